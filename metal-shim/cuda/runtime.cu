// cherenkov.h over CUDA: errors, device, buffers (storage modes), library, command buffers
// and events. One CUDA stream runs every command buffer in commit order; a submit thread
// enqueues committed command buffers (kernel launches; an event signal is a one-thread
// kernel that writes the event's word in pinned host memory, an event wait a one-thread
// kernel that polls it), a completion thread marks them done in order and reports a GPU
// wait's timeout, which the wait kernel enforces itself: past it, it sets the command
// buffer's cancel word, which turns every later command of it into a no-op, and writes the
// command buffer's id where the completion thread looks. docs/cuda.md explains the mapping.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime.h"
#include "../common/encode.h"
#include "../include/cherenkov_tape.h"

using ck::set_error;

namespace ck {
// Whether device memory comes from the stream-ordered pool (cudaMallocAsync, device_alloc):
// then it is freed with cudaFreeAsync, which does not synchronize the device. -1 until the
// first allocation says; 0 on a GPU or driver without pools (cudaMalloc / cudaFree).
static std::atomic<int> g_pooled{-1};

// The GPU waits in flight in this process (command buffers holding a wait, from the submit
// thread's launch to the completion thread's seeing them done) against the reaper's
// device-synchronizing calls. Such a call returns only when every stream of the context is idle,
// which a spinning wait never is until its host release; and the host's release may need a CUDA
// call of its own (a handshake's download on the engine's thread, a graph launch on a submit
// thread) that queues behind it: the wait then ran to its timeout (a golden sequence on the H200,
// 2026-12-03, four test processes on the GPU, an engine closed just before). So the reaper asks
// first: no new command buffer with a wait is launched from then on (the submit threads hold
// theirs), the ones in flight finish (their releases need nothing from the reaper), and only then
// the synchronizing calls run, with nothing on the GPU that waits for the host.
class WaitGate {
 public:
  // Submit thread, before launching a command buffer with a wait.
  static void enter() {
    WaitGate &g = get();
    std::unique_lock<std::mutex> lk(g.m_);
    if (g.closed_) {
      g.held_++;
      g.cv_.wait(lk, [&] { return !g.closed_; });
      if (--g.held_ == 0) g.cv_.notify_all();
    }
    g.inflight_++;
  }
  // Completion thread, once such a command buffer is done (or failed).
  static void leave() {
    WaitGate &g = get();
    std::lock_guard<std::mutex> lk(g.m_);
    if (--g.inflight_ == 0) g.cv_.notify_all();
  }
  // Reaper: from close() to open() no GPU wait is in flight. The command buffers held at the
  // last closing go first (else a reaper with more to free could hold them again and again).
  static void close() {
    WaitGate &g = get();
    std::unique_lock<std::mutex> lk(g.m_);
    g.cv_.wait(lk, [&] { return g.held_ == 0; });
    g.closed_ = true;
    g.cv_.wait(lk, [&] { return g.inflight_ == 0; });
  }
  static void open() {
    WaitGate &g = get();
    std::lock_guard<std::mutex> lk(g.m_);
    g.closed_ = false;
    g.cv_.notify_all();
  }

 private:
  static WaitGate &get() {
    static WaitGate *g = new WaitGate();  // never destroyed, as the threads that use it
    return *g;
  }
  std::mutex m_;
  std::condition_variable cv_;
  uint64_t inflight_ = 0;
  uint64_t held_ = 0;  // submit threads waiting in enter() for the gate to open
  bool closed_ = false;
};

// Releases CUDA memory off the caller's thread. cudaFree, cudaFreeHost and cudaHostUnregister
// may synchronize the whole device: on the thread that must release a GPU wait (the engine's
// JS thread) that never returns while any device of the process has a step waiting on that
// thread (three models in one process hung this way on the H200). One reaper thread does
// them, each batch inside the WaitGate; pooled device memory goes back with cudaFreeAsync on the
// reaper's own stream instead (every user of it was seen complete), outside the gate. Evicted
// CUDA graphs are destroyed here too (cudaGraphExecDestroy of an idle graph; whether it
// synchronizes is not documented: gated).
struct Release {
  enum Kind { kDevice, kHost, kUnregisterUnmap, kGraphExec, kGraph } kind;
  void *p;
  size_t n;
};

class Reaper {
 public:
  static void post(Release r) {
    Reaper &R = get();
    {
      std::lock_guard<std::mutex> lk(R.m_);
      R.q_.push_back(r);
    }
    R.cv_.notify_one();
  }

 private:
  static Reaper &get() {
    static Reaper *r = new Reaper();  // never destroyed: the thread outlives static destructors
    return *r;
  }
  Reaper() { std::thread([this] { loop(); }).detach(); }
  void loop() {
    cudaSetDevice(0);
    cudaStream_t stream = nullptr;
    for (;;) {
      std::deque<Release> batch;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return !q_.empty(); });
        batch.swap(q_);
      }
      std::vector<Release> gated;
      for (const Release &r : batch) {
        if (r.kind == Release::kDevice && g_pooled.load() == 1) {
          if (!stream && cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
            cudaGetLastError();
            stream = nullptr;
          }
          if (stream && cudaFreeAsync(r.p, stream) == cudaSuccess) continue;
          cudaGetLastError();
        }
        gated.push_back(r);
      }
      if (gated.empty()) continue;
      WaitGate::close();
      for (const Release &r : gated) {
        if (r.kind == Release::kDevice) cudaFree(r.p);
        else if (r.kind == Release::kHost) cudaFreeHost(r.p);
        else if (r.kind == Release::kGraphExec) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(r.p));
        else if (r.kind == Release::kGraph) cudaGraphDestroy(static_cast<cudaGraph_t>(r.p));
        else {
          cudaHostUnregister(r.p);
          munmap(r.p, r.n);
        }
        cudaGetLastError();
      }
      WaitGate::open();
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Release> q_;
};

// Device memory for `dev`, zero-filled: allocated and filled on the copy stream and waited
// for there (cudaMalloc may synchronize the device, see Reaper; a plain cudaMemset runs on the
// legacy stream, which the non-blocking streams do not order after). Copy is optional.
static cudaError_t device_alloc(ck_device *dev, void **d, size_t n, const void *copy_from) {
  std::lock_guard<std::mutex> lk(dev->copy_m);
  cudaError_t e = g_pooled.load() == 0 ? cudaErrorNotSupported : cudaMallocAsync(d, n, dev->copy);
  if (e == cudaErrorNotSupported) {  // a GPU or driver without stream-ordered pools
    cudaGetLastError();
    g_pooled.store(0);
    e = cudaMalloc(d, n);
  } else if (e == cudaSuccess) {
    int unknown = -1;
    g_pooled.compare_exchange_strong(unknown, 1);
  }
  if (e == cudaSuccess) {
    e = copy_from ? cudaMemcpyAsync(*d, copy_from, n, cudaMemcpyHostToDevice, dev->copy) : cudaMemsetAsync(*d, 0, n, dev->copy);
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(dev->copy);
  if (e != cudaSuccess && *d) {
    if (g_pooled.load() == 1) cudaFreeAsync(*d, dev->copy);
    else cudaFree(*d);
    *d = nullptr;
  }
  return e;
}
}  // namespace ck

#define CUDA_FAIL(call, fmt, ...)                                                              \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) return set_error(fmt ": %s", ##__VA_ARGS__, cudaGetErrorString(e_)); \
  } while (0)

// ---- buffers ----------------------------------------------------------------------

ck_buffer::~ck_buffer() {
  if (host_owner == kHostAlloc) ck::Reaper::post({ck::Release::kHost, host, 0});
  // The caller's memory: unregistered now (it may map or wrap the same pages again at once).
  else if (host_owner == kRegistered) cudaHostUnregister(host);
  else if (host_owner == kMapped) ck::Reaper::post({ck::Release::kUnregisterUnmap, host, mapped});
  if (gpu_owned) ck::Reaper::post({ck::Release::kDevice, gpu, 0});
}

void ck_buffer_unref(ck_buffer *b) {
  if (b && b->drop()) delete b;
}

static bool checked_length(ck_device *dev, double length, const char *fn, size_t &out) {
  uint64_t n;
  if (!dev) return set_error("%s: device is NULL", fn), false;
  if (!ck::to_u64(length, n) || n == 0)
    return set_error("%s: length %.17g is not a positive integer below 2^53", fn, length), false;
  uint64_t page = dev->page_size;
  out = size_t((n + page - 1) / page * page);
  return true;
}

static bool checked_storage(int32_t storage, const char *fn) {
  if (storage == CK_STORAGE_SHARED || storage == CK_STORAGE_DEVICE) return true;
  set_error("%s: storage mode %d is not CK_STORAGE_SHARED (0) or CK_STORAGE_DEVICE (1)", fn, storage);
  return false;
}

// Gives `b` its GPU memory (device storage): zero-filled, or a copy of `from` (b->length bytes),
// via ck::device_alloc (the copy stream, waited for). Deletes `b` and returns null on failure.
static ck_buffer *with_device_copy(ck_buffer *b, const void *from, const char *fn) {
  void *d = nullptr;
  cudaError_t e = ck::device_alloc(b->dev, &d, b->length, from);
  if (e != cudaSuccess) {
    if (from) set_error("%s: cannot copy %zu bytes to GPU memory: %s", fn, b->length, cudaGetErrorString(e));
    else set_error("%s: cannot allocate %zu bytes of GPU memory: %s", fn, b->length, cudaGetErrorString(e));
    delete b;
    return nullptr;
  }
  b->gpu = static_cast<char *>(d);
  b->gpu_owned = true;
  return b;
}

static ck_buffer *new_buffer(ck_device *dev, double length, int32_t storage, const char *fn) {
  size_t n;
  if (!checked_length(dev, length, fn, n) || !checked_storage(storage, fn)) return nullptr;
  cudaSetDevice(dev->ordinal);
  auto *b = new ck_buffer();
  b->dev = dev;
  b->length = n;
  b->storage = storage;
  // Page-aligned zeroed pages (mmap), pinned and mapped for the GPU.
  void *h = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (h == MAP_FAILED) {
    set_error("%s: cannot allocate %zu bytes: %s", fn, n, std::strerror(errno));
    delete b;
    return nullptr;
  }
  cudaError_t e = cudaHostRegister(h, n, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();
    munmap(h, n);
    set_error("%s: cannot pin %zu bytes of host memory: %s", fn, n, cudaGetErrorString(e));
    delete b;
    return nullptr;
  }
  b->host = static_cast<char *>(h);
  b->mapped = n;
  b->host_owner = ck_buffer::kMapped;
  if (storage == CK_STORAGE_SHARED) {
    void *d = nullptr;
    cudaHostGetDevicePointer(&d, h, 0);
    b->gpu = static_cast<char *>(d);
    return b;
  }
  return with_device_copy(b, nullptr, fn);  // zero-filled
}

