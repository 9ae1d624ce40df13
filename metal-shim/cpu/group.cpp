// One threadgroup on one OS thread. Its threads run as fibers in a ring:
// a fiber runs threads one after another until one reaches a barrier or a
// SIMD function; it then yields, and the next fiber (created on demand for
// the next unstarted thread) takes over. A kernel without synchronisation
// therefore runs as a plain loop on one fiber; a kernel with it gets one fiber
// per thread, advancing in lockstep, one switch per thread per sync point.
#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <memory>

#include "exec.h"
#include "fiber.h"

namespace ck {
namespace {

constexpr size_t kStackBytes = 80 * 1024;
// Stack tops are staggered ("colored") by up to 16 KiB so that the hot top
// frames of 1024 fibers do not all fall into the same cache sets; 64 KiB stay
// usable by every fiber.
constexpr size_t kColorBytes = 16 * 1024;
constexpr size_t kGuardBytes = 64 * 1024;  // a multiple of every page size in use
constexpr uint64_t kCanary = 0x21636b6e6572656bull;  // written at each stack's low end

struct Fiber {
  void *sp;
  char *stack;
  Fiber *next, *prev;  // ring of live fibers
  uint32_t tid;        // thread this fiber is running
  ThreadCtx ctx;
};

struct SimdGroup {
  uint32_t arrived, live, gen;
  uint32_t mask[2];  // lanes that published, for the two alternating slot sets
  alignas(16) unsigned char slots[2][kSimdWidth][kSlotBytes];
};

}  // namespace

struct Worker {
  // The threadgroup being run.
  const Dispatch *d = nullptr;
  ThreadCtx proto{};
  uint32_t nthreads = 0, next_thread = 0, live = 0;
  uint32_t next_pos[3] = {};
  uint32_t bar_arrived = 0, bar_gen = 0;
  uint32_t idle = 0;  // waiting yields since anyone made progress
  bool failed = false;
  char error[256] = {};
  SimdGroup sg[kMaxThreads / kSimdWidth];
  // Fibers.
  void *sched_sp = nullptr;
  Fiber *cur = nullptr;
  Fiber *tail = nullptr;  // most recently created
  uint32_t nfibers = 0, live_fibers = 0;
  char *stacks = nullptr;
  Fiber fibers[kMaxThreads];

