// kernels/sampling.metal through lib/gpu/sampling.ts against the reference sampler
// (lib/reference/sampling.ts): the drawn token for many (seed, position) pairs, the
// distribution after penalties, temperature, top-k, top-p and min-p, the verification of
// drafts, greedy one-hot rows and the logprobs of the raw logits.
import { afterAll, describe, expect, test } from "bun:test";

import { encodeSample, MAX_TOP_LOGPROBS, SamplingScratch, type SampleArgs } from "../../lib/gpu/sampling.ts";
import {
  Draw,
  PenaltyCounts,
  sampleToken,
  samplingDistribution,
  samplingParams,
  tokenLogprobs,
  verifyDraft,
  type SamplingOptions,
} from "../../lib/reference/sampling.ts";
import { chiSquare, chiSquareCritical } from "../reference/statistics.ts";
import { expectClose, expectExact, openDevice, rng, rows, run, uploadF32, uploadI32 } from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());

const CASES: [string, SamplingOptions][] = [
  ["temperature 1", { temperature: 1 }],
  ["temperature 0.7, top-k 40", { temperature: 0.7, topK: 40 }],
  ["top-p 0.9", { temperature: 1.3, topP: 0.9 }],
  ["min-p 0.05", { temperature: 1, minP: 0.05 }],
  ["all filters", { temperature: 0.8, topK: 50, topP: 0.8, minP: 0.02 }],
  ["penalties", { temperature: 1, repetitionPenalty: 1.3, presencePenalty: 0.5, frequencyPenalty: 0.25 }],
  ["greedy with penalties", { temperature: 0, repetitionPenalty: 1.5, frequencyPenalty: 1 }],
];

/** Logits with ties (on a 1/8 grid) and a few peaks, as a real row has. */
function logitRows(nb: number, vocab: number, seed: number): Float32Array {
  const r = rng(seed, "sample-logits");
  const z = new Float32Array(nb * vocab);
  for (let i = 0; i < z.length; i++) z[i] = Math.round(r.symmetric() * 24) / 8 + (r.next() < 0.01 ? 4 : 0);
  return z;
}

function scratchFor(vocab: number, nb: number) {
  return new SamplingScratch(dev, vocab, nb, nb);
}

