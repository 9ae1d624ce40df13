// Hyper-connections (MODEL.md "Residual"): coefficients from the raw products fn . flat
// (a matvec computes those), the gated read x = sum_i pre_i X_i (optionally normalised),
// and the write X'_j = post_j y + sum_i comb[i][j] X_i. Coefficient rows are
// [pre (n) | post (n) | comb (n * n, [i][j])] for a site and [pre (n)] for the final read.
#include <metal_stdlib>
#include "hc.h"
#include "hc-site.h"
#include "matvec.h"
#include "params.h"

using namespace metal;


// The raw products of a site, split for parallelism: simdgroup (tg.x * HC_MIX_SG + sg) of row
// tg.y takes item = m * stride + c and writes partials[row][item] = fn[m] . flat over chunk c
// (m < mixes) or the chunk's sum of squares (m = mixes, for the streams' rms); stride is
// chunks rounded up to 4 and the padding items write 0 (the gather reads float4s). Every lane
// issues its loads at once (8 flat values and 8 weights), so the pass costs about one trip
// to memory. fn is [mixes][n * d] in the storage dtype T; n * d is a multiple of 4.
template <typename T>
[[max_total_threads_per_threadgroup(256)]] kernel void hc_mix_partials(
    constant HcMixParams& p   [[buffer(0)]],
    device const uchar* x     [[buffer(1)]],
    device const uchar* fn    [[buffer(2)]],
    device uchar* partials    [[buffer(3)]],
    uint2 tg                  [[threadgroup_position_in_grid]],
    ushort sg                 [[simdgroup_index_in_threadgroup]],
    ushort lane               [[thread_index_in_simdgroup]]) {
  const int item = int(tg.x) * HC_MIX_SG + int(sg);
  const int row = int(tg.y);
  const int stride = hc_chunk_stride(p.chunks);
  if (item >= (p.mixes + 1) * stride || row >= p.rows) {
    return;  // uniform per simdgroup
  }
  const int m = item / stride;
  const int len = p.streams * p.cols;
  // A padding item's c is past len: it loads nothing and writes 0.
  const int chunk = item - m * stride;
  const int c = chunk < p.chunks ? chunk * HC_CHUNK + int(lane) * 8 : len;
  device const float* flat = (device const float*)(x + ulong(row) * p.x_stride);
  const float4 zero = float4(0.0f);
  float4 a = c < len ? *((device const float4*)(flat + c)) : zero;
  float4 b = c + 4 < len ? *((device const float4*)(flat + c + 4)) : zero;
  float v;
  if (m < p.mixes) {
    const uint w0 = uint(m) * uint(len) + uint(c);
    float4 wa = c < len ? Weights<T>::load4(fn, w0) : zero;
    float4 wb = c + 4 < len ? Weights<T>::load4(fn, w0 + 4u) : zero;
    v = dot(wa, a) + dot(wb, b);
  } else {
    v = dot(a, a) + dot(b, b);
  }
  v = simd_sum(v);
  if (lane == 0) {
    ((device float*)(partials + ulong(row) * p.p_stride))[item] = v;
  }
}

template [[host_name("hc_mix_partials_f32_f32")]] kernel decltype(hc_mix_partials<float>) hc_mix_partials<float>;
template [[host_name("hc_mix_partials_bf16_f32")]] kernel decltype(hc_mix_partials<bfloat>) hc_mix_partials<bfloat>;
template [[host_name("hc_mix_partials_f16_f32")]] kernel decltype(hc_mix_partials<half>) hc_mix_partials<half>;


