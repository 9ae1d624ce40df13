// Softmax attention over cached K/V (docs/model.md, Mixer B): row t (position pos0 + t)
// and query head h read KV head floor(h * Hkv / H) at either every position s <= pos0 + t
// (causal, dense) or the positions of its QSA list; o = softmax(q k^T * scale) v with
// scale = 1/sqrt(hd). The cache holds the rows of this batch already (K, V are appended
// before attention), so prefill rows are causal within the chunk and against the past.
//
// One simdgroup per (row, head, split of positions). Lane l scores position b + l of each
// block of 32 (a whole hd dot product per lane), the block's max and sum are SIMD
// reductions (online softmax), and for the V sum the lanes own dims l, l + 32, ... and
// read the block's weights from threadgroup memory: four sync points per 32 positions.
// With one split the result goes to o; with more, each split writes (max, sum, acc[hd])
// and attn_combine_f32 merges them (long-context decode). With `gated`, whichever writes o
// applies the mixer's output gate o / (1 + e^-gate), ew_sigmoid_mul_f32's arithmetic.
#include <metal_stdlib>
#include "params.h"
#include "sequence.h"

using namespace metal;

// Loops over head dims run to constants with a guard, so acc[] stays in registers (a runtime
// bound spilled it to local memory on the H200). For the V sum a lane owns four consecutive
// dims per 128 (hd % 4 == 0): one 4-byte (q8) or 16-byte (f32) load per position instead of
// one byte per dim, and ATTN_V_UNROLL positions' loads in flight at once.
#define ATTN_MAX_SIMDGROUPS 8
#define ATTN_MAX_HEAD_DIM 256
#define ATTN_V4 (ATTN_MAX_HEAD_DIM / 128)
#define ATTN_V_UNROLL 4

