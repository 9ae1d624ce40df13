// The expert pool (lib/gpu/residency.ts): LRU order, pinning, eviction never touching pinned
// slots, pool-too-small errors, both backings holding the exact record bytes, lookahead
// accounting, cancellation of queued lookahead reads, IO failures, determinism, close().
import { afterAll, beforeAll, expect, test } from "bun:test";
import { createExpertPool, DEFAULT_POOL_POLICY, layerCycleOrder, PoolTooSmallError, type ExpertPool } from "../../lib/gpu/residency.ts";
import { IoReadError, IoScheduler, IoTimeoutError } from "../../lib/gpu/streaming.ts";
import { Device } from "../../lib/shim.ts";
import { faultyReader, gate, settledWithin, tinyModel, type TinyModel } from "./fixture.ts";

let tiny: TinyModel;
let layers: number;
let perLayer: number;
let stride: number;
beforeAll(async () => {
  tiny = await tinyModel(23);
  ({ layers, perLayer, stride } = tiny.model.expertLayout);
});
afterAll(() => tiny.cleanup());

/** A mapped pool without a device, policy "lru": no IO, the LRU alone (decisions are the same for both backings). */
const lruPool = (capacity: number) => createExpertPool({ backing: "mapped", model: tiny.model, capacity, policy: "lru" });

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && Buffer.compare(a, b) === 0;
}

test("misses fill free slots, hits keep theirs, and the least recently used unpinned record is evicted", async () => {
  const pool = lruPool(4);
  let a = pool.acquire(0, [0, 1]);
  expect([a.misses, a.missIds]).toEqual([2, [0, 1]]);
  pool.release(0);
  a = pool.acquire(1, [0, 1]);
  expect(a.misses).toBe(2);
  pool.release(1);
  // Recency now (oldest first): L0e0, L0e1, L1e0, L1e1. Touch L0e0.
  a = pool.acquire(0, [0]);
  expect(a.misses).toBe(0);
  pool.release(0);
  a = pool.acquire(2, [5]);
  expect(a.missIds).toEqual([5]);
  expect(pool.isResident(0, 1)).toBe(false); // the least recent went
  expect(pool.isResident(0, 0)).toBe(true);
  expect(pool.isResident(1, 0) && pool.isResident(1, 1)).toBe(true);
  pool.release(2);
  const s = pool.poolStats();
  expect([s.hits, s.misses, s.evictions, s.resident]).toEqual([1, 5, 1, 4]);
  expect(s.hitRate).toBeCloseTo(1 / 6, 12);
  expect(s.perLayer.misses.slice(0, 3)).toEqual([2, 2, 1]);
  await pool.close();
});

test("pinned slots are never evicted, and a union that cannot fit beside them fails clearly", async () => {
  const pool = lruPool(4);
  pool.acquire(0, [0, 1, 2]); // pinned until release(0)
  for (let e = 0; e < perLayer; e++) {
    // One free slot cycles through layer 1's experts; layer 0's three stay.
    const a = pool.acquire(1, [e]);
    expect(a.misses).toBe(1);
    pool.release(1);
    expect([0, 1, 2].every((x) => pool.isResident(0, x))).toBe(true);
  }
  expect(() => pool.acquire(2, [3, 4])).toThrow(PoolTooSmallError);
  expect(() => pool.acquire(2, [3, 4])).toThrow(/layer 2 routes 2 distinct experts this step, the pool has 4 slots of which 3 are pinned/);
  // The failed acquire changed nothing: layer 2 can be acquired once there is room.
  pool.release(0);
  expect(pool.acquire(2, [3, 4]).misses).toBe(2);
  expect(() => pool.acquire(3, [0, 1, 2, 3, 4])).toThrow(/layer 3 routes 5 distinct experts this step, the pool has 4 slots/);
  await pool.close();
});

test("acquire rejects a layer acquired twice and ids out of range; duplicates are one union entry", async () => {
  const pool = lruPool(8);
  const a = pool.acquire(1, [3, 5, 3, 1, 5]);
  expect(a.union).toEqual([3, 5, 1]);
  expect(() => pool.acquire(1, [2])).toThrow(/layer 1 is already acquired; release\(1\) first/);
  expect(() => pool.acquire(2, [perLayer])).toThrow(new RegExp(`layer 2: expert id ${perLayer} is not in 0\\.\\.${perLayer - 1}`));
  expect(() => pool.acquire(layers, [0])).toThrow(/layer 5 is not in 0\.\.4/);
  pool.release(1);
  pool.release(1); // idempotent
  await pool.close();
  expect(() => pool.acquire(0, [0])).toThrow(/closed/);
});

test("the slot table lists the acquired union's slots and its size; mapped slots are record indices", async () => {
  const pool = lruPool(6);
  const a = pool.acquire(3, [6, 2]);
  const table = new Int32Array(pool.slotTableStride + 2).fill(99);
  pool.writeSlotTable(3, table);
  for (let e = 0; e < perLayer; e++) expect(table[e]).toBe(e === 6 || e === 2 ? 3 * perLayer + e : -1);
  expect(table[perLayer]).toBe(2);
  expect(table[perLayer + 1]).toBe(99); // nothing written past the stride
  expect(Array.from(a.slotOf)).toEqual(Array.from(table.subarray(0, perLayer)));
  expect(() => pool.writeSlotTable(2, table)).toThrow(/layer 2 is not acquired/);
  await pool.close();
});

