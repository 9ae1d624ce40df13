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
// The kernels' [[max_total_threads_per_threadgroup]] bounds (literals: the bindings parser
// reads them) are these threadgroup sizes.
static_assert(MV_SG * 32 == 128 && MV_SPLIT_SG * 32 == 256, "update the matvec/moe kernels' thread bounds");

// Unrolls the next loop (constant trip count) on every compiler: arrays it indexes by the loop
// variable then stay in registers. nvcc leaves a large body rolled, and a rolled loop over
// acc[j] put the accumulators in local memory.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define MV_UNROLL _Pragma("GCC unroll 8")
#else
#define MV_UNROLL _Pragma("unroll")
#endif

// ---- element conversions ----------------------------------------------------------

inline float bf16_to_f32(ushort b) {
  return as_type<float>(uint(b) << 16);
}

// Four bf16 packed in two words (element 0 in the low half of .x).
inline float4 bf16x4_to_f32(uint2 v) {
  return float4(as_type<float>(v.x << 16), as_type<float>(v.x & 0xFFFF0000u),
                as_type<float>(v.y << 16), as_type<float>(v.y & 0xFFFF0000u));
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

// Four nibbles of a word (the low ones of its bytes, or with w >> 4 the high ones) as exact
// floats without int-to-float conversions (a quarter-rate instruction on NVIDIA GPUs): the
// nibble is the low mantissa of 2^23 + q, and subtracting 2^23 is exact.
inline float4 q4_nibbles4(uint w) {
  const uint m = 0x4B000000u;
  return float4(as_type<float>((w & 0xFu) | m), as_type<float>(((w >> 8) & 0xFu) | m),
                as_type<float>(((w >> 16) & 0xFu) | m), as_type<float>(((w >> 24) & 0xFu) | m)) -
         8388608.0f;
}

// sum_{j in group} q_j x_j for one q4 group: its 16 nibble bytes (byte b holds elements 2b,
// 2b + 1) against the HalfSet halves, 16 even and 16 odd elements.
inline float q4_group_dot(uint4 nib, thread const float4* ev, thread const float4* od) {
  return dot(q4_nibbles4(nib.x), ev[0]) + dot(q4_nibbles4(nib.x >> 4), od[0]) +
         dot(q4_nibbles4(nib.y), ev[1]) + dot(q4_nibbles4(nib.y >> 4), od[1]) +
         dot(q4_nibbles4(nib.z), ev[2]) + dot(q4_nibbles4(nib.z >> 4), od[2]) +
         dot(q4_nibbles4(nib.w), ev[3]) + dot(q4_nibbles4(nib.w >> 4), od[3]);
}

// q4 over HalfSet rows: a lane takes one whole group of 32 columns at a time (one 16-byte
// load of nibbles per weight row, its scale and bias), the group's 32 x values and sum are
// loaded once per batch row and serve all MV_R weight rows. Per-row pointers are formed
// once; inside the loop offsets are 32-bit.
inline void mv_pass_q4(device const uchar* w, int in_dim, int o0, int out_dim,
                       device const uchar* x, thread const ulong* xoff, int nx,
                       thread float4* acc, int lane, int lanes) {
  const uint groups = uint(in_dim) / 32u;
  const ulong total = ulong(out_dim) * ulong(in_dim);
  device const ushort* scales = (device const ushort*)(w + total / 2);
  device const ushort* biases = scales + total / 32;
  device const uint4* nib_row[MV_R];
  device const ushort* sc_row[MV_R];
  device const ushort* bi_row[MV_R];
  for (int i = 0; i < MV_R; i++) {
    ulong row = ulong(min(o0 + i, out_dim - 1));
    nib_row[i] = (device const uint4*)(w + row * ulong(in_dim / 2));
    sc_row[i] = scales + row * groups;
    bi_row[i] = biases + row * groups;
  }
  const uint half_dim = uint(in_dim) / 2u;
  for (uint g = uint(lane); g < groups; g += uint(lanes)) {
    uint4 nib[MV_R];
    float sc[MV_R];
    float bi[MV_R];
    for (int i = 0; i < MV_R; i++) {
      nib[i] = nib_row[i][g];
      sc[i] = bf16_to_f32(sc_row[i][g]);
      bi[i] = bf16_to_f32(bi_row[i][g]);
    }
    MV_UNROLL for (int j = 0; j < MV_NR; j++) if (j < nx) {
      device const float* h = (device const float*)(x + xoff[j]);
      device const float4* he = (device const float4*)(h + g * 16u);
      device const float4* ho = (device const float4*)(h + half_dim + g * 16u);
      float4 ev[4] = {he[0], he[1], he[2], he[3]};
      float4 od[4] = {ho[0], ho[1], ho[2], ho[3]};
      float gs = h[uint(in_dim) + g];
      for (int i = 0; i < MV_R; i++) {
        acc[j][i] += sc[i] * q4_group_dot(nib[i], ev, od) + bi[i] * gs;
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
