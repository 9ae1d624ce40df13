// Scalar and vector types of MSL, shared by the CPU and CUDA preludes (metal-shim/cpu/include,
// metal-shim/cuda/include): half, bfloat, ck_vec<T, N> with its names (float4, uint2...) and
// as_type. Every member is CK_HD: CUDA host code may use them too.
// They live in namespace ckm: nvcc's own headers already declare float4, uint2... in the
// global namespace, so each generated CUDA file brings ckm's names into the kernels' namespace
// (cuda/include/ck/names.h); the CPU prelude brings them into the global namespace.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "fn.h"

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

namespace ckm {

#if !defined(__CUDACC__) && !defined(CK_SOFT_HALF) && \
    (defined(__clang__) || __GNUC__ >= 13 || (__GNUC__ == 12 && defined(__x86_64__)))
// half on the CPU: IEEE binary16, native where the compiler has _Float16 in C++ (clang;
// GCC >= 12 on x86-64, >= 13 on arm64; __FLT16_MAX__ does not tell).
typedef _Float16 half;
#else
// Otherwise (CUDA; other CPU compilers) a storage type: arithmetic happens in float, as for
// bfloat. Conversions round to nearest even; on a CUDA device they are PTX's cvt instructions,
// which cannot be constexpr.
#ifdef __CUDACC__
#define CK_HALF_CONSTEXPR
#else
#define CK_HALF_CONSTEXPR constexpr
#endif
struct half {
  uint16_t bits;
  half() = default;
  CK_HD CK_HALF_CONSTEXPR half(float f) : bits(from_float(f)) {}
  CK_HD CK_HALF_CONSTEXPR half(double d) : half(float(d)) {}
  CK_HD CK_HALF_CONSTEXPR half(int i) : half(float(i)) {}
  CK_HD CK_HALF_CONSTEXPR half(uint i) : half(float(i)) {}
  CK_HD CK_HALF_CONSTEXPR operator float() const { return to_float(bits); }
  CK_HD half &operator+=(float o) { return *this = half(float(*this) + o); }
  CK_HD half &operator-=(float o) { return *this = half(float(*this) - o); }
  CK_HD half &operator*=(float o) { return *this = half(float(*this) * o); }
  CK_HD half &operator/=(float o) { return *this = half(float(*this) / o); }
  CK_HD half operator-() const { half r; r.bits = uint16_t(bits ^ 0x8000u); return r; }

  // Round to nearest even, with subnormals, infinities and NaN.
  static CK_HD CK_HALF_CONSTEXPR uint16_t from_float(float f) {
#ifdef __CUDA_ARCH__
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    uint32_t u = __builtin_bit_cast(uint32_t, f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);             // NaN
    if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);            // overflow -> inf
    if (a >= 0x38800000u) {                                           // normal
      uint32_t r = a - 0x38000000u;                                   // rebias 127 -> 15
      r = r + 0xfffu + ((r >> 13) & 1u);
      return uint16_t(sign | (r >> 13));
    }
    if (a < 0x33000000u) return uint16_t(sign);                       // below half the smallest subnormal
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - (a >> 23);                                // 14..24
    uint32_t r = mant >> shift;
    uint32_t rest = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (r & 1u))) r++;
    return uint16_t(sign | r);
#endif
  }
  static CK_HD CK_HALF_CONSTEXPR float to_float(uint16_t h) {
#ifdef __CUDA_ARCH__
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 31) return __builtin_bit_cast(float, sign | 0x7f800000u | (m << 13));
    if (e != 0) return __builtin_bit_cast(float, sign | ((e + 112u) << 23) | (m << 13));
    float v = float(m) * 0x1p-24f;                                    // subnormal
    return sign ? -v : v;
#endif
  }
};
#undef CK_HALF_CONSTEXPR
#endif

