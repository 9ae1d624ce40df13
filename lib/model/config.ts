// The qwen4-exp configuration (../../docs/model.md): one zod schema, so that every
// error names the field that is wrong ("config.attention.head_dim: ...").
import { z } from "zod";

const positiveInt = z.number().int().positive();
const nonNegativeInt = z.number().int().nonnegative();

/**
 * Upper bounds of every numeric config field (docs/format.md "Bounds"): far above any real
 * model, low enough that no loop or allocation sized by a hostile config can hang or exhaust
 * memory before the file-size checks run.
 */
export const CONFIG_LIMITS = {
  vocab_size: 1 << 22,
  hidden_size: 1 << 16,
  num_layers: 1024,
  /** Attention heads, KV heads, DeltaNet and QSA heads, PLE heads. */
  heads: 1024,
  /** Every per-head dimension (attention, DeltaNet keys/values, QSA, PLE). */
  head_dim: 4096,
  conv_kernel: 64,
  hc_streams: 16,
  sinkhorn_iters: 100,
  experts: 1 << 16,
  top_k: 64,
  intermediate: 1 << 18,
  qsa_topk: 1 << 24,
  ple_orders: 8,
  ple_order: 16,
  ple_rows: 1 << 28,
  max_drafts: 16,
  rope_theta: 1e12,
  /** rms_norm_eps and hc.eps. */
  eps: 1,
} as const;
const L = CONFIG_LIMITS;
const upTo = (max: number) => positiveInt.max(max);

export const LayerType = z.enum(["deltanet", "attention"]);
export type LayerType = z.infer<typeof LayerType>;

/** Storage dtypes of tensors on disk. q4 = affine 4-bit, group 32 along the input dim. */
export const DType = z.enum(["f32", "bf16", "f16", "q4"]);
export type DType = z.infer<typeof DType>;

const HyperConnection = z.strictObject({
  /** Number of residual streams n; 1 = plain pre-norm residual (no hc tensors). */
  streams: upTo(L.hc_streams),
  eps: z.number().positive().max(L.eps),
  sinkhorn_iters: upTo(L.sinkhorn_iters),
});

const DeltaNet = z.strictObject({
  key_heads: upTo(L.heads),
  key_dim: upTo(L.head_dim),
  value_heads: upTo(L.heads),
  value_dim: upTo(L.head_dim),
  conv_kernel: upTo(L.conv_kernel),
});

const Qsa = z.strictObject({
  heads: upTo(L.heads),
  head_dim: upTo(L.head_dim),
  /** Each row attends to at most this many positions (selected by index score). */
  topk: upTo(L.qsa_topk),
});

const Attention = z.strictObject({
  heads: upTo(L.heads),
  kv_heads: upTo(L.heads),
  head_dim: upTo(L.head_dim),
  partial_rotary_factor: z.number().gt(0).lte(1),
  rope_theta: z.number().positive().max(L.rope_theta),
  kv_cache: z.enum(["q8", "f32"]),
  qsa: Qsa.nullable(),
});

const Moe = z.strictObject({
  experts: upTo(L.experts),
  top_k: upTo(L.top_k),
  intermediate: upTo(L.intermediate),
  norm_topk_prob: z.boolean(),
  /** Intermediate size of the shared expert; 0 = no shared expert. */
  shared_intermediate: nonNegativeInt.max(L.intermediate),
});

const Ple = z.strictObject({
  layers: z.array(nonNegativeInt.max(L.num_layers - 1)).min(1).max(L.num_layers),
  orders: z.array(upTo(L.ple_order)).min(1).max(L.ple_orders),
  heads: upTo(L.heads),
  head_dim: upTo(L.head_dim),
  /** rows[o][j]: table size of order index o, head j. */
  rows: z.array(z.array(upTo(L.ple_rows)).max(L.heads)).max(L.ple_orders),
  /** mult[o][j][i]: odd u32 multipliers of the n-gram hash. */
  mult: z.array(z.array(z.array(z.number().int().min(1).max(0xffffffff)).max(L.ple_order)).max(L.heads)).max(L.ple_orders),
  pad_id: nonNegativeInt.max(L.vocab_size - 1),
  conv_kernel: upTo(L.conv_kernel),
});

const Mtp = z.strictObject({
  max_drafts: upTo(L.max_drafts),
});

