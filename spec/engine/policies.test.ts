// The policy simulators behind bench:pool (spec/bench/policies.ts): Belady's MIN is checked
// against an exhaustive search on small sequences, LRU against a hand-worked sequence, and
// the perfect lookahead against what it must achieve when the pool has room.
import { expect, test } from "bun:test";
import { join } from "node:path";
import { readTrace } from "../../lib/gpu/trace.ts";
import { accessesOf, largestUnion, simulateBelady, simulateLayerCyclic, simulateLru, type Access } from "../bench/policies.ts";
import type { TraceStep } from "../../lib/gpu/trace.ts";

const shape = { layers: 1, perLayer: 8 };
/** One step per id, all on layer 0. */
const single = (ids: number[]): Access[][] => ids.map((e) => [{ layer: 0, ids: [e] }]);

/** The fewest misses any eviction choices can reach (single-id accesses), by exhaustive search. */
function optimalMisses(ids: number[], capacity: number): number {
  const go = (t: number, resident: number[]): number => {
    if (t === ids.length) return 0;
    const e = ids[t]!;
    if (resident.includes(e)) return go(t + 1, resident);
    if (resident.length < capacity) return 1 + go(t + 1, [...resident, e]);
    let best = Infinity;
    for (let v = 0; v < resident.length; v++) best = Math.min(best, go(t + 1, resident.map((x, i) => (i === v ? e : x))));
    return 1 + best;
  };
  return go(0, []);
}

test("LRU and Belady on the classic cyclic sequence", async () => {
  const seq = single([0, 1, 2, 0, 1, 2]);
  const lru = await simulateLru(seq, shape, 2);
  expect([lru.hits, lru.misses]).toEqual([0, 6]); // LRU always evicts the one needed next
  const opt = simulateBelady(seq, shape, 2);
  expect([opt.hits, opt.misses]).toEqual([2, 4]);
  expect(opt.hitRate).toBeCloseTo(2 / 6, 12);
});

test("Belady reaches the exhaustive optimum on random short sequences", () => {
  let x = 12345;
  const rand = (n: number) => ((x = (Math.imul(x, 1664525) + 1013904223) >>> 0) >>> 8) % n;
  for (let trial = 0; trial < 40; trial++) {
    const ids = Array.from({ length: 10 }, () => rand(5));
    const capacity = 2 + (trial % 2);
    expect(simulateBelady(single(ids), shape, capacity).misses).toBe(optimalMisses(ids, capacity));
  }
});

test("Belady never misses more than LRU, and never evicts a record the current access uses", async () => {
  let x = 99;
  const rand = (n: number) => ((x = (Math.imul(x, 1664525) + 1013904223) >>> 0) >>> 8) % n;
  const steps: Access[][] = Array.from({ length: 200 }, () =>
    Array.from({ length: 4 }, (_, layer) => ({ layer, ids: [...new Set([rand(8), rand(8), rand(8)])] })),
  );
  const shape4 = { layers: 4, perLayer: 8 };
  for (const cap of [3, 6, 12, 24, 32]) {
    const opt = simulateBelady(steps, shape4, cap);
    const lru = await simulateLru(steps, shape4, cap);
    expect(opt.demanded).toBe(lru.demanded);
    expect(opt.misses).toBeLessThanOrEqual(lru.misses);
    if (cap === 32) {
      // Room for every record: only first uses miss, whatever the policy.
      const distinct = new Set(steps.flat().flatMap((a) => a.ids.map((e) => a.layer * 8 + e))).size;
      expect([opt.misses, lru.misses]).toEqual([distinct, distinct]);
    }
  }
  expect(() => simulateBelady(steps, shape4, 2)).toThrow(/needs 3 records, the pool has 2/);
});

