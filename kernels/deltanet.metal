// Gated DeltaNet recurrence (docs/model.md, Mixer A) over nb rows, and the rollback copy
// of snapshot planes.
//
// State S per sequence, stored [Hv][dv][dk]: the transpose of each head of lib/reference's
// DeltaNetState.S ([Hv][dk][dv]), so that a column is contiguous. Column j of a value head's S
// only ever meets column j: S = e^g S; m_j = S[:, j] . k; delta_j = beta (v_j - m_j);
// S[:, j] += k delta_j; o_j = S[:, j] . q. So one simdgroup owns one column (lane l holds rows
// l, l + 32, ...: one coalesced load per 32 rows; the reference's layout put the lanes 4 * dv
// bytes apart) and walks the rows in order without threadgroup barriers. Per row it needs the reductions |q|^2, |k|^2, q.k, S.k and S.q over
// dk, all of the state before the update: with q^ = q rq, k^ = k rk,
//   m_j = e^g rk (S.k),  o_j = e^g rq (S.q) + delta_j rq rk (q.k),
// which is the reference's order of operations rewritten (equal up to f32 rounding), and
// costs two SIMD sums per row.
#include <metal_stdlib>
#include "params.h"
#include "sequence.h"

using namespace metal;

// Grid: (ceil(dv / simdgroups per threadgroup), Hv) threadgroups of 32 x simdgroups threads.
// Inputs: the conv output qkv [nb][q: Hk*dk | k: Hk*dk | v: Hv*dv] (after SiLU, not yet
// normalised), b and a [nb][Hv] (raw projections), A_log and dt_bias [Hv].
// Output o [nb][Hv*dv]; snapshot plane r holds S after row r.
[[max_total_threads_per_threadgroup(128)]] kernel void deltanet_rows_f32(
    constant DeltaNetParams& p   [[buffer(0)]],
    device const float* qkv      [[buffer(1)]],
    device const float* b        [[buffer(2)]],
    device const float* a        [[buffer(3)]],
    device const float* A_log    [[buffer(4)]],
    device const float* dt_bias  [[buffer(5)]],
    device float* S              [[buffer(6)]],
    device float* o              [[buffer(7)]],
    device float* snap           [[buffer(8)]],
    uint2 tg                     [[threadgroup_position_in_grid]],
    ushort lane                  [[thread_index_in_simdgroup]],
    ushort sg                    [[simdgroup_index_in_threadgroup]],
    ushort nsg                   [[simdgroups_per_threadgroup]]) {
  const uint dk = uint(p.key_dim);
  const uint dv = uint(p.value_dim);
  const uint h = tg.y;
  const uint j = tg.x * uint(nsg) + uint(sg);
  if (j >= dv || h >= uint(p.value_heads)) {
    return;  // whole simdgroup: no SIMD function is left waiting
  }
  const uint kh = h / uint(p.value_heads / p.key_heads);
  const uint per = (dk + 31u) / 32u;
  const uint q_off = kh * dk;
  const uint k_off = uint(p.key_heads) * dk + kh * dk;
  const uint v_off = 2u * uint(p.key_heads) * dk + h * dv + j;
  const ulong head_off = ulong(h) * dk * dv;

  const ulong col_off = head_off + ulong(j) * dk;
  // Loops over a lane's rows run to the constant bound with a guard: s[] and kr[] stay in
  // registers (to `per` they were local memory).
  float s[SEQ_MAX_PER_LANE];
  float kr[SEQ_MAX_PER_LANE];
  CK_UNROLL for (uint m = 0; m < SEQ_MAX_PER_LANE; m++) {
    const uint i = lane + 32u * m;
    s[m] = m < per && i < dk ? S[col_off + i] : 0.0f;
  }
  const float A = exp(A_log[h]);
  const float dtb = dt_bias[h];

  for (int t = 0; t < p.rows; t++) {
    device const float* row = seq_row(qkv, p.qkv_stride, uint(t));
    float4 part = float4(0.0f);  // |q|^2, |k|^2, S.k, S.q
    float qk = 0.0f;
    CK_UNROLL for (uint m = 0; m < SEQ_MAX_PER_LANE; m++) {
      if (m < per) {
        const uint i = lane + 32u * m;
        const float qi = i < dk ? row[q_off + i] : 0.0f;
        const float ki = i < dk ? row[k_off + i] : 0.0f;
        kr[m] = ki;
        part = part + float4(qi * qi, ki * ki, s[m] * ki, s[m] * qi);
        qk = fma(qi, ki, qk);
      }
    }
    part = simd_sum(part);
    qk = simd_sum(qk);
    const float rq = rsqrt(part.x + p.l2_eps) * p.q_scale;
    const float rk = rsqrt(part.y + p.l2_eps);
    const float beta = seq_sigmoid(seq_row(b, p.b_stride, uint(t))[h]);
    const float decay = exp(-A * seq_softplus(seq_row(a, p.a_stride, uint(t))[h] + dtb));
    const float mj = decay * rk * part.z;
    const float delta = beta * (row[v_off] - mj);
    const float oj = decay * rq * part.w + delta * (rq * rk * qk);
    const float kd = rk * delta;
    CK_UNROLL for (uint m = 0; m < SEQ_MAX_PER_LANE; m++) {
      if (m < per) {
        s[m] = fma(decay, s[m], kr[m] * kd);
      }
    }
    if (lane == 0) {
      seq_row(o, p.o_stride, uint(t))[h * dv + j] = oj;
    }
    if (t < p.snap_rows) {
      device float* plane = seq_row(snap, p.plane_stride, uint(t));
      CK_UNROLL for (uint m = 0; m < SEQ_MAX_PER_LANE; m++) {
        const uint i = lane + 32u * m;
        if (m < per && i < dk) {
          plane[col_off + i] = s[m];
        }
      }
    }
  }
  CK_UNROLL for (uint m = 0; m < SEQ_MAX_PER_LANE; m++) {
    const uint i = lane + 32u * m;
    if (m < per && i < dk) {
      S[col_off + i] = s[m];
    }
  }
}

// Rollback: dst0[i] = src0[i] for i < n0, then dst1[i] = src1[i] for i < n1, one thread
// per element (a DeltaNet layer restores S and its conv window in one dispatch). The
// bindings' offsets select the snapshot plane.
kernel void snapshot_restore_f32(
    constant SnapshotRestoreParams& p [[buffer(0)]],
    device const float* src0          [[buffer(1)]],
    device float* dst0                [[buffer(2)]],
    device const float* src1          [[buffer(3)]],
    device float* dst1                [[buffer(4)]],
    uint i                            [[thread_position_in_grid]]) {
  const uint n0 = uint(p.n0);
  if (i < n0) {
    dst0[i] = src0[i];
  } else if (i - n0 < uint(p.n1)) {
    dst1[i - n0] = src1[i - n0];
  }
}
