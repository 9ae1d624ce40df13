// The MoE sub-layer (MODEL.md, follows Qwen3-Next `mlp`): a softmax router picks top-k
// routed experts, each a SiLU-gated MLP, plus an optional sigmoid-gated shared expert.
import type { ModelConfig } from "../model/config.ts";
import type { ExpertWeights } from "../model/weights.ts";
import { dot, matvec, sigmoid, silu, softmax, topKIndices } from "./ops.ts";

/** The dense MoE tensors of one layer (`layers.{l}.moe.*` or `mtp.moe.*`). */
export interface MoeWeights {
  router: Float32Array;
  shared: { gate: Float32Array; up: Float32Array; down: Float32Array; expertGate: Float32Array } | null;
}

export interface Routing {
  /** Expert ids in rank order (probability descending, ties: lower id). */
  experts: number[];
  /** Their weights: p_k, or p_k / sum of the chosen p when norm_topk_prob. */
  weights: number[];
}

/**
 * Router decision from the router logits: p = softmax(logits), top-k (ties: lower index,
 * compared on the logits, which order the experts as p does), weights normalised when asked.
 */
export function routerTopK(logits: Float32Array, k: number, normTopkProb: boolean): Routing {
  const p = softmax(logits);
  const experts = topKIndices(logits, k);
  let sum = 0;
  for (const e of experts) sum += p[e]!;
  const weights = experts.map((e) => Math.fround(normTopkProb ? p[e]! / sum : p[e]!));
  return { experts, weights };
}

/** A SiLU-gated MLP: down (SiLU(gate x) * up x), gate/up [I, d], down [d, I]. Adds scale * result to acc. */
export function gatedMlp(
  gate: Float32Array,
  up: Float32Array,
  down: Float32Array,
  x: Float32Array,
  d: number,
  I: number,
  scale: number,
  acc: Float32Array,
): void {
  const g = matvec(gate, x, new Float32Array(I), I, d);
  const u = matvec(up, x, new Float32Array(I), I, d);
  for (let i = 0; i < I; i++) g[i] = silu(g[i]!) * u[i]!;
  const y = matvec(down, g, new Float32Array(d), d, I);
  for (let c = 0; c < d; c++) acc[c] = acc[c]! + scale * y[c]!;
}

/**
 * The MoE of one normalised row x [d]: sum_k w_k E_{i_k}(x) + sigmoid(w_sg . x) Shared(x).
 * `expert(e)` supplies routed expert e of this layer. Returns the output and the routing.
 */
export function moeRow(
  w: MoeWeights,
  config: ModelConfig,
  expert: (e: number) => ExpertWeights,
  x: Float32Array,
): { y: Float32Array; routing: Routing } {
  const d = config.hidden_size;
  const m = config.moe;
  const logits = matvec(w.router, x, new Float32Array(m.experts), m.experts, d);
  const routing = routerTopK(logits, m.top_k, m.norm_topk_prob);
  const y = new Float32Array(d);
  routing.experts.forEach((e, i) => {
    const ew = expert(e);
    gatedMlp(ew.gate, ew.up, ew.down, x, d, m.intermediate, routing.weights[i]!, y);
  });
  if (w.shared) {
    const s = w.shared;
    gatedMlp(s.gate, s.up, s.down, x, d, m.shared_intermediate, sigmoid(dot(s.expertGate, x)), y);
  }
  return { y, routing };
}
