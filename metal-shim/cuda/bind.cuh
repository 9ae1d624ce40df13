// Binds a kernel's parameters for one CUDA thread, from the Launch block and the thread's
// Metal builtins. The generated entry points name one binder per parameter, in order, from
// the parsed [[...]] attributes; the parameter's C++ type, deduced from the kernel
// function, says how to convert. Included only by generated code, after the prelude (so it
// never spells the prelude's macro words).
#pragma once
#include "abi.h"

namespace ck {

// The builtins of one thread. Threads past a partial (dispatchThreads) edge threadgroup do
// not exist in Metal: setup() returns false for them and the entry returns at once.
struct Builtins {
  uint32_t tpig[3], tpitg[3], tgpig[3], ntptg[3], dtptg[3], ntgpg[3], ntpg[3];
  uint32_t index, lane, simdgroup, simdgroups;
};

__device__ __forceinline__ bool setup(const Launch &L, Builtins &b) {
  const uint32_t g[3] = {blockIdx.x, blockIdx.y, blockIdx.z};
  const uint32_t n[3] = {gridDim.x, gridDim.y, gridDim.z};
  uint32_t count = 1;
#pragma unroll
  for (int i = 0; i < 3; i++) {
    uint32_t origin = g[i] * L.tg[i];
    b.ntptg[i] = L.threads[i] - origin < L.tg[i] ? L.threads[i] - origin : L.tg[i];
    b.dtptg[i] = L.tg[i];
    b.tgpig[i] = g[i];
    b.ntgpg[i] = n[i];
    b.ntpg[i] = L.threads[i];
    count *= b.ntptg[i];
  }
  const uint32_t l = threadIdx.x;
  if (l >= count) return false;
  b.tpitg[0] = l % b.ntptg[0];
  b.tpitg[1] = (l / b.ntptg[0]) % b.ntptg[1];
  b.tpitg[2] = l / (b.ntptg[0] * b.ntptg[1]);
#pragma unroll
  for (int i = 0; i < 3; i++) b.tpig[i] = g[i] * L.tg[i] + b.tpitg[i];
  b.index = l;
  b.lane = l & 31u;
  b.simdgroup = l >> 5;
  b.simdgroups = (count + 31u) >> 5;
  return true;
}

template <class T>
__device__ __forceinline__ T builtin3(const uint32_t (&v)[3]) {
  if constexpr (std::is_integral<T>::value) {
    return T(v[0]);
  } else {
    using E = typename T::value_type;
    if constexpr (T::size == 2) return T(E(v[0]), E(v[1]));
    else return T(E(v[0]), E(v[1]), E(v[2]));
  }
}

template <int I>
struct Buf {
  static constexpr int index = I;
  template <class T>
  static __device__ __forceinline__ T get(const Launch &L, const Builtins &) {
    void *p = L.buf[I];
    if constexpr (std::is_pointer<T>::value) {
      return static_cast<T>(p);
    } else {
      static_assert(std::is_reference<T>::value, "a [[buffer(i)]] parameter must be a pointer or a reference");
      return *static_cast<std::remove_reference_t<T> *>(p);
    }
  }
};

#define CK_BUILTIN3(attr, field)                                                       \
  struct attr {                                                                        \
    static constexpr int index = -1;                                                   \
    template <class T>                                                                 \
    static __device__ __forceinline__ T get(const Launch &, const Builtins &b) { return builtin3<T>(b.field); } \
  };
#define CK_BUILTIN1(attr, expr)                                                        \
  struct attr {                                                                        \
    static constexpr int index = -1;                                                   \
    template <class T>                                                                 \
    static __device__ __forceinline__ T get(const Launch &, const Builtins &b) { return T(expr); } \
  };
CK_BUILTIN3(thread_position_in_grid, tpig)
CK_BUILTIN3(thread_position_in_threadgroup, tpitg)
CK_BUILTIN3(threadgroup_position_in_grid, tgpig)
CK_BUILTIN3(threads_per_threadgroup, ntptg)
CK_BUILTIN3(dispatch_threads_per_threadgroup, dtptg)
CK_BUILTIN3(threadgroups_per_grid, ntgpg)
CK_BUILTIN3(threads_per_grid, ntpg)
CK_BUILTIN1(thread_index_in_threadgroup, b.index)
CK_BUILTIN1(thread_index_in_simdgroup, b.lane)
CK_BUILTIN1(simdgroup_index_in_threadgroup, b.simdgroup)
CK_BUILTIN1(simdgroups_per_threadgroup, b.simdgroups)
CK_BUILTIN1(threads_per_simdgroup, kSimdWidth)
CK_BUILTIN1(thread_execution_width, kSimdWidth)
#undef CK_BUILTIN3
#undef CK_BUILTIN1

// Calls kernel F (a __device__ function) with its parameters bound: a direct call.
template <auto F>
struct Invoke;
template <class... Args, void (*F)(Args...)>
struct Invoke<F> {
  template <class... Bs>
  static __device__ __forceinline__ void run(const Launch &L, const Builtins &b) {
    static_assert(sizeof...(Bs) == sizeof...(Args), "gen.ts parsed a different number of parameters than the kernel has");
    F(Bs::template get<Args>(L, b)...);
  }
};

template <class B, class A>
inline void describe_param(KernelInfo &k) {
  if constexpr (B::index >= 0) {
    static_assert(B::index < int(kMaxBuffers), "[[buffer(i)]] index must be below 31");
    k.buffer_mask |= 1u << B::index;
    if constexpr (std::is_reference<A>::value) k.min_bytes[B::index] = uint32_t(sizeof(std::remove_reference_t<A>));
  }
}

// One table entry (host side): the kernel's function type gives the reference sizes.
template <class... Bs, class... Args>
inline KernelInfo describe(void (*)(Args...), const char *name, const char *where, const void *entry) {
  KernelInfo k{name, where, entry, 0, {}};
  (describe_param<Bs, Args>(k), ...);
  return k;
}

}  // namespace ck