static ck_buffer *wrap_buffer(ck_device *dev, void *ptr, double length, int32_t storage, const char *fn) {
  size_t n;
  if (!checked_length(dev, length, fn, n) || !checked_storage(storage, fn)) return nullptr;
  if (!ptr || reinterpret_cast<uintptr_t>(ptr) % dev->page_size != 0) {
    set_error("%s: pointer %p is not page-aligned (page size %u)", fn, ptr, dev->page_size);
    return nullptr;
  }
  cudaSetDevice(dev->ordinal);
  auto *b = new ck_buffer();
  b->dev = dev;
  b->length = n;
  b->storage = storage;
  b->host = static_cast<char *>(ptr);
  if (storage == CK_STORAGE_DEVICE) return with_device_copy(b, ptr, fn);  // the caller's bytes
  // Shared: pin the caller's pages and map them for the GPU (read-only where the caller's
  // mapping may be read-only, e.g. a file).
  cudaError_t e = cudaHostRegister(ptr, n, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();
    e = cudaHostRegister(ptr, n, cudaHostRegisterMapped | cudaHostRegisterPortable | cudaHostRegisterReadOnly);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    set_error("%s: cannot pin %zu bytes at %p for the GPU: %s", fn, n, ptr, cudaGetErrorString(e));
    delete b;
    return nullptr;
  }
  b->host_owner = ck_buffer::kRegistered;
  void *d = nullptr;
  cudaHostGetDevicePointer(&d, ptr, 0);
  b->gpu = static_cast<char *>(d);
  return b;
}

// ---- events --------------------------------------------------------------------------

ck_event::~ck_event() {
  if (word) ck::Reaper::post({ck::Release::kHost, (void *)word, 0});
}

void ck_event_unref(ck_event *e) {
  if (e && e->drop()) delete e;
}

static uint64_t event_value(const ck_event *e) {
  return __atomic_load_n(e->word, __ATOMIC_ACQUIRE);
}

// The GPU side of events: one thread each, launched in the stream between dispatches. The
// value is read from the command buffer's copied bytes (its value slot, ck::SliceLayout), not
// passed by value: a CUDA graph replays the same arguments with each command buffer's values.
__global__ void ck_signal_kernel(volatile unsigned long long *word, const unsigned long long *value, const volatile uint32_t *cancel) {
  ck::after_previous_grid();
  if (*cancel) return;
  const unsigned long long v = *value;
  __threadfence_system();
  // Apple's rule (MTLSharedEvent): a value below the current one is ignored. The GPU is the
  // word's only writer while a command buffer runs (the host releases it only when it waits).
  if (*word < v) *word = v;
  __threadfence_system();
}

// A wait enforces its own timeout (watch[0] ms, read as it starts: the moment it became the
// first unsatisfied wait, as on the other backends): past it, it sets its command buffer's
// cancel word (every later command of it does nothing) and writes the command buffer's id
// (the slice's second word, stage()) to its slot in the watch, where the completion thread
// looks once the command buffer is done (complete_loop). Cancelling from the host
// took a CUDA call (a memset on the copy stream), which could queue behind the reaper's
// cudaFree, itself waiting for the device to idle, which this spinning wait kept busy: a
// process that had just closed an engine hung on its next timed-out wait (the H200, 2026-12-03).
__device__ __forceinline__ unsigned long long gpu_clock_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void ck_wait_kernel(const volatile unsigned long long *word, const unsigned long long *value, volatile uint32_t *cancel, volatile uint32_t *watch) {
  ck::after_previous_grid();
  const unsigned long long v = *value;
  const unsigned long long start = gpu_clock_ns();
  const unsigned long long limit = 1000000ull * watch[0];
  while (*word < v) {
    if (*cancel) return;
    if (gpu_clock_ns() - start > limit) {
      *cancel = 1;
      const uint32_t id = cancel[1];
      watch[1 + id % ck::kWatchSlots] = id;
      __threadfence_system();
      return;
    }
    __nanosleep(100);
  }
  __threadfence_system();
}

// ---- command buffers -------------------------------------------------------------------

static void release_resources(ck_cmdbuf *cb) {
  for (auto *b : cb->buffers) ck_buffer_unref(b);
  cb->buffers.clear();
  for (auto &c : cb->commands)
    if (c.kind != ck::Command::kDispatch) ck_event_unref(c.event);
  cb->commands.clear();
  cb->event_commands = 0;
  cb->bindings.clear();
  cb->params.clear();
}

ck_cmdbuf::~ck_cmdbuf() {
  release_resources(this);
  if (done) cudaEventDestroy(done);
}

void ck_cmdbuf_unref(ck_cmdbuf *cb) {
  if (cb && cb->drop()) delete cb;
}

