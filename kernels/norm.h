// One RMSNorm vector per simdgroup (kernels/norm.metal, and the DeltaNet tail and
// deltanet_rows_norm_f32 in kernels/deltanet.metal): lanes stride over it, simd_sum joins the
// squares, no barriers. In place is fine (each lane rewrites only the elements it read).
#pragma once
#include <metal_stdlib>
#include "unroll.h"

using namespace metal;

#define NORM_SG 4  // simdgroups (vectors) per threadgroup

// Elements a lane loads before it uses any (NORM_LOADS turns of 32): the loads of a turn are
// in flight together, so a 2,048-wide vector is 8 trips to memory a pass instead of 64 (one
// simdgroup walking a row an element at a time is a chain of dependent trips: ~25 us for the
// PLE layer's k norm on the H200). The sums keep the one-at-a-time order, so the same bits.
#define NORM_LOADS 8

// rsqrt(mean(x^2) + eps) of a vector as one simdgroup forms it (every lane calls it and gets
// it): lane l sums x[l]^2, x[l + 32]^2, ... in that order, simd_sum joins them. The plain read
// of the projections that form their input (matvec.metal) calls it too, for the same bits.
// X is the pointer to x: device memory, or threadgroup memory where a kernel staged x.
// L: the turns a lane loads at once (NORM_LOADS; fewer where registers are short).
template <int L = NORM_LOADS, typename X>
inline float rms_norm_scale(int dim, float eps, X xv, ushort lane) {
  float ss = 0.0f;
  for (int c0 = int(lane); c0 < dim; c0 += 32 * L) {
    float v[L];
    CK_UNROLL for (int u = 0; u < L; u++) {
      const int c = c0 + 32 * u;
      v[u] = c < dim ? xv[c] : 0.0f;
    }
    CK_UNROLL for (int u = 0; u < L; u++) {
      if (c0 + 32 * u < dim) {
        ss += v[u] * v[u];
      }
    }
  }
  ss = simd_sum(ss);
  return rsqrt(ss / float(dim) + eps);
}

// A row read as x + b (rms_norm_bias_f32): each element the one f32 add ew_add_f32 makes, so
// the norm of it has the bits of the norm of the added row.
struct BiasedRow {
  device const float* x;
  device const float* b;
  inline float operator[](int c) const {
    return x[c] + b[c];
  }
};

// y = x * rsqrt(mean(x^2) + eps) * (centred ? 1 + w : w), times SiLU(z) when GATED (the same
// arithmetic whichever memory X points into).
template <bool GATED, int L = NORM_LOADS, typename X>
inline void rms_norm_vector(int dim, float eps, bool centred, X xv, device const float* w,
                            device float* yv, device const float* zv, ushort lane) {
  float r = rms_norm_scale<L>(dim, eps, xv, lane);
  float offset = centred ? 1.0f : 0.0f;
  for (int c0 = int(lane); c0 < dim; c0 += 32 * L) {
    float xs[L], ws[L], zs[L];
    CK_UNROLL for (int u = 0; u < L; u++) {
      const int c = c0 + 32 * u;
      xs[u] = c < dim ? xv[c] : 0.0f;
      ws[u] = c < dim ? w[c] : 0.0f;
      zs[u] = GATED && c < dim ? zv[c] : 0.0f;
    }
    CK_UNROLL for (int u = 0; u < L; u++) {
      const int c = c0 + 32 * u;
      float v = xs[u] * r * (offset + ws[u]);
      if (GATED) {
        v *= zs[u] / (1.0f + exp(-zs[u]));
      }
      if (c < dim) {
        yv[c] = v;
      }
    }
  }
}
