// Row-batched dense projections y[r] = W x[r] for every storage dtype. Bodies are in matvec.h.
// The _hc forms write y into hyper-connection streams instead of storing it (hc.h).
#include <metal_stdlib>
#include "params.h"
#include "matvec.h"
#include "hc.h"
#include "hc-site.h"
#include "conv.h"
#include "norm.h"

using namespace metal;

// One `matvec` simdgroup: its MV_R rows of W from o0 for batch rows [r_begin, r_end), NR
// rows per pass (y = W x, or y += W x when accumulating; HC: the write of y into `hc`'s
// streams, column o0 / 4, in place of the store). matvec, matvec_hc and matvec_multi share it,
// so a projection gives the same bits in each.
template <typename T, int NR, bool HC = false>
inline void matvec_simdgroup(device const uchar* w, int in_dim, int o0, int out_dim, device const uchar* x, ulong x_stride,
                             int r_begin, int r_end, device uchar* y, ulong y_stride, bool accumulate, ushort lane,
                             HcTarget hc = HcTarget()) {
  for (int r0 = r_begin; r0 < r_end; r0 += NR) {
    ulong xoff[NR];
    mv_row_offsets<NR>(xoff, r0, r_end, x_stride);
    int nx = min(NR, r_end - r0);
    float4 acc[NR];
    mv_clear<NR>(acc);
    MvPass<T, NR>::run(w, in_dim, o0, out_dim, x, xoff, nx, acc, lane);
    mv_reduce<NR>(acc, nx);
    for (int j = 0; j < NR; j++) if (j < nx) {
      if (HC) {
        hc_store_lanes(hc, r0 + j, o0 / MV_R, acc[j], lane);  // every lane: the fold's epilogue
      } else if (lane == 0) {
        mv_store(y, y_stride, r0 + j, o0, out_dim, acc[j], accumulate);
      }
    }
  }
}

// y[r] = W x[r] (+ y[r]). Threadgroup (x, y) covers MV_SG * MV_R output rows for batch rows
// [y * rows_per_group, ...); each simdgroup walks those rows NR at a time with its
// MV_R weight rows, so a weight is read once per threadgroup row range.
template <typename T, int NR>
[[max_total_threads_per_threadgroup(128)]] kernel void matvec(
    constant MatvecParams& p [[buffer(0)]],
    device const uchar* w    [[buffer(1)]],
    device const uchar* x    [[buffer(2)]],
    device uchar* y          [[buffer(3)]],
    uint2 tg                 [[threadgroup_position_in_grid]],
    ushort sg                [[simdgroup_index_in_threadgroup]],
    ushort lane              [[thread_index_in_simdgroup]]) {
  int o0 = (int(tg.x) * MV_SG + int(sg)) * MV_R;
  int r_begin = int(tg.y) * p.rows_per_group;
  int r_end = min(p.rows, r_begin + p.rows_per_group);
  if (o0 >= p.out_dim || r_begin >= r_end) {
    return;  // uniform per simdgroup
  }
  if (lane == 0) {
    mv_prefetch_tile<T>(w, p.in_dim, o0, p.out_dim);
  }
  ck_inputs_ready();
  matvec_simdgroup<T, NR>(w, p.in_dim, o0, p.out_dim, x, p.x_stride, r_begin, r_end, y, p.y_stride, p.accumulate != 0, lane);
}

// matvec's decode form for q4 rows of at most MV_STAGE_COLS columns (the host picks it for a
// one-row dispatch): the threadgroup stages its input row in threadgroup memory and its
// simdgroups read x from there (mv_pass_q4_staged). From device memory a lane's 32 x values
// are 128 bytes from its neighbours', so each of a group's eight 16-byte x loads touched 32
// cache lines: in a decode projection that was most of an L1's work, the weights being one
// 16-byte load a row and group (H200, [8192, 2048]: 8.9 -> a median of 6.8 us timed cold, 5.5
// warm with the weights loaded before the wait; the LM head 113 -> 72-81).
// The same pass, reduction and store as matvec<uchar, 1>: the same bits. A row wider than the
// staging takes that form.
// LOADS_ONLY: bench:kernels' loads-only form (q4_loads_only, matvec.h).
template <bool LOADS_ONLY>
[[max_total_threads_per_threadgroup(128)]] kernel void matvec_q4_staged_r1(
    constant MatvecParams& p [[buffer(0)]],
    device const uchar* w    [[buffer(1)]],
    device const uchar* x    [[buffer(2)]],
    device uchar* y          [[buffer(3)]],
    uint2 tg                 [[threadgroup_position_in_grid]],
    ushort sg                [[simdgroup_index_in_threadgroup]],
    ushort lane              [[thread_index_in_simdgroup]]) {
  threadgroup float4 xs[MV_STAGE_COLS / 4];
  threadgroup float4 gsums[MV_STAGE_COLS / 32];
  const int o0 = (int(tg.x) * MV_SG + int(sg)) * MV_R;
  const int r_begin = int(tg.y) * p.rows_per_group;
  const int r_end = min(p.rows, r_begin + p.rows_per_group);
  const bool active = o0 < p.out_dim && r_begin < r_end;  // uniform per simdgroup
  if (active && lane == 0) {
    mv_prefetch_tile<uchar>(w, p.in_dim, o0, p.out_dim);
  }
  if (p.in_dim > MV_STAGE_COLS || p.rows_per_group != 1) {  // uniform: x from device memory (not the host's choice)
    ck_inputs_ready();
    if (active && LOADS_ONLY) {
      matvec_simdgroup<q4_loads_only, 1>(w, p.in_dim, o0, p.out_dim, x, p.x_stride, r_begin, r_end, y, p.y_stride, p.accumulate != 0, lane);
    } else if (active) {
      matvec_simdgroup<uchar, 1>(w, p.in_dim, o0, p.out_dim, x, p.x_stride, r_begin, r_end, y, p.y_stride, p.accumulate != 0, lane);
    }
    return;
  }
  float4 acc[1] = {float4(0.0f)};  // (the pass waits for the previous dispatch after loading its weights)
  if (mv_pass_q4_staged<LOADS_ONLY>(w, p.in_dim, o0, p.out_dim, active, xs, gsums, x + ulong(r_begin) * p.x_stride, r_begin < p.rows,
                        int(sg) * 32 + int(lane), MV_SG * 32, acc, int(lane))) {
    mv_reduce<1>(acc, 1);
    if (lane == 0) {
      mv_store(y, p.y_stride, r_begin, o0, p.out_dim, acc[0], p.accumulate != 0);
    }
  }
}

