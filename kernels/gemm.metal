// Row-batch projections y[r] = W x[r] as a tiled matrix product (prefill: tens to thousands of
// rows). A threadgroup owns a GEMM_BM x GEMM_BN block of y; per K step of GEMM_BK columns it
// converts its x rows and dequantizes its weight rows once into threadgroup memory (bf16), and
// its simdgroups multiply them through the tile API (tile.h) on the matrix units. A weight is
// thus unpacked once per GEMM_BM batch rows, where the matvec kernels unpack it every MV_NR.
// Weight formats and the q4 unpack come from matvec.h (one source of truth for the layout).
#include <metal_stdlib>
#include "params.h"
#include "matvec.h"
#include "tile.h"

using namespace metal;

// Block of y per threadgroup (batch rows x output rows), K step, simdgroups. The simdgroups
// sit 2 x 2 over the block, each on 32 x 32 of it (2 x 2 tiles). A thread loads one row's 16
// columns of each operand per K step: 128 threads = 64 rows x 2 halves of GEMM_BK.
#define GEMM_BM 64
#define GEMM_BN 64
#define GEMM_BK 32
#define GEMM_SG 4
// Row pitch of the operand tiles in threadgroup memory (bf16 elements): 8 past GEMM_BK, so the
// rows of one fragment load fall in different banks (CUDA: 20 words apart, 8 rows, no conflict).
#define GEMM_LD (GEMM_BK + 8)
static_assert(GEMM_BM == 64 && GEMM_BN == 64 && GEMM_BK == 32 && GEMM_SG * 32 == 128,
              "the load mapping (64 rows x 2 halves) and the 2 x 2 simdgroups assume these sizes; "
              "gemm's thread bound and lib/gpu/gemm.ts's GEMM_TILE follow them");

// Sixteen consecutive weights of row o (clamped to out_dim - 1: those rows' results are never
// written) from column k, as floats; columns past in_dim are 0.
template <typename T>
struct GemmWeights {
  static void load16(device const uchar* w, int in_dim, int out_dim, int o, int k, thread float* v) {
    const ulong total = ulong(out_dim) * ulong(in_dim);
    const ulong row = ulong(min(o, out_dim - 1)) * ulong(in_dim);
    MV_UNROLL for (int i = 0; i < 16; i++) {
      v[i] = k + i < in_dim ? Weights<T>::load1(w, total, row + ulong(k + i)) : 0.0f;
    }
  }
};

// q4 (in_dim % 32 == 0, k % 16 == 0): half (k / 16) % 2 of group k / 32, 8 nibble bytes.
// Word m covers elements 8m .. 8m + 7 of the half: its low nibbles the even ones.
template <>
struct GemmWeights<uchar> {
  static void load16(device const uchar* w, int in_dim, int out_dim, int o, int k, thread float* v) {
    const Q4Rows r = q4_rows(w, in_dim, o, out_dim);
    const uint g = uint(k) / 32u;
    const uint2 nib = ((device const uint2*)(r.nib[0] + g))[(uint(k) / 16u) & 1u];
    const float s = bf16_to_f32(r.sc[0][g]);
    const float b = bf16_to_f32(r.bi[0][g]);
    const uint words[2] = {nib.x, nib.y};
    MV_UNROLL for (int m = 0; m < 2; m++) {
      float4 lo = q4_nibbles4(words[m]);
      float4 hi = q4_nibbles4(words[m] >> 4);
      MV_UNROLL for (int e = 0; e < 4; e++) {
        v[8 * m + 2 * e] = s * lo[e] + b;
        v[8 * m + 2 * e + 1] = s * hi[e] + b;
      }
    }
  }
};

