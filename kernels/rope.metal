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

// cos and sin of the f32 angle pos * inv_freq, reduced mod 2 pi (Cody-Waite) first.
inline float2 rope_cos_sin(float pos, float inv_freq) {
  const float angle = pos * inv_freq;
  const float n = rint(angle * ROPE_INV_TWO_PI);
  float r = fma(-n, ROPE_TWO_PI_HI, angle);
  r = fma(-n, ROPE_TWO_PI_LO, r);
  return float2(precise::cos(r), precise::sin(r));
}

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

  const float2 cs = rope_cos_sin(float(p.pos0 + int(t)), p.inv_freq[i]);
  const float c = cs.x;
  const float s = cs.y;

  const float x1 = x[i];
  const float x2 = x[i + half_rd];
  x[i] = fma(x1, c, -(x2 * s));
  x[i + half_rd] = fma(x2, c, x1 * s);
}

// The attention mixer's per-row preparation in one dispatch (lib/gpu/mixers.ts): q and k
// per-head RMSNorm (rms_norm_f32's arithmetic), RoPE on both (rope_neox_f32's), q and k
// written back in place, then K (normed, rotated) and V appended at pos0 + t
// (kv_append_q8's or kv_append_f32's): the same float operations in the same order, so the
// same bits as those four kernels. With ik_dim > 0 a row has one more vector, QSA's index
// key: normed in place (its own weight and width) and appended to the ik cache, not rotated
// (rms_norm_f32 + kv_append's bits; two dispatches a QSA layer fewer).
//
// One simdgroup per (row, vector); a row's vectors are its q heads, then k heads, then v
// heads, then the index key. Lane l holds elements l, l + 32, ... (head_dim <= 256); RoPE
// pairs (i, i + rd/2) may sit on other lanes, so the normed vector goes through threadgroup
// memory.
#define PREP_SG 4  // simdgroups per threadgroup (128 threads, the bound below)