export const ModelConfig = z
  .strictObject({
    architecture: z.literal("qwen4-exp"),
    vocab_size: upTo(L.vocab_size),
    hidden_size: upTo(L.hidden_size),
    num_layers: upTo(L.num_layers),
    layer_types: z.array(LayerType).min(1).max(L.num_layers),
    rms_norm_eps: z.number().positive().max(L.eps),
    tie_embeddings: z.boolean(),
    bos_token_id: nonNegativeInt.max(L.vocab_size - 1).nullable(),
    eos_token_id: nonNegativeInt.max(L.vocab_size - 1).nullable(),
    hc: HyperConnection,
    deltanet: DeltaNet,
    attention: Attention,
    moe: Moe,
    ple: Ple.nullable(),
    mtp: Mtp.nullable(),
  })
  .superRefine((c, ctx) => {
    const issue = (path: (string | number)[], message: string) => ctx.addIssue({ code: "custom", path, message });
    if (c.layer_types.length !== c.num_layers)
      issue(["layer_types"], `has ${c.layer_types.length} entries, num_layers is ${c.num_layers}`);
    if (c.hidden_size % 32 !== 0) issue(["hidden_size"], "must be a multiple of 32 (q4 groups)");
    if (c.deltanet.value_heads % c.deltanet.key_heads !== 0)
      issue(["deltanet", "value_heads"], "must be a multiple of key_heads");
    if (c.attention.heads % c.attention.kv_heads !== 0) issue(["attention", "heads"], "must be a multiple of kv_heads");
    const rd = c.attention.head_dim * c.attention.partial_rotary_factor;
    if (!Number.isInteger(rd) || rd % 2 !== 0)
      issue(["attention", "partial_rotary_factor"], `head_dim * factor = ${rd} must be an even integer`);
    if (c.moe.top_k > c.moe.experts) issue(["moe", "top_k"], `exceeds experts (${c.moe.experts})`);
    if (c.moe.intermediate % 32 !== 0) issue(["moe", "intermediate"], "must be a multiple of 32 (q4 groups)");
    if (c.moe.shared_intermediate % 32 !== 0) issue(["moe", "shared_intermediate"], "must be a multiple of 32");
    if (c.bos_token_id !== null && c.bos_token_id >= c.vocab_size) issue(["bos_token_id"], "outside the vocabulary");
    if (c.eos_token_id !== null && c.eos_token_id >= c.vocab_size) issue(["eos_token_id"], "outside the vocabulary");
    // The streams' norm in the hc mixes uses hc.eps here and rms_norm_eps in DeepSeek-V4: one
    // number serves both only when they are equal (docs/model.md, numeric rules).
    if (c.hc.streams > 1 && c.hc.eps !== c.rms_norm_eps)
      issue(["hc", "eps"], `is ${c.hc.eps} but rms_norm_eps is ${c.rms_norm_eps}: with streams > 1 the two must be equal (DeepSeek-V4 normalises the streams with rms_norm_eps)`);
    const p = c.ple;
    if (p) {
      p.layers.forEach((l, i) => {
        if (l >= c.num_layers) issue(["ple", "layers", i], `layer ${l} does not exist (num_layers ${c.num_layers})`);
      });
      if (p.pad_id >= c.vocab_size) issue(["ple", "pad_id"], "outside the vocabulary");
      if (p.rows.length !== p.orders.length) issue(["ple", "rows"], "needs one entry per order");
      if (p.mult.length !== p.orders.length) issue(["ple", "mult"], "needs one entry per order");
      p.orders.forEach((order, o) => {
        if (p.rows[o] && p.rows[o].length !== p.heads) issue(["ple", "rows", o], `needs ${p.heads} entries (heads)`);
        const m = p.mult[o];
        if (!m) return;
        if (m.length !== p.heads) issue(["ple", "mult", o], `needs ${p.heads} entries (heads)`);
        m.forEach((mj, j) => {
          if (mj.length !== order) issue(["ple", "mult", o, j], `needs ${order} multipliers (order)`);
          mj.forEach((v, i) => {
            if (v % 2 !== 1) issue(["ple", "mult", o, j, i], "must be odd");
          });
        });
      });
    }
  });
export type ModelConfig = z.infer<typeof ModelConfig>;

/** Formats a zod error as one line per issue, each naming its field. */
export function describeIssues(error: z.ZodError, prefix: string): string {
  return error.issues
    .map((i) => `${[prefix, ...i.path].filter((p) => p !== "").join(".")}: ${i.message}`)
    .join("\n");
}

export class ConfigError extends Error {
  override name = "ConfigError";
}

/** Validates a parsed config object; `where` names the file for the error message. */
export function parseConfig(raw: unknown, where = "config"): ModelConfig {
  const r = ModelConfig.safeParse(raw);
  if (!r.success) throw new ConfigError(`invalid model config in ${where}:\n${describeIssues(r.error, "config")}`);
  return r.data;
}

/** Derived sizes used by the reference, the format and the kernels. */
export function dims(c: ModelConfig) {
  const dn = c.deltanet;
  const at = c.attention;
  const n = c.hc.streams;
  return {
    d: c.hidden_size,
    n,
    hcMix: 2 * n + n * n,
    dnKey: dn.key_heads * dn.key_dim,
    dnValue: dn.value_heads * dn.value_dim,
    dnConvChannels: 2 * dn.key_heads * dn.key_dim + dn.value_heads * dn.value_dim,
    attnQ: at.heads * at.head_dim,
    attnKv: at.kv_heads * at.head_dim,
    rotaryDim: Math.round(at.head_dim * at.partial_rotary_factor),
    pleEmbed: c.ple ? c.ple.orders.length * c.ple.heads * c.ple.head_dim : 0,
    pleDilation: c.ple ? Math.max(...c.ple.orders) : 0,
    /** Expert layers in experts.bin: the trunk's L plus one for the MTP head. */
    expertLayers: c.num_layers + (c.mtp ? 1 : 0),
  };
}
export type Dims = ReturnType<typeof dims>;
