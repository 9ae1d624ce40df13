// Shared helpers of the reference tests: seeded random data and models of the tiny preset.
import { presetConfig, type Features } from "../../lib/convert/presets.ts";
import type { ModelConfig } from "../../lib/model/config.ts";
import { Rng } from "../../lib/model/rng.ts";
import { RandomWeights } from "../../lib/model/weights.ts";
import { ReferenceModel } from "../../lib/reference/index.ts";

/** A Float32Array of n values uniform in [-scale, scale). */
export function randomArray(rng: Rng, n: number, scale = 1): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = rng.symmetric() * scale;
  return a;
}

/** n token ids in [0, vocab), reproducible from the seed. */
export function randomTokens(seed: number, n: number, vocab: number): number[] {
  const rng = new Rng(seed, "tokens");
  return Array.from({ length: n }, () => rng.int(vocab));
}

export function tinyModel(seed: number, features: Features = {}, edit?: (c: ModelConfig) => void): ReferenceModel {
  const config = presetConfig("tiny", features);
  edit?.(config);
  return new ReferenceModel(new RandomWeights(config, seed));
}

/** Largest |a - b| over two equally long arrays. */
export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new Error(`length ${a.length} vs ${b.length}`);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

/** Largest |x| of an array. */
export function maxAbs(a: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]!));
  return m;
}

/**
 * Values x within an ulp or two of (n + 1/2) * scale whose quotient x / scale, rounded to f32,
 * lands exactly on n + 1/2 although the true quotient does not: an f32 division would round
 * them the wrong way; the q8 rule (docs/model.md) decides on the exact quotient.
 */
export function nearHalves(scale: number, count: number): number[] {
  const out: number[] = [];
  const f = new Float32Array(1);
  const u = new Int32Array(f.buffer);
  for (let n = 1; out.length < count && n < 126; n++) {
    f[0] = (n + 0.5) * scale;
    const mid = u[0]!;
    for (const step of [-2, -1, 1, 2]) {
      u[0] = mid + step;
      const x = f[0]!;
      if (Math.fround(x / scale) === n + 0.5 && x / scale !== n + 0.5) out.push(x);
    }
  }
  return out;
}
