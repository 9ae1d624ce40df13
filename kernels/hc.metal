// Hyper-connections (MODEL.md "Residual"): coefficients from the raw products fn . flat
// (a matvec computes those), the gated read x = sum_i pre_i X_i (optionally normalised),
// and the write X'_j = post_j y + sum_i comb[i][j] X_i. Coefficient rows are
// [pre (n) | post (n) | comb (n * n, [i][j])] for a site and [pre (n)] for the final read.
#include <metal_stdlib>
#include "hc.h"
#include "matvec.h"
#include "params.h"

using namespace metal;

#define HC_MAX_MIXES (2 * HC_MAX_STREAMS + HC_MAX_STREAMS * HC_MAX_STREAMS)
// A row per threadgroup of HC_TG_SG simdgroups for the reads: a thread holds one float4
// column of every stream at a time (two turns at d = 2048), partial sums meet in threadgroup
// memory in simdgroup order. One simdgroup per row was latency-bound on the H200 (85 us for
// the coefficients and 69 us for a read at d = 2048, n = 4), and so were 256 threads that
// each walked eight columns one load at a time (19 us a site). 512 threads would cover
// d = 2048 in one turn, but nvcc then caps registers at 64 and spills the columns.
#define HC_TG_SG 8
static_assert(HC_TG_SG * 32 == 256, "update the hc read kernels' [[max_total_threads_per_threadgroup]]");
// The raw products fn . flat are summed in chunks of HC_CHUNK flat values, one simdgroup per
// (mix, chunk): a lane takes 8 consecutive values. The partials spread the 24 x 8192 weights
// of a site over ~100 threadgroups instead of the few a matvec of 24 rows gets.
#define HC_CHUNK 256
#define HC_MIX_SG 8
static_assert(HC_MIX_SG * 32 == 256, "update hc_mix_partials' [[max_total_threads_per_threadgroup]]");

// Floats per mix in hc_mix_partials' rows: chunks rounded up to 4, so a mix's partials are
// whole float4s as a folded write's (d / 4 columns, d % 16 == 0) are.
inline int hc_chunk_stride(int chunks) {
  return (chunks + 3) & ~3;
}

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
                             device const float* base, threadgroup const float* mix, device float* out,
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

// The largest n of the lane form (n * n <= 32).
#define HC_LANES_N 5

// v from lanes first, first + stride, ... (n <= HC_LANES_N of them), added (or maxed) in that
// order. The shuffles are issued together and the sum follows: a shuffle's latency is paid
// once per sum, not once per term (Sinkhorn's 20 rounds of dependent shuffles were ~20 us
// of a single simdgroup on the H200).
inline float hc_lanes_sum(float v, int first, int stride, int n) {
  float t[HC_LANES_N];
  CK_UNROLL for (int k = 0; k < HC_LANES_N; k++) {
    t[k] = k < n ? simd_shuffle(v, ushort(first + k * stride)) : 0.0f;
  }
  float s = 0.0f;
  CK_UNROLL for (int k = 0; k < HC_LANES_N; k++) {
    if (k < n) {
      s += t[k];
    }
  }
  return s;
}
inline float hc_lanes_max(float v, int first, int stride, int n) {
  float t[HC_LANES_N];
  CK_UNROLL for (int k = 0; k < HC_LANES_N; k++) {
    t[k] = k < n ? simd_shuffle(v, ushort(first + k * stride)) : -INFINITY;
  }
  float m = -INFINITY;
  CK_UNROLL for (int k = 0; k < HC_LANES_N; k++) {
    m = max(m, t[k]);
  }
  return m;
}

// The sum (or max) over v's group of n lanes, for n a power of two: a row's lanes are the n
// consecutive ones from i * n (stride 1), a column's are j, j + n, ... (stride n). log2(n)
// xor butterflies: every lane of the group ends with the same bits, (a + b) + (c + d) for
// n = 4, where hc_lanes_sum adds in order, ((a + b) + c) + d, with n shuffles in a row. On the
// H200 Sinkhorn's 40 dependent sums a site were half the coefficient kernel.
inline float hc_group_sum(float v, int stride, int n) {
  CK_UNROLL for (int k = 0; k < 3; k++) {
    const int o = 1 << k;
    if (o < n) {  // uniform
      v += simd_shuffle_xor(v, ushort(o * stride));
    }
  }
  return v;
}
inline float hc_group_max(float v, int stride, int n) {
  CK_UNROLL for (int k = 0; k < 3; k++) {
    const int o = 1 << k;
    if (o < n) {  // uniform
      v = max(v, simd_shuffle_xor(v, ushort(o * stride)));
    }
  }
  return v;
}