namespace ck {
// Where a command buffer's bytes lie, in its ring slice and in a graph's area alike: the
// cancel word at 0, the params at kCancelBytes, then one 64-bit value per event command in
// command order (what ck_signal_kernel / ck_wait_kernel compare against).
struct SliceLayout {
  size_t values;  // offset of the first event value
  size_t bytes;   // bytes copied to the GPU
};

static SliceLayout slice_layout(const ck_cmdbuf *cb) {
  const size_t values = kCancelBytes + ((cb->params.size() + 7) & ~size_t(7));
  return {values, values + 8 * size_t(cb->event_commands)};
}

// Writes cb's bytes (layout `lay`) at `host`, its pinned ring slice: the cancel word cleared.
static void stage(const ck_cmdbuf *cb, const SliceLayout &lay, unsigned char *host) {
  std::memset(host, 0, kCancelBytes);
  std::memcpy(host + 4, &cb->id, sizeof cb->id);  // after the cancel word: whom a timed-out wait names
  if (!cb->params.empty()) std::memcpy(host + kCancelBytes, cb->params.data(), cb->params.size());
  unsigned char *value = host + lay.values;
  for (const Command &c : cb->commands)
    if (c.kind != Command::kDispatch) {
      std::memcpy(value, &c.value, sizeof c.value);
      value += 8;
    }
}

// One command as a kernel call: what cudaLaunchKernel and a graph's kernel node both take.
// Its arguments address `base`, the device copy of the command buffer's bytes. Not copyable:
// `args` points at its own fields.
struct KernelCall {
  const void *func = nullptr;
  dim3 grid, block;
  Launch L;                                     // a dispatch's one argument
  unsigned long long *word = nullptr;           // an event command's three
  const unsigned long long *value = nullptr;
  const volatile uint32_t *cancel = nullptr;
  uint32_t *watch = nullptr;                    // a wait's fourth (the device's watch)
  void *args[4] = {};
  KernelCall() = default;
  KernelCall(const KernelCall &) = delete;
  KernelCall &operator=(const KernelCall &) = delete;
};

// `events` counts the event commands before `c` (its value slot); an event command advances it.
// `stamps`: a graph's end clocks (CHERENKOV_CUDA_STAMPS), command i's at stamps[i]; else null.
static void kernel_call(const ck_cmdbuf *cb, const Command &c, const SliceLayout &lay, unsigned char *base,
                        uint32_t &events, KernelCall &k, unsigned long long *stamps = nullptr) {
  k.cancel = reinterpret_cast<const volatile uint32_t *>(base);
  if (c.kind == Command::kDispatch) {
    std::memset(k.L.buf, 0, sizeof k.L.buf);
    k.L.stamp = stamps ? stamps + (&c - cb->commands.data()) : nullptr;
    for (int i = 0; i < 3; i++) {
      k.L.tg[i] = c.tg[i];
      k.L.threads[i] = c.threads[i];
    }
    for (uint32_t b = 0; b < c.binding_count; b++) {
      const BoundBuffer &bound = cb->bindings[c.first_binding + b];
      k.L.buf[bound.index] = bound.address;
    }
    if (c.params_len) k.L.buf[0] = base + kCancelBytes + c.params_offset;
    // Only a GPU wait times out, so only a dispatch after one can find its command buffer
    // cancelled: the others skip the check (a dependent trip to memory before any work; a
    // resident decode step has no wait at all).
    k.L.cancel = size_t(&c - cb->commands.data()) > cb->first_wait ? k.cancel : nullptr;
    k.func = c.kernel->entry;
    k.grid = dim3(c.groups[0], c.groups[1], c.groups[2]);
    k.block = dim3(c.tg[0] * c.tg[1] * c.tg[2]);
    k.args[0] = &k.L;
    return;
  }
  k.word = reinterpret_cast<unsigned long long *>(c.event->dptr);
  k.value = reinterpret_cast<const unsigned long long *>(base + lay.values + 8 * size_t(events++));
  k.func = c.kind == Command::kSignal ? reinterpret_cast<const void *>(ck_signal_kernel) : reinterpret_cast<const void *>(ck_wait_kernel);
  k.grid = dim3(1);
  k.block = dim3(1);
  k.args[0] = &k.word;
  k.args[1] = &k.value;
  k.args[2] = &k.cancel;
  if (c.kind == Command::kWait) {
    k.watch = cb->dev->watch_gpu;
    k.args[3] = &k.watch;
  }
}

// "command buffer C: command I, dispatch of 'K' (file:line)" or "...: command I: signal of event E".
static std::string command_name(const ck_cmdbuf *cb, size_t i) {
  char s[512];
  const Command &c = cb->commands[i];
  if (c.kind == Command::kDispatch)
    std::snprintf(s, sizeof s, "command buffer %u: command %zu, dispatch of '%s' (%s)", cb->id, i, c.kernel->name, c.kernel->where);
  else
    std::snprintf(s, sizeof s, "command buffer %u: command %zu: %s of event %u", cb->id, i, c.kind == Command::kSignal ? "signal" : "wait", c.event->id);
  return s;
}

// ---- graphs --------------------------------------------------------------------------------
//
// A command buffer whose structure was seen before is replayed from a CUDA graph: one
// cudaMemcpyAsync of its bytes (cancel word, params, event values) into the graph's own
// device area, then one cudaGraphLaunch, instead of a launch per command.
//
// What a replay must reproduce: command i's kernel arguments are a function of its shape
// words (shape_of: its kernel, grid, block, threads, bound addresses, params offset and length;
// an event command's word), the area's address and the number of event commands before it.
// Everything else that differs between command buffers (params bytes, event values) is read
// from the area, which each replay refills. A graph is reused for a command buffer of the same
// structure (the number of commands, each one's kind and kernel, the params size and the event
// count, so the area's layout is the same); the nodes of commands whose shape words differ
// (a decode step binds its token and its final hidden row at the position's offset) are updated
// with cudaGraphExecKernelNodeSetParams to exactly what kernel_call gives for the new command
// buffer, as a fresh build would hold, before the launch. When more than a quarter of the
// commands (and more than 4) differ, a graph of its own is built instead (if that exact
// shape was seen before).
//
// Why one area per graph is safe:
// - Params and values: the replay's copy and its graph are enqueued on dev->stream, after
//   everything enqueued before, so the copy runs only once the previous replay's graph (the
//   only other reader of the area) has finished.
// - The cancel word: set by a timed-out wait of the graph's own replay, in stream order
//   (ck_wait_kernel), and cleared by the next replay's copy, enqueued after it. A graph still
//   has at most one command buffer in flight: the submit thread claims it (Graph::busy) before
//   B's copy is enqueued and waits while A holds it; A releases it once marked done. Engine
//   steps are committed one at a time (each waited for before the next), so the wait costs
//   nothing there.
// - Node updates happen after that claim too, so no launch of the graph is in flight (an
//   update would not affect one anyway, per CUDA's documentation).
// - Eviction frees only a graph no command buffer holds; the reaper frees it.
//
// The graph is built with cudaGraphAddKernelNode, not by stream capture. Capture puts
// dev->stream itself in a mode: an allocation or a synchronizing call (the reaper's frees,
// device_alloc; in the global mode from any thread) breaks it, and a capture that fails
// midway must be ended before the stream can take direct launches again. An explicit build
// touches no stream: nothing another thread does can invalidate it, a failure leaves nothing
// to repair (the command buffer is then launched directly, as if graphs were off), it takes
// the very arguments the direct launches take (kernel_call), and it names each command's node
// for updates. Nodes form a chain (each depends on the one before): the same order and
// visibility as launches in one stream.

static uint64_t mix(uint64_t h, uint64_t w) {
  h ^= w * 0x9e3779b97f4a7c15ull;
  return (h << 27 | h >> 37) * 0xc2b2ae3d27d4eb4full;
}

// Never 0 (GraphCache::seen starts zeroed). A collision costs at most a graph or a direct
// launch: entries are confirmed by comparing the shapes themselves.
static uint64_t finish_hash(uint64_t h) {
  h ^= h >> 33;
  return h ? h : 1;
}

// Nanoseconds of a steady clock: the host times CHERENKOV_CUDA_GRAPHS_VERBOSE prints.
static uint64_t steady_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

// The hash of cb's structure: its number of commands, each one's kind and kernel, the params'
// size, the event commands and the shape key (never 0).
static uint64_t structure_of(const ck_cmdbuf *cb) {
  uint64_t st = mix(mix(mix(mix(0x84222325cbf29ce4ull, cb->commands.size()), cb->params.size()), cb->event_commands), cb->shape_key);
  for (const Command &c : cb->commands) st = mix(st, c.kind != Command::kDispatch ? uint64_t(c.kind) : reinterpret_cast<uintptr_t>(c.kernel));
  return finish_hash(st);
}

// The shape of cb as words (`s`; command i's are s[starts[i] .. starts[i + 1])), with the
// hashes of the whole shape and of its structure.
static void shape_of(const ck_cmdbuf *cb, std::vector<uint64_t> &s, std::vector<uint32_t> &starts, uint64_t &full, uint64_t &structure) {
  s.clear();
  starts.clear();
  s.reserve(8 * cb->commands.size() + 2 * cb->bindings.size() + 2);
  starts.reserve(cb->commands.size() + 1);
  s.push_back(cb->params.size());
  s.push_back(cb->event_commands);
  for (const Command &c : cb->commands) {
    starts.push_back(uint32_t(s.size()));
    s.push_back(uint64_t(c.kind));
    if (c.kind != Command::kDispatch) {
      s.push_back(uint64_t(c.event->dptr));
      continue;
    }
    s.push_back(reinterpret_cast<uintptr_t>(c.kernel));
    s.push_back(uint64_t(c.groups[0]) << 32 | c.groups[1]);
    s.push_back(uint64_t(c.groups[2]) << 32 | c.tg[0]);
    s.push_back(uint64_t(c.tg[1]) << 32 | c.tg[2]);
    s.push_back(uint64_t(c.threads[0]) << 32 | c.threads[1]);
    s.push_back(uint64_t(c.threads[2]) << 32 | c.params_len);
    s.push_back(uint64_t(c.params_offset) << 32 | c.binding_count);
    for (uint32_t b = 0; b < c.binding_count; b++) {
      const BoundBuffer &bound = cb->bindings[c.first_binding + b];
      s.push_back(bound.index);
      s.push_back(reinterpret_cast<uintptr_t>(bound.address));
    }
  }
  starts.push_back(uint32_t(s.size()));
  uint64_t h = mix(0xcbf29ce484222325ull, cb->shape_key);
  for (uint64_t w : s) h = mix(h, w);
  full = finish_hash(h);
  structure = structure_of(cb);
}

// The commands of `s` (same structure as g's) whose words differ from g's nodes, into `out`;
// false when g's structure is not s's after all, or more than `limit` differ.
static bool differing_commands(const Graph *g, const std::vector<uint64_t> &s, const std::vector<uint32_t> &starts, size_t limit,
                               std::vector<uint32_t> &out) {
  out.clear();
  if (g->starts.size() != starts.size() || g->shape[0] != s[0] || g->shape[1] != s[1]) return false;
  for (size_t i = 0; i + 1 < starts.size(); i++) {
    const uint64_t *a = g->shape.data() + g->starts[i], *b = s.data() + starts[i];
    const size_t na = g->starts[i + 1] - g->starts[i], nb = starts[i + 1] - starts[i];
    if (a[0] != b[0] || (b[0] == Command::kDispatch && a[1] != b[1])) return false;  // kind, kernel
    if (na == nb && std::equal(a, a + na, b)) continue;
    if (out.size() == limit) return false;
    out.push_back(uint32_t(i));
  }
  return true;
}

static void release_graph(Graph *g) {
  if (g->stamps) Reaper::post({Release::kDevice, g->stamps, 0});
  if (g->stamps_host) Reaper::post({Release::kHost, g->stamps_host, 0});
  if (g->exec) Reaper::post({Release::kGraphExec, static_cast<void *>(g->exec), 0});
  if (g->graph) Reaper::post({Release::kGraph, static_cast<void *>(g->graph), 0});
  if (g->area) Reaper::post({Release::kDevice, g->area, 0});
  delete g;
}

static void graph_error(GraphCache &G, const std::string &what) {
  G.fallbacks++;
  if (G.first_error.empty()) G.first_error = what;
}

static cudaKernelNodeParams node_params(const KernelCall &k) {
  cudaKernelNodeParams p = {};
  p.func = const_cast<void *>(k.func);
  p.gridDim = k.grid;
  p.blockDim = k.block;
  p.sharedMemBytes = 0;
  p.kernelParams = const_cast<void **>(k.args);  // copied by the call
  p.extra = nullptr;
  return p;
}

// ---- Programmatic launch ---------------------------------------------------------------
//
// A decode step is ~900 small kernels in a chain, most of them a few microseconds of work:
// between two of them the GPU drains one grid, then launches the next (measured on the H200:
// overlapping those launches took a 30b-shape decode step from 9.27 to 8.75 ms). On compute
// capability 9.0+ a kernel may be
// launched as a programmatic dependent of the one before it: its threadgroups are launched
// once every threadgroup of the previous kernel has started, and wait at their first
// instruction (ck::after_previous_grid: griddepcontrol.wait, which returns once the previous
// grid has completed and its memory is visible) before reading or writing anything. So the
// order and visibility stay those of a plain stream; only the launch overlaps. Every kernel
// then lets its own dependent launch (griddepcontrol.launch_dependents) at once, so at most
// one grid waits behind a running one.
// Not after a GPU wait (ck_wait_kernel may spin for a host decision of many milliseconds:
// nothing waits on SMs behind it), not for a command buffer's first command (what precedes it
// in the stream is a copy, not a kernel) and not under the profiler (it times each command
// alone). CHERENKOV_CUDA_PDL=0 turns it off.
static bool programmatic_after(const ck_device *dev, const ck_cmdbuf *cb, size_t i) {
  return dev->graphs.pdl && i > 0 && cb->commands[i - 1].kind != Command::kWait;
}

static cudaGraphEdgeData edge_after(const ck_device *dev, const ck_cmdbuf *cb, size_t i) {
  cudaGraphEdgeData edge = {};  // zero: full completion with memory visibility
  if (programmatic_after(dev, cb, i)) {
    edge.from_port = cudaGraphKernelNodePortProgrammatic;
    edge.type = cudaGraphDependencyTypeProgrammatic;
  }
  return edge;
}

// Launches command i of a directly launched command buffer on dev->stream.
static cudaError_t launch(const ck_device *dev, const ck_cmdbuf *cb, size_t i, const KernelCall &k) {
  if (!programmatic_after(dev, cb, i)) return cudaLaunchKernel(k.func, k.grid, k.block, const_cast<void **>(k.args), 0, dev->stream);
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = k.grid;
  cfg.blockDim = k.block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = dev->stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelExC(&cfg, k.func, const_cast<void **>(k.args));
}

// Builds cb's graph into g: its area first, then one kernel node per command, instantiated.
// Returns false with `err` set (the caller releases g).
static bool build_graph(ck_device *dev, const ck_cmdbuf *cb, const SliceLayout &lay, Graph *g, std::string &err) {
  char msg[640];
  g->area_bytes = (lay.bytes + 255) & ~size_t(255);
  void *area = nullptr;
  cudaError_t e = device_alloc(dev, &area, g->area_bytes, nullptr);
  if (e != cudaSuccess) {
    cudaGetLastError();
    std::snprintf(msg, sizeof msg, "cannot allocate its %zu-byte param area: %s", g->area_bytes, cudaGetErrorString(e));
    err = msg;
    return false;
  }
  g->area = static_cast<unsigned char *>(area);
  if (dev->graphs.stamps) {
    const size_t bytes = 8 * cb->commands.size();
    void *stamps = nullptr;
    e = device_alloc(dev, &stamps, bytes, nullptr);
    if (e == cudaSuccess) g->stamps = static_cast<unsigned long long *>(stamps);
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&g->stamps_host, bytes, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      cudaGetLastError();
      err = std::string("its stamps (CHERENKOV_CUDA_STAMPS): ") + cudaGetErrorString(e);
      return false;
    }
  }
  e = cudaGraphCreate(&g->graph, 0);
  if (e != cudaSuccess) {
    cudaGetLastError();
    g->graph = nullptr;
    err = std::string("cudaGraphCreate: ") + cudaGetErrorString(e);
    return false;
  }
  g->nodes.assign(cb->commands.size(), nullptr);
  cudaGraphNode_t prev = nullptr;
  uint32_t events = 0;
  for (size_t i = 0; i < cb->commands.size(); i++) {
    KernelCall k;
    kernel_call(cb, cb->commands[i], lay, g->area, events, k, g->stamps);
    const cudaKernelNodeParams p = node_params(k);
    e = cudaGraphAddKernelNode(&g->nodes[i], g->graph, nullptr, 0, &p);
    if (e != cudaSuccess) {
      err = command_name(cb, i) + ": cudaGraphAddKernelNode: " + cudaGetErrorString(e);
      break;
    }
    if (prev) {
      const cudaGraphEdgeData edge = edge_after(dev, cb, i);
      e = cudaGraphAddDependencies(g->graph, &prev, &g->nodes[i], &edge, 1);
      if (e != cudaSuccess) {
        err = command_name(cb, i) + ": cudaGraphAddDependencies: " + cudaGetErrorString(e);
        break;
      }
    }
    prev = g->nodes[i];
  }
  if (e == cudaSuccess) {
    e = cudaGraphInstantiateWithFlags(&g->exec, g->graph, 0);
    if (e != cudaSuccess) {
      g->exec = nullptr;
      err = std::string("cudaGraphInstantiateWithFlags: ") + cudaGetErrorString(e);
    }
  }
  if (e != cudaSuccess) cudaGetLastError();
  return e == cudaSuccess;
}

