// N-gram memory, "PLE" (docs/model.md): the hash and gather of table rows, the gate, and
// the dilated causal conv whose output is added to every residual stream.
//   e_t = concat over tables (order-major, then head) of table[row], row = mix % rows,
//         mix = XOR_{i < order} tok[t - i] * mult[i] (u32, wrapping; tok[< 0] = pad_id);
//   s = (k . q) / sqrt(d), s = sign(s) sqrt(max(|s|, 1e-6)), alpha = sigmoid(s),
//   v = alpha (W_v e + b_v), u = RMSNorm(v, conv_norm) (zero-centred),
//   y = v + SiLU(conv(u)) (weights [d][K], dilation D), X_i += y for every stream i.
// The conv history is the last (K-1) D inputs u, oldest first, [(K-1) D][d] (the layout of
// lib/reference's PleState.history); snapshot plane r holds it after row r.
#include <metal_stdlib>
#include "grid.h"
#include "unroll.h"
#include "params.h"
#include "sequence.h"

using namespace metal;

#define PLE_MAX_ORDER 4

inline float ple_value(float x) { return x; }
inline float ple_value(ushort bits) { return as_type<float>(uint(bits) << 16); }  // bf16

// One thread per (row, table, element). tokens holds positions pos0 - history ..
// pos0 + nb - 1 (history >= min(pos0, max order - 1)). Tables of type T (f32, or bf16 read
// as ushort) at byte offsets table_offset[] of the bound buffer. Also writes the row
// indices [nb][tables].
template <typename T>
kernel void ple_gather(
    constant PleGatherParams& p [[buffer(0)]],
    device const int* tokens    [[buffer(1)]],
    device const T* tables      [[buffer(2)]],
    device float* e             [[buffer(3)]],
    device uint* rows_out       [[buffer(4)]],
    uint gid                    [[thread_position_in_grid]]) {
  const uint hd = uint(p.head_dim);
  const uint nt = uint(p.tables);
  if (gid >= uint(p.rows) * nt * hd) {
    return;
  }
  const uint c = gid % hd;
  const uint tb = (gid / hd) % nt;
  const uint t = gid / (hd * nt);
  const int pos = p.pos0 + int(t);
  const int first = p.pos0 - p.history;  // position of tokens[0]
  uint mix = 0;
  for (uint i = 0; i < p.table_order[tb]; i++) {
    const int at = pos - int(i);
    const int tok = at < 0 ? p.pad_id : tokens[at - first];
    mix ^= uint(tok) * p.table_mult[tb * PLE_MAX_ORDER + i];
  }
  const uint row = mix % p.table_rows[tb];
  if (c == 0) {
    rows_out[t * nt + tb] = row;
  }
  device const T* table = (device const T*)((device const char*)tables + p.table_offset[tb]);
  seq_row(e, p.e_stride, t)[tb * hd + c] = ple_value(table[ulong(row) * hd + c]);
}

template [[host_name("ple_gather_f32")]] kernel decltype(ple_gather<float>) ple_gather<float>;
template [[host_name("ple_gather_bf16")]] kernel decltype(ple_gather<ushort>) ple_gather<ushort>;

