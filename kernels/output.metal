// The end of a step: greedy argmax over the logits (with the top1 - top2 margin), and the
// MTP head's input fusion. Logits themselves are a matvec (matvec.metal).
#include <metal_stdlib>
#include "params.h"
#include "matvec.h"
#include "unroll.h"

using namespace metal;

#define ARGMAX_MAX_SG 32
// float4 loads a thread issues at once (a row of 151,936 logits is 600 KB for one threadgroup:
// with one load in flight a thread the H200 took 68 us).
#define ARGMAX_LOADS 4

// A candidate: best value and its id, and the second best value seen alongside.
struct Top2 {
  float best;
  int id;
  float second;
};

// Merges two candidates; ties on the best value go to the lower id, and the loser's best
// becomes a second (so equal maxima give margin 0).
inline Top2 top2_merge(Top2 a, Top2 b) {
  bool a_wins = a.best > b.best || (a.best == b.best && a.id < b.id);
  Top2 w = a_wins ? a : b;
  Top2 l = a_wins ? b : a;
  return Top2{w.best, w.id, max(w.second, l.best)};
}

// Value v at id i after the ids this thread saw (increasing): ties keep the earlier id.
inline void top2_consider(thread Top2& c, float v, int i) {
  if (v > c.best || c.id == 0x7FFFFFFF) {
    c.second = c.id == 0x7FFFFFFF ? -INFINITY : c.best;
    c.best = v;
    c.id = i;
  } else {
    c.second = max(c.second, v);
  }
}

inline Top2 top2_shuffle_xor(Top2 t, ushort mask) {
  return Top2{simd_shuffle_xor(t.best, mask), simd_shuffle_xor(t.id, mask), simd_shuffle_xor(t.second, mask)};
}

// One threadgroup per row (a multiple of 32 threads, at most 1024): lanes scan strided
// columns (float4s where the row allows), a butterfly merges each simdgroup, simdgroup 0 merges the simdgroups.
// ids[r] = argmax (ties: lowest id), margin[r] = top1 - top2.
kernel void argmax_f32(
    constant ArgmaxParams& p [[buffer(0)]],
    device const uchar* x    [[buffer(1)]],
    device int* ids          [[buffer(2)]],
    device float* margin     [[buffer(3)]],
    uint row                 [[threadgroup_position_in_grid]],
    uint t                   [[thread_index_in_threadgroup]],
    uint nt                  [[threads_per_threadgroup]],
    ushort sg                [[simdgroup_index_in_threadgroup]],
    ushort nsg               [[simdgroups_per_threadgroup]],
    ushort lane              [[thread_index_in_simdgroup]]) {
  threadgroup float tg_best[ARGMAX_MAX_SG];
  threadgroup int tg_id[ARGMAX_MAX_SG];
  threadgroup float tg_second[ARGMAX_MAX_SG];
  device const float* xr = (device const float*)(x + ulong(row) * p.x_stride);
  Top2 c = Top2{-INFINITY, 0x7FFFFFFF, -INFINITY};
  if (p.vec4 != 0u) {  // uniform: float4s, ARGMAX_LOADS of them in flight a thread
    device const float4* x4 = (device const float4*)xr;
    const int n4 = p.cols / 4;
    const int step = int(nt);
    for (int i0 = int(t); i0 < n4; i0 += ARGMAX_LOADS * step) {
      float4 v[ARGMAX_LOADS];
      CK_UNROLL for (int u = 0; u < ARGMAX_LOADS; u++) {
        const int i = i0 + u * step;
        v[u] = i < n4 ? x4[i] : float4(0.0f);
      }
      CK_UNROLL for (int u = 0; u < ARGMAX_LOADS; u++) {  // in increasing index order
        const int i = i0 + u * step;
        if (i < n4) {
          CK_UNROLL for (int k = 0; k < 4; k++) {
            top2_consider(c, v[u][k], 4 * i + k);
          }
        }
      }
    }
  } else {
    for (int i = int(t); i < p.cols; i += int(nt)) {
      top2_consider(c, xr[i], i);
    }
  }
  for (ushort mask = 16; mask > 0; mask >>= 1) {
    c = top2_merge(c, top2_shuffle_xor(c, mask));
  }
  if (lane == 0) {
    tg_best[sg] = c.best;
    tg_id[sg] = c.id;
    tg_second[sg] = c.second;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (sg == 0) {
    Top2 m = lane < nsg ? Top2{tg_best[lane], tg_id[lane], tg_second[lane]}
                        : Top2{-INFINITY, 0x7FFFFFFF, -INFINITY};
    for (ushort mask = 16; mask > 0; mask >>= 1) {
      m = top2_merge(m, top2_shuffle_xor(m, mask));
    }
    if (lane == 0 && int(row) < p.rows) {
      ids[row] = m.id;
      margin[row] = m.best - m.second;
    }
  }
}

// MTP input: y[r] = [RMSNorm(embed[ids[r]], en) | RMSNorm(h[r], hn)], zero-centred norms.
// One simdgroup per (row, half); the norm rescales what the same lane wrote.
template <typename T>
kernel void mtp_fuse(
    constant MtpFuseParams& p [[buffer(0)]],
    device const int* ids     [[buffer(1)]],
    device const uchar* table [[buffer(2)]],
    device const uchar* h     [[buffer(3)]],
    device const float* en    [[buffer(4)]],
    device const float* hn    [[buffer(5)]],
    device uchar* y           [[buffer(6)]],
    uint tg                   [[threadgroup_position_in_grid]],
    ushort sg                 [[simdgroup_index_in_threadgroup]],
    ushort lane               [[thread_index_in_simdgroup]]) {
  int unit = int(tg) * 2 + int(sg);  // two simdgroups per threadgroup: the row's halves
  int row = unit / 2;
  bool hidden = (unit & 1) != 0;
  if (row >= p.rows) {
    return;
  }
  int d = p.cols;
  device float* out = (device float*)(y + ulong(row) * p.y_stride) + (hidden ? d : 0);
  device const float* hr = (device const float*)(h + ulong(row) * p.h_stride);
  int t = ids[row];
  bool valid = t >= 0 && t < p.vocab;
  ulong total = ulong(p.vocab) * ulong(d);
  float ss = 0.0f;
  for (int c = int(lane); c < d; c += 32) {
    float v = hidden ? hr[c] : (valid ? Weights<T>::load1(table, total, ulong(t) * ulong(d) + ulong(c)) : NAN);
    out[c] = v;
    ss += v * v;
  }
  ss = simd_sum(ss);
  float r = rsqrt(ss / float(d) + p.eps);
  device const float* w = hidden ? hn : en;
  for (int c = int(lane); c < d; c += 32) {
    out[c] = out[c] * r * (1.0f + w[c]);
  }
}

template [[host_name("mtp_fuse_f32_f32")]] kernel decltype(mtp_fuse<float>) mtp_fuse<float>;
template [[host_name("mtp_fuse_bf16_f32")]] kernel decltype(mtp_fuse<bfloat>) mtp_fuse<bfloat>;
template [[host_name("mtp_fuse_f16_f32")]] kernel decltype(mtp_fuse<half>) mtp_fuse<half>;
template [[host_name("mtp_fuse_q4_f32")]] kernel decltype(mtp_fuse<uchar>) mtp_fuse<uchar>;