static bool seen_before(GraphCache &G, uint64_t h) {
  if (std::find(std::begin(G.seen), std::end(G.seen), h) != std::end(G.seen)) return true;
  G.seen[G.seen_next++ % kSeenShapes] = h;
  return false;
}

// Frees the least recently used graph no command buffer holds when the cache is full (submit
// thread); false when every graph is held.
static bool make_room(ck_device *dev) {
  GraphCache &G = dev->graphs;
  if (G.entries.size() < kGraphCacheSize) return true;
  size_t victim = G.entries.size();
  {
    std::lock_guard<std::mutex> lk(dev->qm);  // busy only goes from true to false elsewhere
    for (size_t i = 0; i < G.entries.size(); i++)
      if (!G.entries[i]->busy && (victim == G.entries.size() || G.entries[i]->last_use < G.entries[victim]->last_use)) victim = i;
  }
  if (victim == G.entries.size()) return false;
  {
    std::lock_guard<std::mutex> lk(G.m);
    G.structures.erase(G.entries[victim]->structure);
  }
  release_graph(G.entries[victim]);
  G.entries.erase(G.entries.begin() + victim);
  G.evictions++;
  return true;
}

// Moves the graphs the builder finished into the cache (submit thread).
static void adopt_built(ck_device *dev) {
  GraphCache &G = dev->graphs;
  std::vector<Graph *> built;
  {
    std::lock_guard<std::mutex> lk(G.m);
    if (G.built.empty()) return;
    built.swap(G.built);
  }
  for (Graph *g : built) {
    if (!make_room(dev)) {
      std::lock_guard<std::mutex> lk(G.m);
      G.structures.erase(g->structure);
      release_graph(g);
      continue;
    }
    g->last_use = ++G.tick;
    G.entries.push_back(g);
    G.adopted++;
  }
}

// The graph to replay cb from, or null (launch it directly); G.patch lists the commands whose
// nodes must be updated first. A structure gets its first graph on its second sight, so one-off
// shapes (prefill chunks of odd sizes) never pay for building one; a structure whose graph
// failed is never tried again.
static Graph *graph_for(ck_device *dev, const ck_cmdbuf *cb, const SliceLayout &lay) {
  GraphCache &G = dev->graphs;
  G.patch.clear();
  if (!G.enabled || cb->commands.empty()) return nullptr;
  adopt_built(dev);
  uint64_t full = 0, structure = 0;
  shape_of(cb, G.scratch, G.scratch_starts, full, structure);
  if (G.failed.count(structure)) return nullptr;
  const size_t limit = G.update_nodes ? std::max<size_t>(4, cb->commands.size() / 4) : 0;
  Graph *best = nullptr;
  bool same_structure = false;
  std::vector<uint32_t> diff;
  for (Graph *g : G.entries) {
    if (g->structure != structure || g->broken) continue;
    same_structure = true;
    if (differing_commands(g, G.scratch, G.scratch_starts, limit, diff) && (!best || diff.size() < G.patch.size())) {
      best = g;
      G.patch.swap(diff);
      if (G.patch.empty()) break;
    }
  }
  if (best) {
    best->last_use = ++G.tick;
    return best;
  }
  if (!same_structure && G.hints) {
    // Its graph is being built ahead: launched directly this once rather than built twice.
    std::lock_guard<std::mutex> lk(G.m);
    if (G.structures.count(structure)) return nullptr;
  }
  const bool full_seen = seen_before(G, full);  // both recorded
  const bool structure_seen = seen_before(G, structure);
  // A first graph for a structure seen before, or another one for a shape seen before.
  if (!(same_structure ? full_seen : structure_seen)) return nullptr;
  if (!make_room(dev)) return nullptr;  // every graph has a command buffer in flight
  auto *g = new Graph();
  g->structure = structure;
  g->shape = G.scratch;
  g->starts = G.scratch_starts;
  std::string err;
  const uint64_t t0 = steady_ns();
  const bool built = build_graph(dev, cb, lay, g, err);
  G.build_ns += steady_ns() - t0;
  if (!built) {
    char msg[160];
    std::snprintf(msg, sizeof msg, "command buffer %u: building a CUDA graph of its %zu commands: ", cb->id, cb->commands.size());
    graph_error(G, msg + err);
    G.failed.insert(structure);
    release_graph(g);
    return nullptr;
  }
  G.captures++;
  g->last_use = ++G.tick;
  G.entries.push_back(g);
  {
    std::lock_guard<std::mutex> lk(G.m);
    G.structures.insert(structure);
  }
  return g;
}

// ---- Built ahead ----------------------------------------------------------------------------
//
// Without hints a structure's graph is built on its second sight, in the submit thread, between
// a commit and its launch: ~1.4 ms for the tiny model's 130-command speculative cycle on the
// H200's host, which a cycle of ~0.8 ms waits for, and its first launch uploads it (~0.2 ms). A
// speculative run has one cycle shape per accept count, and the engine encodes the next cycle
// for each count ahead while the GPU runs (only one is committed), so each count's first sights
// came late, and a rare count's as late as the 27th cycle, each costing a direct launch and a
// build on the critical path.
// ck_cmdbuf_hint(cb, key, prime):
// - The shape key (the recording's) is part of the structure hash: each accept count's cycle
//   gets a graph of its own instead of sharing one with another count and updating the ~15
//   nodes whose grids or bindings differ at every switch.
// - prime hands a copy of the command buffer (its commands and bindings, not its buffers: a
//   graph holds addresses, and a command buffer whose shape matches binds live buffers at
//   them) to a builder thread while the GPU is busy. The builder builds and uploads the graph
//   (building touches no stream, "graphs" above) and the submit thread adopts it at its next
//   lookup. One structure is primed once (GraphCache::structures), and a commit of a structure
//   still being built ahead is launched directly instead of building it a second time.

// A copy of what building cb's graph reads (commands, bindings, params' size, events retained).
static ck_cmdbuf *copy_for_build(const ck_cmdbuf *cb) {
  auto *c = new ck_cmdbuf();
  c->id = cb->id;
  c->dev = cb->dev;
  c->commands = cb->commands;
  for (const Command &cmd : c->commands)
    if (cmd.kind != Command::kDispatch) cmd.event->retain();
  c->bindings = cb->bindings;
  c->params.resize(cb->params.size());
  c->event_commands = cb->event_commands;
  c->first_wait = cb->first_wait;
  c->shape_key = cb->shape_key;
  return c;
}

static void build_loop(ck_device *dev) {
  cudaSetDevice(dev->ordinal);
  GraphCache &G = dev->graphs;
  // Where a built graph is uploaded: a graph's first launch otherwise uploads it, ~150-240 us
  // of the submit thread's time on the H200 (measured per graph with CHERENKOV_CUDA_GRAPHS_VERBOSE).
  cudaStream_t upload = nullptr;
  if (cudaStreamCreateWithFlags(&upload, cudaStreamNonBlocking) != cudaSuccess) {
    cudaGetLastError();
    upload = nullptr;
  }
  for (;;) {
    ck_cmdbuf *job;
    {
      std::unique_lock<std::mutex> lk(G.m);
      G.jobs_cv.wait(lk, [&] { return G.stop || !G.jobs.empty(); });
      if (G.stop) {
        lk.unlock();
        if (upload) cudaStreamDestroy(upload);
        return;
      }
      job = G.jobs.front();
      G.jobs.pop_front();
    }
    const uint64_t t0 = steady_ns();
    auto *g = new Graph();
    uint64_t full = 0;
    shape_of(job, g->shape, g->starts, full, g->structure);
    std::string err;
    const bool ok = build_graph(dev, job, slice_layout(job), g, err);
    // Not needed for correctness: a failed upload leaves it to the first launch.
    if (ok && upload && (cudaGraphUpload(g->exec, upload) != cudaSuccess || cudaStreamSynchronize(upload) != cudaSuccess)) cudaGetLastError();
    const uint64_t ns = steady_ns() - t0;
    {
      std::lock_guard<std::mutex> lk(G.m);
      G.prime_ns += ns;
      if (ok) {
        G.built.push_back(g);
        G.primed++;
      } else {
        G.structures.erase(g->structure);
        G.prime_failures++;
        if (G.first_error.empty()) G.first_error = "building a graph ahead: " + err;
      }
    }
    if (!ok) release_graph(g);
    ck_cmdbuf_unref(job);
  }
}

// Stops the builder (device close, before the cache is released): queued copies are dropped.
static void stop_builder(ck_device *dev) {
  GraphCache &G = dev->graphs;
  {
    std::lock_guard<std::mutex> lk(G.m);
    G.stop = true;
  }
  G.jobs_cv.notify_all();
  if (G.builder.joinable()) G.builder.join();
  for (ck_cmdbuf *job : G.jobs) ck_cmdbuf_unref(job);
  G.jobs.clear();
  for (Graph *g : G.built) release_graph(g);
  G.built.clear();
}

