// A verify batch one row a threadgroup (a GPU's default for batches of up to 4 rows,
// lib/gpu/projections.ts defaultRowsPerGroup; CHERENKOV_MATVEC_GROUP_ROWS=1 asks for it on any
// backend): each row takes a decode row's kernels, so speculative decoding keeps greedy's
// tokens (2 and 3 drafts) with the verify's projections in their one-row forms, counted here.
import { describe, expect, test } from "bun:test";
import { Engine } from "../../lib/gpu/engine.ts";
import { defaultRowsPerGroup } from "../../lib/gpu/projections.ts";
import { StepRecordings } from "../../lib/gpu/recorded-step.ts";
import { BACKEND } from "../selected-backend.ts";
import { withEnvVar } from "../env-var.ts";
import { greedyThenSpeculative, tinyDraftsFixture } from "./helpers.ts";

const N = 16;
const KEY = "CHERENKOV_MATVEC_GROUP_ROWS";
const FUSED = "CHERENKOV_HC_READ_FUSED";
const tiny = tinyDraftsFixture([KEY, FUSED]);

const withRows = <T>(rows: string | undefined, f: () => T): T => withEnvVar(KEY, rows, f);

describe("rows a matvec threadgroup takes by default", () => {
  test("GPUs: batches of up to 4 rows one a threadgroup, then up to 32; the CPU backend: all in one", () => {
    withRows(undefined, () => {
      for (const backend of ["cuda", "metal"]) {
        expect([1, 2, 3, 4, 5, 32, 33, 512].map((nb) => defaultRowsPerGroup(backend, nb))).toEqual([1, 1, 1, 1, 5, 32, 32, 32]);
      }
      expect([1, 4, 5, 512].map((nb) => defaultRowsPerGroup("cpu", nb))).toEqual([1, 4, 5, 512]);
    });
  });
  test(`${KEY} overrides it on every backend, and a bad value is refused by name`, () => {
    withRows("2", () => expect([1, 3, 40].map((nb) => defaultRowsPerGroup("cpu", nb))).toEqual([1, 2, 2]));
    withRows("1", () => expect(defaultRowsPerGroup("cuda", 4)).toBe(1));
    for (const bad of ["0", "1.5", "x"]) withRows(bad, () => expect(() => defaultRowsPerGroup("cuda", 4)).toThrow(KEY));
  });
});

async function run(rows: string, drafts: number, fusedReads = "0", recorded = false) {
  process.env[KEY] = rows;
  process.env[FUSED] = fusedReads; // (on by default on a GPU; the CPU backend's threadgroups would each repeat a read)
  StepRecordings.enabled = recorded; // off: every cycle encoded, so each is counted
  StepRecordings.check = recorded; // on: each replay checked word for word against a fresh encode
  const engine = await Engine.load(tiny.files(), BACKEND);
  try {
    return { ...(await greedyThenSpeculative(engine, tiny.prompt(), N, drafts)), replayed: engine.recordedSteps.replayed };
  } finally {
    await engine.close();
  }
}

const count = (m: Map<string, number>, re: RegExp) => [...m].filter(([k]) => re.test(k)).reduce((a, [, v]) => a + v, 0);

for (const drafts of [2, 3]) {
  test(`${drafts} drafts, one verify row a threadgroup: greedy's tokens and accepts; the q4 projections in their one-row forms`, async () => {
    const one = await run("1", drafts);
    const all = await run("4", drafts);
    expect(one.tokens).toEqual(one.greedy);
    expect(all.greedy).toEqual(one.greedy);
    expect(one.accepts).toEqual(all.accepts);
    expect(one.accepts.some((a) => a > 0)).toBe(true);
    // After the first cycle (whose MTP catch-up is the whole prompt) a cycle's batches are its
    // verify rows and a catch-up of 1 + accepted rows: in their one-row forms only...
    // (One-row forms end _q4_r1_f32; matvec_multi_split_q4_f32, a GPU's narrow projections,
    // splits each row's sum over a threadgroup's simdgroups whatever the rows: no batch form.)
    const batchForms = /^matvec(?!_multi_split)\w*_q4_f32$/;
    for (let i = 1; i < one.cycles.length; i++) {
      expect(count(one.cycles[i]!, batchForms)).toBe(0);
      expect(count(one.cycles[i]!, /^matvec\w*_q4_r1_f32$/)).toBeGreaterThan(0);
      // ... where 4 rows a threadgroup take the batch forms.
      expect(count(all.cycles[i]!, batchForms)).toBeGreaterThan(0);
    }
  }, 300_000);
}

test("2 drafts, one verify row a threadgroup with the reads fused (a GPU's default): each verify row's 14 site reads formed by its projections' one-row kernel; greedy's tokens", async () => {
  const fused = await run("1", 2, "1");
  const apart = await run("1", 2, "0");
  expect(fused.tokens).toEqual(fused.greedy);
  expect(fused.accepts).toEqual(apart.accepts);
  for (let i = 1; i < fused.cycles.length; i++) {
    // The trunk's 16 sites but the 2 PLE layers' mixer sites (no folded write before them).
    expect(count(fused.cycles[i]!, /^matvec_multi_q4_r1_read/)).toBe(14);
    expect(count(apart.cycles[i]!, /^matvec_multi_q4_r1_read/)).toBe(0);
    expect(count(apart.cycles[i]!, /^hc_coeffs_read_norm_f32$/) - count(fused.cycles[i]!, /^hc_coeffs_read_norm_f32$/)).toBe(14);
    expect(count(fused.cycles[i]!, /^matvec_multi_q4_read_f32$/)).toBe(0); // (not the rows form)
  }
}, 300_000);

test("3 drafts, one verify row a threadgroup with the reads fused, recorded cycles replayed and checked against a fresh encode: greedy's tokens", async () => {
  const r = await run("1", 3, "1", true);
  expect(r.replayed).toBeGreaterThan(0);
  expect(r.tokens).toEqual(r.greedy);
  expect(r.accepts.some((a) => a > 0)).toBe(true);
}, 300_000);
