// GPU time per kernel, for profiling on a machine without nsys: with CHERENKOV_CUDA_PROFILE=FILE
// the submit thread records a CUDA event between every two commands of a command buffer, the
// completion thread adds each command's elapsed time to its row (kernel name and launch shape,
// so a decode step's dispatches and a prefill chunk's are told apart; "(wait)" is the GPU
// idling on a host event, "(signal)" its one-thread signal), and the totals are written to
// FILE as JSON at ck_device_close and at process exit. Off (no events at all) otherwise.
//
// Stamps (CHERENKOV_CUDA_STAMPS=FILE): the per-command events above time each command alone
// (no graphs, no programmatic launch), which inflates a chain of short kernels. Stamps keep
// both: every node of a graph replay records the GPU clock (%globaltimer) at which its
// threadgroups end (ck::stamp_end), and a node's share of the step is its end minus the end
// of the node before it: what it adds to the chain, its launch and wait included. Written to
// FILE per command-buffer structure (the kernel names in order): the mean share of each node
// over the replays and the mean span from the first node's end to the last's, and on the host's
// clock the mean time from commit to the launch enqueued (submitUs), from there to the first
// node's end (launchUs: the parameter copy, the launch, the first node), from the last
// node's end to the completion thread seeing it (doneUs) and from the previous replay seen
// done to this commit (turnUs: the host's turn between two steps). Graph replays only (a command buffer
// launched directly records nothing).
#pragma once
#include <cuda_runtime.h>
#include <time.h>

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
  bool stamps_on() const { return !stamps_path_.empty(); }

  // The host's clock on the base %globaltimer reads on Linux (CLOCK_REALTIME, in ns; whether
  // the two agree is for the numbers to show: a skew makes launchUs / doneUs implausible).
  static uint64_t host_ns() {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
  }

  // A completed graph replay's end clocks (ends[i]: command i's; 0 for an event command) and
  // its host times (ck_cmdbuf::t_commit, t_launched, t_done).
  void add_stamps(const std::vector<const char *> &names, const unsigned long long *ends, uint64_t t_commit, uint64_t t_launched,
                  uint64_t t_done) {
    std::lock_guard<std::mutex> lk(m_);
    std::string key;
    for (const char *n : names) (key += n) += ';';
    Timeline &t = timelines_[key];
    if (t.us.empty()) {
      t.names.assign(names.begin(), names.end());
      t.us.assign(names.size(), 0.0);
    }
    unsigned long long first = 0, prev = 0;
    for (size_t i = 0; i < names.size(); i++) {
      if (ends[i] == 0) continue;
      if (prev != 0) t.us[i] += (ends[i] > prev ? double(ends[i] - prev) : 0.0) / 1000.0;
      if (first == 0) first = ends[i];
      prev = ends[i];
    }
    t.span_us += prev > first ? double(prev - first) / 1000.0 : 0.0;
    // Signed: commit -> launch enqueued, launch -> first node's end, last node's end -> seen done.
    t.submit_us += (double(t_launched) - double(t_commit)) / 1000.0;
    t.launch_us += (double(first) - double(t_launched)) / 1000.0;
    t.done_us += (double(t_done) - double(prev)) / 1000.0;
    // The host's turn before it: from the previous replay seen done to this commit (when this
    // one came after it: a replay committed while the previous ran has no turn).
    if (last_done_ != 0 && t_commit > last_done_) {
      t.turn_us += double(t_commit - last_done_) / 1000.0;
      t.turns++;
    }
    last_done_ = t_done;
    t.replays++;
  }

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
    dump_stamps();
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
    if (const char *p = std::getenv("CHERENKOV_CUDA_STAMPS")) stamps_path_ = p;
    if (on() || stamps_on()) std::atexit([] { Profiler::get().dump(); });
  }

  // {"timelines":[{"replays":N,"spanUs":mean,"nodes":[{"name":..,"us":mean share},...]},...]}
  void dump_stamps() {
    std::lock_guard<std::mutex> lk(m_);
    if (!stamps_on() || timelines_.empty()) return;
    FILE *f = std::fopen(stamps_path_.c_str(), "w");
    if (!f) return;
    std::fprintf(f, "{\"timelines\":[");
    bool first = true;
    for (auto &kv : timelines_) {
      const Timeline &t = kv.second;
      const double n = double(t.replays);
      std::fprintf(f, "%s{\"replays\":%llu,\"spanUs\":%.3f,\"submitUs\":%.3f,\"launchUs\":%.3f,\"doneUs\":%.3f,\"turnUs\":%.3f,\"nodes\":[", first ? "" : ",",
                   t.replays, t.span_us / n, t.submit_us / n, t.launch_us / n, t.done_us / n, t.turns ? t.turn_us / double(t.turns) : 0.0);
      for (size_t i = 0; i < t.names.size(); i++)
        std::fprintf(f, "%s{\"name\":\"%s\",\"us\":%.3f}", i ? "," : "", t.names[i].c_str(), t.us[i] / n);
      std::fprintf(f, "]}");
      first = false;
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  struct Timeline {
    std::vector<std::string> names;
    std::vector<double> us;  // summed shares (microseconds)
    double span_us = 0, submit_us = 0, launch_us = 0, done_us = 0, turn_us = 0;
    unsigned long long replays = 0, turns = 0;
  };
  std::string stamps_path_;
  std::map<std::string, Timeline> timelines_;
  uint64_t last_done_ = 0;  // the last replay's t_done
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
