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

// The coefficients of one row from its mixes, serially (thread 0 of the row's threadgroup):
// the form for n * n > 32, where a simdgroup's lanes cannot hold comb. comb lives in
// threadgroup memory (a thread-local array indexed by a runtime n went to the stack and
// spilled on the H200). Writes [pre | post | comb] to `out` and pre to `pre`.
inline void hc_coeffs_serial(int n, bool head, int iters, float eps, float rs, device const float* scale,
                             device const float* base, device const float* mix, device float* out,
                             threadgroup float* pre, threadgroup float* comb) {
  for (int i = 0; i < n; i++) {
    out[i] = hc_sigmoid(mix[i] * rs * scale[0] + base[i]) + eps;
    pre[i] = out[i];
  }
  if (head) {
    return;
  }
  for (int i = 0; i < n; i++) {
    out[n + i] = 2.0f * hc_sigmoid(mix[n + i] * rs * scale[1] + base[n + i]);
  }
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
      comb[i * n + j] = comb[i * n + j] / s + eps;
    }
  }
  // Columns first, then iters - 1 rounds of {rows, columns}: round 0 does columns only.
  for (int it = 0; it < iters; it++) {
    if (it > 0) {
      for (int i = 0; i < n; i++) {
        float s = 0.0f;
        for (int j = 0; j < n; j++) {
          s += comb[i * n + j];
        }
        for (int j = 0; j < n; j++) {
          comb[i * n + j] /= s + eps;
        }
      }
    }
    for (int j = 0; j < n; j++) {
      float s = 0.0f;
      for (int i = 0; i < n; i++) {
        s += comb[i * n + j];
      }
      for (int i = 0; i < n; i++) {
        comb[i * n + j] /= s + eps;
      }
    }
  }
  for (int k = 0; k < n * n; k++) {
    out[2 * n + k] = comb[k];
  }
}

// The same coefficients computed by one simdgroup (every lane calls it; n * n <= 32): lane
// i * n + j holds comb[i][j]; each row or column sum gathers its n values by shuffles and adds
// them in the serial form's order, so the results are the serial form's to the bit. Sinkhorn's
// 20 rounds were ~24 us on one thread of the H200 (144 sites a token).
inline void hc_coeffs_lanes(int n, bool head, int iters, float eps, float rs, device const float* scale,
                            device const float* base, device const float* mix, device float* out,
                            threadgroup float* pre, ushort lane) {
  const int l = int(lane);
  if (l < n) {
    float v = hc_sigmoid(mix[l] * rs * scale[0] + base[l]) + eps;
    out[l] = v;
    pre[l] = v;
    if (!head) {
      out[n + l] = 2.0f * hc_sigmoid(mix[n + l] * rs * scale[1] + base[n + l]);
    }
  }
  if (head) {
    return;  // uniform
  }
  const bool live = l < n * n;
  const int i = live ? l / n : 0;  // lanes past n * n shadow entry (0, 0): every shuffle stays in range
  const int j = live ? l % n : 0;
  float c = mix[2 * n + i * n + j] * rs * scale[2] + base[2 * n + i * n + j];
  float m = -INFINITY;
  for (int k = 0; k < n; k++) {
    m = max(m, simd_shuffle(c, ushort(i * n + k)));
  }
  float e = exp(c - m);
  float s = 0.0f;
  for (int k = 0; k < n; k++) {
    s += simd_shuffle(e, ushort(i * n + k));
  }
  c = e / s + eps;
  for (int it = 0; it < iters; it++) {
    if (it > 0) {
      float rsum = 0.0f;
      for (int k = 0; k < n; k++) {
        rsum += simd_shuffle(c, ushort(i * n + k));
      }
      c /= rsum + eps;
    }
    float csum = 0.0f;
    for (int k = 0; k < n; k++) {
      csum += simd_shuffle(c, ushort(k * n + j));
    }
    c /= csum + eps;
  }
  if (live) {
    out[2 * n + l] = c;
  }
}

// One row's coefficients from its raw mixes and the streams' rms: simdgroup 0 of the row's
// threadgroup (lane-parallel for n * n <= 32, else its thread 0 serially). pre also lands in
// threadgroup memory for a read in the same threadgroup.
inline void hc_coeffs_row(int n, bool head, int iters, float eps, float rs, device const float* scale,
                          device const float* base, device const float* mix, device float* out,
                          threadgroup float* pre, threadgroup float* comb, ushort sg, ushort lane) {
  if (sg != 0) {
    return;
  }
  if (n * n <= 32) {
    hc_coeffs_lanes(n, head, iters, eps, rs, scale, base, mix, out, pre, lane);
  } else if (lane == 0) {
    hc_coeffs_serial(n, head, iters, eps, rs, scale, base, mix, out, pre, comb);
  }
}

