// Mixer B: gated attention with partial RoPE and QSA selection (MODEL.md, Qwen3-Next
// attention + a DSA-style indexer). Each row appends its K, V (and index key) to the caches
// first and then attends over positions 0..t read back from the caches.
import type { ModelConfig } from "../model/config.ts";
import { dot, matvec, rmsNorm, rmsNormHeads, ropeNeox, sigmoid, topKIndices } from "./ops.ts";
import type { AttentionState } from "./state.ts";
import type { KvCache } from "./kvcache.ts";

/** The tensors of one attention layer (`layers.{l}.attn.*` or `mtp.attn.*`). */
export interface AttentionWeights {
  q: Float32Array;
  gate: Float32Array;
  k: Float32Array;
  v: Float32Array;
  q_norm: Float32Array;
  k_norm: Float32Array;
  o: Float32Array;
  /** The QSA indexer (absent for dense attention, e.g. the MTP layer). */
  qsa: { iq: Float32Array; ik: Float32Array; ik_norm: Float32Array; iw: Float32Array } | null;
}

/**
 * QSA index scores of one row against cached index keys ik [count, di]:
 * score(s) = sum_h iw_h * relu(iq_h . ik_s) / sqrt(di), iq [Hi, di], iw [Hi].
 */
export function qsaScores(iq: Float32Array, iw: Float32Array, ik: Float32Array, count: number, Hi: number, di: number): Float32Array {
  const scores = new Float32Array(count);
  const norm = Math.sqrt(di);
  for (let s = 0; s < count; s++) {
    let acc = 0;
    for (let h = 0; h < Hi; h++) acc += iw[h]! * Math.max(0, dot(iq, ik, di, h * di, s * di));
    scores[s] = acc / norm;
  }
  return scores;
}

/**
 * The positions a row attends to, ascending: every position when scores.length <= topk,
 * else the topk highest scores (ties: lower position).
 */
export function qsaSelect(scores: Float32Array, topk: number): number[] {
  if (scores.length <= topk) return Array.from({ length: scores.length }, (_, s) => s);
  return topKIndices(scores, topk).sort((a, b) => a - b);
}

/**
 * Softmax attention of one query head over the selected positions of K/V cache head kvh:
 * o = sum_s softmax_s(q . k_s / sqrt(hd)) v_s, positions visited in the given order.
 */
export function attendHead(q: Float32Array, K: KvCache, V: KvCache, kvh: number, positions: number[], out: Float32Array): void {
  const hd = q.length;
  const logits = new Float64Array(positions.length);
  let m = -Infinity;
  for (let i = 0; i < positions.length; i++) {
    logits[i] = dot(q, K.vector(positions[i]!, kvh)) / Math.sqrt(hd);
    if (logits[i]! > m) m = logits[i]!;
  }
  let sum = 0;
  for (let i = 0; i < positions.length; i++) sum += logits[i] = Math.exp(logits[i]! - m);
  out.fill(0);
  const acc = new Float64Array(hd);
  for (let i = 0; i < positions.length; i++) {
    const v = V.vector(positions[i]!, kvh);
    const p = logits[i]! / sum;
    for (let c = 0; c < hd; c++) acc[c] = acc[c]! + p * v[c]!;
  }
  out.set(acc);
}

export interface AttentionRowTrace {
  /** Positions attended to by each row (QSA selection, or all). */
  selected: number[][];
}

/**
 * The attention mixer over a row batch of normalised inputs xs [nb, d] at positions
 * p0 .. p0+nb-1, appending to the layer's caches. Returns [nb, d]. `trace`, when given,
 * receives each row's selected positions.
 */
export function attentionLayer(
  w: AttentionWeights,
  config: ModelConfig,
  state: AttentionState,
  xs: Float32Array,
  nb: number,
  p0: number,
  trace?: AttentionRowTrace,
): Float32Array {
  const d = config.hidden_size;
  const at = config.attention;
  const { heads: H, kv_heads: Hkv, head_dim: hd } = at;
  const rd = Math.round(hd * at.partial_rotary_factor);
  const eps = config.rms_norm_eps;
  if (state.k.length !== p0) throw new Error(`attention: cache holds ${state.k.length} positions, the batch starts at ${p0}`);
  const qsa = w.qsa && at.qsa ? { ...w.qsa, cfg: at.qsa } : null;
  if (qsa && !state.ik) throw new Error("attention: QSA weights without an index-key cache");

  const q = new Float32Array(H * hd);
  const gate = new Float32Array(H * hd);
  const k = new Float32Array(Hkv * hd);
  const v = new Float32Array(Hkv * hd);
  const o = new Float32Array(H * hd);
  const ys = new Float32Array(nb * d);
  for (let b = 0; b < nb; b++) {
    const pos = p0 + b;
    const x = xs.subarray(b * d, (b + 1) * d);
    matvec(w.q, x, q, H * hd, d);
    matvec(w.gate, x, gate, H * hd, d);
    matvec(w.k, x, k, Hkv * hd, d);
    matvec(w.v, x, v, Hkv * hd, d);
    rmsNormHeads(q, w.q_norm, H, hd, eps);
    rmsNormHeads(k, w.k_norm, Hkv, hd, eps);
    for (let h = 0; h < H; h++) ropeNeox(q.subarray(h * hd, (h + 1) * hd), pos, rd, at.rope_theta);
    for (let h = 0; h < Hkv; h++) ropeNeox(k.subarray(h * hd, (h + 1) * hd), pos, rd, at.rope_theta);
    state.k.append(k);
    state.v.append(v);

    let selected: number[];
    if (qsa) {
      const { heads: Hi, head_dim: di, topk } = qsa.cfg;
      const iq = matvec(qsa.iq, x, new Float32Array(Hi * di), Hi * di, d);
      const ik = rmsNorm(matvec(qsa.ik, x, new Float32Array(di), di, d), qsa.ik_norm, eps);
      const iw = matvec(qsa.iw, x, new Float32Array(Hi), Hi, d);
      state.ik!.append(ik);
      const count = pos + 1;
      selected =
        count <= topk
          ? Array.from({ length: count }, (_, s) => s)
          : qsaSelect(qsaScores(iq, iw, state.ik!.values.subarray(0, count * di), count, Hi, di), topk);
    } else {
      selected = Array.from({ length: pos + 1 }, (_, s) => s);
    }
    trace?.selected.push(selected);

    for (let h = 0; h < H; h++) {
      const kvh = Math.floor((h * Hkv) / H);
      attendHead(q.subarray(h * hd, (h + 1) * hd), state.k, state.v, kvh, selected, o.subarray(h * hd, (h + 1) * hd));
    }
    for (let i = 0; i < H * hd; i++) o[i] = o[i]! * sigmoid(gate[i]!);
    matvec(w.o, o, ys.subarray(b * d, (b + 1) * d), d, H * hd);
  }
  return ys;
}
