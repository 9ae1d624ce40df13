// Barriers and SIMD-group functions on warps. A Metal simdgroup is a run of 32
// consecutive thread_index_in_threadgroup values; the generated entry points launch 1-D
// blocks whose thread index is that index, so a simdgroup is exactly a warp. Lanes that
// have returned are inactive: every function works on the lanes of __activemask() (the
// kernels' rule: SIMD functions only in simdgroup-uniform control flow). With all 32 lanes
// live, reductions are xor butterflies (every lane gets the same bits); with some gone, the
// live lanes are folded in lane order.
#pragma once
#include "math.h"
#include "prelude/barrier.h"

namespace metal {

CK_D void threadgroup_barrier(mem_flags) { __syncthreads(); }
CK_D void simdgroup_barrier(mem_flags) { __syncwarp(__activemask()); }

namespace ck_simd {
constexpr unsigned kAll = 0xffffffffu;
CK_D uint lane() { return threadIdx.x & 31u; }

// Shuffles any value of at most 16 bytes, as 32-bit words.
template <class T>
CK_D T shfl(unsigned mask, const T &x, int src) {
  static_assert(sizeof(T) <= 16, "SIMD functions take values of at most 16 bytes");
  constexpr int W = (sizeof(T) + 3) / 4;
  unsigned w[W] = {};
  std::memcpy(w, &x, sizeof(T));
#pragma unroll
  for (int i = 0; i < W; i++) w[i] = __shfl_sync(mask, w[i], src);
  T r;
  std::memcpy(&r, w, sizeof(T));
  return r;
}
template <class T>
CK_D T shfl_xor(const T &x, int m) {
  constexpr int W = (sizeof(T) + 3) / 4;
  unsigned w[W] = {};
  std::memcpy(w, &x, sizeof(T));
#pragma unroll
  for (int i = 0; i < W; i++) w[i] = __shfl_xor_sync(kAll, w[i], m);
  T r;
  std::memcpy(&r, w, sizeof(T));
  return r;
}
template <class T>
CK_D T shfl_up(const T &x, int d) {
  constexpr int W = (sizeof(T) + 3) / 4;
  unsigned w[W] = {};
  std::memcpy(w, &x, sizeof(T));
#pragma unroll
  for (int i = 0; i < W; i++) w[i] = __shfl_up_sync(kAll, w[i], d);
  T r;
  std::memcpy(&r, w, sizeof(T));
  return r;
}

// All live lanes' values folded with f: a butterfly when the warp is whole, else in lane order.
template <class T, class F>
CK_D T reduce(T x, F f) {
  unsigned mask = __activemask();
  if (mask == kAll) {
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) x = f(x, shfl_xor(x, m));
    return x;
  }
  int first = __ffs(int(mask)) - 1;
  T r = shfl(mask, x, first);
  for (int l = first + 1; l < 32; l++)
    if ((mask >> l) & 1u) r = f(r, shfl(mask, x, l));
  return r;
}
// Inclusive prefix over live lanes in lane order (inactive lanes contribute nothing).
template <class T, class F>
CK_D T inclusive(T x, T identity, F f) {
  unsigned mask = __activemask();
  uint me = lane();
  if (mask == kAll) {
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      T y = shfl_up(x, d);
      if (me >= uint(d)) x = f(y, x);
    }
    return x;
  }
  T r = identity;
  for (uint l = 0; l < 32; l++)  // one shuffle per live lane, the same sequence in every lane
    if ((mask >> l) & 1u) {
      T y = shfl(mask, x, int(l));
      if (l <= me) r = f(r, y);
    }
  return r;
}
}  // namespace ck_simd

#define CK_SIMD_REDUCE(name, expr)                                          \
  template <class T>                                                        \
  CK_D T name(T x) {                                                        \
    return ck_simd::reduce(x, [](T a, T b) { return T(expr); });            \
  }
CK_SIMD_REDUCE(simd_sum, a + b)
CK_SIMD_REDUCE(simd_product, a * b)
CK_SIMD_REDUCE(simd_max, max(a, b))
CK_SIMD_REDUCE(simd_min, min(a, b))
CK_SIMD_REDUCE(simd_and, a & b)
CK_SIMD_REDUCE(simd_or, a | b)
CK_SIMD_REDUCE(simd_xor, a ^ b)
#undef CK_SIMD_REDUCE

template <class T>
CK_D T simd_prefix_inclusive_sum(T x) {
  return ck_simd::inclusive(x, T(0), [](T a, T b) { return T(a + b); });
}
template <class T>
CK_D T simd_prefix_exclusive_sum(T x) {
  return T(simd_prefix_inclusive_sum(x) - x);
}
template <class T>
CK_D T simd_prefix_inclusive_product(T x) {
  return ck_simd::inclusive(x, T(1), [](T a, T b) { return T(a * b); });
}
// Exclusive product: the inclusive product of the lane below (1 for the first live lane).
template <class T>
CK_D T simd_prefix_exclusive_product(T x) {
  unsigned mask = __activemask();
  T inc = simd_prefix_inclusive_product(x);
  uint me = ck_simd::lane();
  unsigned below = mask & ((1u << me) - 1u);
  int src = below ? 31 - __clz(int(below)) : int(me);
  T prev = ck_simd::shfl(mask, inc, src);
  return below ? prev : T(1);
}
template <class T, class I>
CK_D T simd_shuffle(T x, I lane) {
  return ck_simd::shfl(__activemask(), x, int(uint(lane) & 31u));
}
template <class T, class I>
CK_D T simd_broadcast(T x, I lane) {
  return simd_shuffle(x, lane);
}
template <class T>
CK_D T simd_broadcast_first(T x) {
  unsigned mask = __activemask();
  return ck_simd::shfl(mask, x, __ffs(int(mask)) - 1);
}
template <class T, class I>
CK_D T simd_shuffle_xor(T x, I mask) {
  return ck_simd::shfl(__activemask(), x, int(ck_simd::lane() ^ (uint(mask) & 31u)));
}
// Lanes whose source would fall off the group keep their own value.
template <class T, class I>
CK_D T simd_shuffle_down(T x, I delta) {
  uint src = ck_simd::lane() + uint(delta);
  T y = ck_simd::shfl(__activemask(), x, int(src & 31u));
  return src < 32u ? y : x;
}
template <class T, class I>
CK_D T simd_shuffle_up(T x, I delta) {
  uint me = ck_simd::lane();
  T y = ck_simd::shfl(__activemask(), x, int((me - uint(delta)) & 31u));
  return me >= uint(delta) ? y : x;
}
template <class T, class I>
CK_D T simd_shuffle_rotate_down(T x, I delta) {
  return ck_simd::shfl(__activemask(), x, int((ck_simd::lane() + uint(delta)) & 31u));
}
template <class T, class I>
CK_D T simd_shuffle_rotate_up(T x, I delta) {
  return ck_simd::shfl(__activemask(), x, int((ck_simd::lane() - uint(delta)) & 31u));
}
CK_D bool simd_all(bool c) { return __all_sync(__activemask(), c); }
CK_D bool simd_any(bool c) { return __any_sync(__activemask(), c); }
CK_D bool simd_is_first() { return ck_simd::lane() == uint(__ffs(int(__activemask())) - 1); }

}  // namespace metal
