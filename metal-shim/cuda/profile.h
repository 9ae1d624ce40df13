// GPU time per kernel, for profiling on a machine without nsys: with CHERENKOV_CUDA_PROFILE=FILE
// the submit thread records a CUDA event between every two commands of a command buffer, the
// completion thread adds each command's elapsed time to its row (kernel name and launch shape,
// so a decode step's dispatches and a prefill chunk's are told apart; "(wait)" is the GPU
// idling on a host event, "(signal)" its one-thread signal), and the totals are written to
// FILE as JSON at ck_device_close and at process exit. Off (no events at all) otherwise.
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace ck {

class Profiler {
 public:
  static Profiler &get() {
    static Profiler *p = new Profiler();  // never destroyed: the atexit dump may run late
    return *p;
  }
  bool on() const { return !path_.empty(); }

  // Events for a command buffer of n commands (n + 1 marks; mark i is before command i).
  std::vector<cudaEvent_t> marks(size_t n) {
    std::vector<cudaEvent_t> m(n + 1);
    for (auto &e : m) cudaEventCreate(&e);
    return m;
  }

  // Adds a completed command buffer: names[i] is command i's row.
  void add(const std::vector<cudaEvent_t> &marks, const std::vector<std::string> &names) {
    std::lock_guard<std::mutex> lk(m_);
    float total = 0;
    if (marks.size() == names.size() + 1 && cudaEventElapsedTime(&total, marks.front(), marks.back()) == cudaSuccess) {
      for (size_t i = 0; i < names.size(); i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, marks[i], marks[i + 1]) != cudaSuccess) continue;
        Row &r = rows_[names[i]];
        r.count++;
        r.ms += ms;
      }
      cmdbufs_++;
      commands_ += names.size();
      span_ms_ += total;
    }
    cudaGetLastError();
    for (auto e : marks) cudaEventDestroy(e);
  }

  void dump() {
    std::lock_guard<std::mutex> lk(m_);
    if (!on() || cmdbufs_ == 0) return;
    FILE *f = std::fopen(path_.c_str(), "w");
    if (!f) return;
    std::fprintf(f, "{\"commandBuffers\":%llu,\"commands\":%llu,\"spanMs\":%.4f,\"kernels\":[", (unsigned long long)cmdbufs_,
                 (unsigned long long)commands_, span_ms_);
    bool first = true;
    for (auto &kv : rows_) {
      std::fprintf(f, "%s{\"name\":\"%s\",\"count\":%llu,\"ms\":%.4f}", first ? "" : ",", kv.first.c_str(),
                   (unsigned long long)kv.second.count, kv.second.ms);
      first = false;
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }

 private:
  Profiler() {
    if (const char *p = std::getenv("CHERENKOV_CUDA_PROFILE")) path_ = p;
    if (on()) std::atexit([] { Profiler::get().dump(); });
  }
  struct Row {
    unsigned long long count = 0;
    double ms = 0;
  };
  std::string path_;
  std::mutex m_;
  std::map<std::string, Row> rows_;
  unsigned long long cmdbufs_ = 0, commands_ = 0;
  double span_ms_ = 0;
};

}  // namespace ck
