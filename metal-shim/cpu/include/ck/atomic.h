// MSL atomics over device or threadgroup memory (relaxed order, which is all
// MSL offers). Threadgroups run in parallel on several OS threads, so these
// are real atomic instructions.
#pragma once
#include "types.h"
#include "prelude/atomic.h"

namespace metal {

template <class T>
inline T atomic_load_explicit(const volatile atomic<T> *a, memory_order) {
  return __atomic_load_n(&a->value, __ATOMIC_RELAXED);
}
template <class T>
inline void atomic_store_explicit(volatile atomic<T> *a, typename ck_atomic::same<T>::type v, memory_order) {
  __atomic_store_n(&a->value, v, __ATOMIC_RELAXED);
}
template <class T>
inline T atomic_exchange_explicit(volatile atomic<T> *a, typename ck_atomic::same<T>::type v, memory_order) {
  return __atomic_exchange_n(&a->value, v, __ATOMIC_RELAXED);
}
template <class T>
inline bool atomic_compare_exchange_weak_explicit(volatile atomic<T> *a, T *expected,
                                                  typename ck_atomic::same<T>::type desired,
                                                  memory_order, memory_order) {
  return __atomic_compare_exchange_n(&a->value, expected, desired, true, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED);
}

#define CK_ATOMIC_INT_OP(name, builtin)                                               \
  template <class T>                                                                  \
  inline T name(volatile atomic<T> *a, typename ck_atomic::same<T>::type v, memory_order) { \
    static_assert(std::is_integral<T>::value, #name " needs an integer atomic");      \
    return builtin(&a->value, v, __ATOMIC_RELAXED);                                   \
  }
CK_ATOMIC_INT_OP(atomic_fetch_sub_explicit, __atomic_fetch_sub)
CK_ATOMIC_INT_OP(atomic_fetch_and_explicit, __atomic_fetch_and)
CK_ATOMIC_INT_OP(atomic_fetch_or_explicit, __atomic_fetch_or)
CK_ATOMIC_INT_OP(atomic_fetch_xor_explicit, __atomic_fetch_xor)
#undef CK_ATOMIC_INT_OP

// add, min, max: integers natively, float through a compare-and-swap loop.
namespace ck_atomic {
template <class T, class F>
inline T update(volatile atomic<T> *a, F f) {
  T old = __atomic_load_n(&a->value, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(&a->value, &old, f(old), true, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
  }
  return old;
}
template <class F>
inline float update(volatile atomic<float> *a, F f) {
  auto *bits = reinterpret_cast<volatile uint *>(&a->value);
  uint old = __atomic_load_n(bits, __ATOMIC_RELAXED);
  for (;;) {
    float fo;
    std::memcpy(&fo, &old, 4);
    float fn = f(fo);
    uint nb;
    std::memcpy(&nb, &fn, 4);
    if (__atomic_compare_exchange_n(bits, &old, nb, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      return fo;
  }
}
}  // namespace ck_atomic

template <class T>
inline T atomic_fetch_add_explicit(volatile atomic<T> *a, typename ck_atomic::same<T>::type v, memory_order) {
  if constexpr (std::is_integral<T>::value) return __atomic_fetch_add(&a->value, v, __ATOMIC_RELAXED);
  else return ck_atomic::update(a, [v](T o) { return T(o + v); });
}
template <class T>
inline T atomic_fetch_max_explicit(volatile atomic<T> *a, typename ck_atomic::same<T>::type v, memory_order) {
  return ck_atomic::update(a, [v](T o) { return o < v ? v : o; });
}
template <class T>
inline T atomic_fetch_min_explicit(volatile atomic<T> *a, typename ck_atomic::same<T>::type v, memory_order) {
  return ck_atomic::update(a, [v](T o) { return v < o ? v : o; });
}

}  // namespace metal
