/**
 * `bun run bench:native`: what the CPU backend's machinery costs.
 *  - fiber switch: the raw register switch (metal-shim/cpu/fiber.cpp), two fibers
 *    ping-ponging, against glibc's swapcontext, in a C++ program built here;
 *  - barrier: a threadgroup barrier inside a kernel, per thread (switch + bookkeeping);
 *  - dispatch: an empty kernel, per dispatch, inside one command buffer, and one
 *    empty command buffer's commit-to-completion round trip;
 *  - FFI: one bun:ffi call into the shim.
 * Prints a table, or one JSON object with --json. Numbers, not assertions.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { Device } from "../../lib/shim.ts";
import { selftestParams } from "./util.ts";

const ROOT = join(import.meta.dir, "..", "..");

function fiberSwitchNs(): { fiber: number; swapcontext: number } | null {
  const dir = mkdtempSync(join(tmpdir(), "cherenkov-bench-"));
  try {
    const source = `
#include "fiber.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ucontext.h>
static void *main_sp, *fiber_sp;
static long rounds;
static void body(void *) { for (;;) ck::ck_fiber_switch(&fiber_sp, main_sp); }
static ucontext_t uc_main, uc_fiber;
static void uc_body() { for (;;) swapcontext(&uc_fiber, &uc_main); }
int main() {
  const long n = 2000000;
  static char stack[65536], ustack[65536];
  fiber_sp = ck::fiber_prepare(stack, sizeof stack, body, nullptr);
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; i++) ck::ck_fiber_switch(&main_sp, fiber_sp);
  auto t1 = std::chrono::steady_clock::now();
  getcontext(&uc_fiber);
  uc_fiber.uc_stack.ss_sp = ustack;
  uc_fiber.uc_stack.ss_size = sizeof ustack;
  uc_fiber.uc_link = nullptr;
  makecontext(&uc_fiber, uc_body, 0);
  const long m = n / 10;
  for (long i = 0; i < m; i++) swapcontext(&uc_main, &uc_fiber);
  auto t2 = std::chrono::steady_clock::now();
  // Two switches per round trip.
  printf("%f %f\\n", std::chrono::duration<double, std::nano>(t1 - t0).count() / (2.0 * n),
         std::chrono::duration<double, std::nano>(t2 - t1).count() / (2.0 * m));
  (void)rounds;
}
`;
    writeFileSync(join(dir, "bench.cpp"), source);
    const exe = join(dir, "bench");
    const cc = Bun.spawnSync(
      ["g++", "-std=c++17", "-O2", "-I", join(ROOT, "metal-shim/cpu"), join(dir, "bench.cpp"), join(ROOT, "metal-shim/cpu/fiber.cpp"), "-o", exe],
      { stderr: "pipe" },
    );
    if (cc.exitCode !== 0) return null;
    const [fiber, swapcontext] = Bun.spawnSync([exe]).stdout.toString().trim().split(" ").map(Number);
    return { fiber: fiber!, swapcontext: swapcontext! };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function timeNs(fn: () => void, reps: number): number {
  fn(); // warm
  const t0 = Bun.nanoseconds();
  for (let i = 0; i < reps; i++) fn();
  return (Bun.nanoseconds() - t0) / reps;
}

const dev = Device.open({ backend: "cpu" });
const out = dev.buffer(1 << 16);

// Barrier: 1 threadgroup of 1024 threads, 200 barriers each.
const barriers = 200;
const barrierParams = selftestParams({ n: barriers });
const barrierNs =
  timeNs(() => {
    const cb = dev.commandBuffer();
    cb.dispatch("selftest_barrier_loop", 1, 1024, [null, out], barrierParams).commit().waitUntilCompleted();
    cb.release();
  }, 5) /
  (1024 * barriers);

// Dispatch: 1000 empty dispatches in one command buffer (1 threadgroup, and 64 threadgroups).
function dispatchNs(groups: number, tg: number): number {
  const count = 1000;
  const empty = dev.pipeline("selftest_empty");
  return (
    timeNs(() => {
      const cb = dev.commandBuffer();
      for (let i = 0; i < count; i++) cb.dispatch(empty, groups, tg, []);
      cb.commit().waitUntilCompleted();
      cb.release();
    }, 5) / count
  );
}
const dispatch1 = dispatchNs(1, 32);
const dispatch64 = dispatchNs(64, 32);
// Encoding alone, 1000 dispatches per command buffer (best of 20), with two bindings and params.
const encodeNs = (() => {
  const empty = dev.pipeline("selftest_empty");
  const scale = dev.pipeline("selftest_scale_f32");
  const params = selftestParams({ n: 1 });
  let best = { empty: Infinity, scale: Infinity };
  for (let r = 0; r < 20; r++) {
    const cb = dev.commandBuffer();
    let t0 = Bun.nanoseconds();
    for (let i = 0; i < 1000; i++) cb.dispatch(empty, 1, 32, []);
    const e = (Bun.nanoseconds() - t0) / 1000;
    t0 = Bun.nanoseconds();
    for (let i = 0; i < 1000; i++) cb.dispatch(scale, 1, 32, [null, out, out], params);
    const s = (Bun.nanoseconds() - t0) / 1000;
    best = { empty: Math.min(best.empty, e), scale: Math.min(best.scale, s) };
    cb.release();
  }
  return best;
})();
const roundTripNs = timeNs(() => {
  const cb = dev.commandBuffer();
  cb.commit().waitUntilCompleted();
  cb.release();
}, 2000);

// FFI: a call that returns a u32 and one that returns a double.
const ev = dev.event();
const ffiU32 = timeNs(() => dev.shim.symbols.ck_event_id(ev.handle), 2_000_000);
const ffiF64 = timeNs(() => dev.shim.symbols.ck_event_value(ev.handle), 2_000_000);

const fiber = fiberSwitchNs();
const result = {
  device: dev.name,
  fiberSwitchNs: fiber?.fiber ?? null,
  swapcontextNs: fiber?.swapcontext ?? null,
  barrierPerThreadNs: barrierNs,
  emptyDispatchNs: { oneThreadgroup: dispatch1, sixtyFourThreadgroups: dispatch64 },
  encodeDispatchNs: encodeNs,
  emptyCommandBufferRoundTripNs: roundTripNs,
  ffiCallNs: { u32: ffiU32, f64: ffiF64 },
};
ev.release();
dev.close();

if (process.argv.includes("--json")) {
  console.log(JSON.stringify(result));
} else {
  const f = (x: number | null) => (x === null ? "n/a" : x < 1000 ? `${x.toFixed(1)} ns` : `${(x / 1000).toFixed(2)} us`);
  console.log(`metal-shim cpu backend on ${result.device}`);
  console.table({
    "fiber switch (register switch)": f(result.fiberSwitchNs),
    "glibc swapcontext, for comparison": f(result.swapcontextNs),
    "threadgroup barrier, per thread": f(barrierNs),
    "empty dispatch, 1 threadgroup": f(dispatch1),
    "empty dispatch, 64 threadgroups": f(dispatch64),
    "encode a dispatch, no bindings (JS + FFI)": f(encodeNs.empty),
    "encode a dispatch, 2 buffers + params": f(encodeNs.scale),
    "empty command buffer commit+wait": f(roundTripNs),
    "FFI call, u32 return": f(ffiU32),
    "FFI call, f64 return": f(ffiF64),
  });
}
