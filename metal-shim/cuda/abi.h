// Internal contract between the CUDA runtime (runtime.cu) and the generated kernel tables
// (metal-shim/cuda/gen.ts). Plain C++: no Metal prelude (whose macros rename `device`,
// `constant`, `thread`, `kernel`).
#pragma once
#include <cstdint>

namespace ck {

constexpr uint32_t kSimdWidth = 32;
constexpr uint32_t kMaxThreads = 1024;  // per threadgroup (entries without an MSL bound get __launch_bounds__(1024))
constexpr uint32_t kMaxBuffers = 31;    // [[buffer(0..30)]]

// The first thing every kernel does (generated entries and the event kernels): wait until
// the previous kernel of the stream has completed with its memory visible, then let the next
// one be launched. A no-op unless the runtime launched this kernel as a programmatic
// dependent (runtime.cu "Programmatic launch"); then the next kernel's launch overlaps this
// one's work instead of starting after it, and its threadgroups wait here.
__device__ __forceinline__ void after_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// What every generated __global__ entry receives by value: the bound addresses (device
// pointers: base + offset) and the dispatch's shape. A threadgroup is a 1-D block of
// tg[0]*tg[1]*tg[2] threads; blockIdx is the threadgroup's position in the grid.
struct Launch {
  void *buf[kMaxBuffers];
  uint32_t tg[3];       // dispatch_threads_per_threadgroup (the requested size)
  uint32_t threads[3];  // threads per grid (groups * tg unless dispatchThreads)
  // The command buffer's cancel word (device memory): set when one of its GPU waits timed
  // out, so that every later command of it does nothing, as the other backends skip them.
  // Null for a dispatch before the command buffer's first wait (nothing can cancel it).
  const volatile uint32_t *cancel;
  // CHERENKOV_CUDA_STAMPS (profile.h "Stamps"): where this command of a graph replay records
  // the GPU clock at which its threadgroups end (the latest of their first threads). Null
  // otherwise.
  unsigned long long *stamp;
};

// A threadgroup's end, for the stamps: its first thread's clock, the largest over the grid.
// Thread 0 only (no barrier, which threads that returned early would not reach): a
// threadgroup's other simdgroups may end a little later. Called by the generated entries of a
// profiling build only (CHERENKOV_CUDA_STAMPS_BUILD=1 defines CK_STAMPS): in every build it
// made hot kernels spill (hc_coeffs_read_norm_f32: 180 bytes).
__device__ __forceinline__ void stamp_end(unsigned long long *stamp) {
#if defined(__CUDA_ARCH__)
  if (stamp != nullptr && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    atomicMax(stamp, t);
  }
#endif
}

// One compiled kernel, as the generated table describes it.
struct KernelInfo {
  const char *name;          // pipeline name ([[host_name]] or the function name)
  const char *where;         // "kernels/file.metal:line" of its signature
  const void *entry;         // the __global__ entry point (for cudaLaunchKernel)
  uint32_t buffer_mask;      // bit i: the kernel declares [[buffer(i)]]
  uint32_t min_bytes[kMaxBuffers];  // bytes a reference parameter reads at [[buffer(i)]]
};

struct KernelTable {
  const KernelInfo *kernels;
  uint32_t count;
};

extern const KernelTable kAllTables[];
extern const uint32_t kAllTablesCount;

}  // namespace ck