/** Acquires every record once, layer by layer, through a pool smaller than the model. */
async function checkEveryRecord(pool: ExpertPool): Promise<void> {
  for (let l = 0; l < layers; l++) {
    const ids = Array.from({ length: perLayer }, (_, e) => (e * 3 + l) % perLayer);
    for (let i = 0; i < ids.length; i += 3) {
      const union = ids.slice(i, i + 3);
      const a = pool.acquire(l, union);
      await a.ready;
      for (const e of union) {
        const slot = a.slotOf[e]!;
        const want = tiny.model.readExpertRecord(l, e);
        expect(sameBytes(pool.slotView(slot), want)).toBe(true);
        if (pool.buffers.length) {
          const buf = pool.slotBuffer(slot);
          const off = pool.slotOffset(slot);
          expect(sameBytes(buf.bytes.subarray(off, off + stride), want)).toBe(true);
          expect(pool.buffers[pool.slotBufferIndex(slot)]).toBe(buf);
        }
      }
      pool.release(l);
    }
  }
}

test("wired slots (shim buffers, uncached reads) hold exactly the records of experts.bin", async () => {
  const dev = Device.open();
  // 5 slots across 3 buffers of 2 slots: slots never straddle buffers.
  const pool = createExpertPool({ backing: "wired", model: tiny.model, capacity: 5, device: dev, maxBufferBytes: 2 * stride + 100 });
  expect(pool.buffers.length).toBe(3);
  expect(pool.slotsPerBuffer).toBe(2);
  expect(pool.slotOffset(3)).toBe(stride);
  expect(pool.slotBufferIndex(3)).toBe(1);
  await checkEveryRecord(pool);
  expect(pool.poolStats().misses).toBe(layers * perLayer);
  await pool.close();
  dev.close();
});

test("mapped slots (a wrapped mapping of experts.bin) hold exactly the records, with nothing read", async () => {
  const dev = Device.open();
  const pool = createExpertPool({ backing: "mapped", model: tiny.model, capacity: 5, device: dev, maxBufferBytes: 16 * stride });
  expect(pool.slotCount).toBe(layers * perLayer);
  expect(pool.buffers.length).toBe(Math.ceil((layers * perLayer) / 16));
  await checkEveryRecord(pool);
  await pool.close();
  dev.close();
});

test("both backings make the same residency decisions for the same calls", async () => {
  const calls: [number, number[]][] = [];
  let x = 7;
  for (let i = 0; i < 60; i++) {
    const l = i % layers;
    const ids: number[] = [];
    for (let k = 0; k < 3; k++) ids.push(((x = (Math.imul(x, 1103515245) + 12345) >>> 0) >>> 16) % perLayer);
    calls.push([l, ids]);
  }
  const run = async (backing: "wired" | "mapped") => {
    const pool = createExpertPool({ backing, model: tiny.model, capacity: 9 });
    const log: string[] = [];
    for (const [l, ids] of calls) {
      if (l % 2 === 0) pool.prefetch(l, ids.slice(0, 2));
      const a = pool.acquire(l, ids);
      await a.ready;
      log.push(a.missIds.join(","));
      pool.release(l);
    }
    const stats = { pool: pool.poolStats(), lookahead: pool.lookaheadStats() };
    await pool.close();
    return { log, stats };
  };
  const w1 = await run("wired");
  const w2 = await run("wired");
  const m = await run("mapped");
  expect(w2).toEqual(w1);
  expect(m.log).toEqual(w1.log);
  // Mapped records are never "loading", everything else matches.
  expect({ ...m.stats.pool, backing: "wired", hitsWhileLoading: 0 }).toEqual({ ...w1.stats.pool, hitsWhileLoading: 0 });
  expect(m.stats.lookahead).toEqual(w1.stats.lookahead);
  expect(w1.stats.pool.hits).toBeGreaterThan(0);
  expect(w1.stats.pool.evictions).toBeGreaterThan(0);
});

test("lookahead predictions are counted as used when acquired, wasted (with bytes) when evicted unused", async () => {
  const pool = createExpertPool({ backing: "wired", model: tiny.model, capacity: 4 });
  const p = pool.prefetch(2, [0, 1]);
  expect(p.issued).toBe(2);
  await p.ready;
  const a = pool.acquire(2, [0, 5]); // 0 predicted and used, 5 a miss
  expect([a.misses, a.missIds]).toEqual([1, [5]]);
  await a.ready;
  pool.release(2);
  expect(pool.prefetch(2, [0]).issued).toBe(0); // already resident
  // Three new records: the unused prediction (2,1) is the least recent and goes first.
  const b = pool.acquire(3, [0, 1, 2]);
  await b.ready;
  expect(pool.isResident(2, 1)).toBe(false);
  pool.release(3);
  const la = pool.lookaheadStats();
  expect(la).toMatchObject({ predictions: 2, used: 1, wasted: 1, wastedBytes: stride, alreadyResident: 1, cancelled: 0 });
  expect(la.accuracy).toBe(0.5);
  await pool.close();
});