// Grid: (ceil(H / simdgroups), nb, splits) threadgroups of 32 x simdgroups threads.
// K/V: q8 codes [positions][Hkv][hd] with scales [positions][Hkv], or f32 values (the
// scale bindings unused). list [nb][list_stride] and counts [nb] when use_list.
// Partials [nb][H][splits][hd + 2] when splits > 1.
template <bool Q8>
[[max_total_threads_per_threadgroup(256)]] kernel void attn_rows(
    constant AttentionParams& p [[buffer(0)]],
    device const float* q       [[buffer(1)]],
    device const char* kc       [[buffer(2)]],
    device const float* ks      [[buffer(3)]],
    device const char* vc       [[buffer(4)]],
    device const float* vs      [[buffer(5)]],
    device const int* list      [[buffer(6)]],
    device const int* counts    [[buffer(7)]],
    device float* o             [[buffer(8)]],
    device float* part          [[buffer(9)]],
    device const float* gate    [[buffer(10)]],
    uint3 tg                    [[threadgroup_position_in_grid]],
    ushort lane                 [[thread_index_in_simdgroup]],
    ushort sg                   [[simdgroup_index_in_threadgroup]],
    ushort nsg                  [[simdgroups_per_threadgroup]]) {
  threadgroup float qbuf[ATTN_MAX_SIMDGROUPS][ATTN_MAX_HEAD_DIM];
  threadgroup float wbuf[ATTN_MAX_SIMDGROUPS][32];
  threadgroup int sbuf[ATTN_MAX_SIMDGROUPS][32];
  const uint H = uint(p.heads);
  const uint h = tg.x * uint(nsg) + uint(sg);
  const uint t = tg.y;
  const uint z = tg.z;
  if (h >= H) {
    return;  // whole simdgroup; only simdgroup-scope sync follows
  }
  const uint hd = uint(p.head_dim);
  const uint Hkv = uint(p.kv_heads);
  const uint kvh = h * Hkv / H;
  const uint count = p.use_list != 0 ? uint(counts[t]) : uint(p.pos0 + int(t) + 1);
  const uint begin = z * uint(p.split_len);
  const uint end = min(count, begin + uint(p.split_len));
  device const int* positions = list + ulong(t) * uint(p.list_stride);
  threadgroup float* qs = qbuf[sg];
  threadgroup float* ws = wbuf[sg];
  threadgroup int* ss = sbuf[sg];

  device const float* qrow = seq_row(q, p.q_stride, t) + h * hd;
  for (uint d = lane; d < hd; d += 32u) {
    qs[d] = qrow[d];
  }
  simdgroup_barrier(mem_flags::mem_threadgroup);

  // Lane dims d = 4 * lane + 128 * m (.. + 3) for m < ATTN_V4 while d < hd.
  float4 acc[ATTN_V4];
  CK_UNROLL for (uint m = 0; m < ATTN_V4; m++) {
    acc[m] = float4(0.0f);
  }
  float mx = -INFINITY;
  float sum = 0.0f;
  for (uint b = begin; b < end; b += 32u) {
    const uint j = b + uint(lane);
    const bool valid = j < end;
    const uint s = valid ? (p.use_list != 0 ? uint(positions[j]) : j) : 0u;
    const ulong slot = ulong(s) * Hkv + kvh;
    float logit = -INFINITY;
    if (valid) {
      float d = 0.0f;
      if (Q8 && (hd & 15u) == 0u) {
        // 16 codes per load (a lane reads a whole K row: scalar char4 loads left it waiting
        // on 32 round trips per position); the dot product adds in the same order.
        device const int4* k16 = (device const int4*)(kc + slot * hd);
        int4 kw[ATTN_MAX_HEAD_DIM / 16];
        CK_UNROLL for (uint i = 0; i < ATTN_MAX_HEAD_DIM / 16u; i++) {
          kw[i] = i < hd / 16u ? k16[i] : int4(0);  // every load of the row goes out at once
        }
        CK_UNROLL for (uint i = 0; i < ATTN_MAX_HEAD_DIM / 16u; i++) if (i < hd / 16u) {
          const int4 w = kw[i];
          for (uint c = 0; c < 4u; c++) {
            const float4 kv = float4(as_type<char4>(w[c]));
            const uint e = 16u * i + 4u * c;
            d += dot(float4(qs[e], qs[e + 1u], qs[e + 2u], qs[e + 3u]), kv);
          }
        }
        d *= ks[slot];
      } else if (Q8) {
        device const char4* k4 = (device const char4*)(kc + slot * hd);
        for (uint i = 0; i < hd / 4u; i++) {
          const float4 kv = float4(k4[i]);
          d += dot(float4(qs[4u * i], qs[4u * i + 1u], qs[4u * i + 2u], qs[4u * i + 3u]), kv);
        }
        d *= ks[slot];
      } else {
        device const float4* k4 = (device const float4*)((device const float*)kc + slot * hd);
        for (uint i = 0; i < hd / 4u; i++) {
          d += dot(float4(qs[4u * i], qs[4u * i + 1u], qs[4u * i + 2u], qs[4u * i + 3u]), k4[i]);
        }
      }
      logit = d * p.scale;
    }
    const float mnew = max(mx, simd_max(logit));
    const float corr = exp(mx - mnew);
    const float w = valid ? exp(logit - mnew) : 0.0f;
    sum = sum * corr + simd_sum(w);
    ws[lane] = Q8 && valid ? w * vs[slot] : w;
    ss[lane] = int(s);
    simdgroup_barrier(mem_flags::mem_threadgroup);
    CK_UNROLL for (uint m = 0; m < ATTN_V4; m++) {
      acc[m] *= corr;
    }
    const uint n = min(32u, end - b);
    for (uint j0 = 0; j0 < n; j0 += ATTN_V_UNROLL) {
      float wj[ATTN_V_UNROLL];
      float4 v[ATTN_V_UNROLL][ATTN_V4];
      CK_UNROLL for (uint u = 0; u < ATTN_V_UNROLL; u++) {
        const uint jj = min(j0 + u, n - 1u);
        wj[u] = ws[jj];
        const ulong base = (ulong(ss[jj]) * Hkv + kvh) * hd;
        CK_UNROLL for (uint m = 0; m < ATTN_V4; m++) {
          const uint d = 4u * uint(lane) + 128u * m;
          v[u][m] = d >= hd ? float4(0.0f)
                  : Q8 ? float4(*((device const char4*)(vc + base + d)))
                       : *((device const float4*)((device const float*)vc + base + d));
        }
      }
      // Positions in order, each dim's sum as one fma per position.
      CK_UNROLL for (uint u = 0; u < ATTN_V_UNROLL; u++) if (j0 + u < n) {
        CK_UNROLL for (uint m = 0; m < ATTN_V4; m++) {
          acc[m] = fma(float4(wj[u]), v[u][m], acc[m]);
        }
      }
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    mx = mnew;
  }

  if (p.splits == 1) {
    device float* out = seq_row(o, p.o_stride, t) + h * hd;
    device const float* g = seq_row(gate, p.gate_stride, t) + h * hd;
    const float inv = 1.0f / sum;
    CK_UNROLL for (uint m = 0; m < ATTN_V4; m++) {
      const uint d = 4u * uint(lane) + 128u * m;
      if (d < hd) {
        for (uint c = 0; c < 4u; c++) {
          const float y = acc[m][c] * inv;
          out[d + c] = p.gated != 0 ? y / (1.0f + exp(-g[d + c])) : y;
        }
      }
    }
  } else {
    device float* pr = part + ((ulong(t) * H + h) * uint(p.splits) + z) * (hd + 2u);
    if (lane == 0) {
      pr[0] = mx;
      pr[1] = sum;
    }
    CK_UNROLL for (uint m = 0; m < ATTN_V4; m++) {
      const uint d = 4u * uint(lane) + 128u * m;
      if (d < hd) {
        for (uint c = 0; c < 4u; c++) {
          pr[2u + d + c] = acc[m][c];
        }
      }
    }
  }
}

template [[host_name("attn_rows_q8")]] kernel decltype(attn_rows<true>) attn_rows<true>;
template [[host_name("attn_rows_f32")]] kernel decltype(attn_rows<false>) attn_rows<false>;

// o[t][h][d] from the splits' partials: weights e^(m_z - M) with M the largest max.
// One thread per (row, head, dim). A split with no positions has m = -inf (weight 0).
// With `gated`, o / (1 + e^-gate) (the mixer's output gate, as ew_sigmoid_mul_f32).
kernel void attn_combine_f32(
    constant AttentionCombineParams& p [[buffer(0)]],
    device const float* part           [[buffer(1)]],
    device float* o                    [[buffer(2)]],
    device const float* gate           [[buffer(3)]],
    uint gid                           [[thread_position_in_grid]]) {
  const uint hd = uint(p.head_dim);
  const uint H = uint(p.heads);
  if (gid >= uint(p.rows) * H * hd) {
    return;
  }
  const uint d = gid % hd;
  const uint th = gid / hd;
  const uint stride = hd + 2u;
  device const float* pr = part + ulong(th) * uint(p.splits) * stride;
  float M = -INFINITY;
  for (int z = 0; z < p.splits; z++) {
    M = max(M, pr[uint(z) * stride]);
  }
  float sum = 0.0f;
  float acc = 0.0f;
  for (int z = 0; z < p.splits; z++) {
    device const float* pz = pr + uint(z) * stride;
    const float w = exp(pz[0] - M);
    sum = fma(w, pz[1], sum);
    acc = fma(w, pz[2u + d], acc);
  }
  const float y = acc / sum;
  const uint c = (th % H) * hd + d;
  seq_row(o, p.o_stride, th / H)[c] = p.gated != 0 ? y / (1.0f + exp(-seq_row(gate, p.gate_stride, th / H)[c])) : y;
}