// Updates the nodes of g's commands listed in G.patch to cb's (g claimed: nothing of it in
// flight), then records cb's shape as g's. Returns the failing step's message, or "".
static std::string update_nodes(GraphCache &G, Graph *g, const ck_cmdbuf *cb, const SliceLayout &lay) {
  if (G.patch.empty()) return "";
  uint32_t events = 0;
  size_t next = 0;
  for (size_t i = 0; i < cb->commands.size() && next < G.patch.size(); i++) {
    const Command &c = cb->commands[i];
    if (i != G.patch[next]) {
      if (c.kind != Command::kDispatch) events++;
      continue;
    }
    next++;
    KernelCall k;
    kernel_call(cb, c, lay, g->area, events, k, g->stamps);
    const cudaKernelNodeParams p = node_params(k);
    cudaError_t e = cudaGraphExecKernelNodeSetParams(g->exec, g->nodes[i], &p);
    if (e != cudaSuccess) return command_name(cb, i) + ": cudaGraphExecKernelNodeSetParams: " + cudaGetErrorString(e);
  }
  G.patched += G.patch.size();
  g->shape.swap(G.scratch);
  g->starts.swap(G.scratch_starts);
  return "";
}

// Enqueues cb as a replay of a graph, if one fits; false: launch it directly (nothing of it
// was run). `staged` is its pinned ring slice, written by stage().
static bool replay(ck_device *dev, ck_cmdbuf *cb, const SliceLayout &lay, const unsigned char *staged) {
  GraphCache &G = dev->graphs;
  const uint64_t t0 = G.verbose ? steady_ns() : 0;
  Graph *g = graph_for(dev, cb, lay);
  if (!g) {
    if (G.enabled) G.direct++;
    return false;
  }
  {
    // At most one command buffer in flight per graph: see "Why one area per graph is safe".
    std::unique_lock<std::mutex> lk(dev->qm);
    dev->flightcv.wait(lk, [&] { return !g->busy; });
    g->busy = true;
  }
  cb->graph = g;  // held until cb completes, whatever happens below (a copy into the area may be pending)
  const uint64_t t1 = G.verbose ? steady_ns() : 0;
  const size_t patching = G.patch.size();
  std::string failed = update_nodes(G, g, cb, lay);
  const uint64_t t2 = G.verbose ? steady_ns() : 0;
  cudaError_t e = cudaSuccess;
  if (failed.empty()) {
    e = cudaMemcpyAsync(g->area, staged, lay.bytes, cudaMemcpyHostToDevice, dev->stream);
    if (e != cudaSuccess) failed = std::string("copying its bytes to the graph's area: ") + cudaGetErrorString(e);
  }
  const uint64_t t3 = G.verbose ? steady_ns() : 0;
  const size_t stamp_bytes = 8 * cb->commands.size();
  if (failed.empty() && g->stamps) {
    e = cudaMemsetAsync(g->stamps, 0, stamp_bytes, dev->stream);
    if (e != cudaSuccess) failed = std::string("clearing its stamps: ") + cudaGetErrorString(e);
  }
  if (failed.empty()) {
    e = cudaGraphLaunch(g->exec, dev->stream);
    if (e != cudaSuccess) failed = std::string("cudaGraphLaunch: ") + cudaGetErrorString(e);
  }
  if (G.verbose) {
    const uint64_t t4 = steady_ns();
    g->replays++;
    g->patched += patching;
    g->t_wake += cb->t_committed_ns && t0 > cb->t_committed_ns ? t0 - cb->t_committed_ns : 0;
    g->t_lookup += t1 - t0;
    g->t_update += t2 - t1;
    g->t_copy += t3 - t2;
    g->t_launch += t4 - t3;
  }
  if (failed.empty() && g->stamps) {
    cb->t_launched = Profiler::host_ns();
    e = cudaMemcpyAsync(g->stamps_host, g->stamps, stamp_bytes, cudaMemcpyDeviceToHost, dev->stream);
    if (e != cudaSuccess) failed = std::string("reading its stamps: ") + cudaGetErrorString(e);
  }
  if (failed.empty()) {
    G.replays++;
    return true;
  }
  cudaGetLastError();
  char msg[64];
  std::snprintf(msg, sizeof msg, "command buffer %u: replaying a CUDA graph: ", cb->id);
  graph_error(G, msg + failed);
  G.failed.insert(g->structure);
  g->broken = true;
  g->last_use = 0;  // evicted first
  G.direct++;
  return false;
}

// At device close (streams idle, threads joined): the counters, then every graph released.
static void close_graphs(ck_device *dev) {
  GraphCache &G = dev->graphs;
  stop_builder(dev);
  if (G.verbose) {
    if (!G.enabled)
      std::fprintf(stderr, "cherenkov cuda graphs: off (CHERENKOV_CUDA_GRAPHS=0 or CHERENKOV_CUDA_PROFILE set)\n");
    else
      std::fprintf(stderr,
                   "cherenkov cuda graphs: %llu command buffers replayed, %llu launched directly (%.2f ms enqueueing them), %llu graphs "
                   "built at a launch (%.2f ms), %llu built ahead (%.2f ms; %llu adopted, %llu failed), %llu nodes updated, %llu evicted, "
                   "%llu graph errors%s%s\n",
                   (unsigned long long)G.replays, (unsigned long long)G.direct, G.direct_ns / 1e6, (unsigned long long)G.captures, G.build_ns / 1e6,
                   (unsigned long long)G.primed, G.prime_ns / 1e6, (unsigned long long)G.adopted, (unsigned long long)G.prime_failures,
                   (unsigned long long)G.patched, (unsigned long long)G.evictions, (unsigned long long)G.fallbacks,
                   G.first_error.empty() ? "" : "; first: ", G.first_error.c_str());
  }
  if (G.verbose)
    for (const Graph *g : G.entries)
      if (g->replays)
        std::fprintf(stderr,
                     "cherenkov cuda graph of %zu nodes: %llu replays; per replay (us): commit to submit %.1f, lookup %.1f, %.1f nodes "
                     "updated %.1f, copy %.1f, launch %.1f\n",
                     g->nodes.size(), (unsigned long long)g->replays, g->t_wake / 1e3 / g->replays, g->t_lookup / 1e3 / g->replays,
                     double(g->patched) / g->replays, g->t_update / 1e3 / g->replays, g->t_copy / 1e3 / g->replays,
                     g->t_launch / 1e3 / g->replays);
  for (Graph *g : G.entries) release_graph(g);
  G.entries.clear();
}
}  // namespace ck

// Enqueues one command buffer into the device's stream (submit thread): a graph replay when
// its shape has one, else a launch per command. Returns false with cb->error set when
// something could not be enqueued.
static bool enqueue(ck_device *dev, ck_cmdbuf *cb) {
  char msg[768];
  // Its ring slice: the cancel word, params and event values (FIFO; wait for completions when full).
  const ck::SliceLayout lay = ck::slice_layout(cb);
  size_t need = (lay.bytes + 255) & ~size_t(255);
  if (need > dev->ring_size) {
    std::snprintf(msg, sizeof msg, "command buffer %u: %zu bytes of params, more than the %zu-byte ring", cb->id, need, dev->ring_size);
    cb->error = msg;
    std::lock_guard<std::mutex> lk(dev->qm);
    dev->ring_live.push_back({0, 0});  // the completion thread pops one slice per command buffer
    return false;
  }
  size_t start = 0;
  {
    std::unique_lock<std::mutex> lk(dev->qm);
    for (;;) {
      size_t head = dev->ring_head;
      if (head + need > dev->ring_size) head = 0;  // wrap
      bool fits = true;
      for (auto &r : dev->ring_live)
        if (head < r.second && r.first < head + need) fits = false;
      if (fits) {
        start = head;
        break;
      }
      dev->flightcv.wait(lk);
    }
    dev->ring_head = start + need;
    dev->ring_live.push_back({start, start + need});
  }
  cb->ring_start = start;
  unsigned char *staged = dev->ring_host + start;
  ck::stage(cb, lay, staged);
  if (ck::replay(dev, cb, lay, staged)) return true;
  struct DirectTime {  // the host time of this direct launch (whichever return ends it), into the verbose line's sum
    ck::GraphCache &G;
    const uint64_t t0 = ck::steady_ns();
    ~DirectTime() { G.direct_ns += ck::steady_ns() - t0; }
  } direct_time{dev->graphs};

  // Direct: the bytes to the ring slice's device copy, then each command launched.
  unsigned char *base = dev->ring_gpu + start;
  cudaError_t e = cudaMemcpyAsync(base, staged, lay.bytes, cudaMemcpyHostToDevice, dev->stream);
  if (e != cudaSuccess) {
    std::snprintf(msg, sizeof msg, "command buffer %u: copying %zu bytes of params to the GPU failed: %s", cb->id, lay.bytes, cudaGetErrorString(e));
    cb->error = msg;
    return false;
  }
  ck::Profiler &prof = ck::Profiler::get();
  if (prof.on()) {
    cb->marks = prof.marks(cb->commands.size());
    cudaEventRecord(cb->marks[0], dev->stream);
  }
  uint32_t events = 0;
  for (size_t i = 0; i < cb->commands.size(); i++) {
    if (i > 0 && !cb->marks.empty()) cudaEventRecord(cb->marks[i], dev->stream);
    ck::KernelCall k;
    ck::kernel_call(cb, cb->commands[i], lay, base, events, k);
    e = ck::launch(dev, cb, i, k);
    if (e != cudaSuccess) {
      cudaGetLastError();
      cb->error = ck::command_name(cb, i) + ": launch failed: " + cudaGetErrorString(e);
      return false;
    }
  }
  if (!cb->marks.empty()) cudaEventRecord(cb->marks.back(), dev->stream);
  return true;
}

// CHERENKOV_CUDA_PROFILE: the command buffer's per-command times go to the profile (after
// completion, before its commands are released).
static void profile_completed(ck_cmdbuf *cb, bool ok) {
  if (ok && cb->graph && cb->graph->stamps_host) {
    std::vector<const char *> names(cb->commands.size());
    for (size_t i = 0; i < names.size(); i++) {
      const ck::Command &c = cb->commands[i];
      names[i] = c.kind == ck::Command::kDispatch ? c.kernel->name : c.kind == ck::Command::kSignal ? "(signal)" : "(wait)";
    }
    ck::Profiler::get().add_stamps(names, cb->graph->stamps_host, cb->t_commit, cb->t_launched, cb->t_done);
  }
  if (cb->marks.empty()) return;
  std::vector<std::string> names;
  if (ok && cb->marks.size() == cb->commands.size() + 1) {
    names.reserve(cb->commands.size());
    char row[256];
    for (auto &c : cb->commands) {
      if (c.kind == ck::Command::kDispatch)
        std::snprintf(row, sizeof row, "%s %ux%ux%u x %u", c.kernel->name, c.groups[0], c.groups[1], c.groups[2], c.tg[0] * c.tg[1] * c.tg[2]);
      names.push_back(c.kind == ck::Command::kDispatch ? row : c.kind == ck::Command::kSignal ? "(signal)" : "(wait)");
    }
  }
  ck::Profiler::get().add(cb->marks, names);
  cb->marks.clear();
}