// bfloat: the top 16 bits of a float; arithmetic happens in float.
struct bfloat {
  uint16_t bits;
  bfloat() = default;
  CK_HD bfloat(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = uint16_t((u >> 16) | 0x40);  // quiet NaN
    } else {
      bits = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // round to nearest even
    }
  }
  CK_HD bfloat(half h) : bfloat(float(h)) {}
  CK_HD bfloat(double d) : bfloat(float(d)) {}
  CK_HD bfloat(int i) : bfloat(float(i)) {}
  CK_HD bfloat(uint i) : bfloat(float(i)) {}
  CK_HD operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  CK_HD bfloat &operator+=(float o) { return *this = bfloat(float(*this) + o); }
  CK_HD bfloat &operator-=(float o) { return *this = bfloat(float(*this) - o); }
  CK_HD bfloat &operator*=(float o) { return *this = bfloat(float(*this) * o); }
  CK_HD bfloat &operator/=(float o) { return *this = bfloat(float(*this) / o); }
  CK_HD bfloat operator-() const { bfloat r; r.bits = uint16_t(bits ^ 0x8000u); return r; }
};

}  // namespace ckm

namespace ck {
using ckm::half;
using ckm::bfloat;
template <class T>
struct is_scalar
    : std::integral_constant<bool, std::is_arithmetic<T>::value || std::is_same<T, half>::value ||
                                       std::is_same<T, bfloat>::value> {};
}  // namespace ck

// ---- vectors: ck_vec<T, N> with .x .y .z .w and [i]; no swizzles ----------

namespace ckm {
template <class T, int N>
struct ck_vec_storage;
template <class T>
struct alignas(2 * sizeof(T)) ck_vec_storage<T, 2> {
  union { struct { T x, y; }; T v[2]; };
};
template <class T>
struct alignas(4 * sizeof(T)) ck_vec_storage<T, 3> {  // 3-vectors take the room of 4, as in MSL
  union { struct { T x, y, z; }; T v[4]; };
};
template <class T>
struct alignas(4 * sizeof(T)) ck_vec_storage<T, 4> {
  union { struct { T x, y, z, w; }; T v[4]; };
};

template <class T, int N>
struct ck_vec;
}  // namespace ckm

namespace ck {
using ckm::ck_vec;
template <class A>
struct components : std::integral_constant<int, 1> {};
template <class T, int N>
struct components<ck_vec<T, N>> : std::integral_constant<int, N> {};

template <class T, class A>
CK_HD void fill(T *v, int &i, const A &a) {
  if constexpr (components<A>::value == 1) {
    v[i++] = T(a);
  } else {
    CK_PRELUDE_UNROLL for (int k = 0; k < components<A>::value; k++) v[i++] = T(a.v[k]);
  }
}
}  // namespace ck

namespace ckm {
template <class T, int N>
struct ck_vec : ck_vec_storage<T, N> {
  using value_type = T;
  static constexpr int size = N;

  ck_vec() = default;
  // Scalar to vector replicates (MSL's implicit scalar conversion).
  CK_HD ck_vec(T s) {
    CK_PRELUDE_UNROLL for (int i = 0; i < N; i++) this->v[i] = s;
  }
  // Components and shorter vectors, concatenated: float4(a, b, c, d), float4(f2, z, w).
  template <class... A, class = std::enable_if_t<(sizeof...(A) >= 2) &&
                                                 ((ck::components<A>::value + ...) == N)>>
  CK_HD ck_vec(const A &...a) {
    int i = 0;
    (ck::fill(this->v, i, a), ...);
  }
  // Between element types only explicitly: float4(h4).
  template <class U, class = std::enable_if_t<!std::is_same<U, T>::value>>
  CK_HD explicit ck_vec(const ck_vec<U, N> &o) {
    CK_PRELUDE_UNROLL for (int i = 0; i < N; i++) this->v[i] = T(o.v[i]);
  }