test("a demand that needs the slots of queued lookahead reads cancels them; the read in flight is waited for", async () => {
  const f = faultyReader();
  const hold = gate();
  f.hold.set(tiny.model.expertOffset(1, 0), hold.promise);
  const io = new IoScheduler({ maxInFlight: 1, reader: f.reader });
  const pool = createExpertPool({ backing: "wired", model: tiny.model, capacity: 4, scheduler: io });
  pool.prefetch(1, [0, 1, 2, 3]); // (1,0) reading and held; three queued
  const a = pool.acquire(4, [4, 5, 6, 7]);
  expect(a.misses).toBe(4);
  const la = pool.lookaheadStats();
  expect([la.predictions, la.cancelled, la.wasted]).toEqual([4, 3, 1]);
  expect(await settledWithin(a.ready, 50)).toBe("pending"); // one slot still receives (1,0)
  hold.open();
  await a.ready;
  for (const e of [4, 5, 6, 7]) expect(sameBytes(pool.slotView(a.slotOf[e]!), tiny.model.readExpertRecord(4, e))).toBe(true);
  // (1,1..3) never touched the disk.
  expect(f.started.filter((p) => p >= tiny.model.expertOffset(1, 1) && p <= tiny.model.expertOffset(1, 3))).toEqual([]);
  pool.release(4);
  await pool.close();
  await io.close();
});

test("a hit on a record still being prefetched waits for that read and promotes it", async () => {
  const f = faultyReader();
  const hold = gate();
  f.hold.set(tiny.model.expertOffset(0, 3), hold.promise);
  const io = new IoScheduler({ maxInFlight: 1, reader: f.reader });
  const pool = createExpertPool({ backing: "wired", model: tiny.model, capacity: 6, scheduler: io });
  pool.prefetch(0, [3], "lookahead"); // in flight, held
  pool.prefetch(0, [4, 5], "ngram"); // queued at the lowest priority
  const a = pool.acquire(0, [5]); // a hit on a queued read: promoted to demand
  expect(a.misses).toBe(0);
  expect(pool.poolStats().hitsWhileLoading).toBe(1);
  hold.open();
  await a.ready;
  const order = f.started.map((p) => (p - tiny.model.expertOffset(0, 0)) / stride);
  expect(order).toEqual([3, 5, 4]); // the promoted read jumped the queue
  expect(sameBytes(pool.slotView(a.slotOf[5]!), tiny.model.readExpertRecord(0, 5))).toBe(true);
  pool.release(0);
  await pool.close();
  await io.close();
});

test("a failed read rejects the acquire naming file, offset, layer and expert; the slot is emptied and the pool stays usable", async () => {
  const f = faultyReader();
  const bad = tiny.model.expertOffset(3, 2);
  f.fail.add(bad);
  const io = new IoScheduler({ reader: f.reader });
  const pool = createExpertPool({ backing: "wired", model: tiny.model, capacity: 4, scheduler: io });
  const a = pool.acquire(3, [1, 2]);
  const err = (await a.ready.catch((e) => e)) as IoReadError;
  expect(err).toBeInstanceOf(IoReadError);
  expect(err.message).toContain(tiny.model.paths.experts);
  expect(err.message).toContain(`offset ${bad}`);
  expect(err.message).toMatch(/layer 3 expert 2/);
  expect(pool.isResident(3, 2)).toBe(false);
  expect(pool.isResident(3, 1)).toBe(true);
  pool.release(3);
  // Usable: other records, and the failed one once the fault is gone.
  const b = pool.acquire(2, [0, 1, 2, 3]);
  await b.ready;
  pool.release(2);
  f.fail.clear();
  const c = pool.acquire(3, [2]);
  expect(c.misses).toBe(1);
  await c.ready;
  expect(sameBytes(pool.slotView(c.slotOf[2]!), tiny.model.readExpertRecord(3, 2))).toBe(true);
  pool.release(3);
  // A failed prefetch is counted, never thrown.
  f.short.add(tiny.model.expertOffset(0, 7));
  const p = pool.prefetch(0, [7]);
  expect(await settledWithin(p.ready, 60_000)).toBe("resolved"); // the limit only catches a hang
  expect(pool.isResident(0, 7)).toBe(false);
  expect(io.stats().failed).toBe(2);
  await pool.close();
  await io.close();
});