// A threadgroup per row: the mixes from hc_mix_partials, then simdgroup 0 turns them into
// coefficients. Params are read once into registers: a barrier makes the compiler read them
// from memory again.
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
  threadgroup float mix[HC_MAX_MIXES + 1];
  threadgroup float pre[HC_MAX_STREAMS];
  threadgroup float comb[HC_MAX_STREAMS * HC_MAX_STREAMS];
  const int row = int(tg);
  const int n = p.streams, cols = p.cols, iters = p.iters;
  const bool head = p.head != 0;
  const float eps = p.eps;
  if (row >= p.rows) {
    return;  // uniform per threadgroup
  }
  device float* out = (device float*)(coeffs + ulong(row) * p.c_stride);
  hc_row_coefficients(n, cols, head, iters, eps, (device const float*)(raw + ulong(row) * p.raw_stride), p.chunks, scale, base, out,
                      mix, pre, comb, sg, lane);
}

// A residual site's read (or the final read): two threadgroups per row, side by side. Role 0
// forms the row's coefficients as hc_coeffs_f32 (written out for the site's write); role 1
// forms only pre itself (n sigmoids a thread) and reads: x = sum_i pre_i X_i and its RMSNorm.
// The read no longer waits for Sinkhorn's ~40 dependent steps, which only the write needs:
// the kernel takes the longer of the two paths instead of their sum. Each role issues every
// load it needs (stream columns, norm weights, scale and base, partials) before its first
// barrier: one trip to memory, then arithmetic.
[[max_total_threads_per_threadgroup(256)]] kernel void hc_coeffs_read_norm_f32(
    constant HcCoeffsReadParams& p [[buffer(0)]],
    device const uchar* x      [[buffer(1)]],
    device const uchar* raw    [[buffer(2)]],
    device const float* scale  [[buffer(3)]],
    device const float* base   [[buffer(4)]],
    device uchar* coeffs       [[buffer(5)]],
    device uchar* y            [[buffer(6)]],
    device const float* w      [[buffer(7)]],
    uint2 tg                   [[threadgroup_position_in_grid]],
    ushort sg                  [[simdgroup_index_in_threadgroup]],
    ushort lane                [[thread_index_in_simdgroup]]) {
  threadgroup float partial[HC_TG_SG];
  threadgroup float mix[HC_MAX_MIXES + 1];
  threadgroup float pre[HC_MAX_STREAMS];
  threadgroup float comb[HC_MAX_STREAMS * HC_MAX_STREAMS];
  const int row = int(tg.y);
  const int n = p.streams, cols = p.cols, iters = p.iters;
  const bool head = p.head != 0, centred = p.centred != 0;
  const float eps = p.eps, norm_eps = p.norm_eps;
  if (row >= p.rows) {
    return;  // uniform per threadgroup
  }
  device const float* part = (device const float*)(raw + ulong(row) * p.raw_stride);
  if (tg.x == 0u) {  // uniform per threadgroup: the coefficients
    hc_row_coefficients(n, cols, head, iters, eps, part, p.chunks, scale, base,
                        (device float*)(coeffs + ulong(row) * p.c_stride), mix, pre, comb, sg, lane);
    return;
  }
  device const float* flat = (device const float*)(x + ulong(row) * p.x_stride);
  const int t = int(sg) * 32 + int(lane);
  float4 xs[HC_READ_AHEAD * HC_PF_STREAMS];
  hc_prefetch(n, cols, flat, t, xs);
  float4 wk[HC_READ_AHEAD];
  hc_prefetch_norm(cols, w, t, wk);
  float b[HC_MAX_STREAMS];
  CK_UNROLL for (int i = 0; i < HC_MAX_STREAMS; i++) {
    b[i] = i < n ? base[i] : 0.0f;
  }
  const float scale0 = scale[0];
  hc_site_read(n, cols, head, eps, norm_eps, centred, flat, part, p.chunks, b, scale0, xs, w, wk,
               HcOutDevice{(device float4*)(y + ulong(row) * p.y_stride)}, mix, partial, sg, lane);
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
    device const float* X = (device const float*)(x + ulong(row) * p.x_stride);
    float4 xs[HC_READ_AHEAD * HC_PF_STREAMS];
    hc_prefetch(p.streams, p.cols, X, int(sg) * 32 + int(lane), xs);
    hc_read_row<false>(p.streams, p.cols, p.eps, p.centred != 0, X, (device const float*)(coeffs + ulong(row) * p.c_stride), xs,
                       (device const float*)coeffs /* unused */, xs /* unused */, HcOutDevice{(device float4*)(y + ulong(row) * p.y_stride)}, partial,
                       sg, lane);
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
    const int t = int(sg) * 32 + int(lane);
    device const float* X = (device const float*)(x + ulong(row) * p.x_stride);
    float4 xs[HC_READ_AHEAD * HC_PF_STREAMS];
    hc_prefetch(p.streams, p.cols, X, t, xs);
    float4 wk[HC_READ_AHEAD];
    hc_prefetch_norm(p.cols, w, t, wk);
    hc_read_row<true>(p.streams, p.cols, p.eps, p.centred != 0, X, (device const float*)(coeffs + ulong(row) * p.c_stride), xs, w, wk,
                      HcOutDevice{(device float4*)(y + ulong(row) * p.y_stride)}, partial, sg, lane);
  }
}