// One `matvec_split` threadgroup: MV_R output rows of W from o0 for batch rows
// [r_begin, r_end), its nsg (<= MV_SPLIT_SG, the host's choice) simdgroups splitting the input
// dimension (lane l of simdgroup s takes the columns of item s * 32 + l, then every 32 * nsg
// items: float4s for dense weights, q4 groups of 32); the partial sums meet in threadgroup
// memory (`part`, [MV_SPLIT_SG][NR]), added in simdgroup order (HC:
// written into `hc`'s streams as matvec_simdgroup does). matvec_split, matvec_split_hc and
// matvec_multi_split share it, so a projection gives the same bits in each.
// The end of a matvec_split pass: each simdgroup's partial sums meet in `part`, added in
// simdgroup order, and simdgroup 0 stores them (HC: writes them into the streams). Ends with
// a barrier: `part` may be reused.
template <int NR, bool HC>
inline void mv_split_finish(thread float4* acc, int nx, int r0, int o0, int out_dim, device uchar* y, ulong y_stride, bool accumulate,
                            threadgroup float4* part, ushort sg, ushort lane, int nsg, HcTarget hc) {
  mv_reduce<NR>(acc, nx);
  if (lane == 0) {
    for (int j = 0; j < NR; j++) if (j < nx) {
      part[int(sg) * NR + j] = acc[j];
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (sg == 0 && (HC || lane == 0)) {  // HC: all of simdgroup 0 (hc_store_lanes)
    for (int j = 0; j < NR; j++) if (j < nx) {
      float4 v = part[j];
      for (int s = 1; s < nsg; s++) {
        v += part[s * NR + j];
      }
      if (HC) {
        hc_store_lanes(hc, r0 + j, o0 / MV_R, v, lane);
      } else {
        mv_store(y, y_stride, r0 + j, o0, out_dim, v, accumulate);
      }
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);  // part is reused by the next pass
}

template <typename T, int NR, bool HC = false>
inline void matvec_split_tg(device const uchar* w, int in_dim, int o0, int out_dim, device const uchar* x, ulong x_stride,
                            int r_begin, int r_end, device uchar* y, ulong y_stride, bool accumulate,
                            threadgroup float4* part, ushort sg, ushort lane, int nsg, HcTarget hc = HcTarget()) {
  for (int r0 = r_begin; r0 < r_end; r0 += NR) {
    ulong xoff[NR];
    mv_row_offsets<NR>(xoff, r0, r_end, x_stride);
    int nx = min(NR, r_end - r0);
    float4 acc[NR];
    mv_clear<NR>(acc);
    MvPass<T, NR>::run_split(w, in_dim, o0, out_dim, x, xoff, nx, acc, int(sg) * 32 + int(lane), 32 * nsg);
    mv_split_finish<NR, HC>(acc, nx, r0, o0, out_dim, y, y_stride, accumulate, part, sg, lane, nsg, hc);
  }
}

// y[r] = W x[r] (+ y[r]) for narrow W: threadgroup (x, y) holds MV_R output rows for batch
// rows [y * rows_per_group, ...) (matvec_split_tg). A matvec with few output rows gets
// MV_SPLIT_SG times the simdgroups of `matvec` and each a shorter walk: on the H200 a
// [24, 8192] projection took 149 us as `matvec` (two threadgroups, latency-bound).
template <typename T, int NR>
[[max_total_threads_per_threadgroup(256)]] kernel void matvec_split(
    constant MatvecParams& p [[buffer(0)]],
    device const uchar* w    [[buffer(1)]],
    device const uchar* x    [[buffer(2)]],
    device uchar* y          [[buffer(3)]],
    uint2 tg                 [[threadgroup_position_in_grid]],
    ushort sg                [[simdgroup_index_in_threadgroup]],
    ushort lane              [[thread_index_in_simdgroup]],
    ushort nsg               [[simdgroups_per_threadgroup]]) {
  threadgroup float4 part[MV_SPLIT_SG][NR];
  int o0 = int(tg.x) * MV_R;
  int r_begin = int(tg.y) * p.rows_per_group;
  int r_end = min(p.rows, r_begin + p.rows_per_group);
  if (o0 >= p.out_dim || r_begin >= r_end) {
    return;  // uniform per threadgroup: no barrier is left waiting
  }
  if (sg == 0 && lane == 0) {
    mv_prefetch_tile<T>(w, p.in_dim, o0, p.out_dim);
  }
  ck_inputs_ready();
  matvec_split_tg<T, NR>(w, p.in_dim, o0, p.out_dim, x, p.x_stride, r_begin, r_end, y, p.y_stride, p.accumulate != 0, &part[0][0], sg, lane, int(nsg));
}

// The streams target of a _hc kernel's params and bindings.
inline HcTarget matvec_hc_target(constant MatvecHcParams& p, device uchar* X, device const uchar* coeffs,
                                 device const uchar* fold_fn, device uchar* fold_part) {
  HcTarget t = hc_fold_target(fold_fn, fold_part, p.p_stride, p.fold_mixes, p.fold_dtype);
  t.x = X;
  t.coeffs = coeffs;
  t.x_stride = p.hc_stride;
  t.c_stride = p.c_stride;
  t.streams = p.streams;
  t.c4s = p.out_dim / 4;
  t.residual = false;
  return t;
}

// matvec whose output goes into hyper-connection streams: X'[r][j] = post_j y + sum_i
// comb[i][j] X[r][i] with y = W x[r] (out_dim = d, a multiple of 4: a simdgroup's MV_R
// outputs are one whole float4 column, so the thread that forms them owns its write).
template <typename T, int NR>
[[max_total_threads_per_threadgroup(128)]] kernel void matvec_hc(
    constant MatvecHcParams& p [[buffer(0)]],
    device const uchar* w      [[buffer(1)]],
    device const uchar* x      [[buffer(2)]],
    device uchar* X            [[buffer(3)]],
    device const uchar* coeffs [[buffer(4)]],
    device const uchar* fold_fn [[buffer(5)]],
    device uchar* fold_part    [[buffer(6)]],
    uint2 tg                   [[threadgroup_position_in_grid]],
    uint2 ntg                  [[threadgroups_per_grid]],
    ushort sg                  [[simdgroup_index_in_threadgroup]],
    ushort lane                [[thread_index_in_simdgroup]]) {
  int o0 = (int(tg.x) * MV_SG + int(sg)) * MV_R;
  int r_begin = int(tg.y) * p.rows_per_group;
  int r_end = min(p.rows, r_begin + p.rows_per_group);
  if (o0 >= p.out_dim || r_begin >= r_end) {
    return;  // uniform per simdgroup
  }
  if (lane == 0) {
    mv_prefetch_tile<T>(w, p.in_dim, o0, p.out_dim);
    if (sg == 0 && tg.y == 0u) {
      hc_fold_prefetch(fold_fn, p.fold_mixes, p.streams, p.out_dim, p.fold_dtype, false, tg.x, ntg.x);
    }
  }
  ck_inputs_ready();
  matvec_simdgroup<T, NR, true>(w, p.in_dim, o0, p.out_dim, x, p.x_stride, r_begin, r_end, X, 0, false, lane,
                                matvec_hc_target(p, X, coeffs, fold_fn, fold_part));
}

// matvec_split whose output goes into hyper-connection streams (as matvec_hc).
template <typename T, int NR>
[[max_total_threads_per_threadgroup(256)]] kernel void matvec_split_hc(
    constant MatvecHcParams& p [[buffer(0)]],
    device const uchar* w      [[buffer(1)]],
    device const uchar* x      [[buffer(2)]],
    device uchar* X            [[buffer(3)]],
    device const uchar* coeffs [[buffer(4)]],
    device const uchar* fold_fn [[buffer(5)]],
    device uchar* fold_part    [[buffer(6)]],
    uint2 tg                   [[threadgroup_position_in_grid]],
    uint2 ntg                  [[threadgroups_per_grid]],
    ushort sg                  [[simdgroup_index_in_threadgroup]],
    ushort lane                [[thread_index_in_simdgroup]],
    ushort nsg                 [[simdgroups_per_threadgroup]]) {
  threadgroup float4 part[MV_SPLIT_SG][NR];
  int o0 = int(tg.x) * MV_R;
  int r_begin = int(tg.y) * p.rows_per_group;
  int r_end = min(p.rows, r_begin + p.rows_per_group);
  if (o0 >= p.out_dim || r_begin >= r_end) {
    return;  // uniform per threadgroup: no barrier is left waiting
  }
  if (sg == 0 && lane == 0) {
    mv_prefetch_tile<T>(w, p.in_dim, o0, p.out_dim);
  }
  if (sg == 1 && lane == 0 && tg.y == 0u) {
    hc_fold_prefetch(fold_fn, p.fold_mixes, p.streams, p.out_dim, p.fold_dtype, false, tg.x, ntg.x);
  }
  ck_inputs_ready();
  matvec_split_tg<T, NR, true>(w, p.in_dim, o0, p.out_dim, x, p.x_stride, r_begin, r_end, X, 0, false, &part[0][0], sg, lane,
                               int(nsg), matvec_hc_target(p, X, coeffs, fold_fn, fold_part));
}

// Several projections of one input in one dispatch (DeltaNet's qkv and z, attention's q,
// gate, k and v): the simdgroups are laid out weight after weight, each weight's rows in
// MV_R tiles, and a simdgroup finds its weight by the tile counts; then it is `matvec`'s
// simdgroup for that weight (matvec_simdgroup: the same bits as separate matvecs).
// The weight of matvec_multi's `tile` (MV_R rows, counted weight after weight): its index,
// and the tile's index within it.
template <typename P>
inline int mv_multi_weight(constant P& p, thread int& tile) {
  int i = 0;
  while (i < p.count - 1 && tile >= (p.out_dim[i] + MV_R - 1) / MV_R) {
    tile -= (p.out_dim[i] + MV_R - 1) / MV_R;
    i++;
  }
  return i;
}

// Binding i of a matvec_multi's four weights (or outputs).
inline device const uchar* mv_pick(int i, device const uchar* a, device const uchar* b, device const uchar* c, device const uchar* d) {
  return i == 0 ? a : i == 1 ? b : i == 2 ? c : d;
}
inline device uchar* mv_pick(int i, device uchar* a, device uchar* b, device uchar* c, device uchar* d) {
  return i == 0 ? a : i == 1 ? b : i == 2 ? c : d;
}

// The MV_R tiles of the first p.dense_count (bf16) weights: they come first.
template <typename P>
inline int mv_dense_tiles(constant P& p) {
  int tiles = 0;
  for (int k = 0; k < p.dense_count; k++) {
    tiles += (p.out_dim[k] + MV_R - 1) / MV_R;
  }
  return tiles;
}

template <typename T, int NR>
[[max_total_threads_per_threadgroup(128)]] kernel void matvec_multi(
    constant MatvecMultiParams& p [[buffer(0)]],
    device const uchar* w0   [[buffer(1)]],
    device const uchar* w1   [[buffer(2)]],
    device const uchar* w2   [[buffer(3)]],
    device const uchar* w3   [[buffer(4)]],
    device const uchar* x    [[buffer(5)]],
    device uchar* y0         [[buffer(6)]],
    device uchar* y1         [[buffer(7)]],
    device uchar* y2         [[buffer(8)]],
    device uchar* y3         [[buffer(9)]],
    uint2 tg                 [[threadgroup_position_in_grid]],
    ushort sg                [[simdgroup_index_in_threadgroup]],
    ushort lane              [[thread_index_in_simdgroup]]) {
  int tile = int(tg.x) * MV_SG + int(sg);
  const int i = mv_multi_weight(p, tile);
  const int out_dim = p.out_dim[i];
  device const uchar* w = mv_pick(i, w0, w1, w2, w3);
  device uchar* y = mv_pick(i, y0, y1, y2, y3);
  const ulong y_stride = p.y_stride[i];
  int o0 = tile * MV_R;
  int r_begin = int(tg.y) * p.rows_per_group;
  int r_end = min(p.rows, r_begin + p.rows_per_group);
  if (o0 >= out_dim || r_begin >= r_end) {
    return;  // uniform per simdgroup
  }
  if (lane == 0) {
    mv_prefetch_tile<T>(w, p.in_dim, o0, out_dim);
  }
  ck_inputs_ready();
  matvec_simdgroup<T, NR>(w, p.in_dim, o0, out_dim, x, p.x_stride, r_begin, r_end, y, y_stride, false, lane);
}

// A decode q4 tile's MV_R outputs (channels o0..) stored, or with `conv` put through the
// causal conv + SiLU of conv.h (DeltaNet's qkv: channel c's conv output and state instead of
// the projection's; conv_silu_rows_f32's bits for a one-row batch).
inline void mv_store_or_conv(bool conv, int taps, device uchar* y, ulong y_stride, int row, int o0, int out_dim, float4 v,
                             device const float* conv_w, device float* conv_state, device float* conv_y) {
  if (!conv) {
    mv_store(y, y_stride, row, o0, out_dim, v, false);
    return;
  }
  for (int i = 0; i < MV_R && o0 + i < out_dim; i++) {
    conv_decode_channel(taps, uint(out_dim), uint(o0 + i), v[i], conv_w, conv_state, conv_y);
  }
}

// matvec_multi's decode form for q4 (one batch row a threadgroup, one row a pass): the
// threadgroup stages its input row in threadgroup memory (mv_pass_q4_staged: rows of up to
// MV_STAGE_COLS columns), and its simdgroups read x from there instead of each reading it
// from device memory. The same pass, reduction and store as matvec_multi<uchar, 1> (which
// wider rows still take), so the same bits: a simdgroup is one MV_R tile, nsg of them a
// threadgroup. The first p.dense_count weights may be bf16 (DeltaNet's b and a beside its q4
// qkv and z): the first threadgroups then take one MV_R tile of those each in
// matvec_multi_split's form (its nsg simdgroups splitting the input: the host launches 256
// threads, so the same bits as matvec_multi_split_bf16, which a verify batch runs), so a decode
// step's four input projections are one dispatch, not two.
[[max_total_threads_per_threadgroup(256)]] kernel void matvec_multi_q4_r1_f32(
    constant MatvecMultiParams& p [[buffer(0)]],
    device const uchar* w0   [[buffer(1)]],
    device const uchar* w1   [[buffer(2)]],
    device const uchar* w2   [[buffer(3)]],
    device const uchar* w3   [[buffer(4)]],
    device const uchar* x    [[buffer(5)]],
    device uchar* y0         [[buffer(6)]],
    device uchar* y1         [[buffer(7)]],
    device uchar* y2         [[buffer(8)]],
    device uchar* y3         [[buffer(9)]],
    device const float* conv_w [[buffer(10)]],
    device float* conv_state [[buffer(11)]],
    device float* conv_y     [[buffer(12)]],
    uint2 tg                 [[threadgroup_position_in_grid]],
    ushort sg                [[simdgroup_index_in_threadgroup]],
    ushort lane              [[thread_index_in_simdgroup]],
    ushort nsg               [[simdgroups_per_threadgroup]]) {
  threadgroup float4 xs[MV_STAGE_COLS / 4];
  threadgroup float4 gsums[MV_STAGE_COLS / 32];
  threadgroup float4 part[MV_SPLIT_SG];
  const int r = int(tg.y) * p.rows_per_group;
  const int r_end = min(p.rows, r + p.rows_per_group);
  const int dense_tiles = mv_dense_tiles(p);
  if (int(tg.x) < dense_tiles) {  // uniform per threadgroup: one bf16 tile, split form
    int tile = int(tg.x);
    const int i = mv_multi_weight(p, tile);
    device const uchar* w = mv_pick(i, w0, w1, w2, w3);
    device uchar* y = mv_pick(i, y0, y1, y2, y3);
    if (r < r_end) {
      if (sg == 0 && lane == 0) {
        mv_prefetch_tile<bfloat>(w, p.in_dim, tile * MV_R, p.out_dim[i]);
      }
      ck_inputs_ready();
      matvec_split_tg<bfloat, 1>(w, p.in_dim, tile * MV_R, p.out_dim[i], x, p.x_stride, r, r_end, y, p.y_stride[i], false, part, sg, lane,
                                 int(nsg));
    }
    return;
  }
  int tile = dense_tiles + (int(tg.x) - dense_tiles) * int(nsg) + int(sg);
  const int i = mv_multi_weight(p, tile);
  const int out_dim = p.out_dim[i];
  device const uchar* w = mv_pick(i, w0, w1, w2, w3);
  device uchar* y = mv_pick(i, y0, y1, y2, y3);
  const ulong y_stride = p.y_stride[i];
  const int o0 = tile * MV_R;
  const bool active = i >= p.dense_count && o0 < out_dim && r < r_end;  // uniform per simdgroup
  if (active && lane == 0) {
    mv_prefetch_tile<uchar>(w, p.in_dim, o0, out_dim);
  }
  if (p.in_dim > MV_STAGE_COLS || p.rows_per_group != 1) {  // uniform: x from device memory
    ck_inputs_ready();
    if (active) {
      matvec_simdgroup<uchar, 1>(w, p.in_dim, o0, out_dim, x, p.x_stride, r, r_end, y, y_stride, false, lane);
    }
    return;
  }
  float4 acc[1] = {float4(0.0f)};  // (the pass waits for the previous dispatch after loading its weights; every simdgroup stages x)
  if (mv_pass_q4_staged(w, p.in_dim, o0, out_dim, active, xs, gsums, x + ulong(r) * p.x_stride, r < p.rows, int(sg) * 32 + int(lane), int(nsg) * 32,
                        acc, int(lane))) {
    mv_reduce<1>(acc, 1);
    if (lane == 0) {  // (the host asks for the conv only where this staged form runs)
      mv_store_or_conv(i == p.conv_index, p.conv_taps, y, y_stride, r, o0, out_dim, acc[0], conv_w, conv_state, conv_y);
    }
  }
}

// matvec_multi for narrow weights (DeltaNet's b and a: 32 rows each): a threadgroup per MV_R
// tile, its simdgroups splitting the input dimension (matvec_split_tg: the same bits as
// separate split matvecs). The rows form gave those two 4 threadgroups (21 us on the H200).
template <typename T, int NR>
[[max_total_threads_per_threadgroup(256)]] kernel void matvec_multi_split(
    constant MatvecMultiParams& p [[buffer(0)]],
    device const uchar* w0   [[buffer(1)]],
    device const uchar* w1   [[buffer(2)]],
    device const uchar* w2   [[buffer(3)]],
    device const uchar* w3   [[buffer(4)]],
    device const uchar* x    [[buffer(5)]],
    device uchar* y0         [[buffer(6)]],
    device uchar* y1         [[buffer(7)]],
    device uchar* y2         [[buffer(8)]],
    device uchar* y3         [[buffer(9)]],
    uint2 tg                 [[threadgroup_position_in_grid]],
    ushort sg                [[simdgroup_index_in_threadgroup]],
    ushort lane              [[thread_index_in_simdgroup]],
    ushort nsg               [[simdgroups_per_threadgroup]]) {
  threadgroup float4 part[MV_SPLIT_SG][NR];
  int tile = int(tg.x);
  const int i = mv_multi_weight(p, tile);
  const int out_dim = p.out_dim[i];
  device const uchar* w = mv_pick(i, w0, w1, w2, w3);
  device uchar* y = mv_pick(i, y0, y1, y2, y3);
  int o0 = tile * MV_R;
  int r_begin = int(tg.y) * p.rows_per_group;
  int r_end = min(p.rows, r_begin + p.rows_per_group);
  if (o0 >= out_dim || r_begin >= r_end) {
    return;  // uniform per threadgroup
  }
  if (sg == 0 && lane == 0) {
    mv_prefetch_tile<T>(w, p.in_dim, o0, out_dim);
  }
  ck_inputs_ready();
  matvec_split_tg<T, NR>(w, p.in_dim, o0, out_dim, x, p.x_stride, r_begin, r_end, y, p.y_stride[i], false, &part[0][0], sg, lane, int(nsg));
}

// The fused reads' tiles, asked of L2 before the kernel waits for its input (nothing before it
// writes them): by lane 0 of every simdgroup of a q4 threadgroup (its `per` turns of tiles from
// `first`, nsg apart) and of the first simdgroup of a bf16 one (its one tile, `first`).
template <typename P>
inline void mv_read_prefetch_tiles(constant P& p, bool dense, int first, int per, int nsg, int cols, device const uchar* w0,
                                   device const uchar* w1, device const uchar* w2, device const uchar* w3, ushort sg, ushort lane) {
  if (lane != 0 || (sg != 0 && dense)) {
    return;
  }
  for (int k = 0; k < per; k++) {
    int tile = first + k * nsg;
    const int i = mv_multi_weight(p, tile);
    device const uchar* w = mv_pick(i, w0, w1, w2, w3);
    if (dense) {
      mv_prefetch_tile<bfloat>(w, cols, tile * MV_R, p.out_dim[i]);
    } else if (i >= p.dense_count) {
      mv_prefetch_tile<uchar>(w, cols, tile * MV_R, p.out_dim[i]);
    }
  }
}

// The norm weights of a thread's first HC_READ_AHEAD float4 columns (t, t + threads, ..: the
// read's stride; hc_prefetch_norm's columns), loaded before the wait.
inline void mv_read_norm_ahead(device const float* norm, int cols, int t, int threads, thread float4* wk) {
  CK_UNROLL for (int a = 0; a < HC_READ_AHEAD; a++) {
    const int c4 = t + a * threads;
    wk[a] = c4 < cols / 4 ? float4(norm[4 * c4], norm[4 * c4 + 1], norm[4 * c4 + 2], norm[4 * c4 + 3]) : float4(0.0f);
  }
}

// The plain residual's read (n = 1, no site: the MTP head) as a threadgroup of
// matvec_multi_q4_r1_read forms it: y = x * rsqrt(mean(x^2) + eps) * (centred ? 1 + w : w)
// into the staging buffer, the arithmetic of rms_norm_f32 (norm.h), so the same bits: every
// simdgroup forms the scale itself in rms_norm_vector's order (no barrier to share it), each
// thread scales its own float4 columns with the norm weights `wk` it loaded early (HC_READ_AHEAD
// turns of nsg * 32 threads; later ones load here). The caller's barrier ends it.
inline void mv_plain_read(int cols, float eps, bool centred, device const float* x, device const float* norm, thread const float4* wk,
                          threadgroup float4* xs, int t, int threads, ushort lane) {
  const float r = rms_norm_scale(cols, eps, x, lane);
  const float offset = centred ? 1.0f : 0.0f;
  device const float4* x4 = (device const float4*)x;
  MV_UNROLL for (int a = 0; a < HC_READ_AHEAD; a++) {
    const int c4 = t + a * threads;
    if (c4 < cols / 4) {
      HcOutStaged{xs}.store(c4, x4[c4] * r * (offset + wk[a]));
    }
  }
  for (int c4 = t + HC_READ_AHEAD * threads; c4 < cols / 4; c4 += threads) {
    const float4 wv = float4(norm[4 * c4], norm[4 * c4 + 1], norm[4 * c4 + 2], norm[4 * c4 + 3]);
    HcOutStaged{xs}.store(c4, x4[c4] * r * (offset + wv));
  }
}

// matvec_multi_q4_r1_f32 whose input row is a residual's normalised read: every threadgroup
// forms it itself into its staging buffer instead of a read kernel writing it to memory first
// (one dispatch fewer, and no wait for it), and threadgroup 0 also stores it to xn for what
// reads it later (attention's QSA projections, the MoE site's experts). Two reads:
// - a hyper-connection site's (matvec_multi_q4_r1_read_f32), from the streams X and the
//   partials the site's folded write left (hc_site_read: hc_coeffs_read_norm_f32's read, so
//   the same bits); threadgroup coeff_tg forms the site's coefficients for its write
//   (hc_row_coefficients, as that kernel's threadgroup 0), and the site's read no longer waits
//   for Sinkhorn's chain;
// - PLAIN, the plain residual's RMSNorm of X (matvec_multi_q4_r1_norm_f32: mv_plain_read,
//   rms_norm_f32's bits); no coefficients (coeff_tg is past the grid), raw/scale/base/coeffs
//   unused.
// One decode row; 256 threads (the read's HC_TG_SG simdgroups); in_dim <= MV_STAGE_COLS. The
// projections are computed as matvec_multi_q4_r1_f32 computes them: the same bits. Each
// threadgroup asks for its weights before it waits for its input. A grid of height nb runs
// batch row tg.y in the same way (its streams, partials, coefficients, xn and outputs at the
// params' row strides): a verify batch one row a threadgroup, each row a decode row's bits.
// NMAX: the most streams of the sites this instantiation serves (hc-site.h HC_SMALL_STREAMS:
// the coefficient threadgroup's code for wider sites left out; the host picks by the site).
template <bool PLAIN, int NMAX>
[[max_total_threads_per_threadgroup(256)]] kernel void matvec_multi_q4_r1_read(
    constant MatvecMultiReadParams& p [[buffer(0)]],
    device const uchar* w0     [[buffer(1)]],
    device const uchar* w1     [[buffer(2)]],
    device const uchar* w2     [[buffer(3)]],
    device const uchar* w3     [[buffer(4)]],
    device const uchar* X      [[buffer(5)]],
    device uchar* y0           [[buffer(6)]],
    device uchar* y1           [[buffer(7)]],
    device uchar* y2           [[buffer(8)]],
    device uchar* y3           [[buffer(9)]],
    device const uchar* raw    [[buffer(10)]],
    device const float* scale  [[buffer(11)]],
    device const float* base   [[buffer(12)]],
    device uchar* coeffs       [[buffer(13)]],
    device const float* norm   [[buffer(14)]],
    device uchar* xn           [[buffer(15)]],
    device const float* conv_w [[buffer(16)]],
    device float* conv_state   [[buffer(17)]],
    device float* conv_y       [[buffer(18)]],
    uint2 tg                   [[threadgroup_position_in_grid]],
    ushort sg                  [[simdgroup_index_in_threadgroup]],
    ushort lane                [[thread_index_in_simdgroup]],
    ushort nsg                 [[simdgroups_per_threadgroup]]) {
  threadgroup float4 xs[MV_STAGE_COLS / 4];
  threadgroup float4 part[MV_SPLIT_SG];
  threadgroup float partial[HC_TG_SG];
  threadgroup float mix[HC_MAX_MIXES + 1];
  threadgroup float pre[HC_MAX_STREAMS];
  threadgroup float comb[HC_MAX_STREAMS * HC_MAX_STREAMS];
  const int n = p.streams, cols = p.in_dim;
  const ulong row = ulong(tg.y);  // (0 for a decode row)
  X += row * p.x_stride;
  xn += row * p.xn_stride;
  device const float* partials = (device const float*)(raw + row * p.raw_stride);
  coeffs += row * p.c_stride;
  y0 += row * p.y_stride[0];
  y1 += row * p.y_stride[1];
  y2 += row * p.y_stride[2];
  y3 += row * p.y_stride[3];
  if (!PLAIN && int(tg.x) == p.coeff_tg) {  // uniform per threadgroup: the site's coefficients
    ck_inputs_ready();
    hc_row_coefficients<NMAX>(n, cols, false, p.iters, p.eps, partials, p.chunks, scale, base, (device float*)coeffs, mix, pre, comb, sg, lane);
    return;
  }
  const int dense_tiles = mv_dense_tiles(p);
  const bool dense = int(tg.x) < dense_tiles;  // uniform per threadgroup: one bf16 tile, split form
  // A q4 threadgroup's simdgroups take p.tiles_per_sg turns, turn k the nsg consecutive tiles
  // from dense_tiles + (j * tiles_per_sg + k) * nsg (fewer threadgroups, each forming the read
  // once, in one wave).
  const int per = dense ? 1 : p.tiles_per_sg;
  const int q4_first = dense_tiles + (int(tg.x) - dense_tiles) * per * int(nsg) + int(sg);
  // What no dispatch writes, asked for first: the tiles' weights (into L2), the norm's weights
  // and the site's base.
  mv_read_prefetch_tiles(p, dense, dense ? int(tg.x) : q4_first, per, int(nsg), cols, w0, w1, w2, w3, sg, lane);
  const int t = int(sg) * 32 + int(lane);
  const int threads = PLAIN ? 32 * int(nsg) : 32 * HC_TG_SG;  // (the hc read's columns assume its HC_TG_SG simdgroups)
  float4 wk[HC_READ_AHEAD];
  mv_read_norm_ahead(norm, cols, t, threads, wk);
  if (PLAIN) {
    ck_inputs_ready();
    mv_plain_read(cols, p.norm_eps, p.centred != 0, (device const float*)X, norm, wk, xs, t, threads, lane);
  } else {
    float b[HC_MAX_STREAMS];
    CK_UNROLL for (int k = 0; k < HC_MAX_STREAMS; k++) {
      b[k] = k < n ? base[k] : 0.0f;
    }
    const float scale0 = scale[0];
    ck_inputs_ready();
    // The read, into xs in the staged layout (every thread's columns; the barrier after).
    device const float* flat = (device const float*)X;
    float4 xr[HC_READ_AHEAD * HC_PF_STREAMS];
    hc_prefetch(n, cols, flat, t, xr);
    hc_site_read(n, cols, false, p.eps, p.norm_eps, p.centred != 0, flat, partials, p.chunks, b, scale0, xr, norm, wk, HcOutStaged{xs}, mix,
                 partial, sg, lane);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tg.x == 0u) {
    for (int c4 = t; c4 < cols / 4; c4 += 32 * int(nsg)) {
      ((device float4*)xn)[c4] = HcOutStaged{xs}.load(c4);
    }
  }
  if (dense) {  // matvec_split_tg<bfloat, 1>'s pass over the staged row
    int tile = int(tg.x);
    const int i = mv_multi_weight(p, tile);
    device const uchar* w = mv_pick(i, w0, w1, w2, w3);
    device uchar* y = mv_pick(i, y0, y1, y2, y3);
    float4 acc[1] = {float4(0.0f)};
    mv_pass_dense<Weights<bfloat>, 1>(w, cols, tile * MV_R, p.out_dim[i], MvXStaged{xs}, 1, acc, t, 32 * int(nsg));
    mv_split_finish<1, false>(acc, 1, 0, tile * MV_R, p.out_dim[i], y, 0, false, part, sg, lane, int(nsg), HcTarget());
    return;
  }
  CK_ROLLED for (int k = 0; k < per; k++) {
    int tile = q4_first + k * int(nsg);
    const int i = mv_multi_weight(p, tile);
    const int out_dim = p.out_dim[i];
    const int o0 = tile * MV_R;
    if (i < p.dense_count || o0 >= out_dim) {  // uniform per simdgroup: past the last tile
      break;
    }
    device const uchar* w = mv_pick(i, w0, w1, w2, w3);
    device uchar* y = mv_pick(i, y0, y1, y2, y3);
    float4 acc[1] = {float4(0.0f)};
    mv_pass_q4<false, 1, MV_Q4_BATCH, Q4XStaged>(w, w, cols, o0, out_dim, Q4XStaged{xs}, 1, acc, acc, int(lane), 32);  // mv_pass_q4_staged's load and dot, on x as the read staged it
    mv_reduce<1>(acc, 1);
    if (lane == 0) {
      mv_store_or_conv(i == p.conv_index, p.conv_taps, y, 0, 0, o0, out_dim, acc[0], conv_w, conv_state, conv_y);
    }
  }
}

// matvec_multi_q4_r1_read for a batch of `rows` rows (a verify batch: 1 + k, k drafts; rows *
// in_dim <= MV_STAGE_COLS): every threadgroup forms each row's read in turn (the same code as
// the one-row kernel, so the same bits a row) into its staging buffer, row j from float4
// j * in_dim / 4, and threadgroup 0 stores them to xn; threadgroups coeff_tg + j form row j's
// coefficients (hc_coeffs_read_norm_f32's grid [2, rows] has a coefficients threadgroup a row
// too). The projections are computed as the batch's unfused dispatches compute them: bf16
// tiles in matvec_multi_split's form (a threadgroup a tile), q4 tiles in matvec_multi_q4's
// (a simdgroup a tile, all the rows in one pass: the same per-row sums as the r1 form and, at
// in_dim <= 1024, as the one-simdgroup split form). No conv epilogue: the rows' conv runs
// after (it needs them in order in one thread). A kernel of its own: MV_NR accumulators a
// thread would raise the one-row kernels' registers.
template <bool PLAIN>
[[max_total_threads_per_threadgroup(256)]] kernel void matvec_multi_q4_rows_read(
    constant MatvecMultiReadParams& p [[buffer(0)]],
    device const uchar* w0     [[buffer(1)]],
    device const uchar* w1     [[buffer(2)]],
    device const uchar* w2     [[buffer(3)]],
    device const uchar* w3     [[buffer(4)]],
    device const uchar* X      [[buffer(5)]],
    device uchar* y0           [[buffer(6)]],
    device uchar* y1           [[buffer(7)]],
    device uchar* y2           [[buffer(8)]],
    device uchar* y3           [[buffer(9)]],
    device const uchar* raw    [[buffer(10)]],
    device const float* scale  [[buffer(11)]],
    device const float* base   [[buffer(12)]],
    device uchar* coeffs       [[buffer(13)]],
    device const float* norm   [[buffer(14)]],
    device uchar* xn           [[buffer(15)]],
    uint2 tg                   [[threadgroup_position_in_grid]],
    ushort sg                  [[simdgroup_index_in_threadgroup]],
    ushort lane                [[thread_index_in_simdgroup]],
    ushort nsg                 [[simdgroups_per_threadgroup]]) {
  threadgroup float4 xs[MV_STAGE_COLS / 4];
  threadgroup float4 part[MV_SPLIT_SG * MV_NR];
  threadgroup float partial[HC_TG_SG];
  threadgroup float mix[HC_MAX_MIXES + 1];
  threadgroup float pre[HC_MAX_STREAMS];
  threadgroup float comb[HC_MAX_STREAMS * HC_MAX_STREAMS];
  const int n = p.streams, cols = p.in_dim, rows = min(p.rows, MV_NR), c4s = cols / 4;
  if (!PLAIN && int(tg.x) >= p.coeff_tg) {  // uniform per threadgroup: row tg.x - coeff_tg's coefficients
    const int row = int(tg.x) - p.coeff_tg;
    if (row >= rows) {
      return;
    }
    ck_inputs_ready();
    hc_row_coefficients(n, cols, false, p.iters, p.eps, (device const float*)(raw + ulong(row) * p.raw_stride), p.chunks, scale, base,
                        (device float*)(coeffs + ulong(row) * p.c_stride), mix, pre, comb, sg, lane);
    return;
  }
  const int dense_tiles = mv_dense_tiles(p);
  const bool dense = int(tg.x) < dense_tiles;  // uniform per threadgroup: one bf16 tile, split form
  const int per = dense ? 1 : p.tiles_per_sg;
  const int q4_first = dense_tiles + (int(tg.x) - dense_tiles) * per * int(nsg) + int(sg);
  // The tiles' weights and the norm's first, as the one-row kernel.
  mv_read_prefetch_tiles(p, dense, dense ? int(tg.x) : q4_first, per, int(nsg), cols, w0, w1, w2, w3, sg, lane);
  const int t = int(sg) * 32 + int(lane);
  const int threads = PLAIN ? 32 * int(nsg) : 32 * HC_TG_SG;
  float4 wk[HC_READ_AHEAD];
  mv_read_norm_ahead(norm, cols, t, threads, wk);
  float b[HC_MAX_STREAMS];
  CK_UNROLL for (int k = 0; k < HC_MAX_STREAMS; k++) {
    b[k] = !PLAIN && k < n ? base[k] : 0.0f;
  }
  const float scale0 = PLAIN ? 0.0f : scale[0];
  ck_inputs_ready();
  for (int r = 0; r < rows; r++) {  // uniform: each row's read in turn (their barriers end each)
    device const float* flat = (device const float*)(X + ulong(r) * p.x_stride);
    if (PLAIN) {
      mv_plain_read(cols, p.norm_eps, p.centred != 0, flat, norm, wk, xs + r * c4s, t, threads, lane);
    } else {
      float4 xr[HC_READ_AHEAD * HC_PF_STREAMS];
      hc_prefetch(n, cols, flat, t, xr);
      hc_site_read(n, cols, false, p.eps, p.norm_eps, p.centred != 0, flat, (device const float*)(raw + ulong(r) * p.raw_stride), p.chunks,
                   b, scale0, xr, norm, wk, HcOutStaged{xs + r * c4s}, mix, partial, sg, lane);
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tg.x == 0u) {
    for (int r = 0; r < rows; r++) {
      for (int c4 = t; c4 < c4s; c4 += 32 * int(nsg)) {
        ((device float4*)(xn + ulong(r) * p.xn_stride))[c4] = HcOutStaged{xs + r * c4s}.load(c4);
      }
    }
  }
  float4 acc[MV_NR];
  if (dense) {  // matvec_split_tg<bfloat, MV_NR>'s pass over the staged rows
    int tile = int(tg.x);
    const int i = mv_multi_weight(p, tile);
    device const uchar* w = mv_pick(i, w0, w1, w2, w3);
    device uchar* y = mv_pick(i, y0, y1, y2, y3);
    mv_clear<MV_NR>(acc);
    mv_pass_dense<Weights<bfloat>, MV_NR>(w, cols, tile * MV_R, p.out_dim[i], MvXStagedRows{xs, c4s}, rows, acc, t, 32 * int(nsg));
    mv_split_finish<MV_NR, false>(acc, rows, 0, tile * MV_R, p.out_dim[i], y, p.y_stride[i], false, part, sg, lane, int(nsg), HcTarget());
    return;
  }
  CK_ROLLED for (int k = 0; k < per; k++) {
    int tile = q4_first + k * int(nsg);
    const int i = mv_multi_weight(p, tile);
    const int out_dim = p.out_dim[i];
    const int o0 = tile * MV_R;
    if (i < p.dense_count || o0 >= out_dim) {  // uniform per simdgroup: past the last tile
      break;
    }
    device const uchar* w = mv_pick(i, w0, w1, w2, w3);
    device uchar* y = mv_pick(i, y0, y1, y2, y3);
    mv_clear<MV_NR>(acc);
    mv_pass_q4<false, MV_NR, 1, Q4XStagedRows>(w, w, cols, o0, out_dim, Q4XStagedRows{xs, c4s}, rows, acc, acc, int(lane), 32);
    mv_reduce<MV_NR>(acc, rows);
    if (lane == 0) {
      for (int j = 0; j < MV_NR; j++) if (j < rows) {
        mv_store(y, p.y_stride[i], j, o0, out_dim, acc[j], false);
      }
    }
  }
}

template [[host_name("matvec_f32_f32")]] kernel decltype(matvec<float, MV_NR>) matvec<float, MV_NR>;
template [[host_name("matvec_bf16_f32")]] kernel decltype(matvec<bfloat, MV_NR>) matvec<bfloat, MV_NR>;
template [[host_name("matvec_f16_f32")]] kernel decltype(matvec<half, MV_NR>) matvec<half, MV_NR>;
template [[host_name("matvec_q4_f32")]] kernel decltype(matvec<uchar, MV_NR>) matvec<uchar, MV_NR>;
template [[host_name("matvec_split_f32_f32")]] kernel decltype(matvec_split<float, MV_NR>) matvec_split<float, MV_NR>;
template [[host_name("matvec_split_bf16_f32")]] kernel decltype(matvec_split<bfloat, MV_NR>) matvec_split<bfloat, MV_NR>;
template [[host_name("matvec_split_f16_f32")]] kernel decltype(matvec_split<half, MV_NR>) matvec_split<half, MV_NR>;
template [[host_name("matvec_split_q4_f32")]] kernel decltype(matvec_split<uchar, MV_NR>) matvec_split<uchar, MV_NR>;
// Decode forms (one batch row per pass: a quarter of the registers, so more simdgroups per
// core hide the memory latency); the host picks them when a dispatch has one row.
template [[host_name("matvec_q4_r1_f32")]] kernel decltype(matvec<uchar, 1>) matvec<uchar, 1>;
// bench:kernels only: the one-row q4 matvec's loads without its arithmetic (q4_loads_only, matvec.h).
template [[host_name("matvec_q4_loads_r1_f32")]] kernel decltype(matvec<char, 1>) matvec<char, 1>;
template [[host_name("matvec_q4_staged_r1_f32")]] kernel decltype(matvec_q4_staged_r1<false>) matvec_q4_staged_r1<false>;
template [[host_name("matvec_q4_staged_loads_r1_f32")]] kernel decltype(matvec_q4_staged_r1<true>) matvec_q4_staged_r1<true>;
template [[host_name("matvec_split_q4_r1_f32")]] kernel decltype(matvec_split<uchar, 1>) matvec_split<uchar, 1>;
// The same forms writing into hyper-connection streams (the mixers' output projections).
template [[host_name("matvec_hc_f32_f32")]] kernel decltype(matvec_hc<float, MV_NR>) matvec_hc<float, MV_NR>;
template [[host_name("matvec_hc_bf16_f32")]] kernel decltype(matvec_hc<bfloat, MV_NR>) matvec_hc<bfloat, MV_NR>;
template [[host_name("matvec_hc_f16_f32")]] kernel decltype(matvec_hc<half, MV_NR>) matvec_hc<half, MV_NR>;
template [[host_name("matvec_hc_q4_f32")]] kernel decltype(matvec_hc<uchar, MV_NR>) matvec_hc<uchar, MV_NR>;
template [[host_name("matvec_hc_q4_r1_f32")]] kernel decltype(matvec_hc<uchar, 1>) matvec_hc<uchar, 1>;
template [[host_name("matvec_split_hc_f32_f32")]] kernel decltype(matvec_split_hc<float, MV_NR>) matvec_split_hc<float, MV_NR>;
template [[host_name("matvec_split_hc_bf16_f32")]] kernel decltype(matvec_split_hc<bfloat, MV_NR>) matvec_split_hc<bfloat, MV_NR>;
template [[host_name("matvec_split_hc_f16_f32")]] kernel decltype(matvec_split_hc<half, MV_NR>) matvec_split_hc<half, MV_NR>;
template [[host_name("matvec_split_hc_q4_f32")]] kernel decltype(matvec_split_hc<uchar, MV_NR>) matvec_split_hc<uchar, MV_NR>;
template [[host_name("matvec_split_hc_q4_r1_f32")]] kernel decltype(matvec_split_hc<uchar, 1>) matvec_split_hc<uchar, 1>;
template [[host_name("matvec_multi_f32_f32")]] kernel decltype(matvec_multi<float, MV_NR>) matvec_multi<float, MV_NR>;
template [[host_name("matvec_multi_bf16_f32")]] kernel decltype(matvec_multi<bfloat, MV_NR>) matvec_multi<bfloat, MV_NR>;
template [[host_name("matvec_multi_f16_f32")]] kernel decltype(matvec_multi<half, MV_NR>) matvec_multi<half, MV_NR>;
template [[host_name("matvec_multi_q4_f32")]] kernel decltype(matvec_multi<uchar, MV_NR>) matvec_multi<uchar, MV_NR>;
template [[host_name("matvec_multi_split_f32_f32")]] kernel decltype(matvec_multi_split<float, MV_NR>) matvec_multi_split<float, MV_NR>;
template [[host_name("matvec_multi_split_bf16_f32")]] kernel decltype(matvec_multi_split<bfloat, MV_NR>) matvec_multi_split<bfloat, MV_NR>;
template [[host_name("matvec_multi_split_f16_f32")]] kernel decltype(matvec_multi_split<half, MV_NR>) matvec_multi_split<half, MV_NR>;
template [[host_name("matvec_multi_split_q4_f32")]] kernel decltype(matvec_multi_split<uchar, MV_NR>) matvec_multi_split<uchar, MV_NR>;
// Decode projections that form their input row themselves: a hyper-connection site's read, or
// the plain residual's RMSNorm.
template [[host_name("matvec_multi_q4_r1_read_f32")]] kernel decltype(matvec_multi_q4_r1_read<false, HC_MAX_STREAMS>) matvec_multi_q4_r1_read<false, HC_MAX_STREAMS>;
template [[host_name("matvec_multi_q4_r1_read_hc4_f32")]] kernel decltype(matvec_multi_q4_r1_read<false, HC_SMALL_STREAMS>) matvec_multi_q4_r1_read<false, HC_SMALL_STREAMS>;
template [[host_name("matvec_multi_q4_r1_norm_f32")]] kernel decltype(matvec_multi_q4_r1_read<true, 1>) matvec_multi_q4_r1_read<true, 1>;
// The same for a batch of up to MV_NR rows (a verify batch).
template [[host_name("matvec_multi_q4_read_f32")]] kernel decltype(matvec_multi_q4_rows_read<false>) matvec_multi_q4_rows_read<false>;
template [[host_name("matvec_multi_q4_norm_f32")]] kernel decltype(matvec_multi_q4_rows_read<true>) matvec_multi_q4_rows_read<true>;
