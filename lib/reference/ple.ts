// N-gram memory, "PLE" (MODEL.md, a simplified DeepSeek Engram): each position hashes its
// last o tokens per order and head into a table row, the gathered rows are gated against
// the residual and passed through a short dilated causal conv, and the result is added to
// every stream. Row indices depend only on tokens, so they are known before any compute.
import type { ModelConfig } from "../model/config.ts";
import { causalConvStep, dot, matvec, rmsNorm, sigmoid, silu } from "./ops.ts";
import type { PleState } from "./state.ts";

/** The tensors of one PLE layer (`layers.{l}.ple.*`) and its tables [order][head]. */
export interface PleWeights {
  k: Float32Array;
  k_bias: Float32Array;
  v: Float32Array;
  v_bias: Float32Array;
  k_norm: Float32Array;
  q_norm: Float32Array;
  conv_norm: Float32Array;
  conv: Float32Array;
  /** tables[o][j]: rows[o][j] x head_dim */
  tables: Float32Array[][];
}

/**
 * The n-gram hash of position t: XOR over i < mult.length of imul(tok[t-i], mult[i]) as u32,
 * tok[<0] = padId; returns that value mod rows.
 */
export function pleRowIndex(tokens: ArrayLike<number>, t: number, mult: readonly number[], padId: number, rows: number): number {
  let mix = 0;
  for (let i = 0; i < mult.length; i++) {
    const tok = t - i < 0 ? padId : tokens[t - i]!;
    mix ^= Math.imul(tok, mult[i]!);
  }
  return (mix >>> 0) % rows;
}

/** Table rows of position t for every (order index o, head j): [o][j]. */
export function pleRows(config: ModelConfig, tokens: ArrayLike<number>, t: number): number[][] {
  const p = config.ple;
  if (!p) throw new Error("model has no PLE");
  return p.orders.map((_, o) => p.mult[o]!.map((mult, j) => pleRowIndex(tokens, t, mult, p.pad_id, p.rows[o]![j]!)));
}

/** e_t: the gathered rows concatenated order-major ([o0 j0, o0 j1, .., o1 j0, ..]). */
export function pleGather(tables: Float32Array[][], rows: number[][], headDim: number): Float32Array {
  const e = new Float32Array(rows.length * rows[0]!.length * headDim);
  let off = 0;
  rows.forEach((rj, o) =>
    rj.forEach((row, j) => {
      e.set(tables[o]![j]!.subarray(row * headDim, (row + 1) * headDim), off);
      off += headDim;
    }),
  );
  return e;
}

/**
 * The PLE injection over a row batch, in place on the streams X [nb, n, d] at positions
 * p0.. (tokens holds every token by position, this batch's included). Updates the conv
 * history; `onRow(r)` runs after row r.
 */
export function pleLayer(
  w: PleWeights,
  config: ModelConfig,
  state: PleState,
  X: Float32Array,
  nb: number,
  p0: number,
  tokens: ArrayLike<number>,
  onRow?: (r: number) => void,
): void {
  const p = config.ple!;
  const d = config.hidden_size;
  const n = config.hc.streams;
  const eps = config.rms_norm_eps;
  const E = p.orders.length * p.heads * p.head_dim;
  const K = p.conv_kernel;
  const dilation = Math.max(...p.orders);
  const h = new Float32Array(d);
  const kv = new Float32Array(d);
  const v = new Float32Array(d);
  const u = new Float32Array(d);
  const conv = new Float32Array(d);
  for (let b = 0; b < nb; b++) {
    const e = pleGather(w.tables, pleRows(config, tokens, p0 + b), p.head_dim);
    if (e.length !== E) throw new Error(`ple: gathered ${e.length} values, expected ${E}`);
    const row = X.subarray(b * n * d, (b + 1) * n * d);
    h.fill(0);
    for (let i = 0; i < n; i++) for (let c = 0; c < d; c++) h[c] = h[c]! + row[i * d + c]!;
    for (let c = 0; c < d; c++) h[c] = h[c]! / n;
    const qn = rmsNorm(h, w.q_norm, eps);
    matvec(w.k, e, kv, d, E);
    for (let c = 0; c < d; c++) kv[c] = kv[c]! + w.k_bias[c]!;
    const kn = rmsNorm(kv, w.k_norm, eps);
    let s = dot(kn, qn) / Math.sqrt(d);
    s = Math.sign(s) * Math.sqrt(Math.max(Math.abs(s), 1e-6));
    const alpha = sigmoid(s);
    matvec(w.v, e, v, d, E);
    for (let c = 0; c < d; c++) v[c] = alpha * (v[c]! + w.v_bias[c]!);
    rmsNorm(v, w.conv_norm, eps, {}, u);
    causalConvStep(state.history, u, w.conv, d, K, conv, dilation);
    for (let c = 0; c < d; c++) {
      const y = v[c]! + silu(conv[c]!);
      for (let i = 0; i < n; i++) row[i * d + c] = row[i * d + c]! + y;
    }
    onRow?.(b);
  }
}
