// CK_UNROLL unrolls the next loop (constant trip count) on every compiler the kernels meet
// (Metal, nvcc, clang++, g++): arrays it indexes by the loop variable then stay in registers.
// nvcc leaves a large body rolled, and a rolled loop over acc[j] put the accumulators in
// local memory on the H200.
#pragma once
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define CK_UNROLL _Pragma("GCC unroll 8")
#else
#define CK_UNROLL _Pragma("unroll")
#endif

// CK_ROLLED keeps the next loop rolled: a body whose loads the compiler would otherwise hoist
// across iterations, holding many registers for them (hc_write_column's output streams,
// deltanet_chunk_scan_f32).
#if defined(__CUDACC__)
#define CK_ROLLED _Pragma("unroll 1")
#elif defined(__clang__)
#define CK_ROLLED _Pragma("nounroll")
#else
#define CK_ROLLED _Pragma("GCC unroll 1")
#endif