// ple_gate_f32's row in float4s (p.vec4: d % 4 == 0, every row and vector 16-byte aligned),
// PLE_LOADS of them in flight a lane and array: one simdgroup walking a 2,048-wide row a
// float at a time took 55 us on the H200 (a chain of dependent trips to memory).
#define PLE_LOADS 4
inline void ple_gate_row4(constant PleGateParams& p, device const float* kr, device const float* qr, device const float* vr,
                          device const float* v_bias, device const float* cnorm, device float* vo, device float* uo, ushort lane) {
  const uint d4 = uint(p.dim) / 4u;
  const uint step = 32u * PLE_LOADS;
  device const float4* k4 = (device const float4*)kr;
  device const float4* q4 = (device const float4*)qr;
  device const float4* v4 = (device const float4*)vr;
  device const float4* b4 = (device const float4*)v_bias;
  device const float4* n4 = (device const float4*)cnorm;
  device float4* vo4 = (device float4*)vo;
  device float4* uo4 = (device float4*)uo;
  float4 kq = float4(0.0f);
  for (uint c = lane; c < d4; c += step) {
    float4 a[PLE_LOADS], b[PLE_LOADS];
    CK_UNROLL for (int u = 0; u < PLE_LOADS; u++) {
      const uint i = c + 32u * uint(u);
      a[u] = i < d4 ? k4[i] : float4(0.0f);
      b[u] = i < d4 ? q4[i] : float4(0.0f);
    }
    CK_UNROLL for (int u = 0; u < PLE_LOADS; u++) {
      kq = fma(a[u], b[u], kq);
    }
  }
  float s = simd_sum((kq.x + kq.y) + (kq.z + kq.w)) / p.norm;
  s = sign(s) * sqrt(max(fabs(s), 1e-6f));
  const float alpha = seq_sigmoid(s);
  float4 ss = float4(0.0f);
  for (uint c = lane; c < d4; c += step) {
    float4 a[PLE_LOADS], b[PLE_LOADS];
    CK_UNROLL for (int u = 0; u < PLE_LOADS; u++) {
      const uint i = c + 32u * uint(u);
      a[u] = i < d4 ? v4[i] : float4(0.0f);
      b[u] = i < d4 ? b4[i] : float4(0.0f);
    }
    CK_UNROLL for (int u = 0; u < PLE_LOADS; u++) {
      const uint i = c + 32u * uint(u);
      const float4 x = alpha * (a[u] + b[u]);
      if (i < d4) {
        vo4[i] = x;
      }
      ss = fma(x, x, ss);
    }
  }
  const float r = rsqrt(simd_sum((ss.x + ss.y) + (ss.z + ss.w)) / float(p.dim) + p.eps);
  for (uint c = lane; c < d4; c += step) {
    float4 a[PLE_LOADS], b[PLE_LOADS];
    CK_UNROLL for (int u = 0; u < PLE_LOADS; u++) {
      const uint i = c + 32u * uint(u);
      a[u] = i < d4 ? vo4[i] : float4(0.0f);
      b[u] = i < d4 ? n4[i] : float4(0.0f);
    }
    CK_UNROLL for (int u = 0; u < PLE_LOADS; u++) {
      const uint i = c + 32u * uint(u);
      if (i < d4) {
        uo4[i] = a[u] * r * (1.0f + b[u]);
      }
    }
  }
}

// One simdgroup per row. Inputs: k = RMSNorm(W_k e + b_k, k_norm), q = RMSNorm(h, q_norm)
// and vin = W_v e (no bias), each [nb][d]. Outputs v and u [nb][d].
kernel void ple_gate_f32(
    constant PleGateParams& p   [[buffer(0)]],
    device const float* k       [[buffer(1)]],
    device const float* q       [[buffer(2)]],
    device const float* vin     [[buffer(3)]],
    device const float* v_bias  [[buffer(4)]],
    device const float* cnorm   [[buffer(5)]],
    device float* v             [[buffer(6)]],
    device float* u             [[buffer(7)]],
    uint tg                     [[threadgroup_position_in_grid]],
    ushort lane                 [[thread_index_in_simdgroup]],
    ushort sg                   [[simdgroup_index_in_threadgroup]],
    ushort nsg                  [[simdgroups_per_threadgroup]]) {
  const uint t = tg * uint(nsg) + uint(sg);
  if (t >= uint(p.rows)) {
    return;  // whole simdgroup
  }
  const uint d = uint(p.dim);
  // The bias and the conv norm's weight (weights: no dispatch writes them) into L2 while the
  // dispatch before finishes: the second and third passes then wait on L2, not memory.
  if (lane == 0) {
    ck_prefetch((device const uchar*)v_bias, d * 4u);
    ck_prefetch((device const uchar*)cnorm, d * 4u);
  }
  ck_inputs_ready();
  device const float* kr = seq_row(k, p.k_stride, t);
  device const float* qr = seq_row(q, p.q_stride, t);
  device const float* vr = seq_row(vin, p.vin_stride, t);
  device float* vo = seq_row(v, p.v_stride, t);
  device float* uo = seq_row(u, p.u_stride, t);
  if (p.vec4 != 0u) {  // uniform
    ple_gate_row4(p, kr, qr, vr, v_bias, cnorm, vo, uo, lane);
    return;
  }
  float kq = 0.0f;
  for (uint c = lane; c < d; c += 32u) {
    kq = fma(kr[c], qr[c], kq);
  }
  float s = simd_sum(kq) / p.norm;
  s = sign(s) * sqrt(max(fabs(s), 1e-6f));
  const float alpha = seq_sigmoid(s);
  float ss = 0.0f;
  for (uint c = lane; c < d; c += 32u) {
    const float x = alpha * (vr[c] + v_bias[c]);
    vo[c] = x;
    ss = fma(x, x, ss);
  }
  const float r = rsqrt(simd_sum(ss) / float(d) + p.eps);
  for (uint c = lane; c < d; c += 32u) {
    uo[c] = vo[c] * r * (1.0f + cnorm[c]);
  }
}

