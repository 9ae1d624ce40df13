// Host-side pieces the CPU and CUDA runtimes share (cpu/runtime.h and cuda/runtime.h include
// this): the thread's last error, the ABI's double-to-integer check, reference counting.
#pragma once
#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <string>

#include "../include/cherenkov.h"

namespace ck {
// This thread's ck_last_error() message.
inline thread_local std::string last_error;

// Sets this thread's ck_last_error() message; returns CK_ERROR.
__attribute__((format(printf, 1, 2))) inline int32_t set_error(const char *fmt, ...) {
  char buf[768];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  last_error = buf;
  return CK_ERROR;
}

// Converts a double crossing the ABI to an exact integer in [0, 2^53].
inline bool to_u64(double v, uint64_t &out) {
  if (!(v >= 0.0) || v > 9007199254740992.0 || std::floor(v) != v) return false;
  out = uint64_t(v);
  return true;
}

// Intrusive reference count for objects a command buffer may keep alive.
struct Counted {
  std::atomic<int> refs{1};
  void retain() { refs.fetch_add(1, std::memory_order_relaxed); }
  bool drop() { return refs.fetch_sub(1, std::memory_order_acq_rel) == 1; }
};
}  // namespace ck
