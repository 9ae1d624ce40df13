// Shared bodies of the row-batched projections (matvec.metal, moe.metal, embed.metal,
// output.metal): weight loaders per storage dtype and one simdgroup "pass" that multiplies
// MV_R weight rows with MV_NR input rows. A simdgroup keeps its MV_R weight rows and walks
// all the batch rows it serves, so the weights of a step are read from memory once, not
// once per row; its lanes split the input dimension and simd_sum joins them.
//
// q4 (docs/format.md): [nibbles out*in/2][bf16 scales out*in/32][bf16 biases out*in/32],
// even column in the low nibble. Its input is a HalfSet row: the even elements of x, then
// the odd ones, then the per-32 group sums, so that
//   dot(w_row, x) = sum_g scale_g * (sum_{j in g} q_j x_j) + bias_g * gsum_g
// and four nibbles of a word meet four consecutive floats of one half.
#ifndef CHERENKOV_MATVEC_H
#define CHERENKOV_MATVEC_H

#include <metal_stdlib>

using namespace metal;

// Loops over a pass's batch rows run to the constant MV_NR with a guard (j < nx): indexed by
// constants once unrolled, the accumulators stay in registers. To a runtime bound they were
// indexed dynamically, which put them in local memory on the H200 (ncu: 605k spill requests
// in one [2048, 4096] q4 projection).
//
// Output rows per simdgroup (4: one float4 accumulator per batch row holds them, so one
// simd_sum reduces 4 outputs at once), batch rows per pass, simdgroups per threadgroup.
#define MV_R 4
#define MV_NR 4
#define MV_SG 4
// Simdgroups of a matvec_split threadgroup: all of them on the same MV_R rows, each on a
// slice of the input dimension (narrow projections: few output rows, long inputs).
#define MV_SPLIT_SG 8
static_assert(MV_R == 4, "an accumulator is one float4 of MV_R output rows");

// ---- element conversions ----------------------------------------------------------

inline float bf16_to_f32(ushort b) {
  return as_type<float>(uint(b) << 16);
}

// Four bf16 packed in two words (element 0 in the low half of .x).
inline float4 bf16x4_to_f32(uint2 v) {
  return float4(as_type<float>(v.x << 16), as_type<float>(v.x & 0xFFFF0000u),
                as_type<float>(v.y << 16), as_type<float>(v.y & 0xFFFF0000u));
}

// The four low (or, shifted first, high) nibbles of a word as floats.
inline float4 nibbles_lo(uint w) {
  return float4(as_type<uchar4>(w & 0x0F0F0F0Fu));
}
inline float4 nibbles_hi(uint w) {
  return float4(as_type<uchar4>((w >> 4) & 0x0F0F0F0Fu));
}

// ---- weight loaders --------------------------------------------------------------------
// load4: 4 consecutive elements from element e (e % 4 == 0); load1: element e of a tensor
// of `total` elements (q4 needs the total to find its scales).
// Kernels are instantiated on the storage element type as a tag: float (f32), bfloat
// (bf16), half (f16), uchar (q4: two nibbles per byte). Weights<T> is its loader.

template <typename T>
struct Weights;

template <>
struct Weights<float> {
  static float4 load4(device const uchar* w, ulong e) {
    return *((device const float4*)(w + e * 4));
  }
  static float load1(device const uchar* w, ulong total, ulong e) {
    return *((device const float*)(w + e * 4));
  }
};

template <>
struct Weights<bfloat> {
  static float4 load4(device const uchar* w, ulong e) {
    return bf16x4_to_f32(*((device const uint2*)(w + e * 2)));
  }
  static float load1(device const uchar* w, ulong total, ulong e) {
    return bf16_to_f32(*((device const ushort*)(w + e * 2)));
  }
};

template <>
struct Weights<half> {
  static float4 load4(device const uchar* w, ulong e) {
    return float4(*((device const half4*)(w + e * 2)));
  }
  static float load1(device const uchar* w, ulong total, ulong e) {
    return float(*((device const half*)(w + e * 2)));
  }
};

// One element of a q4 tensor of `total` elements (gathers: embedding rows).
inline float q4_load1(device const uchar* w, ulong total, ulong e) {
  uchar byte = w[e >> 1];
  float q = float((e & 1) != 0 ? (byte >> 4) : (byte & 15));
  ulong g = e >> 5;
  device const ushort* scales = (device const ushort*)(w + total / 2);
  device const ushort* biases = scales + total / 32;
  return bf16_to_f32(scales[g]) * q + bf16_to_f32(biases[g]);
}

template <>
struct Weights<uchar> {
  static float load1(device const uchar* w, ulong total, ulong e) {
    return q4_load1(w, total, e);
  }
};

// ---- one pass: acc[j][i] += W[o0 + i] . x_j for the first nx (<= MV_NR) batch rows -----
// Rows of W past out_dim are clamped (their results are never written); x rows arrive as
// byte offsets from x so the caller decides where each batch row lives.

// `lane` of `lanes` splits the input dimension: a simdgroup's 32 lanes (lanes = 32), or every
// lane of a threadgroup that shares its weight rows (matvec_split).
template <typename WL>
inline void mv_pass_dense(device const uchar* w, int in_dim, int o0, int out_dim,
                          device const uchar* x, thread const ulong* xoff, int nx,
                          thread float4* acc, int lane, int lanes) {
  ulong wrow[MV_R];
  for (int i = 0; i < MV_R; i++) {
    wrow[i] = ulong(min(o0 + i, out_dim - 1)) * ulong(in_dim);
  }
  for (int c = lane * 4; c < in_dim; c += lanes * 4) {
    float4 wv[MV_R];
    for (int i = 0; i < MV_R; i++) {
      wv[i] = WL::load4(w, wrow[i] + ulong(c));
    }
    for (int j = 0; j < MV_NR; j++) if (j < nx) {
      float4 xv = *((device const float4*)(x + xoff[j] + ulong(c) * 4));
      acc[j] += float4(dot(wv[0], xv), dot(wv[1], xv), dot(wv[2], xv), dot(wv[3], xv));
    }
  }
}