// Sixteen floats of an x row (xr: its first float) from column k; 0 past in_dim, or all 0
// when the row does not exist (!valid: xr then points at a row that does, never read). Rows
// start 16-byte aligned (the host checks), so whole spans load as float4.
inline void gemm_load_x16(device const float* xr, bool valid, int in_dim, int k, thread float* v) {
  xr += k;
  if (valid && k + 16 <= in_dim) {
    MV_UNROLL for (int q = 0; q < 4; q++) {
      float4 f = ((device const float4*)xr)[q];
      MV_UNROLL for (int e = 0; e < 4; e++) {
        v[4 * q + e] = f[e];
      }
    }
  } else {
    MV_UNROLL for (int i = 0; i < 16; i++) {
      v[i] = valid && k + i < in_dim ? xr[i] : 0.0f;
    }
  }
}

// Sixteen floats rounded to bf16 at hi (16-byte aligned), as two 16-byte stores; with SPLIT
// also what the rounding left, rounded to bf16, at lo (v = hi + lo to about 2^-17 of v).
template <bool SPLIT>
inline void gemm_store16(threadgroup bfloat* hi, threadgroup bfloat* lo, thread const float* v) {
  MV_UNROLL for (int q = 0; q < 2; q++) {
    thread const float* u = v + 8 * q;
    const uint4 h = uint4(tile_pack_bf16x2(u[0], u[1]), tile_pack_bf16x2(u[2], u[3]), tile_pack_bf16x2(u[4], u[5]),
                          tile_pack_bf16x2(u[6], u[7]));
    ((threadgroup uint4*)hi)[q] = h;
    if (SPLIT) {
      // The residuals are exact in f32 (v minus its 8-bit rounding).
      uint l[4];
      MV_UNROLL for (int i = 0; i < 4; i++) {
        l[i] = tile_pack_bf16x2(u[2 * i] - as_type<float>(h[i] << 16), u[2 * i + 1] - as_type<float>(h[i] & 0xFFFF0000u));
      }
      ((threadgroup uint4*)lo)[q] = uint4(l[0], l[1], l[2], l[3]);
    }
  }
}

// One K step's products for a simdgroup: its 2 x 2 tiles c[2 i + j] += A_i B_j, A_i the 16 x
// rows from a_row0 + 16 i, B_j the 16 weight rows from b_row0 + b_step j (of the operand tiles,
// GEMM_LD apart). SPLIT: hi hi + lo hi + hi lo, the small terms first.
template <bool SPLIT>
inline void gemm_step(threadgroup const bfloat* xs, threadgroup const bfloat* xs_lo, threadgroup const bfloat* ws,
                      threadgroup const bfloat* ws_lo, int a_row0, int b_row0, int b_step, thread TileC* c, ushort lane) {
  MV_UNROLL for (int kk = 0; kk < GEMM_BK; kk += TILE) {
    TileA a[2];
    TileB b[2];
    MV_UNROLL for (int i = 0; i < 2; i++) {
      tile_load_a(a[i], xs + (a_row0 + i * TILE) * GEMM_LD + kk, GEMM_LD, lane);
      tile_load_bt(b[i], ws + (b_row0 + i * b_step) * GEMM_LD + kk, GEMM_LD, lane);
    }
    if (SPLIT) {
      TileA a_lo[2];
      TileB b_lo[2];
      MV_UNROLL for (int i = 0; i < 2; i++) {
        tile_load_a(a_lo[i], xs_lo + (a_row0 + i * TILE) * GEMM_LD + kk, GEMM_LD, lane);
        tile_load_bt(b_lo[i], ws_lo + (b_row0 + i * b_step) * GEMM_LD + kk, GEMM_LD, lane);
      }
      MV_UNROLL for (int i = 0; i < 2; i++) {
        MV_UNROLL for (int j = 0; j < 2; j++) {
          tile_mma(c[2 * i + j], a_lo[i], b[j]);
          tile_mma(c[2 * i + j], a[i], b_lo[j]);
        }
      }
    }
    MV_UNROLL for (int i = 0; i < 2; i++) {
      MV_UNROLL for (int j = 0; j < 2; j++) {
        tile_mma(c[2 * i + j], a[i], b[j]);
      }
    }
  }
}

