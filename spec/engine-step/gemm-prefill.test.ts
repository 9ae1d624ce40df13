// Prefill through the tiled GEMM (lib/gpu/gemm.ts): with the row threshold lowered to 2
// (CHERENKOV_GEMM_MIN_ROWS), every prompt row and every verify batch of the golden models takes
// gemm_q4_f32 instead of the matvec, and the engine must still reproduce the golden tokens,
// its logit margins within a quarter of the closest golden step (as spec/engine-step's golden
// suite asks of the matvec path), and prefill in one chunk must equal token by token.
// The CPU backend never takes the GEMM by default (gemmMinRows): without this file nothing
// would send an engine step through it there.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { gemmMinRows } from "../../lib/gpu/gemm.ts";
import { goldenCases } from "../golden/cases.ts";
import { buildGoldenModel } from "../golden/golden.ts";
import { goldenRecord, greedy, marginError, openEngine } from "./helpers.ts";

// The cases whose margins came closest to the GEMM's error when this was written (tiny-plain-s4:
// smallest golden margin 3.96e-3, GEMM margin error 5.7e-4; tiny-all-s1 has every feature).
const cases = goldenCases.filter((c) => c.name === "tiny-all-s1" || c.name === "tiny-plain-s4");
const dirs = new Map<string, string>();
const saved = process.env.CHERENKOV_GEMM_MIN_ROWS;

beforeAll(async () => {
  process.env.CHERENKOV_GEMM_MIN_ROWS = "2";
  for (const c of cases) dirs.set(c.name, await buildGoldenModel(c));
});
afterAll(() => {
  if (saved === undefined) delete process.env.CHERENKOV_GEMM_MIN_ROWS;
  else process.env.CHERENKOV_GEMM_MIN_ROWS = saved;
  for (const d of dirs.values()) rmSync(d, { recursive: true, force: true });
});

describe("prefill through the GEMM (CHERENKOV_GEMM_MIN_ROWS=2)", () => {
  test("every golden prompt reaches the lowered threshold (so each one-chunk prefill takes the GEMM)", () => {
    expect(gemmMinRows("cpu")).toBe(2);
    for (const c of cases) expect(c.prompt.length).toBeGreaterThanOrEqual(2);
  });

  for (const c of cases) {
    test(`${c.name}: the whole prompt in one chunk and token by token give the golden tokens`, async () => {
      const want = await goldenRecord(c.name);
      const minMargin = Math.min(...want.margins);
      for (const chunk of [c.prompt.length, 1]) {
        const backend = await openEngine(dirs.get(c.name)!, { prefillChunk: chunk });
        try {
          const got = await greedy(backend, c.prompt, c.maxTokens);
          expect({ chunk, tokens: got.tokens }).toEqual({ chunk, tokens: want.tokens });
          expect(marginError(got.margins, want.margins)).toBeLessThan(minMargin / 4);
        } finally {
          await backend.close();
        }
      }
    }, 120_000);
  }
});
