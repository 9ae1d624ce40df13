// The sampling definition (lib/reference/sampling.ts, docs/sampling.md): the uniform's exact
// bits, the penalties as defined, the filters, and statistical tests that drawn frequencies
// follow softmax(z / T) after top-k / top-p / min-p, with and without speculative drafts.
//
// Statistical tests: chi-square goodness of fit at a critical value whose upper-tail
// probability is 1e-6 (Wilson-Hilferty), so a correct sampler fails one of them with
// probability about 1e-6 per test over the choice of seed; the seeds are fixed, so each test
// is deterministic. A wrong distribution (a filter off by one token, a missing residual)
// moves the statistic by hundreds or thousands at these sample sizes.
import { describe, expect, test } from "bun:test";

import {
  Draw,
  drawIndex,
  PenaltyCounts,
  sampleToken,
  samplingDistribution,
  samplingParams,
  samplingUniform,
  speculativeTokens,
  tokenLogprobs,
  transformLogits,
  type SamplingOptions,
} from "../../lib/reference/sampling.ts";
import { softmax } from "../../lib/reference/ops.ts";
import { chiSquare, chiSquareCritical } from "./statistics.ts";

/** The expected distribution written independently: softmax(z / T), then the filters by rank. */
function expected(z: number[], T: number, topK: number, topP: number, minP: number): number[] {
  const p = Array.from(softmax(Float32Array.from(z, (v) => v / T)));
  const order = p.map((_, i) => i).sort((a, b) => p[b]! - p[a]! || a - b);
  const keep = new Set(order.slice(0, topK > 0 ? topK : p.length));
  const keptMass = [...keep].reduce((s, i) => s + p[i]!, 0);
  let acc = 0;
  const nucleus = new Set<number>();
  for (const i of order) {
    if (!keep.has(i)) break;
    nucleus.add(i);
    acc += p[i]! / keptMass;
    if (acc >= topP) break;
  }
  const pmax = p[order[0]!]!;
  const out = p.map((v, i) => (nucleus.has(i) && v >= minP * pmax ? v : 0));
  const s = out.reduce((a, b) => a + b, 0);
  return out.map((v) => v / s);
}

// Distinct logits (no ties), so the filters keep an exact number of tokens.
const Z = [2.1, -0.3, 1.4, 0.9, 3.0, -1.2, 0.2, 1.9, -2.5, 0.55, 1.05, -0.8];

describe("the uniform u(seed, position, draw)", () => {
  test("its bits follow the documented recipe (splitmix64 chain, top 24 bits)", () => {
    // Computed by hand from the recipe in docs/sampling.md (BigInt, independent of the code).
    const M = (1n << 64n) - 1n;
    const G = 0x9e3779b97f4a7c15n;
    const mix = (z: bigint) => {
      z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & M;
      z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & M;
      return z ^ (z >> 31n);
    };
    for (const [seed, pos, draw] of [[0, 0, 0], [42, 7, 1], [2 ** 53 - 1, 123456, 3]] as const) {
      const h = mix((mix((mix((BigInt(seed) + G) & M) + BigInt(pos) + G) & M) + BigInt(draw) + G) & M);
      expect(samplingUniform(seed, pos, draw)).toBe(Number(h >> 40n) / 2 ** 24);
    }
    // Pinned values: a change of the recipe changes every seeded output, so it must be deliberate.
    expect(samplingUniform(0, 0, 0) * 2 ** 24).toBe(Math.round(samplingUniform(0, 0, 0) * 2 ** 24));
    expect([samplingUniform(1, 2, 0), samplingUniform(1, 2, 1), samplingUniform(1, 3, 0)].map((u) => Math.round(u * 2 ** 24))).toEqual(
      [samplingUniform(1, 2, 0), samplingUniform(1, 2, 1), samplingUniform(1, 3, 0)].map((u) => u * 2 ** 24),
    );
  });

  test("is uniform: 20000 positions in 20 bins pass a chi-square test", () => {
    const bins = new Array(20).fill(0);
    const n = 20000;
    for (let i = 0; i < n; i++) bins[Math.floor(samplingUniform(9, i, 0) * 20)]++;
    const { stat, df } = chiSquare(bins, new Array(20).fill(1 / 20), n);
    expect(stat).toBeLessThan(chiSquareCritical(df));
  });
});

