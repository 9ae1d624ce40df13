// MTP drafting at known acceptance rates (spec/reference/mtp-acceptance.ts): the reference's
// speculative decoding must accept exactly the drafts the construction predicts, position by
// position. Which catch-up row seeds the first draft and which token is fed back to a chained
// row both decide these counts; a regression there cuts acceptance and fails here.
import { describe, expect, test } from "bun:test";
import { generateGreedy, ReferenceModel } from "../../lib/reference/index.ts";
import { AcceptanceWeights, expectedDrafts, sigma } from "./mtp-acceptance.ts";

const prompt = [17, 200, 5, 91, 33, 140];
const everyThird = (v: number) => v % 3 === 0;
const none = () => false;

describe("MTP drafts accepted at known rates", () => {
  for (const [label, marked] of [["no marked token: every draft accepted", none], ["every third token marked", everyThird]] as const) {
    const model = new ReferenceModel(new AcceptanceWeights(11, marked));
    const V = model.config.vocab_size;
    test(`${label}: the trunk is the bigram map sigma`, () => {
      const g = generateGreedy(model, prompt, { maxTokens: 12 });
      let t = prompt[prompt.length - 1]!;
      expect(g.tokens).toEqual(g.tokens.map(() => (t = sigma(t, V))));
      expect(Math.min(...g.margins)).toBeGreaterThan(0.5);
    });
    for (const drafts of [1, 2, 3]) {
      test(`${label}, ${drafts} draft(s): tokens and accepts per position as predicted`, () => {
        const want = expectedDrafts(prompt, 24, drafts, marked, V);
        const g = generateGreedy(model, prompt, { maxTokens: 24, drafts });
        expect(g.tokens).toEqual(want.tokens);
        expect({ byPosition: g.drafts!.byPosition, proposedByPosition: g.drafts!.proposedByPosition }).toEqual({
          byPosition: want.byPosition,
          proposedByPosition: want.proposedByPosition,
        });
        // The construction really exercises what it should.
        expect(want.byPosition[drafts - 1]!).toBeGreaterThan(0);
        if (marked === everyThird) expect(want.byPosition[0]!).toBeLessThan(want.proposedByPosition[0]!);
        else expect(want.byPosition).toEqual(want.proposedByPosition);
      });
    }
  }
});
