/**
 * The host's part of a MoE site in the expert pool: acquire (victims for the misses), prefetch
 * of the next layer's predicted experts, the slot table, release, timed per site for each
 * policy, on a 30b-a3b-shaped pool (48 layers x 128 experts, top-8) at 50% and 25%, uniform
 * routing (the worst case for reuse: every layer's records look alike), no IO (mapped, no
 * file). This is the handshake's host work that the H200 bench showed growing with misses.
 *
 *   bun spec/bench/pool-host.ts [--layers 48] [--experts 128] [--top-k 8] [--steps 40]
 */
import { parseArgs } from "node:util";
import { createExpertPool, POOL_POLICIES, type ExpertPoolOptions } from "../../lib/gpu/residency.ts";

const { values: o } = parseArgs({
  options: { layers: { type: "string", default: "48" }, experts: { type: "string", default: "128" }, "top-k": { type: "string", default: "8" }, steps: { type: "string", default: "40" } },
});
const [L, E, K, steps] = [Number(o.layers), Number(o.experts), Number(o["top-k"]), Number(o.steps)];
const model = { paths: { experts: "(simulation: no file)" }, expertLayout: { stride: 1, layers: L, perLayer: E } } as unknown as ExpertPoolOptions["model"];

console.log(`pool host work per site: ${L} layers x ${E} experts, top-${K}, lookahead prefetch of the next layer\n`);
console.log("| policy | pool | p50 us | mean us | hit rate |");
console.log("| --- | --- | ---: | ---: | ---: |");
for (const fraction of [0.5, 0.25])
  for (const policy of POOL_POLICIES) {
    const pool = createExpertPool({ backing: "mapped", model, capacity: Math.round(L * E * fraction), policy });
    let seed = 1;
    const rand = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32;
    const pick = () => {
      const s = new Set<number>();
      while (s.size < K) s.add(Math.floor(rand() * E));
      return [...s];
    };
    const table = new Int32Array(pool.slotTableStride);
    const times: number[] = [];
    let next = pick();
    for (let t = 0; t < steps; t++)
      for (let l = 0; l < L; l++) {
        const ids = next;
        next = pick();
        const t0 = performance.now();
        pool.acquire(l, ids);
        if (l + 1 < L) pool.prefetch(l + 1, next);
        pool.writeSlotTable(l, table);
        pool.release(l);
        times.push(performance.now() - t0);
      }
    times.sort((a, b) => a - b);
    const st = pool.poolStats();
    const mean = times.reduce((a, b) => a + b, 0) / times.length;
    console.log(`| ${policy} | ${fraction * 100}% | ${(1000 * times[times.length >> 1]!).toFixed(1)} | ${(1000 * mean).toFixed(1)} | ${(st.hits / (st.hits + st.misses)).toFixed(3)} |`);
    await pool.close();
  }
