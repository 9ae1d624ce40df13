// Hugging Face Qwen3-Next (`qwen3_next`) and Qwen3.5-MoE (`qwen3_5_moe`, text model) ->
// cherenkov: the config mapping, the tensor-name mapping (with the row reorders of packed
// projections) and the plain safetensors source. mlx.ts supplies another source for the same
// mapping. Converted models use n = 1 streams, no QSA, no PLE; MTP when the checkpoint has it.
import { parseConfig, type LayerType, type ModelConfig } from "../model/config.ts";
import { denseTensorSpecs } from "../model/tensors.ts";
import { RowMatrix, span } from "./rows.ts";
import type { Checkpoint } from "./safetensors.ts";

export type Architecture = "qwen3_next" | "qwen3_5_moe";
export const SUPPORTED_MODEL_TYPES = ["qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text"];

export class ConvertError extends Error {
  override name = "ConvertError";
  constructor(message: string, readonly tensor?: string) {
    super(message);
  }
}

type Json = Record<string, unknown>;

/** The architecture of a config.json, or a ConvertError naming what it is instead. */
export function architectureOf(raw: Json): Architecture {
  const type = raw.model_type;
  if (type === "qwen3_next") return "qwen3_next";
  if (type === "qwen3_5_moe" || type === "qwen3_5_moe_text") return "qwen3_5_moe";
  const what = typeof type === "string" ? `model_type "${type}"` : `no model_type (architectures: ${JSON.stringify(raw.architectures ?? null)})`;
  throw new ConvertError(
    `config.json: ${what} is not supported; cherenkov converts ${SUPPORTED_MODEL_TYPES.join(", ")} ` +
      `(Qwen3-Next and Qwen3.5-MoE text models, Hugging Face or MLX)`,
  );
}

/** The text model's fields (Qwen3.5 checkpoints nest them in text_config). */
export function textConfig(raw: Json): Json {
  const t = raw.text_config;
  return t && typeof t === "object" ? (t as Json) : raw;
}

function field(t: Json, key: string, fallback?: number): number {
  const v = t[key];
  if (v === undefined || v === null) {
    if (fallback !== undefined) return fallback;
    throw new ConvertError(`config.json: ${key} is missing`);
  }
  if (typeof v !== "number" || !Number.isFinite(v)) throw new ConvertError(`config.json: ${key} is ${JSON.stringify(v)}, not a number`);
  return v;
}

export interface HfConfigOptions {
  /** Attention KV cache type recorded in the config (default q8; f32 for oracle comparisons). */
  kvCache?: "q8" | "f32";
  /** Whether the checkpoint has an MTP head (mtp.* tensors). */
  mtp: boolean;
  /** Draft count limit recorded for the MTP head. */
  maxDrafts?: number;
}

