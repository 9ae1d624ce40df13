// MSL atomics (relaxed order, which is all MSL offers) on device or threadgroup memory:
// CUDA's atomic instructions through generic pointers.
#pragma once
#include "math.h"
#include "prelude/atomic.h"

namespace metal {

namespace ck_atomic {
template <class T>
CK_D T *raw(volatile atomic<T> *a) { return const_cast<T *>(&a->value); }
// 32-bit compare-and-swap loop for what CUDA has no instruction for.
template <class T, class F>
CK_D T update(volatile atomic<T> *a, F f) {
  static_assert(sizeof(T) == 4, "a 32-bit atomic");
  unsigned *bits = reinterpret_cast<unsigned *>(raw(a));
  unsigned old = *reinterpret_cast<volatile unsigned *>(bits);
  for (;;) {
    T o;
    std::memcpy(&o, &old, 4);
    T n = f(o);
    unsigned nb;
    std::memcpy(&nb, &n, 4);
    unsigned seen = atomicCAS(bits, old, nb);
    if (seen == old) return o;
    old = seen;
  }
}
}  // namespace ck_atomic

template <class T>
CK_D T atomic_load_explicit(const volatile atomic<T> *a, memory_order) {
  return a->value;
}
template <class T>
CK_D void atomic_store_explicit(volatile atomic<T> *a, typename ck_atomic::same<T>::type v, memory_order) {
  a->value = v;
}
template <class T>
CK_D T atomic_exchange_explicit(volatile atomic<T> *a, typename ck_atomic::same<T>::type v, memory_order) {
  return atomicExch(ck_atomic::raw(a), v);
}
template <class T>
CK_D bool atomic_compare_exchange_weak_explicit(volatile atomic<T> *a, T *expected,
                                                typename ck_atomic::same<T>::type desired, memory_order,
                                                memory_order) {
  T want = *expected;
  T seen;
  if constexpr (std::is_same<T, float>::value) {
    unsigned s = atomicCAS(reinterpret_cast<unsigned *>(ck_atomic::raw(a)), __float_as_uint(want), __float_as_uint(desired));
    seen = __uint_as_float(s);
    if (s == __float_as_uint(want)) return true;
  } else {
    seen = atomicCAS(ck_atomic::raw(a), want, desired);
    if (seen == want) return true;
  }
  *expected = seen;
  return false;
}
template <class T>
CK_D T atomic_fetch_add_explicit(volatile atomic<T> *a, typename ck_atomic::same<T>::type v, memory_order) {
  return atomicAdd(ck_atomic::raw(a), v);
}
template <class T>
CK_D T atomic_fetch_sub_explicit(volatile atomic<T> *a, typename ck_atomic::same<T>::type v, memory_order) {
  static_assert(std::is_integral<T>::value, "atomic_fetch_sub_explicit needs an integer atomic");
  return atomicSub(ck_atomic::raw(a), v);
}
template <class T>
CK_D T atomic_fetch_and_explicit(volatile atomic<T> *a, typename ck_atomic::same<T>::type v, memory_order) {
  return atomicAnd(ck_atomic::raw(a), v);
}
template <class T>
CK_D T atomic_fetch_or_explicit(volatile atomic<T> *a, typename ck_atomic::same<T>::type v, memory_order) {
  return atomicOr(ck_atomic::raw(a), v);
}
template <class T>
CK_D T atomic_fetch_xor_explicit(volatile atomic<T> *a, typename ck_atomic::same<T>::type v, memory_order) {
  return atomicXor(ck_atomic::raw(a), v);
}
template <class T>
CK_D T atomic_fetch_max_explicit(volatile atomic<T> *a, typename ck_atomic::same<T>::type v, memory_order) {
  if constexpr (std::is_integral<T>::value) return atomicMax(ck_atomic::raw(a), v);
  else return ck_atomic::update(a, [v](T o) { return o < v ? v : o; });
}
template <class T>
CK_D T atomic_fetch_min_explicit(volatile atomic<T> *a, typename ck_atomic::same<T>::type v, memory_order) {
  if constexpr (std::is_integral<T>::value) return atomicMin(ck_atomic::raw(a), v);
  else return ck_atomic::update(a, [v](T o) { return v < o ? v : o; });
}

}  // namespace metal
