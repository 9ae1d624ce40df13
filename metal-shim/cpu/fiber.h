// Minimal fibers: a hand-written register switch (x86-64 and arm64). glibc's
// swapcontext costs ~290 ns because it saves the signal mask with a system
// call; this saves only the callee-saved registers (a few ns).
#pragma once
#include <cstddef>

namespace ck {

// Saves the current callee-saved registers on the current stack, stores the
// stack pointer in *save_sp, and resumes the context whose stack pointer is
// `load_sp`.
extern "C" void ck_fiber_switch(void **save_sp, void *load_sp);

using FiberMain = void (*)(void *arg);

// Prepares a stack [lo, lo + size) so that the first ck_fiber_switch to the
// returned stack pointer calls main(arg). `main` must never return.
void *fiber_prepare(char *lo, size_t size, FiberMain main, void *arg);

}  // namespace ck
