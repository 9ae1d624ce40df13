// Command buffers of one shape committed again and again, as the engine commits a decode step
// every token. On cuda (CHERENKOV_BACKEND=cuda) the second and later ones replay a CUDA graph
// (metal-shim/cuda/runtime.cu, "graphs"): these tests check that a replay uses its own params,
// event values and bound addresses (a binding at a moving offset, as a decode step binds its
// token), that a timeout cancel of one replay does not reach the next, that several in flight
// at once run in order, and that more structures than the cache holds stay correct. On the
// other backends the same results are required (there is nothing to replay there).
import { afterAll, expect, test } from "bun:test";

import { Device, type Binding } from "../../lib/shim.ts";
import { selftestParams } from "./util.ts";

const dev = Device.open();
afterAll(() => dev.close());

const n = 1024;
const x = dev.buffer(n * 4);
for (let i = 0; i < n; i++) x.f32[i] = i;
const scale = (from: Binding, to: Binding, s: number) =>
  ["selftest_scale_f32", n / 64, 64, [null, from, to], selftestParams({ n, scale: s })] as const;

test("each commit of one shape uses its own params, event values and buffers", async () => {
  const ev = dev.event();
  const pairs = [0, 1, 2].map(() => [dev.buffer(n * 4), dev.buffer(n * 4)] as const);
  let base = 0;
  for (let round = 1; round <= 8; round++) {
    const [y1, y2] = pairs[Math.floor(round / 3) % pairs.length]!; // the same buffers twice or three times in a row, then others
    const cb = dev.commandBuffer();
    cb.dispatch(...scale(x, y1, round))
      .signal(ev, base + 1)
      .wait(ev, base + 2)
      .dispatch(...scale(y1, y2, 10 + round))
      .signal(ev, base + 3)
      .commit();
    expect(ev.waitFor(base + 1, 5000)).toBe(true); // this round's signal value
    expect(y1.f32[100]).toBe(100 * round); // this round's params
    await Bun.sleep(20);
    expect(cb.status).toBe("committed"); // held by this round's wait value, not an earlier one
    expect(ev.value).toBe(base + 1);
    ev.set(base + 2);
    cb.waitUntilCompleted(5000);
    expect(cb.status).toBe("completed");
    expect(ev.value).toBe(base + 3);
    expect(y2.f32[100]).toBe(100 * round * (10 + round));
    cb.release();
    base += 3;
  }
  ev.release();
  for (const r of pairs.flat()) r.release();
});

test("a binding at a moving offset (a position) is read at each commit's offset", () => {
  const xs = dev.buffer((n + 64) * 4);
  for (let i = 0; i < n + 64; i++) xs.f32[i] = i;
  const y = dev.buffer(n * 4);
  for (let pos = 0; pos < 8; pos++) {
    const cb = dev.commandBuffer().dispatch(...scale({ buffer: xs, offset: pos * 4 }, y, 3)).commit();
    cb.waitUntilCompleted(5000);
    expect(y.f32[5]).toBe(3 * (5 + pos));
    expect(y.f32[n - 1]).toBe(3 * (n - 1 + pos));
    cb.release();
  }
  for (const r of [xs, y]) r.release();
});

test("a timed-out wait cancels only its own commit; the next commit of the shape runs whole", () => {
  dev.setWaitTimeout(100);
  try {
    const ev = dev.event();
    const y = dev.buffer(n * 4);
    const run = (value: number, s: number) => dev.commandBuffer().wait(ev, value).dispatch(...scale(x, y, s)).commit();
    for (let round = 1; round <= 3; round++) {
      ev.set(round);
      const cb = run(round, round);
      cb.waitUntilCompleted(5000);
      expect(y.f32[5]).toBe(5 * round);
      cb.release();
    }
    y.f32.fill(-1);
    const blocked = run(4, 7); // nobody sets 4
    expect(() => blocked.waitUntilCompleted(5000)).toThrow(new RegExp(`^command buffer ${blocked.id}: wait for event ${ev.id} >= 4 timed out after 100 ms$`));
    expect(y.f32[5]).toBe(-1); // its dispatch was skipped
    ev.set(5);
    const after = run(5, 9);
    after.waitUntilCompleted(5000);
    expect(after.status).toBe("completed");
    expect(y.f32[5]).toBe(45);
    for (const r of [blocked, after, ev, y]) r.release();
  } finally {
    dev.setWaitTimeout(10_000);
  }
});

