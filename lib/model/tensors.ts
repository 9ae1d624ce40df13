// The tensor inventory of a qwen4-exp model: every dense tensor's name and shape, and the
// parts of an expert record. The single list the writer, reader, synthesizer, converters
// and reference all agree on. Shapes are [out, in] for projections (row-major, like torch).
import { dims, type ModelConfig, type DType } from "./config.ts";

/**
 * How a tensor is used, which decides its storage dtype in a quantized model and how the
 * synthesizer initialises it:
 * - matrix: a projection x -> W x (q4 in quantized models), init ~ U(-1,1)/sqrt(in)
 * - small: a projection whose precision matters (router, gates): bf16, init like matrix
 * - hcFn: the hyper-connection mixes' projection (`*.fn`): f32 always, as DeepSeek-V4 keeps its hc
 *   parameters (bf16 moves the small preset's logits by 7e-2 of the largest); init like matrix. Files
 *   written before this rule hold bf16 fn and still load (the reader takes any float dtype).
 * - norm: a zero-centred RMSNorm weight (the effective scale is 1 + w), init ~ 0.1 N
 * - plainNorm: an RMSNorm weight used as is (DeltaNet's gated norm), init ~ 1 + 0.1 N
 * - vector: biases, conv weights, per-head constants: f32
 */
export type TensorRole = "matrix" | "small" | "hcFn" | "norm" | "plainNorm" | "vector" | "aLog" | "hcScale";

export interface TensorSpec {
  name: string;
  shape: number[];
  role: TensorRole;
}

function attentionTensors(c: ModelConfig, p: string, withQsa: boolean): TensorSpec[] {
  const d = c.hidden_size;
  const at = c.attention;
  const D = dims(c);
  const t: TensorSpec[] = [
    { name: `${p}attn.q`, shape: [D.attnQ, d], role: "matrix" },
    { name: `${p}attn.gate`, shape: [D.attnQ, d], role: "matrix" },
    { name: `${p}attn.k`, shape: [D.attnKv, d], role: "matrix" },
    { name: `${p}attn.v`, shape: [D.attnKv, d], role: "matrix" },
    { name: `${p}attn.q_norm`, shape: [at.head_dim], role: "norm" },
    { name: `${p}attn.k_norm`, shape: [at.head_dim], role: "norm" },
    { name: `${p}attn.o`, shape: [d, D.attnQ], role: "matrix" },
  ];
  if (withQsa && at.qsa) {
    const q = at.qsa;
    t.push(
      { name: `${p}attn.iq`, shape: [q.heads * q.head_dim, d], role: "matrix" },
      { name: `${p}attn.ik`, shape: [q.head_dim, d], role: "matrix" },
      { name: `${p}attn.ik_norm`, shape: [q.head_dim], role: "norm" },
      { name: `${p}attn.iw`, shape: [q.heads, d], role: "small" },
    );
  }
  return t;
}

function moeTensors(c: ModelConfig, p: string): TensorSpec[] {
  const d = c.hidden_size;
  const m = c.moe;
  const t: TensorSpec[] = [{ name: `${p}moe.router`, shape: [m.experts, d], role: "small" }];
  if (m.shared_intermediate > 0) {
    const s = m.shared_intermediate;
    t.push(
      { name: `${p}moe.shared_gate`, shape: [s, d], role: "matrix" },
      { name: `${p}moe.shared_up`, shape: [s, d], role: "matrix" },
      { name: `${p}moe.shared_down`, shape: [d, s], role: "matrix" },
      { name: `${p}moe.shared_expert_gate`, shape: [1, d], role: "small" },
    );
  }
  return t;
}

function hcSite(c: ModelConfig, p: string): TensorSpec[] {
  const D = dims(c);
  if (D.n === 1) return [];
  return [
    { name: `${p}.fn`, shape: [D.hcMix, D.n * D.d], role: "hcFn" },
    { name: `${p}.base`, shape: [D.hcMix], role: "vector" },
    { name: `${p}.scale`, shape: [3], role: "hcScale" },
  ];
}

