// The trained example models on the engine: the same greedy tokens as the reference, and
// speculative decoding with 1..3 MTP drafts gives exactly the greedy tokens while the drafts
// really get accepted (the trained MTP head), proposing what the reference's head proposes.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { Model } from "../../lib/api/model.ts";
import { BACKEND } from "../selected-backend.ts";

const MODELS = join(import.meta.dir, "..", "..", "examples", "models");
const PROMPT = "The cat sat on the mat. The dog";
const N = 16;

describe("qwen4-exp-tiny (every feature on)", () => {
  let engine: Model;
  let reference: Model;
  let greedy: number[];
  beforeAll(async () => {
    engine = await Model.load(join(MODELS, "qwen4-exp-tiny"), { backend: BACKEND });
    reference = await Model.load(join(MODELS, "qwen4-exp-tiny"), { backend: "reference" });
    greedy = (await reference.generate(PROMPT, { maxTokens: N, stopAtEos: false })).tokens;
  });
  afterAll(async () => {
    await engine.close();
    await reference.close();
  });

  test("greedy tokens equal the reference's", async () => {
    const r = await engine.generate(PROMPT, { maxTokens: N, stopAtEos: false });
    expect(r.tokens).toEqual(greedy);
    expect(engine.backendName).toBe(BACKEND);
  });

  test.each([1, 2, 3])("speculative with %i drafts = greedy, drafts accepted as the reference accepts them", async (drafts) => {
    const r = await engine.generate(PROMPT, { maxTokens: N, stopAtEos: false, drafts });
    expect(r.tokens).toEqual(greedy);
    expect(r.drafts!.accepted).toBeGreaterThan(0);
    const ref = await reference.generate(PROMPT, { maxTokens: N, stopAtEos: false, drafts });
    expect(r.drafts).toEqual(ref.drafts!);
  });

  test("rolled-back verify rows are counted in the activity", async () => {
    const stats = engine.stats().engine as { activity: { rolledBackRows: number; rows: number[] } };
    expect(stats.activity.rolledBackRows).toBeGreaterThan(0);
    // The MTP head's expert layer (the last) saw rows too.
    expect(stats.activity.rows[stats.activity.rows.length - 1]!).toBeGreaterThan(0);
  });
});

test("qwen3-next-tiny (converted layout, n = 1, no PLE/QSA): greedy tokens equal the reference's", async () => {
  const dir = join(MODELS, "qwen3-next-tiny");
  const engine = await Model.load(dir, { backend: BACKEND });
  const reference = await Model.load(dir, { backend: "reference" });
  try {
    const a = await engine.generate(PROMPT, { maxTokens: N, stopAtEos: false });
    const b = await reference.generate(PROMPT, { maxTokens: N, stopAtEos: false });
    expect(a.tokens).toEqual(b.tokens);
  } finally {
    await engine.close();
    await reference.close();
  }
});
