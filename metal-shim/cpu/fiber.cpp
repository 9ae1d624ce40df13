#include "fiber.h"

#include <cstdint>

// Symbol decoration differs between ELF (Linux) and Mach-O (macOS).
#if defined(__APPLE__)
#define CK_ASM_SYM(name) "_" #name
#define CK_ASM_HEADER(name) ".globl _" #name "\n.private_extern _" #name "\n.p2align 4\n_" #name ":\n"
#else
#define CK_ASM_SYM(name) #name
#if defined(__aarch64__)
#define CK_ASM_HEADER(name) ".globl " #name "\n.hidden " #name "\n.type " #name ", %function\n.p2align 4\n" #name ":\n"
#else
#define CK_ASM_HEADER(name) ".globl " #name "\n.hidden " #name "\n.type " #name ", @function\n.p2align 4\n" #name ":\n"
#endif
#endif

extern "C" void ck_fiber_entry();

#if defined(__x86_64__)
// Frame on a suspended stack, from the saved stack pointer up:
// r15 r14 r13 r12 rbx rbp return-address.
asm(".text\n" CK_ASM_HEADER(ck_fiber_switch)
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    // First entry of a fiber: r12 = arg, r13 = main. rsp is 16-byte aligned
    // here, so the call leaves the callee's stack aligned as the ABI wants.
    CK_ASM_HEADER(ck_fiber_entry)
    "  movq %r12, %rdi\n"
    "  callq *%r13\n"
    "  ud2\n");

namespace ck {
void *fiber_prepare(char *lo, size_t size, FiberMain main, void *arg) {
  auto top = reinterpret_cast<uintptr_t>(lo + size) & ~uintptr_t(15);
  auto *frame = reinterpret_cast<uintptr_t *>(top - 72);  // 7 words + 16 bytes spare
  frame[0] = 0;                                       // r15
  frame[1] = 0;                                       // r14
  frame[2] = reinterpret_cast<uintptr_t>(main);       // r13
  frame[3] = reinterpret_cast<uintptr_t>(arg);        // r12
  frame[4] = 0;                                       // rbx
  frame[5] = 0;                                       // rbp
  frame[6] = reinterpret_cast<uintptr_t>(&ck_fiber_entry);  // ret -> entry, rsp = top - 16
  return frame;
}
}  // namespace ck

#elif defined(__aarch64__)
// Frame (160 bytes): x19..x28, x29 (fp), x30 (lr), d8..d15.
asm(".text\n" CK_ASM_HEADER(ck_fiber_switch)
    "  sub sp, sp, #160\n"
    "  stp x19, x20, [sp, #0]\n"
    "  stp x21, x22, [sp, #16]\n"
    "  stp x23, x24, [sp, #32]\n"
    "  stp x25, x26, [sp, #48]\n"
    "  stp x27, x28, [sp, #64]\n"
    "  stp x29, x30, [sp, #80]\n"
    "  stp d8, d9, [sp, #96]\n"
    "  stp d10, d11, [sp, #112]\n"
    "  stp d12, d13, [sp, #128]\n"
    "  stp d14, d15, [sp, #144]\n"
    "  mov x9, sp\n"
    "  str x9, [x0]\n"
    "  mov sp, x1\n"
    "  ldp x19, x20, [sp, #0]\n"
    "  ldp x21, x22, [sp, #16]\n"
    "  ldp x23, x24, [sp, #32]\n"
    "  ldp x25, x26, [sp, #48]\n"
    "  ldp x27, x28, [sp, #64]\n"
    "  ldp x29, x30, [sp, #80]\n"
    "  ldp d8, d9, [sp, #96]\n"
    "  ldp d10, d11, [sp, #112]\n"
    "  ldp d12, d13, [sp, #128]\n"
    "  ldp d14, d15, [sp, #144]\n"
    "  add sp, sp, #160\n"
    "  ret\n"
    // First entry of a fiber: x19 = arg, x20 = main.
    CK_ASM_HEADER(ck_fiber_entry)
    "  mov x0, x19\n"
    "  blr x20\n"
    "  brk #1\n");

namespace ck {
void *fiber_prepare(char *lo, size_t size, FiberMain main, void *arg) {
  auto top = reinterpret_cast<uintptr_t>(lo + size) & ~uintptr_t(15);
  auto *frame = reinterpret_cast<uintptr_t *>(top - 160);
  for (int i = 0; i < 20; i++) frame[i] = 0;
  frame[0] = reinterpret_cast<uintptr_t>(arg);               // x19
  frame[1] = reinterpret_cast<uintptr_t>(main);              // x20
  frame[11] = reinterpret_cast<uintptr_t>(&ck_fiber_entry);  // x30 (lr)
  return frame;
}
}  // namespace ck

#else
#error "metal-shim/cpu: fibers need x86-64 or arm64"
#endif