// ---- one threadgroup's block -----------------------------------------------------------------
// What a threadgroup multiplies: batch rows [begin, end) (GROUPED: positions in `pairs`, whose
// entries are pair ids q: x row q / top_k for gate_up, q for down; y row q), output columns
// from n0 of the weights w0 (and w1, gate_up). missing: read nothing, write NaN.
struct GemmJob {
  device const uchar* w0;
  device const uchar* w1;
  device const uchar* x;
  device uchar* y;
  device const int* pairs;
  ulong x_stride;
  ulong y_stride;
  int in_dim;
  int out_dim;
  int top_k;
  int begin;
  int end;
  int n0;
  bool missing;
  bool accumulate;
};

// y rows [begin, end) x GEMM_BN columns from n0 (gate_up: GEMM_BN / 2 columns of gate and the
// same of up; the weight tile's rows are 32 of gate then 32 of up, and a simdgroup's two
// column tiles are one of gate and its match in up), GEMM_BM rows at a time:
//   plain:   y = W x (+ y when accumulating)
//   gate_up: y = SiLU(gate x) * up x
// SPLIT (numeric rule R7): both operands as bf16 pairs hi + lo and three tile products per
// step, about 2^-16 of each |w x|, close to the f32 matvec; without it one bf16 product, 2^-8.
// Its threadgroup memory, declared by each kernel (MSL declares threadgroup variables at
// kernel scope): x and weight operand tiles (hi, then lo when SPLIT) as uint4 storage (16-byte
// aligned for gemm_store16), used as bf16; a staging tile per simdgroup (two for gate_up).
#define GEMM_TILE_UINT4S(SPLIT) (((SPLIT) ? 2 : 1) * GEMM_BM * GEMM_LD / 8)
#define GEMM_STAGED_FLOATS(GATE_UP) (GEMM_SG * ((GATE_UP) ? 2 : 1) * TILE * TILE)
static_assert(GEMM_BM == GEMM_BN, "one operand tile size serves x and the weights");
template <typename T, bool GATE_UP, bool GROUPED, bool SPLIT>
inline void gemm_block(thread const GemmJob& j, threadgroup uint4* xs4, threadgroup uint4* ws4, threadgroup float* staged,
                       ushort tid, ushort sg, ushort lane) {
  threadgroup bfloat* xs = (threadgroup bfloat*)xs4;
  threadgroup bfloat* ws = (threadgroup bfloat*)ws4;
  threadgroup bfloat* xs_lo = xs + (SPLIT ? GEMM_BM * GEMM_LD : 0);
  threadgroup bfloat* ws_lo = ws + (SPLIT ? GEMM_BN * GEMM_LD : 0);
  const int lr = int(tid) / 2;         // the operand row this thread loads
  const int lc = (int(tid) % 2) * 16;  // and its first column within the K step
  const int sm = (int(sg) / 2) * 32;   // this simdgroup's 32 rows of the block
  // This thread's weight row: gate_up takes rows n0 + lr of gate (lr < 32), then of up.
  device const uchar* wpart = GATE_UP && lr >= GEMM_BN / 2 ? j.w1 : j.w0;
  const int wrow = j.n0 + (GATE_UP ? lr % (GEMM_BN / 2) : lr);
  // The simdgroup's B tiles and first output column.
  const int b_row0 = GATE_UP ? (int(sg) % 2) * TILE : (int(sg) % 2) * 32;
  const int b_step = GATE_UP ? GEMM_BN / 2 : TILE;
  const int out0 = j.n0 + b_row0;
  threadgroup float* mine = staged + int(sg) * (GATE_UP ? 2 : 1) * TILE * TILE;
  const int sr = int(lane) / 2;
  const int sc = (int(lane) % 2) * 8;

  // Dense blocks are one GEMM_BM step (the host sizes the grid so): no loop to keep live.
  for (int m0 = j.begin; m0 < j.end && (GROUPED || m0 == j.begin); m0 += GEMM_BM) {
    TileC c[4];
    MV_UNROLL for (int t = 0; t < 4; t++) {
      tile_clear(c[t]);
    }
    if (!j.missing) {
      const int m = min(m0 + lr, j.end - 1);
      const int xr = GROUPED ? (GATE_UP ? j.pairs[m] / j.top_k : j.pairs[m]) : m;
      device const float* xrow = (device const float*)(j.x + ulong(xr) * j.x_stride);
      for (int k0 = 0; k0 < j.in_dim; k0 += GEMM_BK) {
        float v[16];
        gemm_load_x16(xrow, m0 + lr < j.end, j.in_dim, k0 + lc, v);
        gemm_store16<SPLIT>(xs + lr * GEMM_LD + lc, xs_lo + lr * GEMM_LD + lc, v);
        GemmWeights<T>::load16(wpart, j.in_dim, j.out_dim, wrow, k0 + lc, v);
        gemm_store16<SPLIT>(ws + lr * GEMM_LD + lc, ws_lo + lr * GEMM_LD + lc, v);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        gemm_step<SPLIT>(xs, xs_lo, ws, ws_lo, sm, b_row0, b_step, c, lane);
        threadgroup_barrier(mem_flags::mem_threadgroup);  // the tiles are refilled next step
      }
    }
    // Out through the staging tile: lane l writes row l / 2 of each 16-row tile, 8 columns from
    // (l % 2) * 8.
    MV_UNROLL for (int i = 0; i < 2; i++) {
      MV_UNROLL for (int t = 0; t < (GATE_UP ? 1 : 2); t++) {
        tile_store(c[2 * i + t], mine, TILE, lane);
        if (GATE_UP) {
          tile_store(c[2 * i + 1], mine + TILE * TILE, TILE, lane);
        }
        simdgroup_barrier(mem_flags::mem_threadgroup);
        const int m = m0 + sm + i * TILE + sr;
        const int o = out0 + t * TILE + sc;
        if (m < j.end) {
          device float* yr = (device float*)(j.y + ulong(GROUPED ? j.pairs[m] : m) * j.y_stride);
          for (int e = 0; e < 8 && o + e < j.out_dim; e++) {
            float g = mine[sr * TILE + sc + e];
            float val = GATE_UP ? g / (1.0f + exp(-g)) * mine[TILE * TILE + sr * TILE + sc + e] : g;
            yr[o + e] = j.missing ? NAN : j.accumulate ? yr[o + e] + val : val;
          }
        }
        simdgroup_barrier(mem_flags::mem_threadgroup);  // mine is reused by the next tile
      }
    }
  }
}

