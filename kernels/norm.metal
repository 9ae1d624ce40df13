// RMSNorm over row batches: whole rows or `heads` vectors of `dim` per row (q_norm/k_norm),
// zero-centred (1 + w) or plain w, and DeltaNet's gated form (* SiLU(z)). One simdgroup
// per vector: lanes stride over it, simd_sum joins the squares, no barriers. In place is
// fine (each lane rewrites only the elements it read).
#include <metal_stdlib>
#include "grid.h"
#include "params.h"
#include "norm.h"

using namespace metal;

// Where vector `unit` (row unit / heads, head unit % heads) of the batch lives in x, y and z.
struct NormUnit {
  device const float* x;
  device float* y;
  device const float* z;
};

inline NormUnit norm_unit(constant RmsNormParams& p, device const uchar* x, device uchar* y, device const uchar* z, uint unit) {
  const int row = int(unit) / p.heads;
  const int head = int(unit) % p.heads;
  NormUnit u;
  u.x = (device const float*)(x + ulong(row) * p.x_stride) + head * p.dim;
  u.y = (device float*)(y + ulong(row) * p.y_stride) + head * p.dim;
  u.z = (device const float*)(z + ulong(row) * p.z_stride) + head * p.dim;
  return u;
}

template <bool GATED>
inline void rms_norm_unit(constant RmsNormParams& p, device const uchar* x, device const float* w, device uchar* y,
                          device const uchar* z, uint unit, ushort lane) {
  const NormUnit u = norm_unit(p, x, y, z, unit);
  rms_norm_vector<GATED>(p.dim, p.eps, p.centred != 0, u.x, w, u.y, u.z, lane);
}

kernel void rms_norm_f32(
    constant RmsNormParams& p [[buffer(0)]],
    device const uchar* x     [[buffer(1)]],
    device const float* w     [[buffer(2)]],
    device uchar* y           [[buffer(3)]],
    uint tg                   [[threadgroup_position_in_grid]],
    ushort sg                 [[simdgroup_index_in_threadgroup]],
    ushort lane               [[thread_index_in_simdgroup]]) {
  uint unit = tg * NORM_SG + sg;
  if (unit >= uint(p.rows * p.heads)) {
    return;  // uniform per simdgroup
  }
  rms_norm_unit<false>(p, x, w, y, x, unit, lane);
}

// RMSNorm of x + b, b one vector for every row (bound as z with z_stride 0; per head at
// head * dim): the PLE layer's k = RMSNorm(W_k e + b_k) in one dispatch instead of ew_add_f32
// then rms_norm_f32, the same bits (BiasedRow).
kernel void rms_norm_bias_f32(
    constant RmsNormParams& p [[buffer(0)]],
    device const uchar* x     [[buffer(1)]],
    device const float* w     [[buffer(2)]],
    device uchar* y           [[buffer(3)]],
    device const uchar* b     [[buffer(4)]],
    uint tg                   [[threadgroup_position_in_grid]],
    ushort sg                 [[simdgroup_index_in_threadgroup]],
    ushort lane               [[thread_index_in_simdgroup]]) {
  const uint unit = tg * NORM_SG + sg;
  if (unit >= uint(p.rows * p.heads)) {
    return;  // uniform per simdgroup
  }
  const NormUnit u = norm_unit(p, x, y, b, unit);  // the bias is z
  // The norm weight and the bias are weights: into L2 while the dispatch before finishes.
  if (lane == 0) {
    ck_prefetch((device const uchar*)w, uint(p.dim) * 4u);
    ck_prefetch((device const uchar*)u.z, uint(p.dim) * 4u);
  }
  ck_inputs_ready();
  // Twice a plain norm's loads in flight: a decode row is this one simdgroup's chain of trips.
  rms_norm_vector<false, 2 * NORM_LOADS>(p.dim, p.eps, p.centred != 0, BiasedRow{u.x, u.z}, w, u.y, u.y, lane);
}

// o * rsqrt(mean(o^2) + eps) * w * SiLU(z) per head (DeltaNet output; w plain when centred = 0).
kernel void rms_norm_gated_f32(
    constant RmsNormParams& p [[buffer(0)]],
    device const uchar* x     [[buffer(1)]],
    device const float* w     [[buffer(2)]],
    device uchar* y           [[buffer(3)]],
    device const uchar* z     [[buffer(4)]],
    uint tg                   [[threadgroup_position_in_grid]],
    ushort sg                 [[simdgroup_index_in_threadgroup]],
    ushort lane               [[thread_index_in_simdgroup]]) {
  uint unit = tg * NORM_SG + sg;
  if (unit >= uint(p.rows * p.heads)) {
    return;
  }
  rms_norm_unit<true>(p, x, w, y, z, unit, lane);
}