// What lane l of the lane form reads of a site's scale and base: loaded at the kernel's start,
// with the stream loads, so the coefficients wait for no memory after the barrier.
struct HcLaneConsts {
  float scale0, scale1, scale2;
  float pre, post, comb;  // base[l], base[n + l], base[2n + i * n + j]
};

inline HcLaneConsts hc_lane_consts(int n, bool head, device const float* scale, device const float* base, ushort lane) {
  const int l = int(lane);
  const bool live = l < n * n;
  const int i = live ? l / n : 0;
  const int j = live ? l % n : 0;
  HcLaneConsts k;
  k.scale0 = scale[0];
  k.scale1 = head ? 0.0f : scale[1];
  k.scale2 = head ? 0.0f : scale[2];
  k.pre = l < n ? base[l] : 0.0f;
  k.post = !head && l < n ? base[n + l] : 0.0f;
  k.comb = head ? 0.0f : base[2 * n + i * n + j];
  return k;
}

// The same coefficients computed by one simdgroup (every lane calls it; n * n <= 32): lane
// i * n + j holds comb[i][j]; each row or column sum gathers its n values by shuffles and adds
// them in the serial form's order, so the results are the serial form's to the bit.
inline void hc_coeffs_lanes(int n, bool head, int iters, float eps, float rs, HcLaneConsts k,
                            threadgroup const float* mix, device float* out, threadgroup float* pre, ushort lane) {
  const int l = int(lane);
  if (l < n) {
    float v = hc_sigmoid(mix[l] * rs * k.scale0 + k.pre) + eps;
    out[l] = v;
    pre[l] = v;
    if (!head) {
      out[n + l] = 2.0f * hc_sigmoid(mix[n + l] * rs * k.scale1 + k.post);
    }
  }
  if (head) {
    return;  // uniform
  }
  const bool live = l < n * n;
  const int i = live ? l / n : 0;  // lanes past n * n shadow entry (0, 0): every shuffle stays in range
  const int j = live ? l % n : 0;
  float c = mix[2 * n + i * n + j] * rs * k.scale2 + k.comb;
  if ((n & (n - 1)) == 0) {  // uniform. n = 1, 2, 4: butterflies (lanes past n * n form groups of their own)
    c = mix[2 * n + l % (n * n)] * rs * k.scale2 + k.comb;
    const float e = exp(c - hc_group_max(c, 1, n));
    c = e / hc_group_sum(e, 1, n) + eps;
    for (int it = 0; it < iters; it++) {
      if (it > 0) {
        c /= hc_group_sum(c, 1, n) + eps;
      }
      c /= hc_group_sum(c, n, n) + eps;
    }
  } else {
    const float m = hc_lanes_max(c, i * n, 1, n);
    const float e = exp(c - m);
    c = e / hc_lanes_sum(e, i * n, 1, n) + eps;
    for (int it = 0; it < iters; it++) {
      if (it > 0) {
        c /= hc_lanes_sum(c, i * n, 1, n) + eps;
      }
      c /= hc_lanes_sum(c, j, n, n) + eps;
    }
  }
  if (live) {
    out[2 * n + l] = c;
  }
}

// One row's coefficients from its raw mixes and the streams' rms: simdgroup 0 of the row's
// threadgroup (lane-parallel for n * n <= 32, with the constants `k` it loaded early, else its
// thread 0 serially). pre also lands in threadgroup memory for a read in the same threadgroup.
inline void hc_coeffs_row(int n, bool head, int iters, float eps, float rs, device const float* scale,
                          device const float* base, HcLaneConsts k, threadgroup const float* mix, device float* out,
                          threadgroup float* pre, threadgroup float* comb, ushort sg, ushort lane) {
  if (sg != 0) {
    return;
  }
  if (n * n <= 32) {
    hc_coeffs_lanes(n, head, iters, eps, rs, k, mix, out, pre, lane);
  } else if (lane == 0) {
    hc_coeffs_serial(n, head, iters, eps, rs, scale, base, mix, out, pre, comb);
  }
}

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

