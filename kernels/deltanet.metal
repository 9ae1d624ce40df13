// Gated DeltaNet recurrence (docs/model.md, Mixer A) over nb rows, and the rollback copy
// of snapshot planes. With CHERENKOV_DELTANET_FUSE_ROWS=N (off by default: slower on the
// H200, lib/gpu/deltanet.ts says why) batches of up to N rows run the mixer's conv,
// recurrence and gated norm as two kernels instead (deltanet_conv_rows_f32, then
// rms_norm_gated_conv_window_f32; lib/gpu/deltanet.ts encodeDeltaNetBlock). With
// CHERENKOV_DELTANET_NORM_FUSED=1 (off by default until timed) decode rows and verify batches
// of the three-kernel form run the recurrence and the gated norm in one dispatch
// (deltanet_rows_norm_f32: one threadgroup per value head).
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
#include "grid.h"
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

// Row t's inputs that all state columns of value head h share: the lane's q and k elements.
template <bool CONV, uint PER>
inline void dn_load_qk(thread const DnInput& in, uint t, uint q_off, uint k_off, uint dk, uint per, ushort lane,
                       thread float* q, thread float* k) {
  CK_UNROLL for (uint m = 0; m < PER; m++) {
    const uint i = lane + 32u * m;
    q[m] = m < per && i < dk ? dn_input<CONV>(in, t, q_off + i) : 0.0f;
    k[m] = m < per && i < dk ? dn_input<CONV>(in, t, k_off + i) : 0.0f;
  }
}

// Row t's inputs of one state column: lane's q and k elements, v_j, and the head's b and a.
template <bool CONV, uint PER>
inline void dn_load_row(thread const DnInput& in, device const float* b, ulong b_stride, device const float* a, ulong a_stride,
                        uint t, uint h, uint q_off, uint k_off, uint v_off, uint dk, uint per, ushort lane,
                        thread float* q, thread float* k, thread float& v, thread float& bt, thread float& at) {
  dn_load_qk<CONV, PER>(in, t, q_off, k_off, dk, per, lane, q, k);
  v = dn_input<CONV>(in, t, v_off);
  bt = seq_row(b, b_stride, t)[h];
  at = seq_row(a, a_stride, t)[h];
}

// Where deltanet_column puts o_j of row t (lane 0 stores it): the output rows o [nb][Hv*dv]
// (device), or the head's rows [nb][dv] staged in threadgroup memory for the gated norm that
// follows in the same threadgroup (deltanet_rows_norm_f32).
struct DnRowsOut {
  device float* o;
  ulong stride;
};
struct DnStagedOut {
  threadgroup float* o;
};

inline void dn_store_o(thread const DnRowsOut& out, uint t, uint h, uint j, uint dv, float oj) {
  seq_row(out.o, out.stride, t)[h * dv + j] = oj;
}
inline void dn_store_o(thread const DnStagedOut& out, uint t, uint h, uint j, uint dv, float oj) {
  out.o[t * dv + j] = oj;
}

// A column's row step once its sums are reduced: o_j and the scale kd of k in the state update
// (S_j = decay S_j + kd k). `sk`, `sq`: S_j.k and S_j.q; rqk = rq rk q.k. deltanet_column and
// deltanet_columns both call it, and the partial sums before it are explicit fmas in both:
// left to the compiler, nvcc contracted the same expressions differently in the two kernels
// (outputs 1 ulp apart on the H200).
struct DnColumnStep {
  float oj;
  float kd;
};
inline DnColumnStep dn_column_step(float decay, float rq, float rk, float beta, float v, float sk, float sq, float rqk) {
  const float delta = beta * fma(-(decay * rk), sk, v);
  DnColumnStep r;
  r.oj = fma(decay * rq, sq, delta * rqk);
  r.kd = rk * delta;
  return r;
}