// X'_j = post_j y + sum_i comb[i][j] X_i, in place: each thread owns four columns of one row
// (cols % 4 == 0); hc_write_column (hc.h) is the column's write.
[[max_total_threads_per_threadgroup(64)]] kernel void hc_write_f32(
    constant HcWriteParams& p  [[buffer(0)]],
    device uchar* x            [[buffer(1)]],
    device const uchar* coeffs [[buffer(2)]],
    device const uchar* y      [[buffer(3)]],
    uint2 gid                  [[thread_position_in_grid]]) {
  const int c4 = int(gid.x);
  const int r = int(gid.y);
  const int c4s = p.cols / 4;
  if (c4 >= c4s || r >= p.rows) {
    return;
  }
  device float4* X = (device float4*)(x + ulong(r) * p.x_stride);
  device const float* k = (device const float*)(coeffs + ulong(r) * p.c_stride);
  float4 yv = ((device const float4*)(y + ulong(r) * p.y_stride))[c4];
  hc_write_column(X, c4s, c4, p.streams, k, yv);
}

// hc_write_f32 that also leaves the next site's raw products for its columns (hc_store_lanes):
// a simdgroup per float4 column of a row (the unfused writers of small batches: a verify
// batch's MoE, a GEMM projection). p.fold_mixes > 0.
#define HC_WRITE_FOLD_SG 2
[[max_total_threads_per_threadgroup(64)]] kernel void hc_write_fold_f32(
    constant HcWriteFoldParams& p [[buffer(0)]],
    device uchar* x            [[buffer(1)]],
    device const uchar* coeffs [[buffer(2)]],
    device const uchar* y      [[buffer(3)]],
    device const uchar* fn     [[buffer(4)]],
    device uchar* part         [[buffer(5)]],
    uint2 tg                   [[threadgroup_position_in_grid]],
    ushort sg                  [[simdgroup_index_in_threadgroup]],
    ushort lane                [[thread_index_in_simdgroup]]) {
  const int c4 = int(tg.x) * HC_WRITE_FOLD_SG + int(sg);
  const int r = int(tg.y);
  const int c4s = p.cols / 4;
  if (c4 >= c4s || r >= p.rows) {
    return;  // uniform per simdgroup
  }
  HcTarget t = hc_fold_target(fn, part, p.p_stride, p.fold_mixes, p.fold_dtype);
  t.x = x;
  t.coeffs = coeffs;
  t.x_stride = p.x_stride;
  t.c_stride = p.c_stride;
  t.streams = p.streams;
  t.c4s = c4s;
  t.residual = false;
  const float4 yv = ((device const float4*)(y + ulong(r) * p.y_stride))[c4];
  hc_store_lanes(t, r, c4, yv, lane);
}
static_assert(HC_WRITE_FOLD_SG * 32 == 64, "update hc_write_fold_f32's [[max_total_threads_per_threadgroup]]");