// q4 over HalfSet rows: a lane takes 16 columns at a time (8 nibble bytes: 8 even and
// 8 odd elements) and adds its group's bias term on the first half of the group.
inline void mv_pass_q4(device const uchar* w, int in_dim, int o0, int out_dim,
                       device const uchar* x, thread const ulong* xoff, int nx,
                       thread float4* acc, int lane, int lanes) {
  ulong total = ulong(out_dim) * ulong(in_dim);
  device const ushort* scales = (device const ushort*)(w + total / 2);
  device const ushort* biases = scales + total / 32;
  ulong wrow[MV_R];
  for (int i = 0; i < MV_R; i++) {
    wrow[i] = ulong(min(o0 + i, out_dim - 1)) * ulong(in_dim);
  }
  int half_dim = in_dim / 2;
  for (int u = lane; u < in_dim / 16; u += lanes) {
    int g = u >> 1;
    // The 16 nibbles of each row as floats, even and odd halves, unpacked once per unit.
    float4 qe0[MV_R], qe1[MV_R], qo0[MV_R], qo1[MV_R];
    float sc[MV_R];
    float bi[MV_R];
    for (int i = 0; i < MV_R; i++) {
      ulong e = wrow[i] + ulong(u) * 16;
      uint2 nib = *((device const uint2*)(w + e / 2));
      qe0[i] = nibbles_lo(nib.x);
      qo0[i] = nibbles_hi(nib.x);
      qe1[i] = nibbles_lo(nib.y);
      qo1[i] = nibbles_hi(nib.y);
      sc[i] = bf16_to_f32(scales[e >> 5]);
      bi[i] = (u & 1) == 0 ? bf16_to_f32(biases[e >> 5]) : 0.0f;
    }
    for (int j = 0; j < MV_NR; j++) if (j < nx) {
      device const float* h = (device const float*)(x + xoff[j]);
      float4 e0 = *((device const float4*)(h + u * 8));
      float4 e1 = *((device const float4*)(h + u * 8 + 4));
      float4 d0 = *((device const float4*)(h + half_dim + u * 8));
      float4 d1 = *((device const float4*)(h + half_dim + u * 8 + 4));
      float gs = h[in_dim + g];
      for (int i = 0; i < MV_R; i++) {
        float q = dot(qe0[i], e0) + dot(qo0[i], d0) + dot(qe1[i], e1) + dot(qo1[i], d1);
        acc[j][i] += sc[i] * q + bi[i] * gs;
      }
    }
  }
}

// Dispatch on the weight format: q4 reads HalfSet rows, the others plain rows.
template <typename T>
struct MvPass {
  static void run(device const uchar* w, int in_dim, int o0, int out_dim, device const uchar* x,
                  thread const ulong* xoff, int nx, thread float4* acc, ushort lane) {
    mv_pass_dense<Weights<T> >(w, in_dim, o0, out_dim, x, xoff, nx, acc, int(lane), 32);
  }
  static void run_split(device const uchar* w, int in_dim, int o0, int out_dim, device const uchar* x,
                        thread const ulong* xoff, int nx, thread float4* acc, int lane, int lanes) {
    mv_pass_dense<Weights<T> >(w, in_dim, o0, out_dim, x, xoff, nx, acc, lane, lanes);
  }
};

template <>
struct MvPass<uchar> {
  static void run(device const uchar* w, int in_dim, int o0, int out_dim, device const uchar* x,
                  thread const ulong* xoff, int nx, thread float4* acc, ushort lane) {
    mv_pass_q4(w, in_dim, o0, out_dim, x, xoff, nx, acc, int(lane), 32);
  }
  static void run_split(device const uchar* w, int in_dim, int o0, int out_dim, device const uchar* x,
                        thread const ulong* xoff, int nx, thread float4* acc, int lane, int lanes) {
    mv_pass_q4(w, in_dim, o0, out_dim, x, xoff, nx, acc, lane, lanes);
  }
};

// Sums the first nx accumulators over the simdgroup (each lane then holds the totals).
// nx is uniform across the simdgroup, so every lane makes the same simd_sum calls.
inline void mv_reduce(thread float4* acc, int nx) {
  for (int j = 0; j < MV_NR; j++) if (j < nx) {
    acc[j] = simd_sum(acc[j]);
  }
}

// Byte offsets of a pass's MV_NR batch rows from r0; rows past r_end repeat the last one
// (their results are never written).
inline void mv_row_offsets(thread ulong* xoff, int r0, int r_end, ulong x_stride) {
  for (int j = 0; j < MV_NR; j++) {
    xoff[j] = ulong(min(r0 + j, r_end - 1)) * x_stride;
  }
}

// y[row][o0 + i] = v[i] (or += v[i] when accumulating) for the MV_R rows of W from o0 that
// exist (out_dim may end inside the four).
inline void mv_store(device uchar* y, ulong y_stride, int row, int o0, int out_dim, float4 v, bool accumulate) {
  device float* yr = (device float*)(y + ulong(row) * y_stride);
  for (int i = 0; i < MV_R && o0 + i < out_dim; i++) {
    yr[o0 + i] = accumulate ? yr[o0 + i] + v[i] : v[i];
  }
}

inline void mv_clear(thread float4* acc) {
  for (int j = 0; j < MV_NR; j++) {
    acc[j] = float4(0.0f);
  }
}

#endif  // CHERENKOV_MATVEC_H
