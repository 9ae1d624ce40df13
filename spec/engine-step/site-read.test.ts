// Decoding with the sites' reads formed by the projections that take them (lib/gpu/site-read.ts,
// CHERENKOV_HC_READ_FUSED=1): the golden tokens, margins beside the unfused run's, the fused
// kernel in the steps and the read kernel that many times fewer; recorded steps replay it.
// On a GPU the tiny models' mixer projections are split-form q4 groups, which it does not take
// (the kernel test, spec/kernels/site-read.test.ts, pins its bits on every backend); their MoE
// sites' routers (bf16, the split form) are taken there too.
import { afterAll, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { Engine } from "../../lib/gpu/engine.ts";
import { StepRecordings } from "../../lib/gpu/recorded-step.ts";
import { openModel } from "../../lib/model/format.ts";
import { goldenCases } from "../golden/cases.ts";
import { buildGoldenModel } from "../golden/golden.ts";
import { BACKEND } from "../selected-backend.ts";
import { countDispatches, goldenRecord } from "./helpers.ts";

const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

async function decode(dir: string, name: string, fused: boolean, recorded: boolean) {
  const c = goldenCases.find((x) => x.name === name)!;
  const before = { fused: process.env.CHERENKOV_HC_READ_FUSED, recorded: StepRecordings.enabled };
  process.env.CHERENKOV_HC_READ_FUSED = fused ? "1" : "0";
  StepRecordings.enabled = recorded;
  const files = await openModel(dir);
  const engine = await Engine.load(files, BACKEND, { lookahead: false });
  try {
    const seq = engine.newSequence();
    const first = await seq.forward(c.prompt);
    const tokens = [first.next[first.next.length - 1]!];
    const margins: number[] = [];
    const seen = await countDispatches(async () => {
      while (tokens.length < c.maxTokens) {
        const r = await seq.forward([tokens[tokens.length - 1]!]);
        tokens.push(r.next[0]!);
        margins.push(r.margins[0]!);
      }
    });
    return { tokens, margins, seen, replayed: engine.recordedSteps.replayed };
  } finally {
    await engine.close();
    files.close();
    if (before.fused === undefined) delete process.env.CHERENKOV_HC_READ_FUSED;
    else process.env.CHERENKOV_HC_READ_FUSED = before.fused;
    StepRecordings.enabled = before.recorded;
  }
}

const count = (seen: Map<string, number>, name: string) => seen.get(name) ?? 0;
// The one-row fused read in either form (the general one, or _hc4 for sites of <= 4 streams).
const r1Reads = (seen: Map<string, number>) => count(seen, "matvec_multi_q4_r1_read_f32") + count(seen, "matvec_multi_q4_r1_read_hc4_f32");

test.each(["tiny-all-s1", "tiny-plelate-s8"])("%s: fused site reads give the golden tokens; the read kernel runs once fewer for each", async (name) => {
  const c = goldenCases.find((x) => x.name === name)!;
  const dir = await buildGoldenModel(c);
  dirs.push(dir);
  const want = await goldenRecord(name);
  const fused = await decode(dir, name, true, false);
  const plain = await decode(dir, name, false, false);
  expect(fused.tokens).toEqual(want.tokens);
  expect(plain.tokens).toEqual(want.tokens);
  const reads = r1Reads(fused.seen);
  expect(reads).toBeGreaterThan(0);
  expect(r1Reads(plain.seen)).toBe(0);
  expect(count(plain.seen, "hc_coeffs_read_norm_f32") - count(fused.seen, "hc_coeffs_read_norm_f32")).toBe(reads);
  // The fused read is the read kernel's to the bit; what may differ is DeltaNet's bf16 b and a,
  // which the fused kernel takes in the split form where the CPU backend would use the rows form.
  fused.margins.forEach((m, i) => expect(Math.abs(m - plain.margins[i]!)).toBeLessThan(1e-4));
  // Recorded and replayed, the same tokens.
  const replayed = await decode(dir, name, true, true);
  expect(replayed.tokens).toEqual(want.tokens);
  expect(replayed.replayed).toBeGreaterThan(0);
}, 120_000);
