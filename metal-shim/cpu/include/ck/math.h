// MSL math, relational and geometric functions (float, half, integer
// scalars; vectors element by element). precise:: and fast:: are the same
// functions: the CPU is always precise.
#pragma once
#include <climits>

#include "types.h"

#define INFINITY (__builtin_inff())
#define NAN (__builtin_nanf(""))
#define MAXFLOAT 0x1.fffffep127f
#define FLT_MAX 0x1.fffffep127f
#define FLT_MIN 0x1p-126f
#define FLT_EPSILON 0x1p-23f
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

// Applies a scalar function to each element of vectors.
#define CK_MAP1(name)                                                       \
  template <class T, int N>                                                 \
  inline ck_vec<T, N> name(const ck_vec<T, N> &a) {                         \
    ck_vec<T, N> r;                                                         \
    for (int i = 0; i < N; i++) r.v[i] = name(a.v[i]);                      \
    return r;                                                               \
  }
#define CK_MAP2(name)                                                       \
  template <class T, int N>                                                 \
  inline ck_vec<T, N> name(const ck_vec<T, N> &a, const ck_vec<T, N> &b) {  \
    ck_vec<T, N> r;                                                         \
    for (int i = 0; i < N; i++) r.v[i] = name(a.v[i], b.v[i]);              \
    return r;                                                               \
  }
#define CK_MAP3(name)                                                       \
  template <class T, int N>                                                 \
  inline ck_vec<T, N> name(const ck_vec<T, N> &a, const ck_vec<T, N> &b,    \
                           const ck_vec<T, N> &c) {                         \
    ck_vec<T, N> r;                                                         \
    for (int i = 0; i < N; i++) r.v[i] = name(a.v[i], b.v[i], c.v[i]);      \
    return r;                                                               \
  }

// float versions call the compiler builtins; half versions round through float.
#define CK_FLOAT1(name, expr)                                               \
  inline float name(float x) { return expr; }                               \
  inline half name(half h) { return half(name(float(h))); }                 \
  CK_MAP1(name)
#define CK_FLOAT2(name, expr)                                               \
  inline float name(float x, float y) { return expr; }                      \
  inline half name(half a, half b) { return half(name(float(a), float(b))); } \
  CK_MAP2(name)

CK_FLOAT1(exp, __builtin_expf(x))
CK_FLOAT1(exp2, __builtin_exp2f(x))
CK_FLOAT1(exp10, __builtin_powf(10.0f, x))
CK_FLOAT1(log, __builtin_logf(x))
CK_FLOAT1(log2, __builtin_log2f(x))
CK_FLOAT1(log10, __builtin_log10f(x))
CK_FLOAT1(sqrt, __builtin_sqrtf(x))
CK_FLOAT1(rsqrt, 1.0f / __builtin_sqrtf(x))
CK_FLOAT1(sin, __builtin_sinf(x))
CK_FLOAT1(cos, __builtin_cosf(x))
CK_FLOAT1(tan, __builtin_tanf(x))
CK_FLOAT1(asin, __builtin_asinf(x))
CK_FLOAT1(acos, __builtin_acosf(x))
CK_FLOAT1(atan, __builtin_atanf(x))
CK_FLOAT1(sinh, __builtin_sinhf(x))
CK_FLOAT1(cosh, __builtin_coshf(x))
CK_FLOAT1(tanh, __builtin_tanhf(x))
CK_FLOAT1(floor, __builtin_floorf(x))
CK_FLOAT1(ceil, __builtin_ceilf(x))
CK_FLOAT1(round, __builtin_roundf(x))
CK_FLOAT1(rint, __builtin_rintf(x))
CK_FLOAT1(trunc, __builtin_truncf(x))
CK_FLOAT1(fract, x - __builtin_floorf(x))
CK_FLOAT1(fabs, __builtin_fabsf(x))
CK_FLOAT1(saturate, x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x))
CK_FLOAT1(sign, x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f))
CK_FLOAT2(pow, __builtin_powf(x, y))
CK_FLOAT2(powr, __builtin_powf(x, y))
CK_FLOAT2(atan2, __builtin_atan2f(x, y))
CK_FLOAT2(fmod, __builtin_fmodf(x, y))
CK_FLOAT2(copysign, __builtin_copysignf(x, y))
CK_FLOAT2(fmin, __builtin_fminf(x, y))
CK_FLOAT2(fmax, __builtin_fmaxf(x, y))
CK_FLOAT2(step, y < x ? 0.0f : 1.0f)
inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline half fma(half a, half b, half c) { return half(__builtin_fmaf(float(a), float(b), float(c))); }
CK_MAP3(fma)
inline float mix(float x, float y, float a) { return x + (y - x) * a; }
inline half mix(half x, half y, half a) { return half(mix(float(x), float(y), float(a))); }
CK_MAP3(mix)
inline float divide(float x, float y) { return x / y; }

