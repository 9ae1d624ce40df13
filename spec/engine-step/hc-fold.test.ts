// The fold in whole runs (lib/gpu/hc-fold.ts): a step runs hc_mix_partials only at the
// sites whose partials no write just left (the first mixer site, and a mixer site after a
// PLE injection), one dispatch fewer for every other site and the final read, and nothing else
// changes in the dispatch list; the tokens stay the golden ones. CHERENKOV_HC_FOLD=0 is the
// unfolded baseline the counts are compared with.
import { afterAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { Engine } from "../../lib/gpu/engine.ts";
import { StepRecordings } from "../../lib/gpu/recorded-step.ts";
import { openModel } from "../../lib/model/format.ts";
import { fusesSiteRead } from "../../lib/gpu/site-read.ts";
import { goldenCases } from "../golden/cases.ts";
import { buildGoldenModel } from "../golden/golden.ts";
import { decodeCountingDispatches, goldenRecord } from "./helpers.ts";
import { BACKEND } from "../selected-backend.ts";
import { gemmMinRows } from "../../lib/gpu/gemm.ts";

const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

/** The tokens of case `name`, the dispatches of its prompt's step and of its decode steps. */
async function decode(dir: string, name: string, fold: boolean) {
  const c = goldenCases.find((x) => x.name === name)!;
  const before = process.env.CHERENKOV_HC_FOLD;
  if (!fold) process.env.CHERENKOV_HC_FOLD = "0";
  // Every step encoded afresh, so every dispatch is seen (a recorded step replays its tape).
  const recorded = StepRecordings.enabled;
  StepRecordings.enabled = false;
  const files = await openModel(dir);
  const engine = await Engine.load(files, BACKEND, { lookahead: false });
  try {
    const { tokens, prompt, seen } = await decodeCountingDispatches(engine.newSequence(), c.prompt, c.maxTokens);
    return { tokens, prompt, seen, steps: c.maxTokens - 1, config: files.manifest.config };
  } finally {
    await engine.close();
    files.close();
    StepRecordings.enabled = recorded;
    if (before === undefined) delete process.env.CHERENKOV_HC_FOLD;
    else process.env.CHERENKOV_HC_FOLD = before;
  }
}

const count = (seen: Map<string, number>, prefix: string) => [...seen].filter(([k]) => k.startsWith(prefix)).reduce((n, [, v]) => n + v, 0);
const total = (seen: Map<string, number>) => [...seen.values()].reduce((a, b) => a + b, 0);

describe("hc fold: decode steps skip hc_mix_partials where a fused write left the partials", () => {
  // tiny-all-s1: PLE on layer 0 only; tiny-plelate-s8: PLE on layers 1 and 3.
  test.each(["tiny-all-s1", "tiny-plelate-s8"])("%s", async (name) => {
    const c = goldenCases.find((x) => x.name === name)!;
    const dir = await buildGoldenModel(c);
    dirs.push(dir);
    const want = await goldenRecord(name);
    const folded = await decode(dir, name, true);
    const plain = await decode(dir, name, false);
    expect(folded.tokens).toEqual(want.tokens);
    expect(plain.tokens).toEqual(want.tokens);
    const L = folded.config.num_layers;
    const sites = 2 * L + 1; // a mixer and a MoE site a layer, and the final read
    // Mixer sites no fused write precedes: layer 0's, and every PLE layer's.
    const unfolded = new Set([0, ...(folded.config.ple?.layers ?? [])]).size;
    const steps = folded.steps;
    expect(count(plain.seen, "hc_mix_partials_")).toBe(sites * steps);
    expect(count(folded.seen, "hc_mix_partials_")).toBe(unfolded * steps);
    // A folded site's read may be formed by the projections that take it (site-read.ts: the
    // mixer's input projections, the MoE site's router; one dispatch for the read kernel and
    // theirs on the GPU backends).
    const fusedReads = count(folded.seen, "matvec_multi_q4_r1_read_"); // (the general form and the small-site one: _hc4)
    // (On a GPU these tiny models' mixer projections are narrow q4 groups in the split form,
    // never fused there; their MoE sites' routers are.)
    if (!fusesSiteRead(BACKEND)) expect(fusedReads).toBe(0);
    else expect(fusedReads).toBeGreaterThan(0);
    expect(fusedReads).toBeLessThanOrEqual((sites - 1 - unfolded) * steps); // not the final read
    expect(count(plain.seen, "matvec_multi_q4_r1_read_")).toBe(0);
    // (With a fused read at least that many fewer: where the backend would not have merged
    // DeltaNet's bf16 b and a with its q4 projections, the fused dispatch does.)
    if (fusedReads === 0) expect(total(plain.seen) - total(folded.seen)).toBe((sites - unfolded) * steps);
    else expect(total(plain.seen) - total(folded.seen)).toBeGreaterThanOrEqual((sites - unfolded) * steps + fusedReads);
    // Every site still forms its coefficients and reads once.
    expect(count(folded.seen, "hc_coeffs_read_norm_f32") + fusedReads).toBe(sites * steps);
    // The prompt's step (one chunk of every row) folds the same sites, unless it has rows
    // enough for the GEMM (a GPU: gemmMinRows), where nothing folds.
    const promptFolds = c.prompt.length < gemmMinRows(BACKEND);
    expect(count(plain.prompt, "hc_mix_partials_")).toBe(sites);
    expect(count(folded.prompt, "hc_mix_partials_")).toBe(promptFolds ? unfolded : sites);
    expect(total(plain.prompt) - total(folded.prompt)).toBe(promptFolds ? sites - unfolded : 0);
  }, 120_000);
});
