// The hyper-connection write of one float4 column (MODEL.md "Residual"): the one source of
// hc_write_f32 (hc.metal) and of the producers that write their output into the streams
// themselves instead of storing it (the matvec_hc and moe_down_combine_hc epilogues), so a
// fused producer gives the bits of producer + hc_write_f32.
#ifndef CHERENKOV_HC_H
#define CHERENKOV_HC_H

#include <metal_stdlib>
#include "unroll.h"

using namespace metal;

#define HC_MAX_STREAMS 8

// X'_j[c4] = post_j y + sum_i comb[i][j] X_i[c4] for float4 column c4 of one row's streams
// X ([n][c4s] float4s), k the row's coefficients [pre (n) | post (n) | comb (n * n)]. In
// place: the thread reads every old stream value of its column, at once, before writing any.
inline void hc_write_column(device float4* X, int c4s, int c4, int n, device const float* k, float4 yv) {
  float4 old[HC_MAX_STREAMS];
  CK_UNROLL for (int i = 0; i < HC_MAX_STREAMS; i++) {
    if (i < n) {
      old[i] = X[i * c4s + c4];
    }
  }
  CK_ROLLED for (int j = 0; j < n; j++) {
    {
      float4 v = k[n + j] * yv;
      CK_UNROLL for (int i = 0; i < HC_MAX_STREAMS; i++) {
        if (i < n) {
          v += k[2 * n + i * n + j] * old[i];
        }
      }
      X[j * c4s + c4] = v;
    }
  }
}

// Where a fused producer puts its output: rows of the streams X (x_stride bytes apart) and
// of the site's coefficients, or with `residual` the plain residual X += y (n = 1, no site;
// coeffs unused).
struct HcTarget {
  device uchar* x;
  device const uchar* coeffs;
  ulong x_stride;
  ulong c_stride;
  int streams;
  int c4s;
  bool residual;
};

// The write of y (column c4 of batch row `row`) into the target.
inline void hc_store(HcTarget t, int row, int c4, float4 yv) {
  device float4* X = (device float4*)(t.x + ulong(row) * t.x_stride);
  if (t.residual) {
    X[c4] = X[c4] + yv;
  } else {
    hc_write_column(X, t.c4s, c4, t.streams, (device const float*)(t.coeffs + ulong(row) * t.c_stride), yv);
  }
}

#endif  // CHERENKOV_HC_H