  CK_HD T &operator[](int i) { return this->v[i]; }
  CK_HD const T &operator[](int i) const { return this->v[i]; }

#define CK_VEC_BINOP(op)                                                                \
  friend CK_HD ck_vec operator op(const ck_vec &a, const ck_vec &b) {                   \
    ck_vec r;                                                                           \
    CK_PRELUDE_UNROLL for (int i = 0; i < N; i++) r.v[i] = T(a.v[i] op b.v[i]);         \
    return r;                                                                           \
  }                                                                                     \
  CK_HD ck_vec &operator op##=(const ck_vec & b) {                                      \
    CK_PRELUDE_UNROLL for (int i = 0; i < N; i++) this->v[i] = T(this->v[i] op b.v[i]); \
    return *this;                                                                       \
  }
  CK_VEC_BINOP(+)
  CK_VEC_BINOP(-)
  CK_VEC_BINOP(*)
  CK_VEC_BINOP(/)
  CK_VEC_BINOP(%)
  CK_VEC_BINOP(&)
  CK_VEC_BINOP(|)
  CK_VEC_BINOP(^)
  CK_VEC_BINOP(<<)
  CK_VEC_BINOP(>>)
#undef CK_VEC_BINOP

#define CK_VEC_CMP(op)                                                         \
  friend CK_HD ck_vec<bool, N> operator op(const ck_vec &a, const ck_vec &b) { \
    ck_vec<bool, N> r;                                                         \
    CK_PRELUDE_UNROLL for (int i = 0; i < N; i++) r.v[i] = a.v[i] op b.v[i];   \
    return r;                                                                  \
  }
  CK_VEC_CMP(==)
  CK_VEC_CMP(!=)
  CK_VEC_CMP(<)
  CK_VEC_CMP(<=)
  CK_VEC_CMP(>)
  CK_VEC_CMP(>=)
  CK_VEC_CMP(&&)
  CK_VEC_CMP(||)
#undef CK_VEC_CMP

  friend CK_HD ck_vec operator-(const ck_vec &a) {
    ck_vec r;
    CK_PRELUDE_UNROLL for (int i = 0; i < N; i++) r.v[i] = T(-a.v[i]);
    return r;
  }
  friend CK_HD ck_vec operator+(const ck_vec &a) { return a; }
  friend CK_HD ck_vec operator~(const ck_vec &a) {
    ck_vec r;
    CK_PRELUDE_UNROLL for (int i = 0; i < N; i++) r.v[i] = T(~a.v[i]);
    return r;
  }
  friend CK_HD ck_vec<bool, N> operator!(const ck_vec &a) {
    ck_vec<bool, N> r;
    CK_PRELUDE_UNROLL for (int i = 0; i < N; i++) r.v[i] = !a.v[i];
    return r;
  }
};

#define CK_VEC_NAMES(T, name)   \
  typedef ck_vec<T, 2> name##2; \
  typedef ck_vec<T, 3> name##3; \
  typedef ck_vec<T, 4> name##4;
CK_VEC_NAMES(float, float)
CK_VEC_NAMES(half, half)
CK_VEC_NAMES(bfloat, bfloat)
CK_VEC_NAMES(int, int)
CK_VEC_NAMES(uint, uint)
CK_VEC_NAMES(short, short)
CK_VEC_NAMES(ushort, ushort)
CK_VEC_NAMES(char, char)
CK_VEC_NAMES(uchar, uchar)
CK_VEC_NAMES(long, long)
CK_VEC_NAMES(ulong, ulong)
CK_VEC_NAMES(bool, bool)
#undef CK_VEC_NAMES
}  // namespace ckm

static_assert(sizeof(ckm::float3) == 16 && alignof(ckm::float4) == 16 && sizeof(ckm::half2) == 4 &&
                  sizeof(ckm::uchar4) == 4 && sizeof(ckm::bfloat) == 2,
              "vector layout must match MSL");

namespace metal {
using namespace ckm;
// Reinterprets the bits of a value of the same size (MSL as_type).
template <class To, class From>
CK_HD To as_type(const From &from) {
  static_assert(sizeof(To) == sizeof(From), "as_type: sizes differ");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}
}  // namespace metal