describe("the transform", () => {
  test("penalties as defined: repetition on the context, presence and frequency on generated tokens", () => {
    const p = samplingParams({ temperature: 2, repetitionPenalty: 2, presencePenalty: 0.5, frequencyPenalty: 0.25 });
    const counts = new PenaltyCounts(6);
    counts.add(0, false); // prompt
    counts.add(1, false);
    counts.add(1, true); // prompt and generated
    counts.add(2, true);
    counts.add(2, true);
    const y = transformLogits([4, -4, 4, 4, -4, 1], p, counts, [3]);
    // 0: 4/2 = 2, /T -> 1. 1: -4*2 = -8, generated once: -8 - (0.25 + 0.5) = -8.75, /2. 2: 4/2 = 2, twice: 2 - (0.5 + 0.5) = 1, /2.
    // 3: an extra (a draft earlier in the step) counts as generated once: 4/2 - 0.75 = 1.25, /2. 4, 5: untouched, /2.
    expect(Array.from(y)).toEqual([1, -4.375, 0.5, 0.625, -2, 0.5]);
  });

  test("top-k keeps ties at the k-th value; top-p keeps the smallest top set reaching the mass; min-p is relative to the max", () => {
    const z = [1, 3, 3, 2, 0];
    expect(Array.from(samplingDistribution(z, samplingParams({ temperature: 1, topK: 2 }))).map((v) => v > 0)).toEqual([false, true, true, false, false]);
    expect(Array.from(samplingDistribution(z, samplingParams({ temperature: 1, topK: 3 }))).map((v) => v > 0)).toEqual([false, true, true, true, false]);
    // p = softmax(z): the two 3s hold 0.78 of the mass: top-p 0.5 keeps both (ties kept).
    expect(Array.from(samplingDistribution(z, samplingParams({ temperature: 1, topP: 0.5 }))).map((v) => v > 0)).toEqual([false, true, true, false, false]);
    expect(Array.from(samplingDistribution(z, samplingParams({ temperature: 1, topP: 0.9 }))).map((v) => v > 0)).toEqual([false, true, true, true, false]);
    // min-p 0.3: e^(2-3) = 0.37 kept, e^(1-3) = 0.14 not.
    expect(Array.from(samplingDistribution(z, samplingParams({ temperature: 1, minP: 0.3 }))).map((v) => v > 0)).toEqual([false, true, true, true, false]);
    // temperature 0: one-hot on the lowest id among the maxima.
    expect(Array.from(samplingDistribution(z, samplingParams({ temperature: 0 })))).toEqual([0, 1, 0, 0, 0]);
  });

  test("options are validated with errors that name them", () => {
    expect(() => samplingParams({ temperature: -1 })).toThrow(/temperature/);
    expect(() => samplingParams({ topP: 0 })).toThrow(/topP/);
    expect(() => samplingParams({ topK: 1.5 })).toThrow(/topK/);
    expect(() => samplingParams({ minP: 2 })).toThrow(/minP/);
    expect(() => samplingParams({ repetitionPenalty: 0 })).toThrow(/repetitionPenalty/);
  });

  test("drawIndex walks ids in order: the lowest id whose running sum exceeds u * total", () => {
    expect(drawIndex([0, 1, 1, 2], 0)).toBe(1);
    expect(drawIndex([0, 1, 1, 2], 0.2499)).toBe(1);
    expect(drawIndex([0, 1, 1, 2], 0.25)).toBe(2);
    expect(drawIndex([0, 1, 1, 2], 0.9999)).toBe(3);
  });

  test("logprobs are log_softmax of the raw logits, the top list by value then id", () => {
    const z = [0.5, 2, -1, 2, 1];
    const lp = tokenLogprobs(z, 4, 3);
    const sm = softmax(Float32Array.from(z));
    expect(lp.logprob).toBeCloseTo(Math.log(sm[4]!), 6);
    expect(lp.top.map((t) => t.id)).toEqual([1, 3, 4]);
    lp.top.forEach((t) => expect(t.logprob).toBeCloseTo(Math.log(sm[t.id]!), 6));
  });
});