test("close() while reads are in flight cancels the queued ones, waits for the rest, and rejects pending acquires", async () => {
  // The reads wait at a gate opened only after close(): the first is certainly still in flight.
  const f = faultyReader();
  const hold = gate();
  for (let e = 0; e < 4; e++) f.hold.set(tiny.model.expertOffset(1, e), hold.promise);
  const io = new IoScheduler({ maxInFlight: 1, reader: f.reader });
  const pool = createExpertPool({ backing: "wired", model: tiny.model, capacity: 8, scheduler: io });
  const a = pool.acquire(1, [0, 1, 2, 3]);
  const closing = pool.close();
  hold.open();
  expect(await settledWithin(closing, 60_000)).toBe("resolved");
  expect(await settledWithin(a.ready, 100)).toBe("rejected");
  expect(io.stats().inFlight).toBe(0);
  expect(io.stats().cancelled).toBe(3);
  await io.close();
});

test("a slot's next read always waits for every earlier read still writing into it", async () => {
  const f = faultyReader();
  const hold = gate();
  f.hold.set(tiny.model.expertOffset(0, 0), hold.promise); // A: in flight, lands only when the gate opens
  const io = new IoScheduler({ maxInFlight: 4, reader: f.reader });
  const pool = createExpertPool({ backing: "wired", model: tiny.model, capacity: 1, scheduler: io });
  pool.prefetch(0, [0]); // A into the only slot
  pool.acquire(1, [0]); // B: must wait for A (chained)
  pool.release(1); // B given up while still waiting
  const c = pool.acquire(2, [0]); // C: B is cancelled, C must still wait for A
  expect(io.stats().cancelled).toBe(1);
  await Bun.sleep(10);
  expect(await settledWithin(c.ready, 1)).toBe("pending");
  hold.open();
  await c.ready;
  expect(sameBytes(pool.slotView(c.slotOf[0]!), tiny.model.readExpertRecord(2, 0))).toBe(true); // not A's bytes
  pool.release(2);
  await pool.close();
  await io.close();
});

test("evictAll() drops every record but keeps the slots; it refuses while a layer is acquired", async () => {
  const pool = createExpertPool({ backing: "wired", model: tiny.model, capacity: 6 });
  const a = pool.acquire(1, [0, 1, 2]);
  expect(() => pool.evictAll()).toThrow(/layers 1 are still acquired/);
  await a.ready;
  pool.release(1);
  pool.prefetch(2, [4, 5]);
  pool.evictAll();
  expect(pool.poolStats().resident).toBe(0);
  const b = pool.acquire(1, [0, 1, 2, 3, 4, 5]);
  expect(b.misses).toBe(6);
  await b.ready;
  for (const e of [0, 3, 5]) expect(sameBytes(pool.slotView(b.slotOf[e]!), tiny.model.readExpertRecord(1, e))).toBe(true);
  expect(pool.poolStats().evictions).toBe(0);
  pool.release(1);
  await pool.close();
});

test("recordReads counts the reads issued per record: misses and predictions, not hits; the mapped backing reads nothing", async () => {
  const pool = createExpertPool({ backing: "wired", model: tiny.model, capacity: 6 });
  const at = (l: number, e: number) => l * perLayer + e;
  const a = pool.acquire(1, [0, 1, 1, 2]);
  await a.ready;
  pool.release(1);
  await pool.prefetch(2, [3]).ready;
  const b = pool.acquire(1, [0, 1]); // hits
  await b.ready;
  pool.release(1);
  let r = pool.recordReads();
  expect([r[at(1, 0)], r[at(1, 1)], r[at(1, 2)], r[at(2, 3)], r[at(1, 3)]]).toEqual([1, 1, 1, 1, 0]);
  expect(r.reduce((s, x) => s + x, 0)).toBe(4);
  r[at(1, 0)] = 99; // a copy: the pool's counts stay
  pool.evictAll();
  const c = pool.acquire(1, [0]); // read again after the pool was emptied
  await c.ready;
  pool.release(1);
  r = pool.recordReads();
  expect([r[at(1, 0)], r.reduce((s, x) => s + x, 0)]).toEqual([2, 5]);
  await pool.close();
  const mapped = lruPool(4);
  mapped.acquire(0, [0, 1]);
  expect(mapped.recordReads().every((x) => x === 0)).toBe(true);
  await mapped.close();
});

// ---- layer-cyclic eviction ----------------------------------------------------------

/** A mapped pool without a device, policy "layer-cyclic". */
const cyclicPool = (capacity: number, mtp = false) => createExpertPool({ backing: "mapped", model: tiny.model, capacity, policy: "layer-cyclic", mtp });

test("layer-cyclic order: the served layer's own records first, then backwards round the cycle; the MTP head is the cycle's last stop", () => {
  // Layer m is ((m - ref - 1) mod N) + 1 steps from ref: farthest first.
  expect(layerCycleOrder(0, 5)).toEqual([0, 4, 3, 2, 1]);
  expect(layerCycleOrder(3, 5)).toEqual([3, 2, 1, 0, 4]);
  expect(layerCycleOrder(4, 5)).toEqual([4, 3, 2, 1, 0]);
  // With the MTP head (layer 4): trunk layers see it just before layer 0 ...
  expect(layerCycleOrder(1, 5, true)).toEqual([1, 0, 4, 3, 2]);
  // ... and while it is served (chained draft rows come back to back), its own records are kept longest.
  expect(layerCycleOrder(4, 5, true)).toEqual([3, 2, 1, 0, 4]);
  expect(DEFAULT_POOL_POLICY).toBe("reuse");
  expect(createExpertPool({ backing: "mapped", model: tiny.model, capacity: 4 }).policy).toBe(DEFAULT_POOL_POLICY);
  expect(() => createExpertPool({ backing: "mapped", model: tiny.model, capacity: 4, policy: "mru" as never })).toThrow(/policy must be "lru" or "layer-cyclic" or "reuse", got "mru"/);
});

