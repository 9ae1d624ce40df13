// The MTP draft head (MODEL.md, follows vLLM `qwen3_next_mtp`): from the trunk's final
// hidden h at position t and the token at t+1 it predicts the token at t+2, through one
// dense attention + MoE layer with a plain residual and its own KV cache.
import type { ModelConfig } from "../model/config.ts";
import type { ExpertWeights } from "../model/weights.ts";
import { attentionLayer, type AttentionWeights } from "./attention.ts";
import { moeRow, type MoeWeights, type Routing } from "./moe.ts";
import { matvec, rmsNorm } from "./ops.ts";
import type { AttentionState } from "./state.ts";

/** The `mtp.*` tensors. */
export interface MtpWeights {
  embedNorm: Float32Array;
  hiddenNorm: Float32Array;
  /** [d, 2d]: input columns 0..d-1 take the embedding, d..2d-1 the hidden. */
  fc: Float32Array;
  mixerNorm: Float32Array;
  attention: AttentionWeights;
  moeNorm: Float32Array;
  moe: MoeWeights;
  norm: Float32Array;
}

export interface MtpRows {
  /** RMSNorm(x, mtp.norm) per row: the hidden fed back for a chained draft. */
  out: Float32Array[];
  /** Logits per row through the shared LM head; argmax = the draft. */
  logits: Float32Array[];
  /** Routing of the MTP layer's MoE per row. */
  routing: Routing[];
}

/**
 * Runs MTP rows (hidden[i], tokens[i]) at positions p0 + i, appending to the MTP cache.
 * `embed` is the token embedding, `lmHead` the LM head ([vocab, d] each); `expert(e)`
 * supplies expert e of expert layer L.
 */
export function mtpForward(
  w: MtpWeights,
  config: ModelConfig,
  state: AttentionState,
  embed: Float32Array,
  lmHead: Float32Array,
  expert: (e: number) => ExpertWeights,
  hidden: Float32Array[],
  tokens: number[],
  p0: number,
): MtpRows {
  const d = config.hidden_size;
  const eps = config.rms_norm_eps;
  const nb = tokens.length;
  if (hidden.length !== nb) throw new Error(`mtpForward: ${hidden.length} hidden rows for ${nb} tokens`);
  const X = new Float32Array(nb * d);
  const cat = new Float32Array(2 * d);
  for (let b = 0; b < nb; b++) {
    const t = tokens[b]!;
    rmsNorm(embed.subarray(t * d, (t + 1) * d), w.embedNorm, eps, {}, cat.subarray(0, d));
    rmsNorm(hidden[b]!, w.hiddenNorm, eps, {}, cat.subarray(d));
    matvec(w.fc, cat, X.subarray(b * d, (b + 1) * d), d, 2 * d);
  }
  const normed = (norm: Float32Array) => {
    const xs = new Float32Array(nb * d);
    for (let b = 0; b < nb; b++) rmsNorm(X.subarray(b * d, (b + 1) * d), norm, eps, {}, xs.subarray(b * d, (b + 1) * d));
    return xs;
  };
  const a = attentionLayer(w.attention, config, state, normed(w.mixerNorm), nb, p0);
  for (let i = 0; i < nb * d; i++) X[i] = X[i]! + a[i]!;
  const xs = normed(w.moeNorm);
  const routing: Routing[] = [];
  for (let b = 0; b < nb; b++) {
    const r = moeRow(w.moe, config, expert, xs.subarray(b * d, (b + 1) * d));
    routing.push(r.routing);
    for (let c = 0; c < d; c++) X[b * d + c] = X[b * d + c]! + r.y[c]!;
  }
  const vocab = config.vocab_size;
  const out: Float32Array[] = [];
  const logits: Float32Array[] = [];
  for (let b = 0; b < nb; b++) {
    const o = rmsNorm(X.subarray(b * d, (b + 1) * d), w.norm, eps);
    out.push(o);
    logits.push(matvec(lmHead, o, new Float32Array(vocab), vocab, d));
  }
  return { out, logits, routing };
}
