// MSL math, relational and geometric functions for the CUDA prelude. Scalar forms are
// templates: where nvcc's headers already declare the same function for float (expf's
// C++ overloads, min, max...), that non-template overload wins and means the same;
// half and bfloat compute in float. precise:: and fast:: are the same precise functions
// (Metal's default is fast math; the CPU backend and the tests assume precise).
#pragma once
#include <climits>
#include <cmath>

#include "types.h"

#undef isnan
#undef isinf
#undef isfinite
#undef signbit

#define CK_D __device__ __forceinline__

#ifndef INFINITY
#define INFINITY (__builtin_inff())
#endif
#ifndef NAN
#define NAN (__builtin_nanf(""))
#endif
#ifndef MAXFLOAT
#define MAXFLOAT 0x1.fffffep127f
#endif
#ifndef FLT_MAX
#define FLT_MAX 0x1.fffffep127f
#endif
#ifndef FLT_MIN
#define FLT_MIN 0x1p-126f
#endif
#ifndef FLT_EPSILON
#define FLT_EPSILON 0x1p-23f
#endif
#define HALF_MAX 65504.0f
#define HALF_MIN 0x1p-14f
#define HALF_EPSILON 0x1p-10f
#define M_E_F 2.71828182845904523536f
#define M_LOG2E_F 1.44269504088896340736f
#define M_LOG10E_F 0.434294481903251827651f
#define M_LN2_F 0.693147180559945309417f
#define M_LN10_F 2.30258509299404568402f
#define M_PI_F 3.14159265358979323846f
#define M_PI_2_F 1.57079632679489661923f
#define M_PI_4_F 0.785398163397448309616f
#define M_1_PI_F 0.318309886183790671538f
#define M_2_PI_F 0.636619772367581343076f
#define M_2_SQRTPI_F 1.12837916709551257390f
#define M_SQRT2_F 1.41421356237309504880f
#define M_SQRT1_2_F 0.707106781186547524401f

namespace metal {
namespace ck_math {
template <class T>
struct is_fp : std::integral_constant<bool, std::is_same<T, float>::value || std::is_same<T, ckm::half>::value ||
                                                std::is_same<T, ckm::bfloat>::value> {};
#define CK_FP(T) class T, class = std::enable_if_t<is_fp<T>::value>

#define CK_MAP1(name)                                                       \
  template <class T, int N>                                                 \
  CK_D ck_vec<T, N> name(const ck_vec<T, N> &a) {                           \
    ck_vec<T, N> r;                                                         \
    _Pragma("unroll") for (int i = 0; i < N; i++) r.v[i] = name(a.v[i]);    \
    return r;                                                               \
  }
#define CK_MAP2(name)                                                       \
  template <class T, int N>                                                 \
  CK_D ck_vec<T, N> name(const ck_vec<T, N> &a, const ck_vec<T, N> &b) {    \
    ck_vec<T, N> r;                                                         \
    _Pragma("unroll") for (int i = 0; i < N; i++) r.v[i] = name(a.v[i], b.v[i]); \
    return r;                                                               \
  }
#define CK_MAP3(name)                                                       \
  template <class T, int N>                                                 \
  CK_D ck_vec<T, N> name(const ck_vec<T, N> &a, const ck_vec<T, N> &b,      \
                         const ck_vec<T, N> &c) {                           \
    ck_vec<T, N> r;                                                         \
    _Pragma("unroll") for (int i = 0; i < N; i++) r.v[i] = name(a.v[i], b.v[i], c.v[i]); \
    return r;                                                               \
  }

#define CK_FLOAT1(name, expr)                                               \
  template <CK_FP(T)>                                                       \
  CK_D T name(T t) { float x = float(t); return T(expr); }                  \
  CK_MAP1(name)
#define CK_FLOAT2(name, expr)                                               \
  template <CK_FP(T)>                                                       \
  CK_D T name(T a, T b) { float x = float(a), y = float(b); return T(expr); } \
  CK_MAP2(name)

CK_FLOAT1(exp, ::expf(x))
CK_FLOAT1(exp2, ::exp2f(x))
CK_FLOAT1(exp10, ::exp10f(x))
CK_FLOAT1(log, ::logf(x))
CK_FLOAT1(log2, ::log2f(x))
CK_FLOAT1(log10, ::log10f(x))
CK_FLOAT1(sqrt, ::sqrtf(x))
CK_FLOAT1(rsqrt, 1.0f / ::sqrtf(x))
CK_FLOAT1(sin, ::sinf(x))
CK_FLOAT1(cos, ::cosf(x))
CK_FLOAT1(tan, ::tanf(x))
CK_FLOAT1(asin, ::asinf(x))
CK_FLOAT1(acos, ::acosf(x))
CK_FLOAT1(atan, ::atanf(x))
CK_FLOAT1(sinh, ::sinhf(x))
CK_FLOAT1(cosh, ::coshf(x))
CK_FLOAT1(tanh, ::tanhf(x))
CK_FLOAT1(floor, ::floorf(x))
CK_FLOAT1(ceil, ::ceilf(x))
CK_FLOAT1(round, ::roundf(x))
CK_FLOAT1(rint, ::rintf(x))
CK_FLOAT1(trunc, ::truncf(x))
CK_FLOAT1(fract, x - ::floorf(x))
CK_FLOAT1(fabs, ::fabsf(x))
CK_FLOAT1(saturate, x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x))
CK_FLOAT1(sign, x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f))
CK_FLOAT2(pow, ::powf(x, y))
CK_FLOAT2(powr, ::powf(x, y))
CK_FLOAT2(atan2, ::atan2f(x, y))
CK_FLOAT2(fmod, ::fmodf(x, y))
CK_FLOAT2(copysign, ::copysignf(x, y))
CK_FLOAT2(fmin, ::fminf(x, y))
CK_FLOAT2(fmax, ::fmaxf(x, y))
CK_FLOAT2(step, y < x ? 0.0f : 1.0f)
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

