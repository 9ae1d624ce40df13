// Logits only for the rows that need them (issue 19 item 3): a forward states which rows get
// the LM head and argmax ("all", "last", "none"); its result covers those rows only. "last"
// gives the token and margin "all" gives for that row, and the command buffers carry the LM
// head for the asked rows only (counted from the dispatches, lm-head-count.ts). Prefill with
// "all" still equals token by token row for row; the public API prefills with the cheap path.
// On an MTP model (every hidden row is final-read for the head), a plain one (no streams) and
// a hyper-connection model without MTP (only the asked rows are final-read, from row offsets).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import type { Backend, ForwardOptions, ForwardResult } from "../../lib/api/backend.ts";
import { Model } from "../../lib/api/model.ts";
import { ReferenceBackend } from "../../lib/api/reference-backend.ts";
import { openModel } from "../../lib/model/format.ts";
import { goldenCases, type GoldenCase } from "../golden/cases.ts";
import { buildGoldenModel } from "../golden/golden.ts";
import { BACKEND } from "../selected-backend.ts";
import { openEngine } from "./helpers.ts";
import { countLmHead, type LmHeadCount } from "./lm-head-count.ts";

const golden = (name: string) => goldenCases.find((c) => c.name === name)!;
const cases: GoldenCase[] = [
  golden("tiny-all-s1"),
  golden("tiny-plain-s4"),
  { name: "tiny-hc-nomtp-s9", preset: "tiny", features: { mtp: false }, seed: 9, dtype: "q4", prompt: golden("tiny-all-s1").prompt, maxTokens: 8 },
];
const dirs = new Map<string, string>();

beforeAll(async () => {
  for (const c of cases) dirs.set(c.name, await buildGoldenModel(c));
});
afterAll(() => {
  for (const d of dirs.values()) rmSync(d, { recursive: true, force: true });
});

/** One forward on a fresh sequence, with the LM-head dispatches it recorded. */
async function counted(backend: Backend, tokens: number[], opts: ForwardOptions): Promise<{ r: ForwardResult; lm: LmHeadCount }> {
  const seq = backend.newSequence();
  const probe = countLmHead({ vocab: backend.config.vocab_size, d: backend.config.hidden_size });
  try {
    const r = await seq.forward(tokens, opts);
    return { r, lm: probe.stop() };
  } finally {
    probe.stop();
    seq.dispose();
  }
}

