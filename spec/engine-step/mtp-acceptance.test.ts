// The engine drafts as the construction of spec/reference/mtp-acceptance.ts predicts: the same
// accepted drafts, position by position, as the reference (tokens equal to greedy are not
// enough: a drafting regression keeps the tokens and only loses speed).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { EngineBackend } from "../../lib/api/engine-backend.ts";
import { AcceptanceWeights, expectedDrafts, writeWeights } from "../reference/mtp-acceptance.ts";
import { openEngine, tempDir } from "./helpers.ts";
import { BACKEND } from "../selected-backend.ts";

const prompt = [17, 200, 5, 91, 33, 140];
const marked = (v: number) => v % 3 === 0;
const tmp = tempDir("acceptance");
let engine: EngineBackend;

beforeAll(async () => {
  await writeWeights(tmp.dir, new AcceptanceWeights(11, marked));
  engine = await openEngine(tmp.dir);
});
afterAll(async () => {
  await engine?.close();
  tmp.remove();
});

describe(`engine MTP drafts at known acceptance rates (${BACKEND} backend)`, () => {
  for (const drafts of [1, 3]) {
    test(`${drafts} draft(s): the predicted tokens and accepts per position`, async () => {
      const V = engine.config.vocab_size;
      const maxTokens = 24;
      const want = expectedDrafts(prompt, maxTokens, drafts, marked, V);
      const seq = engine.newSequence();
      try {
        const first = await seq.forward(prompt);
        let next = first.next[first.next.length - 1]!;
        const tokens = [next];
        const byPosition = new Array<number>(drafts).fill(0);
        const proposedByPosition = new Array<number>(drafts).fill(0);
        while (tokens.length < maxTokens) {
          const k = Math.min(drafts, maxTokens - tokens.length - 1);
          const r = await seq.speculate!(next, k);
          for (let j = 0; j < r.proposed; j++) proposedByPosition[j]! += 1;
          for (let j = 0; j < r.next.length - 1; j++) byPosition[j]! += 1;
          tokens.push(...r.next);
          next = r.next[r.next.length - 1]!;
        }
        expect(tokens).toEqual(want.tokens);
        expect({ byPosition, proposedByPosition }).toEqual({ byPosition: want.byPosition, proposedByPosition: want.proposedByPosition });
      } finally {
        seq.dispose();
      }
    }, 60_000);
  }
});
