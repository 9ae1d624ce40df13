// The elementary operations of qwen4-exp (docs/model.md), one plain function each, on
// Float32Array. Every GPU kernel test compares against these. Sums run in JS numbers (f64)
// and are stored as f32: the reference is at least as exact as any f32 kernel.
import { ropeAngle, ropeInvFreq } from "../model/rope.ts";

/** Logistic sigmoid 1 / (1 + e^-x). */
export const sigmoid = (x: number): number => 1 / (1 + Math.exp(-x));

/** SiLU x * sigmoid(x). */
export const silu = (x: number): number => x / (1 + Math.exp(-x));

/** Softplus log(1 + e^x), in the overflow-free form max(x, 0) + log1p(e^-|x|). */
export const softplus = (x: number): number => Math.max(x, 0) + Math.log1p(Math.exp(-Math.abs(x)));

/** Dot product of n values of a (from aOff) and b (from bOff). */
export function dot(a: Float32Array, b: Float32Array, n = a.length, aOff = 0, bOff = 0): number {
  let acc = 0;
  for (let i = 0; i < n; i++) acc += a[aOff + i]! * b[bOff + i]!;
  return acc;
}

/** out[r] = W[r, :] . x for a row-major W [rows, cols]. */
export function matvec(W: Float32Array, x: Float32Array, out: Float32Array, rows: number, cols: number): Float32Array {
  if (W.length !== rows * cols) throw new Error(`matvec: W has ${W.length} values, expected ${rows} x ${cols}`);
  if (x.length < cols || out.length < rows) throw new Error(`matvec: x (${x.length}) or out (${out.length}) too short`);
  for (let r = 0; r < rows; r++) {
    const base = r * cols;
    let acc = 0;
    for (let c = 0; c < cols; c++) acc += W[base + c]! * x[c]!;
    out[r] = acc;
  }
  return out;
}

/** Row batch of matvecs: Y[b] = W . X[b] for nb rows; X is [nb, cols], the result [nb, rows]. */
export function matmulRows(W: Float32Array, X: Float32Array, nb: number, rows: number, cols: number): Float32Array {
  const Y = new Float32Array(nb * rows);
  for (let b = 0; b < nb; b++) matvec(W, X.subarray(b * cols, (b + 1) * cols), Y.subarray(b * rows, (b + 1) * rows), rows, cols);
  return Y;
}

export interface RmsNormOptions {
  /** true (default, MODEL.md's RMSNorm): scale by (1 + w); false: scale by w ("plain w"). */
  zeroCentred?: boolean;
}

/** out = x * rsqrt(mean(x^2) + eps) * (1 + w) (zero-centred) or * w (plain). out may be x. */
export function rmsNorm(
  x: Float32Array,
  w: Float32Array,
  eps: number,
  opts: RmsNormOptions = {},
  out: Float32Array = new Float32Array(x.length),
): Float32Array {
  const n = x.length;
  if (w.length !== n) throw new Error(`rmsNorm: weight has ${w.length} values, input ${n}`);
  let ss = 0;
  for (let i = 0; i < n; i++) ss += x[i]! * x[i]!;
  const r = 1 / Math.sqrt(ss / n + eps);
  const centred = opts.zeroCentred ?? true;
  for (let i = 0; i < n; i++) out[i] = x[i]! * r * (centred ? 1 + w[i]! : w[i]!);
  return out;
}

/** RMSNorm of each of the `heads` consecutive vectors of `dim` values in x, in place. */
export function rmsNormHeads(x: Float32Array, w: Float32Array, heads: number, dim: number, eps: number, opts: RmsNormOptions = {}): void {
  for (let h = 0; h < heads; h++) {
    const v = x.subarray(h * dim, (h + 1) * dim);
    rmsNorm(v, w, eps, opts, v);
  }
}

/** DeltaNet's RMSNormGated: o * rsqrt(mean(o^2) + eps) * w (plain) * SiLU(z), in place on o. */
export function rmsNormGated(o: Float32Array, z: Float32Array, w: Float32Array, eps: number): void {
  const n = o.length;
  let ss = 0;
  for (let i = 0; i < n; i++) ss += o[i]! * o[i]!;
  const r = 1 / Math.sqrt(ss / n + eps);
  for (let i = 0; i < n; i++) o[i] = o[i]! * r * w[i]! * silu(z[i]!);
}

/** x *= rsqrt(sum(x^2) + eps), in place (DeltaNet's q/k normalisation, eps 1e-6). */
export function l2Normalize(x: Float32Array, eps = 1e-6): void {
  let ss = 0;
  for (let i = 0; i < x.length; i++) ss += x[i]! * x[i]!;
  const r = 1 / Math.sqrt(ss + eps);
  for (let i = 0; i < x.length; i++) x[i] = x[i]! * r;
}

