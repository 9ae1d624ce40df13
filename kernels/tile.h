// The tile API: one simdgroup multiplies 16 x 16 tiles on the GPU's matrix units.
//
//   TileA a;  TileB b;  TileC c;          // operand A (16 x 16), operand B (16 x 16), f32 C
//   tile_clear(c);
//   tile_load_a(a, src, stride, lane);    // A[m][k] = src[m * stride + k]   (threadgroup bf16)
//   tile_load_bt(b, src, stride, lane);   // B[k][n] = src[n * stride + k]   (threadgroup bf16)
//   tile_mma(c, a, b);                    // c += a b
//   tile_store(c, dst, stride, lane);     // dst[m * stride + n] = C[m][n]   (threadgroup f32)
//   uint w = tile_pack_bf16x2(a, b);      // two floats as bf16 (nearest even), a in the low half:
//                                         // how operands are written into threadgroup memory
//
// Every lane of the simdgroup makes the same calls (they are SIMD functions: simdgroup-
// uniform control flow only, as simd_sum). Operands are bf16, accumulators f32: bf16 keeps
// f32's range, so activations never overflow (docs/model.md, numeric rule R7). Sources and
// destinations live in threadgroup memory; a stride is in elements, even, and a source starts
// 4-byte aligned. B is loaded from its transpose Bt[n][k] (a weight's rows [out][in], a key's
// dimensions), which every matrix unit takes without a transposing copy.
//
// Three implementations of the same fragments, each in its backend's natural layout (a
// fragment's lanes are opaque; only load, mma and store see them):
//  - Metal (below): simdgroup_matrix, a 16 x 16 tile as 2 x 2 simdgroup_bfloat8x8 operands
//    and simdgroup_float8x8 accumulators, 8 simdgroup_multiply_accumulate per tile_mma;
//  - CUDA (metal-shim/cuda/include/ck/tile.h): mma.sync.m16n8k16 bf16 -> f32, two per tile_mma;
//  - CPU (metal-shim/cpu/include/ck/tile.h): plain loops over the lanes' fragments.
#ifndef CHERENKOV_TILE_H
#define CHERENKOV_TILE_H

#include <metal_stdlib>

using namespace metal;

// Rows and columns of a tile, and the k of one tile_mma.
#define TILE 16

#if defined(__METAL_VERSION__)

struct TileA {
  simdgroup_bfloat8x8 m[2][2];  // [row block][k block]
};
struct TileB {
  simdgroup_bfloat8x8 m[2][2];  // [k block][column block]
};
struct TileC {
  simdgroup_float8x8 m[2][2];  // [row block][column block]
};

inline void tile_clear(thread TileC& c) {
  for (int i = 0; i < 2; i++) {
    for (int j = 0; j < 2; j++) {
      c.m[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    }
  }
}

inline uint tile_pack_bf16x2(float a, float b) {
  return uint(as_type<ushort>(bfloat(a))) | (uint(as_type<ushort>(bfloat(b))) << 16);
}

inline void tile_load_a(thread TileA& a, threadgroup const bfloat* src, uint stride, ushort lane) {
  for (int i = 0; i < 2; i++) {
    for (int k = 0; k < 2; k++) {
      simdgroup_load(a.m[i][k], src + ulong(i * 8) * stride + k * 8, ulong(stride));
    }
  }
}

// Block (k, n) of B is block (n, k) of Bt, loaded transposed.
inline void tile_load_bt(thread TileB& b, threadgroup const bfloat* src, uint stride, ushort lane) {
  for (int k = 0; k < 2; k++) {
    for (int n = 0; n < 2; n++) {
      simdgroup_load(b.m[k][n], src + ulong(n * 8) * stride + k * 8, ulong(stride), ulong2(0, 0), true);
    }
  }
}

inline void tile_mma(thread TileC& c, thread const TileA& a, thread const TileB& b) {
  for (int i = 0; i < 2; i++) {
    for (int j = 0; j < 2; j++) {
      for (int k = 0; k < 2; k++) {
        simdgroup_multiply_accumulate(c.m[i][j], a.m[i][k], b.m[k][j], c.m[i][j]);
      }
    }
  }
}

inline void tile_store(thread const TileC& c, threadgroup float* dst, uint stride, ushort lane) {
  for (int i = 0; i < 2; i++) {
    for (int j = 0; j < 2; j++) {
      simdgroup_store(c.m[i][j], dst + ulong(i * 8) * stride + j * 8, ulong(stride));
    }
  }
}

#endif  // __METAL_VERSION__: the CPU and CUDA preludes define the same API

#endif  // CHERENKOV_TILE_H