/** Every dense tensor (dense.bin), in file order. */
export function denseTensorSpecs(c: ModelConfig): TensorSpec[] {
  const d = c.hidden_size;
  const D = dims(c);
  const dn = c.deltanet;
  const t: TensorSpec[] = [{ name: "embed", shape: [c.vocab_size, d], role: "matrix" }];
  for (let l = 0; l < c.num_layers; l++) {
    const p = `layers.${l}.`;
    if (c.ple && c.ple.layers.includes(l)) {
      const K = c.ple.conv_kernel;
      t.push(
        { name: `${p}ple.k`, shape: [d, D.pleEmbed], role: "matrix" },
        { name: `${p}ple.k_bias`, shape: [d], role: "vector" },
        { name: `${p}ple.v`, shape: [d, D.pleEmbed], role: "matrix" },
        { name: `${p}ple.v_bias`, shape: [d], role: "vector" },
        { name: `${p}ple.k_norm`, shape: [d], role: "norm" },
        { name: `${p}ple.q_norm`, shape: [d], role: "norm" },
        { name: `${p}ple.conv_norm`, shape: [d], role: "norm" },
        { name: `${p}ple.conv`, shape: [d, K], role: "vector" },
      );
    }
    t.push(...hcSite(c, `${p}hc_mixer`), { name: `${p}mixer_norm`, shape: [d], role: "norm" });
    if (c.layer_types[l] === "deltanet") {
      t.push(
        { name: `${p}dn.qkv`, shape: [D.dnConvChannels, d], role: "matrix" },
        { name: `${p}dn.z`, shape: [D.dnValue, d], role: "matrix" },
        { name: `${p}dn.b`, shape: [dn.value_heads, d], role: "small" },
        { name: `${p}dn.a`, shape: [dn.value_heads, d], role: "small" },
        { name: `${p}dn.conv`, shape: [D.dnConvChannels, dn.conv_kernel], role: "vector" },
        { name: `${p}dn.A_log`, shape: [dn.value_heads], role: "aLog" },
        { name: `${p}dn.dt_bias`, shape: [dn.value_heads], role: "vector" },
        { name: `${p}dn.norm`, shape: [dn.value_dim], role: "plainNorm" },
        { name: `${p}dn.out`, shape: [d, D.dnValue], role: "matrix" },
      );
    } else {
      t.push(...attentionTensors(c, p, true));
    }
    t.push(...hcSite(c, `${p}hc_moe`), { name: `${p}moe_norm`, shape: [d], role: "norm" }, ...moeTensors(c, p));
  }
  if (D.n > 1) {
    t.push(
      { name: "hc_head.fn", shape: [D.n, D.n * d], role: "hcFn" },
      { name: "hc_head.base", shape: [D.n], role: "vector" },
      { name: "hc_head.scale", shape: [1], role: "hcScale" },
    );
  }
  t.push({ name: "final_norm", shape: [d], role: "norm" });
  if (!c.tie_embeddings) t.push({ name: "lm_head", shape: [c.vocab_size, d], role: "matrix" });
  if (c.mtp) {
    // The MTP layer: dense attention (no QSA), plain residual, experts at layer index L.
    t.push(
      { name: "mtp.embed_norm", shape: [d], role: "norm" },
      { name: "mtp.hidden_norm", shape: [d], role: "norm" },
      { name: "mtp.fc", shape: [d, 2 * d], role: "matrix" },
      { name: "mtp.mixer_norm", shape: [d], role: "norm" },
      ...attentionTensors(c, "mtp.", false),
      { name: "mtp.moe_norm", shape: [d], role: "norm" },
      ...moeTensors(c, "mtp."),
      { name: "mtp.norm", shape: [d], role: "norm" },
    );
  }
  return t;
}

/** The three matrices of one routed expert, in record order. */
export function expertPartSpecs(c: ModelConfig): TensorSpec[] {
  const d = c.hidden_size;
  const I = c.moe.intermediate;
  return [
    { name: "gate", shape: [I, d], role: "matrix" },
    { name: "up", shape: [I, d], role: "matrix" },
    { name: "down", shape: [d, I], role: "matrix" },
  ];
}

/** Storage dtype of a tensor when a model is written with weights of `weights` dtype. */
export function storageDType(spec: TensorSpec, weights: DType): DType {
  if (weights === "f32") return "f32";
  if (spec.role === "matrix") {
    if (weights === "q4" && spec.shape.length === 2 && spec.shape[1]! % 32 === 0) return "q4";
    return weights === "q4" ? "bf16" : weights;
  }
  if (spec.role === "hcFn") return "f32";
  if (spec.role === "small") return "bf16";
  return "f32";
}

export const numel = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

/** Bytes a tensor of this shape and dtype takes (q4: nibbles, then bf16 scales, then bf16 biases). */
export function tensorBytes(shape: readonly number[], dtype: DType): number {
  const n = numel(shape);
  switch (dtype) {
    case "f32":
      return n * 4;
    case "bf16":
    case "f16":
      return n * 2;
    case "q4":
      return n / 2 + (n / 32) * 4;
  }
}
