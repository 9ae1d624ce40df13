// Sampling over the logits (docs/sampling.md; the oracle is lib/reference/sampling.ts):
// per row, y = penalized(z) / T, then top-k, top-p and min-p as thresholds on y, a draw by
// inverse CDF in token-id order with the counter-based uniform u(seed, position, draw),
// optionally the verification of a draft (speculative sampling) and logprobs of the raw
// logits. One threadgroup per row; thresholds are found by bisection over the order-
// preserving integer keys of y, so ties at a threshold are kept, as in the reference.
#include <metal_stdlib>
#include "params.h"

using namespace metal;

#define SAMPLE_MAX_SG 32
// top_p candidates bisected in threadgroup memory (more: the bisection scans the vocabulary).
#define SAMPLE_LIST 2048
#define SAMPLE_FLAG_PENALTIES 1u
#define SAMPLE_FLAG_VERIFY 2u
#define SAMPLE_FLAG_PROBS 4u
// Draw indices (lib/reference/sampling.ts Draw).
#define SAMPLE_DRAW_ACCEPT 1u
#define SAMPLE_DRAW_RESIDUAL 2u

// splitmix64's output function.
inline ulong sample_mix64(ulong z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9UL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBUL;
  return z ^ (z >> 31);
}

// u in [0, 1), 24 bits: h = mix(seed + G); h = mix(h + position + G); h = mix(h + draw + G).
inline float sample_uniform(uint seed_lo, uint seed_hi, uint position, uint draw) {
  const ulong g = 0x9E3779B97F4A7C15UL;
  ulong h = sample_mix64(((ulong(seed_hi) << 32) | ulong(seed_lo)) + g);
  h = sample_mix64(h + ulong(position) + g);
  h = sample_mix64(h + ulong(draw) + g);
  return float(uint(h >> 40)) * (1.0f / 16777216.0f);
}

// Order-preserving key of a float: a < b  <=>  key(a) < key(b).
inline uint sample_key(float f) {
  uint b = as_type<uint>(f);
  return (b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u);
}

