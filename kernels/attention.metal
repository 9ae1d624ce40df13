// Softmax attention over cached K/V (docs/model.md, Mixer B): row t (position pos0 + t)
// and query head h read KV head floor(h * Hkv / H) at either every position s <= pos0 + t
// (causal, dense) or the positions of its QSA list; o = softmax(q k^T * scale) v with
// scale = 1/sqrt(hd). The cache holds the rows of this batch already (K, V are appended
// before attention), so prefill rows are causal within the chunk and against the past.
//
// One simdgroup per (row, head, split of positions). Lane l scores position b + l of each
// block of 32 (a whole hd dot product per lane), the block's max and sum are SIMD
// reductions (online softmax), and for the V sum the lanes own dims l, l + 32, ... and
// read the block's weights from threadgroup memory: four sync points per 32 positions.
// With one split the result goes to o; with more, each split writes (max, sum, acc[hd])
// and attn_combine_f32 merges them (long-context decode). With `gated`, whichever writes o
// applies the mixer's output gate o / (1 + e^-gate), ew_sigmoid_mul_f32's arithmetic.
#include <metal_stdlib>
#include "params.h"
#include "sequence.h"
#include "tile.h"

using namespace metal;

// Loops over head dims run to constants with a guard, so acc[] stays in registers (a runtime
// bound spilled it to local memory on the H200). For the V sum a lane owns four consecutive
// dims per 128 (hd % 4 == 0): one 4-byte (q8) or 16-byte (f32) load per position instead of
// one byte per dim, and a block's 32 positions' loads (q8; f32: ATTN_V_UNROLL) in flight at once.
#define ATTN_MAX_SIMDGROUPS 8
#define ATTN_MAX_HEAD_DIM 256
#define ATTN_V4 (ATTN_MAX_HEAD_DIM / 128)
#define ATTN_V_UNROLL 4

