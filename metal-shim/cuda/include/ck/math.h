// MSL math, relational and geometric functions for the CUDA prelude, on top of the shared
// part (metal-shim/common/prelude/math.h). Scalar forms are
// templates: where nvcc's headers already declare the same function for float (expf's
// C++ overloads, min, max...), that non-template overload wins and means the same;
// half and bfloat compute in float. precise:: and fast:: are the same precise functions
// (Metal's default is fast math; the CPU backend and the tests assume precise).
#pragma once
#include <cmath>

#include "types.h"
#include "prelude/math.h"

#undef isnan
#undef isinf
#undef isfinite
#undef signbit

#define CK_D __device__ __forceinline__

namespace metal {
namespace ck_math {
template <class T>
struct is_fp : std::integral_constant<bool, std::is_same<T, float>::value || std::is_same<T, ckm::half>::value ||
                                                std::is_same<T, ckm::bfloat>::value> {};
#define CK_FP(T) class T, class = std::enable_if_t<is_fp<T>::value>

#define CK_FLOAT1(name, expr)                                               \
  template <CK_FP(T)>                                                       \
  CK_D T name(T t) { float x = float(t); return T(expr); }                  \
  CK_MAP1(name)
#define CK_FLOAT2(name, expr)                                               \
  template <CK_FP(T)>                                                       \
  CK_D T name(T a, T b) { float x = float(a), y = float(b); return T(expr); } \
  CK_MAP2(name)

CK_FLOAT_FUNCTIONS(CK_FLOAT1, CK_FLOAT2)
CK_FLOAT1(exp10, ::exp10f(x))
template <CK_FP(T)>
CK_D T fma(T a, T b, T c) { return T(::fmaf(float(a), float(b), float(c))); }
CK_MAP3(fma)
template <CK_FP(T)>
CK_D T mix(T x, T y, T a) { return T(float(x) + (float(y) - float(x)) * float(a)); }
CK_MAP3(mix)
CK_D float divide(float x, float y) { return x / y; }

template <CK_FP(T)>
CK_D bool isnan(T x) { return ::isnan(float(x)); }
template <CK_FP(T)>
CK_D bool isinf(T x) { return ::isinf(float(x)); }
template <CK_FP(T)>
CK_D bool isfinite(T x) { return ::isfinite(float(x)); }
template <CK_FP(T)>
CK_D bool signbit(T x) { return ::signbit(float(x)); }

// min/max/clamp: integers compare; floating values follow fmin/fmax (a NaN operand
// yields the other one).
template <class T, class = std::enable_if_t<ck::is_scalar<T>::value>>
CK_D T min(T a, T b) {
  if constexpr (is_fp<T>::value) return T(::fminf(float(a), float(b)));
  else return b < a ? b : a;
}
template <class T, class = std::enable_if_t<ck::is_scalar<T>::value>>
CK_D T max(T a, T b) {
  if constexpr (is_fp<T>::value) return T(::fmaxf(float(a), float(b)));
  else return a < b ? b : a;
}
template <class T, class = std::enable_if_t<ck::is_scalar<T>::value>>
CK_D T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
CK_MAP2(min)
CK_MAP2(max)
CK_MAP3(clamp)
template <class T, int N>
CK_D ck_vec<T, N> clamp(const ck_vec<T, N> &x, T lo, T hi) {
  return clamp(x, ck_vec<T, N>(lo), ck_vec<T, N>(hi));
}
template <class T, class = std::enable_if_t<ck::is_scalar<T>::value>>
CK_D T abs(T x) {
  if constexpr (is_fp<T>::value) return T(::fabsf(float(x)));
  else if constexpr (std::is_unsigned<T>::value) return x;
  else return x < T(0) ? T(-x) : x;
}
CK_MAP1(abs)

CK_D uint popcount(uint x) { return uint(__popc(x)); }
CK_D uint clz(uint x) { return uint(__clz(int(x))); }
CK_D uint ctz(uint x) { return x ? uint(__ffs(int(x)) - 1) : 32u; }
CK_D ulong popcount(ulong x) { return ulong(__popcll((unsigned long long)x)); }

#undef CK_FLOAT1
#undef CK_FLOAT2
#undef CK_MAP1
#undef CK_MAP2
#undef CK_MAP3
#undef CK_FP
}  // namespace ck_math
}  // namespace metal
