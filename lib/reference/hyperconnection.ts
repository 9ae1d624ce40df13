// The residual of qwen4-exp: n hyper-connection streams (DeepSeek-V4 mHC, MODEL.md
// "Residual"). A site reads the streams into one vector (pre), runs its sub-layer on it and
// writes the result back (post) while mixing the streams (comb, made doubly stochastic by
// Sinkhorn). With n = 1 there are no hc tensors and a site is the plain pre-norm residual.
import { dot, rmsNorm, sigmoid } from "./ops.ts";

/** The tensors of one hc site (`{site}.fn`, `.base`, `.scale`); null when n = 1. */
export interface HcSiteWeights {
  /** [2n + n*n, n*d] */
  fn: Float32Array;
  /** [2n + n*n] */
  base: Float32Array;
  /** [3]: pre, post, comb */
  scale: Float32Array;
}

/** The final read's tensors (`hc_head.*`): fn [n, n*d], base [n], scale [1]. */
export interface HcHeadWeights {
  fn: Float32Array;
  base: Float32Array;
  scale: Float32Array;
}

export interface HcConfig {
  streams: number;
  eps: number;
  sinkhorn_iters: number;
}

/** mixes[m] = (fn[m, :] . flat) * rsqrt(mean(flat^2) + eps), flat = the n*d stream values. */
export function hcMixes(fn: Float32Array, flat: Float32Array, mixCount: number, eps: number, out = new Float32Array(mixCount)): Float32Array {
  const len = flat.length;
  if (fn.length !== mixCount * len) throw new Error(`hcMixes: fn has ${fn.length} values, expected ${mixCount} x ${len}`);
  const r = 1 / Math.sqrt(dot(flat, flat) / len + eps);
  for (let m = 0; m < mixCount; m++) out[m] = dot(fn, flat, len, m * len, 0) * r;
  return out;
}

/**
 * Sinkhorn normalisation of an n x n logit matrix (row-major, [i][j]): row softmax + eps,
 * divide by column sums (+ eps), then iters - 1 rounds of {rows, columns}. Returns comb.
 */
export function sinkhorn(logits: Float32Array, n: number, iters: number, eps: number): Float32Array {
  const comb = new Float32Array(n * n);
  for (let i = 0; i < n; i++) {
    let m = -Infinity;
    for (let j = 0; j < n; j++) m = Math.max(m, logits[i * n + j]!);
    let s = 0;
    for (let j = 0; j < n; j++) s += Math.exp(logits[i * n + j]! - m);
    for (let j = 0; j < n; j++) comb[i * n + j] = Math.exp(logits[i * n + j]! - m) / s + eps;
  }
  const divideColumns = () => {
    for (let j = 0; j < n; j++) {
      let s = 0;
      for (let i = 0; i < n; i++) s += comb[i * n + j]!;
      for (let i = 0; i < n; i++) comb[i * n + j] = comb[i * n + j]! / (s + eps);
    }
  };
  const divideRows = () => {
    for (let i = 0; i < n; i++) {
      let s = 0;
      for (let j = 0; j < n; j++) s += comb[i * n + j]!;
      for (let j = 0; j < n; j++) comb[i * n + j] = comb[i * n + j]! / (s + eps);
    }
  };
  divideColumns();
  for (let it = 1; it < iters; it++) {
    divideRows();
    divideColumns();
  }
  return comb;
}

export interface HcCoefficients {
  /** [n]: read weights */
  pre: Float32Array;
  /** [n]: write weights */
  post: Float32Array;
  /** [n * n], comb[i][j]: how much of stream i goes to stream j */
  comb: Float32Array;
}