describe("logit rows on the engine", () => {
  for (const c of cases) {
    test(`${c.name}: "last" = "all"'s last row, "none" computes none, the LM head runs for the asked rows only`, async () => {
      const n = c.prompt.length;
      for (const chunk of [n, 5]) {
        const backend = await openEngine(dirs.get(c.name)!, { prefillChunk: chunk });
        try {
          const all = await counted(backend, c.prompt, { logits: "all" });
          expect(all.r.first).toBe(0);
          expect(all.r.next.length).toBe(n);
          expect(all.lm.rows).toBe(n);
          const last = await counted(backend, c.prompt, { logits: "last" });
          expect({ chunk, first: last.r.first, next: last.r.next }).toEqual({ chunk, first: n - 1, next: [all.r.next[n - 1]!] });
          expect(Math.abs(last.r.margins[0]! - all.r.margins[n - 1]!)).toBeLessThan(1e-5);
          expect(last.lm).toEqual({ dispatches: 1, rows: 1 });
          const none = await counted(backend, c.prompt, { logits: "none" });
          expect({ first: none.r.first, next: none.r.next, margins: none.r.margins }).toEqual({ first: n, next: [], margins: [] });
          expect(none.lm).toEqual({ dispatches: 0, rows: 0 });
          // The default is "last".
          expect((await counted(backend, c.prompt, {})).r).toEqual(last.r);
        } finally {
          await backend.close();
        }
      }
    }, 120_000);

    test(`${c.name}: a prompt with "all" gives every row the token token-by-token steps give`, async () => {
      // The matvec for the whole prompt as for each row: on a GPU a prompt of GEMM_MIN_ROWS
      // rows or more takes the GEMM, whose bf16 operands move margins by ~2e-3 (its own bound
      // is gemm-prefill.test.ts's); what this test pins is the rows' selection.
      const saved = process.env.CHERENKOV_GEMM_MIN_ROWS;
      process.env.CHERENKOV_GEMM_MIN_ROWS = "100000";
      const backend = await openEngine(dirs.get(c.name)!);
      try {
        const batch = await backend.newSequence().forward(c.prompt, { logits: "all" });
        const seq = backend.newSequence();
        const rows: { next: number; margin: number }[] = [];
        for (const t of c.prompt) {
          const r = await seq.forward([t]);
          rows.push({ next: r.next[0]!, margin: r.margins[0]! });
        }
        // Tokens agree wherever the row is not within the kernels' error of a tie.
        for (let i = 0; i < rows.length; i++) {
          expect(Math.abs(batch.margins[i]! - rows[i]!.margin)).toBeLessThan(1e-3);
          if (rows[i]!.margin > 1e-3) expect({ row: i, next: batch.next[i] }).toEqual({ row: i, next: rows[i]!.next });
        }
        // A state advanced with "none" continues exactly as one advanced with "all".
        const a = backend.newSequence();
        const b = backend.newSequence();
        await a.forward(c.prompt, { logits: "all" });
        await b.forward(c.prompt, { logits: "none" });
        expect(await b.forward([7, 8])).toEqual(await a.forward([7, 8]));
      } finally {
        await backend.close();
        if (saved === undefined) delete process.env.CHERENKOV_GEMM_MIN_ROWS;
        else process.env.CHERENKOV_GEMM_MIN_ROWS = saved;
      }
    }, 120_000);
  }

  test("sampling needs the last row's logits: \"none\" with a sample request is refused", async () => {
    const backend = await openEngine(dirs.get("tiny-plain-s4")!);
    try {
      const sample = { params: { temperature: 0.8 }, seed: 1, counts: null, logprobs: null } as unknown as NonNullable<ForwardOptions["sample"]>;
      await expect(backend.newSequence().forward([1, 2, 3], { logits: "none", sample })).rejects.toThrow(/logits "none" computes no row/);
    } finally {
      await backend.close();
    }
  });
});

describe("logit rows on the reference backend", () => {
  test("the same rows as the engine: all, last, none", async () => {
    const c = cases[0]!;
    const files = await openModel(dirs.get(c.name)!);
    const reference = new ReferenceBackend(files, { prefillChunk: 5 });
    const engine = await openEngine(dirs.get(c.name)!, { prefillChunk: 5 });
    try {
      for (const logits of ["all", "last", "none"] as const) {
        const want = await engine.newSequence().forward(c.prompt, { logits });
        const got = await reference.newSequence().forward(c.prompt, { logits });
        expect({ logits, first: got.first, next: got.next }).toEqual({ logits, first: want.first, next: want.next });
      }
      // The reference model computes the asked rows' logits only.
      const model = reference.model;
      const r = model.forward(model.newState(), c.prompt, { logitRows: { from: 3, count: 2 } });
      expect({ from: r.logitsFrom, rows: r.logits.length, hidden: r.hidden.length }).toEqual({ from: 3, rows: 2, hidden: c.prompt.length });
    } finally {
      await reference.close();
      await engine.close();
    }
  }, 120_000);
});

describe("the public API prefills with the cheap path", () => {
  test("a 300-token prompt and 4 generated tokens run the LM head for 4 rows (one per token), greedy and sampled", async () => {
    const c = cases[0]!;
    const prompt = Array.from({ length: 300 }, (_, i) => c.prompt[i % c.prompt.length]!);
    const model = await Model.load(dirs.get(c.name)!, { backend: BACKEND, prefillChunk: 128 });
    try {
      for (const opts of [{}, { temperature: 0.7, seed: 3 }]) {
        const probe = countLmHead({ vocab: model.config.vocab_size, d: model.config.hidden_size });
        let tokens: number[];
        try {
          tokens = (await model.generate(prompt, { maxTokens: 4, stopAtEos: false, ...opts })).tokens;
        } finally {
          probe.stop();
        }
        expect(tokens.length).toBe(4);
        expect({ opts, rows: probe.count.rows }).toEqual({ opts, rows: 4 });
      }
    } finally {
      await model.close();
    }
  }, 120_000);
});
