// Mixer A: gated DeltaNet (MODEL.md, follows Qwen3.5 `linear_attn`). The recurrent step is
// the definition; the chunked form (the WY / forward-substitution form used for prefill) must
// agree with it to rounding.
import type { ModelConfig } from "../model/config.ts";
import { causalConvStep, l2Normalize, matvec, rmsNormGated, sigmoid, silu, softplus } from "./ops.ts";
import type { DeltaNetState } from "./state.ts";

/** The tensors of one DeltaNet layer (`layers.{l}.dn.*`). */
export interface DeltaNetWeights {
  qkv: Float32Array;
  z: Float32Array;
  b: Float32Array;
  a: Float32Array;
  conv: Float32Array;
  A_log: Float32Array;
  dt_bias: Float32Array;
  norm: Float32Array;
  out: Float32Array;
}

/**
 * One recurrent DeltaNet step of one value head, S [dk, dv] updated in place:
 * S = e^g S; m = S^T k; delta = beta (v - m); S += k delta^T; out = S^T q.
 */
export function deltanetStep(
  S: Float32Array,
  q: Float32Array,
  k: Float32Array,
  v: Float32Array,
  beta: number,
  g: number,
  dk: number,
  dv: number,
  out: Float32Array,
): void {
  const decay = Math.exp(g);
  for (let i = 0; i < dk * dv; i++) S[i] = S[i]! * decay;
  for (let j = 0; j < dv; j++) {
    let m = 0;
    for (let i = 0; i < dk; i++) m += S[i * dv + j]! * k[i]!;
    const delta = beta * (v[j]! - m);
    for (let i = 0; i < dk; i++) S[i * dv + j] = S[i * dv + j]! + k[i]! * delta;
  }
  for (let j = 0; j < dv; j++) {
    let o = 0;
    for (let i = 0; i < dk; i++) o += S[i * dv + j]! * q[i]!;
    out[j] = o;
  }
}

/**
 * T steps of one value head in chunks of `chunk` rows (q, k [T, dk], v [T, dv], beta, g [T]),
 * S [dk, dv] updated in place, outputs [T, dv]. Within a chunk with cumulative decay G_t:
 * u_t = beta_t (v_t - e^G_t S0^T k_t - sum_{i<t} e^(G_t-G_i) (k_t.k_i) u_i) (forward
 * substitution), o_t = e^G_t S0^T q_t + sum_{i<=t} e^(G_t-G_i) (q_t.k_i) u_i,
 * S = e^G_last S0 + sum_i e^(G_last-G_i) k_i u_i^T.
 */
export function deltanetChunked(
  S: Float32Array,
  q: Float32Array,
  k: Float32Array,
  v: Float32Array,
  beta: Float32Array,
  g: Float32Array,
  T: number,
  dk: number,
  dv: number,
  chunk: number,
  out: Float32Array,
): void {
  if (!(chunk >= 1)) throw new Error(`deltanetChunked: chunk size ${chunk} must be >= 1`);
  const G = new Float64Array(chunk);
  const U = new Float64Array(chunk * dv); // f64: forward substitution cancels; f32 storage lost 4e-5 of the logits
  const S0 = new Float32Array(dk * dv);
  for (let c0 = 0; c0 < T; c0 += chunk) {
    const C = Math.min(chunk, T - c0);
    S0.set(S);
    let acc = 0;
    for (let t = 0; t < C; t++) G[t] = acc += g[c0 + t]!;
    for (let t = 0; t < C; t++) {
      const kt = (c0 + t) * dk;
      const gt = Math.exp(G[t]!);
      const kk = new Float64Array(t);
      for (let i = 0; i < t; i++) {
        let s = 0;
        for (let a = 0; a < dk; a++) s += k[kt + a]! * k[(c0 + i) * dk + a]!;
        kk[i] = s * Math.exp(G[t]! - G[i]!);
      }
      for (let j = 0; j < dv; j++) {
        let m = 0;
        for (let a = 0; a < dk; a++) m += S0[a * dv + j]! * k[kt + a]!;
        let rhs = v[(c0 + t) * dv + j]! - gt * m;
        for (let i = 0; i < t; i++) rhs -= kk[i]! * U[i * dv + j]!;
        U[t * dv + j] = beta[c0 + t]! * rhs;
      }
    }
    for (let t = 0; t < C; t++) {
      const qt = (c0 + t) * dk;
      const gt = Math.exp(G[t]!);
      const qk = new Float64Array(t + 1);
      for (let i = 0; i <= t; i++) {
        let s = 0;
        for (let a = 0; a < dk; a++) s += q[qt + a]! * k[(c0 + i) * dk + a]!;
        qk[i] = s * Math.exp(G[t]! - G[i]!);
      }
      for (let j = 0; j < dv; j++) {
        let o = 0;
        for (let a = 0; a < dk; a++) o += S0[a * dv + j]! * q[qt + a]!;
        o *= gt;
        for (let i = 0; i <= t; i++) o += qk[i]! * U[i * dv + j]!;
        out[(c0 + t) * dv + j] = o;
      }
    }
    const last = G[C - 1]!;
    const gl = Math.exp(last);
    for (let a = 0; a < dk; a++) {
      for (let j = 0; j < dv; j++) {
        let s = gl * S0[a * dv + j]!;
        for (let i = 0; i < C; i++) s += Math.exp(last - G[i]!) * k[(c0 + i) * dk + a]! * U[i * dv + j]!;
        S[a * dv + j] = s;
      }
    }
  }
}

export interface DeltaNetRunOptions {
  /** 0: recurrent steps (row snapshots possible); > 0: the chunked form with this chunk size. */
  chunk: number;
  /** Called after row r has updated the state (recurrent form only). */
  onRow?: (r: number) => void;
}

