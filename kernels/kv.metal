// KV cache append (docs/model.md, Mixer B and decision 4): nb rows of `heads` vectors of
// `dim` values go to positions pos0 .. pos0+nb-1. Used for attention K (after norm and
// RoPE), V, and the QSA index keys ik (heads = 1).
//   q8:  codes int8 [positions][heads][dim], scales f32 [positions][heads];
//        scale = f32(max|x| / 127), code = round(x / scale) (halves away from zero),
//        clamped to +-127; an all-zero vector gets scale 0 and codes 0.
//   f32: values [positions][heads][dim].
#include <metal_stdlib>
#include "params.h"
#include "sequence.h"

using namespace metal;

// One simdgroup per (row, head) vector: lane l holds elements l, l + 32, ... (dim <= 256).
// Grid: ceil(rows * heads / simdgroups) threadgroups of 32 x simdgroups threads.
kernel void kv_append_q8(
    constant KvAppendParams& p  [[buffer(0)]],
    device const float* x       [[buffer(1)]],
    device char* codes          [[buffer(2)]],
    device float* scales        [[buffer(3)]],
    uint tg                     [[threadgroup_position_in_grid]],
    ushort lane                 [[thread_index_in_simdgroup]],
    ushort sg                   [[simdgroup_index_in_threadgroup]],
    ushort nsg                  [[simdgroups_per_threadgroup]]) {
  const uint vec = tg * uint(nsg) + uint(sg);
  const uint heads = uint(p.heads);
  const uint dim = uint(p.dim);
  if (vec >= uint(p.rows) * heads) {
    return;  // whole simdgroup
  }
  const uint t = vec / heads;
  const uint h = vec % heads;
  device const float* src = seq_row(x, p.x_stride, t) + h * dim;
  const uint per = (dim + 31u) / 32u;
  float v[SEQ_MAX_PER_LANE];
  float m = 0.0f;
  for (uint i = 0; i < per; i++) {
    const uint e = lane + 32u * i;
    v[i] = e < dim ? src[e] : 0.0f;
    m = max(m, fabs(v[i]));
  }
  m = simd_max(m);
  const float scale = m / 127.0f;
  const ulong slot = ulong(p.pos0 + int(t)) * heads + h;
  device char* out = codes + slot * dim;
  for (uint i = 0; i < per; i++) {
    const uint e = lane + 32u * i;
    if (e < dim) {
      out[e] = char(seq_q8_code(v[i], scale));
    }
  }
  if (lane == 0) {
    scales[slot] = scale;
  }
}

// One thread per element.
kernel void kv_append_f32(
    constant KvAppendParams& p  [[buffer(0)]],
    device const float* x       [[buffer(1)]],
    device float* values        [[buffer(2)]],
    uint gid                    [[thread_position_in_grid]]) {
  const uint width = uint(p.heads * p.dim);
  if (gid >= uint(p.rows) * width) {
    return;
  }
  const uint t = gid / width;
  const uint e = gid % width;
  values[ulong(p.pos0 + int(t)) * width + e] = seq_row(x, p.x_stride, t)[e];
}
