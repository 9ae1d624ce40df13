// model.generate() with a fixed draft count tells the engine, as it runs the prompt, that a
// speculative cycle comes next (ForwardOptions.nextDrafts), so the engine encodes that cycle
// while the prompt runs (lib/gpu/engine.ts prepareFirstCycle). maxTokens 3 leaves room for
// exactly one cycle (of one draft), so the engine's count of prepared cycles says whether
// that first one was.
import { expect, test } from "bun:test";
import { join } from "node:path";
import { Model } from "../../lib/api/model.ts";
import type { Engine } from "../../lib/gpu/engine.ts";
import { BACKEND } from "../selected-backend.ts";

const DIR = join(import.meta.dir, "../../examples/models/qwen4-exp-tiny");
const PROMPT = Array.from({ length: 24 }, (_, i) => (29 * i + 7) % 256);

function engineOf(model: Model): Engine {
  return (model as unknown as { backend: { engine: Engine } }).backend.engine;
}

test("generate() with drafts announces its first cycle with the prompt (greedy and sampled); drafts 0 and \"auto\" do not; the tokens do not change", async () => {
  await using model = await Model.load(DIR, { backend: BACKEND });
  const engine = engineOf(model);
  const run = async (opts: Parameters<Model["generate"]>[1]) => {
    const before = engine.speculativeCycles;
    const r = await model.generate(PROMPT, { maxTokens: 3, stopAtEos: false, ...opts });
    const after = engine.speculativeCycles;
    return { tokens: r.tokens, cycles: after.cycles - before.cycles, prepared: after.prepared - before.prepared };
  };
  const plain = await run({});
  expect(plain.cycles).toBe(0);
  const greedy = await run({ drafts: 2 });
  expect(greedy.tokens).toEqual(plain.tokens);
  expect(greedy).toMatchObject({ cycles: 1, prepared: 1 });
  const seeded = { temperature: 0.8, seed: 7 };
  const sampledPlain = await run(seeded);
  const sampled = await run({ ...seeded, drafts: 2 });
  expect(sampled).toMatchObject({ cycles: 1, prepared: 1 });
  expect(sampled.tokens.length).toBe(sampledPlain.tokens.length);
  // "auto" decides its count later: nothing is announced (its first step may be a cycle or not).
  const auto = await run({ drafts: "auto" });
  expect(auto.prepared).toBe(0);
  expect(auto.tokens).toEqual(plain.tokens);
}, 120_000);