test("commits of one shape queued together run in order, each with its params", () => {
  const y = dev.buffer(n * 4);
  const first = dev.commandBuffer().dispatch(...scale(x, y, 1)).commit();
  const chain = [2, 3, 1, 5, 2, 3].map((s) => dev.commandBuffer().dispatch(...scale(y, y, s)).commit());
  chain.at(-1)!.waitUntilCompleted(5000);
  for (const cb of [first, ...chain]) expect(cb.status).toBe("completed");
  expect(y.f32[3]).toBe(3 * 180);
  expect(y.f32[1000]).toBe(1000 * 180);
  for (const r of [first, ...chain, y]) r.release();
});

test("more structures than the graph cache holds, interleaved, stay correct", () => {
  const outs = Array.from({ length: 72 }, () => dev.buffer(n * 4)); // the CUDA cache holds 64 (kGraphCacheSize)
  for (let round = 0; round < 4; round++) {
    for (let j = 0; j < outs.length; j++) {
      // j + 1 commands: a structure of its own (the extra ones multiply by 1).
      const cb = dev.commandBuffer().dispatch(...scale(x, outs[j]!, round * 100 + j));
      for (let k = 0; k < j; k++) cb.dispatch(...scale(outs[j]!, outs[j]!, 1));
      cb.commit();
      cb.waitUntilCompleted(5000);
      expect(outs[j]!.f32[7]).toBe(7 * (round * 100 + j));
      cb.release();
    }
  }
  for (const y of outs) y.release();
});

test("shape keys and graphs built ahead (hint): keyed commits of one structure, primed by command buffers never committed, each use their own params, offsets and events", async () => {
  const xs = dev.buffer((n + 64) * 4);
  for (let i = 0; i < n + 64; i++) xs.f32[i] = i;
  const y = dev.buffer(n * 4);
  // Two keys of one structure (as two accept counts' cycles), each primed by a command buffer
  // with an event of its own, released uncommitted with its event: the builder holds copies.
  for (const key of [11, 12]) {
    const ev = dev.event();
    const cb = dev.commandBuffer().dispatch(...scale({ buffer: xs, offset: 0 }, y, 1)).signal(ev, 1).hint(key, true);
    cb.release();
    ev.release();
  }
  await Bun.sleep(50); // the builder works meanwhile (no result may depend on whether it finished)
  const ev = dev.event();
  for (let pos = 0; pos < 8; pos++) {
    const key = 11 + (pos % 2);
    const cb = dev
      .commandBuffer()
      .dispatch(...scale({ buffer: xs, offset: pos * 4 }, y, key))
      .signal(ev, pos + 1)
      .hint(key, pos < 4)
      .commit();
    cb.waitUntilCompleted(5000);
    expect(y.f32[5]).toBe(key * (5 + pos));
    expect(y.f32[n - 1]).toBe(key * (n - 1 + pos));
    expect(ev.value).toBe(pos + 1);
    expect(() => cb.hint(key, true)).toThrow(/command buffer \d+: hint after commit/);
    cb.release();
  }
  for (const r of [ev, xs, y]) r.release();
});

test("each dispatch, signal and wait counts as one encoded command on its device (bench:decode's commands per token)", () => {
  const ev = dev.event();
  const y = dev.buffer(n * 4);
  const before = dev.commandsEncoded;
  const cb = dev.commandBuffer().dispatch(...scale(x, y, 2)).signal(ev, 1).dispatch(...scale(y, y, 3)).commit();
  cb.waitUntilCompleted(5000);
  expect(dev.commandsEncoded - before).toBe(3);
  cb.release();
  ev.release();
  y.release();
});