// A row's mixes from its partials ([mixes + 1][chunks] floats, chunks % 4 == 0, the row
// 16-byte aligned) into threadgroup memory: `count` items, item i being mix i, except the last,
// which is mix[mixes] (the row's sum of squares): all of them (count = mixes + 1) or only pre's
// n and the sum of squares (count = n + 1). Simdgroup s takes items s, s + HC_TG_SG, ...; lane
// l sums float4s l, l + 32, ... of an item's partials in that order, then the simdgroup sums
// the lanes (simd_sum): a fixed order, whoever wrote the partials. The turns and a batch of
// float4s are unrolled so a lane's loads for all its items go out at once (one trip to memory
// for 512 partials a mix: a folded write's d / 4 at d = 2048); a runtime loop here put the
// sums in local memory. Ends with a barrier (every thread may read mix after it).
template <int TURNS, int BATCH>
inline void hc_gather_turns(device const float* part, int mixes, int chunks, int count, threadgroup float* mix,
                            ushort sg, ushort lane) {
  device const float4* part4 = (device const float4*)part;
  const int q4 = chunks / 4;
  float4 s[TURNS];
  CK_UNROLL for (int j = 0; j < TURNS; j++) {
    s[j] = float4(0.0f);
  }
  for (int b = int(lane); b < q4; b += 32 * BATCH) {  // one trip up to 32 * 4 * BATCH partials a mix
    CK_UNROLL for (int j = 0; j < TURNS; j++) {
      const int item = int(sg) + j * HC_TG_SG;
      const int m = item == count - 1 ? mixes : item;
      CK_UNROLL for (int u = 0; u < BATCH; u++) {
        const int c = b + 32 * u;
        s[j] += item < count && c < q4 ? part4[m * q4 + c] : float4(0.0f);
      }
    }
  }
  CK_UNROLL for (int j = 0; j < TURNS; j++) {
    const int item = int(sg) + j * HC_TG_SG;
    if (item < count) {  // uniform per simdgroup
      const float t = simd_sum((s[j].x + s[j].y) + (s[j].z + s[j].w));
      if (lane == 0) {
        mix[item == count - 1 ? mixes : item] = t;
      }
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
}

// The most items a gather takes, and its turns for up to 32 items (n <= 4: 25 a site) and
// for any (n <= 8: 81; one float4 a turn per trip to bound the registers).
#define HC_GATHER_TURNS ((HC_MAX_MIXES + 1 + HC_TG_SG - 1) / HC_TG_SG)
inline void hc_gather_mixes(device const float* part, int mixes, int chunks, int count, threadgroup float* mix, ushort sg, ushort lane) {
  if (count <= 4 * HC_TG_SG) {  // uniform
    hc_gather_turns<4, 4>(part, mixes, chunks, count, mix, sg, lane);
  } else {
    hc_gather_turns<HC_GATHER_TURNS, 1>(part, mixes, chunks, count, mix, sg, lane);
  }
}

// This thread's float4 columns (c4 = thread index, and one threadgroup width on) of the first
// HC_PF_STREAMS streams, loaded early so the loads overlap what the threadgroup does before its
// read (the coefficients). Two turns cover d = 2048 with 256 threads; wider rows, and streams
// past HC_PF_STREAMS (n > 4: more registers than a thread has to spare), load in the read.
#define HC_READ_AHEAD 2
#define HC_PF_STREAMS 4
inline void hc_prefetch(int n, int cols, device const float* X, int t, thread float4* xs) {
  const int c4s = cols / 4;
  device const float4* X4 = (device const float4*)X;
  CK_UNROLL for (int a = 0; a < HC_READ_AHEAD; a++) {
    const int c4 = t + a * 32 * HC_TG_SG;
    CK_UNROLL for (int i = 0; i < HC_PF_STREAMS; i++) {
      xs[a * HC_PF_STREAMS + i] = (i < n && c4 < c4s) ? X4[i * c4s + c4] : float4(0.0f);
    }
  }
}

// The norm weights of this thread's prefetched turns (hc_prefetch's columns).
inline void hc_prefetch_norm(int cols, device const float* w, int t, thread float4* wk) {
  const int c4s = cols / 4;
  CK_UNROLL for (int a = 0; a < HC_READ_AHEAD; a++) {
    const int c4 = t + a * 32 * HC_TG_SG;
    wk[a] = c4 < c4s ? float4(w[4 * c4], w[4 * c4 + 1], w[4 * c4 + 2], w[4 * c4 + 3]) : float4(0.0f);
  }
}

// x = sum_i pre_i X_i for one row, four columns per thread (cols % 4 == 0), then (NORM)
// x * rsqrt(mean(x^2) + eps) * w. xs holds the thread's first HC_READ_AHEAD turns of columns
// (hc_prefetch) and wk their norm weights (hc_prefetch_norm); later ones (cols > 4 *
// HC_READ_AHEAD * threads) are loaded in the loop. The norm rescales what the same thread
// wrote, the prefetched turns from registers. PRE is where pre lives (device or threadgroup
// memory).
template <bool NORM, typename PRE>
inline void hc_read_row(int n, int cols, float eps, bool centred, device const float* X, PRE pre, thread float4* xs,
                        device const float* w, thread const float4* wk, device float* out, threadgroup float* partial,
                        ushort sg, ushort lane) {
  const int t = int(sg) * 32 + int(lane);
  const int c4s = cols / 4;
  const int step = 32 * HC_TG_SG;
  device const float4* X4 = (device const float4*)X;
  device float4* out4 = (device float4*)out;
  float ss = 0.0f;
  float4 kept[HC_READ_AHEAD];
  MV_UNROLL for (int a = 0; a < HC_READ_AHEAD; a++) {
    const int c4 = t + a * step;
    float4 v = float4(0.0f);
    CK_UNROLL for (int i = 0; i < HC_MAX_STREAMS; i++) {
      if (i < n) {
        v += pre[i] * (i < HC_PF_STREAMS ? xs[a * HC_PF_STREAMS + (i % HC_PF_STREAMS)] : (c4 < c4s ? X4[i * c4s + c4] : float4(0.0f)));
      }
    }
    kept[a] = v;
    if (c4 < c4s) {
      out4[c4] = v;
      ss += dot(v, v);
    }
  }
  for (int c4 = t + HC_READ_AHEAD * step; c4 < c4s; c4 += step) {
    float4 v = float4(0.0f);
    MV_UNROLL for (int i = 0; i < HC_MAX_STREAMS; i++) {
      if (i < n) {
        v += pre[i] * X4[i * c4s + c4];
      }
    }
    out4[c4] = v;
    ss += dot(v, v);
  }
  if (NORM) {
    ss = hc_tg_sum(ss, partial, sg, lane);
    float r = rsqrt(ss / float(cols) + eps);
    float offset = centred ? 1.0f : 0.0f;
    MV_UNROLL for (int a = 0; a < HC_READ_AHEAD; a++) {
      const int c4 = t + a * step;
      if (c4 < c4s) {
        out4[c4] = kept[a] * r * (offset + wk[a]);
      }
    }
    for (int c4 = t + HC_READ_AHEAD * step; c4 < c4s; c4 += step) {
      float4 wv = float4(w[4 * c4], w[4 * c4 + 1], w[4 * c4 + 2], w[4 * c4 + 3]);
      out4[c4] = out4[c4] * r * (offset + wv);
    }
  }
}

// One row's coefficients from its partials (both coefficient kernels): simdgroup 0 loads the
// lane form's scale and base, the threadgroup gathers the mixes (loads issued together, then a
// barrier), and simdgroup 0 forms pre, post and comb into `out` and pre into threadgroup memory.
inline void hc_row_coefficients(int n, int cols, bool head, int iters, float eps, device const float* part, int chunks,
                                device const float* scale, device const float* base, device float* out,
                                threadgroup float* mix, threadgroup float* pre, threadgroup float* comb, ushort sg, ushort lane) {
  HcLaneConsts k = {};
  if (sg == 0 && n * n <= 32) {
    k = hc_lane_consts(n, head, scale, base, lane);
  }
  const int mixes = head ? n : 2 * n + n * n;
  hc_gather_mixes(part, mixes, chunks, mixes + 1, mix, sg, lane);
  const float rs = rsqrt(mix[mixes] / float(n * cols) + eps);
  hc_coeffs_row(n, head, iters, eps, rs, scale, base, k, mix, out, pre, comb, sg, lane);
}

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

// pre_i = sigmoid(mix_i * rs * scale_0 + base_i) + eps for every stream, in registers: the
// expression of hc_coeffs_lanes / hc_coeffs_serial, so the same bits.
inline void hc_pre_of(int n, float eps, float rs, float scale0, thread const float* base, threadgroup const float* mix,
                      thread float* pre) {
  CK_UNROLL for (int i = 0; i < HC_MAX_STREAMS; i++) {
    pre[i] = i < n ? hc_sigmoid(mix[i] * rs * scale0 + base[i]) + eps : 0.0f;
  }
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
  const int mixes = head ? n : 2 * n + n * n;
  // Pre's mixes and the sum of squares (n + 1 <= 9 items: two turns), with few registers
  // beside the prefetched columns.
  hc_gather_turns<(HC_MAX_STREAMS + 1 + HC_TG_SG - 1) / HC_TG_SG, 4>(part, mixes, p.chunks, n + 1, mix, sg, lane);
  float pr[HC_MAX_STREAMS];
  hc_pre_of(n, eps, rsqrt(mix[mixes] / float(n * cols) + eps), scale0, b, mix, pr);
  hc_read_row<true>(n, cols, norm_eps, centred, flat, (thread const float*)pr, xs, w, wk,
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
    device const float* X = (device const float*)(x + ulong(row) * p.x_stride);
    float4 xs[HC_READ_AHEAD * HC_PF_STREAMS];
    hc_prefetch(p.streams, p.cols, X, int(sg) * 32 + int(lane), xs);
    hc_read_row<false>(p.streams, p.cols, p.eps, p.centred != 0, X, (device const float*)(coeffs + ulong(row) * p.c_stride), xs,
                       (device const float*)coeffs /* unused */, xs /* unused */, (device float*)(y + ulong(row) * p.y_stride), partial,
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
                      (device float*)(y + ulong(row) * p.y_stride), partial, sg, lane);
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
