// Qualifiers of the prelude code shared by the CPU backend (C++, g++ or clang++) and the
// CUDA backend (nvcc): metal-shim/common/prelude/*.h is written once with these words.
//   CK_FN              a function kernels call (device code on CUDA)
//   CK_HD              a member of the MSL types, which host code may use too
//   CK_PRELUDE_UNROLL  before a loop of fixed trip count that nvcc must unroll (nothing on
//                      the CPU); the kernels' own CK_UNROLL is kernels/unroll.h
#pragma once

#ifdef __CUDACC__
#define CK_FN __device__ __forceinline__
#define CK_HD __host__ __device__ __forceinline__
#define CK_PRELUDE_UNROLL _Pragma("unroll")
#else
#define CK_FN inline
#define CK_HD inline
#define CK_PRELUDE_UNROLL
#endif
