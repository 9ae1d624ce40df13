// The objects behind cherenkov.h's opaque handles, for the CPU backend.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "../common/host.h"
#include "../include/cherenkov.h"
#include "exec.h"

struct ck_buffer : ck::Counted {
  char *data = nullptr;
  size_t length = 0;
  bool owned = false;  // false: wraps caller memory
  // CHERENKOV_CPU_DEVICE_MIRROR=1: a device-storage buffer's host view is this separate copy
  // (what the host reads and writes), kernels use `data`, upload/download copy between them,
  // as on a discrete GPU; so a missing upload or download shows on the CPU backend too.
  char *mirror = nullptr;
  bool mirror_owned = false;  // false: the caller's wrapped memory is the mirror
  ~ck_buffer();
};
void ck_buffer_unref(ck_buffer *b);

struct ck_event : ck::Counted {
  uint32_t id = 0;
  std::mutex m;
  std::condition_variable cv;
  uint64_t value = 0;  // guarded by m
  void set(uint64_t v);
  bool wait_at_least(uint64_t v, uint32_t timeout_ms);
};
void ck_event_unref(ck_event *e);

struct ck_pipeline {
  const ck::KernelInfo *info;
  uint32_t max_threads = ck::kMaxThreads;  // per threadgroup (CHERENKOV_CPU_MAX_THREADS)
};

struct ck_library {
  ck_device *dev;
  std::vector<ck_pipeline> pipelines;  // sorted by name
  std::unordered_map<std::string, ck_pipeline *> by_name;
};

namespace ck {
// One recorded command, kept small: a command buffer may hold thousands.
struct Command {
  enum Kind { kDispatch, kSignal, kWait, kWaitHost } kind;  // kWaitHost: ck_encode_wait_host
  const KernelInfo *kernel;   // kDispatch
  uint32_t groups[3], tg[3], threads[3];
  uint32_t first_binding;     // into ck_cmdbuf::bindings
  uint32_t binding_count;
  uint32_t params_offset;     // into ck_cmdbuf::params
  uint32_t params_len;
  ck_event *event;            // kSignal, kWait, kWaitHost (retained)
  uint64_t value;
};

struct BoundBuffer {
  uint32_t index;
  char *address;  // buffer contents + offset (the buffer is retained)
};
}  // namespace ck

struct ck_cmdbuf : ck::Counted {
  uint32_t id = 0;
  ck_device *dev = nullptr;
  std::atomic<int32_t> status{CK_CMDBUF_ENCODING};
  std::vector<ck::Command> commands;
  std::vector<ck::BoundBuffer> bindings;   // every dispatch's buffers
  std::vector<unsigned char> params;       // every dispatch's param bytes, 16-byte aligned
  std::vector<ck_buffer *> buffers;        // retained until completion
  std::string error;                       // written before status becomes FAILED
  ~ck_cmdbuf();
};
void ck_cmdbuf_unref(ck_cmdbuf *cb);

struct ck_device {
  std::string name;
  uint32_t page_size = 4096;     // reported and used for rounding (CHERENKOV_CPU_PAGE_SIZE)
  uint32_t os_page_size = 4096;  // the machine's, for pointer alignment
  // Each pipeline's maxTotalThreadsPerThreadgroup. Metal lowers it below the
  // device's 1024 for kernels that use many registers; CHERENKOV_CPU_MAX_THREADS
  // emulates that so a threadgroup the GPU would refuse fails here too.
  uint32_t pipeline_max_threads = ck::kMaxThreads;
  bool device_mirror = false;  // CHERENKOV_CPU_DEVICE_MIRROR=1 (see ck_buffer::mirror)
  // Largest single buffer (new or wrapped). Metal's maxBufferLength is well below the working
  // set on Apple silicon; CHERENKOV_CPU_MAX_BUFFER_LENGTH emulates a small one. 2^53 = none.
  double max_buffer_length = 9007199254740992.0;
  // An OS limit on one GPU-side event wait (CHERENKOV_CPU_GPU_WAIT_LIMIT_MS, 0 = none): a wait
  // that outlives it fails its command buffer as Metal's MTLCommandBufferErrorTimeout does,
  // unless the device's own wait timeout (the engine's watchdog) fires first.
  uint32_t gpu_wait_limit_ms = 0;
  double working_set = 0;
  unsigned threads = 1;
  std::atomic<uint32_t> wait_timeout_ms{10000};
  std::atomic<uint32_t> next_cmdbuf_id{1};
  std::atomic<uint32_t> next_event_id{1};
  std::unique_ptr<ck::Pool> pool;
  // Command queue: one thread runs committed command buffers in order.
  std::mutex qm;
  std::condition_variable qcv;    // work arrived or stopping
  std::condition_variable donecv; // some command buffer finished
  std::deque<ck_cmdbuf *> queue;
  bool stopping = false;
  std::thread qthread;
};
void ck_queue_start(ck_device *dev);
void ck_queue_stop(ck_device *dev);