static void finish(ck_cmdbuf *cb, int32_t status) {
  release_resources(cb);
  ck_device *dev = cb->dev;
  std::lock_guard<std::mutex> lk(dev->qm);
  cb->status.store(status, std::memory_order_release);
  dev->donecv.notify_all();
}

// ---- Spin, then sleep ----------------------------------------------------------------
//
// A decode step is two thread hand-offs: the commit wakes the submit thread, and the
// completion thread's notify wakes the host thread waiting for the step. Measured on the
// H200's host (in-graph stamps, docs/performance.md "eighteenth run"): 93-153 us from commit
// to the graph's launch and 104-245 us from the GPU's end to the next commit, against a
// 0.48 ms chain of kernels for the tiny model's step. A sleeping thread's wake-up is most of
// that. So both waiters poll an atomic for up to spin_us before they sleep: the host thread
// in ck_cmdbuf_wait (it waits anyway; spin_us in all over a command buffer's waits, so a
// prefill chunk waited for in slices spins only at first), the submit thread after each
// command buffer (the next commit comes one step later). One core busy while a model decodes, as the
// completion thread already is (it polls the GPU's event).
static inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Polls `ready` for up to `us` microseconds; whether it became true.
template <class Ready>
static bool spin_until(uint32_t us, Ready ready) {
  if (us == 0) return ready();
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  for (unsigned i = 0;; i++) {
    if (ready()) return true;
    cpu_relax();
    if ((i & 63u) == 63u && std::chrono::steady_clock::now() >= until) return ready();
  }
}

static void submit_loop(ck_device *dev) {
  cudaSetDevice(dev->ordinal);
  uint64_t taken = 0;  // commits taken from the queue
  for (;;) {
    ck_cmdbuf *cb;
    spin_until(dev->spin_us, [&] { return dev->committed.load(std::memory_order_acquire) > taken; });
    {
      std::unique_lock<std::mutex> lk(dev->qm);
      dev->qcv.wait(lk, [&] { return dev->stopping || !dev->queue.empty(); });
      if (dev->queue.empty()) {
        // The completion thread ends only after this: a command buffer popped but not yet in
        // flight (held at the WaitGate, say) must still be completed, and its gate count let go.
        dev->submit_done = true;
        lk.unlock();
        dev->flightcv.notify_all();
        return;
      }
      cb = dev->queue.front();
      dev->queue.pop_front();
      taken++;
    }
    // A command buffer with a wait is launched only while the reaper is not between its
    // device-synchronizing calls (ck::WaitGate); the completion thread lets go of it.
    cb->gated = cb->first_wait != SIZE_MAX;
    if (cb->gated) ck::WaitGate::enter();
    if (!enqueue(dev, cb)) cb->submit_failed = true;
    cudaError_t e = cudaEventCreateWithFlags(&cb->done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(cb->done, dev->stream);
    if (e != cudaSuccess) {  // the completion thread's query of `done` fails too: the command buffer fails
      cudaGetLastError();
      if (cb->error.empty()) cb->error = std::string("command buffer ") + std::to_string(cb->id) + ": recording its completion event: " + cudaGetErrorString(e);
      cb->submit_failed = true;
      // Without the event the completion thread would call it done at once, with its kernels (a
      // spinning wait among them) perhaps still running: its gate count and buffers would go early.
      cudaStreamSynchronize(dev->stream);
      cudaGetLastError();
    }
    {
      std::lock_guard<std::mutex> lk(dev->qm);
      dev->inflight.push_back(cb);
    }
    dev->flightcv.notify_all();
  }
}

// The first wait of `cb` whose event is still below its value (nullptr: none).
static ck::Command *blocked_wait(ck_cmdbuf *cb) {
  for (auto &c : cb->commands)
    if (c.kind == ck::Command::kWait && event_value(c.event) < c.value) return &c;
  return nullptr;
}

static void complete_loop(ck_device *dev) {
  cudaSetDevice(dev->ordinal);
  for (;;) {
    ck_cmdbuf *cb;
    {
      std::unique_lock<std::mutex> lk(dev->qm);
      dev->flightcv.wait(lk, [&] { return !dev->inflight.empty() || dev->submit_done; });
      if (dev->inflight.empty()) return;
      cb = dev->inflight.front();
    }
    // Wait for the stream to pass this command buffer. Spin briefly (the engine waits on
    // every step), then sleep in short steps. Its GPU waits time out by themselves
    // (ck_wait_kernel); one that did wrote this command buffer's id to its watch slot.
    ck::Command *blocked = nullptr;  // its first unsatisfied wait, when last looked at
    unsigned spins = 0;
    cudaError_t e;
    for (;;) {
      e = cudaEventQuery(cb->done);
      if (e != cudaErrorNotReady) {
        if (dev->graphs.stamps) cb->t_done = ck::Profiler::host_ns();
        break;
      }
      if (++spins < 20000) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      blocked = blocked_wait(cb);
    }
    std::string timed_out;
    volatile uint32_t &slot = dev->watch_host[1 + cb->id % ck::kWatchSlots];
    if (e == cudaSuccess && slot == cb->id) {
      slot = 0;
      // The first wait still unsatisfied is the one that timed out (the later ones returned
      // at the cancel word), unless a late release satisfied it: then the one last seen blocked.
      const ck::Command *w = blocked_wait(cb);
      if (!w) w = blocked;
      char msg[256];
      if (w)
        std::snprintf(msg, sizeof msg, "command buffer %u: wait for event %u >= %llu timed out after %u ms", cb->id, w->event->id,
                      static_cast<unsigned long long>(w->value), dev->wait_timeout_ms.load());
      else
        std::snprintf(msg, sizeof msg, "command buffer %u: a wait timed out after %u ms", cb->id, dev->wait_timeout_ms.load());
      timed_out = msg;
    }
    if (e != cudaSuccess && cb->error.empty()) {
      char msg[512];
      std::snprintf(msg, sizeof msg, "command buffer %u: CUDA error: %s (%s)", cb->id, cudaGetErrorName(e), cudaGetErrorString(e));
      cb->error = msg;
    }
    if (!timed_out.empty() && !cb->submit_failed) cb->error = timed_out;
    if (cb->gated) ck::WaitGate::leave();  // its waits are over, satisfied or timed out
    bool failed = cb->submit_failed || e != cudaSuccess || !timed_out.empty();
    profile_completed(cb, !failed);
    {
      std::lock_guard<std::mutex> lk(dev->qm);
      dev->inflight.pop_front();
      if (!dev->ring_live.empty()) dev->ring_live.pop_front();
      if (cb->graph) cb->graph->busy = false;  // its next replay may be enqueued (submit thread, in replay)
      cb->graph = nullptr;
    }
    dev->flightcv.notify_all();
    finish(cb, failed ? CK_CMDBUF_FAILED : CK_CMDBUF_COMPLETED);
    ck_cmdbuf_unref(cb);
  }
}

static int32_t encode_dispatch(ck_cmdbuf *cb, ck_pipeline *pipe, const uint32_t grid[3], const uint32_t tg[3],
                               bool grid_counts_threads, const ck_binding *bindings, uint32_t binding_count,
                               const void *params, uint32_t params_len) {
  ck::Command c{};
  if (ck::check_dispatch(cb, pipe, grid, tg, grid_counts_threads, bindings, binding_count, params, params_len, c) != CK_OK)
    return CK_ERROR;
  if (c.groups[1] > 65535 || c.groups[2] > 65535)
    return set_error("command buffer %u: dispatch of '%s' (%s): grid %ux%ux%u threadgroups: CUDA allows at most 65535 along y and z",
                     cb->id, c.kernel->name, c.kernel->where, c.groups[0], c.groups[1], c.groups[2]);
  ck::record_dispatch(cb, c, bindings, binding_count, params, params_len, [](ck_buffer *b) { return b->gpu; });
  return CK_OK;
}

static int32_t encode_event(ck_cmdbuf *cb, ck_event *ev, double value, ck::Command::Kind kind) {
  ck::Command c{};
  if (ck::check_event(cb, ev, value, kind, c) != CK_OK) return CK_ERROR;
  ev->retain();
  if (kind == ck::Command::kWait && cb->first_wait == SIZE_MAX) cb->first_wait = cb->commands.size();
  cb->commands.push_back(c);
  cb->event_commands++;
  return CK_OK;
}

// ---- the device ----------------------------------------------------------------------

extern "C" {

CK_API const char *ck_last_error(void) { return ck::last_error.c_str(); }
CK_API int32_t ck_abi_version(void) { return CK_ABI_VERSION; }

CK_API ck_device *ck_device_open(void) {
  // Each device has two streams and its GPU waits are spinning kernels: streams that share one
  // of the hardware queues (8 by default) can hold each other's work behind such a wait. More
  // queues keep several devices of one process (three models loaded at once) apart. Read when
  // the CUDA context is created, so only the first open in a process sets it; an explicit
  // setting wins.
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  // CHERENKOV_CUDA_SPIN_US: "Spin, then sleep" (default 2,000 us: a decode step's span).
  uint32_t spin_us = 2000u;
  if (const char *spin = std::getenv("CHERENKOV_CUDA_SPIN_US"); spin && *spin) {
    char *end = nullptr;
    errno = 0;
    const unsigned long v = std::strtoul(spin, &end, 10);
    if (*end != '\0' || errno != 0 || v > 10000000ul || *spin == '-')
      return set_error("ck_device_open: CHERENKOV_CUDA_SPIN_US=%s: expected microseconds, a whole number up to 10,000,000", spin), nullptr;
    spin_us = uint32_t(v);
  }
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    set_error("ck_device_open: no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0");
    cudaGetLastError();
    return nullptr;
  }
  auto *dev = new ck_device();
  dev->ordinal = 0;
  cudaSetDevice(0);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  long page = sysconf(_SC_PAGESIZE);
  dev->page_size = page > 0 ? uint32_t(page) : 4096;
  dev->working_set = double(prop.totalGlobalMem) * 0.9;
  char name[320];
  std::snprintf(name, sizeof name, "%s (cuda, sm_%d%d, %d SMs)", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  dev->name = name;
  e = cudaStreamCreateWithFlags(&dev->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&dev->copy, cudaStreamNonBlocking);
  dev->ring_size = size_t(32) << 20;
  if (e == cudaSuccess) e = cudaHostAlloc((void **)&dev->ring_host, dev->ring_size, cudaHostAllocDefault);
  void *watch = nullptr;
  if (e == cudaSuccess) e = cudaHostAlloc(&watch, 4 * (1 + ck::kWatchSlots), cudaHostAllocMapped | cudaHostAllocPortable);
  if (e == cudaSuccess) {
    std::memset(watch, 0, 4 * (1 + ck::kWatchSlots));
    dev->watch_host = static_cast<volatile uint32_t *>(watch);
    dev->watch_host[0] = dev->wait_timeout_ms.load();
    e = cudaHostGetDevicePointer(reinterpret_cast<void **>(&dev->watch_gpu), watch, 0);
  }
  if (e == cudaSuccess) e = ck::device_alloc(dev, (void **)&dev->ring_gpu, dev->ring_size, nullptr);
  if (e != cudaSuccess) {
    set_error("ck_device_open: %s", cudaGetErrorString(e));
    delete dev;
    return nullptr;
  }
  // CUDA graphs: on unless CHERENKOV_CUDA_GRAPHS=0 ("exact": no node updates, for telling a
  // fault in them apart); off under the per-command profiler (it records events between commands).
  const char *graphs = std::getenv("CHERENKOV_CUDA_GRAPHS");
  const char *verbose = std::getenv("CHERENKOV_CUDA_GRAPHS_VERBOSE");
  dev->graphs.enabled = !(graphs && std::strcmp(graphs, "0") == 0) && !ck::Profiler::get().on();
  dev->graphs.verbose = verbose && *verbose && std::strcmp(verbose, "0") != 0;
  dev->graphs.update_nodes = !(graphs && std::strcmp(graphs, "exact") == 0);
  // CHERENKOV_CUDA_GRAPH_HINTS=0: ck_cmdbuf_hint is ignored (no shape keys, nothing built ahead).
  const char *hints = std::getenv("CHERENKOV_CUDA_GRAPH_HINTS");
  dev->graphs.hints = !(hints && std::strcmp(hints, "0") == 0);
  const char *pdl = std::getenv("CHERENKOV_CUDA_PDL");
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev->ordinal);
  dev->graphs.pdl = major >= 9 && !(pdl && std::strcmp(pdl, "0") == 0) && !ck::Profiler::get().on();
#ifdef CK_STAMPS
  dev->graphs.stamps = dev->graphs.enabled && ck::Profiler::get().stamps_on();
#else
  if (ck::Profiler::get().stamps_on())
    std::fprintf(stderr, "cherenkov cuda: CHERENKOV_CUDA_STAMPS is ignored: this library was not built with CHERENKOV_CUDA_STAMPS_BUILD=1\n");
#endif
  dev->spin_us = spin_us;
  if (dev->graphs.enabled) dev->graphs.builder = std::thread(ck::build_loop, dev);
  dev->submitter = std::thread(submit_loop, dev);
  dev->completer = std::thread(complete_loop, dev);
  return dev;
}

CK_API void ck_device_close(ck_device *dev) {
  if (!dev) return;
  {
    std::lock_guard<std::mutex> lk(dev->qm);
    dev->stopping = true;
  }
  dev->qcv.notify_all();
  if (dev->submitter.joinable()) dev->submitter.join();
  dev->flightcv.notify_all();
  if (dev->completer.joinable()) dev->completer.join();
  cudaStreamSynchronize(dev->stream);
  ck::close_graphs(dev);
  ck::Profiler::get().dump();
  cudaStreamDestroy(dev->stream);
  cudaStreamDestroy(dev->copy);
  ck::Reaper::post({ck::Release::kHost, dev->ring_host, 0});
  ck::Reaper::post({ck::Release::kDevice, dev->ring_gpu, 0});
  ck::Reaper::post({ck::Release::kHost, const_cast<uint32_t *>(dev->watch_host), 0});
  delete dev;
}

CK_API const char *ck_device_backend(ck_device *) { return "cuda"; }
CK_API const char *ck_device_name(ck_device *dev) { return dev ? dev->name.c_str() : ""; }
CK_API double ck_device_max_working_set(ck_device *dev) { return dev ? dev->working_set : 0; }
CK_API uint32_t ck_device_max_threadgroup_memory(ck_device *) { return 32768; }
CK_API uint32_t ck_device_max_threads_per_threadgroup(ck_device *) { return ck::kMaxThreads; }
CK_API uint32_t ck_device_simd_width(ck_device *) { return ck::kSimdWidth; }
CK_API uint32_t ck_device_page_size(ck_device *dev) { return dev ? dev->page_size : 0; }
CK_API double ck_device_limit(ck_device *dev, int32_t limit) {
  if (!dev) return set_error("ck_device_limit: device is NULL"), -1;
  int value = 0;
  size_t free_bytes = 0, total_bytes = 0;
  switch (limit) {
    case CK_LIMIT_MAX_BUFFER_LENGTH:  // one cudaMalloc may take all of the GPU's memory
      cudaSetDevice(dev->ordinal);
      return cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess ? double(total_bytes) : (cudaGetLastError(), 0.0);
    case CK_LIMIT_MAX_WORKING_SET: return dev->working_set;
    case CK_LIMIT_PAGE_SIZE: return dev->page_size;
    case CK_LIMIT_EXECUTION_WIDTH: return ck::kSimdWidth;
    case CK_LIMIT_GPU_CORES:  // streaming multiprocessors
      return cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, dev->ordinal) == cudaSuccess ? value : (cudaGetLastError(), 0);
    case CK_LIMIT_MAX_THREADS_PER_THREADGROUP: return ck::kMaxThreads;
    case CK_LIMIT_MAX_THREADGROUP_MEMORY: return 32768;
    case CK_LIMIT_GPU_WAIT_LIMIT_MS: return 0;  // the driver does not end a stream's spin-wait
    default: return set_error("ck_device_limit: unknown limit %d (0 to %d)", limit, CK_LIMIT_COUNT - 1), -1;
  }
}
CK_API void ck_device_set_wait_timeout(ck_device *dev, uint32_t timeout_ms) {
  if (!dev) return;
  dev->wait_timeout_ms.store(timeout_ms);
  dev->watch_host[0] = timeout_ms;  // read by each GPU wait as it starts
}

