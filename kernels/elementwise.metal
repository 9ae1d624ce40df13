// Elementwise ops over [rows][cols] with row strides, one thread per element:
// add (residual), SiLU(a) * b (gated MLP), a * sigmoid(b) (attention gate), a + scale * b.
// y may alias a (in-place residual updates).
#include <metal_stdlib>
#include "params.h"

using namespace metal;

#define EW_ADD 0
#define EW_SILU_MUL 1
#define EW_SIGMOID_MUL 2
#define EW_SCALE_ADD 3

template <int OP>
inline float ew_apply(float a, float b, float s) {
  if (OP == EW_ADD) {
    return a + b;
  } else if (OP == EW_SILU_MUL) {
    return a / (1.0f + exp(-a)) * b;
  } else if (OP == EW_SIGMOID_MUL) {
    return a / (1.0f + exp(-b));
  } else {
    return a + s * b;
  }
}

template <int OP>
kernel void ew(
    constant ElementwiseParams& p [[buffer(0)]],
    device const uchar* a         [[buffer(1)]],
    device const uchar* b         [[buffer(2)]],
    device uchar* y               [[buffer(3)]],
    uint2 gid                     [[thread_position_in_grid]]) {
  int c = int(gid.x);
  int r = int(gid.y);
  if (c >= p.cols || r >= p.rows) {
    return;
  }
  float av = ((device const float*)(a + ulong(r) * p.a_stride))[c];
  float bv = ((device const float*)(b + ulong(r) * p.b_stride))[c];
  ((device float*)(y + ulong(r) * p.y_stride))[c] = ew_apply<OP>(av, bv, p.scale);
}

template [[host_name("ew_add_f32")]] kernel decltype(ew<EW_ADD>) ew<EW_ADD>;
template [[host_name("ew_silu_mul_f32")]] kernel decltype(ew<EW_SILU_MUL>) ew<EW_SILU_MUL>;
template [[host_name("ew_sigmoid_mul_f32")]] kernel decltype(ew<EW_SIGMOID_MUL>) ew<EW_SIGMOID_MUL>;
template [[host_name("ew_scale_add_f32")]] kernel decltype(ew<EW_SCALE_ADD>) ew<EW_SCALE_ADD>;
