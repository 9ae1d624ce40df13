/**
 * Expert-pool policies replayed on routing traces (bench:pool):
 *  - "lru": the engine's own pool (lib/gpu/residency.ts, mapped backing without a device:
 *    decisions only, no IO), acquire/release per layer of each step;
 *  - "layer-cyclic": the same pool with policy "layer-cyclic" (the victim is in the layer whose
 *    next visit in the cyclic layer order is farthest away, least recently used within it);
 *  - "lru+lookahead": the same, plus prefetch(l + 1, predicted) before layer l is released,
 *    with a predictor: "perfect" (the trace's own next-layer union) or "trace" (the
 *    `predicted` field a recorded trace carries);
 *  - "belady": the offline optimum (MIN): on a miss with the pool full, evict the record
 *    whose next use is farthest away, never one the current layer uses.
 * Hit rate = demanded experts found resident / demanded experts, where a step's demand at a
 * layer is the union of its rows' routed experts. `reads` counts every record read (misses
 * plus prefetches), the number disk bandwidth pays for.
 */
import { createExpertPool, type PoolPolicy } from "../../lib/gpu/residency.ts";
import type { TraceStep } from "../../lib/gpu/trace.ts";

/** One layer of one step: the union its rows route to, and the prediction made for it. */
export interface Access {
  layer: number;
  ids: number[];
  predicted?: number[];
}

export interface SimResult {
  policy: string;
  capacity: number;
  demanded: number;
  hits: number;
  misses: number;
  /** Records read: misses plus prefetches. */
  reads: number;
  hitRate: number;
  /** Lookahead only: prefetched records never used before eviction. */
  wasted?: number;
}

/** The accesses of a trace, step by step and layer by layer (unions in first-seen order). */
export function accessesOf(trace: TraceStep[]): Access[][] {
  return trace.map((step) =>
    step.experts.map((rows, layer) => {
      const ids = [...new Set(rows.flat())];
      const a: Access = { layer, ids };
      const p = step.predicted?.[layer];
      if (p) a.predicted = [...new Set(p)];
      return a;
    }),
  );
}

/** The largest union of any access: the smallest pool that can replay the trace. */
export function largestUnion(steps: Access[][]): number {
  let m = 0;
  for (const s of steps) for (const a of s) m = Math.max(m, a.ids.length);
  return m;
}

/** A layout-only expert source: the mapped pool without a device never opens the file. */
function layoutOnly(layers: number, perLayer: number) {
  return { paths: { experts: "(simulation: no file)" }, expertLayout: { stride: 1, layers, perLayer } };
}

/**
 * The engine's ExpertPool replayed (policy "lru" by default, or "layer-cyclic"), optionally
 * with one-layer lookahead.
 */
export async function simulateLru(
  steps: Access[][],
  shape: { layers: number; perLayer: number },
  capacity: number,
  lookahead: "none" | "perfect" | "trace" = "none",
  policy: PoolPolicy = "lru",
): Promise<SimResult> {
  const pool = createExpertPool({ backing: "mapped", model: layoutOnly(shape.layers, shape.perLayer), capacity, policy });
  for (const step of steps) {
    for (let i = 0; i < step.length; i++) {
      const a = step[i]!;
      pool.acquire(a.layer, a.ids);
      const next = step[i + 1];
      if (next && lookahead !== "none") {
        const predicted = lookahead === "perfect" ? next.ids : next.predicted;
        if (predicted?.length) pool.prefetch(next.layer, predicted);
      }
      pool.release(a.layer);
    }
  }
  const p = pool.poolStats();
  const la = pool.lookaheadStats();
  await pool.close();
  const demanded = p.hits + p.misses;
  const name = lookahead === "none" ? policy : `${policy}+lookahead(${lookahead})`;
  const out: SimResult = { policy: name, capacity, demanded, hits: p.hits, misses: p.misses, reads: p.misses + la.predictions, hitRate: demanded ? p.hits / demanded : 0 };
  if (lookahead !== "none") out.wasted = la.wasted;
  return out;
}

