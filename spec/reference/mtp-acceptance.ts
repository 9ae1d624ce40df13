// A model whose MTP drafts are accepted at rates known in advance, so that acceptance counts
// can be checked exactly (random MTP heads are never accepted, so they only exercise the
// reject-everything path).
//
// Construction, on the tiny preset with every feature on:
// - every sub-layer's output projection is zero (attention o, DeltaNet out, expert and shared
//   down, PLE v), so the streams stay multiples of the token embedding and the trunk is a
//   bigram model: h_t = RMSNorm(E[tok_t]) (final norm weights 0);
// - E[v] = [p_v ; s_v] with p_v a random unit vector of d-1 values, s_v = MARK for v in the
//   marked set W, else 0; lm_head row sigma(u) = E[u] / |E[u]|: the greedy next token after u is
//   sigma(u), a fixed permutation (u*7 + 3 mod vocab);
// - the MTP head reads only the token: mtp.fc = [diag(1, .., 1, -1) | 0], its attention and
//   MoE outputs zero, norms 0. For a token u outside W its out is RMSNorm(E[u]) and the draft is
//   sigma(u), the right one; for u in W the last coordinate flips, E[u] is no longer the best
//   match and the draft is sigma of another token: wrong.
// So a step whose newest token is `next` accepts drafts while next, sigma(next), ... stay
// outside W (expectedDrafts). The hidden input has no weight here: which hidden feeds a chained
// row is pinned by the torch agreement (spec/train) instead.
import { presetConfig } from "../../lib/convert/presets.ts";
import { dims, type ModelConfig } from "../../lib/model/config.ts";
import { denseTensorSpecs } from "../../lib/model/tensors.ts";
import { ModelWriter } from "../../lib/model/writer.ts";
import { Rng } from "../../lib/model/rng.ts";
import { RandomWeights, type ExpertWeights, type Weights } from "../../lib/model/weights.ts";

const MARK = 1.5;

export const sigma = (v: number, vocab: number) => (v * 7 + 3) % vocab;

export class AcceptanceWeights implements Weights {
  readonly config: ModelConfig;
  private base: RandomWeights;
  private over = new Map<string, Float32Array>();
  private zeroDown: Float32Array;

  /** marked(v): whether the MTP head drafts wrongly after token v. */
  constructor(
    seed: number,
    readonly marked: (v: number) => boolean,
  ) {
    const c = (this.config = presetConfig("tiny"));
    this.base = new RandomWeights(c, seed);
    const d = c.hidden_size;
    const V = c.vocab_size;
    const zero = (name: string) => this.over.set(name, new Float32Array(this.base.get(name).length));
    for (const name of this.base.config.layer_types.flatMap((_, l) => [`layers.${l}.attn.o`, `layers.${l}.dn.out`, `layers.${l}.moe.shared_down`, `layers.${l}.ple.v`, `layers.${l}.ple.v_bias`]))
      if (this.base.has(name)) zero(name);
    for (const name of ["mtp.attn.o", "mtp.moe.shared_down", "final_norm", "mtp.embed_norm", "mtp.hidden_norm", "mtp.norm"]) zero(name);
    this.zeroDown = new Float32Array(d * c.moe.intermediate);

    const rng = new Rng(seed, "acceptance-embed");
    const E = new Float32Array(V * d);
    for (let v = 0; v < V; v++) {
      let n = 0;
      for (let i = 0; i < d - 1; i++) n += (E[v * d + i] = rng.normal()) ** 2;
      for (let i = 0; i < d - 1; i++) E[v * d + i] = E[v * d + i]! / Math.sqrt(n);
      E[v * d + d - 1] = marked(v) ? MARK : 0;
    }
    const head = new Float32Array(V * d);
    for (let u = 0; u < V; u++) {
      const norm = Math.hypot(...E.subarray(u * d, (u + 1) * d));
      for (let i = 0; i < d; i++) head[sigma(u, V) * d + i] = E[u * d + i]! / norm;
    }
    const fc = new Float32Array(d * 2 * d);
    for (let i = 0; i < d; i++) fc[i * 2 * d + i] = i === d - 1 ? -1 : 1;
    this.over.set("embed", E).set("lm_head", head).set("mtp.fc", fc);
  }
  get(name: string): Float32Array {
    return this.over.get(name) ?? this.base.get(name);
  }
  has(name: string): boolean {
    return this.base.has(name);
  }
  expert(layer: number, e: number): ExpertWeights {
    return { ...this.base.expert(layer, e), down: this.zeroDown };
  }
  pleTable(layer: number, o: number, j: number): Float32Array {
    return this.base.pleTable(layer, o, j);
  }
}

export interface ExpectedDrafts {
  tokens: number[];
  byPosition: number[];
  proposedByPosition: number[];
}

/**
 * What greedy speculative decoding must do on AcceptanceWeights, derived from the
 * construction alone: tokens follow sigma; a step with newest token `next` and k drafts
 * accepts while next, sigma(next), .. are unmarked (at most k), then takes the bonus.
 */
export function expectedDrafts(prompt: number[], maxTokens: number, drafts: number, marked: (v: number) => boolean, vocab: number): ExpectedDrafts {
  const s = (v: number) => sigma(v, vocab);
  let next = s(prompt[prompt.length - 1]!);
  const tokens = [next];
  const byPosition = new Array<number>(drafts).fill(0);
  const proposedByPosition = new Array<number>(drafts).fill(0);
  while (tokens.length < maxTokens) {
    const k = Math.min(drafts, maxTokens - tokens.length - 1);
    let a = 0;
    for (let t = next; a < k && !marked(t); t = s(t)) a++;
    for (let j = 0; j < k; j++) proposedByPosition[j]! += 1;
    for (let j = 0; j < a; j++) byPosition[j]! += 1;
    for (let j = 0; j <= a; j++) tokens.push((next = s(next)));
  }
  return { tokens, byPosition, proposedByPosition };
}

/** Writes any Weights as an f32 model directory (no tokenizer), for the engine. */
export async function writeWeights(dir: string, weights: Weights): Promise<void> {
  const c = weights.config;
  const w = await ModelWriter.create(dir, c, { weights: "f32", source: { test: "spec/reference/mtp-acceptance.ts" } });
  for (const spec of denseTensorSpecs(c)) w.addDense(spec.name, weights.get(spec.name));
  for (let l = 0; l < dims(c).expertLayers; l++) for (let e = 0; e < c.moe.experts; e++) w.addExpert(l, e, weights.expert(l, e));
  const p = c.ple;
  if (p) for (const l of p.layers) p.orders.forEach((_, o) => {
    for (let j = 0; j < p.heads; j++) w.addPleTable(l, o, j, weights.pleTable(l, o, j));
  });
  await w.finish();
}
