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

// Sixteen floats of x row r from column k; rows past `rows` and columns past in_dim are 0.
// Rows start 16-byte aligned (the host checks), so whole spans load as float4.
inline void gemm_load_x16(device const uchar* x, ulong x_stride, int rows, int in_dim, int r, int k, thread float* v) {
  device const float* xr = (device const float*)(x + ulong(min(r, rows - 1)) * x_stride) + k;
  if (r < rows && k + 16 <= in_dim) {
    MV_UNROLL for (int q = 0; q < 4; q++) {
      float4 f = ((device const float4*)xr)[q];
      MV_UNROLL for (int e = 0; e < 4; e++) {
        v[4 * q + e] = f[e];
      }
    }
  } else {
    MV_UNROLL for (int i = 0; i < 16; i++) {
      v[i] = r < rows && k + i < in_dim ? xr[i] : 0.0f;
    }
  }
}

inline uint gemm_bf16x2(float a, float b) {
  return uint(as_type<ushort>(bfloat(a))) | (uint(as_type<ushort>(bfloat(b))) << 16);
}

// Sixteen floats rounded to bf16 at hi (16-byte aligned), as two 16-byte stores; with SPLIT
// also what the rounding left, rounded to bf16, at lo (v = hi + lo to about 2^-17 of v).
template <bool SPLIT>
inline void gemm_store16(threadgroup bfloat* hi, threadgroup bfloat* lo, thread float* v) {
  threadgroup uint4* h = (threadgroup uint4*)hi;
  h[0] = uint4(gemm_bf16x2(v[0], v[1]), gemm_bf16x2(v[2], v[3]), gemm_bf16x2(v[4], v[5]), gemm_bf16x2(v[6], v[7]));
  h[1] = uint4(gemm_bf16x2(v[8], v[9]), gemm_bf16x2(v[10], v[11]), gemm_bf16x2(v[12], v[13]), gemm_bf16x2(v[14], v[15]));
  if (SPLIT) {
    MV_UNROLL for (int i = 0; i < 16; i++) {
      v[i] -= float(bfloat(v[i]));
    }
    threadgroup uint4* l = (threadgroup uint4*)lo;
    l[0] = uint4(gemm_bf16x2(v[0], v[1]), gemm_bf16x2(v[2], v[3]), gemm_bf16x2(v[4], v[5]), gemm_bf16x2(v[6], v[7]));
    l[1] = uint4(gemm_bf16x2(v[8], v[9]), gemm_bf16x2(v[10], v[11]), gemm_bf16x2(v[12], v[13]), gemm_bf16x2(v[14], v[15]));
  }
}