/** cherenkov's config for a Qwen3-Next / Qwen3.5-MoE config.json. */
export function hfModelConfig(raw: Json, opts: HfConfigOptions): ModelConfig {
  const arch = architectureOf(raw);
  const t = textConfig(raw);
  const L = field(t, "num_hidden_layers");
  const d = field(t, "hidden_size");
  const heads = field(t, "num_attention_heads");
  const unsupported = (what: string) => {
    throw new ConvertError(`config.json: ${what} is not supported by cherenkov`);
  };
  if ((t.hidden_act ?? "silu") !== "silu") unsupported(`hidden_act "${t.hidden_act}"`);
  if (t.attention_bias === true) unsupported("attention_bias true");
  if (field(t, "num_experts", 0) <= 0) unsupported("a model without routed experts (num_experts 0)");
  if (arch === "qwen3_next") {
    const only = (t.mlp_only_layers ?? []) as unknown[];
    if (Array.isArray(only) && only.length > 0) unsupported(`dense MLP layers (mlp_only_layers ${JSON.stringify(only)})`);
    if (field(t, "decoder_sparse_step", 1) !== 1) unsupported(`decoder_sparse_step ${t.decoder_sparse_step} (dense MLP layers)`);
  }
  const rope = (t.rope_parameters ?? t.rope_scaling ?? {}) as Json;
  const ropeType = rope.rope_type ?? rope.type ?? "default";
  if (ropeType !== "default") unsupported(`rope_type "${ropeType}"`);
  const theta = (rope.rope_theta as number | undefined) ?? field(t, "rope_theta", 10000);
  const partial = (rope.partial_rotary_factor as number | undefined) ?? field(t, "partial_rotary_factor", 0.25);

  let types: LayerType[];
  if (Array.isArray(t.layer_types)) {
    types = (t.layer_types as unknown[]).map((x, l) => {
      if (x === "linear_attention") return "deltanet";
      if (x === "full_attention") return "attention";
      throw new ConvertError(`config.json: layer_types[${l}] is ${JSON.stringify(x)}, expected linear_attention or full_attention`);
    });
  } else {
    const every = field(t, "full_attention_interval", 4);
    types = Array.from({ length: L }, (_, l) => ((l + 1) % every === 0 ? "attention" : "deltanet"));
  }
  const idOrNull = (v: unknown) => {
    const id = Array.isArray(v) ? v[0] : v;
    return Number.isInteger(id) && (id as number) >= 0 && (id as number) < field(t, "vocab_size") ? (id as number) : null;
  };
  const tie = (t.tie_word_embeddings ?? raw.tie_word_embeddings ?? false) === true;
  const config = {
    architecture: "qwen4-exp",
    vocab_size: field(t, "vocab_size"),
    hidden_size: d,
    num_layers: L,
    layer_types: types,
    rms_norm_eps: field(t, "rms_norm_eps", 1e-6),
    tie_embeddings: tie,
    bos_token_id: idOrNull(t.bos_token_id ?? raw.bos_token_id),
    eos_token_id: idOrNull(t.eos_token_id ?? raw.eos_token_id),
    hc: { streams: 1, eps: 1e-6, sinkhorn_iters: 20 },
    deltanet: {
      key_heads: field(t, "linear_num_key_heads"),
      key_dim: field(t, "linear_key_head_dim"),
      value_heads: field(t, "linear_num_value_heads"),
      value_dim: field(t, "linear_value_head_dim"),
      conv_kernel: field(t, "linear_conv_kernel_dim", 4),
    },
    attention: {
      heads,
      kv_heads: field(t, "num_key_value_heads"),
      head_dim: field(t, "head_dim", d / heads),
      partial_rotary_factor: partial,
      rope_theta: theta,
      kv_cache: opts.kvCache ?? "q8",
      qsa: null,
    },
    moe: {
      experts: field(t, "num_experts"),
      top_k: field(t, "num_experts_per_tok"),
      intermediate: field(t, "moe_intermediate_size"),
      // transformers' Qwen3.5-MoE router always renormalises the top-k probabilities
      norm_topk_prob: arch === "qwen3_5_moe" ? true : t.norm_topk_prob !== false,
      shared_intermediate: field(t, "shared_expert_intermediate_size", 0),
    },
    ple: null,
    mtp: opts.mtp ? { max_drafts: opts.maxDrafts ?? 3 } : null,
  };
  return parseConfig(config, "the converted config.json");
}

// --- tensor sources ---------------------------------------------------------------------------

/** Checkpoint tensors under canonical Hugging Face names (model.layers.*, lm_head.weight, mtp.*). */
export interface TensorSource {
  has(name: string): boolean;
  /** The logical (dequantized) shape in the Hugging Face layout. */
  shape(name: string): number[];
  /** Where the tensor is stored, for messages. */
  where(name: string): string;
  /** The tensor, or its slice `index` along dim 0, as rows of its last dimension. */
  matrix(name: string, index?: number): RowMatrix;
  /** Stored names that no canonical name covers (vision towers and the like). */
  readonly ignored: string[];
  /** Canonical names present. */
  readonly names: string[];
  /** Why a present tensor cannot be read (e.g. an FP8 dtype), checked before anything is written. */
  problem?(name: string): string | undefined;
}

/** Stored-name prefixes and the canonical prefix each becomes; null = not part of the text model. */
const PREFIXES: [string, string | null][] = [
  ["model.language_model.mtp.", "mtp."],
  ["model.language_model.", "model."],
  ["language_model.model.", "model."],
  ["language_model.mtp.", "mtp."],
  ["language_model.lm_head.", "lm_head."],
  ["model.visual.", null],
  ["visual.", null],
  ["vision_tower.", null],
  ["model.vision_tower.", null],
];

/** The canonical name of a stored tensor name, or null when it is outside the text model. */
export function canonicalName(stored: string): string | null {
  for (const [from, to] of PREFIXES) if (stored.startsWith(from)) return to === null ? null : to + stored.slice(from.length);
  return stored;
}

const numelOf = (s: readonly number[]) => s.reduce((a, b) => a * b, 1);

/** Rows x cols of a tensor of `shape` (or of its dim-0 slice): cols = the last dimension. */
export function rowsCols(shape: readonly number[], sliced: boolean): [number, number] {
  const s = sliced ? shape.slice(1) : shape;
  const cols = s.length ? s[s.length - 1]! : 1;
  return [numelOf(s) / cols || 0, cols];
}

