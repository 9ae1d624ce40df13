// Scalar and vector types of MSL for the CPU backend prelude.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

#if !defined(CK_SOFT_HALF) && (defined(__clang__) || __GNUC__ >= 13 || (__GNUC__ == 12 && defined(__x86_64__)))
// half: IEEE binary16, native where the compiler has _Float16 in C++ (clang;
// GCC >= 12 on x86-64, >= 13 on arm64; __FLT16_MAX__ does not tell).
typedef _Float16 half;
#else
// Otherwise a storage type: arithmetic happens in float, as for bfloat.
struct half {
  uint16_t bits;
  half() = default;
  constexpr half(float f) : bits(from_float(f)) {}
  constexpr half(double d) : half(float(d)) {}
  constexpr half(int i) : half(float(i)) {}
  constexpr half(uint i) : half(float(i)) {}
  constexpr operator float() const { return to_float(bits); }
  half &operator+=(float o) { return *this = half(float(*this) + o); }
  half &operator-=(float o) { return *this = half(float(*this) - o); }
  half &operator*=(float o) { return *this = half(float(*this) * o); }
  half &operator/=(float o) { return *this = half(float(*this) / o); }
  half operator-() const { half r; r.bits = uint16_t(bits ^ 0x8000u); return r; }

  // Round to nearest even, with subnormals, infinities and NaN.
  static constexpr uint16_t from_float(float f) {
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
  }
  static constexpr float to_float(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 31) return __builtin_bit_cast(float, sign | 0x7f800000u | (m << 13));
    if (e != 0) return __builtin_bit_cast(float, sign | ((e + 112u) << 23) | (m << 13));
    float v = float(m) * 0x1p-24f;                                    // subnormal
    return sign ? -v : v;
  }
};
#endif

// bfloat: the top 16 bits of a float; arithmetic happens in float.
struct bfloat {
  uint16_t bits;
  bfloat() = default;
  bfloat(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = uint16_t((u >> 16) | 0x40);  // quiet NaN
    } else {
      bits = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // round to nearest even
    }
  }
  bfloat(half h) : bfloat(float(h)) {}
  bfloat(double d) : bfloat(float(d)) {}
  bfloat(int i) : bfloat(float(i)) {}
  bfloat(uint i) : bfloat(float(i)) {}
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  bfloat &operator+=(float o) { return *this = bfloat(float(*this) + o); }
  bfloat &operator-=(float o) { return *this = bfloat(float(*this) - o); }
  bfloat &operator*=(float o) { return *this = bfloat(float(*this) * o); }
  bfloat &operator/=(float o) { return *this = bfloat(float(*this) / o); }
  bfloat operator-() const { bfloat r; r.bits = uint16_t(bits ^ 0x8000u); return r; }
};

namespace ck {
template <class T>
struct is_scalar
    : std::integral_constant<bool, std::is_arithmetic<T>::value || std::is_same<T, half>::value ||
                                       std::is_same<T, bfloat>::value> {};
}  // namespace ck

// ---- vectors: ck_vec<T, N> with .x .y .z .w and [i]; no swizzles ----------

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

namespace ck {
template <class A>
struct components : std::integral_constant<int, 1> {};
template <class T, int N>
struct components<ck_vec<T, N>> : std::integral_constant<int, N> {};

template <class T, class A>
inline void fill(T *v, int &i, const A &a) {
  if constexpr (components<A>::value == 1) {
    v[i++] = T(a);
  } else {
    for (int k = 0; k < components<A>::value; k++) v[i++] = T(a.v[k]);
  }
}
}  // namespace ck

template <class T, int N>
struct ck_vec : ck_vec_storage<T, N> {
  using value_type = T;
  static constexpr int size = N;

  ck_vec() = default;
  // Scalar to vector replicates (MSL's implicit scalar conversion).
  ck_vec(T s) {
    for (int i = 0; i < N; i++) this->v[i] = s;
  }
  // Components and shorter vectors, concatenated: float4(a, b, c, d), float4(f2, z, w).
  template <class... A, class = std::enable_if_t<(sizeof...(A) >= 2) &&
                                                 ((ck::components<A>::value + ...) == N)>>
  ck_vec(const A &...a) {
    int i = 0;
    (ck::fill(this->v, i, a), ...);
  }
  // Between element types only explicitly: float4(h4).
  template <class U, class = std::enable_if_t<!std::is_same<U, T>::value>>
  explicit ck_vec(const ck_vec<U, N> &o) {
    for (int i = 0; i < N; i++) this->v[i] = T(o.v[i]);
  }

  T &operator[](int i) { return this->v[i]; }
  const T &operator[](int i) const { return this->v[i]; }

#define CK_VEC_BINOP(op)                                                    \
  friend ck_vec operator op(const ck_vec &a, const ck_vec &b) {             \
    ck_vec r;                                                               \
    for (int i = 0; i < N; i++) r.v[i] = T(a.v[i] op b.v[i]);               \
    return r;                                                               \
  }                                                                         \
  ck_vec &operator op##=(const ck_vec & b) {                                \
    for (int i = 0; i < N; i++) this->v[i] = T(this->v[i] op b.v[i]);       \
    return *this;                                                           \
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

#define CK_VEC_CMP(op)                                                      \
  friend ck_vec<bool, N> operator op(const ck_vec &a, const ck_vec &b) {    \
    ck_vec<bool, N> r;                                                      \
    for (int i = 0; i < N; i++) r.v[i] = a.v[i] op b.v[i];                  \
    return r;                                                               \
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

  friend ck_vec operator-(const ck_vec &a) {
    ck_vec r;
    for (int i = 0; i < N; i++) r.v[i] = T(-a.v[i]);
    return r;
  }
  friend ck_vec operator+(const ck_vec &a) { return a; }
  friend ck_vec operator~(const ck_vec &a) {
    ck_vec r;
    for (int i = 0; i < N; i++) r.v[i] = T(~a.v[i]);
    return r;
  }
  friend ck_vec<bool, N> operator!(const ck_vec &a) {
    ck_vec<bool, N> r;
    for (int i = 0; i < N; i++) r.v[i] = !a.v[i];
    return r;
  }
};

#define CK_VEC_NAMES(T, name) \
  typedef ck_vec<T, 2> name##2;   \
  typedef ck_vec<T, 3> name##3;   \
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

static_assert(sizeof(float3) == 16 && alignof(float4) == 16 && sizeof(half2) == 4 &&
                  sizeof(uchar4) == 4 && sizeof(bfloat) == 2,
              "vector layout must match MSL");

namespace metal {
// Reinterprets the bits of a value of the same size (MSL as_type).
template <class To, class From>
inline To as_type(const From &from) {
  static_assert(sizeof(To) == sizeof(From), "as_type: sizes differ");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}
}  // namespace metal
