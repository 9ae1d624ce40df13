// MSL's mem_flags (the argument of threadgroup_barrier and simdgroup_barrier), shared by the
// CPU and CUDA preludes; each backend's ck/simd.h implements the barriers.
#pragma once
#include "types.h"

namespace metal {

enum class mem_flags : uint {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
};
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(uint(a) | uint(b)); }

}  // namespace metal
