// Prefill attention through attn_tiles (lib/gpu/attention.ts): with the row threshold lowered to
// 2 (CHERENKOV_ATTN_TILES_MIN_ROWS), every prompt chunk of a golden model without QSA takes the
// tiled kernel instead of attn_rows, and the engine must still give the golden tokens with its
// logit margins within a quarter of the closest golden step (as the golden suite asks of
// attn_rows), the whole prompt in one chunk and in chunks of 5 (later chunks start at pos0 > 0).
// The goldens' prompts (11 to 19 rows) stay below the default threshold, and the CPU backend
// never takes the tiles by default: without this file no engine step would run them here.
// Models with QSA keep attn_rows (a selection list), so the cases are the two without it.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { ATTN_TILES_MIN_ROWS } from "../../lib/gpu/attention.ts";
import { goldenCases } from "../golden/cases.ts";
import { buildGoldenModel } from "../golden/golden.ts";
import { countDispatches, goldenRecord, greedy, marginError, openEngine } from "./helpers.ts";

const cases = goldenCases.filter((c) => c.name === "tiny-plain-s4" || c.name === "tiny-noqsa-s6");
const dirs = new Map<string, string>();
const saved = process.env.CHERENKOV_ATTN_TILES_MIN_ROWS;

beforeAll(async () => {
  process.env.CHERENKOV_ATTN_TILES_MIN_ROWS = "2";
  for (const c of cases) dirs.set(c.name, await buildGoldenModel(c));
});
afterAll(() => {
  if (saved === undefined) delete process.env.CHERENKOV_ATTN_TILES_MIN_ROWS;
  else process.env.CHERENKOV_ATTN_TILES_MIN_ROWS = saved;
  for (const d of dirs.values()) rmSync(d, { recursive: true, force: true });
});


describe("prefill attention through attn_tiles (CHERENKOV_ATTN_TILES_MIN_ROWS=2)", () => {
  test("the cases have no QSA and prompts shorter than the default threshold (so this file is what covers the tiles)", () => {
    expect(cases.map((c) => c.name).sort()).toEqual(["tiny-noqsa-s6", "tiny-plain-s4"]);
    for (const c of cases) {
      expect(c.features.qsa).toBe(false);
      expect(c.prompt.length).toBeLessThan(ATTN_TILES_MIN_ROWS);
    }
  });

  for (const c of cases) {
    test(`${c.name}: the prompt in one chunk and in chunks of 5 gives the golden tokens through attn_tiles_q8`, async () => {
      const want = await goldenRecord(c.name);
      const minMargin = Math.min(...want.margins);
      for (const chunk of [c.prompt.length, 5]) {
        const backend = await openEngine(dirs.get(c.name)!, { prefillChunk: chunk });
        try {
          let got = { tokens: [] as number[], margins: [] as number[] };
          const seen = await countDispatches(async () => {
            got = await greedy(backend, c.prompt, c.maxTokens);
          });
          expect(seen.get("attn_tiles_q8") ?? 0).toBeGreaterThan(0);
          expect({ chunk, tokens: got.tokens }).toEqual({ chunk, tokens: want.tokens });
          expect(marginError(got.margins, want.margins)).toBeLessThan(minMargin / 4);
        } finally {
          await backend.close();
        }
      }
    }, 120_000);
  }
});
