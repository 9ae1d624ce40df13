// Executes dispatches: threadgroups spread over a pool of OS threads; the
// threads of one threadgroup run as fibers on one OS thread.
#pragma once
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "abi.h"

namespace ck {

struct Dispatch {
  const KernelInfo *kernel;
  void *buf[kMaxBuffers];
  uint32_t groups[3];   // threadgroups per grid
  uint32_t tg[3];       // requested threads per threadgroup
  uint32_t threads[3];  // threads per grid (groups * tg unless dispatchThreads)
};

// Per-OS-thread executor state (fiber stacks, threadgroup bookkeeping).
struct Worker;
Worker *this_thread_worker();

// Runs threadgroup `linear` (x fastest) of `d` on the calling thread. On a
// kernel fault the detectable way (deadlocked barriers, stack overflow)
// returns false with `error` set.
bool run_threadgroup(Worker *w, const Dispatch &d, uint32_t linear, std::string &error);

// Runs all threadgroups of a dispatch on `threads` OS threads (the caller
// included). Only one thread calls run() at a time. Threadgroups are claimed
// through one atomic word holding (dispatch generation, next index), so the
// caller waits only for threadgroups actually claimed, never for a worker that
// is still asleep. Between dispatches workers spin briefly, then sleep.
class Pool {
 public:
  explicit Pool(unsigned threads);
  ~Pool();
  bool run(const Dispatch &d, std::string &error);
  unsigned size() const { return unsigned(threads_.size()) + 1; }

 private:
  struct Job {
    Dispatch d;
    std::atomic<uint32_t> total{0};
    std::atomic<uint32_t> done{0};
    std::atomic<bool> failed{false};
  };
  void loop();
  void work(uint64_t generation);

  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable wake_;
  unsigned sleepers_ = 0;             // guarded by m_
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> claim_{0};    // generation << 32 | next threadgroup index
  uint64_t generation_ = 0;           // of the last run(), written by its caller only
  Job jobs_[2];                       // jobs_[generation & 1]
  std::string error_;                 // guarded by m_
};

}  // namespace ck
