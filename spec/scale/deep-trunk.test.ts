// The engine against the reference at the 80b trunk's depth (issue 23 item 2): 48 layers,
// 512 experts top-10 with a shared expert, 16/2 attention heads of head_dim 256, QSA that
// selects, PLE, MTP, all at a small hidden size (trunk-80b.ts). With an f32 KV cache nothing
// rounds differently on the two sides except f32 sums, so the tokens must be equal and the
// logprobs agree within LOGPROB_TOL, and every step's margin must be far above that error (so
// equal tokens are a real check, not luck). With the q8 cache the real shape's tokens may
// legitimately part after a few steps; docs/model.md says how to compare then (bun run compare).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { synthesize } from "../../lib/convert/synth.ts";
import { Model } from "../../lib/api/model.ts";
import type { GenerationResult } from "../../lib/api/model.ts";
import { BACKEND } from "../selected-backend.ts";
import { tempDir } from "../engine-step/helpers.ts";
import { trunk80bSmall } from "./trunk-80b.ts";
import { compareLayers, suspectLayer } from "../../lib/gpu/layer-compare.ts";
import { openModel } from "../../lib/model/format.ts";

// Measured 2.5e-4 at most here (8 tokens, CPU backend): f32 sums in another order, 48 layers deep.
const LOGPROB_TOL = 1e-3;
const PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
const N = 4;

const tmp = tempDir("trunk80b");
let engine: GenerationResult;
let reference: GenerationResult;

beforeAll(async () => {
  const config = trunk80bSmall("f32");
  await synthesize({ preset: "80b-a3b-shape", config, seed: 3, out: tmp.dir, weights: "q4" });
  const run = async (backend: "reference" | typeof BACKEND) => {
    await using m = await Model.load(tmp.dir, { backend });
    expect(m.config.num_layers).toBe(48);
    return await m.generate(PROMPT, { maxTokens: N, stopAtEos: false, logprobs: true, topLogprobs: 2 });
  };
  reference = await run("reference");
  engine = await run(BACKEND);
});
afterAll(() => tmp.remove());

test("48 layers, f32 KV: the engine's tokens equal the reference's, logprobs within 1e-3", () => {
  expect(engine.tokens).toEqual(reference.tokens);
  const errors = engine.logprobs!.map((l, i) => Math.abs(l.logprob - reference.logprobs![i]!.logprob));
  expect(Math.max(...errors)).toBeLessThan(LOGPROB_TOL);
  // The top alternatives agree too (ids, and logprobs within the same tolerance).
  engine.logprobs!.forEach((l, i) => {
    const want = reference.logprobs![i]!.top;
    expect(l.top.map((t) => t.id)).toEqual(want.map((t) => t.id));
    l.top.forEach((t, j) => expect(Math.abs(t.logprob - want[j]!.logprob)).toBeLessThan(LOGPROB_TOL));
  });
});

test("every step's margin (top-1 minus top-2 logprob) is at least 10x the tolerance: equal tokens are meaningful", () => {
  const margins = reference.logprobs!.map((l) => l.top[0]!.logprob - l.top[1]!.logprob);
  expect(Math.min(...margins)).toBeGreaterThan(10 * LOGPROB_TOL);
});

test("48 layers: every layer's own update agrees with the reference's to 1e-5 (bun run compare)", async () => {
  const files = await openModel(tmp.dir);
  try {
    const cmp = await compareLayers(files, BACKEND, PROMPT, { steps: 1 });
    expect(cmp.layers).toHaveLength(48);
    for (const a of cmp.layers) expect(a.updateRel).toBeLessThan(1e-5);
    expect(suspectLayer(cmp)).toBeNull();
  } finally {
    files.close();
  }
});