test("layer-cyclic evicts from the layer whose next visit is farthest away, not the least recently used", async () => {
  const pool = cyclicPool(6);
  for (const l of [0, 1, 2]) {
    pool.acquire(l, [0, 1]);
    pool.release(l);
  }
  // Full. Serving layer 3: layer 2 comes back last (4 steps), layer 0 next-but-one (2 steps);
  // LRU would take L0e0, the record needed soonest.
  let a = pool.acquire(3, [0]);
  expect(a.missIds).toEqual([0]);
  expect(pool.isResident(2, 0)).toBe(false); // the farthest layer's least recent
  expect([pool.isResident(2, 1), pool.isResident(0, 0), pool.isResident(0, 1), pool.isResident(1, 0)]).toEqual([true, true, true, true]);
  pool.release(3);
  // Within a layer, the least recently used goes first: touch L1e0, then serve layer 2 (layer 1 is farthest from 2 after 2 itself).
  pool.acquire(1, [0]);
  pool.release(1);
  a = pool.acquire(2, [1, 5]); // L2e1 hits (pinned); L2e5 misses: layer 2 has nothing else unpinned, so layer 1's least recent, L1e1
  expect([a.misses, a.missIds]).toEqual([1, [5]]);
  expect(pool.isResident(1, 1)).toBe(false);
  expect(pool.isResident(1, 0)).toBe(true);
  pool.release(2);
  // The served layer's own unpinned records go before any other layer's.
  a = pool.acquire(2, [6]);
  expect(a.missIds).toEqual([6]);
  expect([pool.isResident(2, 1), pool.isResident(2, 5)]).toEqual([false, true]); // L2e1 was less recent than L2e5
  pool.release(2);
  const s = pool.poolStats();
  expect(s.resident).toBe(6);
  expect(s.evictions).toBe(3);
  await pool.close();
});

test("layer-cyclic never evicts pinned slots, and the pool too small error is the same", async () => {
  const pool = cyclicPool(4);
  pool.acquire(0, [0, 1, 2]);
  for (let e = 0; e < perLayer; e++) {
    expect(pool.acquire(1, [e]).misses).toBe(1);
    pool.release(1);
    expect([0, 1, 2].every((x) => pool.isResident(0, x))).toBe(true);
  }
  expect(() => pool.acquire(2, [3, 4])).toThrow(PoolTooSmallError);
  pool.release(0);
  // Serving layer 0 again: its own unpinned records are the farthest; the pinned union stays.
  expect(pool.acquire(0, [0, 3]).missIds).toEqual([3]);
  expect(pool.isResident(0, 0)).toBe(true);
  await pool.close();
});

test("layer-cyclic with the MTP head: drafting keeps the MTP experts, trunk layers see it last before layer 0", async () => {
  const pool = cyclicPool(5, true); // layer 4 is the MTP head
  for (const [l, ids] of [[0, [0]], [1, [0]], [2, [0]], [3, [0]], [4, [0]]] as [number, number[]][]) {
    pool.acquire(l, ids);
    pool.release(l);
  }
  // A second chained draft row on the MTP head: layer 3 is the farthest (a whole trunk away), not L4e0.
  expect(pool.acquire(4, [1]).missIds).toEqual([1]);
  expect([pool.isResident(3, 0), pool.isResident(4, 0)]).toEqual([false, true]);
  pool.release(4);
  // Serving layer 1: layer 1 itself, then 0, then the MTP head (visited just before layer 0's next turn) go first.
  expect(pool.acquire(1, [0, 2]).missIds).toEqual([2]);
  expect(pool.isResident(0, 0)).toBe(false);
  pool.release(1);
  expect(pool.acquire(1, [3]).missIds).toEqual([3]);
  // Layer 1's unpinned records (e0, e2) go before the MTP head's: the least recent, e0.
  expect([pool.isResident(1, 0), pool.isResident(1, 2), pool.isResident(4, 0), pool.isResident(4, 1)]).toEqual([false, true, true, true]);
  pool.release(1);
  await pool.close();
});

