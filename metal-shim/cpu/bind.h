// Binds a kernel's parameters for one thread. The generated tables name one
// binder per parameter, in order, from the parsed [[...]] attributes (g++
// ignores the attributes themselves); the parameter's C++ type, deduced from
// the kernel function, says how to convert. Included only by generated code,
// after the prelude.
#pragma once
#include <metal_stdlib>

#include "abi.h"

namespace ck {

// A builtin as the kernel declared it: uint, ushort, uint2, uint3, ushort3...
template <class T>
inline T builtin3(const uint32_t (&v)[3]) {
  if constexpr (std::is_integral<T>::value) {
    return T(v[0]);
  } else {
    using E = typename T::value_type;
    if constexpr (T::size == 2) return T(E(v[0]), E(v[1]));
    else return T(E(v[0]), E(v[1]), E(v[2]));
  }
}
template <class T>
inline T builtin1(uint32_t v) {
  static_assert(std::is_integral<T>::value, "this builtin is a scalar integer");
  return T(v);
}

// [[buffer(I)]]: a pointer, or a reference (e.g. `constant Params& p`).
template <int I>
struct Buf {
  static constexpr int index = I;
  template <class T>
  static T get(const ThreadCtx &c) {
    void *p = c.buf[I];
    if constexpr (std::is_pointer<T>::value) {
      return static_cast<T>(p);
    } else {
      static_assert(std::is_reference<T>::value,
                    "a [[buffer(i)]] parameter must be a pointer or a reference");
      return *static_cast<std::remove_reference_t<T> *>(p);
    }
  }
};

#define CK_BUILTIN3(attr, field)                                          \
  struct attr {                                                           \
    static constexpr int index = -1;                                      \
    template <class T>                                                    \
    static T get(const ThreadCtx &c) { return builtin3<T>(c.field); }     \
  };
#define CK_BUILTIN1(attr, expr)                                           \
  struct attr {                                                           \
    static constexpr int index = -1;                                      \
    template <class T>                                                    \
    static T get(const ThreadCtx &c) { return builtin1<T>(expr); }        \
  };
CK_BUILTIN3(thread_position_in_grid, tpig)
CK_BUILTIN3(thread_position_in_threadgroup, tpitg)
CK_BUILTIN3(threadgroup_position_in_grid, tgpig)
CK_BUILTIN3(threads_per_threadgroup, ntptg)
CK_BUILTIN3(dispatch_threads_per_threadgroup, dtptg)
CK_BUILTIN3(threadgroups_per_grid, ntgpg)
CK_BUILTIN3(threads_per_grid, ntpg)
CK_BUILTIN1(thread_index_in_threadgroup, c.index)
CK_BUILTIN1(thread_index_in_simdgroup, c.lane)
CK_BUILTIN1(simdgroup_index_in_threadgroup, c.simdgroup)
CK_BUILTIN1(simdgroups_per_threadgroup, c.simdgroups)
CK_BUILTIN1(threads_per_simdgroup, kSimdWidth)
CK_BUILTIN1(thread_execution_width, kSimdWidth)
#undef CK_BUILTIN3
#undef CK_BUILTIN1

template <class... Bs, class... Args>
inline void call(void (*f)(Args...), const ThreadCtx &c) {
  static_assert(sizeof...(Bs) == sizeof...(Args),
                "gen-bindings parsed a different number of parameters than the kernel has");
  f(Bs::template get<Args>(c)...);
}

template <auto F, class... Bs>
void invoke(const ThreadCtx &c) {
  call<Bs...>(F, c);
}

template <class B, class A>
inline void describe_param(KernelInfo &k) {
  if constexpr (B::index >= 0) {
    static_assert(B::index < int(kMaxBuffers), "[[buffer(i)]] index must be below 31");
    k.buffer_mask |= 1u << B::index;
    if constexpr (std::is_reference<A>::value)
      k.min_bytes[B::index] = uint32_t(sizeof(std::remove_reference_t<A>));
  }
}

template <class... Bs, class... Args>
inline KernelInfo describe(void (*)(Args...), const char *name, const char *where, InvokeFn fn, uint32_t max_threads) {
  KernelInfo k{name, where, fn, 0, {}, max_threads};
  (describe_param<Bs, Args>(k), ...);
  return k;
}

// One table entry: ck::kernel_info<&ns::kernel, ck::Buf<0>, ck::thread_position_in_grid>(...)
template <auto F, class... Bs>
inline KernelInfo kernel_info(const char *name, const char *where, uint32_t max_threads) {
  return describe<Bs...>(F, name, where, &invoke<F, Bs...>, max_threads);
}

}  // namespace ck
