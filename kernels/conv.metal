// Causal depthwise conv + SiLU over the DeltaNet qkv channels (docs/model.md, Mixer A).
// Weights [C][K]: tap K-1 multiplies the current input, tap k the input K-1-k rows back.
// The per-sequence state is the last K-1 inputs, oldest first, [K-1][C] (the layout of
// lib/reference's DeltaNetState.conv). One thread per channel walks the nb rows in order,
// so the kernel has no synchronisation and the window lives in registers.
#include <metal_stdlib>
#include "params.h"
#include "sequence.h"

using namespace metal;

// Rows a thread walks: a prompt chunk's rows are split into blocks of max(CONV_BLOCK_ROWS,
// K - 1), each thread starting from the K-1 inputs before its block (the state's, before row
// 0; a block is at least K - 1 rows so that only block 0 reads the state, which it also
// writes). One thread walking all of a 1,024-row chunk took 155 us on the H200 (a load a
// row, in order).
#define CONV_BLOCK_ROWS 16

// Grid (channels, row blocks). Snapshot planes: plane r holds the window after row r.
kernel void conv_silu_rows_f32(
    constant ConvParams& p  [[buffer(0)]],
    device const float* x   [[buffer(1)]],
    device const float* w   [[buffer(2)]],
    device float* state     [[buffer(3)]],
    device float* y         [[buffer(4)]],
    device float* snap      [[buffer(5)]],
    uint2 gid               [[thread_position_in_grid]]) {
  const uint C = uint(p.channels);
  const uint c = gid.x;
  const int K = p.taps;
  const int span = K - 1;
  const int block = max(CONV_BLOCK_ROWS, span);
  const int t0 = int(gid.y) * block;
  if (c >= C || t0 >= p.rows) {
    return;
  }
  const int t1 = min(p.rows, t0 + block);
  float win[SEQ_CONV_MAX_SPAN];
  float taps[SEQ_CONV_MAX_SPAN + 1];
  for (int k = 0; k < K; k++) {
    taps[k] = w[c * uint(K) + uint(k)];
  }
  for (int k = 0; k < span; k++) {
    const int r = t0 - span + k;
    win[k] = r < 0 ? state[uint(r + span) * C + c] : seq_row(x, p.x_stride, uint(r))[c];
  }
  for (int t = t0; t < t1; t++) {
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
  // The new state, written by the thread that read the old one (block 0): its own window
  // when it walked every row, else the last K-1 batch inputs (rows > block >= K - 1).
  if (t0 == 0) {
    for (int k = 0; k < span; k++) {
      state[uint(k) * C + c] = t1 == p.rows ? win[k] : seq_row(x, p.x_stride, uint(p.rows - span + k))[c];
    }
  }
}