test("layer-cyclic and reuse decisions are the same on both backings (wired reads awaited) and do not depend on IO timing", async () => {
  const calls: [number, number[]][] = [];
  let x = 7;
  const rand = (n: number) => ((x = (Math.imul(x, 1103515245) + 12345) >>> 0) >>> 8) % n;
  for (let t = 0; t < 30; t++) for (let l = 0; l < layers; l++) calls.push([l, [rand(perLayer), rand(perLayer)]]);
  const run = async (backing: "wired" | "mapped", wait: boolean, policy: "layer-cyclic" | "reuse") => {
    const pool = createExpertPool({ backing, model: tiny.model, capacity: 7, policy });
    const log: number[][] = [];
    for (const [l, ids] of calls) {
      const a = pool.acquire(l, ids);
      if (wait) await a.ready;
      log.push([...a.missIds]);
      pool.release(l);
      if (!wait) await a.ready.catch(() => {});
    }
    const st = pool.poolStats();
    await pool.close();
    return { log, hits: st.hits, misses: st.misses };
  };
  for (const policy of ["layer-cyclic", "reuse"] as const) {
    const mapped = await run("mapped", false, policy);
    expect(await run("wired", true, policy)).toEqual(mapped);
    expect(await run("wired", false, policy)).toEqual(mapped);
    expect(mapped.hits).toBeGreaterThan(0);
  }
});

test("a released record whose read is still queued is not the victim while a record in place can go (every policy)", async () => {
  // bench:io's pattern at large records: acquire and release at once, await a window later.
  // Layer-cyclic order alone would take the served layer's own record, just asked for and
  // still queued, and its acquire would reject with IoCancelledError.
  for (const policy of ["lru", "layer-cyclic", "reuse"] as const) {
    const f = faultyReader();
    const hold = gate();
    f.hold.set(tiny.model.expertOffset(3, 0), hold.promise);
    const io = new IoScheduler({ maxInFlight: 1, reader: f.reader });
    const pool = createExpertPool({ backing: "wired", model: tiny.model, capacity: 4, scheduler: io, policy });
    for (const e of [4, 5, 6, 7]) {
      const a = pool.acquire(0, [e]);
      await a.ready;
      pool.release(0);
    }
    const waits: Promise<void>[] = [];
    for (const [l, e] of [[3, 0], [1, 1], [1, 2], [1, 3]] as const) {
      waits.push(pool.acquire(l, [e]).ready); // (3,0) held in flight, the layer 1 reads queued behind it
      pool.release(l);
    }
    expect(io.stats().cancelled).toBe(0);
    expect([0, 1, 2, 3].every((e) => !pool.isResident(0, 4 + e))).toBe(true); // the records in place went
    hold.open();
    expect(await settledWithin(Promise.all(waits), 5000)).toBe("resolved");
    for (const [l, e] of [[3, 0], [1, 1], [1, 2], [1, 3]] as const) expect(pool.isResident(l, e)).toBe(true);
    await pool.close();
    await io.close();
  }
});

// ---- reuse eviction ------------------------------------------------------------------

/** A mapped pool without a device, policy "reuse". */
const reusePool = (capacity: number) => createExpertPool({ backing: "mapped", model: tiny.model, capacity, policy: "reuse" });

test("reuse keeps a layer's frequently used expert over a rarely used one that is more recent (layer-cyclic does the opposite)", async () => {
  const play = (pool: ExpertPool) => {
    for (let i = 0; i < 5; i++) {
      pool.acquire(0, [0]); // e0: five visits in a row
      pool.release(0);
    }
    pool.acquire(0, [1]); // e1: once, last
    pool.release(0);
    pool.acquire(0, [2]); // full: one of e0, e1 must go
    pool.release(0);
  };
  const reuse = reusePool(2);
  play(reuse);
  expect([reuse.isResident(0, 0), reuse.isResident(0, 1)]).toEqual([true, false]);
  const lc = cyclicPool(2);
  play(lc);
  expect([lc.isResident(0, 0), lc.isResident(0, 1)]).toEqual([false, true]);
  await reuse.close();
  await lc.close();
});

test("reuse: a prediction is kept until its layer's next visit, then, unused, it goes first", async () => {
  let pool = reusePool(2);
  pool.acquire(0, [0]);
  pool.release(0);
  expect(pool.prefetch(1, [5]).issued).toBe(1);
  // Serving layer 2 (layer 1 not visited yet): the prediction counts as likely used; L0e0, used once, goes.
  pool.acquire(2, [3]);
  pool.release(2);
  expect([pool.isResident(1, 5), pool.isResident(0, 0)]).toEqual([true, false]);
  await pool.close();
  pool = reusePool(2);
  pool.acquire(0, [0]);
  pool.release(0);
  pool.prefetch(1, [5]);
  // Layer 1's visit routes elsewhere: the prediction was wrong and is the victim, counted as wasted.
  expect(pool.acquire(1, [6]).missIds).toEqual([6]);
  pool.release(1);
  expect([pool.isResident(1, 5), pool.isResident(0, 0)]).toEqual([false, true]);
  expect(pool.lookaheadStats()).toMatchObject({ predictions: 1, used: 0, wasted: 1 });
  await pool.close();
});

test("reuse: a prefetch does not push out a record expected back sooner than the prediction", async () => {
  const pool = reusePool(1);
  for (let i = 0; i < 40; i++) {
    pool.acquire(2, [0]); // used at every visit of layer 2
    pool.release(2);
  }
  expect(pool.prefetch(1, [4]).issued).toBe(0);
  expect(pool.isResident(2, 0)).toBe(true);
  expect(pool.lookaheadStats()).toMatchObject({ predictions: 0, skipped: 1 });
  await pool.close();
  const rare = reusePool(1);
  rare.acquire(2, [0]); // used once
  rare.release(2);
  expect(rare.prefetch(1, [4]).issued).toBe(1);
  expect(rare.isResident(1, 4)).toBe(true);
  await rare.close();
});