  // All fiber stacks in one lazily committed mapping, above an inaccessible
  // guard page. A stack that overflows into its lower neighbour is caught by
  // that neighbour's canary; the lowest one faults on the guard page.
  Worker() {
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_NORESERVE
    flags |= MAP_NORESERVE;
#endif
    void *p = mmap(nullptr, kGuardBytes + kStackBytes * kMaxThreads, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED) return;
    mprotect(p, kGuardBytes, PROT_NONE);
    stacks = static_cast<char *>(p) + kGuardBytes;
  }
  ~Worker() {
    if (stacks) munmap(stacks - kGuardBytes, kGuardBytes + kStackBytes * kMaxThreads);
  }
};

namespace {

thread_local Worker *tls_worker = nullptr;  // set while a threadgroup runs

void fiber_main(void *arg);

Fiber *new_fiber(Worker *w) {
  Fiber *f = &w->fibers[w->nfibers];
  f->stack = w->stacks + kStackBytes * w->nfibers;
  w->nfibers++;
  std::memcpy(f->stack, &kCanary, sizeof kCanary);
  f->ctx = w->proto;
  size_t color = (size_t(w->nfibers) * 7 % (kColorBytes / 64)) * 64;
  f->sp = fiber_prepare(f->stack, kStackBytes - color, fiber_main, f);
  if (w->tail) {
    f->prev = w->tail;
    f->next = w->tail->next;
    w->tail->next->prev = f;
    w->tail->next = f;
  } else {
    f->next = f->prev = f;
  }
  w->tail = f;
  w->live_fibers++;
  return f;
}

void yield(Worker *w, Fiber *f) {
  Fiber *n = (f == w->tail && w->next_thread < w->nthreads) ? new_fiber(w) : f->next;
  if (n == f) return;
  w->cur = n;
  ck_fiber_switch(&f->sp, n->sp);
}

[[noreturn]] void fail(Worker *w, Fiber *f) {
  w->failed = true;
  ck_fiber_switch(&f->sp, w->sched_sp);
  __builtin_unreachable();
}

// Yields until *gen moves on; a full round of the ring without anyone
// arriving anywhere means the threads wait for each other: a kernel bug.
void wait_for_generation(Worker *w, Fiber *f, const uint32_t *gen, uint32_t seen, const char *what) {
  while (*gen == seen) {
    if (++w->idle > 2 * w->live_fibers + 2) {
      const ThreadCtx &c = f->ctx;
      std::snprintf(w->error, sizeof w->error,
                    "threadgroup (%u,%u,%u): deadlock: thread %u waits at %s that the other "
                    "threads never reach (barriers and SIMD functions must be reached by every "
                    "thread still running)",
                    c.tgpig[0], c.tgpig[1], c.tgpig[2], f->tid, what);
      fail(w, f);
    }
    yield(w, f);
  }
}

void complete_simd(SimdGroup &s) {
  s.arrived = 0;
  s.gen++;
  s.mask[s.gen & 1] = 0;  // every lane has read the set this clears
}

void complete_barrier(Worker *w) {
  w->bar_arrived = 0;
  w->bar_gen++;
}

void start_thread(Worker *w, Fiber *f) {
  uint32_t t = w->next_thread++;
  f->tid = t;
  ThreadCtx &c = f->ctx;
  c.index = t;
  c.lane = t % kSimdWidth;
  c.simdgroup = t / kSimdWidth;
  for (int i = 0; i < 3; i++) {
    c.tpitg[i] = w->next_pos[i];
    c.tpig[i] = c.tgpig[i] * c.dtptg[i] + c.tpitg[i];
  }
  if (++w->next_pos[0] == c.ntptg[0]) {
    w->next_pos[0] = 0;
    if (++w->next_pos[1] == c.ntptg[1]) {
      w->next_pos[1] = 0;
      ++w->next_pos[2];
    }
  }
}

void finish_thread(Worker *w, Fiber *f) {
  w->live--;
  w->idle = 0;
  SimdGroup &s = w->sg[f->tid / kSimdWidth];
  s.live--;
  if (s.arrived != 0 && s.arrived == s.live) complete_simd(s);
  if (w->bar_arrived != 0 && w->bar_arrived == w->live) complete_barrier(w);
}

[[noreturn]] void exit_fiber(Worker *w, Fiber *f) {
  w->live_fibers--;
  Fiber *n = f->next;
  f->prev->next = f->next;
  f->next->prev = f->prev;
  if (w->tail == f) w->tail = f->prev;
  if (w->live_fibers == 0) ck_fiber_switch(&f->sp, w->sched_sp);
  w->cur = n;
  ck_fiber_switch(&f->sp, n->sp);
  __builtin_unreachable();
}

void fiber_main(void *arg) {
  Fiber *f = static_cast<Fiber *>(arg);
  Worker *w = tls_worker;
  while (w->next_thread < w->nthreads) {
    start_thread(w, f);
    w->d->kernel->invoke(f->ctx);
    finish_thread(w, f);
  }
  exit_fiber(w, f);
}

}  // namespace

Worker *this_thread_worker() {
  thread_local std::unique_ptr<Worker> owned;
  if (!owned) owned.reset(new Worker());
  return owned.get();
}

bool run_threadgroup(Worker *w, const Dispatch &d, uint32_t linear, std::string &error) {
  if (!w->stacks) {
    error = "cannot reserve fiber stacks (mmap failed)";
    return false;
  }
  ThreadCtx &p = w->proto;
  p.buf = d.buf;
  p.tgpig[0] = linear % d.groups[0];
  p.tgpig[1] = (linear / d.groups[0]) % d.groups[1];
  p.tgpig[2] = linear / d.groups[0] / d.groups[1];
  uint32_t n = 1;
  for (int i = 0; i < 3; i++) {
    uint32_t origin = p.tgpig[i] * d.tg[i];
    p.dtptg[i] = d.tg[i];
    p.ntptg[i] = d.threads[i] - origin < d.tg[i] ? d.threads[i] - origin : d.tg[i];
    p.ntgpg[i] = d.groups[i];
    p.ntpg[i] = d.threads[i];
    n *= p.ntptg[i];
  }
  p.simdgroups = (n + kSimdWidth - 1) / kSimdWidth;
  w->d = &d;
  w->nthreads = w->live = n;
  w->next_thread = 0;
  w->next_pos[0] = w->next_pos[1] = w->next_pos[2] = 0;
  w->bar_arrived = w->bar_gen = 0;
  w->idle = 0;
  w->failed = false;
  w->nfibers = w->live_fibers = 0;
  w->tail = nullptr;
  for (uint32_t s = 0; s < p.simdgroups; s++) {
    SimdGroup &g = w->sg[s];
    g.arrived = g.gen = 0;
    g.mask[0] = g.mask[1] = 0;
    g.live = n - s * kSimdWidth < kSimdWidth ? n - s * kSimdWidth : kSimdWidth;
  }

  Worker *outer = tls_worker;
  tls_worker = w;
  Fiber *first = new_fiber(w);
  w->cur = first;
  ck_fiber_switch(&w->sched_sp, first->sp);
  tls_worker = outer;

  for (uint32_t i = 0; i < w->nfibers; i++) {
    if (std::memcmp(w->fibers[i].stack, &kCanary, sizeof kCanary) != 0) {
      char msg[160];
      std::snprintf(msg, sizeof msg,
                    "threadgroup (%u,%u,%u): a thread overflowed its %zu KiB emulator stack "
                    "(large local arrays?)",
                    p.tgpig[0], p.tgpig[1], p.tgpig[2], (kStackBytes - kColorBytes) / 1024);
      error = msg;
      return false;
    }
  }
  if (w->failed) {
    error = w->error;
    return false;
  }
  return true;
}

// ---- synchronisation points (called from kernels through the prelude) ----

void threadgroup_sync() {
  Worker *w = tls_worker;
  Fiber *f = w->cur;
  uint32_t gen = w->bar_gen;
  w->idle = 0;
  if (++w->bar_arrived == w->live) {
    complete_barrier(w);
    return;
  }
  wait_for_generation(w, f, &w->bar_gen, gen, "threadgroup_barrier");
}

SimdView simd_exchange(const void *value, uint32_t size) {
  Worker *w = tls_worker;
  Fiber *f = w->cur;
  uint32_t lane = f->tid % kSimdWidth;
  SimdGroup &s = w->sg[f->tid / kSimdWidth];
  uint32_t gen = s.gen, set = gen & 1;
  if (size) std::memcpy(s.slots[set][lane], value, size);
  s.mask[set] |= 1u << lane;
  w->idle = 0;
  if (++s.arrived == s.live) complete_simd(s);
  else wait_for_generation(w, f, &s.gen, gen, "a SIMD function");
  return SimdView{&s.slots[set][0][0], s.mask[set], lane};
}

}  // namespace ck
