// Shared bodies of the row-batched projections (matvec.metal, moe.metal, embed.metal,
// output.metal): weight loaders per storage dtype and one simdgroup "pass" that multiplies
// MV_R weight rows with MV_NR input rows. A simdgroup keeps its MV_R weight rows and walks
// all the batch rows it serves, so the weights of a step are read from memory once, not
// once per row; its lanes split the input dimension and simd_sum joins them.
//
// q4 (docs/format.md): [nibbles out*in/2][bf16 scales out*in/32][bf16 biases out*in/32],
// even column in the low nibble. Its input is a plain row of x, and
//   dot(w_row, x) = sum_g scale_g * (sum_{j in g} q_j x_j) + bias_g * gsum_g
// with the group sums gsum_g formed by the lane that reads the group's 32 x values.
#ifndef CHERENKOV_MATVEC_H
#define CHERENKOV_MATVEC_H

#include <metal_stdlib>
#include "grid.h"
#include "unroll.h"

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

// Unrolls the next loop (constant trip count): kernels/unroll.h.
#define MV_UNROLL CK_UNROLL

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

// Prefetches (kernels/grid.h) what rows [o0, o0 + MV_R) of a weight of out_dim rows of in_dim
// elements are made of: the rows' elements, and for q4 their scales and biases. Called by one
// lane before the kernel's ck_inputs_ready(); the rows past out_dim are not asked for. The
// last argument only picks the storage type (overloads: q4 is uchar).
template <typename T>
inline void mv_prefetch_rows(device const uchar* w, ulong n, int o0, int rows, int out_dim, thread const T*) {
  ck_prefetch(w + ulong(o0) * n * sizeof(T), uint(ulong(rows) * n * sizeof(T)));
}
inline void mv_prefetch_rows(device const uchar* w, ulong n, int o0, int rows, int out_dim, thread const uchar*) {
  const ulong total = ulong(out_dim) * n;  // nibbles, then bf16 scales and biases a group of 32
  ck_prefetch(w + ulong(o0) * n / 2, uint(ulong(rows) * n / 2));
  ck_prefetch(w + total / 2 + ulong(o0) * n / 16, uint(ulong(rows) * n / 16));
  ck_prefetch(w + total / 2 + total / 16 + ulong(o0) * n / 16, uint(ulong(rows) * n / 16));
}
// A bench-only storage tag (bench:kernels' "loads only" cases): a q4 weight read exactly as
// the q4 pass reads it (the same tiles, x loads and reductions) with its arithmetic cut to one
// XOR and two FMAs a row-group, so its time against the q4 kernel's says how much of that is
// the nibble arithmetic: the speed of light of the tiling. Its results mean nothing. The tag is
// `char` (no weight is stored as char), so kernels instantiate on a type every backend's
// generated tables name as written.
using q4_loads_only = char;
inline void mv_prefetch_rows(device const uchar* w, ulong n, int o0, int rows, int out_dim, thread const q4_loads_only*) {
  mv_prefetch_rows(w, n, o0, rows, out_dim, (thread const uchar*)nullptr);
}

template <typename T>
inline void mv_prefetch_tile(device const uchar* w, int in_dim, int o0, int out_dim) {
  const int rows = min(MV_R, out_dim - o0);
  if (rows > 0) {
    mv_prefetch_rows(w, ulong(in_dim), o0, rows, out_dim, (thread const T*)nullptr);
  }
}

// ---- one pass: acc[j][i] += W[o0 + i] . x_j for the first nx (<= MV_NR) batch rows -----
// Rows of W past out_dim are clamped (their results are never written); x rows arrive as
// byte offsets from x so the caller decides where each batch row lives.

// A row staged in threadgroup memory keeps its float4 i (of q4 group g = i / 8, k = i % 8) at
// g * 8 + (k ^ (g % 8)): the lanes of a q4 pass read consecutive groups at once, and without
// the rotation their 16-byte reads of one k would all fall on the same banks (groups are 128
// bytes apart). The one definition of the layout (mv_stage_q4x, the staged x sources, the
// site and plain reads).
inline uint mv_staged_at(uint i) {
  const uint g = i / 8u;
  return g * 8u + ((i & 7u) ^ (g & 7u));
}

