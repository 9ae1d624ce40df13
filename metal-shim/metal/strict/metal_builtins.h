// Strict-check prelude, part 1: what the Metal Shading Language has without
// any #include. check.ts force-includes it (clang -include) before each
// kernels/*.metal compiled as C++17 by clang-19 with -fsyntax-only.
//
// Its purpose is to make clang reject what Apple's Metal compiler rejects
// where the CPU backend's permissive prelude cannot:
//  - device, constant and threadgroup are distinct address spaces, so a
//    threadgroup pointer cannot become a device pointer, a device pointer
//    cannot be passed where a thread (plain) pointer is expected, and
//    constant data is read-only;
//  - vector constructors must add up to the vector's size;
//  - double does not exist (poisoned at the end of metal_stdlib).
// Only declarations: nothing here is ever run. Written for this project.
#pragma once

#define device __attribute__((address_space(1)))
#define constant const __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define thread
#define kernel

// ---- scalar types ----------------------------------------------------------------
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef __INT8_TYPE__ int8_t;
typedef __INT16_TYPE__ int16_t;
typedef __INT32_TYPE__ int32_t;
typedef __INT64_TYPE__ int64_t;
typedef __UINT8_TYPE__ uint8_t;
typedef __UINT16_TYPE__ uint16_t;
typedef __UINT32_TYPE__ uint32_t;
typedef __UINT64_TYPE__ uint64_t;
typedef __SIZE_TYPE__ size_t;
typedef __PTRDIFF_TYPE__ ptrdiff_t;
typedef _Float16 half;
typedef __bf16 bfloat;
#define offsetof(type, member) __builtin_offsetof(type, member)

// ---- vectors -------------------------------------------------------------------------
// Clang's ext_vector_type gives MSL's swizzles (.xy, .zw, .rgba), element
// indexing and element-wise arithmetic with scalar broadcast. Constructors
// (float4(a, b), float4(x), float4(h4)) are function-like macros: a name such
// as float4 is only replaced when a '(' follows it, so it stays a type name
// everywhere else.
namespace ck_strict {
template <class T>
struct components {
  static constexpr int n = 1;
};
template <class E, int N>
struct components<E __attribute__((ext_vector_type(N)))> {
  static constexpr int n = N;
};
template <int N>
struct bvec;
template <int N>
struct components<bvec<N>> {
  static constexpr int n = N;
};
template <class... A>
constexpr int sum_components() {
  return (0 + ... + components<A>::n);
}
// V(a, b, ...): one scalar (replicated), one vector of V's size (converted),
// or scalars and vectors that add up to V's size.
template <class V, class... A>
V make(A... parts) {
  static_assert(sizeof...(A) == 0 || (sizeof...(A) == 1 && sum_components<A...>() == 1) ||
                    sum_components<A...>() == components<V>::n,
                "vector constructor: the components given do not add up to the vector's size");
  return V();
}

// Boolean vectors: what comparisons of vectors yield and select/all/any take.
// (A class, so that a comparison of any element type converts to it.)
template <int N>
struct bvec {
  bool x, y, z, w;
  bvec() = default;
  bvec(bool b);
  template <class V, class = decltype(V() < V()), class = char[components<V>::n == N ? 1 : -1]>
  bvec(V comparison);
  bool operator[](int i) const;
  friend bvec operator!(bvec a);
  friend bvec operator&&(bvec a, bvec b);
  friend bvec operator||(bvec a, bvec b);
  friend bvec operator==(bvec a, bvec b);
  friend bvec operator!=(bvec a, bvec b);
};
}  // namespace ck_strict

#define CK_STRICT_VECTORS(T, name)                                   \
  typedef T name##2 __attribute__((ext_vector_type(2)));             \
  typedef T name##3 __attribute__((ext_vector_type(3)));             \
  typedef T name##4 __attribute__((ext_vector_type(4)));             \
  typedef T packed_##name##2 __attribute__((ext_vector_type(2), aligned(sizeof(T)))); \
  typedef T packed_##name##3 __attribute__((ext_vector_type(3), aligned(sizeof(T)))); \
  typedef T packed_##name##4 __attribute__((ext_vector_type(4), aligned(sizeof(T))));
