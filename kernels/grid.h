// Where a kernel waits for the previous dispatch's results, and what it may do before.
//
// On CUDA every dispatch is launched as a programmatic dependent of the one before it
// (docs/cuda.md): its threadgroups may start while that one still runs, and a generated entry
// waits for it (griddepcontrol.wait) before calling the kernel. A kernel whose body calls
// ck_inputs_ready() itself is launched without that wait (metal-shim/gen-bindings.ts finds the
// call), so it can ask for its weights first: ck_prefetch brings bytes into L2 while the
// previous kernel (often a latency-bound one that leaves the memory idle) finishes. Before the
// call a kernel may read only what no dispatch writes (weights; params are by value) and may
// write nothing; every path that touches other memory must pass through the call. A prefetch
// is not a read: L2 holds the newest data whoever wrote it, so a kernel may ask early for what
// dispatches write (DeltaNet's state), and reads it after the call.
//
// Metal runs the dispatches of a serial compute encoder one after the other and has no such
// launch, and the CPU backend runs them in order: both functions do nothing there.
#ifndef CHERENKOV_GRID_H
#define CHERENKOV_GRID_H

#include <metal_stdlib>

using namespace metal;

#if defined(__CUDACC__)
// The generated entry's wait (metal-shim/cuda/abi.h), called where the kernel chooses.
inline void ck_inputs_ready() {
  ck::after_previous_grid();
}
#else
inline void ck_inputs_ready() {}
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// [p, p + bytes) into L2, one instruction (a bulk prefetch: 16-byte granules, so the range is
// widened to them; weights live in allocations of 256-byte granules).
inline void ck_prefetch(device const uchar* p, uint bytes) {
  const ulong a = ulong(p) & ~ulong(15);
  const uint n = uint((ulong(p) + bytes + 15 - a) & ~ulong(15));
  if (bytes > 0u) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(n) : "memory");
  }
}
#else
inline void ck_prefetch(device const uchar* p, uint bytes) {}
#endif

#endif