describe("statistics: sampled frequencies follow the filtered softmax(z / T)", () => {
  const CASES: [string, SamplingOptions][] = [
    ["T = 1", { temperature: 1 }],
    ["T = 0.7, top-k 5", { temperature: 0.7, topK: 5 }],
    ["T = 1.5, top-p 0.8", { temperature: 1.5, topP: 0.8 }],
    ["T = 1, min-p 0.1", { temperature: 1, minP: 0.1 }],
    ["T = 0.9, top-k 8, top-p 0.9, min-p 0.05", { temperature: 0.9, topK: 8, topP: 0.9, minP: 0.05 }],
  ];
  const N = 20000;

  test.each(CASES)("%s", (_, o) => {
    const params = samplingParams(o);
    const want = expected(Z, params.temperature, params.topK, params.topP, params.minP);
    const dist = samplingDistribution(Z, params);
    want.forEach((v, i) => expect(dist[i]!).toBeCloseTo(v, 6));
    const counts = new Array(Z.length).fill(0);
    for (let i = 0; i < N; i++) counts[sampleToken(Z, { params, seed: 2024, position: i })]++;
    const { stat, df } = chiSquare(counts, want, N);
    expect(stat).toBeLessThan(chiSquareCritical(df));
  });

  test.each(CASES.slice(1, 4))("speculative, 2 drafts from another distribution: %s", (_, o) => {
    // Target rows p0, p1 (fixed, as if the model ignored the prefix) and draft rows from
    // other logits. A generation of two tokens: one speculative step (speculativeTokens), and
    // a plain step when it stopped after one token. The pair must be distributed as p0 x p1.
    const params = samplingParams(o);
    const z0 = Z;
    const z1 = Z.map((_, i) => Z[(i * 5) % Z.length]! * 0.8);
    const zq0 = Z.map((v, i) => (i % 3 === 0 ? v + 1.5 : -v));
    const zq1 = Z.map((v) => v * 0.3);
    const [p0, p1, q0, q1] = [z0, z1, zq0, zq1].map((z) => samplingDistribution(z, params));
    const V = Z.length;
    const counts = new Array(V * V).fill(0);
    const N2 = 12000;
    let acceptedDrafts = 0;
    for (let seed = 0; seed < N2; seed++) {
      const s = { params, seed, position: 10 };
      const d0 = drawIndex(q0!, samplingUniform(seed, 10, Draw.draft));
      const d1 = drawIndex(q1!, samplingUniform(seed, 11, Draw.draft));
      const r = speculativeTokens([z0, z1, z0], [d0, d1], [q0!, q1!], s);
      acceptedDrafts += r.accepted;
      const t0 = r.tokens[0]!;
      const t1 = r.tokens.length > 1 ? r.tokens[1]! : drawIndex(p1!, samplingUniform(seed, 11, Draw.sample));
      counts[t0 * V + t1]++;
    }
    const want = Array.from({ length: V * V }, (_, c) => p0![Math.floor(c / V)]! * p1![c % V]!);
    const { stat, df } = chiSquare(counts, want, N2);
    expect(stat).toBeLessThan(chiSquareCritical(df));
    // The drafts were accepted often (the test exercises acceptance and rejection).
    expect(acceptedDrafts).toBeGreaterThan(N2 * 0.2);
    expect(acceptedDrafts).toBeLessThan(N2 * 1.9);
  });
});