/**
 * The DeltaNet mixer over a row batch of normalised inputs xs [nb, d], updating the layer's
 * conv window and recurrent state. Returns [nb, d].
 */
export function deltanetLayer(
  w: DeltaNetWeights,
  config: ModelConfig,
  state: DeltaNetState,
  xs: Float32Array,
  nb: number,
  opts: DeltaNetRunOptions,
): Float32Array {
  const d = config.hidden_size;
  const { key_heads: Hk, key_dim: dk, value_heads: Hv, value_dim: dv, conv_kernel: K } = config.deltanet;
  const r = Hv / Hk;
  const C = 2 * Hk * dk + Hv * dv;
  const Q = new Float32Array(nb * Hk * dk);
  const Kk = new Float32Array(nb * Hk * dk);
  const V = new Float32Array(nb * Hv * dv);
  const Z = new Float32Array(nb * Hv * dv);
  const beta = new Float32Array(nb * Hv);
  const g = new Float32Array(nb * Hv);
  const O = new Float32Array(nb * Hv * dv);
  const qkv = new Float32Array(C);
  const conv = new Float32Array(C);
  const ba = new Float32Array(Hv);
  const qScale = 1 / Math.sqrt(dk);

  // Projections, conv (with the window) + SiLU, q/k normalisation, beta and g of row b.
  const prepareRow = (b: number) => {
    const x = xs.subarray(b * d, (b + 1) * d);
    matvec(w.qkv, x, qkv, C, d);
    causalConvStep(state.conv, qkv, w.conv, C, K, conv);
    for (let c = 0; c < C; c++) conv[c] = silu(conv[c]!);
    Q.set(conv.subarray(0, Hk * dk), b * Hk * dk);
    Kk.set(conv.subarray(Hk * dk, 2 * Hk * dk), b * Hk * dk);
    V.set(conv.subarray(2 * Hk * dk), b * Hv * dv);
    for (let h = 0; h < Hk; h++) {
      const qh = Q.subarray((b * Hk + h) * dk, (b * Hk + h + 1) * dk);
      l2Normalize(qh);
      for (let i = 0; i < dk; i++) qh[i] = qh[i]! * qScale;
      l2Normalize(Kk.subarray((b * Hk + h) * dk, (b * Hk + h + 1) * dk));
    }
    matvec(w.z, x, Z.subarray(b * Hv * dv, (b + 1) * Hv * dv), Hv * dv, d);
    matvec(w.b, x, ba, Hv, d);
    for (let h = 0; h < Hv; h++) beta[b * Hv + h] = sigmoid(ba[h]!);
    matvec(w.a, x, ba, Hv, d);
    for (let h = 0; h < Hv; h++) g[b * Hv + h] = -Math.exp(w.A_log[h]!) * softplus(ba[h]! + w.dt_bias[h]!);
  };

  if (opts.chunk === 0) {
    for (let b = 0; b < nb; b++) {
      prepareRow(b);
      for (let h = 0; h < Hv; h++) {
        const kh = Math.floor(h / r);
        deltanetStep(
          state.S.subarray(h * dk * dv, (h + 1) * dk * dv),
          Q.subarray((b * Hk + kh) * dk, (b * Hk + kh + 1) * dk),
          Kk.subarray((b * Hk + kh) * dk, (b * Hk + kh + 1) * dk),
          V.subarray((b * Hv + h) * dv, (b * Hv + h + 1) * dv),
          beta[b * Hv + h]!,
          g[b * Hv + h]!,
          dk,
          dv,
          O.subarray((b * Hv + h) * dv, (b * Hv + h + 1) * dv),
        );
      }
      opts.onRow?.(b);
    }
  } else {
    if (opts.onRow) throw new Error("deltanetLayer: row snapshots need the recurrent form (chunk 0)");
    for (let b = 0; b < nb; b++) prepareRow(b);
    const qh = new Float32Array(nb * dk);
    const kh = new Float32Array(nb * dk);
    const vh = new Float32Array(nb * dv);
    const bh = new Float32Array(nb);
    const gh = new Float32Array(nb);
    const oh = new Float32Array(nb * dv);
    for (let h = 0; h < Hv; h++) {
      const key = Math.floor(h / r);
      for (let b = 0; b < nb; b++) {
        qh.set(Q.subarray((b * Hk + key) * dk, (b * Hk + key + 1) * dk), b * dk);
        kh.set(Kk.subarray((b * Hk + key) * dk, (b * Hk + key + 1) * dk), b * dk);
        vh.set(V.subarray((b * Hv + h) * dv, (b * Hv + h + 1) * dv), b * dv);
        bh[b] = beta[b * Hv + h]!;
        gh[b] = g[b * Hv + h]!;
      }
      deltanetChunked(state.S.subarray(h * dk * dv, (h + 1) * dk * dv), qh, kh, vh, bh, gh, nb, dk, dv, opts.chunk, oh);
      for (let b = 0; b < nb; b++) O.set(oh.subarray(b * dv, (b + 1) * dv), (b * Hv + h) * dv);
    }
  }

  const ys = new Float32Array(nb * d);
  for (let b = 0; b < nb; b++) {
    for (let h = 0; h < Hv; h++) {
      const off = (b * Hv + h) * dv;
      rmsNormGated(O.subarray(off, off + dv), Z.subarray(off, off + dv), w.norm, config.rms_norm_eps);
    }
    matvec(w.out, O.subarray(b * Hv * dv, (b + 1) * Hv * dv), ys.subarray(b * d, (b + 1) * d), d, Hv * dv);
  }
  return ys;
}