// Grid: (ceil(H / simdgroups), nb, splits) threadgroups of 32 x simdgroups threads.
// K/V: q8 codes [positions][Hkv][hd] with scales [positions][Hkv], or f32 values (the
// scale bindings unused). list [nb][list_stride] and counts [nb] when use_list.
// Partials [nb][H][splits][hd + 2] when splits > 1.
template <bool Q8>
[[max_total_threads_per_threadgroup(256)]] kernel void attn_rows(
    constant AttentionParams& p [[buffer(0)]],
    device const float* q       [[buffer(1)]],
    device const char* kc       [[buffer(2)]],
    device const float* ks      [[buffer(3)]],
    device const char* vc       [[buffer(4)]],
    device const float* vs      [[buffer(5)]],
    device const int* list      [[buffer(6)]],
    device const int* counts    [[buffer(7)]],
    device float* o             [[buffer(8)]],
    device float* part          [[buffer(9)]],
    device const float* gate    [[buffer(10)]],
    uint3 tg                    [[threadgroup_position_in_grid]],
    ushort lane                 [[thread_index_in_simdgroup]],
    ushort sg                   [[simdgroup_index_in_threadgroup]],
    ushort nsg                  [[simdgroups_per_threadgroup]]) {
  threadgroup float qbuf[ATTN_MAX_SIMDGROUPS][ATTN_MAX_HEAD_DIM];
  threadgroup float wbuf[ATTN_MAX_SIMDGROUPS][32];
  threadgroup int sbuf[ATTN_MAX_SIMDGROUPS][32];
  const uint H = uint(p.heads);
  const uint h = tg.x * uint(nsg) + uint(sg);
  const uint t = tg.y;
  const uint z = tg.z;
  if (h >= H) {
    return;  // whole simdgroup; only simdgroup-scope sync follows
  }
  const uint hd = uint(p.head_dim);
  const uint Hkv = uint(p.kv_heads);
  const uint kvh = h * Hkv / H;
  const uint count = p.use_list != 0 ? uint(counts[t]) : uint(p.pos0 + int(t) + 1);
  const uint begin = z * uint(p.split_len);
  const uint end = min(count, begin + uint(p.split_len));
  device const int* positions = list + ulong(t) * uint(p.list_stride);
  threadgroup float* qs = qbuf[sg];
  threadgroup float* ws = wbuf[sg];
  threadgroup int* ss = sbuf[sg];

  device const float* qrow = seq_row(q, p.q_stride, t) + h * hd;
  for (uint d = lane; d < hd; d += 32u) {
    qs[d] = qrow[d];
  }
  simdgroup_barrier(mem_flags::mem_threadgroup);

  // Lane dims d = 4 * lane + 128 * m (.. + 3) for m < ATTN_V4 while d < hd.
  float4 acc[ATTN_V4];
  CK_UNROLL for (uint m = 0; m < ATTN_V4; m++) {
    acc[m] = float4(0.0f);
  }
  float mx = -INFINITY;
  float sum = 0.0f;
  for (uint b = begin; b < end; b += 32u) {
    const uint j = b + uint(lane);
    const bool valid = j < end;
    const uint s = valid ? (p.use_list != 0 ? uint(positions[j]) : j) : 0u;
    const ulong slot = ulong(s) * Hkv + kvh;
    float logit = -INFINITY;
    if (valid) {
      float d = 0.0f;
      if (Q8 && (hd & 15u) == 0u) {
        // 16 codes per load (a lane reads a whole K row: scalar char4 loads left it waiting
        // on 32 round trips per position); the dot product adds in the same order.
        device const int4* k16 = (device const int4*)(kc + slot * hd);
        int4 kw[ATTN_MAX_HEAD_DIM / 16];
        CK_UNROLL for (uint i = 0; i < ATTN_MAX_HEAD_DIM / 16u; i++) {
          kw[i] = i < hd / 16u ? k16[i] : int4(0);  // every load of the row goes out at once
        }
        CK_UNROLL for (uint i = 0; i < ATTN_MAX_HEAD_DIM / 16u; i++) if (i < hd / 16u) {
          const int4 w = kw[i];
          for (uint c = 0; c < 4u; c++) {
            const float4 kv = float4(as_type<char4>(w[c]));
            const uint e = 16u * i + 4u * c;
            d += dot(float4(qs[e], qs[e + 1u], qs[e + 2u], qs[e + 3u]), kv);
          }
        }
        d *= ks[slot];
      } else if (Q8) {
        device const char4* k4 = (device const char4*)(kc + slot * hd);
        for (uint i = 0; i < hd / 4u; i++) {
          const float4 kv = float4(k4[i]);
          d += dot(float4(qs[4u * i], qs[4u * i + 1u], qs[4u * i + 2u], qs[4u * i + 3u]), kv);
        }
        d *= ks[slot];
      } else {
        device const float4* k4 = (device const float4*)((device const float*)kc + slot * hd);
        for (uint i = 0; i < hd / 4u; i++) {
          d += dot(float4(qs[4u * i], qs[4u * i + 1u], qs[4u * i + 2u], qs[4u * i + 3u]), k4[i]);
        }
      }
      logit = d * p.scale;
    }
    const float mnew = max(mx, simd_max(logit));
    const float corr = exp(mx - mnew);
    const float w = valid ? exp(logit - mnew) : 0.0f;
    sum = sum * corr + simd_sum(w);
    ws[lane] = Q8 && valid ? w * vs[slot] : w;
    ss[lane] = int(s);
    simdgroup_barrier(mem_flags::mem_threadgroup);
    CK_UNROLL for (uint m = 0; m < ATTN_V4; m++) {
      acc[m] *= corr;
    }
    const uint n = min(32u, end - b);
    if (Q8) {
      // Every position's V codes for the lane's 4 dims in flight at once (one 4-byte word
      // each), then summed in position order: the same fmas as below, one round trip to
      // memory instead of 32 / ATTN_V_UNROLL (the tiny model's decode attention took 10-15 us
      // on the H200, most of it these dependent rounds).
      CK_UNROLL for (uint m = 0; m < ATTN_V4; m++) if (128u * m < hd) {
        const uint d = 4u * uint(lane) + 128u * m;
        int vw[32];
        CK_UNROLL for (uint j = 0; j < 32u; j++) {
          const uint jj = min(j, n - 1u);
          vw[j] = d < hd ? *((device const int*)(vc + (ulong(ss[jj]) * Hkv + kvh) * hd + d)) : 0;
        }
        CK_UNROLL for (uint j = 0; j < 32u; j++) if (j < n) {
          acc[m] = fma(float4(ws[j]), float4(as_type<char4>(vw[j])), acc[m]);
        }
      }
    } else for (uint j0 = 0; j0 < n; j0 += ATTN_V_UNROLL) {
      float wj[ATTN_V_UNROLL];
      float4 v[ATTN_V_UNROLL][ATTN_V4];
      CK_UNROLL for (uint u = 0; u < ATTN_V_UNROLL; u++) {
        const uint jj = min(j0 + u, n - 1u);
        wj[u] = ws[jj];
        const ulong base = (ulong(ss[jj]) * Hkv + kvh) * hd;
        CK_UNROLL for (uint m = 0; m < ATTN_V4; m++) {
          const uint d = 4u * uint(lane) + 128u * m;
          v[u][m] = d >= hd ? float4(0.0f)
                  : Q8 ? float4(*((device const char4*)(vc + base + d)))
                       : *((device const float4*)((device const float*)vc + base + d));
        }
      }
      // Positions in order, each dim's sum as one fma per position.
      CK_UNROLL for (uint u = 0; u < ATTN_V_UNROLL; u++) if (j0 + u < n) {
        CK_UNROLL for (uint m = 0; m < ATTN_V4; m++) {
          acc[m] = fma(float4(wj[u]), v[u][m], acc[m]);
        }
      }
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    mx = mnew;
  }

  if (p.splits == 1) {
    device float* out = seq_row(o, p.o_stride, t) + h * hd;
    device const float* g = seq_row(gate, p.gate_stride, t) + h * hd;
    const float inv = 1.0f / sum;
    CK_UNROLL for (uint m = 0; m < ATTN_V4; m++) {
      const uint d = 4u * uint(lane) + 128u * m;
      if (d < hd) {
        for (uint c = 0; c < 4u; c++) {
          const float y = acc[m][c] * inv;
          out[d + c] = p.gated != 0 ? y / (1.0f + exp(-g[d + c])) : y;
        }
      }
    }
  } else {
    device float* pr = part + ((ulong(t) * H + h) * uint(p.splits) + z) * (hd + 2u);
    if (lane == 0) {
      pr[0] = mx;
      pr[1] = sum;
    }
    CK_UNROLL for (uint m = 0; m < ATTN_V4; m++) {
      const uint d = 4u * uint(lane) + 128u * m;
      if (d < hd) {
        for (uint c = 0; c < 4u; c++) {
          pr[2u + d + c] = acc[m][c];
        }
      }
    }
  }
}

template [[host_name("attn_rows_q8")]] kernel decltype(attn_rows<true>) attn_rows<true>;
template [[host_name("attn_rows_f32")]] kernel decltype(attn_rows<false>) attn_rows<false>;

// o[t][h][d] from the splits' partials: weights e^(m_z - M) with M the largest max.
// One thread per (row, head, dim). A split with no positions has m = -inf (weight 0).
// With `gated`, o / (1 + e^-gate) (the mixer's output gate, as ew_sigmoid_mul_f32).
kernel void attn_combine_f32(
    constant AttentionCombineParams& p [[buffer(0)]],
    device const float* part           [[buffer(1)]],
    device float* o                    [[buffer(2)]],
    device const float* gate           [[buffer(3)]],
    uint gid                           [[thread_position_in_grid]]) {
  const uint hd = uint(p.head_dim);
  const uint H = uint(p.heads);
  if (gid >= uint(p.rows) * H * hd) {
    return;
  }
  const uint d = gid % hd;
  const uint th = gid / hd;
  const uint stride = hd + 2u;
  device const float* pr = part + ulong(th) * uint(p.splits) * stride;
  float M = -INFINITY;
  for (int z = 0; z < p.splits; z++) {
    M = max(M, pr[uint(z) * stride]);
  }
  float sum = 0.0f;
  float acc = 0.0f;
  for (int z = 0; z < p.splits; z++) {
    device const float* pz = pr + uint(z) * stride;
    const float w = exp(pz[0] - M);
    sum = fma(w, pz[1], sum);
    acc = fma(w, pz[2u + d], acc);
  }
  const float y = acc / sum;
  const uint c = (th % H) * hd + d;
  seq_row(o, p.o_stride, th / H)[c] = p.gated != 0 ? y / (1.0f + exp(-seq_row(gate, p.gate_stride, th / H)[c])) : y;
}

// ---- prompt chunks in tiles (flash attention on the matrix units) ------------------------------
// attn_tiles: the causal, dense case of attn_rows (every position read, one split) for a chunk
// of rows, through the tile API (tile.h). Threadgroup (x, y) serves KV head x and the (row,
// head) pairs [P y, P y + P) of its G = H / Hkv query heads (P = ATTN_TILE_PAIRS: 64, WIDE 32),
// pair m = row m / G, head x G + m % G (GQA: every K/V tile is dequantized once for all G
// heads). Its four simdgroups own 16 pairs each (WIDE: two simdgroups per 16 pairs).
// Per tile of ATTN_TILE_BK positions, up to the threadgroup's last row's position (tiles above
// the diagonal are never loaded; a simdgroup whose rows all end before a tile skips it):
//   K as [position][dim] and V transposed as [dim][position], bf16 in threadgroup memory;
//   S = Q K^T (tile_mma), the logits S * k scale * 1/sqrt(hd), masked past each row's own
//   position; the online softmax in f32 as attn_rows (running max, e^(m_old - m_new) rescale);
//   O = O * corr + P V (tile_mma), P = e^(logit - m) * v scale.
// Precision (docs/model.md, rule R7): q8 codes are integers of at most 127, exact in bf16; Q, P
// and f32 K/V are split into bf16 hi + lo and multiplied as hi hi + lo hi (+ hi lo when both are
// split): about 2^-16 of each |q k| and |p v|, where attn_rows sums in f32.
// A lane keeps its row's O in registers: row lane / 2 of the simdgroup's 16, dims 16 n +
// (lane % 2) 8 .. + 8 (each P V tile goes through a 16 x 16 staging tile). head_dim is a multiple
// of 16 up to 128 (Q's fragments and O live in registers: a simdgroup holding 256 dims would
// spill on the H200). WIDE (q8, head_dim 144..256): two simdgroups share 16 pairs, each owning
// 128 dims of Q and O; each adds its half of S = Q K^T into threadgroup memory and both read the
// two halves (in the same order: the same softmax in both), so a threadgroup serves 32 pairs.
#define ATTN_TILE_SG 4
#define ATTN_TILE_HALF_HD 128
#define ATTN_TILE_HDT (ATTN_TILE_HALF_HD / TILE)
// (row, head) pairs per threadgroup and the largest head_dim.
#define ATTN_TILE_PAIRS(WIDE) ((WIDE) ? 2u * TILE : ATTN_TILE_SG * TILE)
#define ATTN_TILE_MAX_HD(WIDE) ((WIDE) ? 2u * ATTN_TILE_HALF_HD : ATTN_TILE_HALF_HD)
// Positions per K/V tile: 32 for q8 codes (one bf16 plane), 16 for f32 (hi and lo planes) and
// for WIDE, so each fits Apple's 32 KiB of threadgroup memory.
#define ATTN_TILE_BK(Q8, WIDE) ((Q8) && !(WIDE) ? 32u : 16u)
// Row pitches (bf16) of the staged K ([BK][hd + 8]) and V^T ([hd][BK + 8]) and of the simdgroups'
// Q and P staging: 8 past the data, as gemm.metal, so a fragment load's rows change banks.
#define ATTN_TILE_QLD (TILE + 8u)

// Two floats as bf16 hi (x) and what its rounding left, as bf16 (y): a = hi + lo to ~2^-17 |a|.
inline uint2 attn_split_bf16x2(float a, float b) {
  const uint h = tile_pack_bf16x2(a, b);
  return uint2(h, tile_pack_bf16x2(a - as_type<float>(h << 16), b - as_type<float>(h & 0xFFFF0000u)));
}

// Sixteen values of a cache vector from dim d (q8: codes as floats; f32: values), or zeros.
template <bool Q8>
inline void attn_tile_load16(device const char* cache, ulong vec, uint hd, uint d, bool valid, thread float* v) {
  if (!valid) {
    CK_UNROLL for (uint i = 0; i < 16u; i++) {
      v[i] = 0.0f;
    }
  } else if (Q8) {
    const int4 w = *((device const int4*)(cache + vec * hd + d));
    CK_UNROLL for (uint c = 0; c < 4u; c++) {
      const float4 f = float4(as_type<char4>(w[c]));
      CK_UNROLL for (uint e = 0; e < 4u; e++) {
        v[4u * c + e] = f[e];
      }
    }
  } else {
    device const float4* f4 = (device const float4*)((device const float*)cache + vec * hd + d);
    CK_UNROLL for (uint c = 0; c < 4u; c++) {
      const float4 f = f4[c];
      CK_UNROLL for (uint e = 0; e < 4u; e++) {
        v[4u * c + e] = f[e];
      }
    }
  }
}

// Grid: (Hkv, ceil(nb G / ATTN_TILE_PAIRS)) threadgroups of 128 threads. Bindings as attn_rows'
// without the list, counts and partials.
template <bool Q8, bool WIDE>
[[max_total_threads_per_threadgroup(128)]] kernel void attn_tiles(
    constant AttentionParams& p [[buffer(0)]],
    device const float* q       [[buffer(1)]],
    device const char* kc       [[buffer(2)]],
    device const float* ks      [[buffer(3)]],
    device const char* vc       [[buffer(4)]],
    device const float* vs      [[buffer(5)]],
    device float* o             [[buffer(6)]],
    device const float* gate    [[buffer(7)]],
    uint2 tg                    [[threadgroup_position_in_grid]],
    ushort tid                  [[thread_index_in_threadgroup]],
    ushort sg                   [[simdgroup_index_in_threadgroup]],
    ushort lane                 [[thread_index_in_simdgroup]]) {
  static_assert(Q8 || !WIDE, "an f32 cache's K and V tiles at head_dim 256 exceed 32 KiB");
  constexpr uint BK = ATTN_TILE_BK(Q8, WIDE);
  constexpr uint VLD = BK + 8u;
  constexpr uint PLANES = Q8 ? 1u : 2u;  // K/V staged as hi (+ lo for f32)
  constexpr uint MAX_HD = ATTN_TILE_MAX_HD(WIDE);
  constexpr uint KLD_MAX = MAX_HD + 8u;
  constexpr uint PAIRS = ATTN_TILE_PAIRS(WIDE);
  // Per simdgroup: Q's hi + lo staging (16 x QLD each), then S (16 x BK f32), then P's hi + lo
  // (16 x VLD each), then one O tile (16 x 16 f32), one after another in the same words.
  constexpr uint SCRATCH_U4 = (2u * TILE * VLD * 2u) / 16u;
  static_assert(2u * TILE * ATTN_TILE_QLD * 2u <= SCRATCH_U4 * 16u && TILE * BK * 4u <= SCRATCH_U4 * 16u,
                "a simdgroup's scratch holds its Q staging and its S tile");
  threadgroup uint4 k4[PLANES * BK * KLD_MAX / 8u];
  threadgroup uint4 v4[PLANES * MAX_HD * VLD / 8u];
  threadgroup uint4 scratch4[ATTN_TILE_SG][SCRATCH_U4];
  threadgroup float shalf[WIDE ? ATTN_TILE_SG : 1][WIDE ? TILE * BK : 1];  // WIDE: each half of S
  threadgroup float kscale[BK];
  threadgroup float vscale[BK];

  const uint H = uint(p.heads);
  const uint Hkv = uint(p.kv_heads);
  const uint hd = uint(p.head_dim);
  const uint G = H / Hkv;
  const uint kvh = tg.x;
  const uint pairs = uint(p.rows) * G;
  const uint m0 = tg.y * PAIRS;                 // the threadgroup's first pair
  const uint mt = WIDE ? uint(sg) / 2u : uint(sg);  // the simdgroup's 16 pairs
  const uint sm0 = m0 + mt * TILE;              // their first
  const uint dim0 = WIDE ? (uint(sg) & 1u) * ATTN_TILE_HALF_HD : 0u;  // its first dim of Q and O
  const uint row = uint(lane) / 2u;             // this lane's row of the simdgroup's 16
  const uint half8 = (uint(lane) & 1u) * 8u;    // and its 8 columns of a 16-wide tile
  // Pairs past the last compute the last one's values and write nothing (no NaN from empty rows).
  const uint mine = min(sm0 + row, pairs - 1u);
  const uint t = mine / G;
  const uint h = kvh * G + mine % G;
  const uint last = uint(p.pos0) + t;  // the last position this row reads
  const bool active = sm0 < pairs;     // uniform per simdgroup
  const uint sg_last = uint(p.pos0) + min(sm0 + TILE - 1u, pairs - 1u) / G;
  const uint tg_last = uint(p.pos0) + min(m0 + PAIRS - 1u, pairs - 1u) / G;
  const uint kld = hd + 8u;
  const uint hdt = hd / TILE;                   // 16-dim tiles of K and V
  const uint own = min(hdt - dim0 / TILE, uint(ATTN_TILE_HDT));  // of Q and O in this simdgroup
  threadgroup bfloat* kst = (threadgroup bfloat*)k4;
  threadgroup bfloat* vst = (threadgroup bfloat*)v4;
  threadgroup bfloat* scr = (threadgroup bfloat*)scratch4[sg];
  threadgroup float* scr_f = (threadgroup float*)scratch4[sg];
  threadgroup uint* scr_w = (threadgroup uint*)scratch4[sg];

  // Q's fragments, hi and lo, 16 dims at a time through the scratch.
  TileA qh[ATTN_TILE_HDT];
  TileA ql[ATTN_TILE_HDT];
  device const float* qrow = seq_row(q, p.q_stride, t) + h * hd + dim0;
  CK_UNROLL for (uint n = 0; n < ATTN_TILE_HDT; n++) if (n < own) {
    const float4 a = *((device const float4*)(qrow + n * TILE + half8));
    const float4 b = *((device const float4*)(qrow + n * TILE + half8 + 4u));
    const float f[8] = {a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]};
    CK_UNROLL for (uint e = 0; e < 4u; e++) {
      const uint2 w = attn_split_bf16x2(f[2u * e], f[2u * e + 1u]);
      scr_w[(row * ATTN_TILE_QLD + half8) / 2u + e] = w.x;
      scr_w[(TILE * ATTN_TILE_QLD + row * ATTN_TILE_QLD + half8) / 2u + e] = w.y;
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    tile_load_a(qh[n], scr, ATTN_TILE_QLD, lane);
    tile_load_a(ql[n], scr + TILE * ATTN_TILE_QLD, ATTN_TILE_QLD, lane);
    simdgroup_barrier(mem_flags::mem_threadgroup);
  }

  float acc[ATTN_TILE_HDT][8];
  CK_UNROLL for (uint n = 0; n < ATTN_TILE_HDT; n++) {
    CK_UNROLL for (uint e = 0; e < 8u; e++) {
      acc[n][e] = 0.0f;
    }
  }
  float mx = -INFINITY;
  float sum = 0.0f;

  for (uint s0 = 0; s0 <= tg_last; s0 += BK) {
    // Stage the tile: K rows as they are, V transposed (two positions per 32-bit word).
    for (uint w = uint(tid); w < BK * hdt; w += 32u * ATTN_TILE_SG) {
      const uint j = w / hdt;
      const uint d = (w % hdt) * TILE;
      float v[16];
      attn_tile_load16<Q8>(kc, ulong(s0 + j) * Hkv + kvh, hd, d, s0 + j <= tg_last, v);
      uint hi[8];
      uint lo[8];
      CK_UNROLL for (uint e = 0; e < 8u; e++) {
        const uint2 sp = attn_split_bf16x2(v[2u * e], v[2u * e + 1u]);
        hi[e] = sp.x;
        lo[e] = sp.y;
      }
      // 16-byte stores: rows are (hd + 8) * 2 bytes apart and d a multiple of 16.
      threadgroup uint4* kh = (threadgroup uint4*)(kst + j * kld + d);
      kh[0] = uint4(hi[0], hi[1], hi[2], hi[3]);
      kh[1] = uint4(hi[4], hi[5], hi[6], hi[7]);
      if (!Q8) {
        threadgroup uint4* kl = (threadgroup uint4*)(kst + BK * kld + j * kld + d);
        kl[0] = uint4(lo[0], lo[1], lo[2], lo[3]);
        kl[1] = uint4(lo[4], lo[5], lo[6], lo[7]);
      }
    }
    for (uint w = uint(tid); w < (BK / 2u) * hdt; w += 32u * ATTN_TILE_SG) {
      const uint j = (w % (BK / 2u)) * 2u;
      const uint d = (w / (BK / 2u)) * TILE;
      float a[16];
      float b[16];
      attn_tile_load16<Q8>(vc, ulong(s0 + j) * Hkv + kvh, hd, d, s0 + j <= tg_last, a);
      attn_tile_load16<Q8>(vc, ulong(s0 + j + 1u) * Hkv + kvh, hd, d, s0 + j + 1u <= tg_last, b);
      CK_UNROLL for (uint e = 0; e < 16u; e++) {
        const uint2 sp = attn_split_bf16x2(a[e], b[e]);
        ((threadgroup uint*)vst)[((d + e) * VLD + j) / 2u] = sp.x;
        if (!Q8) {
          ((threadgroup uint*)vst)[(MAX_HD * VLD + (d + e) * VLD + j) / 2u] = sp.y;
        }
      }
    }
    if (uint(tid) < BK) {
      const uint s = s0 + uint(tid);
      const ulong slot = ulong(s) * Hkv + kvh;
      kscale[tid] = !Q8 ? 1.0f : s <= tg_last ? ks[slot] : 0.0f;
      vscale[tid] = !Q8 ? 1.0f : s <= tg_last ? vs[slot] : 0.0f;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    // uniform per simdgroup, and for WIDE the same in both simdgroups of the 16 pairs
    const bool work = active && s0 <= sg_last;
    threadgroup float* sfull = WIDE ? shalf[uint(sg) & ~1u] : scr_f;  // S (WIDE: its first half)
    if (work) {
      // S = Q K^T (WIDE: over this simdgroup's dims), BK columns, as [16][BK] f32.
      CK_UNROLL for (uint jt = 0; jt < BK / TILE; jt++) {
        TileC c;
        tile_clear(c);
        CK_UNROLL for (uint n = 0; n < ATTN_TILE_HDT; n++) if (n < own) {
          TileB b;
          tile_load_bt(b, kst + jt * TILE * kld + dim0 + n * TILE, kld, lane);
          if (!Q8) {
            TileB bl;
            tile_load_bt(bl, kst + BK * kld + jt * TILE * kld + dim0 + n * TILE, kld, lane);
            tile_mma(c, qh[n], bl);
          }
          tile_mma(c, ql[n], b);
          tile_mma(c, qh[n], b);
        }
        tile_store(c, (WIDE ? shalf[sg] : scr_f) + jt * TILE, BK, lane);
      }
    }
    if (WIDE) {
      threadgroup_barrier(mem_flags::mem_threadgroup);  // both halves of S are in
    } else {
      simdgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (work) {
      // The lane's half row: columns c0 .. c0 + BK / 2; its partner (lane ^ 1) has the rest.
      const uint c0 = (uint(lane) & 1u) * (BK / 2u);
      float w[BK / 2u];
      float tmax = -INFINITY;
      CK_UNROLL for (uint e = 0; e < BK / 2u; e++) {
        const uint col = c0 + e;
        const float sv = WIDE ? sfull[row * BK + col] + sfull[TILE * BK + row * BK + col] : sfull[row * BK + col];
        w[e] = s0 + col <= last ? sv * kscale[col] * p.scale : -INFINITY;
        tmax = max(tmax, w[e]);
      }
      tmax = max(tmax, simd_shuffle_xor(tmax, ushort(1)));
      const float mnew = max(mx, tmax);  // finite: position 0 is in every row's first tile
      const float corr = exp(mx - mnew);
      float part = 0.0f;
      CK_UNROLL for (uint e = 0; e < BK / 2u; e++) {
        w[e] = s0 + c0 + e <= last ? exp(w[e] - mnew) : 0.0f;
        part += w[e];
      }
      part += simd_shuffle_xor(part, ushort(1));
      sum = sum * corr + part;
      mx = mnew;
      simdgroup_barrier(mem_flags::mem_threadgroup);  // S is read: P takes its place
      CK_UNROLL for (uint e = 0; e < BK / 2u; e += 2u) {
        const uint2 sp = attn_split_bf16x2(w[e] * vscale[c0 + e], w[e + 1u] * vscale[c0 + e + 1u]);
        scr_w[(row * VLD + c0 + e) / 2u] = sp.x;
        scr_w[(TILE * VLD + row * VLD + c0 + e) / 2u] = sp.y;
      }
      simdgroup_barrier(mem_flags::mem_threadgroup);
      TileA ph[BK / TILE];
      TileA pl[BK / TILE];
      CK_UNROLL for (uint kt = 0; kt < BK / TILE; kt++) {
        tile_load_a(ph[kt], scr + kt * TILE, VLD, lane);
        tile_load_a(pl[kt], scr + TILE * VLD + kt * TILE, VLD, lane);
      }
      simdgroup_barrier(mem_flags::mem_threadgroup);  // P is in registers: O tiles take its place
      // O = O * corr + P V, 16 dims at a time.
      CK_UNROLL for (uint n = 0; n < ATTN_TILE_HDT; n++) if (n < own) {
        TileC c;
        tile_clear(c);
        CK_UNROLL for (uint kt = 0; kt < BK / TILE; kt++) {
          TileB b;
          tile_load_bt(b, vst + (dim0 + n * TILE) * VLD + kt * TILE, VLD, lane);
          if (!Q8) {
            TileB bl;
            tile_load_bt(bl, vst + MAX_HD * VLD + (dim0 + n * TILE) * VLD + kt * TILE, VLD, lane);
            tile_mma(c, ph[kt], bl);
          }
          tile_mma(c, pl[kt], b);
          tile_mma(c, ph[kt], b);
        }
        tile_store(c, scr_f, TILE, lane);
        simdgroup_barrier(mem_flags::mem_threadgroup);
        CK_UNROLL for (uint e = 0; e < 8u; e++) {
          acc[n][e] = acc[n][e] * corr + scr_f[row * TILE + half8 + e];
        }
        simdgroup_barrier(mem_flags::mem_threadgroup);  // the next tile's store
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // the staging is refilled next
  }

  if (active && sm0 + row < pairs) {
    device float* out = seq_row(o, p.o_stride, t) + h * hd + dim0;
    device const float* g = seq_row(gate, p.gate_stride, t) + h * hd + dim0;
    const float inv = 1.0f / sum;
    CK_UNROLL for (uint n = 0; n < ATTN_TILE_HDT; n++) if (n < own) {
      CK_UNROLL for (uint e = 0; e < 8u; e++) {
        const uint d = n * TILE + half8 + e;
        const float y = acc[n][e] * inv;
        out[d] = p.gated != 0 ? y / (1.0f + exp(-g[d])) : y;
      }
    }
  }
}

template [[host_name("attn_tiles_q8")]] kernel decltype(attn_tiles<true, false>) attn_tiles<true, false>;
template [[host_name("attn_tiles_f32")]] kernel decltype(attn_tiles<false, false>) attn_tiles<false, false>;
template [[host_name("attn_tiles_wide_q8")]] kernel decltype(attn_tiles<true, true>) attn_tiles<true, true>;
