// The hyper-connection write of one float4 column (MODEL.md "Residual"): the one source of
// hc_write_f32 (hc.metal) and of the producers that write their output into the streams
// themselves instead of storing it (the matvec_hc and moe_down_combine_hc epilogues), so a
// fused producer gives the bits of producer + hc_write_f32. With a fold (HcTarget.fold_mixes
// > 0) the writer also leaves the next site's raw products fn . flat for its columns, so the
// next site's coefficients need no hc_mix_partials pass (hc_store_lanes).
#ifndef CHERENKOV_HC_H
#define CHERENKOV_HC_H

#include <metal_stdlib>
#include "matvec.h"
#include "unroll.h"

using namespace metal;

#define HC_MAX_STREAMS 8
// fn's storage dtype in a fold (HcTarget.fold_dtype; lib/gpu/hyperconnection.ts FOLD_DTYPES).
#define HC_FN_F32 0
#define HC_FN_BF16 1
#define HC_FN_F16 2

// Stream j's new column X'_j = post_j y + sum_i comb[i][j] old_i (k: the row's coefficients
// [pre (n) | post (n) | comb (n * n)]): the one expression of every write, so every writer
// gives the same bits.
// The products are added with explicit fma: left to the compiler, nvcc contracted the sum
// differently in different writers (hc_write vs hc_store_lanes: 1 ulp apart on the H200).
inline float4 hc_new_column(int n, int j, device const float* k, float4 yv, thread const float4* old) {
  float4 v = k[n + j] * yv;
  CK_UNROLL for (int i = 0; i < HC_MAX_STREAMS; i++) {
    if (i < n) {
      v = fma(float4(k[2 * n + i * n + j]), old[i], v);
    }
  }
  return v;
}

// X'_j[c4] = post_j y + sum_i comb[i][j] X_i[c4] for float4 column c4 of one row's streams
// X ([n][c4s] float4s), k the row's coefficients. In place: the thread reads every old stream
// value of its column, at once, before writing any (a store between two columns keeps the
// compiler from hoisting every coefficient load: registers).
inline void hc_write_column(device float4* X, int c4s, int c4, int n, device const float* k, float4 yv) {
  float4 old[HC_MAX_STREAMS];
  CK_UNROLL for (int i = 0; i < HC_MAX_STREAMS; i++) {
    if (i < n) {
      old[i] = X[i * c4s + c4];
    }
  }
  CK_ROLLED for (int j = 0; j < n; j++) {
    X[j * c4s + c4] = hc_new_column(n, j, k, yv, old);
  }
}

// Where a fused producer puts its output: rows of the streams X (x_stride bytes apart) and
// of the site's coefficients, or with `residual` the plain residual X += y (n = 1, no site;
// coeffs unused). fold_mixes > 0 (hc_store_lanes only): the next site's fn ([fold_mixes][n *
// d], dtype fold_dtype) and its partials rows (p_stride bytes apart, [fold_mixes + 1][c4s]
// floats: item m, column c4 at m * c4s + c4; item fold_mixes is the sum of squares).
struct HcTarget {
  device uchar* x;
  device const uchar* coeffs;
  ulong x_stride;
  ulong c_stride;
  int streams;
  int c4s;
  bool residual;
  device const uchar* fold_fn;
  device uchar* fold_part;
  ulong p_stride;
  int fold_mixes;
  int fold_dtype;
};

// A target whose fold fields come from a writer's params and bindings (fold_mixes 0: no
// fold); the caller fills in the streams.
inline HcTarget hc_fold_target(device const uchar* fn, device uchar* part, ulong p_stride, int mixes, int dtype) {
  HcTarget t;
  t.fold_fn = fn;
  t.fold_part = part;
  t.p_stride = p_stride;
  t.fold_mixes = mixes;
  t.fold_dtype = dtype;
  return t;
}

// The write of y (column c4 of batch row `row`) into the target (one thread).
inline void hc_store(HcTarget t, int row, int c4, float4 yv) {
  device float4* X = (device float4*)(t.x + ulong(row) * t.x_stride);
  if (t.residual) {
    X[c4] = X[c4] + yv;
  } else {
    hc_write_column(X, t.c4s, c4, t.streams, (device const float*)(t.coeffs + ulong(row) * t.c_stride), yv);
  }
}

// Element e of fn and the three after it, in fn's storage dtype (HC_FN_*; uniform branch).
inline float4 hc_fn_load4(device const uchar* fn, ulong e, int dtype) {
  if (dtype == HC_FN_BF16) {
    return Weights<bfloat>::load4(fn, e);
  } else if (dtype == HC_FN_F16) {
    return Weights<half>::load4(fn, e);
  }
  return Weights<float>::load4(fn, e);
}