/** A plain float checkpoint (F32, BF16, F16). */
export class HfSource implements TensorSource {
  private stored = new Map<string, string>();
  readonly ignored: string[] = [];

  constructor(private readonly ckpt: Checkpoint) {
    for (const n of ckpt.names) {
      const c = canonicalName(n);
      if (c === null) this.ignored.push(n);
      else this.stored.set(c, n);
    }
  }

  get names(): string[] {
    return [...this.stored.keys()];
  }

  has(name: string): boolean {
    return this.stored.has(name);
  }

  private raw(name: string): string {
    const s = this.stored.get(name);
    if (!s) throw new ConvertError(`missing tensor ${name}`, name);
    return s;
  }

  shape(name: string): number[] {
    return this.ckpt.info(this.raw(name)).shape;
  }

  where(name: string): string {
    return this.ckpt.info(this.raw(name)).file;
  }

  matrix(name: string, index?: number): RowMatrix {
    const info = this.ckpt.info(this.raw(name));
    const [rows, cols] = rowsCols(info.shape, index !== undefined);
    return RowMatrix.f32(rows, cols, this.ckpt.readF32(info.name, index));
  }

  problem(name: string): string | undefined {
    const { dtype } = this.ckpt.info(this.raw(name));
    if (!["F32", "BF16", "F16", "F64"].includes(dtype))
      return `dtype ${dtype} is not supported (F32, BF16, F16; for FP8/FP4 checkpoints convert the bf16 release)`;
  }
}

// --- the mapping ------------------------------------------------------------------------------

/** Where one cherenkov tensor comes from: rows of one source tensor (or of its dim-0 slice). */
export interface Piece {
  source: string;
  index?: number;
  /** Row indices into the source matrix; all rows when absent. */
  rows?: number[];
}

export interface ConversionPlan {
  architecture: Architecture;
  config: ModelConfig;
  /** Every dense tensor in denseTensorSpecs order. */
  dense: { name: string; piece: Piece }[];
  /** The parts of routed expert e of expert layer l (l = num_layers is the MTP layer). */
  expert(l: number, e: number): { gate: Piece; up: Piece; down: Piece };
  /** Canonical source tensors the plan does not use (beyond extra MTP layers). */
  unused: string[];
}

type ExpertLayout = "per_expert" | "fused";

/**
 * Maps every cherenkov tensor to its source, checking up front that each source tensor exists
 * with the shape the config implies (so a bad checkpoint fails before anything is written).
 */
