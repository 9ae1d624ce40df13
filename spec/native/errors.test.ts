// Kernel bugs the shim can see are errors with a message, never a crash, and the
// device stays usable after them.
import { afterAll, describe, expect, test } from "bun:test";

import { Device, type Buffer } from "../../lib/shim.ts";
import { runOnce, selftestParams } from "./util.ts";

const dev = Device.open();
afterAll(() => dev.close());

const n = 256;
const a = dev.buffer(n * 4), b = dev.buffer(n * 4), c = dev.buffer(n * 4);
const params = selftestParams({ n });
// Sizes come from the device: 16 KiB pages on Apple silicon, 4 KiB here; a pipeline's
// thread limit depends on the kernel and the GPU.
const page = dev.limits.pageSize;
const maxThreads = dev.pipeline("selftest_add_f32").maxThreads;

function stillWorks(): void {
  a.f32[1] = 2;
  b.f32[1] = 3;
  runOnce(dev, "selftest_add_f32", n / 64, 64, [null, a, b, c], params);
  expect(c.f32[1]).toBe(5);
}

describe("rejected when encoded", () => {
  test("unknown pipeline", () => {
    expect(() => dev.pipeline("no_such_kernel")).toThrow(/^pipeline not found: no_such_kernel/);
    stillWorks();
  });

  test.each([
    ["binding index past the kernel's buffers", [null, a, b, c, null, a], 64, params, /binds \[\[buffer\(5\)\]\], which the kernel does not declare/],
    ["missing buffer", [null, a, b], 64, params, /\[\[buffer\(3\)\]\] is not bound/],
    ["threadgroup too large", [null, a, b, c], maxThreads + 1, params, new RegExp(`threadgroup ${maxThreads + 1}x1x1 = ${maxThreads + 1} threads exceeds the pipeline's maximum of ${maxThreads}$`)],
    ["threadgroup too large in 3D", [null, a, b, c], [32, maxThreads / 32, 2], params, new RegExp(`threadgroup 32x${maxThreads / 32}x2 = ${maxThreads * 2} threads exceeds`)],
    ["empty threadgroup", [null, a, b, c], 0, params, /threadgroup 0x1x1 is empty/],
    ["params shorter than the struct", [null, a, b, c], 64, params.subarray(0, 8), /params are 8 bytes; the kernel reads 24 at \[\[buffer\(0\)\]\]/],
    ["params and a buffer both at index 0", [c, a, b, c], 64, params, /\[\[buffer\(0\)\]\] is bound to a buffer and to params/],
    ["no params for a kernel that reads them", [null, a, b, c], 64, undefined, /\[\[buffer\(0\)\]\] is not bound/],
    ["offset past the end", [null, { buffer: a, offset: 1 << 24 }, b, c], 64, params, new RegExp(`\\[\\[buffer\\(1\\)\\]\\] offset 16777216 is past the end of its ${page}-byte buffer`)],
    ["too many bindings", new Array(32).fill(null), 64, params, /32 bindings: at most 31/],
  ] as [string, (Buffer | { buffer: Buffer; offset: number } | null)[], number | [number, number, number], Uint8Array | undefined, RegExp][])("%s", (_, bindings, tg, p, message) => {
    const cb = dev.commandBuffer();
    expect(() => cb.dispatch("selftest_add_f32", 4, tg, bindings, p)).toThrow(message);
    expect(() => cb.dispatch("selftest_add_f32", 4, tg, bindings, p)).toThrow(/^command buffer \d+: |^32 bindings/);
    cb.release();
    stillWorks();
  });

  test("encoding after commit, and waiting before commit", () => {
    const cb = dev.commandBuffer();
    expect(() => cb.waitUntilCompleted(10)).toThrow(`command buffer ${cb.id}: wait before commit`);
    cb.commit();
    expect(() => cb.dispatch("selftest_add_f32", 4, 64, [null, a, b, c], params)).toThrow(`command buffer ${cb.id}: dispatch after commit`);
    expect(() => cb.commit()).toThrow(/commit after commit/);
    cb.waitUntilCompleted(1000);
    cb.release();
    stillWorks();
  });
});

test("cpu emulator: threads that wait at different sync points fail the command buffer", () => {
  const cpu = Device.open({ backend: "cpu" });
  try {
    const out = cpu.buffer(cpu.limits.pageSize);
    const cb = cpu.commandBuffer();
    cb.dispatch("selftest_deadlock", 2, 64, [null, out]).commit();
    expect(() => cb.waitUntilCompleted(10_000)).toThrow(
      new RegExp(`^command buffer ${cb.id}: command 0, dispatch of 'selftest_deadlock' \\(kernels/selftest.metal:\\d+\\): threadgroup \\([01],0,0\\): deadlock`),
    );
    cb.release();
    // The emulator recovers: the next dispatch on the same threads works.
    const a2 = cpu.buffer(n * 4), b2 = cpu.buffer(n * 4), c2 = cpu.buffer(n * 4);
    a2.f32[9] = 1;
    b2.f32[9] = 1;
    runOnce(cpu, "selftest_add_f32", n / 64, 64, [null, a2, b2, c2], params);
    expect(c2.f32[9]).toBe(2);
  } finally {
    cpu.close();
  }
});
