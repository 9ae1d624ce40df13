// A verify batch's site reads formed by the projections that take them (CHERENKOV_HC_READ_FUSED=1
// with CHERENKOV_HC_READ_FUSED_ROWS=4: matvec_multi_q4_read_f32 for the 1 + k rows): speculative
// decoding on the tiny model still gives greedy's tokens (2 and 3 drafts), and a cycle runs the
// dispatches of its separate reads fewer, counted here; recorded cycles replay it (checked).
import { expect, test } from "bun:test";
import { Engine } from "../../lib/gpu/engine.ts";
import { StepRecordings } from "../../lib/gpu/recorded-step.ts";
import { BACKEND } from "../selected-backend.ts";
import { greedyThenSpeculative, tinyDraftsFixture } from "./helpers.ts";

const N = 20;

const tiny = tinyDraftsFixture(["CHERENKOV_HC_READ_FUSED", "CHERENKOV_HC_READ_FUSED_ROWS", "CHERENKOV_MATVEC_GROUP_ROWS"]);

const total = (seen: Map<string, number>) => [...seen.values()].reduce((a, b) => a + b, 0);

/** Greedy tokens, then speculative decoding's tokens, accepts and per-cycle dispatches (every cycle encoded afresh unless `recorded`). */
async function run(rows: string | undefined, drafts: number, recorded = false) {
  process.env.CHERENKOV_HC_READ_FUSED = "1";
  // The batch forms on every backend (a GPU runs up to 4 rows one a threadgroup by default:
  // verify-one-row.test.ts), so that "unset" means reads apart here.
  process.env.CHERENKOV_MATVEC_GROUP_ROWS = "4";
  if (rows === undefined) delete process.env.CHERENKOV_HC_READ_FUSED_ROWS;
  else process.env.CHERENKOV_HC_READ_FUSED_ROWS = rows;
  StepRecordings.enabled = recorded;
  StepRecordings.check = recorded;
  const engine = await Engine.load(tiny.files(), BACKEND);
  try {
    return { ...(await greedyThenSpeculative(engine, tiny.prompt(), N, drafts)), replayed: engine.recordedSteps.replayed };
  } finally {
    await engine.close();
  }
}

/** The MTP head's catch-up in cycle i: the whole prompt in the first, then the last cycle's accepted rows and its next token. */
const catchUpRows = (accepts: number[], i: number) => (i === 0 ? tiny.prompt().length : accepts[i - 1]! + 1);

for (const drafts of [2, 3]) {
  test(`${drafts} drafts: greedy's tokens; a cycle runs its verify batch's 14 reads, and 4 projection dispatches, fewer`, async () => {
    const rows = await run("4", drafts);
    const one = await run(undefined, drafts);
    expect(rows.tokens).toEqual(rows.greedy);
    expect(one.greedy).toEqual(rows.greedy);
    expect(one.accepts).toEqual(rows.accepts);
    expect(rows.accepts.some((a) => a > 0)).toBe(true);
    for (let i = 0; i < rows.cycles.length; i++) {
      const [a, b] = [one.cycles[i]!, rows.cycles[i]!];
      const n = (m: Map<string, number>, k: string) => m.get(k) ?? 0;
      // The trunk's 16 sites but the 2 no folded write precedes (the PLE layers' mixer sites,
      // 0 and 4: the injection wrote the streams; read apart as before) are read by their
      // projections: 14 dispatches...
      expect(n(b, "matvec_multi_q4_read_f32")).toBe(14);
      expect(n(a, "matvec_multi_q4_read_f32")).toBe(0);
      expect(n(a, "hc_coeffs_read_norm_f32") - n(b, "hc_coeffs_read_norm_f32")).toBe(14);
      // ... and the 4 DeltaNet sites among them had their bf16 b, a and q4 qkv, z in two
      // dispatches (a batch has no mixed form): one now. A catch-up of 2..4 rows also forms the
      // MTP head's mixer norm in its projections (matvec_multi_q4_norm_f32).
      const head = catchUpRows(rows.accepts, i) > 1 && catchUpRows(rows.accepts, i) <= 4 ? 1 : 0;
      expect(n(b, "matvec_multi_q4_norm_f32")).toBe(head);
      expect(total(a) - total(b)).toBe(14 + 4 + head);
    }
  }, 300_000);
}

test("3 drafts, recorded cycles replayed and checked word for word against a fresh encode: greedy's tokens", async () => {
  const r = await run("4", 3, true);
  expect(r.tokens).toEqual(r.greedy);
  expect(r.replayed).toBeGreaterThan(0);
  // (the first cycle is encoded directly, and the next ones recorded for each accept count)
  expect(r.cycles[0]!.get("matvec_multi_q4_read_f32")).toBeGreaterThanOrEqual(14);
}, 300_000);
