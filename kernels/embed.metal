// Embedding gather: the table row of each row's token id, written into every residual
// stream (n = 1: the plain residual). One thread per (column, row); an id outside the
// vocabulary writes NaN, so the engine's finite check catches it instead of a stray read.
#include <metal_stdlib>
#include "params.h"
#include "matvec.h"

using namespace metal;

template <typename T>
kernel void embed(
    constant EmbedParams& p   [[buffer(0)]],
    device const int* ids     [[buffer(1)]],
    device const uchar* table [[buffer(2)]],
    device uchar* y           [[buffer(3)]],
    uint2 gid                 [[thread_position_in_grid]]) {
  int c = int(gid.x);
  int r = int(gid.y);
  if (c >= p.cols || r >= p.rows) {
    return;
  }
  int t = ids[r];
  float v = NAN;
  if (t >= 0 && t < p.vocab) {
    v = Weights<T>::load1(table, ulong(p.vocab) * ulong(p.cols), ulong(t) * ulong(p.cols) + ulong(c));
  }
  device uchar* yr = y + ulong(r) * p.y_stride + ulong(c) * 4;
  for (int i = 0; i < p.streams; i++) {
    *((device float*)(yr + ulong(i) * p.stream_stride)) = v;
  }
}

template [[host_name("embed_f32_f32")]] kernel decltype(embed<float>) embed<float>;
template [[host_name("embed_bf16_f32")]] kernel decltype(embed<bfloat>) embed<bfloat>;
template [[host_name("embed_f16_f32")]] kernel decltype(embed<half>) embed<half>;
template [[host_name("embed_q4_f32")]] kernel decltype(embed<uchar>) embed<uchar>;
