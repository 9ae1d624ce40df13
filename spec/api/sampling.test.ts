// Sampling through the public API (reference backend): options, seeds, logprobs on results
// and stream chunks, sessions, and greedy staying the default.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Model, synthesize } from "../../lib/index.ts";

let dir: string;
let model: Model;
const prompt = [72, 101, 108, 108, 111, 44, 32, 119]; // "Hello, w"
const base = { maxTokens: 8, stopAtEos: false };

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "cherenkov-sampling-"));
  await synthesize({ preset: "tiny", seed: 11, out: dir, weights: "q4", workers: 0 });
  model = await Model.load(dir, { backend: "reference" });
});
afterAll(async () => {
  await model.close();
  rmSync(dir, { recursive: true, force: true });
});

describe("sampling options", () => {
  test("greedy stays the default: temperature 0 (with a seed) gives the plain greedy tokens", async () => {
    const greedy = await model.generate(prompt, base);
    expect((await model.generate(prompt, { ...base, temperature: 0, seed: 3 })).tokens).toEqual(greedy.tokens);
    expect(greedy.logprobs).toBeUndefined();
  });

  test("a seed reproduces the tokens (with and without drafts differ only by the draws, each reproducible)", async () => {
    const o = { ...base, temperature: 1.2, topK: 50, seed: 1234 };
    const a = await model.generate(prompt, o);
    expect((await model.generate(prompt, o)).tokens).toEqual(a.tokens);
    expect((await model.generate(prompt, { ...o, seed: 1235 })).tokens).not.toEqual(a.tokens);
    const d = await model.generate(prompt, { ...o, drafts: 2 });
    expect((await model.generate(prompt, { ...o, drafts: 2 })).tokens).toEqual(d.tokens);
    expect(d.drafts!.proposed).toBeGreaterThan(0);
  });

  test("stream chunks carry each token's logprobs; the result carries them all", async () => {
    const o = { ...base, temperature: 0.8, seed: 7, logprobs: true, topLogprobs: 2 };
    const it = model.stream(prompt, o);
    const chunks = [];
    let r = await it.next();
    while (!r.done) {
      chunks.push(r.value);
      r = await it.next();
    }
    const result = r.value;
    expect(chunks.map((c) => c.token)).toEqual(result.tokens);
    expect(chunks.map((c) => c.logprobs![0])).toEqual(result.logprobs!);
    for (const e of result.logprobs!) {
      expect(e.top.length).toBe(2);
      expect(e.logprob).toBeLessThanOrEqual(0);
      expect(e.top[0]!.logprob).toBeGreaterThanOrEqual(e.top[1]!.logprob);
      expect(e.text).toBe(model.tokenizer!.decode([e.id], { skipSpecialTokens: false }));
    }
    // Greedy with logprobs: the token is the most likely one.
    const g = await model.generate(prompt, { ...base, logprobs: true, topLogprobs: 1 });
    g.logprobs!.forEach((e) => expect(e.top[0]!.id).toBe(e.id));
  });

  test("a session that appended its prompt first samples the same tokens as generate()", async () => {
    const o = { ...base, temperature: 1, seed: 99, presencePenalty: 0.5 };
    const s = model.session();
    await s.append(prompt);
    const a = await s.generate(o);
    s.close();
    expect(a.tokens).toEqual((await model.generate(prompt, o)).tokens);
  });

  test("bad options are refused with errors naming them", async () => {
    await expect(model.generate(prompt, { temperature: -0.5 })).rejects.toThrow(/temperature/);
    await expect(model.generate(prompt, { topP: 1.5 })).rejects.toThrow(/topP/);
    await expect(model.generate(prompt, { seed: -1 })).rejects.toThrow(/seed/);
    await expect(model.generate(prompt, { seed: 1.5 })).rejects.toThrow(/seed/);
    await expect(model.generate(prompt, { topLogprobs: 3 })).rejects.toThrow(/logprobs/);
    await expect(model.generate(prompt, { logprobs: true, topLogprobs: 21 })).rejects.toThrow(/topLogprobs/);
  });
});
