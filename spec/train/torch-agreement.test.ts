// The PyTorch implementation of qwen4-exp (spec/train/qwen4exp.py, which trains the shipped
// model) against lib/reference, on the cases of check-cases.ts (random weights of four feature
// sets, PLE on later layers in one, and the trained example model). torch computed every row in
// float64 over whole sequences from position 0, with no caches and no rollback (fixtures in
// spec/train/fixtures, made by check_agreement.py on the H200 machine; device-run.log is its log).
// Held here, each logit row within a tolerance (below) of the row's largest |logit|:
//   - the prompt's trunk logits and MTP catch-up logits;
//   - token-by-token decode of torch's greedy continuation (one row per forward), every position;
//   - speculative decoding (generateGreedy with MTP drafts): exactly torch's drafts, accept counts
//     per position and tokens, and the logits of every MTP row (catch-up seed and chained rows)
//     and every verify row. Rows after a rejected draft were computed by torch on the accepted
//     sequence alone, so they check the state after each rollback.
// Regenerate the fixtures after a change of the model or of RandomWeights:
//   bun spec/train/make-check-fixture.ts /tmp/check
//   python3 spec/train/check_agreement.py /tmp/check spec/train/fixtures   (repository root)
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { openModel } from "../../lib/model/format.ts";
import { generateGreedy, ReferenceModel, type ForwardOptions, type SequenceState } from "../../lib/reference/index.ts";
import { caseWeights, CHECK_CASES, TRAINED_CASE } from "./check-cases.ts";

/**
 * Largest |reference - torch| / max|logit| of a row allowed (f32 against float64). Measured
 * (bun 1.4.4, x86-64): the trained model 1.0e-7 worst over every row; the random-weight tiny
 * models, whose activations are larger and less well conditioned, 1.1e-5 worst (one rejected
 * draft row of tiny-ple-late-f32; most rows below 3e-6). A Sinkhorn loop one round short moves
 * them by 3.2e-5 (tiny-all-f32) and 5.5e-4 (trained). DUMP_ROWS=1 prints every row's value.
 */
export const TOLERANCE_TRAINED = 1e-6;
export const TOLERANCE_RANDOM = 1.5e-5;

interface PackedRows {
  rows: number;
  format: "full" | "top";
  values: string;
  k?: number;
  ids?: string;
  rowMaxAbs?: string;
}

interface SpecRun {
  drafts: number;
  maxTokens: number;
  tokens: number[];
  steps: { position: number; next: number; drafts: number[]; accepted: number; bonus: number }[];
  byPosition: number[];
  proposedByPosition: number[];
  verify: PackedRows;
  chain: PackedRows | null;
}

interface TorchFixture {
  name: string;
  seed?: number;
  prompt: number[];
  vocab: number;
  logits: PackedRows;
  mtpLogits?: PackedRows;
  decode: { tokens: number[]; logits: PackedRows };
  spec?: SpecRun[];
}

function bytes(b64: string): ArrayBuffer {
  const b = Buffer.from(b64, "base64");
  return b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);
}

/** Row-wise comparison with torch's rows: whole rows, or torch's top entries of each row. */
class TorchRows {
  private values: Float32Array;
  private ids: Int32Array | null;
  private scale: Float32Array | null;
  private width: number;
  constructor(
    p: PackedRows,
    private vocab: number,
  ) {
    this.values = new Float32Array(bytes(p.values));
    this.ids = p.format === "top" ? new Int32Array(bytes(p.ids!)) : null;
    this.scale = p.format === "top" ? new Float32Array(bytes(p.rowMaxAbs!)) : null;
    this.width = p.format === "top" ? p.k! : vocab;
    expect(this.values.length).toBe(p.rows * this.width);
  }
  get rows(): number {
    return this.values.length / this.width;
  }
  /** max |ref - torch| / max |torch logit| over the row's stored entries. */
  relDiff(r: number, ref: Float32Array): number {
    expect(ref.length).toBe(this.vocab);
    let diff = 0;
    let scale = this.scale ? this.scale[r]! : 0;
    for (let i = 0; i < this.width; i++) {
      const v = this.values[r * this.width + i]!;
      const id = this.ids ? this.ids[r * this.width + i]! : i;
      diff = Math.max(diff, Math.abs(ref[id]! - v));
      if (!this.scale) scale = Math.max(scale, Math.abs(v));
    }
    return diff / scale;
  }
}

function fixture(name: string): TorchFixture {
  return JSON.parse(readFileSync(join(import.meta.dir, "fixtures", `torch-${name}.json`), "utf8"));
}

/** Worst relative difference over rows, checked against the tolerance with the row named. */
function expectRows(what: string, torch: TorchRows, ref: Float32Array[], worst: { v: number; tol: number }): void {
  expect({ what, rows: ref.length }).toEqual({ what, rows: torch.rows });
  ref.forEach((row, r) => {
    const d = torch.relDiff(r, row);
    worst.v = Math.max(worst.v, d);
    if (process.env.DUMP_ROWS) console.log(what, r, d.toExponential(2));
    if (d >= worst.tol) expect({ what, row: r, relDiff: d }).toEqual({ what, row: r, relDiff: 0 });
  });
}