/** A max-heap of [priority, key] with lazy deletion (stale entries are skipped by the caller). */
class MaxHeap {
  private readonly pri: number[] = [];
  private readonly key: number[] = [];
  get size(): number {
    return this.pri.length;
  }
  push(p: number, k: number): void {
    let i = this.pri.length;
    this.pri.push(p);
    this.key.push(k);
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (this.pri[parent]! >= p) break;
      this.pri[i] = this.pri[parent]!;
      this.key[i] = this.key[parent]!;
      i = parent;
    }
    this.pri[i] = p;
    this.key[i] = k;
  }
  pop(): [number, number] {
    const top: [number, number] = [this.pri[0]!, this.key[0]!];
    const p = this.pri.pop()!;
    const k = this.key.pop()!;
    const n = this.pri.length;
    if (n > 0) {
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        if (l >= n) break;
        const r = l + 1;
        const c = r < n && this.pri[r]! > this.pri[l]! ? r : l;
        if (this.pri[c]! <= p) break;
        this.pri[i] = this.pri[c]!;
        this.key[i] = this.key[c]!;
        i = c;
      }
      this.pri[i] = p;
      this.key[i] = k;
    }
    return top;
  }
}

/** The layer-cyclic pool (farthest layer in the cyclic order first, LRU within it), optionally with lookahead. */
export function simulateLayerCyclic(
  steps: Access[][],
  shape: { layers: number; perLayer: number },
  capacity: number,
  lookahead: "none" | "perfect" | "trace" = "none",
): Promise<SimResult> {
  return simulateLru(steps, shape, capacity, lookahead, "layer-cyclic");
}

/** Belady's MIN over the flattened access sequence. */
export function simulateBelady(steps: Access[][], shape: { layers: number; perLayer: number }, capacity: number): SimResult {
  const seq = steps.flat();
  const keysOf = seq.map((a) => a.ids.map((e) => a.layer * shape.perLayer + e));
  // nextUse[t][i]: the next access index (after t) that uses keysOf[t][i]; Infinity if none.
  const nextUse: number[][] = new Array(seq.length);
  const last = new Map<number, number>();
  for (let t = seq.length - 1; t >= 0; t--) {
    nextUse[t] = keysOf[t]!.map((k) => last.get(k) ?? Infinity);
    for (const k of keysOf[t]!) last.set(k, t);
  }
  const resident = new Map<number, number>(); // key -> its next use
  const heap = new MaxHeap();
  let hits = 0;
  let misses = 0;
  for (let t = 0; t < seq.length; t++) {
    const keys = keysOf[t]!;
    if (keys.length > capacity) throw new Error(`belady: access ${t} needs ${keys.length} records, the pool has ${capacity}`);
    const current = new Set(keys);
    const missing: number[] = [];
    for (const k of keys) {
      if (resident.has(k)) hits++;
      else missing.push(k);
    }
    misses += missing.length;
    // Make room: evict the farthest next use among records this access does not use.
    for (let over = resident.size + missing.length - capacity; over > 0; over--) {
      const held: [number, number][] = [];
      for (;;) {
        const [p, k] = heap.pop();
        if (resident.get(k) !== p) continue; // stale entry
        if (current.has(k)) {
          held.push([p, k]);
          continue;
        }
        resident.delete(k);
        break;
      }
      for (const [p, k] of held) heap.push(p, k);
    }
    // Every key of this access is resident now, until its next use.
    keys.forEach((k, i) => {
      const nu = nextUse[t]![i]!;
      resident.set(k, nu);
      heap.push(nu, k);
    });
  }
  const demanded = hits + misses;
  return { policy: "belady", capacity, demanded, hits, misses, reads: misses, hitRate: demanded ? hits / demanded : 0 };
}