/** pre, post and comb of one site from its mixes (MODEL.md's three formulas). */
export function hcCoefficients(mixes: Float32Array, w: HcSiteWeights, cfg: HcConfig): HcCoefficients {
  const n = cfg.streams;
  const pre = new Float32Array(n);
  const post = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    pre[i] = sigmoid(mixes[i]! * w.scale[0]! + w.base[i]!) + cfg.eps;
    post[i] = 2 * sigmoid(mixes[n + i]! * w.scale[1]! + w.base[n + i]!);
  }
  const logits = new Float32Array(n * n);
  for (let m = 0; m < n * n; m++) logits[m] = mixes[2 * n + m]! * w.scale[2]! + w.base[2 * n + m]!;
  return { pre, post, comb: sinkhorn(logits, n, cfg.sinkhorn_iters, cfg.eps) };
}

/** x = sum_i pre_i X_i over the n streams of one row (X is [n, d]). */
export function hcRead(X: Float32Array, pre: Float32Array, n: number, d: number, out = new Float32Array(d)): Float32Array {
  for (let c = 0; c < d; c++) {
    let acc = 0;
    for (let i = 0; i < n; i++) acc += pre[i]! * X[i * d + c]!;
    out[c] = acc;
  }
  return out;
}

/** X'_j = post_j * y + sum_i comb[i][j] X_i, in place on one row's streams X [n, d]. */
export function hcWrite(X: Float32Array, y: Float32Array, post: Float32Array, comb: Float32Array, n: number, d: number): void {
  const old = X.slice();
  for (let j = 0; j < n; j++) {
    for (let c = 0; c < d; c++) {
      let acc = post[j]! * y[c]!;
      for (let i = 0; i < n; i++) acc += comb[i * n + j]! * old[i * d + c]!;
      X[j * d + c] = acc;
    }
  }
}

/**
 * One residual site over a row batch. X is [nb, n, d]; `sub` maps the batch of normalised
 * reads [nb, d] to the sub-layer outputs [nb, d]. n = 1 without weights is the plain pre-norm
 * residual X += F(RMSNorm(X)).
 */
export function residualSite(
  X: Float32Array,
  nb: number,
  d: number,
  cfg: HcConfig,
  site: HcSiteWeights | null,
  norm: Float32Array,
  normEps: number,
  sub: (xs: Float32Array) => Float32Array,
): void {
  const n = cfg.streams;
  if (!site && n !== 1) throw new Error(`hc site weights are required with ${n} streams`);
  const xs = new Float32Array(nb * d);
  const coefficients: HcCoefficients[] = [];
  for (let b = 0; b < nb; b++) {
    const row = X.subarray(b * n * d, (b + 1) * n * d);
    const x = xs.subarray(b * d, (b + 1) * d);
    if (site) {
      const c = hcCoefficients(hcMixes(site.fn, row, 2 * n + n * n, cfg.eps), site, cfg);
      coefficients.push(c);
      hcRead(row, c.pre, n, d, x);
    } else x.set(row);
    rmsNorm(x, norm, normEps, {}, x);
  }
  const ys = sub(xs);
  for (let b = 0; b < nb; b++) {
    const row = X.subarray(b * n * d, (b + 1) * n * d);
    const y = ys.subarray(b * d, (b + 1) * d);
    if (site) {
      const c = coefficients[b]!;
      hcWrite(row, y, c.post, c.comb, n, d);
    } else for (let i = 0; i < d; i++) row[i] = row[i]! + y[i]!;
  }
}

/**
 * The final read of one row before the LM head: pre_i = sigmoid(mixes_h[i] * scale + base[i])
 * + eps, x = sum_i pre_i X_i. With n = 1 (head null) it is X itself.
 */
export function hcFinalRead(X: Float32Array, n: number, d: number, head: HcHeadWeights | null, eps: number, out = new Float32Array(d)): Float32Array {
  if (!head) {
    if (n !== 1) throw new Error(`hc_head weights are required with ${n} streams`);
    out.set(X.subarray(0, d));
    return out;
  }
  const mixes = hcMixes(head.fn, X.subarray(0, n * d), n, eps);
  const pre = new Float32Array(n);
  for (let i = 0; i < n; i++) pre[i] = sigmoid(mixes[i]! * head.scale[0]! + head.base[i]!) + eps;
  return hcRead(X, pre, n, d, out);
}