/** Runs generateGreedy with drafts, recording every verify batch's and MTP row's logits in order. */
function recordSpeculative(model: ReferenceModel, prompt: number[], run: SpecRun) {
  const verify: Float32Array[] = [];
  const chain: Float32Array[] = [];
  const forward = model.forward.bind(model);
  const mtpForward = model.mtpForward.bind(model);
  let firstOfPropose = true;
  const m = Object.create(model) as ReferenceModel;
  m.forward = (state: SequenceState, tokens: number[], opts: ForwardOptions = {}) => {
    const r = forward(state, tokens, opts);
    if (opts.snapshots) verify.push(...r.logits);
    firstOfPropose = true;
    return r;
  };
  m.mtpForward = (state: SequenceState, hidden: Float32Array[], tokens: number[]) => {
    const r = mtpForward(state, hidden, tokens);
    // A propose runs the catch-up rows (the last one seeds the first draft), then one row per chained draft.
    chain.push(firstOfPropose ? r.logits[r.logits.length - 1]! : r.logits[0]!);
    firstOfPropose = false;
    return r;
  };
  const g = generateGreedy(m, prompt, { maxTokens: run.maxTokens, drafts: run.drafts });
  return { g, verify, chain };
}

function agreementTests(name: string, tolerance: number, load: () => Promise<ReferenceModel>) {
  const fx = fixture(name);
  const worst = { v: 0, tol: tolerance };
  let model: ReferenceModel;
  const ready = async () => (model ??= await load());

  test(`${name}: prompt logits and MTP catch-up rows`, async () => {
    const m = await ready();
    expect(fx.vocab).toBe(m.config.vocab_size);
    const state = m.newState();
    const r = m.forward(state, fx.prompt);
    expectRows("prompt", new TorchRows(fx.logits, fx.vocab), r.logits, worst);
    if (m.hasMtp) {
      const mtp = m.mtpForward(state, r.hidden.slice(0, -1), fx.prompt.slice(1));
      expectRows("mtp catch-up", new TorchRows(fx.mtpLogits!, fx.vocab), mtp.logits, worst);
    }
  });

  test(`${name}: token-by-token decode of ${fx.decode.tokens.length - fx.prompt.length} greedy tokens`, async () => {
    const m = await ready();
    const seq = fx.decode.tokens;
    const state = m.newState();
    const rows: Float32Array[] = [];
    for (const t of seq) rows.push(m.forward(state, [t]).logits[0]!);
    expectRows("decode", new TorchRows(fx.decode.logits, fx.vocab), rows, worst);
    // torch's greedy tokens are the reference's.
    const g = generateGreedy(m, fx.prompt, { maxTokens: seq.length - fx.prompt.length });
    expect(g.tokens).toEqual(seq.slice(fx.prompt.length));
  });

  for (const run of fx.spec ?? []) {
    test(`${name}: speculative decoding with ${run.drafts} draft(s): torch's drafts, accepts, tokens and rows`, async () => {
      const m = await ready();
      const { g, verify, chain } = recordSpeculative(m, fx.prompt, run);
      expect(g.tokens).toEqual(run.tokens);
      expect({ byPosition: g.drafts!.byPosition, proposedByPosition: g.drafts!.proposedByPosition }).toEqual({
        byPosition: run.byPosition,
        proposedByPosition: run.proposedByPosition,
      });
      expectRows("verify rows", new TorchRows(run.verify, fx.vocab), verify, worst);
      if (run.chain) expectRows("MTP draft rows", new TorchRows(run.chain, fx.vocab), chain, worst);
      // The drafts themselves, step by step: each MTP row's argmax.
      const drafts = run.steps.flatMap((s) => s.drafts);
      expect(chain.map((row) => row.indexOf(Math.max(...row)))).toEqual(drafts);
    });
  }

  test(`${name}: worst relative difference`, () => {
    console.log(`torch agreement ${name}: worst |ref - torch| / max|logit| = ${worst.v.toExponential(2)} (tolerance ${tolerance})`);
    expect(worst.v).toBeGreaterThan(0);
    expect(worst.v).toBeLessThan(tolerance);
  });
}

describe("PyTorch qwen4-exp agrees with lib/reference", () => {
  for (const c of CHECK_CASES) {
    const fx = fixture(c.name);
    test(`${c.name}: the fixture was made for this case`, () => {
      expect(fx.prompt).toEqual(c.prompt);
      expect(fx.seed).toBe(c.seed);
    });
    agreementTests(c.name, TOLERANCE_RANDOM, async () => new ReferenceModel(caseWeights(c)));
  }
  agreementTests(TRAINED_CASE.name, TOLERANCE_TRAINED, async () => new ReferenceModel(await openModel(TRAINED_CASE.dir)));

  test("the trained model's drafts really get accepted, chained ones included", () => {
    const runs = fixture(TRAINED_CASE.name).spec!;
    for (const r of runs) expect(r.byPosition[r.drafts - 1]!).toBeGreaterThan(0);
    // Partial accepts (rollbacks after an accepted draft) happen too.
    expect(runs.some((r) => r.steps.some((s) => s.accepted > 0 && s.accepted < s.drafts.length))).toBe(true);
  });
});
