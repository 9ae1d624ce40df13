// Prefill in chunks: chunk sizes 1, 7 and the whole prompt give the same tokens (those of the
// golden record), and a session that appends its prompt in pieces matches one that appends it
// whole; each chunk is one step (one handshake per layer per chunk).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { Model } from "../../lib/api/model.ts";
import { goldenCases } from "../golden/cases.ts";
import { buildGoldenModel } from "../golden/golden.ts";
import { goldenRecord, greedy, openEngine } from "./helpers.ts";
import { BACKEND } from "../selected-backend.ts";

const cases = goldenCases.filter((c) => c.name === "tiny-all-s1" || c.name === "tiny-n1-s5");
const dirs = new Map<string, string>();

beforeAll(async () => {
  for (const c of cases) dirs.set(c.name, await buildGoldenModel(c));
});
afterAll(() => {
  for (const d of dirs.values()) rmSync(d, { recursive: true, force: true });
});

describe("prefill chunks", () => {
  for (const c of cases) {
    test(`${c.name}: chunks of 1, 7 and the whole prompt give the golden tokens`, async () => {
      const want = await goldenRecord(c.name);
      for (const chunk of [1, 7, c.prompt.length]) {
        const backend = await openEngine(dirs.get(c.name)!, { prefillChunk: chunk });
        try {
          const got = await greedy(backend, c.prompt, 12);
          expect({ chunk, tokens: got.tokens }).toEqual({ chunk, tokens: want.tokens.slice(0, 12) });
          // One step per chunk plus one per decoded token: the handshake count tells.
          const steps = Math.ceil(c.prompt.length / chunk) + 11;
          const stats = backend.stats();
          expect(stats.phases.step?.count).toBe(steps);
          expect(stats.setup.prefillRows).toBe(chunk);
        } finally {
          await backend.close();
        }
      }
    });
  }

  test("a session appending its prompt in pieces equals one appending it whole", async () => {
    const c = cases[0]!;
    const want = await goldenRecord(c.name);
    const model = await Model.load(dirs.get(c.name)!, { backend: BACKEND, prefillChunk: 5 });
    try {
      const s = model.session();
      await s.append(c.prompt.slice(0, 3));
      await s.append(c.prompt.slice(3, 11));
      await s.append(c.prompt.slice(11));
      const r = await s.generate({ maxTokens: 8, stopAtEos: false });
      expect(r.tokens).toEqual(want.tokens.slice(0, 8));
      s.close();
    } finally {
      await model.close();
    }
  });
});