/** Numerically stable softmax of x (max subtracted). out may be x. */
export function softmax(x: Float32Array, out: Float32Array = new Float32Array(x.length)): Float32Array {
  let m = -Infinity;
  for (let i = 0; i < x.length; i++) if (x[i]! > m) m = x[i]!;
  let s = 0;
  for (let i = 0; i < x.length; i++) s += Math.exp(x[i]! - m);
  for (let i = 0; i < x.length; i++) out[i] = Math.exp(x[i]! - m) / s;
  return out;
}

/** Index of the largest value; ties go to the lowest index (greedy: lowest token id). */
export function argmax(x: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i]! > x[best]!) best = i;
  return best;
}

/** top1 - top2 of x (0 when the two largest values tie): how safe a greedy step is. */
export function topTwoMargin(x: ArrayLike<number>): number {
  const a = argmax(x);
  let second = -Infinity;
  for (let i = 0; i < x.length; i++) if (i !== a && x[i]! > second) second = x[i]!;
  return x[a]! - second;
}

/**
 * Indices of the k largest values in rank order (value descending; equal values: lower
 * index first). Used by the MoE router and QSA selection.
 */
export function topKIndices(values: ArrayLike<number>, k: number): number[] {
  const idx = Array.from({ length: values.length }, (_, i) => i);
  idx.sort((a, b) => (values[b]! !== values[a]! ? values[b]! - values[a]! : a - b));
  return idx.slice(0, Math.min(k, values.length));
}

/**
 * NeoX rotate-half RoPE, in place, on the first rd dims of one head vector at position pos:
 * for i < rd/2, (x_i, x_{i+rd/2}) rotated by angle = f32(pos * inv_freq[i]) with inv_freq as
 * lib/model/rope.ts defines it (f32, as transformers). Dims >= rd are untouched.
 */
export function ropeNeox(x: Float32Array, pos: number, rd: number, theta: number): void {
  const half = rd / 2;
  const inv = invFreqTable(rd, theta);
  for (let i = 0; i < half; i++) {
    const angle = ropeAngle(pos, inv[i]!);
    const c = Math.cos(angle);
    const s = Math.sin(angle);
    const x1 = x[i]!;
    const x2 = x[i + half]!;
    x[i] = x1 * c - x2 * s;
    x[i + half] = x2 * c + x1 * s;
  }
}

const invFreqTables = new Map<string, Float32Array>();
function invFreqTable(rd: number, theta: number): Float32Array {
  const key = `${rd}:${theta}`;
  let t = invFreqTables.get(key);
  if (!t) invFreqTables.set(key, (t = ropeInvFreq(rd, theta)));
  return t;
}

/**
 * q8 quantization of one vector: scale = max|x| / 127 (as f32), q = round(x / scale) with
 * halves away from zero, clamped to +-127. An all-zero vector gets scale 0 and q = 0.
 * Writes q and returns the scale.
 */
export function quantizeQ8(x: Float32Array, q: Int8Array): number {
  let m = 0;
  for (let i = 0; i < x.length; i++) m = Math.max(m, Math.abs(x[i]!));
  const scale = Math.fround(m / 127);
  for (let i = 0; i < x.length; i++) {
    if (scale === 0) {
      q[i] = 0;
      continue;
    }
    const v = x[i]! / scale;
    const r = Math.sign(v) * Math.round(Math.abs(v)); // halves away from zero, as C round()
    q[i] = Math.max(-127, Math.min(127, r));
  }
  return scale;
}

/** out[i] = q[i] * scale (as f32): the value attention reads back from a q8 cache. */
export function dequantizeQ8(q: Int8Array, scale: number, out: Float32Array = new Float32Array(q.length)): Float32Array {
  for (let i = 0; i < q.length; i++) out[i] = q[i]! * scale;
  return out;
}

/**
 * One step of a causal depthwise conv with weights [C, K] and dilation D: out[c] = w[c][K-1]
 * x_t[c] + sum_{k<K-1} w[c][k] x_{t-(K-1-k)D}[c]. `window` holds the last (K-1)*D inputs
 * (oldest first; zeros before the sequence start) and is shifted by one input afterwards.
 */
export function causalConvStep(
  window: Float32Array,
  input: Float32Array,
  w: Float32Array,
  C: number,
  K: number,
  out: Float32Array,
  dilation = 1,
): void {
  const span = (K - 1) * dilation;
  if (window.length !== span * C) throw new Error(`causalConvStep: window has ${window.length} values, expected ${span} x ${C}`);
  for (let c = 0; c < C; c++) {
    let acc = w[c * K + K - 1]! * input[c]!;
    for (let k = 0; k < K - 1; k++) acc += w[c * K + k]! * window[k * dilation * C + c]!;
    out[c] = acc;
  }
  if (span > 0) {
    window.copyWithin(0, C);
    window.set(input.subarray(0, C), (span - 1) * C);
  }
}