// ---- buffers ----------------------------------------------------------------------------

CK_API ck_buffer *ck_buffer_new(ck_device *dev, double length) { return new_buffer(dev, length, CK_STORAGE_SHARED, "ck_buffer_new"); }
CK_API ck_buffer *ck_buffer_wrap(ck_device *dev, void *ptr, double length) {
  return wrap_buffer(dev, ptr, length, CK_STORAGE_SHARED, "ck_buffer_wrap");
}
CK_API ck_buffer *ck_buffer_new_storage(ck_device *dev, double length, int32_t storage) {
  return new_buffer(dev, length, storage, "ck_buffer_new_storage");
}
CK_API ck_buffer *ck_buffer_wrap_storage(ck_device *dev, void *ptr, double length, int32_t storage) {
  return wrap_buffer(dev, ptr, length, storage, "ck_buffer_wrap_storage");
}
CK_API int32_t ck_buffer_storage(ck_buffer *buf) { return buf ? buf->storage : CK_ERROR; }

static int32_t transfer(ck_buffer *buf, double offset, double length, bool up, const char *fn) {
  if (!buf) return set_error("%s: buffer is NULL", fn);
  uint64_t off, len;
  if (!ck::to_u64(offset, off) || !ck::to_u64(length, len) || off > buf->length || len > buf->length - off)
    return set_error("%s: range [%.17g, +%.17g) is not inside the buffer's %zu bytes", fn, offset, length, buf->length);
  if (buf->storage == CK_STORAGE_SHARED || len == 0) return CK_OK;
  ck_device *dev = buf->dev;
  std::lock_guard<std::mutex> lk(dev->copy_m);
  cudaError_t e = up ? cudaMemcpyAsync(buf->gpu + off, buf->host + off, len, cudaMemcpyHostToDevice, dev->copy)
                     : cudaMemcpyAsync(buf->host + off, buf->gpu + off, len, cudaMemcpyDeviceToHost, dev->copy);
  if (e == cudaSuccess) e = cudaStreamSynchronize(dev->copy);
  if (e != cudaSuccess) return set_error("%s: %llu bytes at %llu: %s", fn, (unsigned long long)len, (unsigned long long)off, cudaGetErrorString(e));
  return CK_OK;
}

CK_API int32_t ck_buffer_upload(ck_buffer *buf, double offset, double length) {
  return transfer(buf, offset, length, true, "ck_buffer_upload");
}
CK_API int32_t ck_buffer_download(ck_buffer *buf, double offset, double length) {
  return transfer(buf, offset, length, false, "ck_buffer_download");
}

CK_API void *ck_buffer_contents(ck_buffer *buf) { return buf ? buf->host : nullptr; }
CK_API double ck_buffer_length(ck_buffer *buf) { return buf ? double(buf->length) : 0; }
CK_API void ck_buffer_release(ck_buffer *buf) { ck_buffer_unref(buf); }

// ---- library ------------------------------------------------------------------------------

CK_API ck_library *ck_library_load(ck_device *dev, const char *) {
  if (!dev) return set_error("ck_library_load: device is NULL"), nullptr;
  cudaSetDevice(dev->ordinal);
  auto *lib = new ck_library();
  lib->dev = dev;
  for (uint32_t t = 0; t < ck::kAllTablesCount; t++)
    for (uint32_t i = 0; i < ck::kAllTables[t].count; i++) {
      const ck::KernelInfo *k = &ck::kAllTables[t].kernels[i];
      cudaFuncAttributes attr;
      cudaError_t e = cudaFuncGetAttributes(&attr, k->entry);
      if (e != cudaSuccess) {
        set_error("ck_library_load: kernel %s (%s): %s (was the CUDA backend built for this GPU?)", k->name, k->where, cudaGetErrorString(e));
        delete lib;
        return nullptr;
      }
      lib->pipelines.push_back(ck_pipeline{k, uint32_t(std::min(attr.maxThreadsPerBlock, int(ck::kMaxThreads)))});
    }
  std::sort(lib->pipelines.begin(), lib->pipelines.end(),
            [](const ck_pipeline &a, const ck_pipeline &b) { return std::strcmp(a.info->name, b.info->name) < 0; });
  for (auto &p : lib->pipelines) lib->by_name[p.info->name] = &p;
  return lib;
}

