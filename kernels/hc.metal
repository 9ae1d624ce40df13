// Hyper-connections (MODEL.md "Residual"): coefficients from the raw products fn . flat
// (a matvec computes those), the gated read x = sum_i pre_i X_i (optionally normalised),
// and the write X'_j = post_j y + sum_i comb[i][j] X_i. Coefficient rows are
// [pre (n) | post (n) | comb (n * n, [i][j])] for a site and [pre (n)] for the final read.
#include <metal_stdlib>
#include "params.h"

using namespace metal;

#define HC_MAX_STREAMS 8
// A row per threadgroup of HC_TG_SG simdgroups: the sums over n * d stream values are split
// across all its threads (one simdgroup per row was latency-bound on the H200: 85 us for
// the coefficients and 69 us for a read at d = 2048, n = 4), partial sums meet in
// threadgroup memory in simdgroup order.
#define HC_TG_SG 8
static_assert(HC_TG_SG * 32 == 256, "update the hc kernels' [[max_total_threads_per_threadgroup]]");

inline float hc_sigmoid(float v) {
  return 1.0f / (1.0f + exp(-v));
}

// The sum over the threadgroup of each thread's `v` (every thread gets it); `partial` holds
// HC_TG_SG floats. Two barriers: the caller may call it again with the same `partial`.
inline float hc_tg_sum(float v, threadgroup float* partial, ushort sg, ushort lane) {
  v = simd_sum(v);
  if (lane == 0) {
    partial[sg] = v;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float total = 0.0f;
  for (int s = 0; s < HC_TG_SG; s++) {
    total += partial[s];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return total;
}

// The coefficients of one row from its mixes (thread 0 of the row's threadgroup). N > 0 fixes n
// at compile time: every loop has a constant trip count, so comb[] lives in registers (with a
// runtime n it was indexed dynamically: local memory, about 50 us a call on the H200). N = 0
// takes n from the params. The same operations in the same order either way.
template <int N>
inline void hc_coeffs_row(constant HcCoeffsParams& p, float rs, device const float* scale,
                          device const float* base, device const float* mix, device float* out) {
  const int n = N > 0 ? N : p.streams;
  for (int i = 0; i < n; i++) {
    out[i] = hc_sigmoid(mix[i] * rs * scale[0] + base[i]) + p.eps;
  }
  if (p.head != 0) {
    return;
  }
  for (int i = 0; i < n; i++) {
    out[n + i] = 2.0f * hc_sigmoid(mix[n + i] * rs * scale[1] + base[n + i]);
  }
  float comb[HC_MAX_STREAMS * HC_MAX_STREAMS];
  for (int i = 0; i < n; i++) {
    float m = -INFINITY;
    for (int j = 0; j < n; j++) {
      comb[i * n + j] = mix[2 * n + i * n + j] * rs * scale[2] + base[2 * n + i * n + j];
      m = max(m, comb[i * n + j]);
    }
    float s = 0.0f;
    for (int j = 0; j < n; j++) {
      comb[i * n + j] = exp(comb[i * n + j] - m);
      s += comb[i * n + j];
    }
    for (int j = 0; j < n; j++) {
      comb[i * n + j] = comb[i * n + j] / s + p.eps;
    }
  }
  // Columns first, then iters - 1 rounds of {rows, columns}: round 0 does columns only.
  for (int it = 0; it < p.iters; it++) {
    if (it > 0) {
      for (int i = 0; i < n; i++) {
        float s = 0.0f;
        for (int j = 0; j < n; j++) {
          s += comb[i * n + j];
        }
        for (int j = 0; j < n; j++) {
          comb[i * n + j] /= s + p.eps;
        }
      }
    }
    for (int j = 0; j < n; j++) {
      float s = 0.0f;
      for (int i = 0; i < n; i++) {
        s += comb[i * n + j];
      }
      for (int i = 0; i < n; i++) {
        comb[i * n + j] /= s + p.eps;
      }
    }
  }
  for (int k = 0; k < n * n; k++) {
    out[2 * n + k] = comb[k];
  }
}

// A threadgroup per row: its threads sum flat^2, thread 0 turns the row's mixes into
// coefficients (Sinkhorn is n x n with n <= 8: serial is cheaper than a reduction per step).
[[max_total_threads_per_threadgroup(256)]] kernel void hc_coeffs_f32(
    constant HcCoeffsParams& p [[buffer(0)]],
    device const uchar* x      [[buffer(1)]],
    device const uchar* raw    [[buffer(2)]],
    device const float* scale  [[buffer(3)]],
    device const float* base   [[buffer(4)]],
    device uchar* coeffs       [[buffer(5)]],
    uint tg                    [[threadgroup_position_in_grid]],
    ushort sg                  [[simdgroup_index_in_threadgroup]],
    ushort lane                [[thread_index_in_simdgroup]]) {
  threadgroup float partial[HC_TG_SG];
  int row = int(tg);
  if (row >= p.rows) {
    return;  // uniform per threadgroup
  }
  int n = p.streams;
  int len = n * p.cols;
  device const float* flat = (device const float*)(x + ulong(row) * p.x_stride);
  float ss = 0.0f;
  for (int c = int(sg) * 32 + int(lane); c < len; c += 32 * HC_TG_SG) {
    float v = flat[c];
    ss += v * v;
  }
  ss = hc_tg_sum(ss, partial, sg, lane);
  if (sg != 0 || lane != 0) {
    return;
  }
  float rs = rsqrt(ss / float(len) + p.eps);
  device const float* mix = (device const float*)(raw + ulong(row) * p.raw_stride);
  device float* out = (device float*)(coeffs + ulong(row) * p.c_stride);
  if (n == 4) {
    hc_coeffs_row<4>(p, rs, scale, base, mix, out);
  } else {
    hc_coeffs_row<0>(p, rs, scale, base, mix, out);
  }
}

// x = sum_i pre_i X_i per row, then (NORM) x * rsqrt(mean(x^2) + eps) * w. A threadgroup
// per row; the norm rescales, in a second pass, the elements the same thread wrote.
template <bool NORM>
inline void hc_read_row(constant HcReadParams& p, device const uchar* x, device const uchar* coeffs,
                        device const float* w, device uchar* y, int row, threadgroup float* partial,
                        ushort sg, ushort lane) {
  const int t = int(sg) * 32 + int(lane);
  int n = p.streams;
  device const float* X = (device const float*)(x + ulong(row) * p.x_stride);
  device const float* pre = (device const float*)(coeffs + ulong(row) * p.c_stride);
  device float* out = (device float*)(y + ulong(row) * p.y_stride);
  float ss = 0.0f;
  for (int c = t; c < p.cols; c += 32 * HC_TG_SG) {
    float v = 0.0f;
    for (int i = 0; i < n; i++) {
      v += pre[i] * X[i * p.cols + c];
    }
    out[c] = v;
    ss += v * v;
  }
  if (NORM) {
    ss = hc_tg_sum(ss, partial, sg, lane);
    float r = rsqrt(ss / float(p.cols) + p.eps);
    float offset = p.centred != 0 ? 1.0f : 0.0f;
    for (int c = t; c < p.cols; c += 32 * HC_TG_SG) {
      out[c] = out[c] * r * (offset + w[c]);
    }
  }
}

[[max_total_threads_per_threadgroup(256)]] kernel void hc_read_f32(
    constant HcReadParams& p  [[buffer(0)]],
    device const uchar* x     [[buffer(1)]],
    device const uchar* coeffs [[buffer(2)]],
    device uchar* y           [[buffer(3)]],
    uint tg                   [[threadgroup_position_in_grid]],
    ushort sg                 [[simdgroup_index_in_threadgroup]],
    ushort lane               [[thread_index_in_simdgroup]]) {
  threadgroup float partial[HC_TG_SG];
  int row = int(tg);
  if (row < p.rows) {  // uniform per threadgroup
    hc_read_row<false>(p, x, coeffs, (device const float*)coeffs, y, row, partial, sg, lane);
  }
}

[[max_total_threads_per_threadgroup(256)]] kernel void hc_read_norm_f32(
    constant HcReadParams& p  [[buffer(0)]],
    device const uchar* x     [[buffer(1)]],
    device const uchar* coeffs [[buffer(2)]],
    device uchar* y           [[buffer(3)]],
    device const float* w     [[buffer(4)]],
    uint tg                   [[threadgroup_position_in_grid]],
    ushort sg                 [[simdgroup_index_in_threadgroup]],
    ushort lane               [[thread_index_in_simdgroup]]) {
  threadgroup float partial[HC_TG_SG];
  int row = int(tg);
  if (row < p.rows) {  // uniform per threadgroup
    hc_read_row<true>(p, x, coeffs, w, y, row, partial, sg, lane);
  }
}

// X'_j = post_j y + sum_i comb[i][j] X_i, in place: each thread owns one column of one row
// and reads all its old stream values before writing any.
kernel void hc_write_f32(
    constant HcWriteParams& p  [[buffer(0)]],
    device uchar* x            [[buffer(1)]],
    device const uchar* coeffs [[buffer(2)]],
    device const uchar* y      [[buffer(3)]],
    uint2 gid                  [[thread_position_in_grid]]) {
  int c = int(gid.x);
  int r = int(gid.y);
  if (c >= p.cols || r >= p.rows) {
    return;
  }
  int n = p.streams;
  device float* X = (device float*)(x + ulong(r) * p.x_stride);
  device const float* k = (device const float*)(coeffs + ulong(r) * p.c_stride);
  float yv = ((device const float*)(y + ulong(r) * p.y_stride))[c];
  float old[HC_MAX_STREAMS];
  for (int i = 0; i < n; i++) {
    old[i] = X[i * p.cols + c];
  }
  for (int j = 0; j < n; j++) {
    float v = k[n + j] * yv;
    for (int i = 0; i < n; i++) {
      v += k[2 * n + i * n + j] * old[i];
    }
    X[j * p.cols + c] = v;
  }
}
