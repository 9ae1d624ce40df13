// Self-test kernels: small, obvious kernels that exercise every part of the
// execution model (plain threads, threadgroup memory and barriers, SIMD
// functions, atomics, builtins, partial threadgroups, template
// instantiation). spec/native tests run them against TypeScript computations.
#include <metal_stdlib>
#include "params.h"

using namespace metal;

// c = a + b for the first p.n elements; threads past the end return.
kernel void selftest_add_f32(
    constant SelftestParams& p [[buffer(0)]],
    device const float* a      [[buffer(1)]],
    device const float* b      [[buffer(2)]],
    device float* c            [[buffer(3)]],
    uint i                     [[thread_position_in_grid]]) {
  if (i >= p.n) {
    return;
  }
  c[i] = a[i] + b[i];
}

// y = x * p.scale for the first p.n elements.
kernel void selftest_scale_f32(
    constant SelftestParams& p [[buffer(0)]],
    device const float* x      [[buffer(1)]],
    device float* y            [[buffer(2)]],
    uint i                     [[thread_position_in_grid]]) {
  if (i < p.n) {
    y[i] = x[i] * p.scale;
  }
}

// out[row] = p.scale * sum(x[row][0 .. p.cols)), one threadgroup per row, a
// tree reduction in threadgroup memory (threads per threadgroup: a power of 2).
kernel void selftest_row_sum_tree_f32(
    constant SelftestParams& p [[buffer(0)]],
    device const float* x      [[buffer(1)]],
    device float* out          [[buffer(2)]],
    uint row                   [[threadgroup_position_in_grid]],
    uint t                     [[thread_index_in_threadgroup]],
    uint nt                    [[threads_per_threadgroup]]) {
  threadgroup float partial[1024];
  device const float* xr = x + row * p.cols;
  float s = 0.0f;
  for (uint c = t; c < p.cols; c += nt) {
    s += xr[c];
  }
  partial[t] = s;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint stride = nt / 2; stride > 0; stride /= 2) {
    if (t < stride) {
      partial[t] += partial[t + stride];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (t == 0) {
    out[row] = partial[0] * p.scale;
  }
}

// The same sum the usual way: simd_sum per simdgroup, partial sums through
// threadgroup memory, simd_sum again in simdgroup 0 only.
kernel void selftest_row_sum_simd_f32(
    constant SelftestParams& p [[buffer(0)]],
    device const float* x      [[buffer(1)]],
    device float* out          [[buffer(2)]],
    uint row                   [[threadgroup_position_in_grid]],
    uint t                     [[thread_index_in_threadgroup]],
    uint nt                    [[threads_per_threadgroup]],
    ushort lane                [[thread_index_in_simdgroup]],
    ushort sg                  [[simdgroup_index_in_threadgroup]],
    ushort nsg                 [[simdgroups_per_threadgroup]]) {
  threadgroup float partial[32];
  threadgroup float* mine = partial + sg;
  device const float* xr = x + row * p.cols;
  float s = 0.0f;
  for (uint c = t; c < p.cols; c += nt) {
    s += xr[c];
  }
  s = simd_sum(s);
  if (lane == 0) {
    *mine = s;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (sg == 0) {
    float v = lane < nsg ? partial[lane] : 0.0f;
    v = simd_sum(v);
    if (lane == 0) {
      out[row] = v * p.scale;
    }
  }
}

// Every SIMD function on x[i], 12 results per thread at out[12 i ...].
// Threads past p.n return first, so the last simdgroup may have inactive lanes.
template <typename T>
kernel void selftest_simd(
    constant SelftestParams& p [[buffer(0)]],
    device const T* x          [[buffer(1)]],
    device T* out              [[buffer(2)]],
    uint i                     [[thread_position_in_grid]],
    ushort lane                [[thread_index_in_simdgroup]]) {
  if (i >= p.n) {
    return;
  }
  T v = x[i];
  device T* o = out + i * 12;
  o[0] = simd_sum(v);
  o[1] = simd_max(v);
  o[2] = simd_min(v);
  o[3] = simd_shuffle(v, ushort((lane * 7 + 3) % 32));
  o[4] = simd_shuffle_xor(v, ushort(5));
  o[5] = simd_broadcast(v, ushort(11));
  o[6] = simd_prefix_exclusive_sum(v);
  o[7] = simd_prefix_inclusive_sum(v);
  o[8] = simd_shuffle_down(v, ushort(3));
  o[9] = simd_shuffle_up(v, ushort(2));
  o[10] = simd_broadcast_first(v);
  o[11] = simd_is_first() ? T(1) : T(0);
}

template [[host_name("selftest_simd_f32")]] kernel decltype(selftest_simd<float>) selftest_simd<float>;
template [[host_name("selftest_simd_i32")]] kernel decltype(selftest_simd<int>) selftest_simd<int>;
template [[host_name("selftest_simd_f16")]] kernel decltype(selftest_simd<half>) selftest_simd<half>;

// Every builtin of every thread, 20 uints per thread, indexed by the thread's
// linear position in the grid.
kernel void selftest_builtins(
    device uint* out     [[buffer(1)]],
    uint3 tpig           [[thread_position_in_grid]],
    uint3 tpitg          [[thread_position_in_threadgroup]],
    uint3 tgpig          [[threadgroup_position_in_grid]],
    uint3 ntptg          [[threads_per_threadgroup]],
    uint3 ntgpg          [[threadgroups_per_grid]],
    uint3 ntpg           [[threads_per_grid]],
    uint tiitg           [[thread_index_in_threadgroup]],
    ushort lane          [[thread_index_in_simdgroup]],
    ushort sg            [[simdgroup_index_in_threadgroup]],
    uint width           [[threads_per_simdgroup]]) {
  device uint* o = out + 20 * (tpig.x + ntpg.x * (tpig.y + ntpg.y * tpig.z));
  o[0] = tpig.x; o[1] = tpig.y; o[2] = tpig.z;
  o[3] = tpitg.x; o[4] = tpitg.y; o[5] = tpitg.z;
  o[6] = tgpig.x; o[7] = tgpig.y; o[8] = tgpig.z;
  o[9] = ntptg.x; o[10] = ntptg.y; o[11] = ntptg.z;
  o[12] = ntgpg.x; o[13] = ntgpg.y; o[14] = ntgpg.z;
  o[15] = tiitg;
  o[16] = lane;
  o[17] = sg;
  o[18] = width;
  o[19] = 1;
}

// counts[0] += threads that ran (device atomic); counts[1 + tg] = threads of
// threadgroup tg counted through a threadgroup atomic.
kernel void selftest_atomic_count(
    device atomic_uint* counts [[buffer(1)]],
    uint t                     [[thread_index_in_threadgroup]],
    uint tg                    [[threadgroup_position_in_grid]]) {
  threadgroup atomic_uint local;
  if (t == 0) {
    atomic_store_explicit(&local, 0u, memory_order_relaxed);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  atomic_fetch_add_explicit(&local, 1u, memory_order_relaxed);
  atomic_fetch_add_explicit(&counts[0], 1u, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (t == 0) {
    atomic_store_explicit(&counts[1 + tg], atomic_load_explicit(&local, memory_order_relaxed),
                          memory_order_relaxed);
  }
}

// Conversions and vector math: per i, out[4 i ...] = {float(half(x)),
// float(bfloat(x)), dot(float4(x, 1, 2, 3), float4(2)), as_type<float>(as_type<uint>(x) ^ 0x80000000)}.
kernel void selftest_convert_f32(
    constant SelftestParams& p [[buffer(0)]],
    device const float* x      [[buffer(1)]],
    device float4* out         [[buffer(2)]],
    uint i                     [[thread_position_in_grid]]) {
  if (i >= p.n) {
    return;
  }
  float v = x[i];
  half h = half(v);
  bfloat b = bfloat(v);
  float4 a = float4(v, 1.0f, 2.0f, 3.0f);
  float4 r;
  r.x = float(h);
  r.y = float(b);
  r.z = dot(a, float4(2.0f));
  r.w = as_type<float>(as_type<uint>(v) ^ 0x80000000u);
  out[i] = r;
}

// A deliberate kernel bug for the emulator's error path (never run on a GPU):
// lanes 0-15 wait in a SIMD function while lanes 16-31 wait at a barrier.
kernel void selftest_deadlock(
    device float* out [[buffer(1)]],
    ushort lane       [[thread_index_in_simdgroup]]) {
  if (lane < 16) {
    out[lane] = simd_sum(1.0f);
  } else {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
}

// Does nothing: measures the cost of a dispatch.
kernel void selftest_empty(uint i [[thread_position_in_grid]]) {
}

// p.n threadgroup barriers in a row: measures the emulator's switch cost.
kernel void selftest_barrier_loop(
    constant SelftestParams& p [[buffer(0)]],
    device uint* out           [[buffer(1)]],
    uint i                     [[thread_position_in_grid]]) {
  for (uint r = 0; r < p.n; r++) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  out[i] = p.n;
}
