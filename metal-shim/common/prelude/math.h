// The part of MSL's math, relational and geometric functions that the CPU and CUDA preludes
// share: constants, the vector-generic functions (select, all, any, dot, length, normalize,
// distance), numeric_limits, and macros each backend's ck/math.h defines its scalar functions
// with. Scalar overloads stay per backend: the CPU declares overloads for float and half,
// CUDA templates that leave nvcc's own float overloads the better match.
#pragma once
#include <climits>

#include "types.h"

// CK_LIBM(f): the C library's float function f, a compiler builtin on the CPU and CUDA's
// device function under nvcc.
#ifdef __CUDACC__
#define CK_LIBM(f) ::f
#else
#define CK_LIBM(f) __builtin_##f
#endif

// <cmath> (which nvcc's headers include) may have defined the C ones already.
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

// Applies a scalar function to each element of vectors. A backend's math.h uses these right
// after declaring the scalar forms (the templates must see them) and #undefs them at its end.
#define CK_MAP1(name)                                                    \
  template <class T, int N>                                              \
  CK_FN ck_vec<T, N> name(const ck_vec<T, N> &a) {                       \
    ck_vec<T, N> r;                                                      \
    CK_PRELUDE_UNROLL for (int i = 0; i < N; i++) r.v[i] = name(a.v[i]); \
    return r;                                                            \
  }
#define CK_MAP2(name)                                                            \
  template <class T, int N>                                                      \
  CK_FN ck_vec<T, N> name(const ck_vec<T, N> &a, const ck_vec<T, N> &b) {        \
    ck_vec<T, N> r;                                                              \
    CK_PRELUDE_UNROLL for (int i = 0; i < N; i++) r.v[i] = name(a.v[i], b.v[i]); \
    return r;                                                                    \
  }
#define CK_MAP3(name)                                                                    \
  template <class T, int N>                                                              \
  CK_FN ck_vec<T, N> name(const ck_vec<T, N> &a, const ck_vec<T, N> &b,                  \
                          const ck_vec<T, N> &c) {                                       \
    ck_vec<T, N> r;                                                                      \
    CK_PRELUDE_UNROLL for (int i = 0; i < N; i++) r.v[i] = name(a.v[i], b.v[i], c.v[i]); \
    return r;                                                                            \
  }

// The float functions both backends compute the same way, as F1(name, expression of float x)
// and F2(name, expression of float x, y); each backend's CK_FLOAT1 and CK_FLOAT2 make the
// scalar and vector overloads. (exp10 differs: the CPU has no exp10f builtin.)
#define CK_FLOAT_FUNCTIONS(F1, F2)                      \
  F1(exp, CK_LIBM(expf)(x))                             \
  F1(exp2, CK_LIBM(exp2f)(x))                           \
  F1(log, CK_LIBM(logf)(x))                             \
  F1(log2, CK_LIBM(log2f)(x))                           \
  F1(log10, CK_LIBM(log10f)(x))                         \
  F1(sqrt, CK_LIBM(sqrtf)(x))                           \
  F1(rsqrt, 1.0f / CK_LIBM(sqrtf)(x))                   \
  F1(sin, CK_LIBM(sinf)(x))                             \
  F1(cos, CK_LIBM(cosf)(x))                             \
  F1(tan, CK_LIBM(tanf)(x))                             \
  F1(asin, CK_LIBM(asinf)(x))                           \
  F1(acos, CK_LIBM(acosf)(x))                           \
  F1(atan, CK_LIBM(atanf)(x))                           \
  F1(sinh, CK_LIBM(sinhf)(x))                           \
  F1(cosh, CK_LIBM(coshf)(x))                           \
  F1(tanh, CK_LIBM(tanhf)(x))                           \
  F1(floor, CK_LIBM(floorf)(x))                         \
  F1(ceil, CK_LIBM(ceilf)(x))                           \
  F1(round, CK_LIBM(roundf)(x))                         \
  F1(rint, CK_LIBM(rintf)(x))                           \
  F1(trunc, CK_LIBM(truncf)(x))                         \
  F1(fract, x - CK_LIBM(floorf)(x))                     \
  F1(fabs, CK_LIBM(fabsf)(x))                           \
  F1(saturate, x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x)) \
  F1(sign, x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f)) \
  F2(pow, CK_LIBM(powf)(x, y))                          \
  F2(powr, CK_LIBM(powf)(x, y))                         \
  F2(atan2, CK_LIBM(atan2f)(x, y))                      \
  F2(fmod, CK_LIBM(fmodf)(x, y))                        \
  F2(copysign, CK_LIBM(copysignf)(x, y))                \
  F2(fmin, CK_LIBM(fminf)(x, y))                        \
  F2(fmax, CK_LIBM(fmaxf)(x, y))                        \
  F2(step, y < x ? 0.0f : 1.0f)

namespace metal {
namespace ck_math {

// select(a, b, c): c ? b : a, element by element for vectors.
template <class T, class = std::enable_if_t<ck::is_scalar<T>::value>>
CK_FN T select(T a, T b, bool c) {
  return c ? b : a;
}
template <class T, int N>
CK_FN ck_vec<T, N> select(const ck_vec<T, N> &a, const ck_vec<T, N> &b, const ck_vec<bool, N> &c) {
  ck_vec<T, N> r;
  CK_PRELUDE_UNROLL for (int i = 0; i < N; i++) r.v[i] = c.v[i] ? b.v[i] : a.v[i];
  return r;
}
template <int N>
CK_FN bool all(const ck_vec<bool, N> &c) {
  CK_PRELUDE_UNROLL for (int i = 0; i < N; i++)
    if (!c.v[i]) return false;
  return true;
}
template <int N>
CK_FN bool any(const ck_vec<bool, N> &c) {
  CK_PRELUDE_UNROLL for (int i = 0; i < N; i++)
    if (c.v[i]) return true;
  return false;
}
CK_FN bool all(bool c) { return c; }
CK_FN bool any(bool c) { return c; }

// Geometric functions accumulate in float, in component order, for half/bfloat vectors too
// (a GPU may not): keep reductions that need bit-equality in float.
template <class T, int N>
CK_FN T dot(const ck_vec<T, N> &a, const ck_vec<T, N> &b) {
  float s = 0.0f;
  CK_PRELUDE_UNROLL for (int i = 0; i < N; i++) s += float(a.v[i]) * float(b.v[i]);
  return T(s);
}
template <class T, int N>
CK_FN T length(const ck_vec<T, N> &a) {
  return T(CK_LIBM(sqrtf)(float(dot(a, a))));
}
template <class T, int N>
CK_FN ck_vec<T, N> normalize(const ck_vec<T, N> &a) {
  return a * ck_vec<T, N>(T(1.0f / float(length(a))));
}
template <class T, int N>
CK_FN T distance(const ck_vec<T, N> &a, const ck_vec<T, N> &b) {
  return length(a - b);
}
}  // namespace ck_math

// precise:: and fast:: are the same functions: both backends are always precise (Metal's
// default is fast math; the tests assume precise).
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
