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
#include <unordered_set>
#include <vector>

#include "../common/host.h"
#include "../include/cherenkov.h"
#include "abi.h"
#include "profile.h"

namespace ck {
// Every command buffer's slice of the param ring starts with its cancel word (kCancelBytes),
// then its params, then one 64-bit value per event command (ck::SliceLayout in runtime.cu).
constexpr size_t kCancelBytes = 256;
// ck_device::watch_host's slots: two command buffers share one only kWatchSlots ids apart, far
// more than are ever in flight at once (the engine commits a step at a time).
constexpr uint32_t kWatchSlots = 256;

// A command buffer structure replayed as a CUDA graph (runtime.cu, "---- graphs"). Its kernel
// arguments point into `area` (the same layout as a ring slice), which each replay refills.
struct Graph {
  uint64_t structure = 0;        // structure hash (shape_of): command kinds and kernels, the shape key
  std::vector<uint64_t> shape;   // the shape its nodes hold now (shape_of)
  std::vector<uint32_t> starts;  // command i's words: shape[starts[i] .. starts[i + 1])
  cudaGraph_t graph = nullptr;   // kept: its nodes name the exec's nodes for updates
  std::vector<cudaGraphNode_t> nodes;  // node of command i
  cudaGraphExec_t exec = nullptr;
  unsigned char *area = nullptr;  // device memory: cancel word, params, event values
  size_t area_bytes = 0;
  uint64_t last_use = 0;  // LRU tick
  bool broken = false;    // a replay failed: never used again, evicted first
  bool busy = false;      // a command buffer that used `area` has not completed (guarded by ck_device::qm)
  // CHERENKOV_CUDA_STAMPS: each node's end clock (device, zeroed before each replay) and its
  // copy after the replay (pinned host memory, read at completion). Null otherwise.
  unsigned long long *stamps = nullptr;
  unsigned long long *stamps_host = nullptr;
  // CHERENKOV_CUDA_GRAPHS_VERBOSE: its replays' host time by stage (ns), for the line at close.
  uint64_t replays = 0, patched = 0, t_wake = 0, t_lookup = 0, t_update = 0, t_copy = 0, t_launch = 0;
};

// Instantiated graphs per device: a decode row, a few prompt chunks and, for each draft count
// a speculative run uses, one per accept count and one after plain steps (k + 2 of them: 12 for
// drafts "auto" over 1..3), each in up to three structures (an attention call split past 64
// positions, scoring past QSA's topk): Engine.warmSteps primes all of them at load (~40 on the
// 30b shape; runtime.cu, "Built ahead").
constexpr size_t kGraphCacheSize = 64;
// Command buffers waiting for the builder (more are not primed): the burst at load is ~40.
constexpr size_t kPrimeQueue = 64;
constexpr size_t kSeenShapes = 64;     // recent shape and structure hashes (a graph is built on a second sight)

struct GraphCache {
  bool enabled = false;  // CHERENKOV_CUDA_GRAPHS != 0 and no CHERENKOV_CUDA_PROFILE
  bool verbose = false;  // CHERENKOV_CUDA_GRAPHS_VERBOSE=1: one line of counters at device close
  bool update_nodes = true;  // false (CHERENKOV_CUDA_GRAPHS=exact): replay only an identical shape
  bool hints = true;         // false (CHERENKOV_CUDA_GRAPH_HINTS=0): ck_cmdbuf_hint ignored
  // Programmatic dependent launch between consecutive kernels (CHERENKOV_CUDA_PDL != 0, a GPU
  // of compute capability 9.0 or newer, no profiler): runtime.cu "Programmatic launch".
  bool pdl = false;
  bool stamps = false;  // CHERENKOV_CUDA_STAMPS set: graph replays record each node's end (profile.h)
  std::vector<Graph *> entries;  // owned; only the submit thread adds or removes
  uint64_t seen[kSeenShapes] = {};
  size_t seen_next = 0;
  std::unordered_set<uint64_t> failed;  // structure hashes whose graph failed: launched directly
  std::vector<uint64_t> scratch;        // the shape being looked up
  std::vector<uint32_t> scratch_starts;
  std::vector<uint32_t> patch;          // commands whose nodes the coming replay updates
  uint64_t tick = 0;
  // Counters (submit thread; read at close): command buffers replayed from a graph, graphs
  // built, graph errors (each falls back to direct launches), command buffers launched
  // directly with graphs on, graphs evicted, nodes updated before a replay.
  uint64_t replays = 0, captures = 0, fallbacks = 0, direct = 0, evictions = 0, patched = 0;
  uint64_t build_ns = 0, direct_ns = 0;  // host time building graphs and launching command buffers directly
  std::string first_error;
  // Graphs built ahead (ck_cmdbuf_hint with prime; runtime.cu, "Built ahead"). `m` guards what
  // the builder thread shares with the others: `jobs` (copies of primed command buffers),
  // `built` (graphs it finished, which the submit thread moves into `entries`), `structures`
  // (the structure hashes with a graph in `entries` or `built`, or one being built), `stop` and
  // the builder's counters.
  std::mutex m;
  std::condition_variable jobs_cv;
  std::deque<ck_cmdbuf *> jobs;
  std::vector<Graph *> built;
  std::unordered_set<uint64_t> structures;
  bool stop = false;
  uint64_t primed = 0, prime_failures = 0, prime_ns = 0, adopted = 0;
  std::thread builder;
};
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
  uint32_t event_commands = 0;  // signals and waits among `commands` (each has a value slot)
  size_t first_wait = SIZE_MAX;  // index of its first wait command (dispatches after it check the cancel word)
  cudaEvent_t done = nullptr;
  size_t ring_start = 0;  // its slice of the param ring (cancel word first)
  ck::Graph *graph = nullptr;            // the graph whose area it claimed (busy until it completes), or null
  bool submit_failed = false;
  bool gated = false;  // holds a wait: counted in ck::WaitGate from launch to completion
  std::vector<cudaEvent_t> marks;  // CHERENKOV_CUDA_PROFILE: an event before each command and after the last
  // CHERENKOV_CUDA_STAMPS: host clock (ck::Profiler::host_ns) at commit, after its graph's
  // launch was enqueued, and when the completion thread saw it done.
  uint64_t t_commit = 0, t_launched = 0, t_done = 0;
  uint64_t t_committed_ns = 0;  // CHERENKOV_CUDA_GRAPHS_VERBOSE: steady clock at commit
  uint32_t shape_key = 0;       // ck_cmdbuf_hint: the recording it was encoded from (0: none)
  std::atomic<uint32_t> spun_us{0};  // microseconds its waits have spun (ck_cmdbuf_wait)
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
  // The GPU-wait watch, pinned host memory mapped into the GPU (runtime.cu, ck_wait_kernel):
  // [0] the timeout in ms (set by the host), then kWatchSlots slots: a command buffer whose
  // wait timed out has its id written at [1 + id % kWatchSlots] by the GPU.
  volatile uint32_t *watch_host = nullptr;
  uint32_t *watch_gpu = nullptr;
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
  bool submit_done = false;  // the submit thread has ended (after stopping): the completion thread may too
  std::thread submitter, completer;
  ck::GraphCache graphs;  // the submit thread's; Graph::busy under qm
  // Spinning before sleeping (runtime.cu "Spin, then sleep"): how long, in microseconds, a
  // waiter for a command buffer's completion and the submit thread waiting for the next commit
  // poll before they block (CHERENKOV_CUDA_SPIN_US; 0: block at once). `committed` counts
  // commits, for the submit thread to poll without the lock.
  uint32_t spin_us = 0;
  std::atomic<uint64_t> committed{0};
};
