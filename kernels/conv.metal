// Causal depthwise conv + SiLU over the DeltaNet qkv channels (docs/model.md, Mixer A).
// Weights [C][K]: tap K-1 multiplies the current input, tap k the input K-1-k rows back.
// The per-sequence state is the last K-1 inputs, oldest first, [K-1][C] (the layout of
// lib/reference's DeltaNetState.conv). One thread per channel walks the nb rows in order,
// so the kernel has no synchronisation and the window lives in registers.
#include <metal_stdlib>
#include "params.h"
#include "sequence.h"

using namespace metal;

// Snapshot planes: plane r holds the window after row r ([K-1][C], like the state).
kernel void conv_silu_rows_f32(
    constant ConvParams& p  [[buffer(0)]],
    device const float* x   [[buffer(1)]],
    device const float* w   [[buffer(2)]],
    device float* state     [[buffer(3)]],
    device float* y         [[buffer(4)]],
    device float* snap      [[buffer(5)]],
    uint c                  [[thread_position_in_grid]]) {
  const uint C = uint(p.channels);
  if (c >= C) {
    return;
  }
  const int K = p.taps;
  const int span = K - 1;
  float win[SEQ_CONV_MAX_SPAN];
  float taps[SEQ_CONV_MAX_SPAN + 1];
  for (int k = 0; k < K; k++) {
    taps[k] = w[c * uint(K) + uint(k)];
  }
  for (int k = 0; k < span; k++) {
    win[k] = state[uint(k) * C + c];
  }
  for (int t = 0; t < p.rows; t++) {
    const float xt = seq_row(x, p.x_stride, uint(t))[c];
    float acc = taps[K - 1] * xt;
    for (int k = 0; k < span; k++) {
      acc = fma(taps[k], win[k], acc);
    }
    seq_row(y, p.y_stride, uint(t))[c] = seq_silu(acc);
    for (int k = 0; k + 1 < span; k++) {
      win[k] = win[k + 1];
    }
    if (span > 0) {
      win[span - 1] = xt;
    }
    if (t < p.snap_rows) {
      device float* plane = seq_row(snap, p.plane_stride, uint(t));
      for (int k = 0; k < span; k++) {
        plane[uint(k) * C + c] = win[k];
      }
    }
  }
  for (int k = 0; k < span; k++) {
    state[uint(k) * C + c] = win[k];
  }
}