template <class T, class = std::enable_if_t<ck::is_scalar<T>::value>>
CK_D T select(T a, T b, bool c) {
  return c ? b : a;
}
template <class T, int N>
CK_D ck_vec<T, N> select(const ck_vec<T, N> &a, const ck_vec<T, N> &b, const ck_vec<bool, N> &c) {
  ck_vec<T, N> r;
#pragma unroll
  for (int i = 0; i < N; i++) r.v[i] = c.v[i] ? b.v[i] : a.v[i];
  return r;
}
template <int N>
CK_D bool all(const ck_vec<bool, N> &c) {
#pragma unroll
  for (int i = 0; i < N; i++)
    if (!c.v[i]) return false;
  return true;
}
template <int N>
CK_D bool any(const ck_vec<bool, N> &c) {
#pragma unroll
  for (int i = 0; i < N; i++)
    if (c.v[i]) return true;
  return false;
}
CK_D bool all(bool c) { return c; }
CK_D bool any(bool c) { return c; }

// Geometric functions accumulate in float, in component order (as the CPU backend does).
template <class T, int N>
CK_D T dot(const ck_vec<T, N> &a, const ck_vec<T, N> &b) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < N; i++) s += float(a.v[i]) * float(b.v[i]);
  return T(s);
}
template <class T, int N>
CK_D T length(const ck_vec<T, N> &a) {
  return T(::sqrtf(float(dot(a, a))));
}
template <class T, int N>
CK_D ck_vec<T, N> normalize(const ck_vec<T, N> &a) {
  return a * ck_vec<T, N>(T(1.0f / float(length(a))));
}
template <class T, int N>
CK_D T distance(const ck_vec<T, N> &a, const ck_vec<T, N> &b) {
  return length(a - b);
}

#undef CK_FLOAT1
#undef CK_FLOAT2
#undef CK_MAP1
#undef CK_MAP2
#undef CK_MAP3
#undef CK_FP
}  // namespace ck_math

using namespace ck_math;
namespace precise { using namespace ck_math; }
namespace fast { using namespace ck_math; }

template <class T>
struct numeric_limits;
template <>
struct numeric_limits<float> {
  static constexpr float max() { return FLT_MAX; }
  static constexpr float min() { return FLT_MIN; }
  static constexpr float lowest() { return -FLT_MAX; }
  static constexpr float epsilon() { return FLT_EPSILON; }
  static constexpr float infinity() { return __builtin_inff(); }
  static constexpr float quiet_NaN() { return __builtin_nanf(""); }
};
template <>
struct numeric_limits<int> {
  static constexpr int max() { return INT_MAX; }
  static constexpr int min() { return INT_MIN; }
  static constexpr int lowest() { return INT_MIN; }
};
template <>
struct numeric_limits<uint> {
  static constexpr uint max() { return UINT_MAX; }
  static constexpr uint min() { return 0; }
  static constexpr uint lowest() { return 0; }
};
}  // namespace metal
