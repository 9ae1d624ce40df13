// Deterministic random values for synthetic models. Every tensor draws from its own
// stream (seed, name), so a tensor's values do not depend on the order of generation and
// the writer can stream tensor by tensor while the tests rebuild any one tensor in memory.
import { Rng } from "./rng.ts";
import { numel, type TensorSpec } from "./tensors.ts";

export function initTensor(spec: TensorSpec, seed: number): Float32Array {
  const n = numel(spec.shape);
  const out = new Float32Array(n);
  const rng = new Rng(seed, spec.name);
  const fanIn = spec.shape.length === 2 ? spec.shape[1]! : spec.shape[0]!;
  switch (spec.role) {
    case "matrix":
    case "small":
    case "hcFn": {
      const s = 1 / Math.sqrt(fanIn);
      for (let i = 0; i < n; i++) out[i] = rng.symmetric() * s * 1.7;
      break;
    }
    case "norm":
      for (let i = 0; i < n; i++) out[i] = rng.normal() * 0.1;
      break;
    case "plainNorm":
      for (let i = 0; i < n; i++) out[i] = 1 + rng.normal() * 0.1;
      break;
    case "vector":
      for (let i = 0; i < n; i++) out[i] = rng.symmetric() * 0.5;
      break;
    case "aLog": // A = exp(A_log) in [1, 16], as Qwen3-Next initialises it
      for (let i = 0; i < n; i++) out[i] = Math.log(1 + rng.next() * 15);
      break;
    case "hcScale":
      for (let i = 0; i < n; i++) out[i] = 0.5 + rng.next();
      break;
  }
  return out;
}

/** Values of one PLE table (rows x head_dim), a plain embedding table. */
export function initPleTable(name: string, rows: number, headDim: number, seed: number): Float32Array {
  const rng = new Rng(seed, name);
  const out = new Float32Array(rows * headDim);
  for (let i = 0; i < out.length; i++) out[i] = rng.normal();
  return out;
}
