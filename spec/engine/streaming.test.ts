// The IO scheduler (lib/gpu/streaming.ts): uncached reads of the right bytes, priorities,
// promotion and cancellation, IO errors and short reads with clear messages, close() with
// reads in flight. Fault injection goes through the `reader` and `opener` hooks.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { constants, openSync } from "node:fs";
import { IoCancelledError, IoReadError, IoScheduler, DIRECT_ALIGNMENT } from "../../lib/gpu/streaming.ts";
import { alignedViews, errnoError, faultyReader, gate, settledWithin, tinyModel, type TinyModel } from "./fixture.ts";

let tiny: TinyModel;
let stride: number;
beforeAll(async () => {
  tiny = await tinyModel();
  stride = tiny.model.expertLayout.stride;
});
afterAll(() => tiny.cleanup());

/** Page-aligned memory for `n` records (a wired pool's slots are page-aligned too). */
const slots = (n: number) => alignedViews(n, stride);

const offsetOf = (l: number, e: number) => tiny.model.expertOffset(l, e);

test("reads every record of a layer uncached (or with a recorded fallback) and gets the file's bytes", async () => {
  const io = new IoScheduler({ maxInFlight: 4 });
  const file = io.open(tiny.model.paths.experts);
  if (process.platform === "linux") {
    // Either O_DIRECT is on, or the file system refused it and the reason says so.
    if (file.mode === "O_DIRECT") {
      expect(file.fallbackReason).toBeNull();
      expect(file.alignment).toBe(DIRECT_ALIGNMENT);
    } else expect(file.fallbackReason).toMatch(/O_DIRECT refused/);
  }
  const views = slots(8);
  const tickets = views.map((into, e) => io.submit({ file, position: offsetOf(2, e), into, priority: "demand", label: { layer: 2, expert: e } }));
  await Promise.all(tickets.map((t) => t.done));
  views.forEach((v, e) => expect(Buffer.compare(v, tiny.model.readExpertRecord(2, e))).toBe(0));
  const s = io.stats();
  expect(s.requestedBytes).toBe(8 * stride);
  expect(s.completedBytes).toBe(8 * stride);
  expect(s.reads).toBe(8);
  expect(s.latency.count).toBe(8);
  expect(s.latency.p99Us).toBeGreaterThanOrEqual(s.latency.p50Us);
  expect(s.requestedByPriority.demand).toBe(8 * stride);
  await io.close();
});

test("O_DIRECT alignment rules are checked before a read is queued", () => {
  const io = new IoScheduler();
  const file = io.open(tiny.model.paths.experts);
  const [v] = slots(1);
  if (file.mode === "O_DIRECT") {
    expect(() => io.submit({ file, position: 512 + DIRECT_ALIGNMENT, into: v!, priority: "demand" })).toThrow(/multiples of 4096/);
    expect(() => io.submit({ file, position: 0, into: v!.subarray(1, 1 + DIRECT_ALIGNMENT), priority: "demand" })).toThrow(/buffer address/);
  }
  expect(() => io.submit({ file, position: file.size, into: v!, priority: "demand", label: { layer: 4, expert: 7 } })).toThrow(
    /at offset \d+ \(layer 4 expert 7\) is outside the file/,
  );
  void io.close();
});

test("a file system that refuses O_DIRECT falls back to cached reads and says why", async () => {
  const io = new IoScheduler({
    opener: (path, flags) => {
      if (constants.O_DIRECT && flags & constants.O_DIRECT) throw errnoError("EINVAL", "invalid argument, open");
      return openSync(path, flags);
    },
  });
  const file = io.open(tiny.model.paths.experts);
  if (process.platform === "linux") {
    expect(file.mode).toBe("cached");
    expect(file.fallbackReason).toMatch(/O_DIRECT refused by the file system .*experts\.bin.*EINVAL/);
    expect(io.stats().fallbackReason).toBe(file.fallbackReason);
  }
  const [v] = slots(1);
  await io.submit({ file, position: offsetOf(1, 3), into: v!, priority: "demand" }).done;
  expect(Buffer.compare(v!, tiny.model.readExpertRecord(1, 3))).toBe(0);
  await io.close();
});