test("reuse: the per-batch victim cache makes exactly the choices of a full rescan for every victim", async () => {
  // Lists longer than REUSE_SCAN (96 records a layer at 50% and 25% of 12 x 96), demand misses
  // and lookahead prefetches (right and wrong) in each site. Mapped: no IO, so the decisions do
  // not depend on read timing (with reads in flight, queued and busy slots would differ run to
  // run; the cache keeps those per layer the same way, and no read settles inside a batch).
  let x = 3;
  const rand = (n: number) => ((x = (Math.imul(x, 1103515245) + 12345) >>> 0) >>> 8) % n;
  const pick = (n: number, k: number) => {
    const s = new Set<number>();
    while (s.size < k) s.add(rand(n));
    return [...s];
  };
  const replay = async (pool: ExpertPool, L: number, E: number, k: number, steps: number) => {
    const log: unknown[] = [];
    let next = pick(E, k);
    for (let t = 0; t < steps; t++)
      for (let l = 0; l < L; l++) {
        const ids = next;
        next = pick(E, k);
        const a = pool.acquire(l, ids);
        const predicted = rand(4) === 0 ? pick(E, k) : next; // a quarter of the predictions wrong
        const p = l + 1 < L ? pool.prefetch(l + 1, predicted) : null;
        log.push([a.missIds, Array.from(a.slotOf), p?.issued ?? -1]);
        pool.release(l);
        await a.ready;
      }
    const st = pool.poolStats();
    log.push([st.hits, st.misses, pool.lookaheadStats()]);
    await pool.close();
    return log;
  };
  const sim = { paths: { experts: "(simulation: no file)" }, expertLayout: { stride: 1, layers: 12, perLayer: 96 } } as never;
  for (const capacity of [576, 288]) {
    const runs: unknown[][] = [];
    for (const victimCache of [true, false]) {
      x = 3; // the same routing for both
      runs.push(await replay(createExpertPool({ backing: "mapped", model: sim, capacity, policy: "reuse", victimCache }), 12, 96, 8, 20));
    }
    expect(runs[0]!.length).toBe(12 * 20 + 1);
    expect(runs[0]).toEqual(runs[1]!);
  }
});

test("fullyResident: true only once every record of every layer is in place and read; an eviction ends it", async () => {
  const records = layers * perLayer;
  const small = lruPool(records - 1);
  const full = lruPool(records);
  expect(full.fullyResident()).toBe(false);
  for (let l = 0; l < layers; l++) {
    for (const pool of [small, full]) {
      pool.acquire(l, Array.from({ length: perLayer }, (_, e) => e));
      pool.release(l);
    }
    expect(full.fullyResident()).toBe(l === layers - 1);
    expect(full.fullyResident(l + 1)).toBe(true); // the first l + 1 layers (trunk layers a step runs)
    if (l + 1 < layers) expect(full.fullyResident(l + 2)).toBe(false);
  }
  expect(small.fullyResident()).toBe(false); // one record short: some acquire can still miss
  full.evictAll();
  expect(full.fullyResident()).toBe(false);
  await Promise.all([small.close(), full.close()]);

  // Wired: a record still being read does not count.
  const io = new IoScheduler({ reader: faultyReader().reader });
  const wired = createExpertPool({ backing: "wired", model: tiny.model, capacity: records, scheduler: io });
  const pending: Promise<void>[] = [];
  for (let l = 0; l < layers; l++) {
    const a = wired.acquire(l, Array.from({ length: perLayer }, (_, e) => e));
    pending.push(a.ready);
    wired.release(l);
  }
  expect(wired.fullyResident()).toBe(false);
  await Promise.all(pending);
  expect(wired.fullyResident()).toBe(true);
  await wired.close();
  await io.close();
});

test("hold: a layer whose records are all in place keeps its slots (never a victim) until evictAll, which bumps its generation", async () => {
  const records = layers * perLayer;
  const pool = lruPool(records - 2);
  const all = Array.from({ length: perLayer }, (_, e) => e);
  expect(pool.hold(0)).toBeNull(); // nothing resident yet
  pool.acquire(0, all.slice(1));
  pool.release(0);
  expect(pool.hold(0)).toBeNull(); // expert 0 missing
  pool.acquire(0, [0]);
  pool.release(0);
  const gen = pool.holdGeneration(0);
  const table = pool.hold(0)!;
  expect(pool.isHeld(0)).toBe(true);
  expect(pool.holdGeneration(0)).toBe(gen + 1);
  expect(pool.hold(0)).toEqual(table); // holding again changes nothing
  expect(pool.holdGeneration(0)).toBe(gen + 1);
  // Cycle every other record through the remaining slots: layer 0's stay where they are.
  for (let round = 0; round < 2; round++)
    for (let l = 1; l < layers; l++) {
      pool.acquire(l, all);
      pool.release(l);
    }
  for (let e = 0; e < perLayer; e++) expect(pool.isResident(0, e)).toBe(true);
  expect(pool.hold(0)).toEqual(table);
  expect(pool.poolStats().evictions).toBeGreaterThan(0); // the others did cycle
  pool.evictAll();
  expect(pool.isHeld(0)).toBe(false);
  expect(pool.holdGeneration(0)).toBe(gen + 2);
  // countHits: the distinct ids of a resident site count as hits of its layer.
  const before = pool.poolStats();
  pool.countHits(2, [3, 3, 1]);
  const after = pool.poolStats();
  expect(after.hits - before.hits).toBe(2);
  expect(after.perLayer.hits[2]! - before.perLayer.hits[2]!).toBe(2);
  await pool.close();
});