// Threadgroup reductions: every thread gets the result; partial sums are added in simdgroup
// order, so the result does not depend on scheduling.
inline float sample_sum(float v, threadgroup float* part, ushort sg, ushort nsg, ushort lane) {
  v = simd_sum(v);
  if (lane == 0) {
    part[sg] = v;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float total = 0.0f;
  for (ushort j = 0; j < nsg; j++) {
    total += part[j];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return total;
}

inline int sample_count(int v, threadgroup int* part, ushort sg, ushort nsg, ushort lane) {
  v = simd_sum(v);
  if (lane == 0) {
    part[sg] = v;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  int total = 0;
  for (ushort j = 0; j < nsg; j++) {
    total += part[j];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return total;
}

inline int sample_min_int(int v, threadgroup int* part, ushort sg, ushort nsg, ushort lane) {
  v = simd_min(v);
  if (lane == 0) {
    part[sg] = v;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  int m = part[0];
  for (ushort j = 1; j < nsg; j++) {
    m = min(m, part[j]);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return m;
}

inline uint sample_max_uint(uint v, threadgroup uint* part, ushort sg, ushort nsg, ushort lane) {
  v = simd_max(v);
  if (lane == 0) {
    part[sg] = v;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint m = part[0];
  for (ushort j = 1; j < nsg; j++) {
    m = max(m, part[j]);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return m;
}

// The best (value, id) pair: larger value first, lower id on a tie.
struct SampleTop {
  float v;
  int id;
};

inline SampleTop sample_better(SampleTop a, SampleTop b) {
  return (a.v > b.v || (a.v == b.v && a.id < b.id)) ? a : b;
}

inline SampleTop sample_best(SampleTop c, threadgroup float* pv, threadgroup int* pi, ushort sg, ushort nsg, ushort lane) {
  for (ushort mask = 16; mask > 0; mask >>= 1) {
    c = sample_better(c, SampleTop{simd_shuffle_xor(c.v, mask), simd_shuffle_xor(c.id, mask)});
  }
  if (lane == 0) {
    pv[sg] = c.v;
    pi[sg] = c.id;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  SampleTop m = SampleTop{pv[0], pi[0]};
  for (ushort j = 1; j < nsg; j++) {
    m = sample_better(m, SampleTop{pv[j], pi[j]});
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return m;
}

// Inverse CDF in id order over weights w (not normalized): the lowest id whose running sum
// exceeds u * total. Threads own contiguous chunks; an exclusive scan of the chunk sums
// finds the chunk, its thread walks it. Rounding fallbacks: the chunk's last positive
// weight, else the highest id with a positive weight.
inline int sample_draw(device const float* w, int n, float u, uint t, uint nt, threadgroup float* part, threadgroup int* ipart,
                       ushort sg, ushort nsg, ushort lane) {
  int chunk = (n + int(nt) - 1) / int(nt);
  int lo = min(n, int(t) * chunk);
  int hi = min(n, lo + chunk);
  float s = 0.0f;
  int last = -1;
  for (int i = lo; i < hi; i++) {
    if (w[i] > 0.0f) {
      s += w[i];
      last = i;
    }
  }
  float before = simd_prefix_exclusive_sum(s);
  float sgTotal = simd_sum(s);
  if (lane == 0) {
    part[sg] = sgTotal;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float total = 0.0f;
  float offset = 0.0f;
  for (ushort j = 0; j < nsg; j++) {
    if (j == sg) {
      offset = total;
    }
    total += part[j];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float prefix = offset + before;
  float target = u * total;
  int found = 0x7FFFFFFF;
  if (last >= 0 && target >= prefix && target < prefix + s) {
    float acc = prefix;
    found = last;
    for (int i = lo; i < hi; i++) {
      if (w[i] > 0.0f) {
        acc += w[i];
        if (target < acc) {
          found = i;
          break;
        }
      }
    }
  }
  int pick = sample_min_int(found, ipart, sg, nsg, lane);
  int top = -sample_min_int(-last, ipart, sg, nsg, lane);
  return pick != 0x7FFFFFFF ? pick : top;
}

// One threadgroup per row r < p.rows (a multiple of 32 threads, at most 1024).
//   x: logits rows; counts: [all | gen] token counts (flag 1); extras: tokens counted as
//   generated on top of counts (row r: extras_base + r of them); drafts/q: the draft token and
//   the distribution it was drawn from, per verifying row (flag 2); work: [rows][2][vocab];
//   ids: the drawn token; accepted: 1 when a verifying row kept its draft; probs: the row's
//   distribution (flag 4); lp: [rows][21] the drawn token's logprob then the top_n
//   alternatives', lp_ids: [rows][20] their ids (top_n >= 0).
kernel void sample_f32(
    constant SampleParams& p   [[buffer(0)]],
    device const uchar* x      [[buffer(1)]],
    device const int* counts   [[buffer(2)]],
    device const int* extras   [[buffer(3)]],
    device const int* drafts   [[buffer(4)]],
    device const float* q      [[buffer(5)]],
    device float* work         [[buffer(6)]],
    device int* ids            [[buffer(7)]],
    device int* accepted       [[buffer(8)]],
    device float* probs        [[buffer(9)]],
    device float* lp           [[buffer(10)]],
    device int* lp_ids         [[buffer(11)]],
    uint row                   [[threadgroup_position_in_grid]],
    uint t                     [[thread_index_in_threadgroup]],
    uint nt                    [[threads_per_threadgroup]],
    ushort sg                  [[simdgroup_index_in_threadgroup]],
    ushort nsg                 [[simdgroups_per_threadgroup]],
    ushort lane                [[thread_index_in_simdgroup]]) {
  threadgroup float part[SAMPLE_MAX_SG];
  threadgroup int ipart[SAMPLE_MAX_SG];
  threadgroup float pv[SAMPLE_MAX_SG];
  threadgroup int pi[SAMPLE_MAX_SG];
  threadgroup uint upart[SAMPLE_MAX_SG];
  threadgroup atomic_uint hist[256];
  threadgroup uint found[2];
  threadgroup uint list_key[SAMPLE_LIST];
  threadgroup float list_e[SAMPLE_LIST];
  if (int(row) >= p.rows) {
    return;
  }
  const int n = p.vocab;
  device const float* z = (device const float*)(x + ulong(row) * p.x_stride);
  device float* y = work + ulong(row) * ulong(2 * n);
  device float* w = y + n;
  const bool pen = (p.flags & SAMPLE_FLAG_PENALTIES) != 0u;
  const int nex = p.extras_base + int(row);
  const uint position = p.position + row;

  // Penalties and temperature (f32, op by op as the reference), and the argmax of y.
  SampleTop c = SampleTop{-INFINITY, 0x7FFFFFFF};
  for (int i = int(t); i < n; i += int(nt)) {
    float v = z[i];
    if (pen) {
      int extra = 0;
      for (int j = 0; j < nex; j++) {
        extra += extras[j] == i ? 1 : 0;
      }
      int all = counts[i] + extra;
      int gen = counts[n + i] + extra;
      if (all > 0) {
        v = v > 0.0f ? v / p.repetition : v * p.repetition;
      }
      if (gen > 0) {
        v = v - (float(gen) * p.frequency + p.presence);
      }
    }
    if (p.temperature > 0.0f) {
      v = v / p.temperature;
    }
    y[i] = v;
    if (v > c.v || c.id == 0x7FFFFFFF) {
      c = SampleTop{v, i};
    }
  }
  SampleTop top = sample_best(c, pv, pi, sg, nsg, lane);
  const float m = top.v;
  const bool verify = (p.flags & SAMPLE_FLAG_VERIFY) != 0u && int(row) < p.draft_rows;

  int chosen;
  int acc = 0;
  if (p.temperature <= 0.0f) {
    // One-hot on the argmax: a draft survives only if it is the argmax.
    chosen = top.id;
    if (verify) {
      acc = drafts[row] == top.id ? 1 : 0;
    }
    if ((p.flags & SAMPLE_FLAG_PROBS) != 0u) {
      for (int i = int(t); i < n; i += int(nt)) {
        probs[ulong(row) * ulong(n) + ulong(i)] = i == top.id ? 1.0f : 0.0f;
      }
    }
  } else {
    // top_k: the key of the k-th largest value, by a radix select (four 8-bit histogram
    // passes, as qsa_topk_f32): the largest K with #{key(y) >= K} >= k.
    uint kk = 0u;
    if (p.top_k > 0 && p.top_k < n) {
      uint prefix = 0u;
      uint mask = 0u;
      uint need = uint(p.top_k);
      for (uint pass = 0; pass < 4u; pass++) {
        const uint shift = 24u - 8u * pass;
        for (uint i = t; i < 256u; i += nt) {
          atomic_store_explicit(&hist[i], 0u, memory_order_relaxed);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int i = int(t); i < n; i += int(nt)) {
          const uint key = sample_key(y[i]);
          if ((key & mask) == prefix) {
            atomic_fetch_add_explicit(&hist[(key >> shift) & 255u], 1u, memory_order_relaxed);
          }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (t == 0) {
          uint above = 0u;
          uint bin = 0u;
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
        threadgroup_barrier(mem_flags::mem_threadgroup);
      }
      kk = prefix;
    }
    for (int i = int(t); i < n; i += int(nt)) {
      w[i] = sample_key(y[i]) >= kk ? exp(y[i] - m) : 0.0f;
    }
    // top_p: the largest key K whose set {key(y) >= K} holds top_p of the kept mass, by
    // bisection over the keys. A token with w < (1 - top_p) W / n can never be in the
    // nucleus (the tokens above it hold more than top_p of W), so when few tokens are above
    // half that bound the bisection runs over them in threadgroup memory; for K at or below
    // the largest excluded key the answer is known to be yes.
    uint kp = kk;
    if (p.top_p < 1.0f) {
      float mass = 0.0f;
      for (int i = int(t); i < n; i += int(nt)) {
        mass += w[i];
      }
      const float W = sample_sum(mass, part, sg, nsg, lane);
      const float target = p.top_p * W;
      const float bound = (1.0f - p.top_p) * W / (2.0f * float(n));
      // Candidates counted per contiguous chunk of ids, so that one scan places each
      // thread's candidates in the list (in id order).
      threadgroup_barrier(mem_flags::mem_device);
      const int chunk = (n + int(nt) - 1) / int(nt);
      const int lo = min(n, int(t) * chunk);
      const int hi = min(n, lo + chunk);
      int cnt = 0;
      uint max_out = 0u;
      for (int i = lo; i < hi; i++) {
        if (w[i] > 0.0f) {
          if (w[i] >= bound) {
            cnt++;
          } else {
            max_out = max(max_out, sample_key(y[i]));
          }
        }
      }
      const uint excl = simd_prefix_exclusive_sum(uint(cnt));
      const uint sg_cnt = simd_sum(uint(cnt));
      if (lane == 0) {
        upart[sg] = sg_cnt;
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      int at = int(excl);
      int listed = 0;
      for (ushort g = 0; g < nsg; g++) {
        at += g < sg ? int(upart[g]) : 0;
        listed += int(upart[g]);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      max_out = sample_max_uint(max_out, upart, sg, nsg, lane);
      kp = 0u;
      if (listed <= SAMPLE_LIST) {
        for (int i = lo; i < hi; i++) {
          if (w[i] > 0.0f && w[i] >= bound) {
            list_key[at] = sample_key(y[i]);
            list_e[at] = w[i];
            at++;
          }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int b = 31; b >= 0; b--) {
          const uint cand = kp | (1u << uint(b));
          if (cand <= max_out) {
            kp = cand;  // an excluded token is at or above cand: the answer is above it
            continue;
          }
          float s = 0.0f;
          for (int j = int(t); j < listed; j += int(nt)) {
            s += list_key[j] >= cand ? list_e[j] : 0.0f;
          }
          if (sample_sum(s, part, sg, nsg, lane) >= target) {
            kp = cand;
          }
        }
      } else {
        for (int b = 31; b >= 0; b--) {
          const uint cand = kp | (1u << uint(b));
          float s = 0.0f;
          for (int i = int(t); i < n; i += int(nt)) {
            s += sample_key(y[i]) >= cand ? w[i] : 0.0f;
          }
          if (sample_sum(s, part, sg, nsg, lane) >= target) {
            kp = cand;
          }
        }
      }
    }
    // min_p, on exp(y - max) (the max is always kept, so this is p / p_max).
    float mass = 0.0f;
    for (int i = int(t); i < n; i += int(nt)) {
      float e = w[i];
      float keep = (sample_key(y[i]) >= kp && e >= p.min_p) ? e : 0.0f;
      w[i] = keep;
      mass += keep;
    }
    const float total = sample_sum(mass, part, sg, nsg, lane);
    threadgroup_barrier(mem_flags::mem_device);
    if ((p.flags & SAMPLE_FLAG_PROBS) != 0u) {
      for (int i = int(t); i < n; i += int(nt)) {
        probs[ulong(row) * ulong(n) + ulong(i)] = w[i] / total;
      }
    }
    if (verify) {
      // Accept x with probability min(1, p(x) / q(x)); else draw from max(0, p - q).
      device const float* qr = q + ulong(row) * ulong(n);
      int d = drafts[row];
      float ua = sample_uniform(p.seed_lo, p.seed_hi, position, SAMPLE_DRAW_ACCEPT);
      acc = ua * qr[d] < w[d] / total ? 1 : 0;
      if (acc != 0) {
        chosen = d;
      } else {
        float rs = 0.0f;
        for (int i = int(t); i < n; i += int(nt)) {
          float r = max(0.0f, w[i] / total - qr[i]);
          y[i] = r;
          rs += r;
        }
        float rtotal = sample_sum(rs, part, sg, nsg, lane);
        threadgroup_barrier(mem_flags::mem_device);
        float ur = sample_uniform(p.seed_lo, p.seed_hi, position, SAMPLE_DRAW_RESIDUAL);
        chosen = sample_draw(rtotal > 0.0f ? y : w, n, ur, t, nt, part, ipart, sg, nsg, lane);
      }
    } else {
      float u = sample_uniform(p.seed_lo, p.seed_hi, position, p.draw);
      chosen = sample_draw(w, n, u, t, nt, part, ipart, sg, nsg, lane);
    }
  }
  if (t == 0) {
    ids[row] = chosen;
    accepted[row] = acc;
  }

  // Logprobs of the raw logits: log_softmax(z) at the drawn token and the top_n best.
  if (p.top_n >= 0) {
    SampleTop zc = SampleTop{-INFINITY, 0x7FFFFFFF};
    for (int i = int(t); i < n; i += int(nt)) {
      if (z[i] > zc.v || zc.id == 0x7FFFFFFF) {
        zc = SampleTop{z[i], i};
      }
    }
    const float zm = sample_best(zc, pv, pi, sg, nsg, lane).v;
    float s = 0.0f;
    for (int i = int(t); i < n; i += int(nt)) {
      s += exp(z[i] - zm);
    }
    const float lse = zm + log(sample_sum(s, part, sg, nsg, lane));
    device float* lr = lp + ulong(row) * 21ul;
    device int* lr_ids = lp_ids + ulong(row) * 20ul;
    if (t == 0) {
      lr[0] = z[chosen] - lse;
    }
    SampleTop prev = SampleTop{INFINITY, -1};
    for (int k = 0; k < p.top_n; k++) {
      SampleTop bc = SampleTop{-INFINITY, 0x7FFFFFFF};
      for (int i = int(t); i < n; i += int(nt)) {
        float v = z[i];
        bool after = v < prev.v || (v == prev.v && i > prev.id);
        if (after && (v > bc.v || bc.id == 0x7FFFFFFF)) {
          bc = SampleTop{v, i};
        }
      }
      prev = sample_best(bc, pv, pi, sg, nsg, lane);
      if (t == 0) {
        lr[1 + k] = prev.v - lse;
        lr_ids[k] = prev.id;
      }
    }
  }
}