inline bool isnan(float x) { return __builtin_isnan(x); }
inline bool isinf(float x) { return __builtin_isinf(x); }
inline bool isfinite(float x) { return __builtin_isfinite(x); }
inline bool signbit(float x) { return __builtin_signbit(x); }
inline bool isnan(half x) { return isnan(float(x)); }
inline bool isinf(half x) { return isinf(float(x)); }
inline bool isfinite(half x) { return isfinite(float(x)); }

// min/max/clamp/abs for every scalar type, then vectors.
#define CK_MINMAX(T)                                                        \
  inline T min(T a, T b) { return b < a ? b : a; }                          \
  inline T max(T a, T b) { return a < b ? b : a; }                          \
  inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
CK_MINMAX(char)
CK_MINMAX(uchar)
CK_MINMAX(short)
CK_MINMAX(ushort)
CK_MINMAX(int)
CK_MINMAX(uint)
CK_MINMAX(long)
CK_MINMAX(ulong)
#undef CK_MINMAX
// Floating min/max follow fmin/fmax: a NaN operand yields the other one.
inline float min(float a, float b) { return __builtin_fminf(a, b); }
inline float max(float a, float b) { return __builtin_fmaxf(a, b); }
inline float clamp(float x, float lo, float hi) { return min(max(x, lo), hi); }
inline half min(half a, half b) { return half(min(float(a), float(b))); }
inline half max(half a, half b) { return half(max(float(a), float(b))); }
inline half clamp(half x, half lo, half hi) { return min(max(x, lo), hi); }
CK_MAP2(min)
CK_MAP2(max)
CK_MAP3(clamp)
template <class T, int N>
inline ck_vec<T, N> clamp(const ck_vec<T, N> &x, T lo, T hi) {
  return clamp(x, ck_vec<T, N>(lo), ck_vec<T, N>(hi));
}
inline int abs(int x) { return x < 0 ? -x : x; }
inline long abs(long x) { return x < 0 ? -x : x; }
inline short abs(short x) { return short(x < 0 ? -x : x); }
inline char abs(char x) { return char(x < 0 ? -x : x); }
inline uint abs(uint x) { return x; }
inline float abs(float x) { return __builtin_fabsf(x); }
inline half abs(half x) { return half(__builtin_fabsf(float(x))); }
CK_MAP1(abs)

inline uint popcount(uint x) { return uint(__builtin_popcount(x)); }
inline uint clz(uint x) { return x ? uint(__builtin_clz(x)) : 32u; }
inline uint ctz(uint x) { return x ? uint(__builtin_ctz(x)) : 32u; }
inline ulong popcount(ulong x) { return ulong(__builtin_popcountl(x)); }

// select(a, b, c): c ? b : a, element by element for vectors.
template <class T, class = std::enable_if_t<ck::is_scalar<T>::value>>
inline T select(T a, T b, bool c) {
  return c ? b : a;
}
template <class T, int N>
inline ck_vec<T, N> select(const ck_vec<T, N> &a, const ck_vec<T, N> &b, const ck_vec<bool, N> &c) {
  ck_vec<T, N> r;
  for (int i = 0; i < N; i++) r.v[i] = c.v[i] ? b.v[i] : a.v[i];
  return r;
}
template <int N>
inline bool all(const ck_vec<bool, N> &c) {
  for (int i = 0; i < N; i++)
    if (!c.v[i]) return false;
  return true;
}
template <int N>
inline bool any(const ck_vec<bool, N> &c) {
  for (int i = 0; i < N; i++)
    if (c.v[i]) return true;
  return false;
}
inline bool all(bool c) { return c; }
inline bool any(bool c) { return c; }

// Geometric functions accumulate in float for half/bfloat vectors (the GPU
// may not): keep reductions that need bit-equality in float.
template <class T, int N>
inline T dot(const ck_vec<T, N> &a, const ck_vec<T, N> &b) {
  float s = 0.0f;
  for (int i = 0; i < N; i++) s += float(a.v[i]) * float(b.v[i]);
  return T(s);
}
template <class T, int N>
inline T length(const ck_vec<T, N> &a) {
  return T(__builtin_sqrtf(float(dot(a, a))));
}
template <class T, int N>
inline ck_vec<T, N> normalize(const ck_vec<T, N> &a) {
  return a * ck_vec<T, N>(T(1.0f / float(length(a))));
}
template <class T, int N>
inline T distance(const ck_vec<T, N> &a, const ck_vec<T, N> &b) {
  return length(a - b);
}

#undef CK_FLOAT1
#undef CK_FLOAT2
#undef CK_MAP1
#undef CK_MAP2
#undef CK_MAP3
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
struct numeric_limits<half> {
  static constexpr half max() { return half(HALF_MAX); }
  static constexpr half min() { return half(HALF_MIN); }
  static constexpr half lowest() { return half(-HALF_MAX); }
  static constexpr half epsilon() { return half(HALF_EPSILON); }
  static constexpr half infinity() { return half(__builtin_inff()); }
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