// rsqrt(mean(flat^2) + eps) of a row's n * d stream values, summed by the whole threadgroup.
inline float hc_stream_rms(device const float* flat, int len, float eps, threadgroup float* partial, ushort sg, ushort lane) {
  float ss = 0.0f;
  for (int c = int(sg) * 32 + int(lane); c < len; c += 32 * HC_TG_SG) {
    float v = flat[c];
    ss += v * v;
  }
  ss = hc_tg_sum(ss, partial, sg, lane);
  return rsqrt(ss / float(len) + eps);
}

// x = sum_i pre_i X_i for one row, then (NORM) x * rsqrt(mean(x^2) + eps) * w; the norm
// rescales, in a second pass, the elements the same thread wrote. PRE is where pre lives
// (device or threadgroup memory).
template <bool NORM, typename PRE>
inline void hc_read_row(int n, int cols, float eps, bool centred, device const float* X, PRE pre,
                        device const float* w, device float* out, threadgroup float* partial, ushort sg, ushort lane) {
  const int t = int(sg) * 32 + int(lane);
  float ss = 0.0f;
  for (int c = t; c < cols; c += 32 * HC_TG_SG) {
    float v = 0.0f;
    for (int i = 0; i < n; i++) {
      v += pre[i] * X[i * cols + c];
    }
    out[c] = v;
    ss += v * v;
  }
  if (NORM) {
    ss = hc_tg_sum(ss, partial, sg, lane);
    float r = rsqrt(ss / float(cols) + eps);
    float offset = centred ? 1.0f : 0.0f;
    for (int c = t; c < cols; c += 32 * HC_TG_SG) {
      out[c] = out[c] * r * (offset + w[c]);
    }
  }
}

// A threadgroup per row: its threads sum flat^2, simdgroup 0 turns the row's mixes into
// coefficients.
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
  threadgroup float pre[HC_MAX_STREAMS];
  threadgroup float comb[HC_MAX_STREAMS * HC_MAX_STREAMS];
  int row = int(tg);
  if (row >= p.rows) {
    return;  // uniform per threadgroup
  }
  device const float* flat = (device const float*)(x + ulong(row) * p.x_stride);
  float rs = hc_stream_rms(flat, p.streams * p.cols, p.eps, partial, sg, lane);
  device const float* mix = (device const float*)(raw + ulong(row) * p.raw_stride);
  device float* out = (device float*)(coeffs + ulong(row) * p.c_stride);
  hc_coeffs_row(p.streams, p.head != 0, p.iters, p.eps, rs, scale, base, mix, out, pre, comb, sg, lane);
}

// A residual site's read (or the final read) in one threadgroup per row: the coefficients as
// hc_coeffs_f32 (written out for the site's write), then, after a barrier, x = sum_i pre_i X_i
// and its RMSNorm, pre taken from threadgroup memory. One dispatch instead of two.
[[max_total_threads_per_threadgroup(256)]] kernel void hc_coeffs_read_norm_f32(
    constant HcCoeffsReadParams& p [[buffer(0)]],
    device const uchar* x      [[buffer(1)]],
    device const uchar* raw    [[buffer(2)]],
    device const float* scale  [[buffer(3)]],
    device const float* base   [[buffer(4)]],
    device uchar* coeffs       [[buffer(5)]],
    device uchar* y            [[buffer(6)]],
    device const float* w      [[buffer(7)]],
    uint tg                    [[threadgroup_position_in_grid]],
    ushort sg                  [[simdgroup_index_in_threadgroup]],
    ushort lane                [[thread_index_in_simdgroup]]) {
  threadgroup float partial[HC_TG_SG];
  threadgroup float pre[HC_MAX_STREAMS];
  threadgroup float comb[HC_MAX_STREAMS * HC_MAX_STREAMS];
  int row = int(tg);
  if (row >= p.rows) {
    return;  // uniform per threadgroup
  }
  device const float* flat = (device const float*)(x + ulong(row) * p.x_stride);
  float rs = hc_stream_rms(flat, p.streams * p.cols, p.eps, partial, sg, lane);
  device const float* mix = (device const float*)(raw + ulong(row) * p.raw_stride);
  device float* out = (device float*)(coeffs + ulong(row) * p.c_stride);
  hc_coeffs_row(p.streams, p.head != 0, p.iters, p.eps, rs, scale, base, mix, out, pre, comb, sg, lane);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  hc_read_row<true>(p.streams, p.cols, p.norm_eps, p.centred != 0, flat, (threadgroup const float*)pre, w,
                    (device float*)(y + ulong(row) * p.y_stride), partial, sg, lane);
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
    hc_read_row<false>(p.streams, p.cols, p.eps, p.centred != 0, (device const float*)(x + ulong(row) * p.x_stride),
                       (device const float*)(coeffs + ulong(row) * p.c_stride), (device const float*)coeffs /* unused */,
                       (device float*)(y + ulong(row) * p.y_stride), partial, sg, lane);
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
    hc_read_row<true>(p.streams, p.cols, p.eps, p.centred != 0, (device const float*)(x + ulong(row) * p.x_stride),
                      (device const float*)(coeffs + ulong(row) * p.c_stride), w,
                      (device float*)(y + ulong(row) * p.y_stride), partial, sg, lane);
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
