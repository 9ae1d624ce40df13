// Helpers shared by the sequence kernel families (conv, deltanet, rope, kv, qsa,
// attention, ple): row addressing by byte strides, the scalar activations as the
// reference defines them, and the q8 rounding rule. Compiles as MSL and as C++.
#pragma once
#include <metal_stdlib>
#include "unroll.h"

using namespace metal;

// Most taps a causal conv window may hold: (K-1) * dilation.
#define SEQ_CONV_MAX_SPAN 32
// Most elements of a head vector one SIMD lane holds (head dims up to 8 * 32 = 256).
#define SEQ_MAX_PER_LANE 8

// Row `row` of a row-major batch whose rows are `stride` bytes apart.
inline device const float* seq_row(device const float* base, ulong stride, uint row) {
  return (device const float*)((device const char*)base + stride * ulong(row));
}
inline device float* seq_row(device float* base, ulong stride, uint row) {
  return (device float*)((device char*)base + stride * ulong(row));
}

inline float seq_sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }
inline float seq_silu(float x) { return x / (1.0f + exp(-x)); }

// log(1 + u) for u in [0, 1], accurate for tiny u (Metal has no log1p): the rounding
// of 1 + u is corrected by the factor u / (w - 1).
inline float seq_log1p(float u) {
  float w = 1.0f + u;
  return w == 1.0f ? u : log(w) * (u / (w - 1.0f));
}

// Softplus in the reference's overflow-free form max(x, 0) + log1p(e^-|x|).
inline float seq_softplus(float x) { return max(x, 0.0f) + seq_log1p(exp(-fabs(x))); }

// The q8 code of x for a vector scale (docs/model.md): round(x / scale) with halves away
// from zero, clamped to +-127; scale 0 gives 0. The half-way decision is exact (an fma
// compares |x| with (n + 1/2) * scale), so it agrees with the reference's f64 division.
inline int seq_q8_code(float x, float scale) {
  if (scale == 0.0f) {
    return 0;
  }
  float ax = fabs(x);
  float n = floor(ax / scale);
  float up = fma(n + 0.5f, scale, -ax) <= 0.0f ? 1.0f : 0.0f;
  int q = int(min(n + up, 127.0f));
  return x < 0.0f ? -q : q;
}