// One simdgroup's state column j of value head h over the p.rows rows (grid: see below). A
// lane holds at most PER rows of the column (dk <= 32 PER).
template <bool CONV, uint PER, typename P, typename OUT>
inline void deltanet_column(constant P& p, thread const DnInput& in, device const float* b, device const float* a,
                            device const float* A_log, device const float* dt_bias, device float* S, thread const OUT& o,
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
        part = fma(float4(qi, ki, s[m], s[m]), float4(qi, ki, ki, qi), part);
        qk = fma(qi, ki, qk);
      }
    }
    part = simd_sum(part);
    qk = simd_sum(qk);
    const float rq = rsqrt(part.x + p.l2_eps) * p.q_scale;
    const float rk = rsqrt(part.y + p.l2_eps);
    const float beta = seq_sigmoid(bc);
    const float decay = exp(-A * seq_softplus(ac + dtb));
    const DnColumnStep step = dn_column_step(decay, rq, rk, beta, vc, part.z, part.w, rq * rk * qk);
    CK_UNROLL for (uint m = 0; m < PER; m++) {
      if (m < per) {
        s[m] = fma(decay, s[m], kr[m] * step.kd);
      }
    }
    if (lane == 0) {
      dn_store_o(o, uint(t), h, j, dv, step.oj);
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

// Row t's inputs of the COLS adjacent columns from v_off's (deltanet_columns): the shared q, k, b
// and a once, v of each of the `live` first columns (the rest 0).
template <uint COLS, uint PER>
inline void dn_load_group(thread const DnInput& in, device const float* b, ulong b_stride, device const float* a, ulong a_stride,
                          uint t, uint h, uint q_off, uint k_off, uint v_off, uint dk, uint live, uint per, ushort lane,
                          thread float* q, thread float* k, thread float* v, thread float& bt, thread float& at) {
  dn_load_qk<false, PER>(in, t, q_off, k_off, dk, per, lane, q, k);
  CK_UNROLL for (uint c = 0; c < COLS; c++) {
    v[c] = c < live ? dn_input<false>(in, t, v_off + c) : 0.0f;
  }
  bt = seq_row(b, b_stride, t)[h];
  at = seq_row(a, a_stride, t)[h];
}

// Floats deltanet_columns reduces per row for COLS columns (|q|^2, |k|^2, then S.k and S.q of
// each column, then q.k), and the float4s they travel in (the last one zero-padded).
#define DN_GROUP_SUMS(COLS) (2u * (COLS) + 3u)
#define DN_GROUP_SUM4S(COLS) ((DN_GROUP_SUMS(COLS) + 3u) / 4u)

// deltanet_column (conv output rows: no CONV form) for the COLS adjacent columns j0 .. j0 +
// COLS - 1 of value head h in one simdgroup (columns from dv on: guarded off), so that a simdgroup walking several columns makes
// one pass over the rows per COLS of them. What the columns share is loaded, and reduced, once
// per row: the lane's q and k, b and a, |q|^2, |k|^2, q.k. Every other quantity is per column and
// formed by deltanet_column's operations in its order (the partial sums as its float4 `part`
// forms them, here in float2s: the same fmas; then dn_column_step), and simd_sum is componentwise
// on every backend (Metal; metal-shim's CPU and CUDA preludes), so a column's o, S and snapshot
// planes are deltanet_column's bit for bit however the sums are packed into float4s.
template <uint COLS, uint PER, typename P, typename OUT>
inline void deltanet_columns(constant P& p, thread const DnInput& in, device const float* b, device const float* a,
                             device const float* A_log, device const float* dt_bias, device float* S, thread const OUT& o,
                             device float* snap, uint h, uint j0, ushort lane) {
  const uint dk = uint(p.key_dim);
  const uint dv = uint(p.value_dim);
  const uint kh = h / uint(p.value_heads / p.key_heads);
  const uint per = (dk + 31u) / 32u;
  const uint q_off = kh * dk;
  const uint k_off = uint(p.key_heads) * dk + kh * dk;
  const uint v_off = 2u * uint(p.key_heads) * dk + h * dv + j0;
  const ulong col0 = ulong(h) * dk * dv + ulong(j0) * dk;  // column j0 + c at col0 + c dk

  float s[COLS * PER];  // [c][m]
  float kr[PER];
  CK_UNROLL for (uint c = 0; c < COLS; c++) {
    CK_UNROLL for (uint m = 0; m < PER; m++) {
      const uint i = lane + 32u * m;
      s[c * PER + m] = j0 + c < dv && m < per && i < dk ? S[col0 + c * dk + i] : 0.0f;
    }
  }
  CK_UNROLL for (uint m = 0; m < PER; m++) {
    kr[m] = 0.0f;
  }
  const float A = exp(A_log[h]);
  const float dtb = dt_bias[h];

  // Row t + 1's inputs load during row t, as in deltanet_column.
  float qn[PER], kn[PER], vn[COLS];
  float bn = 0.0f, an = 0.0f;
  if (p.rows > 0) {
    dn_load_group<COLS, PER>(in, b, p.b_stride, a, p.a_stride, 0u, h, q_off, k_off, v_off, dk, dv - j0, per, lane, qn, kn, vn, bn, an);
  }
  for (int t = 0; t < p.rows; t++) {
    float qc[PER], vc[COLS];
    CK_UNROLL for (uint m = 0; m < PER; m++) {
      qc[m] = qn[m];
      kr[m] = kn[m];
    }
    CK_UNROLL for (uint c = 0; c < COLS; c++) {
      vc[c] = vn[c];
    }
    const float bc = bn, ac = an;
    if (t + 1 < p.rows) {
      dn_load_group<COLS, PER>(in, b, p.b_stride, a, p.a_stride, uint(t + 1), h, q_off, k_off, v_off, dk, dv - j0, per, lane, qn, kn, vn, bn, an);
    }
    float2 norms = float2(0.0f);  // |q|^2, |k|^2
    float2 dots[COLS];            // S.k, S.q of each column
    float qk = 0.0f;
    CK_UNROLL for (uint c = 0; c < COLS; c++) {
      dots[c] = float2(0.0f);
    }
    CK_UNROLL for (uint m = 0; m < PER; m++) {
      if (m < per) {
        const float qi = qc[m];
        const float ki = kr[m];
        norms = fma(float2(qi, ki), float2(qi, ki), norms);
        CK_UNROLL for (uint c = 0; c < COLS; c++) {
          dots[c] = fma(float2(s[c * PER + m]), float2(ki, qi), dots[c]);
        }
        qk = fma(qi, ki, qk);
      }
    }
    float sums[4u * DN_GROUP_SUM4S(COLS)];
    sums[0] = norms.x;
    sums[1] = norms.y;
    CK_UNROLL for (uint c = 0; c < COLS; c++) {
      sums[2u + 2u * c] = dots[c].x;
      sums[3u + 2u * c] = dots[c].y;
    }
    CK_UNROLL for (uint i = DN_GROUP_SUMS(COLS) - 1u; i < 4u * DN_GROUP_SUM4S(COLS); i++) {
      sums[i] = 0.0f;
    }
    sums[DN_GROUP_SUMS(COLS) - 1u] = qk;
    CK_UNROLL for (uint r = 0; r < DN_GROUP_SUM4S(COLS); r++) {
      const float4 sum = simd_sum(float4(sums[4u * r], sums[4u * r + 1u], sums[4u * r + 2u], sums[4u * r + 3u]));
      sums[4u * r] = sum.x;
      sums[4u * r + 1u] = sum.y;
      sums[4u * r + 2u] = sum.z;
      sums[4u * r + 3u] = sum.w;
    }
    const float rq = rsqrt(sums[0] + p.l2_eps) * p.q_scale;
    const float rk = rsqrt(sums[1] + p.l2_eps);
    const float beta = seq_sigmoid(bc);
    const float decay = exp(-A * seq_softplus(ac + dtb));
    const float qk_sum = sums[DN_GROUP_SUMS(COLS) - 1u];
    const float rqk = rq * rk * qk_sum;
    CK_UNROLL for (uint c = 0; c < COLS; c++) {
      const DnColumnStep step = dn_column_step(decay, rq, rk, beta, vc[c], sums[2u + 2u * c], sums[3u + 2u * c], rqk);
      CK_UNROLL for (uint m = 0; m < PER; m++) {
        if (m < per) {
          s[c * PER + m] = fma(decay, s[c * PER + m], kr[m] * step.kd);
        }
      }
      const bool live = j0 + c < dv;
      if (lane == 0 && live) {
        dn_store_o(o, uint(t), h, j0 + c, dv, step.oj);
      }
      if (t < p.snap_rows && live) {
        device float* plane = seq_row(snap, p.plane_stride, uint(t));
        CK_UNROLL for (uint m = 0; m < PER; m++) {
          const uint i = lane + 32u * m;
          if (m < per && i < dk) {
            plane[col0 + c * dk + i] = s[c * PER + m];
          }
        }
      }
    }
  }
  CK_UNROLL for (uint c = 0; c < COLS; c++) {
    CK_UNROLL for (uint m = 0; m < PER; m++) {
      const uint i = lane + 32u * m;
      if (j0 + c < dv && m < per && i < dk) {
        S[col0 + c * dk + i] = s[c * PER + m];
      }
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
  const DnRowsOut out = {o, p.o_stride};
  deltanet_column<false, SEQ_MAX_PER_LANE>(p, in, b, a, A_log, dt_bias, S, out, snap, tg.y, j, lane);
}

// Most rows and value dim of deltanet_rows_norm_f32 (its staged o: 2 KiB of threadgroup
// memory), and the most rows of a state column a lane holds there (dk <= 128).
#define DN_NORM_MAX_ROWS 4
#define DN_NORM_MAX_DV 128
#define DN_NORM_PER 4

// deltanet_rows_f32 and rms_norm_gated_f32 in one dispatch (decode rows, verify batches): one
// threadgroup per value head h, its simdgroups taking the head's dv state columns in groups of
// COLS adjacent ones (group g: columns COLS g ..; simdgroup g % simdgroups), each running
// deltanet_column (COLS = 1) or deltanet_columns over all rows with o staged in threadgroup
// memory; after one barrier simdgroup r normalises row r, r + simdgroups.. (rms_norm_vector, as
// rms_norm_gated_f32). Both halves are the replaced kernels' arithmetic in their order, so y, S
// and the snapshot planes are theirs bit for bit, for every COLS (a lane's PER = 4 rows against
// 8 only drops guarded-off terms). COLS trades registers for passes: at the 30b shape (dv 128,
// 16 simdgroups) a simdgroup walks 8 columns, one after another at COLS = 1 (8 chains of memory
// round trips), in 4 or 2 passes at COLS = 2 or 4 (lib/gpu/deltanet.ts
// CHERENKOV_DELTANET_NORM_COLS). y: o's place, [nb][Hv*dv] (in encodeDeltaNetBlock the buffer
// the unfused o went to). The host keeps rows <= DN_NORM_MAX_ROWS, dv <= DN_NORM_MAX_DV, dk <=
// 32 DN_NORM_PER. At most 512 threads (16 simdgroups): the CUDA bound of 1,024 leaves 64
// registers a thread, and the norm's pointers, live across the column loop, then spilled 16
// bytes on sm_90 (at 512: 73 registers a thread at COLS = 1, 95 at 2, 111 at 4; no spills).
template <uint COLS>
[[max_total_threads_per_threadgroup(512)]] kernel void deltanet_rows_norm(
    constant DeltaNetNormParams& p [[buffer(0)]],
    device const float* qkv        [[buffer(1)]],
    device const float* b          [[buffer(2)]],
    device const float* a          [[buffer(3)]],
    device const float* A_log      [[buffer(4)]],
    device const float* dt_bias    [[buffer(5)]],
    device float* S                [[buffer(6)]],
    device const float* norm_w     [[buffer(7)]],
    device const float* z          [[buffer(8)]],
    device float* y                [[buffer(9)]],
    device float* snap             [[buffer(10)]],
    uint h                         [[threadgroup_position_in_grid]],
    ushort lane                    [[thread_index_in_simdgroup]],
    ushort sg                      [[simdgroup_index_in_threadgroup]],
    ushort nsg                     [[simdgroups_per_threadgroup]]) {
  threadgroup float staged[DN_NORM_MAX_ROWS * DN_NORM_MAX_DV];  // o of row t at t * dv
  const uint dv = uint(p.value_dim);
  // The head's state (dk x dv floats, 64 KB at the 30b shape: 2 MB a layer, more than L2 keeps
  // between tokens) into L2 while the projections before finish, so the column walk's loads
  // wait on L2, not memory. A prefetch is only a hint: L2 holds the newest data whoever last
  // wrote it (the previous step, a rollback), so asking early is safe though dispatches write
  // the state; what the kernel reads, it reads after ck_inputs_ready.
  // (Not at COLS 1, whose 73 registers then became 64 and a spill on sm_90.)
  if (COLS > 1u && sg == 0 && lane == 0) {
    ck_prefetch((device const uchar*)(S + ulong(h) * uint(p.key_dim) * dv), uint(p.key_dim) * dv * 4u);
  }
  ck_inputs_ready();
  const DnInput in = {qkv, p.qkv_stride, qkv, qkv, 0u, 0};
  const DnStagedOut out = {staged};
  for (uint j = uint(sg) * COLS; j < dv; j += uint(nsg) * COLS) {  // uniform per simdgroup
    if (COLS == 1u) {
      deltanet_column<false, DN_NORM_PER>(p, in, b, a, A_log, dt_bias, S, out, snap, h, j, lane);
    } else {
      deltanet_columns<COLS, DN_NORM_PER>(p, in, b, a, A_log, dt_bias, S, out, snap, h, j, lane);
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint t = uint(sg); t < uint(p.rows); t += uint(nsg)) {
    const ulong head = ulong(h) * dv;
    // One element at a time (L = 1): the row is in threadgroup memory, nothing to keep in
    // flight, and the batched form's registers spilled the COLS 1 kernel on sm_90.
    rms_norm_vector<true, 1>(p.value_dim, p.eps, false, staged + t * dv, norm_w, seq_row(y, p.o_stride, t) + head,
                                seq_row(z, p.z_stride, t) + head, lane);
  }
}

template [[host_name("deltanet_rows_norm_f32")]] kernel decltype(deltanet_rows_norm<1>) deltanet_rows_norm<1>;
template [[host_name("deltanet_rows_norm_c2_f32")]] kernel decltype(deltanet_rows_norm<2>) deltanet_rows_norm<2>;
template [[host_name("deltanet_rows_norm_c4_f32")]] kernel decltype(deltanet_rows_norm<4>) deltanet_rows_norm<4>;

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
  const DnRowsOut out = {o, p.o_stride};
  deltanet_column<true, DN_CONV_MAX_PER_LANE>(p, in, b, a, A_log, dt_bias, S, out, snap, tg.y, j, lane);
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

// ---- The chunked form (prompt chunks): blocks of DN_CHUNK rows -----------------------------
//
// docs/model.md gives the algebra ("Prefill may use the chunked form"). Within a block of C rows
// with cumulative decays G_t (G_t = g_0 + ... + g_t), state S0 at its start, k^ and q^ the
// normalised rows:
//   r_t     = v_t - e^G_t S0^T k^_t
//   delta   = T diag(beta) r,        T = (I + A)^-1, A[t][i] = beta_t e^(G_t - G_i) (k^_t . k^_i), i < t
//   o_t     = e^G_t S0^T q^_t + sum_{i <= t} e^(G_t - G_i) (q^_t . k^_i) delta_i
//   S_end   = e^G_last S0 + sum_i e^(G_last - G_i) k^_i delta_i^T
// (the row recurrence unrolled: delta_t is the row scan's delta, A's lower solve its dependence
// on the block's earlier rows). Two kernels: deltanet_chunk_prep_f32 builds what does not depend
// on S (T diag(beta), the masked decayed q.k matrix, per-row scale factors) for every (block,
// value head) at once; deltanet_chunk_scan_f32 then walks the blocks in order, one simdgroup per
// two state columns (columns never meet, as in the row scan; deltanet_chunk_scan_c4_f32: four,
// each k and q row it loads serving all of them, for the bench to compare). All f32, no matrix units:
// the lower solve must be f32 (docs/model.md R6: it cancels), and the products are small.
// No snapshot planes: the host takes this form only for batches without snapshot rows.

// Rows of a block: one per lane of the scan's row-indexed values.
#define DN_CHUNK 32
// Most rows of a state column one lane holds in the chunked form (key dim <= 128).
#define DN_CHUNK_PER 4
// Row stride of the prep kernel's staged k^ rows: odd, so lanes reading rows i at one dim hit
// distinct banks.
#define DN_CHUNK_KS (DN_CHUNK_PER * 32 + 1)
// The work region of one (value head, block), floats: [T diag(beta)]^T [i][t] (C x C), then
// P^T [i][t] with P[t][i] = e^(G_t - G_i) (q^_t . k^_i) for i <= t (C x C), then per row t:
// e^G_t rk_t, e^G_t rq_t, e^(G_last - G_t) rk_t, and e^G_last (rk, rq: the L2 factors; rq
// includes q_scale). lib/gpu/deltanet.ts DELTANET_CHUNK_FLOATS must equal it.
#define DN_CHUNK_TB 0
#define DN_CHUNK_P (DN_CHUNK * DN_CHUNK)
#define DN_CHUNK_KC (2 * DN_CHUNK * DN_CHUNK)
#define DN_CHUNK_QC (DN_CHUNK_KC + DN_CHUNK)
#define DN_CHUNK_KU (DN_CHUNK_KC + 2 * DN_CHUNK)
#define DN_CHUNK_GL (DN_CHUNK_KC + 3 * DN_CHUNK)
#define DN_CHUNK_FLOATS (DN_CHUNK_KC + 4 * DN_CHUNK)

// Grid: (blocks = ceil(rows / DN_CHUNK), Hv) threadgroups of 128 threads. Inputs as
// deltanet_rows_f32's; work: DN_CHUNK_FLOATS per (value head, block), head-major.
[[max_total_threads_per_threadgroup(128)]] kernel void deltanet_chunk_prep_f32(
    constant DeltaNetParams& p   [[buffer(0)]],
    device const float* qkv      [[buffer(1)]],
    device const float* b        [[buffer(2)]],
    device const float* a        [[buffer(3)]],
    device const float* A_log    [[buffer(4)]],
    device const float* dt_bias  [[buffer(5)]],
    device float* work           [[buffer(6)]],
    uint2 tg                     [[threadgroup_position_in_grid]],
    ushort lane                  [[thread_index_in_simdgroup]],
    ushort sg                    [[simdgroup_index_in_threadgroup]],
    ushort nsg                   [[simdgroups_per_threadgroup]]) {
  threadgroup float kn[DN_CHUNK * DN_CHUNK_KS];   // k^ rows of the block (padding rows 0)
  threadgroup float Am[DN_CHUNK * (DN_CHUNK + 1)];  // A, row-major, stride C + 1
  threadgroup float Pm[DN_CHUNK * (DN_CHUNK + 1)];  // P
  threadgroup float Tm[DN_CHUNK * (DN_CHUNK + 1)];  // T = (I + A)^-1
  threadgroup float rq[DN_CHUNK];
  threadgroup float rk[DN_CHUNK];
  threadgroup float beta[DN_CHUNK];
  threadgroup float G[DN_CHUNK];

  const uint blk = tg.x;
  const uint h = tg.y;
  const uint nblocks = (uint(p.rows) + DN_CHUNK - 1u) / DN_CHUNK;
  const bool live = blk < nblocks && h < uint(p.value_heads);  // uniform: guards, no early return
  const uint t0 = blk * DN_CHUNK;
  const uint n = live ? min(uint(DN_CHUNK), uint(p.rows) - t0) : 0u;
  const uint dk = uint(p.key_dim);
  const uint ks = dk | 1u;
  const uint kh = live ? h / uint(p.value_heads / p.key_heads) : 0u;
  const uint q_off = kh * dk;
  const uint k_off = uint(p.key_heads) * dk + kh * dk;

  // Per row: the L2 factors, beta and g (padding rows: all 0, so they change nothing).
  for (uint t = sg; t < DN_CHUNK; t += uint(nsg)) {
    float qq = 0.0f, kk = 0.0f;
    if (t < n) {
      device const float* row = seq_row(qkv, p.qkv_stride, t0 + t);
      for (uint i = lane; i < dk; i += 32u) {
        qq = fma(row[q_off + i], row[q_off + i], qq);
        kk = fma(row[k_off + i], row[k_off + i], kk);
      }
    }
    qq = simd_sum(qq);
    kk = simd_sum(kk);
    if (lane == 0) {
      const bool in = t < n;
      rq[t] = in ? rsqrt(qq + p.l2_eps) * p.q_scale : 0.0f;
      rk[t] = in ? rsqrt(kk + p.l2_eps) : 0.0f;
      beta[t] = in ? seq_sigmoid(seq_row(b, p.b_stride, t0 + t)[h]) : 0.0f;
      G[t] = in ? -exp(A_log[h]) * seq_softplus(seq_row(a, p.a_stride, t0 + t)[h] + dt_bias[h]) : 0.0f;
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint t = sg; t < DN_CHUNK; t += uint(nsg)) {
    device const float* row = seq_row(qkv, p.qkv_stride, t0 + min(t, n > 0u ? n - 1u : 0u));
    for (uint i = lane; i < dk; i += 32u) {
      kn[t * ks + i] = t < n ? row[k_off + i] * rk[t] : 0.0f;
    }
  }
  if (sg == 0) {
    const float g = G[lane];
    G[lane] = simd_prefix_inclusive_sum(g);  // each lane its own entry
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // A and P: row t per simdgroup pass, column i per lane.
  {
    const uint i = lane;
    for (uint t = sg; t < DN_CHUNK; t += uint(nsg)) {
      float kk = 0.0f, qk = 0.0f;
      if (t < n) {
        device const float* row = seq_row(qkv, p.qkv_stride, t0 + t);
        for (uint c = 0; c < dk; c++) {
          const float ki = kn[i * ks + c];
          kk = fma(kn[t * ks + c], ki, kk);
          qk = fma(row[q_off + c], ki, qk);
        }
      }
      const float d = i <= t ? exp(G[t] - G[i]) : 0.0f;
      Am[t * (DN_CHUNK + 1) + i] = i < t ? beta[t] * d * kk : 0.0f;
      Pm[t * (DN_CHUNK + 1) + i] = d * rq[t] * qk;
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // T = (I + A)^-1 by forward substitution, column c per lane (a lane reads only its own column
  // of T): T[t][c] = [t == c] - sum_{i < t} A[t][i] T[i][c]. The sum runs over all 32 i (A is 0
  // from i = t on, and T's rows from t on are still the zeros written first) in four independent
  // chains: a fixed trip count the compiler unrolls, its loads issued ahead of the fmas.
  if (sg == 0) {
    const uint c = lane;
    for (uint t = 0; t < DN_CHUNK; t++) {
      Tm[t * (DN_CHUNK + 1) + c] = 0.0f;
    }
    for (uint t = 0; t < DN_CHUNK; t++) {
      float acc[4] = {t == c ? 1.0f : 0.0f, 0.0f, 0.0f, 0.0f};
      CK_UNROLL for (uint i = 0; i < DN_CHUNK; i++) {
        acc[i % 4u] = fma(-Am[t * (DN_CHUNK + 1) + i], Tm[i * (DN_CHUNK + 1) + c], acc[i % 4u]);
      }
      Tm[t * (DN_CHUNK + 1) + c] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  if (live) {
    device float* w = work + (ulong(h) * nblocks + blk) * DN_CHUNK_FLOATS;
    const uint t = lane;
    for (uint i = sg; i < DN_CHUNK; i += uint(nsg)) {
      w[DN_CHUNK_TB + i * DN_CHUNK + t] = Tm[t * (DN_CHUNK + 1) + i] * beta[i];
      w[DN_CHUNK_P + i * DN_CHUNK + t] = Pm[t * (DN_CHUNK + 1) + i];
    }
    if (sg == 0) {
      const float GL = G[DN_CHUNK - 1];  // padding rows add g = 0: G of the last row
      const float eG = exp(G[t]);
      w[DN_CHUNK_KC + t] = eG * rk[t];
      w[DN_CHUNK_QC + t] = eG * rq[t];
      w[DN_CHUNK_KU + t] = exp(GL - G[t]) * rk[t];
      w[DN_CHUNK_GL + t] = exp(GL);
    }
  }
}

// Rows the scan reduces at once: half a block, so that a lane's partial sums (and the loads
// feeding them) take half the registers (200 a thread on sm_90 with whole blocks).
#define DN_CHUNK_HALF (DN_CHUNK / 2)

// Recursive halving within the 16-lane halves of the simdgroup: v holds a lane's partial sums of
// 2W rows; one stage trades half of them with the lane W apart. After the stages 8, 4, 2, 1 lane
// l holds, summed over its half, row l % 16 in v[0]; one more exchange with the lane 16 apart
// completes the sum. 16 shuffles for 16 sums (16 simd_sums would take 80).
template <uint W>
inline void dn_halve(thread float* v, ushort lane) {
  const bool up = (uint(lane) & W) != 0u;
  CK_UNROLL for (uint i = 0; i < W; i++) {
    const float send = up ? v[i] : v[i + W];
    const float keep = up ? v[i + W] : v[i];
    v[i] = keep + simd_shuffle_xor(send, ushort(W));
  }
}

inline float dn_reduce_scatter16(thread float* v, ushort lane) {
  dn_halve<8>(v, lane);
  dn_halve<4>(v, lane);
  dn_halve<2>(v, lane);
  dn_halve<1>(v, lane);
  return v[0] + simd_shuffle_xor(v[0], ushort(16));
}

// Lane's partial products of rows first .. first + 15 of the block (rows from n on count 0) with
// the state columns: part[c][t] = sum over the lane's state rows m of
// x[t0 + first + t][off + lane + 32 m] * s[c][m] (x: the k or q rows, raw; s and part flattened
// [c][m], [c][t]).
template <uint COLS>
inline void dn_chunk_partials(constant DeltaNetParams& p, device const float* qkv, uint off, uint t0, uint first, uint n, uint dk,
                              thread const float* s, thread float* part, ushort lane) {
  CK_UNROLL for (uint t = 0; t < DN_CHUNK_HALF; t++) {
    const uint r = first + t;
    float x[DN_CHUNK_PER];
    device const float* row = seq_row(qkv, p.qkv_stride, t0 + min(r, n - 1u));
    CK_UNROLL for (uint m = 0; m < DN_CHUNK_PER; m++) {
      const uint i = uint(lane) + 32u * m;
      x[m] = r < n && i < dk ? row[off + i] : 0.0f;
    }
    CK_UNROLL for (uint c = 0; c < COLS; c++) {
      float acc = 0.0f;
      CK_UNROLL for (uint m = 0; m < DN_CHUNK_PER; m++) {
        acc = fma(x[m], s[c * DN_CHUNK_PER + m], acc);
      }
      part[c * DN_CHUNK_HALF + t] = acc;
    }
  }
}

// This lane's row (t = lane) of S0^T k and S0^T q over the block (raw k and q rows). Four passes
// (k rows 0-15, 16-31, then q), kept rolled: unrolled, the compiler hoisted all their loads and
// took 217 registers a thread on sm_90 (two threadgroups an SM: the grid ran in two waves).
template <uint COLS>
inline void dn_chunk_project(constant DeltaNetParams& p, device const float* qkv, uint k_off, uint q_off, uint t0, uint n, uint dk,
                             thread const float* s, thread float* sk, thread float* sq, ushort lane) {
  float part[COLS * DN_CHUNK_HALF];
  CK_ROLLED for (uint pass = 0; pass < 4u; pass++) {
    const uint half = pass & 1u;
    dn_chunk_partials<COLS>(p, qkv, pass < 2u ? k_off : q_off, t0, half * DN_CHUNK_HALF, n, dk, s, part, lane);
    const bool mine = (uint(lane) >= DN_CHUNK_HALF) == (half == 1u);
    CK_UNROLL for (uint c = 0; c < COLS; c++) {
      const float sum = dn_reduce_scatter16(part + c * DN_CHUNK_HALF, lane);
      sk[c] = mine && pass < 2u ? sum : sk[c];
      sq[c] = mine && pass >= 2u ? sum : sq[c];
    }
  }
}

// Grid: (ceil(dv / (COLS * simdgroups)), Hv) threadgroups of up to 128 threads. Walks
// the blocks in order; per block a lane holds rows lane + 32 m of its columns of S (as the row
// scan) and, for the row-indexed values (r, delta, o), row t = lane of the block.
template <uint COLS>
[[max_total_threads_per_threadgroup(128)]] kernel void deltanet_chunk_scan(
    constant DeltaNetParams& p   [[buffer(0)]],
    device const float* qkv      [[buffer(1)]],
    device const float* work     [[buffer(2)]],
    device float* S              [[buffer(3)]],
    device float* o              [[buffer(4)]],
    uint2 tg                     [[threadgroup_position_in_grid]],
    ushort lane                  [[thread_index_in_simdgroup]],
    ushort sg                    [[simdgroup_index_in_threadgroup]],
    ushort nsg                   [[simdgroups_per_threadgroup]]) {
  const uint j0 = (tg.x * uint(nsg) + uint(sg)) * COLS;
  const uint h = tg.y;
  const uint dk = uint(p.key_dim);
  const uint dv = uint(p.value_dim);
  if (j0 >= dv || h >= uint(p.value_heads)) {
    return;  // whole simdgroup; this kernel has no threadgroup barriers
  }
  const uint kh = h / uint(p.value_heads / p.key_heads);
  const uint q_off = kh * dk;
  const uint k_off = uint(p.key_heads) * dk + kh * dk;
  const uint v_off = 2u * uint(p.key_heads) * dk + h * dv;
  const ulong head_off = ulong(h) * dk * dv;
  const uint nblocks = (uint(p.rows) + DN_CHUNK - 1u) / DN_CHUNK;

  float s[COLS * DN_CHUNK_PER];  // [c][m]
  CK_UNROLL for (uint c = 0; c < COLS; c++) {
    CK_UNROLL for (uint m = 0; m < DN_CHUNK_PER; m++) {
      const uint i = uint(lane) + 32u * m;
      s[c * DN_CHUNK_PER + m] = j0 + c < dv && i < dk ? S[head_off + ulong(j0 + c) * dk + i] : 0.0f;
    }
  }

  for (uint blk = 0; blk < nblocks; blk++) {
    const uint t0 = blk * DN_CHUNK;
    const uint n = min(uint(DN_CHUNK), uint(p.rows) - t0);
    device const float* w = work + (ulong(h) * nblocks + blk) * DN_CHUNK_FLOATS;
    const uint t = lane;  // this lane's row of the block, for r, delta and o

    // S0^T k_t and S0^T q_t (raw rows; the factors are in the work region).
    float sk[COLS], sq[COLS];
    CK_UNROLL for (uint c = 0; c < COLS; c++) {
      sk[c] = 0.0f;
      sq[c] = 0.0f;
    }
    dn_chunk_project<COLS>(p, qkv, k_off, q_off, t0, n, dk, s, sk, sq, lane);

    // r_t = v_t - e^G_t rk_t (S0^T k_t), then delta = T diag(beta) r.
    const float kc = w[DN_CHUNK_KC + t];
    device const float* vrow = seq_row(qkv, p.qkv_stride, t0 + min(t, n - 1u)) + v_off;
    float r[COLS], delta[COLS], out[COLS];
    CK_UNROLL for (uint c = 0; c < COLS; c++) {
      r[c] = t < n && j0 + c < dv ? vrow[j0 + c] - kc * sk[c] : 0.0f;
      delta[c] = 0.0f;
    }
    for (uint i = 0; i < n; i++) {
      const float tb = w[DN_CHUNK_TB + i * DN_CHUNK + t];
      CK_UNROLL for (uint c = 0; c < COLS; c++) {
        delta[c] = fma(tb, simd_broadcast(r[c], ushort(i)), delta[c]);
      }
    }

    // o_t = e^G_t rq_t (S0^T q_t) + sum_i P[t][i] delta_i; S = e^G_last S0 + sum_i e^(G_last - G_i) k^_i delta_i.
    const float qc = w[DN_CHUNK_QC + t];
    const float gl = w[DN_CHUNK_GL];
    CK_UNROLL for (uint c = 0; c < COLS; c++) {
      out[c] = qc * sq[c];
      CK_UNROLL for (uint m = 0; m < DN_CHUNK_PER; m++) {
        s[c * DN_CHUNK_PER + m] *= gl;
      }
    }
    for (uint i = 0; i < n; i++) {
      const float pt = w[DN_CHUNK_P + i * DN_CHUNK + t];
      const float ku = w[DN_CHUNK_KU + i];
      device const float* krow = seq_row(qkv, p.qkv_stride, t0 + i) + k_off;
      float kx[DN_CHUNK_PER];
      CK_UNROLL for (uint m = 0; m < DN_CHUNK_PER; m++) {
        const uint e = uint(lane) + 32u * m;
        kx[m] = e < dk ? ku * krow[e] : 0.0f;
      }
      CK_UNROLL for (uint c = 0; c < COLS; c++) {
        const float d = simd_broadcast(delta[c], ushort(i));
        out[c] = fma(pt, d, out[c]);
        CK_UNROLL for (uint m = 0; m < DN_CHUNK_PER; m++) {
          s[c * DN_CHUNK_PER + m] = fma(kx[m], d, s[c * DN_CHUNK_PER + m]);
        }
      }
    }
    if (t < n) {
      device float* orow = seq_row(o, p.o_stride, t0 + t) + h * dv;
      CK_UNROLL for (uint c = 0; c < COLS; c++) {
        if (j0 + c < dv) {
          orow[j0 + c] = out[c];
        }
      }
    }
  }

  CK_UNROLL for (uint c = 0; c < COLS; c++) {
    CK_UNROLL for (uint m = 0; m < DN_CHUNK_PER; m++) {
      const uint i = uint(lane) + 32u * m;
      if (j0 + c < dv && i < dk) {
        S[head_off + ulong(j0 + c) * dk + i] = s[c * DN_CHUNK_PER + m];
      }
    }
  }
}

template [[host_name("deltanet_chunk_scan_f32")]] kernel decltype(deltanet_chunk_scan<2>) deltanet_chunk_scan<2>;
template [[host_name("deltanet_chunk_scan_c4_f32")]] kernel decltype(deltanet_chunk_scan<4>) deltanet_chunk_scan<4>;

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