// One thread per channel, rows in order (no synchronisation). X [nb][streams][d] with
// byte strides; every stream of row t gets += y_t. Rows go PLE_CONV_ROWS at a time with their
// loads issued together (u, v, and every stream of X): one row after another, each row's
// loads waited for in turn, a 4-row verify batch took 9.6 us on the H200 where a decode row
// takes 3.7. The same arithmetic in the same order either way.
#define PLE_CONV_ROWS 4
#define PLE_MAX_STREAMS 8  // HC_MAX_STREAMS (lib/gpu/ple.ts checks)
[[max_total_threads_per_threadgroup(256)]] kernel void ple_conv_f32(
    constant PleConvParams& p   [[buffer(0)]],
    device const float* u       [[buffer(1)]],
    device const float* v       [[buffer(2)]],
    device const float* w       [[buffer(3)]],
    device float* history       [[buffer(4)]],
    device float* X             [[buffer(5)]],
    device float* snap          [[buffer(6)]],
    uint c                      [[thread_position_in_grid]]) {
  const uint d = uint(p.dim);
  if (c >= d) {
    return;
  }
  const int K = p.taps;
  const int D = p.dilation;
  const int span = (K - 1) * D;
  float win[SEQ_CONV_MAX_SPAN];
  for (int i = 0; i < span; i++) {
    win[i] = history[uint(i) * d + c];
  }
  device const float* wc = w + c * uint(K);
  for (int t0 = 0; t0 < p.rows; t0 += PLE_CONV_ROWS) {
    const int n = min(PLE_CONV_ROWS, p.rows - t0);
    float ub[PLE_CONV_ROWS], y[PLE_CONV_ROWS];
    float xb[PLE_CONV_ROWS][PLE_MAX_STREAMS];
    CK_UNROLL for (int j = 0; j < PLE_CONV_ROWS; j++) {
      const uint t = uint(t0 + min(j, n - 1));
      ub[j] = seq_row(u, p.u_stride, t)[c];
      y[j] = seq_row(v, p.v_stride, t)[c];
      device const float* xr = seq_row(X, p.x_stride, t);
      CK_UNROLL for (int i = 0; i < PLE_MAX_STREAMS; i++) {
        xb[j][i] = i < p.streams ? seq_row(xr, p.stream_stride, uint(i))[c] : 0.0f;
      }
    }
    CK_UNROLL for (int j = 0; j < PLE_CONV_ROWS; j++) if (j < n) {
      const int t = t0 + j;
      float acc = wc[K - 1] * ub[j];
      for (int k = 0; k + 1 < K; k++) {
        acc = fma(wc[k], win[k * D], acc);
      }
      y[j] += seq_silu(acc);
      for (int i = 0; i + 1 < span; i++) {
        win[i] = win[i + 1];
      }
      if (span > 0) {
        win[span - 1] = ub[j];
      }
      if (t < p.snap_rows) {
        device float* plane = seq_row(snap, p.plane_stride, uint(t));
        for (int i = 0; i < span; i++) {
          plane[uint(i) * d + c] = win[i];
        }
      }
    }
    CK_UNROLL for (int j = 0; j < PLE_CONV_ROWS; j++) if (j < n) {
      device float* xr = seq_row(X, p.x_stride, uint(t0 + j));
      CK_UNROLL for (int i = 0; i < PLE_MAX_STREAMS; i++) if (i < p.streams) {
        seq_row(xr, p.stream_stride, uint(i))[c] = xb[j][i] + y[j];
      }
    }
  }
  for (int i = 0; i < span; i++) {
    history[uint(i) * d + c] = win[i];
  }
}
