// Internal contract between the CPU runtime and the generated kernel tables.
// Plain C++: it must not include the Metal prelude (whose macros rename
// `device`, `thread`, `constant`, `kernel`), so the runtime can use std::thread.
#pragma once
#include <cstdint>

namespace ck {

constexpr uint32_t kSimdWidth = 32;
constexpr uint32_t kMaxThreads = 1024;  // per threadgroup
constexpr uint32_t kMaxBuffers = 31;    // [[buffer(0..30)]]
constexpr uint32_t kSlotBytes = 16;     // largest value a SIMD op exchanges (float4)

// Everything a kernel thread's builtins are computed from.
struct ThreadCtx {
  void *const *buf;         // kMaxBuffers entries: base + offset of each binding
  uint32_t tpig[3];         // thread_position_in_grid
  uint32_t tpitg[3];        // thread_position_in_threadgroup
  uint32_t tgpig[3];        // threadgroup_position_in_grid
  uint32_t ntptg[3];        // threads_per_threadgroup (partial at a dispatchThreads edge)
  uint32_t dtptg[3];        // dispatch_threads_per_threadgroup (the requested size)
  uint32_t ntgpg[3];        // threadgroups_per_grid
  uint32_t ntpg[3];         // threads_per_grid
  uint32_t index;           // thread_index_in_threadgroup
  uint32_t lane;            // thread_index_in_simdgroup
  uint32_t simdgroup;       // simdgroup_index_in_threadgroup
  uint32_t simdgroups;      // simdgroups_per_threadgroup
};

using InvokeFn = void (*)(const ThreadCtx &);

// One compiled kernel, as the generator's table describes it.
struct KernelInfo {
  const char *name;          // pipeline name ([[host_name]] or the function name)
  const char *where;         // "kernels/file.metal:line" of its signature
  InvokeFn invoke;           // calls the kernel for one thread
  uint32_t buffer_mask;      // bit i: the kernel declares [[buffer(i)]]
  uint32_t min_bytes[kMaxBuffers];  // bytes a reference parameter reads at [[buffer(i)]]
  uint32_t max_threads;      // [[max_total_threads_per_threadgroup(N)]], else kMaxThreads
};

struct KernelTable {
  const KernelInfo *kernels;
  uint32_t count;
};

// Every generated table, listed by the generated registry.
extern const KernelTable kAllTables[];
extern const uint32_t kAllTablesCount;

// ---- synchronisation points, called by the prelude from inside a kernel ----

// What a lane sees after a SIMD exchange: the 32 published values (kSlotBytes
// apart) of its simdgroup, the mask of lanes that published (lanes that have
// returned are absent), and its own lane.
struct SimdView {
  const unsigned char *slots;
  uint32_t active;
  uint32_t lane;
};

// Publishes `size` (<= kSlotBytes) bytes of this lane's value and waits until
// every live lane of the simdgroup has published. The view stays valid until
// this lane's next SIMD operation.
SimdView simd_exchange(const void *value, uint32_t size);
// threadgroup_barrier: waits until every live thread of the threadgroup arrives.
void threadgroup_sync();

}  // namespace ck
