#include <chrono>

#include "exec.h"

namespace ck {
namespace {

constexpr auto kSpin = std::chrono::microseconds(50);

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until done() or `limit` passes; returns done().
template <class F>
bool spin_until(F done, std::chrono::microseconds limit) {
  auto start = std::chrono::steady_clock::now();
  for (unsigned i = 1;; i++) {
    if (done()) return true;
    cpu_relax();
    if (i % 256 == 0 && std::chrono::steady_clock::now() - start > limit) return done();
  }
}

}  // namespace

Pool::Pool(unsigned threads) {
  for (unsigned i = 1; i < threads; i++) threads_.emplace_back([this] { loop(); });
}

Pool::~Pool() {
  {
    std::lock_guard<std::mutex> lk(m_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto &t : threads_) t.join();
}

// Claims and runs threadgroups of dispatch `generation` until none are left.
// A claim only succeeds while the claim word still names that generation, and
// a generation's job slot is rewritten only after every threadgroup of the
// generation before it has finished, so a late worker can never run a stale job.
void Pool::work(uint64_t generation) {
  Job &job = jobs_[generation & 1];
  Worker *w = this_thread_worker();
  std::string err;
  uint64_t v = claim_.load(std::memory_order_acquire);
  for (;;) {
    if ((v >> 32) != generation) return;
    uint32_t index = uint32_t(v);
    if (index >= job.total.load(std::memory_order_acquire)) return;
    if (!claim_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) continue;
    if (!job.failed.load(std::memory_order_relaxed) && !run_threadgroup(w, job.d, index, err)) {
      std::lock_guard<std::mutex> lk(m_);
      if (!job.failed.exchange(true)) error_ = err;
    }
    job.done.fetch_add(1, std::memory_order_release);
    v = claim_.load(std::memory_order_acquire);
  }
}

void Pool::loop() {
  uint64_t seen = 0;
  auto ready = [&] {
    return stop_.load(std::memory_order_relaxed) || (claim_.load(std::memory_order_acquire) >> 32) != seen;
  };
  for (;;) {
    if (!spin_until(ready, kSpin)) {
      std::unique_lock<std::mutex> lk(m_);
      sleepers_++;
      wake_.wait(lk, ready);
      sleepers_--;
    }
    if (stop_.load()) return;
    seen = claim_.load(std::memory_order_acquire) >> 32;
    work(seen);
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
  uint64_t generation = ++generation_ & 0xffffffffu;
  Job &job = jobs_[generation & 1];
  job.d = d;
  job.done.store(0, std::memory_order_relaxed);
  job.failed.store(false, std::memory_order_relaxed);
  job.total.store(uint32_t(total), std::memory_order_release);
  {
    std::lock_guard<std::mutex> lk(m_);
    error_.clear();
    claim_.store(generation << 32, std::memory_order_release);
    if (sleepers_) wake_.notify_all();
  }
  work(generation);
  while (!spin_until([&] { return job.done.load(std::memory_order_acquire) == total; }, kSpin))
    std::this_thread::yield();
  if (job.failed.load()) {
    std::lock_guard<std::mutex> lk(m_);
    error = error_;
    return false;
  }
  return true;
}

}  // namespace ck
