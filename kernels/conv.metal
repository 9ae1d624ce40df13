// Causal depthwise conv + SiLU over the DeltaNet qkv channels (docs/model.md, Mixer A).
// Weights [C][K]: tap K-1 multiplies the current input, tap k the input K-1-k rows back.
// The per-sequence state is the last K-1 inputs, oldest first, [K-1][C] (the layout of
// lib/reference's DeltaNetState.conv). One thread per channel walks the nb rows in order,
// so the kernel has no synchronisation and the window lives in registers.
#include <metal_stdlib>
#include "params.h"
#include "sequence.h"
#include "conv.h"
#include "unroll.h"

using namespace metal;

// Rows a thread walks: a prompt chunk's rows are split into blocks of max(CONV_BLOCK_ROWS,
// K - 1), each thread starting from the K-1 inputs before its block (the state's, before row
// 0; a block is at least K - 1 rows so that only block 0 reads the state, which it also
// writes). One thread walking all of a 1,024-row chunk took 155 us on the H200 (a load a
// row, in order).
#define CONV_BLOCK_ROWS 16

// One thread's block of rows. KMAX > 0: kernels of at most KMAX taps, whose window and taps
// are arrays of constant size indexed by unrolled loops (guarded by the runtime K), so they
// stay in registers; indexed by a runtime K they live on the stack (272 bytes a thread on the
// H200, a local-memory round trip per tap and row: KMAX = 0, any K).
// (The general form's loops have runtime bounds, which clang reports it cannot fully unroll.)
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif
template <int KMAX>
inline void conv_block(constant ConvParams& p, device const float* x, device const float* w, device float* state,
                       device float* y, device float* snap, uint c, int t0) {
  const uint C = uint(p.channels);
  const int K = p.taps;
  const int span = K - 1;
  const int t1 = min(p.rows, t0 + max(CONV_BLOCK_ROWS, span));
  constexpr int N = KMAX > 0 ? KMAX : SEQ_CONV_MAX_SPAN + 1;
  const int kn = KMAX > 0 ? KMAX : K;  // loop bound: a constant in the register form
  float win[N - 1 > 0 ? N - 1 : 1];
  float taps[N];
  CK_UNROLL for (int k = 0; k < kn; k++) {
    taps[k] = k < K ? w[c * uint(K) + uint(k)] : 0.0f;
  }
  CK_UNROLL for (int k = 0; k < kn - 1; k++) {
    const int r = t0 - span + k;
    win[k] = k >= span ? 0.0f : r < 0 ? state[uint(r + span) * C + c] : seq_row(x, p.x_stride, uint(r))[c];
  }
  for (int t = t0; t < t1; t++) {
    const float xt = seq_row(x, p.x_stride, uint(t))[c];
    float acc = 0.0f;
    if (KMAX > 0) {  // the register form: conv.h's sum, which the decode projections share
      acc = conv_acc<KMAX>(taps, win, xt, K);
    } else {
      CK_UNROLL for (int k = 0; k < kn; k++) {
        if (k == K - 1) {
          acc = taps[k] * xt;
        }
      }
      CK_UNROLL for (int k = 0; k < kn - 1; k++) {
        if (k < span) {
          acc = fma(taps[k], win[k], acc);
        }
      }
    }
    seq_row(y, p.y_stride, uint(t))[c] = seq_silu(acc);
    CK_UNROLL for (int k = 0; k + 1 < kn - 1; k++) {
      if (k + 1 < span) {
        win[k] = win[k + 1];
      }
    }
    CK_UNROLL for (int k = 0; k < kn - 1; k++) {
      if (k == span - 1) {
        win[k] = xt;
      }
    }
    if (t < p.snap_rows) {
      device float* plane = seq_row(snap, p.plane_stride, uint(t));
      CK_UNROLL for (int k = 0; k < kn - 1; k++) {
        if (k < span) {
          plane[uint(k) * C + c] = win[k];
        }
      }
    }
  }
  // The new state, written by the thread that read the old one (block 0): its own window
  // when it walked every row, else the last K-1 batch inputs (rows > block >= K - 1).
  if (t0 == 0) {
    CK_UNROLL for (int k = 0; k < kn - 1; k++) {
      if (k < span) {
        state[uint(k) * C + c] = t1 == p.rows ? win[k] : seq_row(x, p.x_stride, uint(p.rows - span + k))[c];
      }
    }
  }
}

// Grid (channels, row blocks). Snapshot planes: plane r holds the window after row r. The
// models' kernels have 4 taps (MODEL.md): that form keeps 4 registers of taps; longer
// kernels (up to SEQ_CONV_MAX_SPAN + 1 taps) take the general form, whose arrays live on
// the stack (a prompt's rows amortise it; registers for 33 taps would cost occupancy).
kernel void conv_silu_rows_f32(
    constant ConvParams& p  [[buffer(0)]],
    device const float* x   [[buffer(1)]],
    device const float* w   [[buffer(2)]],
    device float* state     [[buffer(3)]],
    device float* y         [[buffer(4)]],
    device float* snap      [[buffer(5)]],
    uint2 gid               [[thread_position_in_grid]]) {
  const uint c = gid.x;
  const int t0 = int(gid.y) * max(CONV_BLOCK_ROWS, p.taps - 1);
  if (c >= uint(p.channels) || t0 >= p.rows) {
    return;
  }
  if (p.taps <= CONV_REG_TAPS) {
    conv_block<CONV_REG_TAPS>(p, x, w, state, y, snap, c, t0);
  } else {
    conv_block<0>(p, x, w, state, y, snap, c, t0);
  }
}
