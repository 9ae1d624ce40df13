// The tile API of kernels/tile.h on the CPU backend: 16 x 16 fragments of one simdgroup,
// bf16 operands, f32 accumulators, as plain loops. A fragment is spread over the 32 lanes as
// on a GPU: lane l holds row l / 2, columns (l % 2) * 8 .. + 8 (A and C), and of B the column
// n = l / 2, rows (l % 2) * 8 .. + 8 (one row of the Bt storage the kernels load B from).
// Operands hold their bf16 values as floats (exact), so a product is exact and only the f32
// sums round, as in a GPU's matrix unit.
//
// tile_mma is a SIMD function (every lane of the simdgroup calls it, in the same order): the
// lanes publish pointers to their fragments, each computes its own 8 outputs from the others'
// operands, and a second exchange keeps every lane from changing a fragment before all have
// read it. The fibers of a threadgroup share one address space, so a lane can read another
// lane's fragment on that lane's stack.
#pragma once
#include "../../abi.h"
#include "types.h"

namespace metal {

struct TileA {
  float v[8];
};
struct TileB {
  float v[8];
};
struct TileC {
  float v[8];
};

inline void tile_clear(TileC &c) {
  for (int i = 0; i < 8; i++) c.v[i] = 0.0f;
}

// Two floats as bf16 (round to nearest even) in one word, a in the low half.
inline uint tile_pack_bf16x2(float a, float b) {
  return uint(bfloat(a).bits) | (uint(bfloat(b).bits) << 16);
}

// A[m][k] = src[m * stride + k], m, k < 16.
inline void tile_load_a(TileA &a, const bfloat *src, uint stride, ushort lane) {
  const bfloat *row = src + ulong(lane / 2u) * stride + (lane % 2u) * 8u;
  for (int i = 0; i < 8; i++) a.v[i] = float(row[i]);
}

// B[k][n] = src[n * stride + k] (B stored transposed: a weight's rows, a key's dimensions).
inline void tile_load_bt(TileB &b, const bfloat *src, uint stride, ushort lane) {
  const bfloat *row = src + ulong(lane / 2u) * stride + (lane % 2u) * 8u;
  for (int i = 0; i < 8; i++) b.v[i] = float(row[i]);
}

// c += a b. Lanes that have returned count as zero operands (on a GPU the result is undefined).
inline void tile_mma(TileC &c, const TileA &a, const TileB &b) {
  const void *mine[2] = {&a, &b};
  ck::SimdView v = ck::simd_exchange(mine, sizeof mine);
  float rows[2][8], cols[8][16];
  auto operand = [&](uint lane, int which) -> const float * {
    static const float zeros[8] = {};
    if (((v.active >> lane) & 1u) == 0) return zeros;
    const void *p[2];
    std::memcpy(p, v.slots + lane * ck::kSlotBytes, sizeof p);
    return which == 0 ? static_cast<const TileA *>(p[0])->v : static_cast<const TileB *>(p[1])->v;
  };
  const uint r = v.lane / 2u, c0 = (v.lane % 2u) * 8u;
  for (int h = 0; h < 2; h++) std::memcpy(rows[h], operand(2u * r + uint(h), 0), sizeof rows[h]);
  for (int j = 0; j < 8; j++)
    for (int h = 0; h < 2; h++) std::memcpy(&cols[j][h * 8], operand(2u * (c0 + uint(j)) + uint(h), 1), 8 * sizeof(float));
  for (int j = 0; j < 8; j++) {
    float s = c.v[j];
    for (int k = 0; k < 16; k++) s += rows[k / 8][k % 8] * cols[j][k];
    c.v[j] = s;
  }
  ck::simd_exchange(nullptr, 0);
}

// dst[m * stride + n] = C[m][n].
inline void tile_store(const TileC &c, float *dst, uint stride, ushort lane) {
  float *row = dst + ulong(lane / 2u) * stride + (lane % 2u) * 8u;
  for (int i = 0; i < 8; i++) row[i] = c.v[i];
}

}  // namespace metal