CK_API void ck_library_release(ck_library *lib) { delete lib; }
CK_API uint32_t ck_library_kernel_count(ck_library *lib) { return lib ? uint32_t(lib->pipelines.size()) : 0; }
CK_API const char *ck_library_kernel_name(ck_library *lib, uint32_t index) {
  if (!lib || index >= lib->pipelines.size()) return "";
  return lib->pipelines[index].info->name;
}
CK_API ck_pipeline *ck_pipeline_get(ck_library *lib, const char *name) {
  if (!lib || !name) return set_error("ck_pipeline_get: library or name is NULL"), nullptr;
  auto it = lib->by_name.find(name);
  if (it == lib->by_name.end()) {
    set_error("pipeline not found: %s (the cuda library has %zu kernels; was the shim rebuilt after adding it?)", name, lib->pipelines.size());
    return nullptr;
  }
  return it->second;
}
CK_API const char *ck_pipeline_name(ck_pipeline *pipe) { return pipe ? pipe->info->name : ""; }
CK_API uint32_t ck_pipeline_max_threads(ck_pipeline *pipe) { return pipe ? pipe->max_threads : 0; }

// ---- command buffers -------------------------------------------------------------------------

CK_API ck_cmdbuf *ck_cmdbuf_begin(ck_device *dev) {
  if (!dev) return set_error("ck_cmdbuf_begin: device is NULL"), nullptr;
  auto *cb = new ck_cmdbuf();
  cb->dev = dev;
  cb->commands.reserve(64);
  cb->bindings.reserve(256);
  // Never 0 (after 2^32 of them): a watch slot holds 0 when no wait of its command buffers timed out.
  do cb->id = dev->next_cmdbuf_id.fetch_add(1);
  while (cb->id == 0);
  return cb;
}

CK_API uint32_t ck_cmdbuf_id(ck_cmdbuf *cb) { return cb ? cb->id : 0; }

CK_API int32_t ck_encode_dispatch(ck_cmdbuf *cb, ck_pipeline *pipe, uint32_t grid_x, uint32_t grid_y, uint32_t grid_z,
                                  uint32_t tg_x, uint32_t tg_y, uint32_t tg_z, const ck_binding *bindings,
                                  uint32_t binding_count, const void *params, uint32_t params_len) {
  const uint32_t grid[3] = {grid_x, grid_y, grid_z}, tg[3] = {tg_x, tg_y, tg_z};
  return encode_dispatch(cb, pipe, grid, tg, false, bindings, binding_count, params, params_len);
}

CK_API int32_t ck_encode_dispatch_threads(ck_cmdbuf *cb, ck_pipeline *pipe, uint32_t threads_x, uint32_t threads_y,
                                          uint32_t threads_z, uint32_t tg_x, uint32_t tg_y, uint32_t tg_z,
                                          const ck_binding *bindings, uint32_t binding_count, const void *params,
                                          uint32_t params_len) {
  const uint32_t grid[3] = {threads_x, threads_y, threads_z}, tg[3] = {tg_x, tg_y, tg_z};
  return encode_dispatch(cb, pipe, grid, tg, true, bindings, binding_count, params, params_len);
}

CK_API int32_t ck_encode_tape(ck_cmdbuf *cb, const uint32_t *words, uint32_t word_count) {
  const char *why = nullptr;
  const int32_t s = ck_tape_encode(cb, words, word_count, &why);
  return why ? set_error("ck_encode_tape: %s", why) : s;
}
CK_API int32_t ck_encode_signal(ck_cmdbuf *cb, ck_event *ev, double value) { return encode_event(cb, ev, value, ck::Command::kSignal); }
CK_API int32_t ck_encode_wait(ck_cmdbuf *cb, ck_event *ev, double value) { return encode_event(cb, ev, value, ck::Command::kWait); }
// The driver ends no stream for waiting (CK_LIMIT_GPU_WAIT_LIMIT_MS is 0): a GPU-side wait is fine.
CK_API int32_t ck_encode_wait_host(ck_cmdbuf *cb, ck_event *ev, double value) { return ck_encode_wait(cb, ev, value); }

CK_API int32_t ck_cmdbuf_hint(ck_cmdbuf *cb, uint32_t shape_key, int32_t prime) {
  if (ck::check_encoding(cb, "hint") != CK_OK) return CK_ERROR;
  ck::GraphCache &G = cb->dev->graphs;
  if (!G.hints) return CK_OK;
  cb->shape_key = shape_key;
  if (!prime || !shape_key || !G.enabled || cb->commands.empty()) return CK_OK;
  const uint64_t structure = ck::structure_of(cb);
  {
    // One graph per structure (the key is part of it): one there, or coming, is not built
    // again; a full queue drops the hint (the second sight builds it, as without one).
    std::lock_guard<std::mutex> lk(G.m);
    if (G.stop || G.structures.count(structure) || G.jobs.size() >= ck::kPrimeQueue) return CK_OK;
    G.structures.insert(structure);
  }
  ck_cmdbuf *copy = ck::copy_for_build(cb);
  {
    std::lock_guard<std::mutex> lk(G.m);
    G.jobs.push_back(copy);
  }
  G.jobs_cv.notify_one();
  return CK_OK;
}

CK_API int32_t ck_cmdbuf_commit(ck_cmdbuf *cb) {
  if (ck::check_encoding(cb, "commit") != CK_OK) return CK_ERROR;
  ck_device *dev = cb->dev;
  cb->retain();
  if (dev->graphs.stamps) cb->t_commit = ck::Profiler::host_ns();
  if (dev->graphs.verbose) cb->t_committed_ns = ck::steady_ns();
  {
    std::lock_guard<std::mutex> lk(dev->qm);
    cb->status.store(CK_CMDBUF_COMMITTED);
    dev->queue.push_back(cb);
    dev->committed.fetch_add(1, std::memory_order_release);
  }
  dev->qcv.notify_one();
  return CK_OK;
}

CK_API int32_t ck_cmdbuf_wait(ck_cmdbuf *cb, uint32_t timeout_ms) {
  if (!cb) return set_error("ck_cmdbuf_wait: command buffer is NULL");
  if (cb->status.load() == CK_CMDBUF_ENCODING) return set_error("command buffer %u: wait before commit", cb->id);
  ck_device *dev = cb->dev;
  // Its waits spin for spin_us in all (a long step, waited for in slices, then sleeps).
  const uint32_t spun = cb->spun_us.load(std::memory_order_relaxed);
  const uint32_t spin = uint32_t(std::min<uint64_t>(dev->spin_us > spun ? dev->spin_us - spun : 0u, uint64_t(timeout_ms) * 1000u));
  cb->spun_us.fetch_add(spin, std::memory_order_relaxed);
  if (!spin_until(spin, [&] { return cb->status.load(std::memory_order_acquire) >= CK_CMDBUF_COMPLETED; })) {
    std::unique_lock<std::mutex> lk(dev->qm);
    dev->donecv.wait_for(lk, std::chrono::milliseconds(timeout_ms) - std::chrono::microseconds(spin),
                         [&] { return cb->status.load() >= CK_CMDBUF_COMPLETED; });
  }
  int32_t s = cb->status.load(std::memory_order_acquire);
  if (s == CK_CMDBUF_COMPLETED) return CK_OK;
  if (s == CK_CMDBUF_FAILED) return set_error("%s", cb->error.c_str());
  return CK_TIMEOUT;
}

CK_API int32_t ck_cmdbuf_status(ck_cmdbuf *cb) { return cb ? cb->status.load(std::memory_order_acquire) : CK_ERROR; }
CK_API const char *ck_cmdbuf_error(ck_cmdbuf *cb) {
  if (!cb || cb->status.load(std::memory_order_acquire) != CK_CMDBUF_FAILED) return "";
  return cb->error.c_str();
}
CK_API void ck_cmdbuf_release(ck_cmdbuf *cb) { ck_cmdbuf_unref(cb); }

// ---- events --------------------------------------------------------------------------------------

CK_API ck_event *ck_event_new(ck_device *dev) {
  if (!dev) return set_error("ck_event_new: device is NULL"), nullptr;
  void *h = nullptr;
  cudaError_t e = cudaHostAlloc(&h, 64, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess) return set_error("ck_event_new: %s", cudaGetErrorString(e)), nullptr;
  std::memset(h, 0, 64);
  auto *ev = new ck_event();
  ev->word = static_cast<volatile uint64_t *>(h);
  void *d = nullptr;
  cudaHostGetDevicePointer(&d, h, 0);
  ev->dptr = reinterpret_cast<CUdeviceptr>(d);
  ev->id = dev->next_event_id.fetch_add(1);
  return ev;
}

CK_API uint32_t ck_event_id(ck_event *ev) { return ev ? ev->id : 0; }
CK_API double ck_event_value(ck_event *ev) { return ev ? double(event_value(ev)) : 0; }

CK_API int32_t ck_event_set(ck_event *ev, double value) {
  uint64_t v;
  if (!ev) return set_error("ck_event_set: event is NULL");
  if (!ck::to_u64(value, v)) return set_error("event %u: value %.17g is not an integer in [0, 2^53]", ev->id, value);
  // Apple's rule: a value below the current one is ignored (a late release after a timed-out wait).
  uint64_t cur = __atomic_load_n(ev->word, __ATOMIC_ACQUIRE);
  while (cur < v && !__atomic_compare_exchange_n(ev->word, &cur, v, true, __ATOMIC_RELEASE, __ATOMIC_ACQUIRE)) {
  }
  return CK_OK;
}

// Spins first (a step's handshake is microseconds), then sleeps in short steps.
CK_API int32_t ck_event_wait(ck_event *ev, double value, uint32_t timeout_ms) {
  uint64_t v;
  if (!ev) return set_error("ck_event_wait: event is NULL");
  if (!ck::to_u64(value, v)) return set_error("event %u: value %.17g is not an integer in [0, 2^53]", ev->id, value);
  if (event_value(ev) >= v) return CK_OK;
  auto start = std::chrono::steady_clock::now();
  auto deadline = start + std::chrono::milliseconds(timeout_ms);
  for (unsigned i = 0;; i++) {
    if (event_value(ev) >= v) return CK_OK;
    if ((i & 255) == 0) {
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return CK_TIMEOUT;
      if (now - start > std::chrono::milliseconds(2)) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
}

CK_API void ck_event_release(ck_event *ev) { ck_event_unref(ev); }

}  // extern "C"
