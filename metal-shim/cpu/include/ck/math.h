// MSL math, relational and geometric functions for the CPU prelude (float, half, integer
// scalars; vectors element by element): the scalar overloads, on top of the shared part
// (metal-shim/common/prelude/math.h). precise:: and fast:: are the same functions: the CPU
// is always precise.
#pragma once
#include "types.h"
#include "prelude/math.h"

namespace metal {
namespace ck_math {

// float versions call the compiler builtins; half versions round through float.
#define CK_FLOAT1(name, expr)                                               \
  inline float name(float x) { return expr; }                               \
  inline half name(half h) { return half(name(float(h))); }                 \
  CK_MAP1(name)
#define CK_FLOAT2(name, expr)                                               \
  inline float name(float x, float y) { return expr; }                      \
  inline half name(half a, half b) { return half(name(float(a), float(b))); } \
  CK_MAP2(name)

CK_FLOAT_FUNCTIONS(CK_FLOAT1, CK_FLOAT2)
CK_FLOAT1(exp10, __builtin_powf(10.0f, x))
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

#undef CK_FLOAT1
#undef CK_FLOAT2
#undef CK_MAP1
#undef CK_MAP2
#undef CK_MAP3
}  // namespace ck_math

template <>
struct numeric_limits<half> {
  static constexpr half max() { return half(HALF_MAX); }
  static constexpr half min() { return half(HALF_MIN); }
  static constexpr half lowest() { return half(-HALF_MAX); }
  static constexpr half epsilon() { return half(HALF_EPSILON); }
  static constexpr half infinity() { return half(__builtin_inff()); }
};
}  // namespace metal
