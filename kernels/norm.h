// One RMSNorm vector per simdgroup (kernels/norm.metal, and the DeltaNet tail and
// deltanet_rows_norm_f32 in kernels/deltanet.metal): lanes stride over it, simd_sum joins the
// squares, no barriers. In place is fine (each lane rewrites only the elements it read).
#pragma once
#include <metal_stdlib>

using namespace metal;

#define NORM_SG 4  // simdgroups (vectors) per threadgroup

// rsqrt(mean(x^2) + eps) of a vector as one simdgroup forms it (every lane calls it and gets
// it): lane l sums x[l]^2, x[l + 32]^2, ... in that order, simd_sum joins them. The plain read
// of the projections that form their input (matvec.metal) calls it too, for the same bits.
// X is the pointer to x: device memory, or threadgroup memory where a kernel staged x.
template <typename X>
inline float rms_norm_scale(int dim, float eps, X xv, ushort lane) {
  float ss = 0.0f;
  for (int c = int(lane); c < dim; c += 32) {
    float v = xv[c];
    ss += v * v;
  }
  ss = simd_sum(ss);
  return rsqrt(ss / float(dim) + eps);
}

// y = x * rsqrt(mean(x^2) + eps) * (centred ? 1 + w : w), times SiLU(z) when GATED (the same
// arithmetic whichever memory X points into).
template <bool GATED, typename X>
inline void rms_norm_vector(int dim, float eps, bool centred, X xv, device const float* w,
                            device float* yv, device const float* zv, ushort lane) {
  float r = rms_norm_scale(dim, eps, xv, lane);
  float offset = centred ? 1.0f : 0.0f;
  for (int c = int(lane); c < dim; c += 32) {
    float v = xv[c] * r * (offset + w[c]);
    if (GATED) {
      float g = zv[c];
      v *= g / (1.0f + exp(-g));
    }
    yv[c] = v;
  }
}