// ---- dense projections -----------------------------------------------------------------------
// y[r] = W x[r] (+ y[r]): threadgroup (x, y) computes output rows [x * GEMM_BN, ...) of batch
// rows [y * GEMM_BM, ...).
template <typename T, bool SPLIT>
[[max_total_threads_per_threadgroup(128)]] kernel void gemm(
    constant GemmParams& p [[buffer(0)]],
    device const uchar* w  [[buffer(1)]],
    device const uchar* x  [[buffer(2)]],
    device uchar* y        [[buffer(3)]],
    uint2 tg               [[threadgroup_position_in_grid]],
    ushort tid             [[thread_index_in_threadgroup]],
    ushort sg              [[simdgroup_index_in_threadgroup]],
    ushort lane            [[thread_index_in_simdgroup]]) {
  threadgroup uint4 xs4[GEMM_TILE_UINT4S(SPLIT)];
  threadgroup uint4 ws4[GEMM_TILE_UINT4S(SPLIT)];
  threadgroup float staged[GEMM_STAGED_FLOATS(false)];
  const int begin = int(tg.y) * GEMM_BM;
  const GemmJob j = {w, w, x, y, (device const int*)x, p.x_stride, p.y_stride, p.in_dim, p.out_dim, 1,
                     begin, min(p.rows, begin + GEMM_BM), int(tg.x) * GEMM_BN, false, p.accumulate != 0};
  gemm_block<T, false, false, SPLIT>(j, xs4, ws4, staged, tid, sg, lane);
}