test("queued reads start by priority (demand > lookahead > ngram), FIFO within a class, with promotion", async () => {
  const f = faultyReader();
  const first = gate();
  f.hold.set(offsetOf(0, 0), first.promise);
  const io = new IoScheduler({ maxInFlight: 1, reader: f.reader });
  const file = io.open(tiny.model.paths.experts);
  const v = slots(7);
  const submit = (e: number, priority: "demand" | "lookahead" | "ngram", i: number) =>
    io.submit({ file, position: offsetOf(0, e), into: v[i]!, priority, label: { layer: 0, expert: e } });
  const blocker = submit(0, "lookahead", 0); // occupies the only read in flight
  submit(1, "ngram", 1);
  submit(2, "lookahead", 2);
  const promoted = submit(3, "lookahead", 3);
  submit(4, "demand", 4);
  submit(5, "ngram", 5);
  submit(6, "demand", 6);
  promoted.promote("demand");
  expect(promoted.priority).toBe("demand");
  expect(blocker.state).toBe("reading");
  expect(io.stats().queued).toBe(6);
  first.open();
  await io.drain();
  const order = f.started.map((p) => (p - offsetOf(0, 0)) / stride);
  expect(order).toEqual([0, 4, 6, 3, 2, 1, 5]);
  await io.close();
});

test("a queued read can be cancelled; a read in progress cannot", async () => {
  const f = faultyReader();
  const hold = gate();
  f.hold.set(offsetOf(3, 0), hold.promise);
  const io = new IoScheduler({ maxInFlight: 1, reader: f.reader });
  const file = io.open(tiny.model.paths.experts);
  const v = slots(2);
  const a = io.submit({ file, position: offsetOf(3, 0), into: v[0]!, priority: "lookahead" });
  const b = io.submit({ file, position: offsetOf(3, 1), into: v[1]!, priority: "lookahead", label: { layer: 3, expert: 1 } });
  expect(a.cancel()).toBe(false);
  expect(b.cancel()).toBe(true);
  expect(b.state).toBe("cancelled");
  const err = await b.done.catch((e) => e);
  expect(err).toBeInstanceOf(IoCancelledError);
  expect((err as Error).message).toMatch(/layer 3 expert 1/);
  hold.open();
  await a.done;
  expect(f.started.length).toBe(1); // b never reached the disk
  const s = io.stats();
  expect([s.cancelled, s.cancelledBytes, s.reads]).toEqual([1, stride, 1]);
  await io.close();
});

test("an IO error fails that read with file, offset, layer and expert; the scheduler keeps working", async () => {
  const f = faultyReader();
  const bad = offsetOf(2, 5);
  f.fail.add(bad);
  const io = new IoScheduler({ maxInFlight: 2, reader: f.reader });
  const file = io.open(tiny.model.paths.experts);
  const v = slots(3);
  const ok1 = io.submit({ file, position: offsetOf(2, 4), into: v[0]!, priority: "demand", label: { layer: 2, expert: 4 } });
  const failing = io.submit({ file, position: bad, into: v[1]!, priority: "demand", label: { layer: 2, expert: 5 } });
  const err = (await failing.done.catch((e) => e)) as IoReadError;
  expect(err).toBeInstanceOf(IoReadError);
  expect(err.message).toContain(tiny.model.paths.experts);
  expect(err.message).toContain(`offset ${bad}`);
  expect(err.message).toMatch(/layer 2 expert 5/);
  expect(err.message).toMatch(/EIO/);
  expect([err.layer, err.expert, err.position, err.code]).toEqual([2, 5, bad, "EIO"]);
  await ok1.done;
  // Still usable: the same record reads fine once the fault is gone.
  f.fail.clear();
  await io.submit({ file, position: bad, into: v[2]!, priority: "demand" }).done;
  expect(Buffer.compare(v[2]!, tiny.model.readExpertRecord(2, 5))).toBe(0);
  expect(io.stats().failed).toBe(1);
  await io.close();
});

test("a short read fails with the bytes it got, naming file, offset, layer and expert", async () => {
  const f = faultyReader();
  const at = offsetOf(1, 6);
  f.short.add(at);
  const io = new IoScheduler({ reader: f.reader });
  const file = io.open(tiny.model.paths.experts);
  const [v] = slots(1);
  const err = (await io.submit({ file, position: at, into: v!, priority: "demand", label: { layer: 1, expert: 6 } }).done.catch((e) => e)) as IoReadError;
  expect(err).toBeInstanceOf(IoReadError);
  expect(err.code).toBe("SHORT_READ");
  expect(err.message).toMatch(new RegExp(`experts\\.bin: short read at offset ${at} \\(layer 1 expert 6\\): got ${stride / 2} of ${stride} bytes`));
  await io.close();
});

