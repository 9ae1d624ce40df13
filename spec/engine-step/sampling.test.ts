// Sampling end to end on the trained example model (every feature, an MTP head): the engine
// (on the selected backend, spec/selected-backend.ts; the sampling kernel over the logits on the device) draws the same tokens as
// the reference backend for the same seed, plain and with speculative drafts (rejection
// sampling, the same accept/reject decisions), with filters, penalties and logprobs.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { Model } from "../../lib/api/model.ts";
import type { GenerateOptions } from "../../lib/api/model.ts";
import { BACKEND } from "../selected-backend.ts";

const DIR = join(import.meta.dir, "..", "..", "examples", "models", "qwen4-exp-tiny");
const PROMPT = "The cat sat on the mat. The dog";
const N = 10;

let engine: Model;
let reference: Model;
beforeAll(async () => {
  engine = await Model.load(DIR, { backend: BACKEND });
  reference = await Model.load(DIR, { backend: "reference" });
});
afterAll(async () => {
  await engine.close();
  await reference.close();
});

const run = (m: Model, o: GenerateOptions) => m.generate(PROMPT, { maxTokens: N, stopAtEos: false, ...o });

describe("sampling on the engine = the reference, token for token", () => {
  test("seeded: the same seed gives the same tokens on both backends and twice on one; another seed other tokens", async () => {
    const o = { temperature: 0.9, topP: 0.95, seed: 42 };
    const a = await run(engine, o);
    expect(a.tokens).toEqual((await run(reference, o)).tokens);
    expect((await run(engine, o)).tokens).toEqual(a.tokens);
    expect((await run(engine, { ...o, seed: 43 })).tokens).not.toEqual(a.tokens);
    // Not the greedy continuation.
    expect(a.tokens).not.toEqual((await run(engine, {})).tokens);
  });

  test("speculative sampling (3 drafts): the same tokens and the same accept/reject decisions as the reference", async () => {
    const o: GenerateOptions = { temperature: 0.6, topK: 40, minP: 0.02, repetitionPenalty: 1.1, frequencyPenalty: 0.2, seed: 5, drafts: 3 };
    const [a, b] = [await run(engine, o), await run(reference, o)];
    expect(a.tokens).toEqual(b.tokens);
    expect(a.drafts).toEqual(b.drafts!);
    expect(a.drafts!.proposed).toBeGreaterThan(0);
  });

  test("logprobs: the drawn tokens' and the top alternatives' equal the reference's (log_softmax of the raw logits)", async () => {
    const o: GenerateOptions = { temperature: 0.8, seed: 9, logprobs: true, topLogprobs: 3, drafts: 2 };
    const [a, b] = [await run(engine, o), await run(reference, o)];
    expect(a.tokens).toEqual(b.tokens);
    expect(a.logprobs!.length).toBe(N);
    a.logprobs!.forEach((e, i) => {
      const r = b.logprobs![i]!;
      expect(e.id).toBe(a.tokens[i]!);
      // The engine's logits differ from the reference's by kernel rounding (about 1e-4 here).
      expect(Math.abs(e.logprob - r.logprob)).toBeLessThan(1e-3);
      expect(e.top.map((t) => t.id)).toEqual(r.top.map((t) => t.id));
      e.top.forEach((t, k) => expect(Math.abs(t.logprob - r.top[k]!.logprob)).toBeLessThan(1e-3));
      expect(e.logprob).toBeLessThanOrEqual(e.top[0]!.logprob + 1e-6);
    });
  });

  test("a session that appended its prompt samples from that row's logits: the tokens of generate()", async () => {
    const o: GenerateOptions = { temperature: 1, seed: 3 };
    const s = engine.session();
    await s.append(PROMPT);
    const a = await s.generate({ maxTokens: 4, stopAtEos: false, ...o });
    s.close();
    expect(a.tokens).toEqual((await engine.generate(PROMPT, { maxTokens: 4, stopAtEos: false, ...o })).tokens);
  });

  test("greedy with a presence penalty of 100 never repeats a generated token (both backends)", async () => {
    const o: GenerateOptions = { presencePenalty: 100, drafts: 2 };
    const a = await run(engine, o);
    expect(new Set(a.tokens).size).toBe(a.tokens.length);
    expect(a.tokens).toEqual((await run(reference, o)).tokens);
  });
});
