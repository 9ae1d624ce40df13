// Barriers and SIMD-group functions. Every call is a synchronisation point of
// the emulator: the calling thread (a fiber) publishes its value and yields
// until its whole simdgroup (or threadgroup) has arrived. Lanes that have
// returned from the kernel no longer take part, as inactive lanes on a GPU.
// Lanes still running must all make the same sequence of calls (no SIMD
// function inside lane-divergent control flow).
#pragma once
#include "../../abi.h"
#include "math.h"
#include "prelude/barrier.h"

namespace metal {

inline void threadgroup_barrier(mem_flags) { ck::threadgroup_sync(); }
inline void simdgroup_barrier(mem_flags) { ck::simd_exchange(nullptr, 0); }

namespace ck_simd {
template <class T>
inline ck::SimdView exchange(const T &x) {
  static_assert(sizeof(T) <= ck::kSlotBytes, "SIMD functions take values of at most 16 bytes");
  static_assert(std::is_trivially_copyable<T>::value, "SIMD functions take plain values");
  return ck::simd_exchange(&x, sizeof(T));
}
template <class T>
inline T slot(const ck::SimdView &v, uint lane) {
  T t;
  std::memcpy(&t, v.slots + (lane & 31u) * ck::kSlotBytes, sizeof(T));
  return t;
}
inline bool has(const ck::SimdView &v, uint lane) { return (v.active >> lane) & 1u; }
inline uint first(const ck::SimdView &v) { return uint(__builtin_ctz(v.active)); }

// Folds the values of the active lanes in [0, end) with f, in lane order.
template <class T, class F>
inline T fold(const ck::SimdView &v, uint end, T init, F f) {
  T r = init;
  for (uint l = 0; l < end; l++)
    if (has(v, l)) r = f(r, slot<T>(v, l));
  return r;
}
}  // namespace ck_simd

template <class T>
inline T simd_sum(T x) {
  auto v = ck_simd::exchange(x);
  return ck_simd::fold(v, 32, T(0), [](T a, T b) { return T(a + b); });
}
template <class T>
inline T simd_product(T x) {
  auto v = ck_simd::exchange(x);
  return ck_simd::fold(v, 32, T(1), [](T a, T b) { return T(a * b); });
}
template <class T>
inline T simd_max(T x) {
  auto v = ck_simd::exchange(x);
  return ck_simd::fold(v, 32, ck_simd::slot<T>(v, ck_simd::first(v)), [](T a, T b) { return max(a, b); });
}
template <class T>
inline T simd_min(T x) {
  auto v = ck_simd::exchange(x);
  return ck_simd::fold(v, 32, ck_simd::slot<T>(v, ck_simd::first(v)), [](T a, T b) { return min(a, b); });
}
template <class T>
inline T simd_and(T x) {
  auto v = ck_simd::exchange(x);
  return ck_simd::fold(v, 32, T(~T(0)), [](T a, T b) { return T(a & b); });
}
template <class T>
inline T simd_or(T x) {
  auto v = ck_simd::exchange(x);
  return ck_simd::fold(v, 32, T(0), [](T a, T b) { return T(a | b); });
}
template <class T>
inline T simd_xor(T x) {
  auto v = ck_simd::exchange(x);
  return ck_simd::fold(v, 32, T(0), [](T a, T b) { return T(a ^ b); });
}
template <class T>
inline T simd_prefix_exclusive_sum(T x) {
  auto v = ck_simd::exchange(x);
  return ck_simd::fold(v, v.lane, T(0), [](T a, T b) { return T(a + b); });
}
template <class T>
inline T simd_prefix_inclusive_sum(T x) {
  auto v = ck_simd::exchange(x);
  return ck_simd::fold(v, v.lane + 1, T(0), [](T a, T b) { return T(a + b); });
}
template <class T>
inline T simd_prefix_exclusive_product(T x) {
  auto v = ck_simd::exchange(x);
  return ck_simd::fold(v, v.lane, T(1), [](T a, T b) { return T(a * b); });
}
template <class T>
inline T simd_prefix_inclusive_product(T x) {
  auto v = ck_simd::exchange(x);
  return ck_simd::fold(v, v.lane + 1, T(1), [](T a, T b) { return T(a * b); });
}
template <class T, class I>
inline T simd_shuffle(T x, I lane) {
  auto v = ck_simd::exchange(x);
  return ck_simd::slot<T>(v, uint(lane));
}
template <class T, class I>
inline T simd_broadcast(T x, I lane) {
  return simd_shuffle(x, lane);
}
template <class T>
inline T simd_broadcast_first(T x) {
  auto v = ck_simd::exchange(x);
  return ck_simd::slot<T>(v, ck_simd::first(v));
}
template <class T, class I>
inline T simd_shuffle_xor(T x, I mask) {
  auto v = ck_simd::exchange(x);
  return ck_simd::slot<T>(v, v.lane ^ (uint(mask) & 31u));
}
// Lanes whose source would fall off the group keep their own value.
template <class T, class I>
inline T simd_shuffle_down(T x, I delta) {
  auto v = ck_simd::exchange(x);
  uint src = v.lane + uint(delta);
  return src < 32u ? ck_simd::slot<T>(v, src) : x;
}
template <class T, class I>
inline T simd_shuffle_up(T x, I delta) {
  auto v = ck_simd::exchange(x);
  return v.lane >= uint(delta) ? ck_simd::slot<T>(v, v.lane - uint(delta)) : x;
}
template <class T, class I>
inline T simd_shuffle_rotate_down(T x, I delta) {
  auto v = ck_simd::exchange(x);
  return ck_simd::slot<T>(v, (v.lane + uint(delta)) & 31u);
}
template <class T, class I>
inline T simd_shuffle_rotate_up(T x, I delta) {
  auto v = ck_simd::exchange(x);
  return ck_simd::slot<T>(v, (v.lane - uint(delta)) & 31u);
}
inline bool simd_all(bool c) {
  auto v = ck_simd::exchange(c);
  return ck_simd::fold(v, 32, true, [](bool a, bool b) { return a && b; });
}
inline bool simd_any(bool c) {
  auto v = ck_simd::exchange(c);
  return ck_simd::fold(v, 32, false, [](bool a, bool b) { return a || b; });
}
inline bool simd_is_first() {
  auto v = ck::simd_exchange(nullptr, 0);
  return v.lane == ck_simd::first(v);
}

}  // namespace metal