template <bool Q8>
[[max_total_threads_per_threadgroup(128)]] kernel void attn_prep(
    constant AttnPrepParams& p  [[buffer(0)]],
    device float* q             [[buffer(1)]],
    device float* k             [[buffer(2)]],
    device const float* v       [[buffer(3)]],
    device const float* q_norm  [[buffer(4)]],
    device const float* k_norm  [[buffer(5)]],
    device char* k_data         [[buffer(6)]],
    device float* k_scales      [[buffer(7)]],
    device char* v_data         [[buffer(8)]],
    device float* v_scales      [[buffer(9)]],
    device float* ik            [[buffer(10)]],
    device const float* ik_norm [[buffer(11)]],
    device char* ik_data        [[buffer(12)]],
    device float* ik_scales     [[buffer(13)]],
    uint tg                     [[threadgroup_position_in_grid]],
    ushort lane                 [[thread_index_in_simdgroup]],
    ushort sg                   [[simdgroup_index_in_threadgroup]]) {
  threadgroup float buf[PREP_SG][SEQ_MAX_PER_LANE * 32];
  const uint H = uint(p.q_heads);
  const uint Hkv = uint(p.kv_heads);
  const uint per_row = H + 2u * Hkv + (p.ik_dim > 0 ? 1u : 0u);
  const uint vec = tg * PREP_SG + uint(sg);
  if (vec >= uint(p.rows) * per_row) {
    return;  // whole simdgroup; only simdgroup-scope sync follows
  }
  const uint t = vec / per_row;
  const uint u = vec % per_row;
  const bool is_q = u < H;
  const bool is_ik = u == H + 2u * Hkv;  // uniform per simdgroup, like every kind below
  const bool is_v = !is_ik && u >= H + Hkv;
  const uint h = is_q ? u : is_ik ? 0u : is_v ? u - H - Hkv : u - H;  // head within its kind
  const uint dim = is_ik ? uint(p.ik_dim) : uint(p.head_dim);
  device float* x = is_q ? seq_row(q, p.q_stride, t) + h * dim
                  : is_ik ? seq_row(ik, p.ik_stride, t)
                  : is_v ? (device float*)seq_row(v, p.v_stride, t) + h * dim
                         : seq_row(k, p.k_stride, t) + h * dim;
  const uint per = (dim + 31u) / 32u;
  float e[SEQ_MAX_PER_LANE];
  CK_UNROLL for (uint i = 0; i < SEQ_MAX_PER_LANE; i++) {
    const uint c = uint(lane) + 32u * i;
    e[i] = i < per && c < dim ? x[c] : 0.0f;
  }
  if (!is_v) {
    // RMSNorm, lane-strided squares then simd_sum, as rms_norm_f32.
    float ss = 0.0f;
    CK_UNROLL for (uint i = 0; i < SEQ_MAX_PER_LANE; i++) {
      if (i < per && uint(lane) + 32u * i < dim) {
        ss += e[i] * e[i];
      }
    }
    ss = simd_sum(ss);
    const float r = rsqrt(ss / float(dim) + p.eps);
    const float offset = p.centred != 0 ? 1.0f : 0.0f;
    device const float* w = is_q ? q_norm : is_ik ? ik_norm : k_norm;
    threadgroup float* b = buf[sg];
    CK_UNROLL for (uint i = 0; i < SEQ_MAX_PER_LANE; i++) {
      const uint c = uint(lane) + 32u * i;
      if (i < per && c < dim) {
        b[c] = e[i] * r * (offset + w[c]);
      }
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    // RoPE, one pair per lane at a time, as rope_neox_f32.
    const uint half_rd = uint(p.rot_dim) / 2u;
    const float pos = float(p.pos0 + int(t));
    for (uint i = uint(lane); i < (is_ik ? 0u : half_rd); i += 32u) {
      const float2 cs = rope_cos_sin(pos, p.inv_freq[i]);
      const float x1 = b[i];
      const float x2 = b[i + half_rd];
      b[i] = fma(x1, cs.x, -(x2 * cs.y));
      b[i + half_rd] = fma(x2, cs.x, x1 * cs.y);
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    CK_UNROLL for (uint i = 0; i < SEQ_MAX_PER_LANE; i++) {
      const uint c = uint(lane) + 32u * i;
      if (i < per && c < dim) {
        e[i] = b[c];
        x[c] = e[i];
      }
    }
    if (is_q) {
      return;
    }
  }
  // K, V or index-key append at position pos0 + t, as kv_append_q8 / kv_append_f32 (the ik
  // cache has one head).
  const ulong slot = ulong(p.pos0 + int(t)) * (is_ik ? 1u : Hkv) + h;
  device char* data = is_ik ? ik_data : is_v ? v_data : k_data;
  if (Q8) {
    float m = 0.0f;
    CK_UNROLL for (uint i = 0; i < SEQ_MAX_PER_LANE; i++) {
      if (i < per) {
        m = max(m, fabs(e[i]));
      }
    }
    m = simd_max(m);
    const float scale = m / 127.0f;
    device char* out = data + slot * dim;
    CK_UNROLL for (uint i = 0; i < SEQ_MAX_PER_LANE; i++) {
      const uint c = uint(lane) + 32u * i;
      if (i < per && c < dim) {
        out[c] = char(seq_q8_code(e[i], scale));
      }
    }
    if (lane == 0) {
      (is_ik ? ik_scales : is_v ? v_scales : k_scales)[slot] = scale;
    }
  } else {
    device float* out = (device float*)data + slot * dim;
    CK_UNROLL for (uint i = 0; i < SEQ_MAX_PER_LANE; i++) {
      const uint c = uint(lane) + 32u * i;
      if (i < per && c < dim) {
        out[c] = e[i];
      }
    }
  }
}

template [[host_name("attn_prep_q8")]] kernel decltype(attn_prep<true>) attn_prep<true>;
template [[host_name("attn_prep_f32")]] kernel decltype(attn_prep<false>) attn_prep<false>;
