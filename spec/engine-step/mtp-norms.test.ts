// The MTP head's RMSNorms formed by the projections that read them (lib/gpu/site-read.ts
// PlainRead, matvec_multi_q4_r1_norm_f32) where reads are fused: in each MTP row that runs
// one row, the mixer norm by the attention's q/gate/k/v dispatch; in each draft's row, the MoE
// norm by the router's dispatch and the output norm by the LM head's. A cycle of k drafts runs
// 3k - 1 dispatches fewer, one more when its catch-up is a single row (the previous cycle
// accepted nothing); speculative decoding still gives greedy's tokens, with 2 and 3 drafts.
// A site-less trunk (hc.streams = 1) reads its residual the same way: its golden tokens, and
// two rms_norm_f32 a layer fewer in a decode step (its final norm stays apart).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { join } from "node:path";
import { Engine } from "../../lib/gpu/engine.ts";
import { StepRecordings } from "../../lib/gpu/recorded-step.ts";
import { openModel, type ModelFiles } from "../../lib/model/format.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";
import { BACKEND } from "../selected-backend.ts";
import { rmSync } from "node:fs";
import { goldenCases } from "../golden/cases.ts";
import { buildGoldenModel } from "../golden/golden.ts";
import { countDispatches, goldenRecord, greedyThenSpeculative } from "./helpers.ts";

const DIR = join(import.meta.dir, "..", "..", "examples", "models", "qwen4-exp-tiny");
const N = 20;

let files: ModelFiles;
let PROMPT: number[];
const saved = { fused: process.env.CHERENKOV_HC_READ_FUSED, rows: process.env.CHERENKOV_MATVEC_GROUP_ROWS, recorded: StepRecordings.enabled };

beforeAll(async () => {
  PROMPT = (await loadTokenizer(DIR)).encode("The cat sat on the mat. The dog sat on the");
  files = await openModel(DIR);
  // Every cycle encoded afresh, so every dispatch is seen (a recorded cycle replays its tape).
  StepRecordings.enabled = false;
});
afterAll(() => {
  files.close();
  StepRecordings.enabled = saved.recorded;
  if (saved.fused === undefined) delete process.env.CHERENKOV_HC_READ_FUSED;
  else process.env.CHERENKOV_HC_READ_FUSED = saved.fused;
  if (saved.rows === undefined) delete process.env.CHERENKOV_MATVEC_GROUP_ROWS;
  else process.env.CHERENKOV_MATVEC_GROUP_ROWS = saved.rows;
});

const total = (seen: Map<string, number>) => [...seen.values()].reduce((a, b) => a + b, 0);

/** Greedy tokens, then speculative decoding's tokens, accepts and per-cycle dispatches, reads fused or not. */
async function run(fused: boolean, drafts: number) {
  process.env.CHERENKOV_HC_READ_FUSED = fused ? "1" : "0";
  // The batch forms on every backend: a GPU's one-row verify rows fold their reads too
  // (verify-one-row.test.ts), which this count leaves out.
  process.env.CHERENKOV_MATVEC_GROUP_ROWS = "4";
  const engine = await Engine.load(files, BACKEND);
  try {
    return await greedyThenSpeculative(engine, PROMPT, N, drafts);
  } finally {
    await engine.close();
  }
}

for (const drafts of [2, 3]) {
  test(`${drafts} drafts: greedy's tokens; a cycle runs 3 x ${drafts} - 1 dispatches fewer, one more after an accept of 0`, async () => {
    const fused = await run(true, drafts);
    const apart = await run(false, drafts);
    expect(fused.tokens).toEqual(fused.greedy);
    expect(apart.tokens).toEqual(apart.greedy);
    expect(fused.greedy).toEqual(apart.greedy);
    // Cycles after the first (whose catch-up is the whole prompt): a pending rollback is one
    // dispatch; apart, the catch-up rows do not change the count (speculative-cycle.test.ts).
    const base = (r: typeof fused, i: number) => total(r.cycles[i]!) - (r.accepts[i - 1]! < drafts ? 1 : 0);
    const apartBase = base(apart, 1);
    for (let i = 1; i < apart.cycles.length; i++) expect(base(apart, i)).toBe(apartBase);
    expect(fused.accepts.slice(0, -1).some((a) => a === 0)).toBe(true);
    expect(fused.accepts.slice(0, -1).some((a) => a > 0)).toBe(true);
    for (let i = 1; i < fused.cycles.length; i++) {
      const removed = 3 * drafts - 1 + (fused.accepts[i - 1] === 0 ? 1 : 0);
      expect(apartBase - base(fused, i)).toBe(removed);
      expect(fused.cycles[i]!.get("matvec_multi_q4_r1_norm_f32")).toBe(removed);
      expect(apart.cycles[i]!.get("matvec_multi_q4_r1_norm_f32")).toBeUndefined();
      // Every norm of the head the cycle removed was an rms_norm_f32.
      expect((apart.cycles[i]!.get("rms_norm_f32") ?? 0) - (fused.cycles[i]!.get("rms_norm_f32") ?? 0)).toBe(removed);
    }
  }, 300_000);
}

test("a site-less trunk (tiny-n1-s5): the golden tokens; a decode step's mixer and MoE norms formed by their projections", async () => {
  const c = goldenCases.find((x) => x.name === "tiny-n1-s5")!;
  const dir = await buildGoldenModel(c);
  const want = await goldenRecord(c.name);
  const decode = async (fused: boolean) => {
    process.env.CHERENKOV_HC_READ_FUSED = fused ? "1" : "0";
    const golden = await openModel(dir);
    const engine = await Engine.load(golden, BACKEND, { lookahead: false });
    try {
      const seq = engine.newSequence();
      const tokens = [(await seq.forward(c.prompt)).next.at(-1)!];
      const steps: Map<string, number>[] = [];
      while (tokens.length < c.maxTokens) steps.push(await countDispatches(async () => void tokens.push((await seq.forward([tokens.at(-1)!])).next[0]!)));
      return { tokens, steps, layers: golden.manifest.config.num_layers };
    } finally {
      await engine.close();
      golden.close();
    }
  };
  try {
    const fused = await decode(true);
    const apart = await decode(false);
    expect(fused.tokens).toEqual(want.tokens);
    expect(apart.tokens).toEqual(want.tokens);
    fused.steps.forEach((seen, i) => {
      expect(seen.get("matvec_multi_q4_r1_norm_f32")).toBe(2 * fused.layers);
      expect((apart.steps[i]!.get("rms_norm_f32") ?? 0) - (seen.get("rms_norm_f32") ?? 0)).toBe(2 * fused.layers);
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}, 300_000);