CK_STRICT_VECTORS(float, float)
CK_STRICT_VECTORS(half, half)
CK_STRICT_VECTORS(bfloat, bfloat)
CK_STRICT_VECTORS(int, int)
CK_STRICT_VECTORS(uint, uint)
CK_STRICT_VECTORS(short, short)
CK_STRICT_VECTORS(ushort, ushort)
CK_STRICT_VECTORS(char, char)
CK_STRICT_VECTORS(uchar, uchar)
CK_STRICT_VECTORS(long, long)
CK_STRICT_VECTORS(ulong, ulong)
#undef CK_STRICT_VECTORS
typedef ck_strict::bvec<2> bool2;
typedef ck_strict::bvec<3> bool3;
typedef ck_strict::bvec<4> bool4;

#define float2(...) ::ck_strict::make<float2>(__VA_ARGS__)
#define float3(...) ::ck_strict::make<float3>(__VA_ARGS__)
#define float4(...) ::ck_strict::make<float4>(__VA_ARGS__)
#define half2(...) ::ck_strict::make<half2>(__VA_ARGS__)
#define half3(...) ::ck_strict::make<half3>(__VA_ARGS__)
#define half4(...) ::ck_strict::make<half4>(__VA_ARGS__)
#define bfloat2(...) ::ck_strict::make<bfloat2>(__VA_ARGS__)
#define bfloat3(...) ::ck_strict::make<bfloat3>(__VA_ARGS__)
#define bfloat4(...) ::ck_strict::make<bfloat4>(__VA_ARGS__)
#define int2(...) ::ck_strict::make<int2>(__VA_ARGS__)
#define int3(...) ::ck_strict::make<int3>(__VA_ARGS__)
#define int4(...) ::ck_strict::make<int4>(__VA_ARGS__)
#define uint2(...) ::ck_strict::make<uint2>(__VA_ARGS__)
#define uint3(...) ::ck_strict::make<uint3>(__VA_ARGS__)
#define uint4(...) ::ck_strict::make<uint4>(__VA_ARGS__)
#define short2(...) ::ck_strict::make<short2>(__VA_ARGS__)
#define short3(...) ::ck_strict::make<short3>(__VA_ARGS__)
#define short4(...) ::ck_strict::make<short4>(__VA_ARGS__)
#define ushort2(...) ::ck_strict::make<ushort2>(__VA_ARGS__)
#define ushort3(...) ::ck_strict::make<ushort3>(__VA_ARGS__)
#define ushort4(...) ::ck_strict::make<ushort4>(__VA_ARGS__)
#define char2(...) ::ck_strict::make<char2>(__VA_ARGS__)
#define char3(...) ::ck_strict::make<char3>(__VA_ARGS__)
#define char4(...) ::ck_strict::make<char4>(__VA_ARGS__)
#define uchar2(...) ::ck_strict::make<uchar2>(__VA_ARGS__)
#define uchar3(...) ::ck_strict::make<uchar3>(__VA_ARGS__)
#define uchar4(...) ::ck_strict::make<uchar4>(__VA_ARGS__)
#define long2(...) ::ck_strict::make<long2>(__VA_ARGS__)
#define long3(...) ::ck_strict::make<long3>(__VA_ARGS__)
#define long4(...) ::ck_strict::make<long4>(__VA_ARGS__)
#define ulong2(...) ::ck_strict::make<ulong2>(__VA_ARGS__)
#define ulong3(...) ::ck_strict::make<ulong3>(__VA_ARGS__)
#define ulong4(...) ::ck_strict::make<ulong4>(__VA_ARGS__)
#define bool2(...) ::ck_strict::make<bool2>(__VA_ARGS__)
#define bool3(...) ::ck_strict::make<bool3>(__VA_ARGS__)
#define bool4(...) ::ck_strict::make<bool4>(__VA_ARGS__)
