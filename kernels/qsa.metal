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

// qsa_scores: simdgroups per threadgroup (each takes every 8th head of a round), heads one
// lane holds per round, and the floats of q staged per round (heads x di).
#define QSA_SCORE_SIMDGROUPS 8
#define QSA_HEADS_PER_LANE 4
#define QSA_Q_STAGE 4096
// Words of the staged q8 keys: 32 rows of up to di / 4 = 64 words, padded (qsa_key_stride).
#define QSA_KEY_STAGE (32 * 68)

// The int8 code in byte j of w, as a float: 2^23 + (code + 128) built in the mantissa, less
// 2^23 + 128 (exact). Integer ops and an add, where a conversion instruction runs at a
// quarter of the FMA rate or less.
inline float qsa_code(uint w, uint j) {
  return as_type<float>(((w >> (8u * j)) & 255u) ^ 0x4B000080u) - 8388736.0f;
}

// Words between staged key rows: a multiple of 4 (16-byte reads) that is odd in units of 4,
// so the 8 lanes of a 16-byte read phase hit distinct banks.
inline uint qsa_key_stride(uint words) { return ((words + 3u) & ~3u) | 4u; }

// Grid: (ceil((pos0 + nb) / 32), nb) threadgroups of 8 simdgroups; lane l scores position
// 32 x + l of row y. The block's 32 q8 keys are staged in threadgroup memory once (coalesced
// words); heads go in rounds of up to 8 x QSA_HEADS_PER_LANE, q of the round staged beside
// them, simdgroup g taking heads g, g + 8, ...: each head a dot product over di in ascending
// order (one fma chain, as before this layout), relu'd into threadgroup memory; simdgroup 0
// then adds the heads in ascending order. Every sum's order is fixed, so a score is the
// same bits whatever the grid (the top-k ranks scores exactly). Rows that attend everywhere
// and blocks past the row are skipped. ik: q8 codes [positions][di] with scales
// [positions], or f32 values [positions][di] (scales unused; read from device memory).
template <bool Q8>
[[max_total_threads_per_threadgroup(256)]] kernel void qsa_scores(
    constant QsaScoresParams& p  [[buffer(0)]],
    device const float* iq       [[buffer(1)]],
    device const float* iw       [[buffer(2)]],
    device const char* ik        [[buffer(3)]],
    device const float* ik_scale [[buffer(4)]],
    device float* scores         [[buffer(5)]],
    uint2 tg                     [[threadgroup_position_in_grid]],
    uint tid                     [[thread_index_in_threadgroup]],
    ushort lane                  [[thread_index_in_simdgroup]],
    ushort sg                    [[simdgroup_index_in_threadgroup]]) {
  threadgroup float4 qstage[QSA_Q_STAGE / 4];
  threadgroup uint4 kstage[QSA_KEY_STAGE / 4];
  threadgroup float relu_dot[QSA_SCORE_SIMDGROUPS * QSA_HEADS_PER_LANE][32];
  const uint t = tg.y;
  const uint block = tg.x * 32u;
  const uint count = uint(p.pos0 + int(t) + 1);
  if (count <= uint(p.topk) || block >= count) {
    return;  // uniform over the threadgroup
  }
  const uint nthreads = 32u * QSA_SCORE_SIMDGROUPS;
  const uint s = block + uint(lane);
  const bool valid = s < count;
  const uint di = uint(p.head_dim);
  const uint words = di / 4u;  // di % 4 == 0, di <= 256 (the host checks)
  const uint heads = uint(p.heads);
  // Heads a lane takes per round, so that a round's q fits the stage.
  const uint per_lane = min(uint(QSA_HEADS_PER_LANE), uint(QSA_Q_STAGE) / (QSA_SCORE_SIMDGROUPS * di));
  const uint round = QSA_SCORE_SIMDGROUPS * per_lane;
  device const float* q = seq_row(iq, p.iq_stride, t);
  device const float* w = seq_row(iw, p.iw_stride, t);
  threadgroup float* qs = (threadgroup float*)qstage;

  const uint kstride = qsa_key_stride(words);
  float scale = 1.0f;
  if (Q8) {
    // Row r of the stage: the key of position block + r, zero past its words or past count.
    threadgroup uint* ks = (threadgroup uint*)kstage;
    device const uint* src = (device const uint*)(ik + ulong(block) * di);
    for (uint i = tid; i < 32u * kstride; i += nthreads) {
      const uint r = i / kstride;
      const uint c = i - r * kstride;
      ks[i] = c < words && block + r < count ? src[r * words + c] : 0u;
    }
    scale = valid ? ik_scale[s] : 0.0f;
  }
  threadgroup const uint4* mykey = kstage + uint(lane) * (kstride / 4u);
  device const float4* kf32 = (device const float4*)((device const float*)ik + ulong(valid ? s : 0u) * di);

  float acc = 0.0f;
  for (uint h0 = 0; h0 < heads; h0 += round) {
    const uint nh = min(round, heads - h0);
    for (uint i = tid; i < nh * di; i += nthreads) {
      qs[i] = q[h0 * di + i];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    // This lane's heads of the round: h0 + sg + 8 j for j < mine.
    const uint mine = nh > uint(sg) ? min(per_lane, (nh - uint(sg) + QSA_SCORE_SIMDGROUPS - 1u) / QSA_SCORE_SIMDGROUPS) : 0u;
    float d[QSA_HEADS_PER_LANE];
    CK_UNROLL for (uint j = 0; j < QSA_HEADS_PER_LANE; j++) {
      d[j] = 0.0f;
    }
    if (Q8) {
      for (uint c = 0; c < (words + 3u) / 4u; c++) {
        const uint4 w4 = mykey[c];
        CK_UNROLL for (uint b = 0; b < 4u; b++) if (4u * c + b < words) {
          const uint i = 4u * c + b;
          const float4 k = float4(qsa_code(w4[b], 0u), qsa_code(w4[b], 1u), qsa_code(w4[b], 2u), qsa_code(w4[b], 3u));
          CK_UNROLL for (uint j = 0; j < QSA_HEADS_PER_LANE; j++) if (j < mine) {
            const float4 qv = qstage[(uint(sg) + QSA_SCORE_SIMDGROUPS * j) * words + i];
            d[j] = fma(qv.x, k.x, d[j]);
            d[j] = fma(qv.y, k.y, d[j]);
            d[j] = fma(qv.z, k.z, d[j]);
            d[j] = fma(qv.w, k.w, d[j]);
          }
        }
      }
    } else if (valid) {
      for (uint i = 0; i < words; i++) {
        const float4 k = kf32[i];
        CK_UNROLL for (uint j = 0; j < QSA_HEADS_PER_LANE; j++) if (j < mine) {
          const float4 qv = qstage[(uint(sg) + QSA_SCORE_SIMDGROUPS * j) * words + i];
          d[j] = fma(qv.x, k.x, d[j]);
          d[j] = fma(qv.y, k.y, d[j]);
          d[j] = fma(qv.z, k.z, d[j]);
          d[j] = fma(qv.w, k.w, d[j]);
        }
      }
    }
    CK_UNROLL for (uint j = 0; j < QSA_HEADS_PER_LANE; j++) if (j < mine) {
      relu_dot[uint(sg) + QSA_SCORE_SIMDGROUPS * j][lane] = max(d[j] * scale, 0.0f);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    // Heads in ascending order. The next round's staging may overwrite q now (every lane is
    // past its dot products); relu_dot is rewritten only after the next barrier, which
    // simdgroup 0 reaches once done here.
    if (sg == 0) {
      for (uint h = 0; h < nh; h++) {
        acc = fma(w[h0 + h], relu_dot[h][lane], acc);
      }
    }
  }
  if (sg == 0 && valid) {
    seq_row(scores, p.score_stride, t)[s] = acc / p.norm;
  }
}

template [[host_name("qsa_scores_q8")]] kernel decltype(qsa_scores<true>) qsa_scores<true>;
template [[host_name("qsa_scores_f32")]] kernel decltype(qsa_scores<false>) qsa_scores<false>;

// A uint whose order is the float order of the score (-0 counts as +0).
inline uint qsa_key(float f) {
  const uint u = as_type<uint>(f == 0.0f ? 0.0f : f);
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

// One threadgroup per row, 256 to 1024 threads (a multiple of 32). The k-th largest key is
// found by a radix select: four 8-bit passes, each a histogram of the keys that match the
// bytes found so far (threadgroup atomics; a simdgroup whose matching keys share a bin adds
// them at once), then the bin holding the k-th found by a prefix
// sum over the 256 bins, one per thread of the first 8 simdgroups, in descending bin order
// (SIMD prefix sums and 8 simdgroup totals). Two histograms alternate, so the next one is
// cleared while this one is scanned: three barriers a pass.
// Then the positions are compacted in ascending order: s is kept when its key is larger, or
// equal and among the first `need` equal keys (lower s wins ties), at slot
// (larger keys before s) + min(equal keys before s, need). Each thread owns a contiguous run
// of positions: it counts its run, one threadgroup prefix sum gives the counts before it,
// and it writes its run in order (one barrier, whatever the count).
// Writes sel [nb][topk] and counts [nb].
[[max_total_threads_per_threadgroup(1024)]] kernel void qsa_topk_f32(
    constant QsaTopkParams& p   [[buffer(0)]],
    device const float* scores  [[buffer(1)]],
    device int* sel             [[buffer(2)]],
    device int* counts          [[buffer(3)]],
    uint t                      [[threadgroup_position_in_grid]],
    uint tid                    [[thread_index_in_threadgroup]],
    uint nt                     [[threads_per_threadgroup]],
    ushort lane                 [[thread_index_in_simdgroup]],
    ushort sg                   [[simdgroup_index_in_threadgroup]]) {
  threadgroup atomic_uint hist[2][256];
  threadgroup uint found[2];
  threadgroup uint sg_greater[32];
  threadgroup uint sg_equal[32];
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

  for (uint i = tid; i < 256u; i += nt) {
    atomic_store_explicit(&hist[0][i], 0u, memory_order_relaxed);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint prefix = 0;
  uint mask = 0;
  uint need = topk;  // keys still to take at or below the current prefix
  for (uint pass = 0; pass < 4u; pass++) {
    const uint shift = 24u - 8u * pass;
    threadgroup atomic_uint* h = hist[pass & 1u];
    for (uint base = 0; base < count; base += nt) {  // the same trip count on every lane
      const uint s = base + tid;
      const uint key = s < count ? qsa_key(sc[s]) : 0u;
      const bool match = s < count && (key & mask) == prefix;
      const uint bin = (key >> shift) & 255u;
      // Equal scores (relu's zeros) put whole simdgroups in one bin: one add for all of them
      // rather than 32 on one address, which the hardware serializes.
      const uint first = simd_min(match ? bin : 256u);  // 256: no lane matches
      if (simd_all(!match || bin == first)) {
        const uint n = simd_sum(match ? 1u : 0u);
        if (lane == 0 && n > 0u) {
          atomic_fetch_add_explicit(&h[first], n, memory_order_relaxed);
        }
      } else if (match) {
        atomic_fetch_add_explicit(&h[bin], 1u, memory_order_relaxed);
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    // Thread i < 256 holds bin 255 - i: its inclusive sum counts the keys in bins >= its own.
    const uint bin = 255u - min(tid, 255u);
    const uint c = tid < 256u ? atomic_load_explicit(&h[bin], memory_order_relaxed) : 0u;
    const uint incl = simd_prefix_inclusive_sum(c);
    if (lane == 31) {
      sg_greater[sg] = incl;
    }
    for (uint i = tid; i < 256u; i += nt) {
      atomic_store_explicit(&hist[(pass + 1u) & 1u][i], 0u, memory_order_relaxed);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid < 256u) {
      uint above = incl - c;  // keys in bins above this one
      for (uint g = 0; g < uint(sg); g++) {
        above += sg_greater[g];
      }
      if (above < need && above + c >= need) {  // exactly one bin
        found[0] = prefix | (bin << shift);
        found[1] = need - above;
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    prefix = found[0];
    need = found[1];
    mask |= 255u << shift;
  }

  const uint run = (count + nt - 1u) / nt;
  const uint lo = min(count, tid * run);
  const uint hi = min(count, lo + run);
  uint greater = 0;
  uint equal = 0;
  for (uint s = lo; s < hi; s++) {
    const uint key = qsa_key(sc[s]);
    greater += key > prefix ? 1u : 0u;
    equal += key == prefix ? 1u : 0u;
  }
  uint greater_before = simd_prefix_exclusive_sum(greater);
  uint equal_before = simd_prefix_exclusive_sum(equal);
  if (lane == 31) {
    sg_greater[sg] = greater_before + greater;
    sg_equal[sg] = equal_before + equal;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint g = 0; g < uint(sg); g++) {
    greater_before += sg_greater[g];
    equal_before += sg_equal[g];
  }
  for (uint s = lo; s < hi; s++) {
    const uint key = qsa_key(sc[s]);
    if (key > prefix) {
      out[greater_before + min(equal_before, need)] = int(s);
      greater_before++;
    } else if (key == prefix) {
      if (equal_before < need) {
        out[greater_before + equal_before] = int(s);
      }
      equal_before++;
    }
  }
  if (tid == 0) {
    counts[t] = int(topk);
  }
}