// Threadgroup tg of ntg asks L2 for its share (a contiguous 1/ntg) of the fold's fn, the next
// site's weights, before the writer waits for its inputs (one lane calls it; grid.h): together
// the threadgroups bring all of fn, so each one's epilogue (hc_store_lanes: its column of every
// item and stream) reads L2 instead of waiting on memory at the end of the kernel. A no-op
// without a fold, and on Metal and the CPU backend (ck_prefetch).
inline void hc_fold_prefetch(device const uchar* fn, int mixes, int streams, int d, int dtype, bool residual, uint tg, uint ntg) {
  if (residual || mixes <= 0) {
    return;
  }
  const ulong bytes = ulong(mixes) * ulong(streams) * ulong(d) * (dtype == HC_FN_F32 ? 4ul : 2ul);
  const ulong per = ((bytes + ulong(ntg) - 1ul) / ulong(ntg) + 15ul) & ~15ul;
  const ulong at = ulong(tg) * per;
  if (at < bytes) {
    ck_prefetch(fn + at, uint(min(per, bytes - at)));
  }
}

// Turns of hc_store_lanes' fold whose fn values a lane loads with the old column, before
// the new column is formed (one trip to memory for n <= 4: 25 items x 4 streams are 4 turns);
// later turns (n > 4) load theirs when they come.
#define HC_FOLD_AHEAD 4

// hc_store by a whole simdgroup (every lane calls it with the same yv). Without a fold lane 0
// writes the column. With one, lane j < n loads old stream j's column and, the columns shared
// by shuffles, forms and writes stream j's new column (hc_new_column's arithmetic in its order:
// the same bits); then the next site's partials for this column, item m = sum over streams i
// of fn[m]_i . new_i (item `mixes`: the sum of squares), are formed one (item, stream) pair a
// lane, 32 / n items a turn, and the n lanes of an item add their products in stream order
// into the first one, which writes it (hc_fold_item's order: the same bits). A lane holds one
// column and HC_FOLD_AHEAD fn values, not n of each (registers: the matvec_hc epilogues ran at
// 255 on sm_90 with n-sized arrays). Partials land in a fixed place per (item, column): the
// gather's order, not the writers', fixes the sum (no atomics).
inline void hc_store_lanes(HcTarget t, int row, int c4, float4 yv, ushort lane) {
  if (t.residual || t.fold_mixes == 0) {  // uniform
    if (lane == 0) {
      hc_store(t, row, c4, yv);
    }
    return;
  }
  const int n = t.streams, c4s = t.c4s, mixes = t.fold_mixes;
  const ulong flat = ulong(n) * ulong(c4s) * 4ul;
  device float4* X = (device float4*)(t.x + ulong(row) * t.x_stride);
  const int j = int(lane) < n ? int(lane) : 0;  // lanes past n shadow stream 0
  // This lane's (item, stream) pair in each turn: items per turn, the lane's place in its item.
  const int per_turn = 32 / n;
  const int stream = int(lane) % n;
  const int slot = int(lane) / n;  // the lane's item within a turn (per_turn: none)
  const int turns = (mixes + 1 + per_turn - 1) / per_turn;
  // Loads first, all at once: the old column and the first turns' fn values.
  const float4 own = X[j * c4s + c4];
  float4 ahead[HC_FOLD_AHEAD];
  CK_UNROLL for (int u = 0; u < HC_FOLD_AHEAD; u++) {
    const int item = u * per_turn + slot;
    ahead[u] = u < turns && slot < per_turn && item < mixes
                   ? hc_fn_load4(t.fold_fn, ulong(item) * flat + ulong(stream * c4s + c4) * 4ul, t.fold_dtype)
                   : float4(0.0f);
  }
  device const float* k = (device const float*)(t.coeffs + ulong(row) * t.c_stride);
  float4 mine = k[n + j] * yv;
  for (int i = 0; i < n; i++) {  // uniform: every lane takes part in the shuffles
    const float4 old_i = simd_shuffle(own, ushort(i));
    mine = fma(float4(k[2 * n + i * n + j]), old_i, mine);
  }
  simdgroup_barrier(mem_flags::mem_none);  // every lane has read its old column
  if (int(lane) < n) {
    X[j * c4s + c4] = mine;
  }
  const float4 nv = simd_shuffle(mine, ushort(stream));  // stream `stream`'s new column
  device float* part = (device float*)(t.fold_part + ulong(row) * t.p_stride);
  for (int u = 0; u < turns; u++) {  // uniform
    const int item = u * per_turn + slot;
    const bool live = slot < per_turn && item <= mixes;
    float4 w = float4(0.0f);
    CK_UNROLL for (int a = 0; a < HC_FOLD_AHEAD; a++) {
      if (a == u) {
        w = ahead[a];
      }
    }
    if (u >= HC_FOLD_AHEAD && live && item < mixes) {
      w = hc_fn_load4(t.fold_fn, ulong(item) * flat + ulong(stream * c4s + c4) * 4ul, t.fold_dtype);
    }
    const float prod = item == mixes ? dot(nv, nv) : dot(w, nv);
    // The item's first lane adds the products in stream order (from 0, as hc_fold_item did).
    float v = 0.0f + prod;
    for (int i = 1; i < n; i++) {  // uniform
      const float next = simd_shuffle_down(prod, ushort(i));
      v += next;
    }
    if (live && stream == 0) {
      part[item * c4s + c4] = v;
    }
  }
}

#endif  // CHERENKOV_HC_H