describe("sample_f32", () => {
  test.each(CASES)("%s: the drawn tokens and the distribution equal the reference's", (_, opts) => {
    const params = samplingParams(opts);
    const [nb, vocab] = [5, 700];
    const z = logitRows(nb, vocab, 3);
    const counts = new PenaltyCounts(vocab);
    const r = rng(9, "context");
    for (let i = 0; i < 60; i++) counts.add(r.int(vocab), i >= 40);
    const extras = [z.subarray(0, vocab).indexOf(Math.max(...z.subarray(0, vocab))), 5, 7, 5];
    const scratch = scratchFor(vocab, nb);
    const lb = uploadF32(dev, z);
    const countsBuf = uploadI32(dev, counts.data);
    const exBuf = uploadI32(dev, extras);
    const seeds = [1, 77, 2 ** 40 + 3];
    for (const seed of seeds) {
      for (const position of [0, 1, 12345]) {
        const a: SampleArgs = {
          params,
          seed,
          rows: nb,
          position,
          draw: Draw.sample,
          counts: countsBuf,
          extras: exBuf,
          extrasBase: 0,
          verify: null,
          qRow: 0,
          topLogprobs: null,
        };
        run(dev, (ctx) => encodeSample(ctx, rows(lb, vocab), scratch, a));
        const want: number[] = [];
        for (let row = 0; row < nb; row++) {
          const zr = z.subarray(row * vocab, (row + 1) * vocab);
          const ex = extras.slice(0, Math.min(row, extras.length));
          want.push(sampleToken(zr, { params, seed, position: position + row, counts, extras: ex }));
          const dist = samplingDistribution(zr, params, counts, ex);
          expectClose(scratch.q.f32.subarray(row * vocab, (row + 1) * vocab), dist, { abs: 2e-6, rel: 1e-4 }, `sample_f32 distribution row ${row}`);
        }
        expectExact(scratch.ids.i32.subarray(0, nb), want, `sample_f32 ids seed ${seed} position ${position}`);
      }
    }
    scratch.release();
  });

  test.each([
    ["flat: more candidates than the threadgroup list (the full scan)", 3, 0.99],
    ["peaked: few candidates, bisected in threadgroup memory", 0.25, 0.9],
  ])("top-p over 5003 tokens, %s", (_, temperature, topP) => {
    const params = samplingParams({ temperature, topP });
    const [nb, vocab] = [3, 5003];
    const z = logitRows(nb, vocab, 12);
    const scratch = scratchFor(vocab, nb);
    for (const seed of [4, 5]) {
      run(dev, (ctx) =>
        encodeSample(ctx, rows(uploadF32(dev, z), vocab), scratch, {
          params, seed, rows: nb, position: 9, draw: 0, counts: null, extras: null, extrasBase: 0, verify: null, qRow: 0, topLogprobs: null,
        }),
      );
      const want = Array.from({ length: nb }, (_, r) => sampleToken(z.subarray(r * vocab, (r + 1) * vocab), { params, seed, position: 9 + r }));
      expectExact(scratch.ids.i32.subarray(0, nb), want, `top-p ids seed ${seed}`);
      for (let r = 0; r < nb; r++) {
        const dist = samplingDistribution(z.subarray(r * vocab, (r + 1) * vocab), params);
        expectClose(scratch.q.f32.subarray(r * vocab, (r + 1) * vocab), dist, { abs: 2e-6, rel: 1e-4 }, `top-p distribution row ${r}`);
        // The two cases really are on either side of the list size (2048): candidates are the
        // tokens with exp(y - max) >= (1 - topP) W / (2 vocab).
        const y = Array.from(z.subarray(r * vocab, (r + 1) * vocab), (v) => v / temperature);
        const m = Math.max(...y);
        const W = y.reduce((a, v) => a + Math.exp(v - m), 0);
        const candidates = y.filter((v) => Math.exp(v - m) >= ((1 - topP) * W) / (2 * vocab)).length;
        if (temperature > 1) expect(candidates).toBeGreaterThan(2048);
        else {
          expect(candidates).toBeLessThan(2048);
          expect(candidates).toBeLessThan(vocab); // some excluded: the known-yes shortcut runs
        }
      }
    }
    scratch.release();
  });

  test("verification of drafts: accept/reject and the residual draw equal the reference's", () => {
    const params = samplingParams({ temperature: 1, topK: 30 });
    const [nb, vocab] = [4, 300];
    const z = logitRows(nb, vocab, 5);
    const zq = logitRows(nb, vocab, 6);
    const scratch = scratchFor(vocab, nb);
    let accepted = 0;
    let rejected = 0;
    for (let seed = 0; seed < 12; seed++) {
      // Draft distributions q (from other logits) and drafts drawn from them.
      const qs = Array.from({ length: nb }, (_, r) => samplingDistribution(zq.subarray(r * vocab, (r + 1) * vocab), params));
      const drafts = qs.map((q, r) => sampleToken(zq.subarray(r * vocab, (r + 1) * vocab), { params, seed, position: 50 + r }, Draw.draft));
      scratch.q.f32.set(qs.flatMap((q) => Array.from(q)));
      const a: SampleArgs = {
        params,
        seed,
        rows: nb,
        position: 50,
        draw: Draw.sample,
        counts: null,
        extras: null,
        extrasBase: 0,
        verify: { rows: nb - 1, drafts: uploadI32(dev, drafts) },
        qRow: null,
        topLogprobs: null,
      };
      run(dev, (ctx) => encodeSample(ctx, rows(uploadF32(dev, z), vocab), scratch, a));
      for (let r = 0; r < nb; r++) {
        const zr = z.subarray(r * vocab, (r + 1) * vocab);
        const p = samplingDistribution(zr, params);
        if (r < nb - 1) {
          const v = verifyDraft(p, scratch.q.f32.subarray(r * vocab, (r + 1) * vocab), drafts[r]!, seed, 50 + r);
          expect({ row: r, token: scratch.ids.i32[r], accepted: scratch.accepted.i32[r] === 1 }).toEqual({ row: r, token: v.token, accepted: v.accepted });
          if (v.accepted) accepted++;
          else rejected++;
        } else {
          expect(scratch.ids.i32[r]).toBe(sampleToken(zr, { params, seed, position: 50 + r }));
        }
      }
    }
    // Both branches ran.
    expect(accepted).toBeGreaterThan(0);
    expect(rejected).toBeGreaterThan(0);
    scratch.release();
  });

  test("temperature 0 is one-hot on the argmax (ties to the lowest id); a draft survives only as the argmax", () => {
    const params = samplingParams({ temperature: 0 });
    const vocab = 64;
    const z = new Float32Array(2 * vocab);
    z[10] = 3;
    z[20] = 3; // tie: 10 wins
    z[vocab + 40] = 1;
    const scratch = scratchFor(vocab, 2);
    run(dev, (ctx) =>
      encodeSample(ctx, rows(uploadF32(dev, z), vocab), scratch, {
        params, seed: 3, rows: 2, position: 0, draw: 0, counts: null, extras: null, extrasBase: 0,
        verify: { rows: 2, drafts: uploadI32(dev, [10, 41]) }, qRow: null, topLogprobs: null,
      }),
    );
    expectExact(scratch.ids.i32.subarray(0, 2), [10, 40], "greedy ids");
    expectExact(scratch.accepted.i32.subarray(0, 2), [1, 0], "greedy verification");
    scratch.release();
  });

  test.each([0, 3, MAX_TOP_LOGPROBS])("logprobs with %i alternatives equal log_softmax of the raw logits", (top) => {
    const params = samplingParams({ temperature: 0.9, repetitionPenalty: 2 });
    const [nb, vocab] = [3, 5003];
    const z = logitRows(nb, vocab, 8);
    const scratch = scratchFor(vocab, nb);
    const counts = uploadI32(dev, new Int32Array(2 * vocab).fill(1));
    run(dev, (ctx) =>
      encodeSample(ctx, rows(uploadF32(dev, z), vocab), scratch, {
        params, seed: 11, rows: nb, position: 4, draw: 0, counts, extras: null, extrasBase: 0, verify: null, qRow: null, topLogprobs: top,
      }),
    );
    for (let r = 0; r < nb; r++) {
      const id = scratch.ids.i32[r]!;
      const want = tokenLogprobs(z.subarray(r * vocab, (r + 1) * vocab), id, top);
      const got = scratch.logprobs(r, top);
      expectClose([got.logprob, ...got.top.map((t) => t.logprob)], [want.logprob, ...want.top.map((t) => t.logprob)], { abs: 2e-5 }, `logprobs row ${r}`);
      expectExact(got.top.map((t) => t.id), want.top.map((t) => t.id), `top ids row ${r}`);
    }
    scratch.release();
  });
});

