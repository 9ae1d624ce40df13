// Gated DeltaNet recurrence (docs/model.md, Mixer A) over nb rows, and the rollback copy
// of snapshot planes. With CHERENKOV_DELTANET_FUSE_ROWS=N (off by default: slower on the
// H200, lib/gpu/deltanet.ts says why) batches of up to N rows run the mixer's conv,
// recurrence and gated norm as two kernels instead (deltanet_conv_rows_f32, then
// rms_norm_gated_conv_window_f32; lib/gpu/deltanet.ts encodeDeltaNetBlock).
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
#include "norm.h"

using namespace metal;

// Most rows of a state column one lane holds in deltanet_conv_rows_f32 (dk <= 128): the conv
// of each q/k element adds to the live registers; at 8 it spilled on sm_90.
#define DN_CONV_MAX_PER_LANE 4

// Where the recurrence reads its q, k and v channels of row t: the conv output rows
// (deltanet_rows_f32), or the causal conv + SiLU formed right there from the projection rows x
// and the window (deltanet_conv_rows_f32). The conv form is conv_silu_rows_f32's arithmetic in
// its order (tap K-1 times the row's input, then fma over the older inputs, oldest first), so
// its values are bit-identical; input r < 0 of the batch is window slot r + K - 1, which this
// kernel only reads (rms_norm_gated_conv_window_f32 advances it afterwards: the q/k channels of
// a key head are read by the threadgroups of all its value heads, so none may move them).
struct DnInput {
  device const float* rows;   // conv output, or the projection rows x when CONV
  ulong stride;
  device const float* w;      // CONV: conv weights [C][K]
  device const float* window; // CONV: the window [K-1][C], oldest first
  uint C;
  int K;
};

template <bool CONV>
inline float dn_input(thread const DnInput& in, uint t, uint ch) {
  if (!CONV) {
    return seq_row(in.rows, in.stride, t)[ch];
  }
  const int K = in.K;
  const int span = K - 1;
  device const float* wc = in.w + ch * uint(K);
  float acc = wc[K - 1] * seq_row(in.rows, in.stride, t)[ch];
  for (int k = 0; k < span; k++) {
    const int r = int(t) - span + k;
    const float xr = r < 0 ? in.window[uint(r + span) * in.C + ch] : seq_row(in.rows, in.stride, uint(r))[ch];
    acc = fma(wc[k], xr, acc);
  }
  return seq_silu(acc);
}

// Row t's inputs of one state column: lane's q and k elements, v_j, and the head's b and a.
template <bool CONV, uint PER>
inline void dn_load_row(thread const DnInput& in, device const float* b, ulong b_stride, device const float* a, ulong a_stride,
                        uint t, uint h, uint q_off, uint k_off, uint v_off, uint dk, uint per, ushort lane,
                        thread float* q, thread float* k, thread float& v, thread float& bt, thread float& at) {
  CK_UNROLL for (uint m = 0; m < PER; m++) {
    const uint i = lane + 32u * m;
    q[m] = m < per && i < dk ? dn_input<CONV>(in, t, q_off + i) : 0.0f;
    k[m] = m < per && i < dk ? dn_input<CONV>(in, t, k_off + i) : 0.0f;
  }
  v = dn_input<CONV>(in, t, v_off);
  bt = seq_row(b, b_stride, t)[h];
  at = seq_row(a, a_stride, t)[h];
}

