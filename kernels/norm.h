// One RMSNorm vector per simdgroup (kernels/norm.metal, and the DeltaNet tail and
// deltanet_rows_norm_f32 in kernels/deltanet.metal): lanes stride over it, simd_sum joins the
// squares, no barriers. In place is fine (each lane rewrites only the elements it read).
#pragma once
#include <metal_stdlib>

using namespace metal;

#define NORM_SG 4  // simdgroups (vectors) per threadgroup

// y = x * rsqrt(mean(x^2) + eps) * (centred ? 1 + w : w), times SiLU(z) when GATED. X is the
// pointer to x: device memory, or threadgroup memory where a kernel staged x (the same
// arithmetic either way).
template <bool GATED, typename X>
inline void rms_norm_vector(int dim, float eps, bool centred, X xv, device const float* w,
                            device float* yv, device const float* zv, ushort lane) {
  float ss = 0.0f;
  for (int c = int(lane); c < dim; c += 32) {
    float v = xv[c];
    ss += v * v;
  }
  ss = simd_sum(ss);
  float r = rsqrt(ss / float(dim) + eps);
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
