// RoPE, NeoX rotate-half (docs/model.md, Mixer B): for i < rd/2 the pair (x_i, x_{i+rd/2})
// of every q and k head turns by pos * theta^(-2i/rd); dims >= rd are untouched.
//
// Angles follow the f32 rule of docs/model.md (as transformers for Qwen models): the host
// passes inv_freq in f32 (lib/model/rope.ts) and the angle is the one f32 product
// f32(pos) * inv_freq[i], exactly as the reference rounds it. Only the sin/cos of that f32
// angle are computed more precisely: it is reduced mod 2 pi with a two-part 2 pi
// (Cody-Waite) before the precise f32 sin/cos.
#include <metal_stdlib>
#include "params.h"
#include "sequence.h"

using namespace metal;

#define ROPE_TWO_PI_HI 6.28318548202514648f       // f32(2 pi)
#define ROPE_TWO_PI_LO -1.74845553146951720e-7f  // f32(2 pi - ROPE_TWO_PI_HI)
#define ROPE_INV_TWO_PI 0.159154936671257019f

// One thread per (row, head, pair); q heads first, then k heads. In place.
kernel void rope_neox_f32(
    constant RopeParams& p  [[buffer(0)]],
    device float* q         [[buffer(1)]],
    device float* k         [[buffer(2)]],
    uint gid                [[thread_position_in_grid]]) {
  const uint half_rd = uint(p.rot_dim) / 2u;
  const uint heads = uint(p.q_heads + p.k_heads);
  if (gid >= uint(p.rows) * heads * half_rd) {
    return;
  }
  const uint i = gid % half_rd;
  const uint hh = (gid / half_rd) % heads;
  const uint t = gid / (half_rd * heads);
  device float* x = hh < uint(p.q_heads)
      ? seq_row(q, p.q_stride, t) + hh * uint(p.head_dim)
      : seq_row(k, p.k_stride, t) + (hh - uint(p.q_heads)) * uint(p.head_dim);

  const float pos = float(p.pos0 + int(t));
  const float angle = pos * p.inv_freq[i];
  const float n = rint(angle * ROPE_INV_TWO_PI);
  float r = fma(-n, ROPE_TWO_PI_HI, angle);
  r = fma(-n, ROPE_TWO_PI_LO, r);
  const float c = precise::cos(r);
  const float s = precise::sin(r);

  const float x1 = x[i];
  const float x2 = x[i + half_rd];
  x[i] = fma(x1, c, -(x2 * s));
  x[i + half_rd] = fma(x2, c, x1 * s);
}
