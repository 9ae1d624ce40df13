// Every golden sequence (spec/golden) reproduced exactly by the engine on the selected backend (spec/selected-backend.ts),
// with the pool at 100%, 50% and its minimum (one row's top-k: steps of one row), both
// backings, with and without the lookahead. The margins of the golden records say how close
// each step is to a tie; the engine's own margins must agree with them to its kernel error.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import type { EngineOptions } from "../../lib/gpu/load.ts";
import { goldenCases } from "../golden/cases.ts";
import { buildGoldenModel, type GoldenRecord } from "../golden/golden.ts";
import { goldenRecord, greedy, marginError, openEngine } from "./helpers.ts";
import { BACKEND } from "../selected-backend.ts";

export const CONFIGS: [string, EngineOptions][] = [
  ["100% wired lookahead", { pool: "100%", backing: "wired" }],
  ["100% mapped lookahead", { pool: "100%", backing: "mapped" }],
  ["100% wired no-lookahead", { pool: "100%", backing: "wired", lookahead: false }],
  ["100% mapped no-lookahead", { pool: "100%", backing: "mapped", lookahead: false }],
  ["50% wired lookahead", { pool: "50%", backing: "wired" }],
  ["50% mapped lookahead", { pool: "50%", backing: "mapped" }],
  ["50% wired no-lookahead", { pool: "50%", backing: "wired", lookahead: false }],
  ["50% mapped no-lookahead", { pool: "50%", backing: "mapped", lookahead: false }],
  ["min wired lookahead", { poolSlots: 2, backing: "wired" }],
  ["min mapped lookahead", { poolSlots: 2, backing: "mapped" }],
  ["min wired no-lookahead", { poolSlots: 2, backing: "wired", lookahead: false }],
  ["min mapped no-lookahead", { poolSlots: 2, backing: "mapped", lookahead: false }],
];

/** Registers the golden cases [first, end) (split over two files to keep each one short). */
export function goldenSuite(first: number, end: number): void {
  const cases = goldenCases.slice(first, end);
  const dirs = new Map<string, string>();
  const records = new Map<string, GoldenRecord>();
  const worst: string[] = [];

  beforeAll(async () => {
    for (const c of cases) {
      dirs.set(c.name, await buildGoldenModel(c));
      records.set(c.name, await goldenRecord(c.name));
    }
  });
  afterAll(() => {
    for (const d of dirs.values()) rmSync(d, { recursive: true, force: true });
    if (worst.length) console.log(`engine vs golden margins (max |delta| over the configurations):\n  ${worst.join("\n  ")}`);
  });

  describe(`golden sequences on the engine (${BACKEND} backend)`, () => {
    for (const c of cases) {
      test(c.name, async () => {
        const want = records.get(c.name)!;
        expect(want.prompt).toEqual(c.prompt);
        // The minimum pool is one row's top-k: the model's own, so that the test follows the preset.
        const minMargin = Math.min(...want.margins);
        let caseWorst = 0;
        for (const [label, opts] of CONFIGS) {
          const backend = await openEngine(dirs.get(c.name)!, opts);
          try {
            const got = await greedy(backend, c.prompt, c.maxTokens);
            expect({ config: label, tokens: got.tokens }).toEqual({ config: label, tokens: want.tokens });
            const err = marginError(got.margins, want.margins);
            caseWorst = Math.max(caseWorst, err);
            // The engine's logits agree with the reference's far below the closest golden step.
            expect(err).toBeLessThan(minMargin / 4);
            const pool = (backend.stats() as { pool: { capacity: number; misses: number; hits: number } }).pool;
            expect(pool.hits + pool.misses).toBeGreaterThan(0);
            if (opts.poolSlots !== undefined) expect(pool.capacity).toBe(backend.config.moe.top_k);
          } finally {
            await backend.close();
          }
        }
        worst.push(`${c.name}: ${caseWorst.toExponential(2)} (smallest golden margin ${minMargin.toExponential(2)})`);
      }, 60_000);
    }
  });
}
