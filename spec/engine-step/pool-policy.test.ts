// The reuse pool policy (the default), layer-cyclic and LRU, named explicitly, reproduce a golden
// sequence at the minimum pool (one row's top-k) and a little above it (where victims are
// chosen every layer); an unknown policy fails at load.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import type { EngineOptions } from "../../lib/gpu/load.ts";
import { goldenCases } from "../golden/cases.ts";
import { buildGoldenModel, type GoldenRecord } from "../golden/golden.ts";
import { goldenRecord, greedy, openEngine } from "./helpers.ts";

const c = goldenCases[0]!;
let dir: string;
let want: GoldenRecord;
beforeAll(async () => {
  dir = await buildGoldenModel(c);
  want = await goldenRecord(c.name);
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test(`${c.name} on the engine with poolPolicy reuse, layer-cyclic and lru, minimum pool and just above`, async () => {
  const probe = await openEngine(dir, { pool: "100%" });
  const topK = probe.config.moe.top_k;
  await probe.close();
  const configs: [string, EngineOptions][] = [
    ["min wired layer-cyclic", { poolSlots: topK, backing: "wired", poolPolicy: "layer-cyclic" }],
    ["min mapped layer-cyclic no-lookahead", { poolSlots: topK, backing: "mapped", poolPolicy: "layer-cyclic", lookahead: false }],
    ["3 x top-k wired layer-cyclic", { poolSlots: 3 * topK, backing: "wired", poolPolicy: "layer-cyclic" }],
    ["3 x top-k wired lru", { poolSlots: 3 * topK, backing: "wired", poolPolicy: "lru" }],
    ["min wired reuse", { poolSlots: topK, backing: "wired", poolPolicy: "reuse" }],
    ["3 x top-k wired reuse", { poolSlots: 3 * topK, backing: "wired", poolPolicy: "reuse" }],
    ["3 x top-k mapped default", { poolSlots: 3 * topK, backing: "mapped" }],
  ];
  for (const [label, opts] of configs) {
    const backend = await openEngine(dir, opts);
    try {
      const got = await greedy(backend, c.prompt, c.maxTokens);
      expect({ config: label, tokens: got.tokens }).toEqual({ config: label, tokens: want.tokens });
      const pool = (backend.stats() as { pool: { capacity: number; evictions: number } }).pool;
      expect(pool.capacity).toBe(opts.poolSlots!);
      expect(pool.evictions).toBeGreaterThan(0);
    } finally {
      await backend.close();
    }
  }
  await expect(openEngine(dir, { poolPolicy: "mru" as never })).rejects.toThrow(/poolPolicy: "mru" must be "lru" or "layer-cyclic" or "reuse"/);
}, 60_000);
