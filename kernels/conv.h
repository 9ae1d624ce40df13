// One step of the causal depthwise conv + SiLU over a channel (docs/model.md, Mixer A), shared
// by conv_silu_rows_f32 (conv.metal: a thread a channel walking a batch's rows) and the decode
// projections that form the qkv channels themselves (matvec.metal: one row, the epilogue of
// the channel's simdgroup), so both give the same bits.
#ifndef CHERENKOV_CONV_H
#define CHERENKOV_CONV_H

#include <metal_stdlib>
#include "sequence.h"
#include "unroll.h"

using namespace metal;

// Taps of the register form (the models' kernels have 4: MODEL.md).
#define CONV_REG_TAPS 4

// The pre-activation sum for input xt: tap K-1 times xt, then taps 0..K-2 times the window
// (oldest first) in that order. KMAX: the arrays' constant size (K <= KMAX).
template <int KMAX>
inline float conv_acc(thread const float* taps, thread const float* win, float xt, int K) {
  float acc = 0.0f;
  CK_UNROLL for (int k = 0; k < KMAX; k++) {
    if (k == K - 1) {
      acc = taps[k] * xt;
    }
  }
  CK_UNROLL for (int k = 0; k < KMAX - 1; k++) {
    if (k < K - 1) {
      acc = fma(taps[k], win[k], acc);
    }
  }
  return acc;
}

// A decode row of channel c (of C; K <= CONV_REG_TAPS taps, weights w [C][K], state [K-1][C]
// oldest first): y[c] = SiLU(conv), and the state shifted by one with xt last. What
// conv_silu_rows_f32 does for a one-row batch without snapshots.
inline void conv_decode_channel(int K, uint C, uint c, float xt, device const float* w, device float* state, device float* y) {
  const int span = K - 1;
  float taps[CONV_REG_TAPS];
  float win[CONV_REG_TAPS - 1];
  CK_UNROLL for (int k = 0; k < CONV_REG_TAPS; k++) {
    taps[k] = k < K ? w[c * uint(K) + uint(k)] : 0.0f;
  }
  CK_UNROLL for (int k = 0; k < CONV_REG_TAPS - 1; k++) {
    win[k] = k < span ? state[uint(k) * C + c] : 0.0f;
  }
  y[c] = seq_silu(conv_acc<CONV_REG_TAPS>(taps, win, xt, K));
  CK_UNROLL for (int k = 0; k < CONV_REG_TAPS - 1; k++) {
    if (k < span) {
      // (the index is clamped only so that no compiler sees win[CONV_REG_TAPS - 1]: k + 1 < span
      // already keeps it inside)
      state[uint(k) * C + c] = k + 1 < span ? win[min(k + 1, CONV_REG_TAPS - 2)] : xt;
    }
  }
}

#endif  // CHERENKOV_CONV_H
