// The objects behind cherenkov.h's opaque handles, for the CUDA backend.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "../include/cherenkov.h"
#include "abi.h"
#include "profile.h"

namespace ck {
int32_t set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
bool to_u64(double v, uint64_t &out);

struct Counted {
  std::atomic<int> refs{1};
  void retain() { refs.fetch_add(1, std::memory_order_relaxed); }
  bool drop() { return refs.fetch_sub(1, std::memory_order_acq_rel) == 1; }
};

// Every command buffer's slice of the param ring starts with its cancel word (kCancelBytes).
constexpr size_t kCancelBytes = 256;
}  // namespace ck

struct ck_device;
struct ck_buffer : ck::Counted {
  ck_device *dev = nullptr;  // for upload/download (its copy stream)
  size_t mapped = 0;     // bytes mmap'd for a shared buffer (munmap after unregistering)
  char *host = nullptr;  // ck_buffer_contents: the shared memory, or a device buffer's mirror
  char *gpu = nullptr;   // what kernels address
  size_t length = 0;
  int32_t storage = CK_STORAGE_SHARED;
  enum Owner { kHostAlloc, kRegistered, kMapped, kNone } host_owner = kNone;
  bool gpu_owned = false;  // cudaMalloc'd device copy
  ~ck_buffer();
};
void ck_buffer_unref(ck_buffer *b);

struct ck_event : ck::Counted {
  uint32_t id = 0;
  volatile uint64_t *word = nullptr;  // pinned, mapped
  CUdeviceptr dptr = 0;
  ~ck_event();
};
void ck_event_unref(ck_event *e);

struct ck_pipeline {
  const ck::KernelInfo *info;
  uint32_t max_threads;
};

struct ck_library {
  ck_device *dev;
  std::vector<ck_pipeline> pipelines;
  std::unordered_map<std::string, ck_pipeline *> by_name;
};

namespace ck {
struct Command {
  enum Kind { kDispatch, kSignal, kWait } kind;
  const KernelInfo *kernel;
  uint32_t groups[3], tg[3], threads[3];
  uint32_t first_binding, binding_count;
  uint32_t params_offset, params_len;
  ck_event *event;
  uint64_t value;
};
struct BoundBuffer {
  uint32_t index;
  char *address;
};
}  // namespace ck

struct ck_cmdbuf : ck::Counted {
  uint32_t id = 0;
  ck_device *dev = nullptr;
  std::atomic<int32_t> status{CK_CMDBUF_ENCODING};
  std::vector<ck::Command> commands;
  std::vector<ck::BoundBuffer> bindings;
  std::vector<unsigned char> params;
  std::vector<ck_buffer *> buffers;
  std::string error;
  // Set by the submit thread.
  cudaEvent_t done = nullptr;
  size_t ring_start = 0;  // its slice of the param ring (cancel word first)
  bool submit_failed = false;
  std::vector<cudaEvent_t> marks;  // CHERENKOV_CUDA_PROFILE: an event before each command and after the last
  ~ck_cmdbuf();
};
void ck_cmdbuf_unref(ck_cmdbuf *cb);


struct ck_device {
  int ordinal = 0;
  std::string name;
  uint32_t page_size = 4096;
  double working_set = 0;
  uint32_t max_shared = 49152;
  std::atomic<uint32_t> wait_timeout_ms{10000};
  std::atomic<uint32_t> next_cmdbuf_id{1};
  std::atomic<uint32_t> next_event_id{1};
  cudaStream_t stream = nullptr;  // every command buffer, in commit order
  cudaStream_t copy = nullptr;    // ck_buffer_upload / download
  std::mutex copy_m;
  // Params of every dispatch travel to device memory through a FIFO ring: pinned host bytes
  // copied by one cudaMemcpyAsync per command buffer; kernels read them from HBM.
  size_t ring_size = 0;
  unsigned char *ring_host = nullptr;
  unsigned char *ring_gpu = nullptr;
  size_t ring_head = 0;                 // next free byte (submit thread)
  std::deque<std::pair<size_t, size_t>> ring_live;  // [start, end) per in-flight cmdbuf, guarded by qm
  // Submission: committed -> submit thread (enqueues into `stream`) -> in flight -> the
  // completion thread marks them done in order.
  std::mutex qm;
  std::condition_variable qcv, donecv, flightcv;
  std::deque<ck_cmdbuf *> queue;     // committed, not yet enqueued
  std::deque<ck_cmdbuf *> inflight;  // enqueued, not yet finished
  bool stopping = false;
  std::thread submitter, completer;
};