test("close() with reads in flight waits for them, cancels the queued ones, and nothing hangs", async () => {
  // Every read waits at a gate, opened only after close(): the two in flight cannot finish
  // early whatever the machine's load.
  const slow = faultyReader();
  const hold = gate();
  for (let e = 0; e < 6; e++) slow.hold.set(offsetOf(4, e), hold.promise);
  const io = new IoScheduler({ maxInFlight: 2, demandReserve: 0, reader: slow.reader });
  const file = io.open(tiny.model.paths.experts);
  const v = slots(6);
  const tickets = v.map((into, e) => io.submit({ file, position: offsetOf(4, e), into, priority: "lookahead", label: { layer: 4, expert: e } }));
  expect(tickets.filter((t) => t.state === "reading").length).toBe(2);
  const closing = io.close();
  expect(await settledWithin(closing, 1)).toBe("pending"); // it waits for the reads in flight
  hold.open();
  expect(await settledWithin(closing, 60_000)).toBe("resolved");
  const states = await Promise.all(tickets.map((t) => settledWithin(t.done, 100)));
  expect(states).toEqual(["resolved", "resolved", "rejected", "rejected", "rejected", "rejected"]);
  const err = await tickets[5]!.done.catch((e) => e);
  expect(err).toBeInstanceOf(IoCancelledError);
  expect((err as IoCancelledError).reason).toBe("closed");
  expect(Buffer.compare(v[1]!, tiny.model.readExpertRecord(4, 1))).toBe(0);
  expect(() => io.submit({ file, position: 0, into: v[0]!, priority: "demand" })).toThrow(/closed/);
});

test("a read submitted `after` another starts only once that one settles", async () => {
  const f = faultyReader();
  const hold = gate();
  f.hold.set(offsetOf(0, 1), hold.promise);
  const io = new IoScheduler({ maxInFlight: 4, reader: f.reader });
  const file = io.open(tiny.model.paths.experts);
  const [v] = slots(1);
  const first = io.submit({ file, position: offsetOf(0, 1), into: v!, priority: "lookahead" });
  const second = io.submit({ file, position: offsetOf(0, 2), into: v!, priority: "demand", after: first.done });
  await Bun.sleep(10);
  expect(second.state).toBe("waiting");
  expect(f.started).toEqual([offsetOf(0, 1)]);
  hold.open();
  await second.done;
  expect(Buffer.compare(v!, tiny.model.readExpertRecord(0, 2))).toBe(0); // the later read's bytes win
  await io.close();
});

test("prefetches leave the reserved in-flight places to demand reads", async () => {
  const f = faultyReader();
  const hold = gate();
  for (let e = 0; e < 8; e++) f.hold.set(offsetOf(1, e), hold.promise);
  const io = new IoScheduler({ maxInFlight: 4, reader: f.reader });
  expect(io.demandReserve).toBe(1);
  const file = io.open(tiny.model.paths.experts);
  const v = slots(7);
  const look = [0, 1, 2, 3, 4].map((e) => io.submit({ file, position: offsetOf(1, e), into: v[e]!, priority: "lookahead" }));
  expect(look.map((t) => t.state)).toEqual(["reading", "reading", "reading", "queued", "queued"]);
  const demand = io.submit({ file, position: offsetOf(1, 5), into: v[5]!, priority: "demand" });
  expect(demand.state).toBe("reading"); // no wait behind the prefetches
  const more = io.submit({ file, position: offsetOf(1, 6), into: v[6]!, priority: "demand" });
  expect(more.state).toBe("queued"); // the window is full now
  hold.open();
  await io.drain();
  expect(f.started.slice(0, 5).map((p) => (p - offsetOf(1, 0)) / stride)).toEqual([0, 1, 2, 5, 6]);
  expect(() => new IoScheduler({ maxInFlight: 2, demandReserve: 2 })).toThrow(/demandReserve 2 must be an integer in 0\.\.1/);
  await io.close();
});