// One simdgroup's state column j of value head h over the p.rows rows (grid: see below). A
// lane holds at most PER rows of the column (dk <= 32 PER).
template <bool CONV, uint PER, typename P>
inline void deltanet_column(constant P& p, thread const DnInput& in, device const float* b, device const float* a,
                            device const float* A_log, device const float* dt_bias, device float* S, device float* o,
                            device float* snap, uint h, uint j, ushort lane) {
  const uint dk = uint(p.key_dim);
  const uint dv = uint(p.value_dim);
  const uint kh = h / uint(p.value_heads / p.key_heads);
  const uint per = (dk + 31u) / 32u;
  const uint q_off = kh * dk;
  const uint k_off = uint(p.key_heads) * dk + kh * dk;
  const uint v_off = 2u * uint(p.key_heads) * dk + h * dv + j;
  const ulong head_off = ulong(h) * dk * dv;

  const ulong col_off = head_off + ulong(j) * dk;
  // Loops over a lane's rows run to the constant bound with a guard: s[] and kr[] stay in
  // registers (to `per` they were local memory).
  float s[PER];
  float kr[PER];
  CK_UNROLL for (uint m = 0; m < PER; m++) {
    const uint i = lane + 32u * m;
    s[m] = m < per && i < dk ? S[col_off + i] : 0.0f;
    kr[m] = 0.0f;
  }
  const float A = exp(A_log[h]);
  const float dtb = dt_bias[h];

  // Row t's inputs are loaded during row t - 1 (into the `next` set), so a row's loads overlap
  // the previous row's reductions instead of starting each row with a trip to memory (the row
  // scan of a prompt chunk was ~1 us a row on the H200, most of it waiting).
  float qn[PER], kn[PER];
  float vn = 0.0f, bn = 0.0f, an = 0.0f;
  if (p.rows > 0) {
    dn_load_row<CONV, PER>(in, b, p.b_stride, a, p.a_stride, 0u, h, q_off, k_off, v_off, dk, per, lane, qn, kn, vn, bn, an);
  }
  for (int t = 0; t < p.rows; t++) {
    float qc[PER];
    CK_UNROLL for (uint m = 0; m < PER; m++) {
      qc[m] = qn[m];
      kr[m] = kn[m];
    }
    const float vc = vn, bc = bn, ac = an;
    if (t + 1 < p.rows) {
      dn_load_row<CONV, PER>(in, b, p.b_stride, a, p.a_stride, uint(t + 1), h, q_off, k_off, v_off, dk, per, lane, qn, kn, vn, bn, an);
    }
    float4 part = float4(0.0f);  // |q|^2, |k|^2, S.k, S.q
    float qk = 0.0f;
    CK_UNROLL for (uint m = 0; m < PER; m++) {
      if (m < per) {
        const float qi = qc[m];
        const float ki = kr[m];
        part = part + float4(qi * qi, ki * ki, s[m] * ki, s[m] * qi);
        qk = fma(qi, ki, qk);
      }
    }
    part = simd_sum(part);
    qk = simd_sum(qk);
    const float rq = rsqrt(part.x + p.l2_eps) * p.q_scale;
    const float rk = rsqrt(part.y + p.l2_eps);
    const float beta = seq_sigmoid(bc);
    const float decay = exp(-A * seq_softplus(ac + dtb));
    const float mj = decay * rk * part.z;
    const float delta = beta * (vc - mj);
    const float oj = decay * rq * part.w + delta * (rq * rk * qk);
    const float kd = rk * delta;
    CK_UNROLL for (uint m = 0; m < PER; m++) {
      if (m < per) {
        s[m] = fma(decay, s[m], kr[m] * kd);
      }
    }
    if (lane == 0) {
      seq_row(o, p.o_stride, uint(t))[h * dv + j] = oj;
    }
    if (t < p.snap_rows) {
      device float* plane = seq_row(snap, p.plane_stride, uint(t));
      CK_UNROLL for (uint m = 0; m < PER; m++) {
        const uint i = lane + 32u * m;
        if (m < per && i < dk) {
          plane[col_off + i] = s[m];
        }
      }
    }
  }
  CK_UNROLL for (uint m = 0; m < PER; m++) {
    const uint i = lane + 32u * m;
    if (m < per && i < dk) {
      S[col_off + i] = s[m];
    }
  }
}

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
  const uint j = tg.x * uint(nsg) + uint(sg);
  if (j >= uint(p.value_dim) || tg.y >= uint(p.value_heads)) {
    return;  // whole simdgroup: no SIMD function is left waiting
  }
  const DnInput in = {qkv, p.qkv_stride, qkv, qkv, 0u, 0};
  deltanet_column<false, SEQ_MAX_PER_LANE>(p, in, b, a, A_log, dt_bias, S, o, snap, tg.y, j, lane);
}