// The dense gated MLP's input half (the shared expert, as ffn_gate_up in moe.metal):
// y[r] = SiLU(W_gate x[r]) * (W_up x[r]); threadgroup (x, y): GEMM_BN / 2 columns from
// x * GEMM_BN / 2 of batch rows [y * GEMM_BM, ...). p.accumulate is ignored.
template <typename T>
[[max_total_threads_per_threadgroup(128)]] kernel void gemm_gate_up(
    constant GemmParams& p [[buffer(0)]],
    device const uchar* wg [[buffer(1)]],
    device const uchar* wu [[buffer(2)]],
    device const uchar* x  [[buffer(3)]],
    device uchar* y        [[buffer(4)]],
    uint2 tg               [[threadgroup_position_in_grid]],
    ushort tid             [[thread_index_in_threadgroup]],
    ushort sg              [[simdgroup_index_in_threadgroup]],
    ushort lane            [[thread_index_in_simdgroup]]) {
  threadgroup uint4 xs4[GEMM_TILE_UINT4S(true)];
  threadgroup uint4 ws4[GEMM_TILE_UINT4S(true)];
  threadgroup float staged[GEMM_STAGED_FLOATS(true)];
  const int begin = int(tg.y) * GEMM_BM;
  const GemmJob j = {wg, wu, x, y, (device const int*)x, p.x_stride, p.y_stride, p.in_dim, p.out_dim, 1,
                     begin, min(p.rows, begin + GEMM_BM), int(tg.x) * (GEMM_BN / 2), false, false};
  gemm_block<T, true, false, true>(j, xs4, ws4, staged, tid, sg, lane);
}

// ---- grouped GEMM for routed experts -------------------------------------------------------
// The pairs (row r, choice k) routed to one expert, as moe_lists_i32 groups them, multiplied as
// one row batch with that expert's weights: threadgroup (x, u) serves the u-th active expert
// (active[1 + u]) and walks its pairs GEMM_BM at a time. The expert's record is pool slot
// slot_of[e]; a missing slot (-1 or >= slots) reads nothing and writes NaN into its pairs'
// outputs, as moe_gate_up / moe_down do (kernels/moe.metal: same params and bindings).
//   gate_up: out[q] = SiLU(gate x[q / top_k]) * up x[q / top_k]
//   down:    out[q] = down x[q]
template <typename T, bool GATE_UP>
inline void moe_gemm(constant MoeExpertsParams& p, device const int* offsets, device const int* pairs,
                     device const int* active, device const int* slot_of, device const uchar* pool,
                     device const uchar* x, device uchar* y, threadgroup uint4* xs4, threadgroup uint4* ws4,
                     threadgroup float* staged, uint2 tg, ushort tid, ushort sg, ushort lane) {
  if (int(tg.y) >= active[0]) {
    return;  // uniform per threadgroup
  }
  const int e = active[1 + int(tg.y)];
  const int n0 = int(tg.x) * (GATE_UP ? GEMM_BN / 2 : GEMM_BN);
  if (offsets[e] >= offsets[e + 1] || n0 >= p.out_dim) {
    return;  // uniform per threadgroup
  }
  const int slot = slot_of[e];
  const bool missing = slot < 0 || slot >= p.slots;
  device const uchar* record = pool + (missing ? 0ul : ulong(slot) * p.record_stride);
  const GemmJob j = {record + p.w0_offset, record + p.w1_offset, x, y, pairs, p.x_stride, p.y_stride, p.in_dim, p.out_dim,
                     p.top_k, offsets[e], offsets[e + 1], n0, missing, false};
  gemm_block<T, GATE_UP, true, true>(j, xs4, ws4, staged, tid, sg, lane);
}

