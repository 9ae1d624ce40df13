// CHERENKOV_DELTANET_NORM_FUSED=1 in whole runs (lib/gpu/deltanet.ts encodeDeltaNetNormed): a
// decode step's DeltaNet layers run deltanet_rows_norm_f32 instead of deltanet_rows_f32 and
// rms_norm_gated_f32, one dispatch fewer a layer and nothing else changed in the dispatch list;
// the prompt's step (more than 4 rows) keeps its kernels; the tokens stay the golden ones, with
// recorded steps replayed (every replay checked against a fresh encode), and a speculative run
// on the shipped tiny model (verify batches of 3 and 4 rows with snapshot planes) equals greedy.
// All of it for every number of columns a simdgroup walks at once (CHERENKOV_DELTANET_NORM_COLS
// 1, 2, 4: deltanet_rows_norm_f32, _c2_f32, _c4_f32), which changes nothing else.
import { afterAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { DELTANET_NORM_KERNEL, type DeltaNetNormCols } from "../../lib/gpu/deltanet.ts";
import { Engine, type EngineSequence } from "../../lib/gpu/engine.ts";
import { StepRecordings } from "../../lib/gpu/recorded-step.ts";
import { openModel } from "../../lib/model/format.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";
import { goldenCases } from "../golden/cases.ts";
import { buildGoldenModel } from "../golden/golden.ts";
import { countDispatches, decodeCountingDispatches, goldenRecord } from "./helpers.ts";
import { BACKEND } from "../selected-backend.ts";

const dirs: string[] = [];
afterAll(() => {
  dirs.forEach((d) => rmSync(d, { recursive: true, force: true }));
  StepRecordings.check = false;
  StepRecordings.enabled = true;
});

const COLS: DeltaNetNormCols[] = [1, 2, 4];
/** Every variant of the fused kernel: a run must dispatch only the one its COLS names. */
const NORM_KERNELS = Object.values(DELTANET_NORM_KERNEL);

/** Runs `body` with CHERENKOV_DELTANET_NORM_FUSED set to `value` (and CHERENKOV_DELTANET_NORM_COLS to `cols`, else unset), restoring both after. */
async function withOption<T>(value: "0" | "1", body: () => Promise<T>, cols?: DeltaNetNormCols): Promise<T> {
  const before = { fused: process.env.CHERENKOV_DELTANET_NORM_FUSED, cols: process.env.CHERENKOV_DELTANET_NORM_COLS };
  process.env.CHERENKOV_DELTANET_NORM_FUSED = value;
  if (cols === undefined) delete process.env.CHERENKOV_DELTANET_NORM_COLS;
  else process.env.CHERENKOV_DELTANET_NORM_COLS = String(cols);
  try {
    return await body();
  } finally {
    for (const [name, was] of [["CHERENKOV_DELTANET_NORM_FUSED", before.fused], ["CHERENKOV_DELTANET_NORM_COLS", before.cols]] as const) {
      if (was === undefined) delete process.env[name];
      else process.env[name] = was;
    }
  }
}

/** Greedy tokens of golden case `name` and the dispatches of its prompt's step and its decode steps; `recorded`: steps replayed (and checked). */
async function decode(dir: string, name: string, option: "0" | "1", recorded: boolean, cols?: DeltaNetNormCols) {
  const c = goldenCases.find((x) => x.name === name)!;
  return withOption(option, async () => {
    const enabled = StepRecordings.enabled;
    StepRecordings.enabled = recorded;
    StepRecordings.check = recorded;
    const files = await openModel(dir);
    const engine = await Engine.load(files, BACKEND, { lookahead: false });
    try {
      const { tokens, prompt, seen } = await decodeCountingDispatches(engine.newSequence(), c.prompt, c.maxTokens);
      return { tokens, prompt, seen, steps: c.maxTokens - 1, config: files.manifest.config, replayed: engine.recordedSteps.replayed };
    } finally {
      await engine.close();
      files.close();
      StepRecordings.enabled = enabled;
      StepRecordings.check = false;
    }
  }, cols);
}

const count = (seen: Map<string, number>, name: string) => seen.get(name) ?? 0;
const total = (seen: Map<string, number>) => [...seen.values()].reduce((a, b) => a + b, 0);

describe("CHERENKOV_DELTANET_NORM_FUSED=1: one dispatch fewer a DeltaNet layer of a decode step, golden tokens", () => {
  test.each(["tiny-all-s1", "tiny-plain-s4"])("%s, COLS 1, 2 and 4", async (name) => {
    const c = goldenCases.find((x) => x.name === name)!;
    const dir = await buildGoldenModel(c);
    dirs.push(dir);
    const want = await goldenRecord(name);
    // Every step encoded afresh, so every dispatch is seen (a recorded step replays its tape).
    const plain = await decode(dir, name, "0", false);
    expect(plain.tokens).toEqual(want.tokens);
    const layers = plain.config.layer_types.filter((t) => t === "deltanet").length;
    expect(layers).toBeGreaterThan(0);
    const steps = plain.steps;
    for (const kernel of NORM_KERNELS) expect(count(plain.seen, kernel)).toBe(0);
    expect(count(plain.seen, "deltanet_rows_f32")).toBe(layers * steps);
    expect(count(plain.seen, "rms_norm_gated_f32")).toBe(layers * steps);
    for (const cols of COLS) {
      const fused = await decode(dir, name, "1", false, cols);
      expect(fused.tokens).toEqual(want.tokens);
      for (const kernel of NORM_KERNELS) expect(count(fused.seen, kernel)).toBe(kernel === DELTANET_NORM_KERNEL[cols] ? layers * steps : 0);
      expect(count(fused.seen, "deltanet_rows_f32")).toBe(0);
      expect(count(fused.seen, "rms_norm_gated_f32")).toBe(0);
      expect(total(plain.seen) - total(fused.seen)).toBe(layers * steps);
      // On the CPU backend the decode row's conv ran in the qkv projection's epilogue
      // (convDone): no conv dispatch. (A GPU forms an hc site's read in the qkv projection,
      // matvec_multi_q4_r1_read, which has no conv epilogue: the conv stays a dispatch there, in
      // both runs alike, as `others` below checks.)
      if (BACKEND === "cpu") expect(count(fused.seen, "conv_silu_rows_f32")).toBe(0);
      // Nothing else changed: the other pipelines' counts are the same.
      const others = (seen: Map<string, number>) => [...seen].filter(([k]) => ![...NORM_KERNELS, "deltanet_rows_f32", "rms_norm_gated_f32"].includes(k)).sort();
      expect(others(fused.seen)).toEqual(others(plain.seen));
      // The prompt's step (more rows than the kernel takes) keeps the two kernels.
      expect(c.prompt.length).toBeGreaterThan(4);
      expect(fused.prompt).toEqual(plain.prompt);
      for (const kernel of NORM_KERNELS) expect(count(fused.prompt, kernel)).toBe(0);
    }
  }, 600_000);

  test.each(COLS)("recorded steps replay the fused kernel (every replay checked word for word); golden tokens; COLS %i", async (cols) => {
    const c = goldenCases.find((x) => x.name === "tiny-all-s1")!;
    const dir = await buildGoldenModel(c);
    dirs.push(dir);
    const r = await decode(dir, c.name, "1", true, cols);
    expect(r.tokens).toEqual((await goldenRecord(c.name)).tokens);
    expect(r.replayed).toBeGreaterThan(0);
    const layers = r.config.layer_types.filter((t) => t === "deltanet").length;
    expect(count(r.seen, DELTANET_NORM_KERNEL[cols])).toBe(layers * r.steps); // replayed from the tape or encoded
    expect(count(r.seen, "rms_norm_gated_f32")).toBe(0);
  }, 300_000);
});

describe("CHERENKOV_DELTANET_NORM_FUSED=1: speculative decoding on qwen4-exp-tiny equals greedy", () => {
  const DIR = join(import.meta.dir, "..", "..", "examples", "models", "qwen4-exp-tiny");
  const N = 24;

  async function greedy(seq: EngineSequence, prompt: number[], n: number): Promise<number[]> {
    const first = await seq.forward(prompt);
    const tokens = [first.next[first.next.length - 1]!];
    while (tokens.length < n) tokens.push((await seq.forward([tokens[tokens.length - 1]!])).next[0]!);
    seq.dispose();
    return tokens;
  }

  async function speculative(seq: EngineSequence, prompt: number[], drafts: number, n: number) {
    const first = await seq.forward(prompt);
    const tokens = [first.next[first.next.length - 1]!];
    const accepts: number[] = [];
    while (tokens.length < n) {
      const r = await seq.speculate(tokens[tokens.length - 1]!, drafts);
      accepts.push(r.next.length - 1);
      tokens.push(...r.next);
    }
    seq.dispose();
    return { tokens: tokens.slice(0, n), accepts };
  }

  test.each(COLS)("2 and 3 drafts (verify batches of 3 and 4 rows, snapshot planes, rollbacks), cycles replayed and checked; COLS %i", async (cols) => {
    const prompt = (await loadTokenizer(DIR)).encode("The cat sat on the mat. The dog sat on the");
    const files = await openModel(DIR);
    StepRecordings.check = true;
    try {
      // Greedy with the two dispatches: the reference the fused runs must equal.
      const plain = await withOption("0", async () => {
        const engine = await Engine.load(files, BACKEND);
        try {
          return await greedy(engine.newSequence(), prompt, N);
        } finally {
          await engine.close();
        }
      });
      await withOption("1", async () => {
        const engine = await Engine.load(files, BACKEND);
        try {
          expect(await greedy(engine.newSequence(), prompt, N)).toEqual(plain);
          for (const drafts of [2, 3]) {
            let r: Awaited<ReturnType<typeof speculative>> | undefined;
            const seen = await countDispatches(async () => {
              r = await speculative(engine.newSequence(), prompt, drafts, N);
            });
            expect(r!.tokens).toEqual(plain);
            // Partial accepts (rollbacks to a snapshot plane) and full ones.
            expect(r!.accepts.some((a) => a < drafts)).toBe(true);
            expect(r!.accepts.some((a) => a > 0)).toBe(true);
            // The verify batches' DeltaNet layers ran the fused kernel of this COLS (the prompt's
            // step, counted too, its two kernels).
            for (const kernel of NORM_KERNELS) {
              if (kernel === DELTANET_NORM_KERNEL[cols]) expect(seen.get(kernel) ?? 0).toBeGreaterThan(0);
              else expect(seen.get(kernel) ?? 0).toBe(0);
            }
          }
        } finally {
          await engine.close();
        }
      }, cols);
    } finally {
      StepRecordings.check = false;
      files.close();
    }
  }, 600_000);
});
