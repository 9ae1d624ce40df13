// The hyper-connection site's read and coefficients as threadgroup functions (MODEL.md
// "Residual"): the kernels of hc.metal, and the projections that read a site themselves
// (matvec_multi_q4_r1_f32 with a site read: matvec.metal), call the same code, so the same bits.
#ifndef CHERENKOV_HC_SITE_H
#define CHERENKOV_HC_SITE_H

#include <metal_stdlib>
#include "hc.h"
#include "matvec.h"

using namespace metal;

#define HC_MAX_MIXES (2 * HC_MAX_STREAMS + HC_MAX_STREAMS * HC_MAX_STREAMS)
// A row per threadgroup of HC_TG_SG simdgroups for the reads: a thread holds one float4
// column of every stream at a time (two turns at d = 2048), partial sums meet in threadgroup
// memory in simdgroup order. One simdgroup per row was latency-bound on the H200 (85 us for
// the coefficients and 69 us for a read at d = 2048, n = 4), and so were 256 threads that
// each walked eight columns one load at a time (19 us a site). 512 threads would cover
// d = 2048 in one turn, but nvcc then caps registers at 64 and spills the columns.
#define HC_TG_SG 8
// Sites of at most this many streams gather their mixes in the first form (2n + n^2 + 1 <= 32
// items) and run Sinkhorn in the lane form (n^2 <= 32): kernels instantiated for them
// (NMAX = HC_SMALL_STREAMS) leave out the other forms' code (on sm_90, 66 of the 178 KB of
// matvec_multi_q4_r1_read_f32).
#define HC_SMALL_STREAMS 4
static_assert(2 * HC_SMALL_STREAMS + HC_SMALL_STREAMS * HC_SMALL_STREAMS + 1 <= 4 * HC_TG_SG && HC_SMALL_STREAMS * HC_SMALL_STREAMS <= 32,
              "HC_SMALL_STREAMS: the first gather form and the lane form of Sinkhorn must hold such a site");
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
template <int NMAX = HC_MAX_STREAMS>
inline void hc_coeffs_row(int n, bool head, int iters, float eps, float rs, device const float* scale,
                          device const float* base, HcLaneConsts k, threadgroup const float* mix, device float* out,
                          threadgroup float* pre, threadgroup float* comb, ushort sg, ushort lane) {
  if (sg != 0) {
    return;
  }
  if (NMAX <= HC_SMALL_STREAMS || n * n <= 32) {
    hc_coeffs_lanes(n, head, iters, eps, rs, k, mix, out, pre, lane);
  } else if (lane == 0) {
    hc_coeffs_serial(n, head, iters, eps, rs, scale, base, mix, out, pre, comb);
  }
}

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
// NMAX: the most streams the calling kernel serves (HC_SMALL_STREAMS: the second form, whose
// code a small site never runs, is not compiled in).
template <int NMAX = HC_MAX_STREAMS>
inline void hc_gather_mixes(device const float* part, int mixes, int chunks, int count, threadgroup float* mix, ushort sg, ushort lane) {
  if (NMAX <= HC_SMALL_STREAMS || count <= 4 * HC_TG_SG) {  // uniform
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

// Where a read puts its row (float4 column c4): device memory, or threadgroup memory in the
// layout a staged q4 projection reads (mv_staged_at).
struct HcOutDevice {
  device float4* y;
  inline void store(int c4, float4 v) const {
    y[c4] = v;
  }
  inline float4 load(int c4) const {
    return y[c4];
  }
};
struct HcOutStaged {
  threadgroup float4* xs;
  inline void store(int c4, float4 v) const {
    xs[mv_staged_at(uint(c4))] = v;
  }
  inline float4 load(int c4) const {
    return xs[mv_staged_at(uint(c4))];
  }
};

// x = sum_i pre_i X_i for one row, four columns per thread (cols % 4 == 0), into `out`
// (HcOutDevice or HcOutStaged), then (NORM)
// x * rsqrt(mean(x^2) + eps) * w. xs holds the thread's first HC_READ_AHEAD turns of columns
// (hc_prefetch) and wk their norm weights (hc_prefetch_norm); later ones (cols > 4 *
// HC_READ_AHEAD * threads) are loaded in the loop. The norm rescales what the same thread
// wrote, the prefetched turns from registers. PRE is where pre lives (device or threadgroup
// memory).
template <bool NORM, typename PRE, typename OUT>
inline void hc_read_row(int n, int cols, float eps, bool centred, device const float* X, PRE pre, thread float4* xs,
                        device const float* w, thread const float4* wk, OUT out, threadgroup float* partial,
                        ushort sg, ushort lane) {
  const int t = int(sg) * 32 + int(lane);
  const int c4s = cols / 4;
  const int step = 32 * HC_TG_SG;
  device const float4* X4 = (device const float4*)X;
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
      out.store(c4, v);
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
    out.store(c4, v);
    ss += dot(v, v);
  }
  if (NORM) {
    ss = hc_tg_sum(ss, partial, sg, lane);
    float r = rsqrt(ss / float(cols) + eps);
    float offset = centred ? 1.0f : 0.0f;
    MV_UNROLL for (int a = 0; a < HC_READ_AHEAD; a++) {
      const int c4 = t + a * step;
      if (c4 < c4s) {
        out.store(c4, kept[a] * r * (offset + wk[a]));
      }
    }
    for (int c4 = t + HC_READ_AHEAD * step; c4 < c4s; c4 += step) {
      float4 wv = float4(w[4 * c4], w[4 * c4 + 1], w[4 * c4 + 2], w[4 * c4 + 3]);
      out.store(c4, out.load(c4) * r * (offset + wv));
    }
  }
}

// One row's coefficients from its partials (both coefficient kernels): simdgroup 0 loads the
// lane form's scale and base, the threadgroup gathers the mixes (loads issued together, then a
// barrier), and simdgroup 0 forms pre, post and comb into `out` and pre into threadgroup memory.
template <int NMAX = HC_MAX_STREAMS>
inline void hc_row_coefficients(int n, int cols, bool head, int iters, float eps, device const float* part, int chunks,
                                device const float* scale, device const float* base, device float* out,
                                threadgroup float* mix, threadgroup float* pre, threadgroup float* comb, ushort sg, ushort lane) {
  HcLaneConsts k = {};
  if (sg == 0 && n * n <= 32) {
    k = hc_lane_consts(n, head, scale, base, lane);
  }
  const int mixes = head ? n : 2 * n + n * n;
  hc_gather_mixes<NMAX>(part, mixes, chunks, mixes + 1, mix, sg, lane);
  const float rs = rsqrt(mix[mixes] / float(n * cols) + eps);
  hc_coeffs_row<NMAX>(n, head, iters, eps, rs, scale, base, k, mix, out, pre, comb, sg, lane);
}


// pre_i = sigmoid(mix_i * rs * scale_0 + base_i) + eps for every stream, in registers: the
// expression of hc_coeffs_lanes / hc_coeffs_serial, so the same bits.
inline void hc_pre_of(int n, float eps, float rs, float scale0, thread const float* base, threadgroup const float* mix,
                      thread float* pre) {
  CK_UNROLL for (int i = 0; i < HC_MAX_STREAMS; i++) {
    pre[i] = i < n ? hc_sigmoid(mix[i] * rs * scale0 + base[i]) + eps : 0.0f;
  }
}

// A site's normalised read as one threadgroup of HC_TG_SG simdgroups does it (threadgroup 1 of
// hc_coeffs_read_norm_f32, and the projections that read a site themselves): pre from its
// mixes in the partials `part` (n + 1 items: pre's and the sum of squares), then x = sum_i
// pre_i X_i and its RMSNorm into `out` (HcOutDevice or HcOutStaged). `xs` and `wk` hold the
// stream columns and norm weights this thread loaded early (hc_prefetch, hc_prefetch_norm);
// `b` and `scale0` the site's base and scale[0]. Ends with every thread's columns written (the
// caller adds a barrier before other threads read threadgroup output).
template <typename OUT>
inline void hc_site_read(int n, int cols, bool head, float eps, float norm_eps, bool centred, device const float* flat,
                         device const float* part, int chunks, thread const float* b, float scale0, thread float4* xs,
                         device const float* w, thread const float4* wk, OUT out, threadgroup float* mix,
                         threadgroup float* partial, ushort sg, ushort lane) {
  const int mixes = head ? n : 2 * n + n * n;
  // Pre's mixes and the sum of squares (n + 1 <= 9 items: two turns), with few registers
  // beside the prefetched columns.
  hc_gather_turns<(HC_MAX_STREAMS + 1 + HC_TG_SG - 1) / HC_TG_SG, 4>(part, mixes, chunks, n + 1, mix, sg, lane);
  float pr[HC_MAX_STREAMS];
  hc_pre_of(n, eps, rsqrt(mix[mixes] / float(n * cols) + eps), scale0, b, mix, pr);
  hc_read_row<true>(n, cols, norm_eps, centred, flat, (thread const float*)pr, xs, w, wk, out, partial, sg, lane);
}

#endif  // CHERENKOV_HC_SITE_H