export function planConversion(arch: Architecture, config: ModelConfig, src: TensorSource): ConversionPlan {
  const c = config;
  const d = c.hidden_size;
  const { key_heads: Hk, key_dim: dk, value_heads: Hv, value_dim: dv, conv_kernel: K } = c.deltanet;
  const { heads: H, kv_heads: Hkv, head_dim: hd } = c.attention;
  const { experts: E, intermediate: I, shared_intermediate: S } = c.moe;
  const r = Hv / Hk;
  const convC = 2 * Hk * dk + Hv * dv;

  const expected = new Map<string, { shape: number[]; why: string }>();
  const expect = (name: string, shape: number[], why: string) => {
    expected.set(name, { shape, why });
    return name;
  };
  const dense = new Map<string, Piece>();
  const put = (name: string, piece: Piece) => dense.set(name, piece);

  const attentionPieces = (to: string, from: string) => {
    const q = expect(`${from}self_attn.q_proj.weight`, [2 * H * hd, d], "2 * num_attention_heads * head_dim, hidden_size");
    // q_proj packs each head as [q_h | gate_h]
    put(`${to}attn.q`, { source: q, rows: Array.from({ length: H }, (_, h) => span(2 * h * hd, hd)).flat() });
    put(`${to}attn.gate`, { source: q, rows: Array.from({ length: H }, (_, h) => span(2 * h * hd + hd, hd)).flat() });
    put(`${to}attn.k`, { source: expect(`${from}self_attn.k_proj.weight`, [Hkv * hd, d], "num_key_value_heads * head_dim, hidden_size") });
    put(`${to}attn.v`, { source: expect(`${from}self_attn.v_proj.weight`, [Hkv * hd, d], "num_key_value_heads * head_dim, hidden_size") });
    put(`${to}attn.q_norm`, { source: expect(`${from}self_attn.q_norm.weight`, [hd], "head_dim") });
    put(`${to}attn.k_norm`, { source: expect(`${from}self_attn.k_norm.weight`, [hd], "head_dim") });
    put(`${to}attn.o`, { source: expect(`${from}self_attn.o_proj.weight`, [d, H * hd], "hidden_size, num_attention_heads * head_dim") });
  };

  const layouts = new Map<string, ExpertLayout>();
  const moePieces = (to: string, from: string) => {
    put(`${to}moe.router`, { source: expect(`${from}mlp.gate.weight`, [E, d], "num_experts, hidden_size") });
    if (S > 0) {
      const sh = `${from}mlp.shared_expert.`;
      put(`${to}moe.shared_gate`, { source: expect(`${sh}gate_proj.weight`, [S, d], "shared_expert_intermediate_size, hidden_size") });
      put(`${to}moe.shared_up`, { source: expect(`${sh}up_proj.weight`, [S, d], "shared_expert_intermediate_size, hidden_size") });
      put(`${to}moe.shared_down`, { source: expect(`${sh}down_proj.weight`, [d, S], "hidden_size, shared_expert_intermediate_size") });
      put(`${to}moe.shared_expert_gate`, { source: expect(`${from}mlp.shared_expert_gate.weight`, [1, d], "1, hidden_size") });
    }
    const fused = src.has(`${from}mlp.experts.gate_up_proj`);
    layouts.set(from, fused ? "fused" : "per_expert");
    if (fused) {
      expect(`${from}mlp.experts.gate_up_proj`, [E, 2 * I, d], "num_experts, 2 * moe_intermediate_size, hidden_size");
      expect(`${from}mlp.experts.down_proj`, [E, d, I], "num_experts, hidden_size, moe_intermediate_size");
    } else {
      for (let e = 0; e < E; e++) {
        const p = `${from}mlp.experts.${e}.`;
        expect(`${p}gate_proj.weight`, [I, d], "moe_intermediate_size, hidden_size");
        expect(`${p}up_proj.weight`, [I, d], "moe_intermediate_size, hidden_size");
        expect(`${p}down_proj.weight`, [d, I], "hidden_size, moe_intermediate_size");
      }
    }
  };

  put("embed", { source: expect("model.embed_tokens.weight", [c.vocab_size, d], "vocab_size, hidden_size") });
  c.layer_types.forEach((type, l) => {
    const from = `model.layers.${l}.`;
    const to = `layers.${l}.`;
    put(`${to}mixer_norm`, { source: expect(`${from}input_layernorm.weight`, [d], "hidden_size") });
    if (type === "deltanet") {
      const la = `${from}linear_attn.`;
      if (arch === "qwen3_next") {
        // in_proj_qkvz packs per key-head group g: [q_g (dk) | k_g (dk) | v_g (r dv) | z_g (r dv)]
        const G = 2 * dk + 2 * r * dv;
        const qkvz = expect(`${la}in_proj_qkvz.weight`, [Hk * G, d], "2 * (linear_num_key_heads * linear_key_head_dim + linear_num_value_heads * linear_value_head_dim), hidden_size");
        const groups = (offset: number, n: number) => Array.from({ length: Hk }, (_, g) => span(g * G + offset, n)).flat();
        put(`${to}dn.qkv`, { source: qkvz, rows: [...groups(0, dk), ...groups(dk, dk), ...groups(2 * dk, r * dv)] });
        put(`${to}dn.z`, { source: qkvz, rows: groups(2 * dk + r * dv, r * dv) });
        // in_proj_ba packs per group: [b_g (r) | a_g (r)]
        const ba = expect(`${la}in_proj_ba.weight`, [2 * Hv, d], "2 * linear_num_value_heads, hidden_size");
        put(`${to}dn.b`, { source: ba, rows: Array.from({ length: Hk }, (_, g) => span(2 * r * g, r)).flat() });
        put(`${to}dn.a`, { source: ba, rows: Array.from({ length: Hk }, (_, g) => span(2 * r * g + r, r)).flat() });
      } else {
        put(`${to}dn.qkv`, { source: expect(`${la}in_proj_qkv.weight`, [convC, d], "2 * linear_num_key_heads * linear_key_head_dim + linear_num_value_heads * linear_value_head_dim, hidden_size") });
        put(`${to}dn.z`, { source: expect(`${la}in_proj_z.weight`, [Hv * dv, d], "linear_num_value_heads * linear_value_head_dim, hidden_size") });
        put(`${to}dn.b`, { source: expect(`${la}in_proj_b.weight`, [Hv, d], "linear_num_value_heads, hidden_size") });
        put(`${to}dn.a`, { source: expect(`${la}in_proj_a.weight`, [Hv, d], "linear_num_value_heads, hidden_size") });
      }
      put(`${to}dn.conv`, { source: expect(`${la}conv1d.weight`, [convC, 1, K], "conv channels, 1, linear_conv_kernel_dim") });
      put(`${to}dn.A_log`, { source: expect(`${la}A_log`, [Hv], "linear_num_value_heads") });
      put(`${to}dn.dt_bias`, { source: expect(`${la}dt_bias`, [Hv], "linear_num_value_heads") });
      put(`${to}dn.norm`, { source: expect(`${la}norm.weight`, [dv], "linear_value_head_dim") });
      put(`${to}dn.out`, { source: expect(`${la}out_proj.weight`, [d, Hv * dv], "hidden_size, linear_num_value_heads * linear_value_head_dim") });
    } else {
      attentionPieces(to, from);
    }
    put(`${to}moe_norm`, { source: expect(`${from}post_attention_layernorm.weight`, [d], "hidden_size") });
    moePieces(to, from);
  });
  put("final_norm", { source: expect("model.norm.weight", [d], "hidden_size") });
  if (!c.tie_embeddings) put("lm_head", { source: expect("lm_head.weight", [c.vocab_size, d], "vocab_size, hidden_size") });
  if (c.mtp) {
    put("mtp.embed_norm", { source: expect("mtp.pre_fc_norm_embedding.weight", [d], "hidden_size") });
    put("mtp.hidden_norm", { source: expect("mtp.pre_fc_norm_hidden.weight", [d], "hidden_size") });
    put("mtp.fc", { source: expect("mtp.fc.weight", [d, 2 * d], "hidden_size, 2 * hidden_size") });
    put("mtp.mixer_norm", { source: expect("mtp.layers.0.input_layernorm.weight", [d], "hidden_size") });
    attentionPieces("mtp.", "mtp.layers.0.");
    put("mtp.moe_norm", { source: expect("mtp.layers.0.post_attention_layernorm.weight", [d], "hidden_size") });
    moePieces("mtp.", "mtp.layers.0.");
    put("mtp.norm", { source: expect("mtp.norm.weight", [d], "hidden_size") });
  }

  // every expected tensor must exist with its shape
  const missing = [...expected.keys()].filter((n) => !src.has(n));
  if (missing.length > 0)
    throw new ConvertError(
      `missing tensor ${missing[0]}${missing.length > 1 ? ` (and ${missing.length - 1} more: ${missing.slice(1, 4).join(", ")}${missing.length > 4 ? ", ..." : ""})` : ""}`,
      missing[0],
    );
  for (const [name, { shape, why }] of expected) {
    const problem = src.problem?.(name);
    if (problem) throw new ConvertError(`tensor ${name} (${src.where(name)}): ${problem}`, name);
    const got = src.shape(name);
    if (got.length !== shape.length || got.some((x, i) => x !== shape[i]))
      throw new ConvertError(
        `tensor ${name} (${src.where(name)}): shape [${got.join(", ")}], expected [${shape.join(", ")}] = [${why}] from config.json`,
        name,
      );
  }

  const order = denseTensorSpecs(c).map((s) => {
    const piece = dense.get(s.name);
    if (!piece) throw new Error(`planConversion: no source for ${s.name}`);
    return { name: s.name, piece };
  });
  const expertSource = (l: number) => (l === c.num_layers ? "mtp.layers.0." : `model.layers.${l}.`);
  const used = new Set(expected.keys());
  return {
    architecture: arch,
    config: c,
    dense: order,
    expert(l, e) {
      const from = expertSource(l);
      if (layouts.get(from) === "fused") {
        const gu = `${from}mlp.experts.gate_up_proj`;
        return {
          gate: { source: gu, index: e, rows: span(0, I) },
          up: { source: gu, index: e, rows: span(I, I) },
          down: { source: `${from}mlp.experts.down_proj`, index: e },
        };
      }
      const p = `${from}mlp.experts.${e}.`;
      return { gate: { source: `${p}gate_proj.weight` }, up: { source: `${p}up_proj.weight` }, down: { source: `${p}down_proj.weight` } };
    },
    unused: src.names.filter((n) => !used.has(n) && !/^mtp\.layers\.[1-9]/.test(n)),
  };
}

/** Whether the checkpoint holds an MTP head. */
export const hasMtp = (src: TensorSource) => src.has("mtp.fc.weight");