test("a perfect one-layer lookahead turns every later layer of a step into a hit when the pool has room", async () => {
  const steps: Access[][] = [
    [{ layer: 0, ids: [0, 1] }, { layer: 1, ids: [2, 3] }, { layer: 2, ids: [4] }],
    [{ layer: 0, ids: [5] }, { layer: 1, ids: [6, 7] }, { layer: 2, ids: [0, 1] }],
  ];
  const s = { layers: 3, perLayer: 8 };
  const la = await simulateLru(steps, s, 24, "perfect");
  // Only layer 0 of each step is unpredicted: 3 misses, 7 hits, 10 records read.
  expect([la.hits, la.misses, la.reads, la.wasted]).toEqual([7, 3, 10, 0]);
  const lru = await simulateLru(steps, s, 24);
  expect([lru.hits, lru.misses, lru.reads]).toEqual([0, 10, 10]);
});

test("a recorded prediction is used as given: right ones are used, wrong ones wasted", async () => {
  const trace: TraceStep[] = [
    {
      tokens: [1],
      experts: [[[0, 1]], [[2, 3]]],
      weights: [[[0.5, 0.5]], [[0.5, 0.5]]],
      misses: [],
      predicted: [[], [2, 6]],
    },
    { tokens: [2], experts: [[[4, 5, 7]], [[0]]], weights: [[[0.4, 0.3, 0.3]], [[1]]], misses: [] },
  ];
  const steps = accessesOf(trace);
  expect(steps[0]![1]).toEqual({ layer: 1, ids: [2, 3], predicted: [2, 6] });
  expect(largestUnion(steps)).toBe(3);
  const r = await simulateLru(steps, { layers: 2, perLayer: 8 }, 4, "trace");
  // Step 1: (1,2) predicted and used, (1,6) predicted and never used. Step 2 needs three
  // slots and pushes out (0,1), the unused (1,6) and (1,2): one wasted prediction.
  expect([r.hits, r.misses, r.reads, r.wasted]).toEqual([1, 7, 9, 1]);
});

test("layer-cyclic beats LRU on a cyclic trace whose working set is larger than the pool", async () => {
  // 6 layers x 8 experts, each token routes expert 5 and one of 1 or 3 (alternating) per layer:
  // 12 records a token, visited 0..5 every token. With 8 slots LRU always evicts the layer needed next.
  const s = { layers: 6, perLayer: 8 };
  const steps: Access[][] = Array.from({ length: 50 }, (_, t) =>
    Array.from({ length: s.layers }, (_, layer) => ({ layer, ids: [(layer + t) % 2 === 0 ? 1 : 3, 5] })),
  );
  const lru = await simulateLru(steps, s, 8);
  const lc = await simulateLayerCyclic(steps, s, 8);
  const opt = simulateBelady(steps, s, 8);
  expect(lru.hitRate).toBe(0);
  expect(lc.policy).toBe("layer-cyclic");
  expect(lc.hitRate).toBeGreaterThan(0.25);
  expect(lc.hits).toBeLessThanOrEqual(opt.hits);
  expect(lc.reads).toBeLessThan(lru.reads);
  // With room for every record the trace touches (18), both only miss each record once.
  for (const r of [await simulateLru(steps, s, 18), await simulateLayerCyclic(steps, s, 18)]) expect(r.misses).toBe(18);
});

test("reuse beats layer-cyclic and LRU on the committed 64-expert traces at 25% and 50% pools, with and without lookahead", async () => {
  for (const name of ["qwen4-exp-64x8", "qwen3-next-64x8"]) {
    const steps = accessesOf(readTrace(join(import.meta.dir, "..", "train", "traces", `${name}.json.gz`)));
    const s = { layers: 8, perLayer: 64 };
    for (const slots of [128, 256]) {
      for (const la of ["none", "trace"] as const) {
        const others = [await simulateLru(steps, s, slots, la, "layer-cyclic"), ...(la === "none" ? [await simulateLru(steps, s, slots, la, "lru")] : [])];
        const reuse = await simulateLru(steps, s, slots, la, "reuse");
        const what = `${name} ${slots} slots lookahead ${la}`;
        expect({ what, better: others.every((o) => reuse.hitRate > o.hitRate) }).toEqual({ what, better: true });
        expect({ what, fewer: others.every((o) => reuse.reads < o.reads) }).toEqual({ what, fewer: true });
      }
    }
  }
}, 120_000);
