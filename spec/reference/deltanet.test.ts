// The chunked DeltaNet equals the recurrent definition, for single heads and whole layers.
import { describe, expect, test } from "bun:test";
import { presetConfig } from "../../lib/convert/presets.ts";
import { Rng } from "../../lib/model/rng.ts";
import { RandomWeights } from "../../lib/model/weights.ts";
import { deltanetChunked, deltanetLayer, deltanetStep, l2Normalize, SequenceState, type DeltaNetWeights } from "../../lib/reference/index.ts";
import { maxAbs, maxAbsDiff, randomArray } from "./fixtures.ts";

/** T steps of one head as the model feeds them: unit q, k (q scaled), beta in (0,1), g < 0. */
function headInputs(seed: number, T: number, dk: number, dv: number) {
  const rng = new Rng(seed, "dn-head");
  const q = randomArray(rng, T * dk);
  const k = randomArray(rng, T * dk);
  for (let t = 0; t < T; t++) {
    l2Normalize(q.subarray(t * dk, (t + 1) * dk));
    l2Normalize(k.subarray(t * dk, (t + 1) * dk));
    for (let i = 0; i < dk; i++) q[t * dk + i]! /= Math.sqrt(dk);
  }
  const v = randomArray(rng, T * dv, 2);
  const beta = Float32Array.from({ length: T }, () => rng.next());
  const g = Float32Array.from({ length: T }, () => -3 * rng.next() ** 2);
  const S0 = randomArray(rng, dk * dv, 0.5);
  return { q, k, v, beta, g, S0 };
}

describe("chunked DeltaNet = recurrent", () => {
  const T = 50;
  const dk = 16;
  const dv = 12;
  for (const seed of [1, 2]) {
    const inp = headInputs(seed, T, dk, dv);
    const S = inp.S0.slice();
    const want = new Float32Array(T * dv);
    for (let t = 0; t < T; t++)
      deltanetStep(
        S,
        inp.q.subarray(t * dk, (t + 1) * dk),
        inp.k.subarray(t * dk, (t + 1) * dk),
        inp.v.subarray(t * dv, (t + 1) * dv),
        inp.beta[t]!,
        inp.g[t]!,
        dk,
        dv,
        want.subarray(t * dv, (t + 1) * dv),
      );
    for (const chunk of [1, 2, 7, 16, 64]) {
      test(`one head, seed ${seed}, chunk ${chunk}: outputs and final state`, () => {
        const Sc = inp.S0.slice();
        const got = new Float32Array(T * dv);
        deltanetChunked(Sc, inp.q, inp.k, inp.v, inp.beta, inp.g, T, dk, dv, chunk, got);
        expect(maxAbsDiff(got, want)).toBeLessThan(1e-5 * Math.max(1, maxAbs(want)));
        expect(maxAbsDiff(Sc, S)).toBeLessThan(1e-5 * Math.max(1, maxAbs(S)));
      });
    }
  }

  test("a whole layer (conv window, GQA heads, gated norm) in chunks of 3 and 16 equals row-by-row", () => {
    const config = presetConfig("tiny");
    const w = new RandomWeights(config, 5);
    const p = "layers.0.dn.";
    const names = ["qkv", "z", "b", "a", "conv", "A_log", "dt_bias", "norm", "out"] as const;
    const weights = Object.fromEntries(names.map((n) => [n, w.get(p + n)])) as unknown as DeltaNetWeights;
    const nb = 20;
    const d = config.hidden_size;
    const xs = randomArray(new Rng(5, "dn-layer"), nb * d, 1.5);
    const recurrent = new SequenceState(config).deltanet[0]!;
    const want = deltanetLayer(weights, config, recurrent, xs, nb, { chunk: 0 });
    for (const chunk of [3, 16]) {
      const chunked = new SequenceState(config).deltanet[0]!;
      const got = deltanetLayer(weights, config, chunked, xs, nb, { chunk });
      expect(maxAbsDiff(got, want)).toBeLessThan(1e-5 * Math.max(1, maxAbs(want)));
      expect(maxAbsDiff(chunked.S, recurrent.S)).toBeLessThan(1e-5);
      expect(Array.from(chunked.conv)).toEqual(Array.from(recurrent.conv));
    }
  });
});
