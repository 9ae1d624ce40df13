/**
 * The matrix work of one prompt token, for bench:prefill's compute bound: 2 FLOPs per weight
 * of every matrix a prompt row multiplies by, i.e. every trunk tensor whose role is a matrix
 * (projections, PLE, shared expert), a small matrix (router, DeltaNet's a and b) or a
 * hyper-connection mixer (not norms, biases or convolution taps), and the top_k routed expert
 * records of each layer. The embedding is a
 * lookup, the LM head runs for the last row only and the MTP head not at all in a prefill, so
 * none of them counts; nor do attention's scores or the DeltaNet recurrence: leaving work out
 * keeps the bound an upper limit on tokens/s.
 */
import type { ModelConfig } from "../../lib/model/config.ts";
import { denseTensorSpecs, type TensorRole } from "../../lib/model/tensors.ts";

const MATRIX_ROLES = new Set<TensorRole>(["matrix", "small", "hcFn"]);

export function weightFlopsPerToken(c: ModelConfig, expertParts: readonly { shape: readonly number[] }[]): number {
  const trunk = denseTensorSpecs(c)
    .filter((t) => t.name.startsWith("layers.") && MATRIX_ROLES.has(t.role))
    .reduce((s, t) => s + t.shape[0]! * t.shape[1]!, 0);
  const record = expertParts.reduce((s, p) => s + p.shape.reduce((a, b) => a * b, 1), 0);
  return 2 * (trunk + c.num_layers * c.moe.top_k * record);
}
