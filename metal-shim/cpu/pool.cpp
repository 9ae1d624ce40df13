#include "exec.h"

namespace ck {

Pool::Pool(unsigned threads) {
  for (unsigned i = 1; i < threads; i++) threads_.emplace_back([this] { loop(); });
}

Pool::~Pool() {
  {
    std::lock_guard<std::mutex> lk(m_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto &t : threads_) t.join();
}

void Pool::work() {
  Worker *w = this_thread_worker();
  std::string err;
  while (!failed_.load(std::memory_order_relaxed)) {
    uint32_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= total_) break;
    if (!run_threadgroup(w, *job_, i, err)) {
      std::lock_guard<std::mutex> lk(m_);
      if (!failed_.exchange(true)) error_ = err;
    }
  }
}

void Pool::loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(m_);
      wake_.wait(lk, [&] { return stop_ || seq_ != seen; });
      if (stop_) return;
      seen = seq_;
    }
    work();
    std::lock_guard<std::mutex> lk(m_);
    if (--running_ == 0) done_.notify_one();
  }
}

bool Pool::run(const Dispatch &d, std::string &error) {
  uint64_t total = uint64_t(d.groups[0]) * d.groups[1] * d.groups[2];
  if (total == 0) return true;
  if (threads_.empty() || total == 1) {
    Worker *w = this_thread_worker();
    for (uint32_t i = 0; i < total; i++)
      if (!run_threadgroup(w, d, i, error)) return false;
    return true;
  }
  {
    std::lock_guard<std::mutex> lk(m_);
    job_ = &d;
    total_ = uint32_t(total);
    next_.store(0);
    failed_.store(false);
    error_.clear();
    running_ = unsigned(threads_.size());
    ++seq_;
  }
  wake_.notify_all();
  work();
  std::unique_lock<std::mutex> lk(m_);
  done_.wait(lk, [&] { return running_ == 0; });
  job_ = nullptr;
  if (failed_.load()) {
    error = error_;
    return false;
  }
  return true;
}

}  // namespace ck