describe("sample_f32 statistics (chi-square, false-failure probability about 1e-6 per test; see spec/reference/sampling.test.ts)", () => {
  const Z = [2.1, -0.3, 1.4, 0.9, 3.0, -1.2, 0.2, 1.9, -2.5, 0.55, 1.05, -0.8];
  const V = Z.length;
  const B = 1024; // rows per dispatch (MAX_NB)
  const N = 3 * B;
  const params = samplingParams({ temperature: 0.9, topK: 8, topP: 0.95, minP: 0.03 });

  test("plain draws over 3072 positions follow the filtered softmax(z / T)", () => {
    const z = new Float32Array(B * V);
    for (let r = 0; r < B; r++) z.set(Z, r * V);
    const zb = uploadF32(dev, z);
    const scratch = new SamplingScratch(dev, V, B, 1);
    const counts = new Array(V).fill(0);
    for (let b = 0; b < N / B; b++) {
      run(dev, (ctx) =>
        encodeSample(ctx, rows(zb, V), scratch, {
          params, seed: 77, rows: B, position: b * B, draw: Draw.sample, counts: null, extras: null, extrasBase: 0, verify: null, qRow: null, topLogprobs: null,
        }),
      );
      for (const id of scratch.ids.i32.subarray(0, B)) counts[id]++;
    }
    const { stat, df } = chiSquare(counts, samplingDistribution(Z, params), N);
    expect(stat).toBeLessThan(chiSquareCritical(df));
    scratch.release();
  });

  test("verifying 3072 drafts drawn from another distribution leaves the target distribution (rejection sampling)", () => {
    const zq = Z.map((v, i) => (i % 3 === 0 ? v + 1.5 : -v));
    const q = samplingDistribution(zq, params);
    const z = new Float32Array(B * V);
    for (let r = 0; r < B; r++) z.set(Z, r * V);
    const zb = uploadF32(dev, z);
    const scratch = new SamplingScratch(dev, V, B, B);
    const qf = Float32Array.from(q);
    for (let r = 0; r < B; r++) scratch.q.f32.set(qf, r * V);
    const counts = new Array(V).fill(0);
    let acc = 0;
    for (let b = 0; b < N / B; b++) {
      // Row r verifies a draft drawn from q for position b * B + r.
      const drafts = Array.from({ length: B }, (_, r) => sampleToken(zq, { params, seed: 78, position: b * B + r }, Draw.draft));
      run(dev, (ctx) =>
        encodeSample(ctx, rows(zb, V), scratch, {
          params, seed: 78, rows: B, position: b * B, draw: Draw.sample, counts: null, extras: null, extrasBase: 0,
          verify: { rows: B, drafts: uploadI32(dev, drafts) }, qRow: null, topLogprobs: null,
        }),
      );
      for (const id of scratch.ids.i32.subarray(0, B)) counts[id]++;
      acc += scratch.accepted.i32.subarray(0, B).reduce((a, b) => a + b, 0);
    }
    const { stat, df } = chiSquare(counts, samplingDistribution(Z, params), N);
    expect(stat).toBeLessThan(chiSquareCritical(df));
    expect(acc).toBeGreaterThan(N * 0.1);
    expect(acc).toBeLessThan(N * 0.95);
    scratch.release();
  });
});