// deltanet_rows_f32 with the causal conv + SiLU of conv_silu_rows_f32 formed where the
// recurrence reads q, k and v (DnInput): x is the projection rows [nb][C] (C = 2 Hk dk + Hv dv),
// w the conv weights [C][K], window the conv state [K-1][C], read only here. The window's
// advance (and its snapshots) is rms_norm_gated_conv_window_f32's, the next dispatch.
[[max_total_threads_per_threadgroup(128)]] kernel void deltanet_conv_rows_f32(
    constant DeltaNetConvParams& p [[buffer(0)]],
    device const float* x          [[buffer(1)]],
    device const float* w          [[buffer(2)]],
    device const float* window     [[buffer(3)]],
    device const float* b          [[buffer(4)]],
    device const float* a          [[buffer(5)]],
    device const float* A_log      [[buffer(6)]],
    device const float* dt_bias    [[buffer(7)]],
    device float* S                [[buffer(8)]],
    device float* o                [[buffer(9)]],
    device float* snap             [[buffer(10)]],
    uint2 tg                       [[threadgroup_position_in_grid]],
    ushort lane                    [[thread_index_in_simdgroup]],
    ushort sg                      [[simdgroup_index_in_threadgroup]],
    ushort nsg                     [[simdgroups_per_threadgroup]]) {
  const uint j = tg.x * uint(nsg) + uint(sg);
  if (j >= uint(p.value_dim) || tg.y >= uint(p.value_heads)) {
    return;  // whole simdgroup
  }
  const uint C = 2u * uint(p.key_heads) * uint(p.key_dim) + uint(p.value_heads) * uint(p.value_dim);
  const DnInput in = {x, p.qkv_stride, w, window, C, p.taps};
  deltanet_column<true, DN_CONV_MAX_PER_LANE>(p, in, b, a, A_log, dt_bias, S, o, snap, tg.y, j, lane);
}

// The DeltaNet mixer's tail after deltanet_conv_rows_f32, two independent jobs in one grid:
// threadgroup g's simdgroups take the gated RMSNorm units (row, value head) 4g.. (norm.metal's
// rms_norm_gated_f32, same arithmetic: y = o * rsqrt(mean(o^2) + eps) * w * SiLU(z)), and its
// threads the conv channels 128g.. (the window and its snapshot planes take the values
// conv_silu_rows_f32 moves there: exact).
[[max_total_threads_per_threadgroup(128)]] kernel void rms_norm_gated_conv_window_f32(
    constant DeltaNetTailParams& p [[buffer(0)]],
    device const float* o          [[buffer(1)]],
    device const float* norm_w     [[buffer(2)]],
    device float* y                [[buffer(3)]],
    device const float* z          [[buffer(4)]],
    device const float* x          [[buffer(5)]],
    device float* window           [[buffer(6)]],
    device float* snap             [[buffer(7)]],
    uint tg                        [[threadgroup_position_in_grid]],
    ushort tid                     [[thread_index_in_threadgroup]],
    ushort sg                      [[simdgroup_index_in_threadgroup]],
    ushort lane                    [[thread_index_in_simdgroup]]) {
  const uint unit = tg * NORM_SG + sg;
  if (unit < uint(p.rows * p.heads)) {  // uniform per simdgroup
    const uint row = unit / uint(p.heads);
    const uint head = unit % uint(p.heads);
    rms_norm_vector<true>(p.dim, p.eps, false, seq_row(o, p.o_stride, row) + head * uint(p.dim), norm_w,
                          seq_row(y, p.y_stride, row) + head * uint(p.dim), seq_row(z, p.z_stride, row) + head * uint(p.dim), lane);
  }
  const uint c = tg * (32u * NORM_SG) + tid;
  const uint C = uint(p.channels);
  const int span = p.taps - 1;
  if (c >= C || span < 1) {
    return;
  }
  // Input r of the batch: x row r, or window slot r + span for r < 0. The window after row t
  // holds inputs t + 1 - span .. t. Snapshots first (they read the old window), then the
  // window in slot order: slot k takes slot k + rows when that is still old, so in place.
  for (int t = 0; t < p.snap_rows; t++) {
    device float* plane = seq_row(snap, p.plane_stride, uint(t));
    for (int k = 0; k < span; k++) {
      const int r = t + 1 - span + k;
      plane[uint(k) * C + c] = r < 0 ? window[uint(r + span) * C + c] : seq_row(x, p.x_stride, uint(r))[c];
    }
  }
  for (int k = 0; k < span; k++) {
    const int r = p.rows - span + k;
    window[uint(k) * C + c] = r < 0 ? window[uint(r + span) * C + c] : seq_row(x, p.x_stride, uint(r))[c];
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