// Where a dense pass reads its x: batch rows in device memory (MvXDevice), or one row staged in
// threadgroup memory in mv_staged_at's layout (MvXStaged). load4(j, c): elements c .. c + 3 of
// batch row j (c % 4 == 0).
struct MvXDevice {
  device const uchar* x;
  thread const ulong* xoff;
  inline float4 load4(int j, int c) const {
    return *((device const float4*)(x + xoff[j] + ulong(c) * 4));
  }
};
struct MvXStaged {
  threadgroup const float4* xs;
  inline float4 load4(int j, int c) const {
    return xs[mv_staged_at(uint(c) / 4u)];
  }
};
// Several rows staged one after another, row j from float4 j * c4s (c4s = in_dim / 4, a
// multiple of 8: each row keeps mv_staged_at's layout; the rows forms of the fused reads).
struct MvXStagedRows {
  threadgroup const float4* xs;
  int c4s;
  inline float4 load4(int j, int c) const {
    return xs[j * c4s + int(mv_staged_at(uint(c) / 4u))];
  }
};

// `lane` of `lanes` splits the input dimension: a simdgroup's 32 lanes (lanes = 32), or every
// lane of a threadgroup that shares its weight rows (matvec_split).
template <typename WL, int NR, typename XS>
inline void mv_pass_dense(device const uchar* w, int in_dim, int o0, int out_dim, XS xsrc, int nx,
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
    for (int j = 0; j < NR; j++) if (j < nx) {
      float4 xv = xsrc.load4(j, c);
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

// A group's 32 x values arranged and pre-scaled for q4_group_dot: word m of the nibbles holds
// elements 8m .. 8m + 7 (nibble k at bits 4k .. 4k + 3), even[m] elements 8m + 0, 2, 4, 6 and
// odd[m] elements 8m + 1, 3, 5, 7. q4_group_dot takes each nibble in place (masked, not shifted
// down) as an exact float q * 2^s, so x is scaled by 2^-s here, once per group and batch row,
// for every weight row that uses it. Scaling by powers of two is exact, so the products are
// the same real numbers as q * x times one power of two, and the sums keep their bits.
struct Q4X {
  float4 even[4];
  float4 odd[4];
};

#if defined(__CUDA_ARCH__)
// CUDA: a nibble masked in place within bits 0 .. 23 of a word IS an exact float without
// arithmetic: the word q * 2^b (b + 4 <= 24) reads as the denormal (or, for bit 23 set, the
// smallest normal) q * 2^(b - 149). Each nibble is brought to bit 12, 16 or 20 (of w << 12, w
// or w >> 12) and x scaled by 2^(85 - b), so every product is q x 2^-64, and the group's sum
// is scaled back by 2^64 at the end: one AND and one FMA a weight, where the magic-number form
// below needs an AND, an OR (a second LOP3 on sm_90: both constants are immediates) and a
// subtraction as well. The scale keeps x finite up to 2^55 (x 2^73) and leaves a sum that
// falls below the normal range an absolute error of at most 2^-85; the bits are the form
// below's unless x holds values under ~2^-38 (where a scaled partial sum can be denormal). It
// needs IEEE denormals in FMA (nvcc without -ftz/fast math: metal-shim/cuda/build.ts).
// spec/kernels/q4-dot-forms.test.ts checks both forms' masks and scales (and those flags) on
// any machine; the q4 kernel tests check the results on CUDA.
inline void q4_prescale_word(float4 a, float4 b, thread float4& even, thread float4& odd) {
  // elements 0, 3, 6 at bit 12 (x 2^73); 1, 4, 7 at bit 16 (x 2^69); 2, 5 at bit 20 (x 2^65)
  even = float4(a.x * 0x1p73f, a.z * 0x1p65f, b.x * 0x1p69f, b.z * 0x1p73f);
  odd = float4(a.y * 0x1p69f, a.w * 0x1p73f, b.y * 0x1p65f, b.w * 0x1p69f);
}

// sum_{j in group} q_j x_j for one q4 group: its 16 nibble bytes (byte b holds elements 2b
// and 2b + 1) against the group's x from q4_prescale.
inline float q4_group_dot(uint4 nib, thread const Q4X& x) {
  float q = 0.0f;
  const uint words[4] = {nib.x, nib.y, nib.z, nib.w};
  MV_UNROLL for (int m = 0; m < 4; m++) {
    const uint w = words[m];
    const uint l = w << 12;  // nibbles 0, 1, 2 at bits 12, 16, 20
    const uint h = w >> 12;  // nibbles 6, 7 at bits 12, 16
    const float4 even = float4(as_type<float>(l & 0xF000u), as_type<float>(l & 0xF00000u), as_type<float>(w & 0xF0000u),
                               as_type<float>(h & 0xF000u));
    const float4 odd = float4(as_type<float>(l & 0xF0000u), as_type<float>(w & 0xF000u), as_type<float>(w & 0xF00000u),
                              as_type<float>(h & 0xF0000u));
    q += dot(even, x.even[m]) + dot(odd, x.odd[m]);
  }
  return q * 0x1p64f;
}
#else
// Metal and the CPU backend: the masked nibble becomes a normal float by the 2^23 magic
// number (2^23 + v is exact for v < 2^23; subtracting 2^23 leaves v), since Metal's fast math
// may flush denormals and x86 takes a slow path on them. Nibbles 6 and 7 and nibble 5 come
// from the word shifted down by 12 (a nibble must sit below bit 23 to be a float's mantissa).
inline void q4_prescale_word(float4 a, float4 b, thread float4& even, thread float4& odd) {
  // elements 8m + 0, 2, 4, 6 scaled by 1, 2^-8, 2^-16, 2^-12; 1, 3, 5, 7 by 2^-4, 2^-12, 2^-8, 2^-16
  even = float4(a.x, a.z * 0x1p-8f, b.x * 0x1p-16f, b.z * 0x1p-12f);
  odd = float4(a.y * 0x1p-4f, a.w * 0x1p-12f, b.y * 0x1p-8f, b.w * 0x1p-16f);
}

// Four masked nibbles as exact floats without int-to-float conversions (a quarter-rate
// instruction on NVIDIA GPUs): a value below 2^23 is the low mantissa of 2^23 + v, and
// subtracting 2^23 is exact. One AND-OR a nibble, no shifts but the one per word.
inline float4 q4_masked4(uint w0, uint w1, uint w2, uint w3) {
  const uint m = 0x4B000000u;
  return float4(as_type<float>(w0 | m), as_type<float>(w1 | m), as_type<float>(w2 | m), as_type<float>(w3 | m)) - 8388608.0f;
}

// sum_{j in group} q_j x_j for one q4 group: its 16 nibble bytes (byte b holds elements 2b
// and 2b + 1) against the group's x from q4_prescale.
inline float q4_group_dot(uint4 nib, thread const Q4X& x) {
  float q = 0.0f;
  const uint words[4] = {nib.x, nib.y, nib.z, nib.w};
  MV_UNROLL for (int m = 0; m < 4; m++) {
    const uint w = words[m];
    const uint h = w >> 12;
    const float4 even = q4_masked4(w & 0xFu, w & 0xF00u, w & 0xF0000u, h & 0xF000u);
    const float4 odd = q4_masked4(w & 0xF0u, w & 0xF000u, h & 0xF00u, h & 0xF0000u);
    q += dot(even, x.even[m]) + dot(odd, x.odd[m]);
  }
  return q;
}
#endif

// A group's x for q4_group_dot: word m's elements (xv[2m], xv[2m + 1]) by q4_prescale_word.
inline Q4X q4_prescale(thread const float4* xv) {
  Q4X r;
  MV_UNROLL for (int m = 0; m < 4; m++) {
    q4_prescale_word(xv[2 * m], xv[2 * m + 1], r.even[m], r.odd[m]);
  }
  return r;
}

// The sum of a word's 8 x values (elements 8m .. 8m + 7 as a and b), and of a group's 32 as
// the sum of its words' in word order: a fixed order, so row results do not depend on which
// kernel formed it (q4_group_sum, or mv_stage_q4x's per-word sums added by q4_words_sum).
inline float q4_word_sum(float4 a, float4 b) {
  return (a.x + a.y) + (a.z + a.w) + (b.x + b.y) + (b.z + b.w);
}
inline float q4_words_sum(float4 words) {
  float sum = 0.0f;
  sum += words.x;
  sum += words.y;
  sum += words.z;
  sum += words.w;
  return sum;
}
inline float q4_group_sum(thread const float4* xv) {
  return q4_words_sum(float4(q4_word_sum(xv[0], xv[1]), q4_word_sum(xv[2], xv[3]), q4_word_sum(xv[4], xv[5]), q4_word_sum(xv[6], xv[7])));
}

// A q4 weight's MV_R rows from o0 (clamped to out_dim - 1): nibble, scale and bias rows.
struct Q4Rows {
  device const uint4* nib[MV_R];
  device const ushort* sc[MV_R];
  device const ushort* bi[MV_R];
};

inline Q4Rows q4_rows(device const uchar* w, int in_dim, int o0, int out_dim) {
  const uint groups = uint(in_dim) / 32u;
  const ulong total = ulong(out_dim) * ulong(in_dim);
  device const ushort* scales = (device const ushort*)(w + total / 2);
  device const ushort* biases = scales + total / 32;
  Q4Rows r;
  MV_UNROLL for (int i = 0; i < MV_R; i++) {
    ulong row = ulong(min(o0 + i, out_dim - 1));
    r.nib[i] = (device const uint4*)(w + row * ulong(in_dim / 2));
    r.sc[i] = scales + row * groups;
    r.bi[i] = biases + row * groups;
  }
  return r;
}

// q4 over plain input rows: a lane takes one whole group of 32 columns at a time (one 16-byte
// load of nibbles per weight row, its scale and bias); the group's 32 x values and their sum
// are loaded and formed once per batch row and serve every weight row. TWO: a second weight
// of the same shape (gate and up) shares the x loads, into acc1. Offsets in the loop are
// 32-bit; the row pointers are formed once.
//
// A one-row pass (NR == 1: decode) loads the weights of MV_Q4_BATCH of its lane's groups
// (g, g + lanes) before computing either: a decode projection has a threadgroup or so per SM,
// and one group's loads at a time left ~10 KB in flight per SM where the memory needs several
// times that (a round trip per group: 2 for the 2048-wide inputs, 4 for [2048, 4096]). Two,
// not more: registers (~160 a thread) still let the 768-threadgroup projections run in two
// waves. The groups are still accumulated in g order: the same bits as one at a time.
// U: groups whose weights a lane loads together (the split form passes 1: its host sizes the
// threadgroup so that a lane has about one group, and a second would only cost registers).
#define MV_Q4_BATCH 2

// Where a q4 pass finds float4 k (0..7) of group g of batch row j: the rows in device memory
// (Q4XDevice), or one row staged in threadgroup memory as it is (Q4XStaged: the fused site and
// plain reads write it) or pre-scaled (Q4XPrescaled, below).
struct Q4XDevice {
  device const uchar* x;
  thread const ulong* xoff;
  inline float4 load(int j, uint g, int k) const {
    return ((device const float4*)(x + xoff[j]))[g * 8u + uint(k)];
  }
};

// One row staged in mv_staged_at's layout.
struct Q4XStaged {
  threadgroup const float4* xs;
  inline float4 load(int j, uint g, int k) const {
    return xs[mv_staged_at(g * 8u + uint(k))];
  }
};
// Rows staged one after another (as MvXStagedRows).
struct Q4XStagedRows {
  threadgroup const float4* xs;
  int c4s;
  inline float4 load(int j, uint g, int k) const {
    return xs[j * c4s + int(mv_staged_at(g * 8u + uint(k)))];
  }
};

// One row staged by mv_stage_q4x: each group already in q4_group_dot's form (Q4X: its words'
// even and odd elements, pre-scaled; float4 k < 4 is even[k], k >= 4 odd[k - 4], at
// mv_staged_at's places) and its words' sums (gsums[g]). The lanes of a one-row q4 pass then
// load a group's x and form no products or sums of their own for it: the staging did that
// once for the threadgroup, not once per simdgroup (exact scalings and the same sums in the
// same order: the same bits).
struct Q4XPrescaled {
  threadgroup const float4* xs;
  threadgroup const float4* gsums;
  // Float4 k of group g as staged (pre-scaled, even/odd order): the loads a pass makes, for
  // q4_tile_dot's loads-only form; q4_group_x reads the group whole.
  inline float4 load(int j, uint g, int k) const {
    return xs[mv_staged_at(g * 8u + uint(k))];
  }
};

// Stages one input row of in_dim floats (a multiple of 32, at most MV_STAGE_COLS) for
// Q4XPrescaled: thread t takes words t, t + threads, ... (a word: 8 x values, two float4s),
// every thread of the threadgroup; the caller puts the barrier after it.
inline void mv_stage_q4x(threadgroup float4* xs, threadgroup float4* gsums, device const uchar* x, int in_dim, int tid, int threads) {
  device const float4* x4 = (device const float4*)x;
  threadgroup float* sums = (threadgroup float*)gsums;
  for (int i = tid; i < in_dim / 8; i += threads) {
    const float4 a = x4[2 * i];
    const float4 b = x4[2 * i + 1];
    const uint g = uint(i) / 4u;
    const uint m = uint(i) % 4u;
    float4 even, odd;
    q4_prescale_word(a, b, even, odd);
    xs[mv_staged_at(g * 8u + m)] = even;
    xs[mv_staged_at(g * 8u + 4u + m)] = odd;
    sums[i] = q4_word_sum(a, b);
  }
}

// A group's sum and pre-scaled x for q4_tile_dot, from any x source (loaded, then formed) or
// from a Q4XPrescaled row (loaded only).
template <typename XS>
inline void q4_group_x(XS xsrc, int j, uint g, thread float& gs, thread Q4X& xq) {
  float4 xv[8];
  MV_UNROLL for (int k = 0; k < 8; k++) {
    xv[k] = xsrc.load(j, g, k);
  }
  gs = q4_group_sum(xv);
  xq = q4_prescale(xv);
}
inline void q4_group_x(Q4XPrescaled xsrc, int j, uint g, thread float& gs, thread Q4X& xq) {
  MV_UNROLL for (int m = 0; m < 4; m++) {
    xq.even[m] = xsrc.xs[mv_staged_at(g * 8u + uint(m))];
    xq.odd[m] = xsrc.xs[mv_staged_at(g * 8u + 4u + uint(m))];
  }
  gs = q4_words_sum(xsrc.gsums[g]);
}

// The weights a lane loads at once: U groups (g0, g0 + lanes, ...) of MV_R rows, and of the
// second weight with TWO. A group past the end reloads g0 (never used): the loads stay
// unconditional.
template <bool TWO, int U>
struct Q4Tile {
  uint4 n0[U][MV_R], n1[U][MV_R];
  float s0[U][MV_R], b0[U][MV_R], s1[U][MV_R], b1[U][MV_R];
};

template <bool TWO, int U>
inline void q4_tile_load(thread Q4Tile<TWO, U>& t, thread const Q4Rows& r0, thread const Q4Rows& r1, uint g0, uint groups, int lanes) {
  MV_UNROLL for (int u = 0; u < U; u++) {
    const uint g = g0 + uint(u * lanes) < groups ? g0 + uint(u * lanes) : g0;
    MV_UNROLL for (int i = 0; i < MV_R; i++) {
      t.n0[u][i] = r0.nib[i][g];
      t.s0[u][i] = bf16_to_f32(r0.sc[i][g]);
      t.b0[u][i] = bf16_to_f32(r0.bi[i][g]);
      if (TWO) {
        t.n1[u][i] = r1.nib[i][g];
        t.s1[u][i] = bf16_to_f32(r1.sc[i][g]);
        t.b1[u][i] = bf16_to_f32(r1.bi[i][g]);
      }
    }
  }
}

// acc[j] += the tile's rows . x_j over its groups, in g order. LOADS_ONLY (q4_loads_only):
// the nibble arithmetic cut to one XOR and two FMAs a row-group, every loaded word, scale,
// bias and x value still feeding the accumulators, so no load is dropped.
template <bool TWO, int NR, int U, typename XS, bool LOADS_ONLY = false>
inline void q4_tile_dot(thread const Q4Tile<TWO, U>& t, uint g0, uint groups, int lanes, XS xsrc, int nx,
                        thread float4* acc0, thread float4* acc1) {
  MV_UNROLL for (int u = 0; u < U; u++) {
    const uint g = g0 + uint(u * lanes);
    if (g >= groups) {
      break;
    }
    MV_UNROLL for (int j = 0; j < NR; j++) if (j < nx) {
      if (LOADS_ONLY) {
        float4 xv[8];
        MV_UNROLL for (int k = 0; k < 8; k++) {
          xv[k] = xsrc.load(j, g, k);
        }
        float4 xs = float4(0.0f);
        MV_UNROLL for (int k = 0; k < 8; k++) {
          xs += xv[k];
        }
        MV_UNROLL for (int i = 0; i < MV_R; i++) {
          const uint4 n0 = t.n0[u][i];
          acc0[j][i] += as_type<float>((n0.x ^ n0.y ^ n0.z ^ n0.w) & 0x3F7FFFFFu) * t.s0[u][i] + t.b0[u][i] * xs.x;
          if (TWO) {
            const uint4 n1 = t.n1[u][i];
            acc1[j][i] += as_type<float>((n1.x ^ n1.y ^ n1.z ^ n1.w) & 0x3F7FFFFFu) * t.s1[u][i] + t.b1[u][i] * xs.y;
          }
        }
        continue;
      }
      float gs;
      Q4X xq;
      q4_group_x(xsrc, j, g, gs, xq);
      MV_UNROLL for (int i = 0; i < MV_R; i++) {
        acc0[j][i] += t.s0[u][i] * q4_group_dot(t.n0[u][i], xq) + t.b0[u][i] * gs;
        if (TWO) {
          acc1[j][i] += t.s1[u][i] * q4_group_dot(t.n1[u][i], xq) + t.b1[u][i] * gs;
        }
      }
    }
  }
}

// The pass over groups first, first + U * lanes, ... (first = lane; a kernel that loaded the
// first tile itself continues from lane + U * lanes). LOADS_ONLY: q4_tile_dot's (q4_loads_only).
template <bool TWO, int NR, int U = (NR == 1 ? MV_Q4_BATCH : 1), typename XS = Q4XDevice, bool LOADS_ONLY = false>
inline void mv_pass_q4(device const uchar* w0, device const uchar* w1, int in_dim, int o0, int out_dim,
                       XS xsrc, int nx, thread float4* acc0, thread float4* acc1, int first, int lanes) {
  const uint groups = uint(in_dim) / 32u;
  const Q4Rows r0 = q4_rows(w0, in_dim, o0, out_dim);
  const Q4Rows r1 = q4_rows(TWO ? w1 : w0, in_dim, o0, out_dim);
  for (uint g0 = uint(first); g0 < groups; g0 += uint(U * lanes)) {
    Q4Tile<TWO, U> t;
    q4_tile_load<TWO, U>(t, r0, r1, g0, groups, lanes);
    q4_tile_dot<TWO, NR, U, XS, LOADS_ONLY>(t, g0, groups, lanes, xsrc, nx, acc0, acc1);
  }
}

// A one-row q4 pass whose input row is staged in threadgroup memory (mv_stage_q4x: pre-scaled,
// with its words' sums) by the threadgroup, for rows of at most MV_STAGE_COLS columns: one tile a
// lane covers them, and the lane loads it before the staging and its barrier, so the two trips
// to memory overlap, then takes the dot on the staged row. The tile is loaded before the wait
// for the previous dispatch, which this pass makes (ck_inputs_ready, kernels/grid.h): on CUDA a
// threadgroup that starts while that dispatch still runs has its weights in registers when it
// ends, where the L2 prefetch alone left a trip from L2 after the wait. Callers do not wait
// before it. (With a second tile after the barrier, for wider rows, a
// gate/up kernel rose from 168 to 248 registers on sm_90: wider rows read x from device
// memory. Staging did not pay for moe_gate_up_pairs at all: 22-25 us against 18 on the H200.)
// `active` (uniform per simdgroup): whether this simdgroup has rows to compute; every thread
// reaches the barrier. Returns `active`. LOADS_ONLY: q4_tile_dot's (bench:kernels).
#define MV_STAGE_COLS (MV_Q4_BATCH * 32 * 32)
template <bool LOADS_ONLY = false>
inline bool mv_pass_q4_staged(device const uchar* w, int in_dim, int o0, int out_dim, bool active, threadgroup float4* xs,
                              threadgroup float4* gsums, device const uchar* x_row, bool has_row, int tid, int threads,
                              thread float4* acc, int lane) {
  constexpr int U = MV_Q4_BATCH;
  const uint groups = uint(in_dim) / 32u;
  const Q4Rows r = q4_rows(w, in_dim, o0, out_dim);
  Q4Tile<false, U> t = {};  // (only read when loaded)
  const uint g0 = uint(lane);
  if (active && g0 < groups) {
    q4_tile_load<false, U>(t, r, r, g0, groups, 32);
  }
  ck_inputs_ready();  // the weights are nobody's output; x is the previous dispatch's
  if (has_row) {
    mv_stage_q4x(xs, gsums, x_row, in_dim, tid, threads);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (!active) {
    return false;
  }
  if (g0 < groups) {
    q4_tile_dot<false, 1, U, Q4XPrescaled, LOADS_ONLY>(t, g0, groups, 32, Q4XPrescaled{xs, gsums}, 1, acc, acc);
  }
  return true;
}

// Dispatch on the weight format. run2: two weights of one shape over the same input (gate
// and up), which q4 does in one pass sharing the x loads.
template <typename T, int NR>
struct MvPass {
  static void run(device const uchar* w, int in_dim, int o0, int out_dim, device const uchar* x,
                  thread const ulong* xoff, int nx, thread float4* acc, ushort lane) {
    mv_pass_dense<Weights<T>, NR>(w, in_dim, o0, out_dim, MvXDevice{x, xoff}, nx, acc, int(lane), 32);
  }
  static void run2(device const uchar* w0, device const uchar* w1, int in_dim, int o0, int out_dim, device const uchar* x,
                   thread const ulong* xoff, int nx, thread float4* acc0, thread float4* acc1, ushort lane) {
    mv_pass_dense<Weights<T>, NR>(w0, in_dim, o0, out_dim, MvXDevice{x, xoff}, nx, acc0, int(lane), 32);
    mv_pass_dense<Weights<T>, NR>(w1, in_dim, o0, out_dim, MvXDevice{x, xoff}, nx, acc1, int(lane), 32);
  }
  static void run_split(device const uchar* w, int in_dim, int o0, int out_dim, device const uchar* x,
                        thread const ulong* xoff, int nx, thread float4* acc, int lane, int lanes) {
    mv_pass_dense<Weights<T>, NR>(w, in_dim, o0, out_dim, MvXDevice{x, xoff}, nx, acc, lane, lanes);
  }
};

// q4 (uchar), and the bench-only q4_loads_only (char) through the same passes.
template <int NR, bool LOADS_ONLY>
struct MvPassQ4 {
  static constexpr int U = NR == 1 ? MV_Q4_BATCH : 1;
  static void run(device const uchar* w, int in_dim, int o0, int out_dim, device const uchar* x,
                  thread const ulong* xoff, int nx, thread float4* acc, ushort lane) {
    mv_pass_q4<false, NR, U, Q4XDevice, LOADS_ONLY>(w, w, in_dim, o0, out_dim, Q4XDevice{x, xoff}, nx, acc, acc, int(lane), 32);
  }
  static void run2(device const uchar* w0, device const uchar* w1, int in_dim, int o0, int out_dim, device const uchar* x,
                   thread const ulong* xoff, int nx, thread float4* acc0, thread float4* acc1, ushort lane) {
    mv_pass_q4<true, NR, U, Q4XDevice, LOADS_ONLY>(w0, w1, in_dim, o0, out_dim, Q4XDevice{x, xoff}, nx, acc0, acc1, int(lane), 32);
  }
  static void run_split(device const uchar* w, int in_dim, int o0, int out_dim, device const uchar* x,
                        thread const ulong* xoff, int nx, thread float4* acc, int lane, int lanes) {
    mv_pass_q4<false, NR, 1, Q4XDevice, LOADS_ONLY>(w, w, in_dim, o0, out_dim, Q4XDevice{x, xoff}, nx, acc, acc, lane, lanes);
  }
};
template <int NR>
struct MvPass<uchar, NR> : MvPassQ4<NR, false> {};
template <int NR>
struct MvPass<q4_loads_only, NR> : MvPassQ4<NR, true> {};

// Sums the first nx accumulators over the simdgroup (each lane then holds the totals).
// nx is uniform across the simdgroup, so every lane makes the same simd_sum calls.
template <int NR>
inline void mv_reduce(thread float4* acc, int nx) {
  for (int j = 0; j < NR; j++) if (j < nx) {
    acc[j] = simd_sum(acc[j]);
  }
}

// Byte offsets of a pass's NR batch rows from r0; rows past r_end repeat the last one
// (their results are never written).
template <int NR>
inline void mv_row_offsets(thread ulong* xoff, int r0, int r_end, ulong x_stride) {
  for (int j = 0; j < NR; j++) {
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

template <int NR>
inline void mv_clear(thread float4* acc) {
  for (int j = 0; j < NR; j++) {
    acc[j] = float4(0.0f);
  }
}

#endif  // CHERENKOV_MATVEC_H
