// The tile API of kernels/tile.h on the CUDA backend: a simdgroup is a warp and a 16 x 16
// tile product is two tensor-core mma.sync.m16n8k16 (bf16 operands, f32 accumulate, sm_80
// and newer). Fragments hold exactly the registers of PTX's layouts (g = lane / 4, t = lane % 4):
//   A 16 x 16 (row):  r[0] (g, 2t..2t+1)  r[1] (g+8, 2t..)  r[2] (g, 2t+8..)  r[3] (g+8, 2t+8..)
//   B 16 x 16 (col):  r[2j] (k 2t..2t+1, n 8j+g)  r[2j+1] (k 2t+8.., n 8j+g), j = 0, 1
//   C 16 x 16 (f32):  v[4j] v[4j+1] (g, 8j+2t..)  v[4j+2] v[4j+3] (g+8, 8j+2t..)
// Each operand register is two consecutive bf16 of one row of the source (A's rows, Bt's rows),
// so loads are 32-bit: sources need an even stride and a 4-byte aligned start.
#pragma once
#include "types.h"

namespace metal {

struct TileA {
  uint r[4];
};
struct TileB {
  uint r[4];
};
struct TileC {
  float v[8];
};

__device__ __forceinline__ void tile_clear(TileC &c) {
#pragma unroll
  for (int i = 0; i < 8; i++) c.v[i] = 0.0f;
}

namespace ck_tile {
__device__ __forceinline__ uint pair(const ckm::bfloat *p) { return *reinterpret_cast<const uint *>(p); }
}  // namespace ck_tile

// Two floats as bf16 (round to nearest even) in one word, a in the low half: one
// cvt.rn.bf16x2.f32 on sm_80 and newer (it takes the high half first).
__device__ __forceinline__ uint tile_pack_bf16x2(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
  return r;
#else
  return uint(ckm::bfloat(a).bits) | (uint(ckm::bfloat(b).bits) << 16);
#endif
}

// A[m][k] = src[m * stride + k], m, k < 16.
__device__ __forceinline__ void tile_load_a(TileA &a, const ckm::bfloat *src, uint stride, ushort lane) {
  const uint g = lane >> 2, t = (lane & 3u) * 2u;
  const ckm::bfloat *lo = src + g * stride + t, *hi = src + (g + 8u) * stride + t;
  a.r[0] = ck_tile::pair(lo);
  a.r[1] = ck_tile::pair(hi);
  a.r[2] = ck_tile::pair(lo + 8);
  a.r[3] = ck_tile::pair(hi + 8);
}

// B[k][n] = src[n * stride + k]: a row of src is a column of B, as mma's .col B wants.
__device__ __forceinline__ void tile_load_bt(TileB &b, const ckm::bfloat *src, uint stride, ushort lane) {
  const uint g = lane >> 2, t = (lane & 3u) * 2u;
#pragma unroll
  for (int j = 0; j < 2; j++) {
    const ckm::bfloat *col = src + (8u * j + g) * stride + t;
    b.r[2 * j] = ck_tile::pair(col);
    b.r[2 * j + 1] = ck_tile::pair(col + 8);
  }
}

// c += a b.
__device__ __forceinline__ void tile_mma(TileC &c, const TileA &a, const TileB &b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#pragma unroll
  for (int j = 0; j < 2; j++) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c.v[4 * j]), "+f"(c.v[4 * j + 1]), "+f"(c.v[4 * j + 2]), "+f"(c.v[4 * j + 3])
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[2 * j]), "r"(b.r[2 * j + 1]));
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // bf16 mma needs sm_80 or newer (docs/cuda.md)
#endif
}

// dst[m * stride + n] = C[m][n].
__device__ __forceinline__ void tile_store(const TileC &c, float *dst, uint stride, ushort lane) {
  const uint g = lane >> 2, t = (lane & 3u) * 2u;
#pragma unroll
  for (int j = 0; j < 2; j++) {
    float *lo = dst + g * stride + 8u * j + t, *hi = dst + (g + 8u) * stride + 8u * j + t;
    lo[0] = c.v[4 * j];
    lo[1] = c.v[4 * j + 1];
    hi[0] = c.v[4 * j + 2];
    hi[1] = c.v[4 * j + 3];
  }
}

}  // namespace metal