test("hold: a record whose read has not landed (or failed) is not in place; a held layer never loses a slot to a miss", async () => {
  const fr = faultyReader();
  const g = gate();
  fr.hold.set(1 * stride, g.promise); // layer 0 expert 1
  const io = new IoScheduler({ reader: fr.reader });
  const pool = createExpertPool({ backing: "wired", model: tiny.model, capacity: perLayer + 2, scheduler: io });
  const all = Array.from({ length: perLayer }, (_, e) => e);
  const a = pool.acquire(0, all);
  pool.release(0);
  expect(pool.hold(0)).toBeNull(); // expert 1 still reading
  g.open();
  await a.ready;
  const table = pool.hold(0)!;
  expect(table).not.toBeNull();
  // Two free slots serve every other layer; layer 0's stay put.
  for (let l = 1; l < layers; l++) {
    const b = pool.acquire(l, [0, 1]);
    await b.ready;
    pool.release(l);
  }
  expect(pool.hold(0)).toEqual(table);
  // With only layer 0's slots left to take, a union of three does not fit (not a silent eviction).
  expect(() => pool.acquire(1, [2, 3, 4])).toThrow(PoolTooSmallError);
  await pool.close();
  await io.close();
});

test("preload: every record of the layers asked, in file order, verified; too few free slots is an error before any read", async () => {
  const fr = faultyReader();
  const io = new IoScheduler({ reader: fr.reader, maxInFlight: 1 });
  const pool = createExpertPool({ backing: "wired", model: tiny.model, capacity: 2 * perLayer, scheduler: io });
  expect(() => pool.preload([0, 1, 2])).toThrow(/preload: .* records of layers 0, 1, 2 are not resident and the pool has .* free slots/);
  expect(fr.started).toEqual([]);
  let landed = 0;
  await pool.preload([2, 0], () => landed++);
  expect(landed).toBe(2 * perLayer);
  // One read at a time: the reads ran through the file in order.
  expect(fr.started).toEqual([...fr.started].sort((a, b) => a - b));
  for (const l of [0, 2]) for (let e = 0; e < perLayer; e++) {
    expect(pool.isResident(l, e)).toBe(true);
    const slot = pool.hold(l)![e]!;
    expect(sameBytes(pool.slotView(slot), tiny.model.readExpertRecord(l, e))).toBe(true);
  }
  expect(pool.poolStats().misses).toBe(0);
  await pool.close();
  await io.close();
});

test("preload fails naming the file, layer and expert: an IO error, a short read, and a read that stalls past the IO deadline", async () => {
  const all = async (setup: (fr: ReturnType<typeof faultyReader>) => void, deadline?: number) => {
    const fr = faultyReader();
    setup(fr);
    const io = new IoScheduler({ reader: fr.reader });
    const pool = createExpertPool({ backing: "wired", model: tiny.model, capacity: layers * perLayer, scheduler: io, ...(deadline ? { ioDeadlineMs: deadline } : {}) });
    const err = await pool.preload([0, 1]).then(() => null, (e: Error) => e);
    return { err, pool, io };
  };
  const eio = await all((fr) => fr.fail.add((perLayer + 2) * stride)); // layer 1 expert 2
  expect(eio.err).toBeInstanceOf(IoReadError);
  expect(eio.err!.message).toContain(tiny.model.paths.experts);
  expect(eio.err!.message).toMatch(/layer 1 expert 2/);
  await eio.pool.close();
  await eio.io.close();
  const short = await all((fr) => fr.short.add(3 * stride));
  expect(short.err).toBeInstanceOf(IoReadError);
  expect(short.err!.message).toMatch(/layer 0 expert 3/);
  await short.pool.close();
  await short.io.close();
  const g = gate();
  const stall = await all((fr) => fr.hold.set((perLayer + 1) * stride, g.promise), 200);
  expect(stall.err).toBeInstanceOf(IoTimeoutError);
  expect(stall.err!.message).toContain(tiny.model.paths.experts);
  expect(stall.err!.message).toMatch(/preload: no expert record arrived within 200 ms.*layer 1 expert 1 /);
  g.open();
  await stall.pool.close();
  await stall.io.close();
});
