// QSA selection (docs/model.md, Mixer B, decision 6): index scores of each row against the
// cached index keys, then the top-k positions per row.
//   score(t, s) = sum_h iw_h relu(iq_h . ik_s) / sqrt(di), for s <= pos = pos0 + t;
//   row t attends to the topk highest scores (equal scores: lower s first), listed in
//   ascending s; when pos + 1 <= topk that is every position 0 .. pos.
// Scores go to a scratch [nb][score_stride] the host sizes for the longest row.
#include <metal_stdlib>
#include "params.h"
#include "sequence.h"

using namespace metal;

// Grid: (ceil((pos0 + nb) / 256), nb) threadgroups of 256 threads: thread (s, t). Rows
// that attend everywhere are skipped. ik: q8 codes [positions][di] with scales
// [positions], or f32 values [positions][di] (scales unused).
template <bool Q8>
kernel void qsa_scores(
    constant QsaScoresParams& p  [[buffer(0)]],
    device const float* iq       [[buffer(1)]],
    device const float* iw       [[buffer(2)]],
    device const char* ik        [[buffer(3)]],
    device const float* ik_scale [[buffer(4)]],
    device float* scores         [[buffer(5)]],
    uint2 gid                    [[thread_position_in_grid]]) {
  const uint s = gid.x;
  const uint t = gid.y;
  const int count = p.pos0 + int(t) + 1;
  if (t >= uint(p.rows) || count <= p.topk || s >= uint(count)) {
    return;
  }
  const uint di = uint(p.head_dim);
  device const float* q = seq_row(iq, p.iq_stride, t);
  device const float* w = seq_row(iw, p.iw_stride, t);
  float acc = 0.0f;
  if (Q8) {
    device const char* key = ik + ulong(s) * di;
    const float scale = ik_scale[s];
    for (int h = 0; h < p.heads; h++) {
      device const float* qh = q + uint(h) * di;
      float d = 0.0f;
      for (uint i = 0; i < di; i++) {
        d = fma(qh[i], float(key[i]), d);
      }
      acc = fma(w[h], max(d * scale, 0.0f), acc);
    }
  } else {
    device const float* key = (device const float*)ik + ulong(s) * di;
    for (int h = 0; h < p.heads; h++) {
      device const float* qh = q + uint(h) * di;
      float d = 0.0f;
      for (uint i = 0; i < di; i++) {
        d = fma(qh[i], key[i], d);
      }
      acc = fma(w[h], max(d, 0.0f), acc);
    }
  }
  seq_row(scores, p.score_stride, t)[s] = acc / p.norm;
}

template [[host_name("qsa_scores_q8")]] kernel decltype(qsa_scores<true>) qsa_scores<true>;
template [[host_name("qsa_scores_f32")]] kernel decltype(qsa_scores<false>) qsa_scores<false>;

// A uint whose order is the float order of the score (-0 counts as +0).
inline uint qsa_key(float f) {
  const uint u = as_type<uint>(f == 0.0f ? 0.0f : f);
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

// One threadgroup per row (any multiple of 32 threads up to 1024). The k-th largest key
// is found by a radix select (four 8-bit histogram passes in threadgroup memory); then the
// positions are compacted in ascending order: s is kept when its key is larger, or equal
// and among the first `need` equal keys (lower s wins ties). Its slot is
// (larger keys before s) + min(equal keys before s, need), from one packed prefix sum.
// Writes sel [nb][topk] and counts [nb].
kernel void qsa_topk_f32(
    constant QsaTopkParams& p   [[buffer(0)]],
    device const float* scores  [[buffer(1)]],
    device int* sel             [[buffer(2)]],
    device int* counts          [[buffer(3)]],
    uint t                      [[threadgroup_position_in_grid]],
    uint tid                    [[thread_index_in_threadgroup]],
    uint nt                     [[threads_per_threadgroup]],
    ushort lane                 [[thread_index_in_simdgroup]],
    ushort sg                   [[simdgroup_index_in_threadgroup]],
    ushort nsg                  [[simdgroups_per_threadgroup]]) {
  threadgroup atomic_uint hist[256];
  threadgroup uint found[2];
  threadgroup uint sg_total[32];
  const uint count = uint(p.pos0 + int(t) + 1);
  const uint topk = uint(p.topk);
  device int* out = sel + ulong(t) * topk;
  if (count <= topk) {  // uniform over the threadgroup
    for (uint i = tid; i < count; i += nt) {
      out[i] = int(i);
    }
    if (tid == 0) {
      counts[t] = int(count);
    }
    return;
  }
  device const float* sc = seq_row(scores, p.score_stride, t);

  uint prefix = 0;
  uint mask = 0;
  uint need = topk;  // keys still to take at or below the current prefix
  for (uint pass = 0; pass < 4u; pass++) {
    const uint shift = 24u - 8u * pass;
    for (uint i = tid; i < 256u; i += nt) {
      atomic_store_explicit(&hist[i], 0u, memory_order_relaxed);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = tid; s < count; s += nt) {
      const uint key = qsa_key(sc[s]);
      if ((key & mask) == prefix) {
        atomic_fetch_add_explicit(&hist[(key >> shift) & 255u], 1u, memory_order_relaxed);
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) {
      uint above = 0;
      uint bin = 0;
      for (int b = 255; b >= 0; b--) {
        const uint c = atomic_load_explicit(&hist[b], memory_order_relaxed);
        if (above + c >= need) {
          bin = uint(b);
          break;
        }
        above += c;
      }
      found[0] = prefix | (bin << shift);
      found[1] = need - above;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    prefix = found[0];
    need = found[1];
    mask |= 255u << shift;
  }

  uint greater_before = 0;
  uint equal_before = 0;
  for (uint b0 = 0; b0 < count; b0 += nt) {
    const uint s = b0 + tid;
    uint flags = 0;  // 1: key larger than the k-th; 1 << 16: equal to it
    if (s < count) {
      const uint key = qsa_key(sc[s]);
      flags = key > prefix ? 1u : (key == prefix ? 65536u : 0u);
    }
    const uint excl = simd_prefix_exclusive_sum(flags);
    const uint total = simd_sum(flags);
    if (lane == 0) {
      sg_total[sg] = total;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint before = excl;
    uint block = 0;
    for (uint g = 0; g < uint(nsg); g++) {
      const uint v = sg_total[g];
      before += g < uint(sg) ? v : 0u;
      block += v;
    }
    const uint gt = greater_before + (before & 0xffffu);
    const uint eq = equal_before + (before >> 16);
    if (flags == 1u) {
      out[gt + min(eq, need)] = int(s);
    } else if (flags == 65536u && eq < need) {
      out[gt + eq] = int(s);
    }
    greater_before += block & 0xffffu;
    equal_before += block >> 16;
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (tid == 0) {
    counts[t] = int(topk);
  }
}
