// Events between host and GPU: a GPU wait blocks until the host sets the value,
// a GPU signal wakes a host wait, and a wait that outlives the device's wait
// timeout fails the command buffer with a clear message.
import { afterAll, expect, test } from "bun:test";

import { Device } from "../../lib/shim.ts";
import { selftestParams } from "./util.ts";

const dev = Device.open();
afterAll(() => dev.close());

const n = 1024;
const x = dev.buffer(n * 4);
for (let i = 0; i < n; i++) x.f32[i] = i;

test("a command buffer waiting on an event stays pending until the host sets it", async () => {
  const ev = dev.event();
  const y1 = dev.buffer(n * 4), y2 = dev.buffer(n * 4);
  const cb = dev.commandBuffer();
  cb.dispatch("selftest_scale_f32", n / 64, 64, [null, x, y1], selftestParams({ n, scale: 2 }))
    .signal(ev, 1)
    .wait(ev, 2)
    .dispatch("selftest_scale_f32", n / 64, 64, [null, y1, y2], selftestParams({ n, scale: 3 }))
    .signal(ev, 3)
    .commit();

  expect(ev.waitFor(1, 5000)).toBe(true); // the GPU's signal reaches a host wait
  expect(y1.f32[100]).toBe(200);
  await Bun.sleep(50);
  expect(cb.status).toBe("committed");
  expect(ev.value).toBe(1);
  expect(y2.f32[100]).toBe(0); // the second dispatch has not run
  expect(ev.waitFor(3, 20)).toBe(false); // host wait times out
  expect(cb.waitFor(20)).toBe(false); // a command buffer's wait in a slice runs out without an error
  expect(() => cb.waitUntilCompleted(20)).toThrow(`command buffer ${cb.id} did not complete within 20 ms`);

  ev.set(2);
  expect(cb.waitFor(5000)).toBe(true);
  expect(cb.status).toBe("completed");
  expect(ev.value).toBe(3);
  expect(y2.f32[100]).toBe(600);
  cb.release();
  ev.release();
  y1.release();
  y2.release();
});

// Issue 9 item 5: Apple's rule for MTLSharedEvent, in every backend. After a timed-out GPU
// wait the event was released for the host and the GPU may have signalled past the host's
// late release; that release must be a no-op, not an error that hides the GpuStepError.
test("setting an event below its current value is ignored, not an error (host and GPU)", () => {
  const ev = dev.event();
  ev.set(5);
  expect(() => ev.set(3)).not.toThrow();
  expect(ev.value).toBe(5);
  ev.set(5); // equal: also a no-op
  expect(ev.value).toBe(5);
  const cb = dev.commandBuffer().signal(ev, 2).commit();
  cb.waitUntilCompleted(5000);
  expect(cb.status).toBe("completed");
  expect(ev.value).toBe(5);
  ev.set(6);
  expect(ev.value).toBe(6);
  cb.release();
  ev.release();
});

test("a wait already satisfied does not block", () => {
  const ev = dev.event();
  ev.set(10);
  const cb = dev.commandBuffer().wait(ev, 4).signal(ev, 11).commit();
  cb.waitUntilCompleted(5000);
  expect(ev.value).toBe(11);
  cb.release();
  ev.release();
});

test("a GPU wait that times out fails its command buffer; the queue goes on", () => {
  dev.setWaitTimeout(100);
  try {
    const ev = dev.event();
    const y = dev.buffer(n * 4);
    const cb = dev.commandBuffer();
    cb.wait(ev, 5).dispatch("selftest_scale_f32", n / 64, 64, [null, x, y], selftestParams({ n, scale: 2 })).commit();
    const message = new RegExp(`^command buffer ${cb.id}: wait for event ${ev.id} >= 5 timed out after 100 ms$`);
    expect(() => cb.waitFor(5000)).toThrow(message); // a failure is an error, not a slice run out
    expect(() => cb.waitUntilCompleted(5000)).toThrow(message);
    expect(cb.status).toBe("failed");
    expect(cb.error).toMatch(message);
    expect(y.f32[3]).toBe(0); // commands after the failed wait were skipped

    const next = dev.commandBuffer();
    next.dispatch("selftest_scale_f32", n / 64, 64, [null, x, y], selftestParams({ n, scale: 2 })).commit();
    next.waitUntilCompleted(5000);
    expect(y.f32[3]).toBe(6);
    for (const r of [cb, next, ev, y]) r.release();
  } finally {
    dev.setWaitTimeout(10_000);
  }
});

test("command buffers run in commit order across events", () => {
  const ev = dev.event();
  const y = dev.buffer(n * 4);
  const first = dev.commandBuffer().wait(ev, 1).dispatch("selftest_scale_f32", n / 64, 64, [null, x, y], selftestParams({ n, scale: 5 })).commit();
  const second = dev.commandBuffer().dispatch("selftest_scale_f32", n / 64, 64, [null, y, y], selftestParams({ n, scale: 2 })).commit();
  expect(second.status).toBe("committed"); // queued behind the waiting one
  ev.set(1);
  second.waitUntilCompleted(5000);
  expect(first.status).toBe("completed");
  expect(y.f32[7]).toBe(70);
  for (const r of [first, second, ev, y]) r.release();
});

test("event values are integers up to 2^53", () => {
  const ev = dev.event();
  ev.set(2 ** 40 + 1);
  expect(ev.value).toBe(2 ** 40 + 1);
  expect(() => ev.set(1.5)).toThrow(/value 1.5 is not an integer/);
  expect(() => ev.set(-1)).toThrow(/not an integer/);
  ev.release();
});