// y[r] = W x[r] (+ y[r]): threadgroup (x, y) computes output rows [x * GEMM_BN, ...) of batch
// rows [y * GEMM_BM, ...). SPLIT (numeric rule R7): both operands as bf16 pairs hi + lo and
// three tile products (hi hi, lo hi, hi lo) per step, about 2^-16 of each |w x|, close to the
// f32 matvec; without it one bf16 product, 2^-8 of |w x|.
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
  // Operand tiles (hi, then lo when SPLIT) as uint4 storage (16-byte aligned for
  // gemm_store16), used as bf16.
  threadgroup uint4 xs4[(SPLIT ? 2 : 1) * GEMM_BM * GEMM_LD / 8];
  threadgroup uint4 ws4[(SPLIT ? 2 : 1) * GEMM_BN * GEMM_LD / 8];
  threadgroup float staged[GEMM_SG * TILE * TILE];
  threadgroup bfloat* xs = (threadgroup bfloat*)xs4;
  threadgroup bfloat* ws = (threadgroup bfloat*)ws4;
  threadgroup bfloat* xs_lo = xs + (SPLIT ? GEMM_BM * GEMM_LD : 0);
  threadgroup bfloat* ws_lo = ws + (SPLIT ? GEMM_BN * GEMM_LD : 0);
  const int n0 = int(tg.x) * GEMM_BN;
  const int m0 = int(tg.y) * GEMM_BM;
  const int lr = int(tid) / 2;          // the operand row this thread loads
  const int lc = (int(tid) % 2) * 16;   // and its first column within the K step
  const int sm = (int(sg) / 2) * 32;    // this simdgroup's 32 x 32 of the block
  const int sn = (int(sg) % 2) * 32;

  TileC c[2][2];
  MV_UNROLL for (int i = 0; i < 2; i++) {
    MV_UNROLL for (int j = 0; j < 2; j++) {
      tile_clear(c[i][j]);
    }
  }
  for (int k0 = 0; k0 < p.in_dim; k0 += GEMM_BK) {
    float v[16];
    gemm_load_x16(x, p.x_stride, p.rows, p.in_dim, m0 + lr, k0 + lc, v);
    gemm_store16<SPLIT>(xs + lr * GEMM_LD + lc, xs_lo + lr * GEMM_LD + lc, v);
    GemmWeights<T>::load16(w, p.in_dim, p.out_dim, n0 + lr, k0 + lc, v);
    gemm_store16<SPLIT>(ws + lr * GEMM_LD + lc, ws_lo + lr * GEMM_LD + lc, v);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    MV_UNROLL for (int kk = 0; kk < GEMM_BK; kk += TILE) {
      TileA a[2];
      TileB b[2];
      MV_UNROLL for (int i = 0; i < 2; i++) {
        tile_load_a(a[i], xs + (sm + i * TILE) * GEMM_LD + kk, GEMM_LD, lane);
        tile_load_bt(b[i], ws + (sn + i * TILE) * GEMM_LD + kk, GEMM_LD, lane);
      }
      if (SPLIT) {
        // The small terms first: lo x hi_w, then hi x lo_w (each needs the other's hi).
        TileA a_lo[2];
        TileB b_lo[2];
        MV_UNROLL for (int i = 0; i < 2; i++) {
          tile_load_a(a_lo[i], xs_lo + (sm + i * TILE) * GEMM_LD + kk, GEMM_LD, lane);
          tile_load_bt(b_lo[i], ws_lo + (sn + i * TILE) * GEMM_LD + kk, GEMM_LD, lane);
        }
        MV_UNROLL for (int i = 0; i < 2; i++) {
          MV_UNROLL for (int j = 0; j < 2; j++) {
            tile_mma(c[i][j], a_lo[i], b[j]);
            tile_mma(c[i][j], a[i], b_lo[j]);
          }
        }
      }
      MV_UNROLL for (int i = 0; i < 2; i++) {
        MV_UNROLL for (int j = 0; j < 2; j++) {
          tile_mma(c[i][j], a[i], b[j]);
        }
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // the tiles are refilled next step
  }

  // Out through a per-simdgroup staging tile: lane l writes row l / 2, 8 columns from (l % 2) * 8.
  threadgroup float* mine = staged + int(sg) * TILE * TILE;
  const int sr = int(lane) / 2;
  const int sc = (int(lane) % 2) * 8;
  MV_UNROLL for (int i = 0; i < 2; i++) {
    MV_UNROLL for (int j = 0; j < 2; j++) {
      tile_store(c[i][j], mine, TILE, lane);
      simdgroup_barrier(mem_flags::mem_threadgroup);
      const int r = m0 + sm + i * TILE + sr;
      const int o = n0 + sn + j * TILE + sc;
      if (r < p.rows) {
        device float* yr = (device float*)(y + ulong(r) * p.y_stride);
        for (int e = 0; e < 8 && o + e < p.out_dim; e++) {
          float val = mine[sr * TILE + sc + e];
          yr[o + e] = p.accumulate != 0 ? yr[o + e] + val : val;
        }
      }
      simdgroup_barrier(mem_flags::mem_threadgroup);  // mine is reused by the next tile
    }
  }
}

template [[host_name("gemm_f32_f32")]] kernel decltype(gemm<float, true>) gemm<float, true>;
template [[host_name("gemm_bf16_f32")]] kernel decltype(gemm<bfloat, true>) gemm<bfloat, true>;
template [[host_name("gemm_f16_f32")]] kernel decltype(gemm<half, true>) gemm<half, true>;
template [[host_name("gemm_q4_f32")]] kernel decltype(gemm<uchar, true>) gemm<uchar, true>;
// One bf16 product per step (2^-8 of |w x|): the tile API's own precision, for its tests and
// for measuring what the split costs.
template [[host_name("gemm_plain_f32_f32")]] kernel decltype(gemm<float, false>) gemm<float, false>;
template [[host_name("gemm_plain_q4_f32")]] kernel decltype(gemm<uchar, false>) gemm<uchar, false>;
