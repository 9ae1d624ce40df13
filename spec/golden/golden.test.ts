import { describe, expect, test } from "bun:test";
import { goldenCases } from "./cases.ts";
import { goldenPath, runGolden, type GoldenRecord } from "./golden.ts";

describe("golden sequences: the reference reproduces spec/golden", () => {
  for (const c of goldenCases) {
    test(c.name, async () => {
      const want = (await Bun.file(goldenPath(c.name)).json()) as GoldenRecord;
      expect(want.prompt).toEqual(c.prompt);
      const got = await runGolden(c);
      expect(got.tokens).toEqual(want.tokens);
      // margins are diagnostics, but they must come out the same on the same code
      for (let i = 0; i < want.margins.length; i++) expect(got.margins[i]!).toBeCloseTo(want.margins[i]!, 5);
    });
  }
  test("the cases are distinct models with distinct outputs", async () => {
    const seqs = await Promise.all(goldenCases.map(async (c) => JSON.stringify(((await Bun.file(goldenPath(c.name)).json()) as GoldenRecord).tokens)));
    expect(new Set(seqs).size).toBe(seqs.length);
  });
});
