// MSL's atomic types and memory order, shared by the CPU and CUDA preludes; each backend's
// ck/atomic.h implements the atomic_*_explicit functions on them.
#pragma once
#include "types.h"

namespace metal {

enum memory_order { memory_order_relaxed = 0 };

template <class T>
struct atomic {
  T value;
};
typedef atomic<int> atomic_int;
typedef atomic<uint> atomic_uint;
typedef atomic<float> atomic_float;
typedef atomic<bool> atomic_bool;

namespace ck_atomic {
template <class T>
struct same { typedef T type; };  // keeps an argument out of template deduction
}  // namespace ck_atomic

}  // namespace metal