template <typename T>
[[max_total_threads_per_threadgroup(128)]] kernel void moe_gemm_gate_up(
    constant MoeExpertsParams& p [[buffer(0)]],
    device const int* offsets    [[buffer(1)]],
    device const int* pairs      [[buffer(2)]],
    device const int* active     [[buffer(3)]],
    device const int* slot_of    [[buffer(4)]],
    device const uchar* pool     [[buffer(5)]],
    device const uchar* x        [[buffer(6)]],
    device uchar* y              [[buffer(7)]],
    uint2 tg                     [[threadgroup_position_in_grid]],
    ushort tid                   [[thread_index_in_threadgroup]],
    ushort sg                    [[simdgroup_index_in_threadgroup]],
    ushort lane                  [[thread_index_in_simdgroup]]) {
  threadgroup uint4 xs4[GEMM_TILE_UINT4S(true)];
  threadgroup uint4 ws4[GEMM_TILE_UINT4S(true)];
  threadgroup float staged[GEMM_STAGED_FLOATS(true)];
  moe_gemm<T, true>(p, offsets, pairs, active, slot_of, pool, x, y, xs4, ws4, staged, tg, tid, sg, lane);
}

template <typename T>
[[max_total_threads_per_threadgroup(128)]] kernel void moe_gemm_down(
    constant MoeExpertsParams& p [[buffer(0)]],
    device const int* offsets    [[buffer(1)]],
    device const int* pairs      [[buffer(2)]],
    device const int* active     [[buffer(3)]],
    device const int* slot_of    [[buffer(4)]],
    device const uchar* pool     [[buffer(5)]],
    device const uchar* x        [[buffer(6)]],
    device uchar* y              [[buffer(7)]],
    uint2 tg                     [[threadgroup_position_in_grid]],
    ushort tid                   [[thread_index_in_threadgroup]],
    ushort sg                    [[simdgroup_index_in_threadgroup]],
    ushort lane                  [[thread_index_in_simdgroup]]) {
  threadgroup uint4 xs4[GEMM_TILE_UINT4S(true)];
  threadgroup uint4 ws4[GEMM_TILE_UINT4S(true)];
  threadgroup float staged[GEMM_STAGED_FLOATS(false)];
  moe_gemm<T, false>(p, offsets, pairs, active, slot_of, pool, x, y, xs4, ws4, staged, tg, tid, sg, lane);
}

template [[host_name("gemm_f32_f32")]] kernel decltype(gemm<float, true>) gemm<float, true>;
template [[host_name("gemm_bf16_f32")]] kernel decltype(gemm<bfloat, true>) gemm<bfloat, true>;
template [[host_name("gemm_f16_f32")]] kernel decltype(gemm<half, true>) gemm<half, true>;
template [[host_name("gemm_q4_f32")]] kernel decltype(gemm<uchar, true>) gemm<uchar, true>;
// One bf16 product per step (2^-8 of |w x|): the tile API's own precision, for its tests and
// for measuring what the split costs.
template [[host_name("gemm_plain_f32_f32")]] kernel decltype(gemm<float, false>) gemm<float, false>;
template [[host_name("gemm_plain_q4_f32")]] kernel decltype(gemm<uchar, false>) gemm<uchar, false>;
template [[host_name("gemm_gate_up_q4_f32")]] kernel decltype(gemm_gate_up<uchar>) gemm_gate_up<uchar>;
template [[host_name("moe_gemm_gate_up_q4_f32")]] kernel decltype(moe_gemm_gate_up<uchar>) moe_gemm_gate_up<uchar>;
template [[host_name("moe_gemm_down_q4_f32")]] kernel decltype(moe_gemm_down<uchar>) moe_gemm_down<uchar>;
