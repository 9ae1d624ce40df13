// Shapes of the synthetic models. "tiny" and "small" are for tests and benchmarks; the
// "-shape" presets have the dimensions of real checkpoints (tens of GB when written).
import { parseConfig, type LayerType, type ModelConfig } from "../model/config.ts";

/** Odd u32 multipliers for the PLE hash, fixed so configs are plain data. */
function pleMultipliers(orders: number[], heads: number, salt: number): number[][][] {
  let x = (0x2545f491 ^ salt) >>> 0;
  const next = () => {
    x = (Math.imul(x ^ (x >>> 15), 0x2c1b3c6d) + 0x297a2d39) >>> 0;
    return (x | 1) >>> 0;
  };
  return orders.map((o) => Array.from({ length: heads }, () => Array.from({ length: o }, next)));
}

/** 3 deltanet : 1 attention, as Qwen3-Next. */
const pattern = (L: number): LayerType[] => Array.from({ length: L }, (_, l) => ((l + 1) % 4 === 0 ? "attention" : "deltanet"));

/** Qwen3-30B-A3B-like dimensions with qwen4-exp's features on. */
const shape30b = {
  architecture: "qwen4-exp",
  vocab_size: 151936,
  hidden_size: 2048,
  num_layers: 48,
  layer_types: pattern(48),
  rms_norm_eps: 1e-6,
  tie_embeddings: false,
  bos_token_id: null,
  eos_token_id: 151643,
  hc: { streams: 4, eps: 1e-6, sinkhorn_iters: 20 },
  deltanet: { key_heads: 16, key_dim: 128, value_heads: 32, value_dim: 128, conv_kernel: 4 },
  attention: {
    heads: 32, kv_heads: 4, head_dim: 128, partial_rotary_factor: 0.25, rope_theta: 1e7, kv_cache: "q8",
    qsa: { heads: 16, head_dim: 128, topk: 2048 },
  },
  moe: { experts: 128, top_k: 8, intermediate: 768, norm_topk_prob: true, shared_intermediate: 0 },
  ple: {
    layers: [0, 24], orders: [2, 3], heads: 4, head_dim: 128, rows: [[65521, 65519, 65497, 65479], [65449, 65447, 65437, 65423]],
    mult: pleMultipliers([2, 3], 4, 3), pad_id: 0, conv_kernel: 4,
  },
  mtp: { max_drafts: 3 },
} as const;

const base = {
  tiny: {
    architecture: "qwen4-exp",
    vocab_size: 320,
    hidden_size: 64,
    num_layers: 4,
    layer_types: pattern(4),
    rms_norm_eps: 1e-6,
    tie_embeddings: false,
    bos_token_id: null,
    eos_token_id: 256,
    hc: { streams: 4, eps: 1e-6, sinkhorn_iters: 20 },
    deltanet: { key_heads: 2, key_dim: 16, value_heads: 4, value_dim: 16, conv_kernel: 4 },
    attention: {
      heads: 4, kv_heads: 2, head_dim: 16, partial_rotary_factor: 0.5, rope_theta: 10000, kv_cache: "q8",
      qsa: { heads: 2, head_dim: 16, topk: 4 },
    },
    moe: { experts: 8, top_k: 2, intermediate: 32, norm_topk_prob: true, shared_intermediate: 32 },
    ple: {
      layers: [0], orders: [2, 3], heads: 2, head_dim: 8, rows: [[97, 101], [103, 107]],
      mult: pleMultipliers([2, 3], 2, 1), pad_id: 0, conv_kernel: 4,
    },
    mtp: { max_drafts: 3 },
  },
  small: {
    architecture: "qwen4-exp",
    vocab_size: 2048,
    hidden_size: 256,
    num_layers: 8,
    layer_types: pattern(8),
    rms_norm_eps: 1e-6,
    tie_embeddings: false,
    bos_token_id: null,
    eos_token_id: 256,
    hc: { streams: 4, eps: 1e-6, sinkhorn_iters: 20 },
    deltanet: { key_heads: 4, key_dim: 32, value_heads: 8, value_dim: 32, conv_kernel: 4 },
    attention: {
      heads: 8, kv_heads: 2, head_dim: 32, partial_rotary_factor: 0.25, rope_theta: 1e6, kv_cache: "q8",
      qsa: { heads: 4, head_dim: 32, topk: 64 },
    },
    moe: { experts: 32, top_k: 4, intermediate: 128, norm_topk_prob: true, shared_intermediate: 128 },
    ple: {
      layers: [0, 4], orders: [2, 3], heads: 2, head_dim: 32, rows: [[4093, 4091], [4099, 4111]],
      mult: pleMultipliers([2, 3], 2, 2), pad_id: 0, conv_kernel: 4,
    },
    mtp: { max_drafts: 3 },
  },
  "30b-a3b-shape": shape30b,
  // Qwen3-Next-80B-A3B's trunk: wider attention heads, 512 small experts, a shared expert.
  "80b-a3b-shape": {
    ...shape30b,
    attention: { ...shape30b.attention, heads: 16, kv_heads: 2, head_dim: 256 },
    moe: { experts: 512, top_k: 10, intermediate: 512, norm_topk_prob: true, shared_intermediate: 512 },
    ple: { ...shape30b.ple, mult: pleMultipliers([2, 3], 4, 4) },
  },
} as const;

/** The synthetic model presets (docs/model.md). */
export type PresetName = "tiny" | "small" | "30b-a3b-shape" | "80b-a3b-shape";
// The table above has exactly these keys (a compile error otherwise).
const _presetNamesMatch: [PresetName, keyof typeof base] extends [keyof typeof base, PresetName] ? true : never = true;
void _presetNamesMatch;
export const presetNames = Object.keys(base) as PresetName[];

/** Feature switches, for coverage of the plain paths (n = 1, dense attention, no PLE, no MTP). */
export interface Features {
  hc?: boolean;
  qsa?: boolean;
  ple?: boolean;
  mtp?: boolean;
  kvCache?: "q8" | "f32";
  /** Put the n-gram memory on these layers (default: the preset's). Later layers see unequal streams. */
  pleLayers?: number[];
}

/** A validated config for a preset, with features switched off as asked. */
export function presetConfig(name: PresetName, f: Features = {}): ModelConfig {
  const b = base[name];
  if (!b) throw new Error(`unknown preset "${name}" (known: ${presetNames.join(", ")})`);
  const c = structuredClone(b) as unknown as ModelConfig;
  if (f.hc === false) c.hc.streams = 1;
  if (f.qsa === false) c.attention.qsa = null;
  if (f.ple === false) c.ple = null;
  if (f.mtp === false) c.mtp = null;
  if (f.kvCache) c.attention.kv_cache = f.kvCache;
  if (f.pleLayers && c.ple) c.ple.layers = [...f.pleLayers];
  return parseConfig(c, `preset ${name}`);
}
