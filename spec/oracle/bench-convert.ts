// Converter throughput (not a test): writes a random bf16 Qwen3-Next-shaped checkpoint of
// about 1.6 GB (real tensor names, one shard per layer), converts it to q4 and to bf16, and
// prints seconds and GB/s of checkpoint read. The checkpoint is deleted unless --keep.
//   bun spec/oracle/bench-convert.ts [--dir /tmp/cherenkov-bench] [--keep] [--workers N]
import { existsSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { convertCheckpoint } from "../../lib/convert/convert.ts";
import { writeSafetensors, type StWriteTensor } from "../../lib/convert/safetensors.ts";

const { values: flags } = parseArgs({ options: { dir: { type: "string" }, keep: { type: "boolean" }, workers: { type: "string" } } });
const root = flags.dir ?? "/tmp/cherenkov-bench";
const ckpt = join(root, "checkpoint");

const cfg = {
  model_type: "qwen3_next",
  architectures: ["Qwen3NextForCausalLM"],
  vocab_size: 32000,
  hidden_size: 2048,
  num_hidden_layers: 3,
  layer_types: ["linear_attention", "linear_attention", "full_attention"],
  num_attention_heads: 16,
  num_key_value_heads: 2,
  head_dim: 256,
  linear_num_key_heads: 16,
  linear_num_value_heads: 32,
  linear_key_head_dim: 128,
  linear_value_head_dim: 128,
  linear_conv_kernel_dim: 4,
  num_experts: 64,
  num_experts_per_tok: 10,
  moe_intermediate_size: 512,
  shared_expert_intermediate_size: 512,
  norm_topk_prob: true,
  rms_norm_eps: 1e-6,
  rope_theta: 10000000,
  partial_rotary_factor: 0.25,
  tie_word_embeddings: false,
  hidden_act: "silu",
};

/** Random bf16 values in about [-scale, scale): a xorshift stream, fast enough for GBs. */
let state = 0x9e3779b9;
function randomBf16(n: number, scale: number): StWriteTensor["data"] {
  const out = new Uint16Array(n);
  const f = new Float32Array(1);
  const u = new Uint32Array(f.buffer);
  for (let i = 0; i < n; i++) {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    f[0] = ((state >>> 0) / 4294967296 - 0.5) * 2 * scale;
    out[i] = u[0]! >>> 16;
  }
  return new Uint8Array(out.buffer);
}
const t = (shape: number[], scale = 0.05): StWriteTensor => ({ dtype: "BF16", shape, data: randomBf16(shape.reduce((a, b) => a * b, 1), scale) });

function writeCheckpoint() {
  mkdirSync(ckpt, { recursive: true });
  writeFileSync(join(ckpt, "config.json"), JSON.stringify(cfg, null, 1));
  const d = cfg.hidden_size;
  const I = cfg.moe_intermediate_size;
  const S = cfg.shared_expert_intermediate_size;
  const Hk = cfg.linear_num_key_heads;
  const Hv = cfg.linear_num_value_heads;
  const dk = cfg.linear_key_head_dim;
  const dv = cfg.linear_value_head_dim;
  const hd = cfg.head_dim;
  const weightMap: Record<string, string> = {};
  const shard = (file: string, tensors: Record<string, StWriteTensor>) => {
    writeSafetensors(join(ckpt, file), tensors, { format: "pt" });
    for (const n of Object.keys(tensors)) weightMap[n] = file;
  };
  shard("model-embed.safetensors", {
    "model.embed_tokens.weight": t([cfg.vocab_size, d], 1),
    "lm_head.weight": t([cfg.vocab_size, d]),
    "model.norm.weight": t([d], 0.1),
  });
  cfg.layer_types.forEach((type, l) => {
    const p = `model.layers.${l}.`;
    const ts: Record<string, StWriteTensor> = {
      [`${p}input_layernorm.weight`]: t([d], 0.1),
      [`${p}post_attention_layernorm.weight`]: t([d], 0.1),
      [`${p}mlp.gate.weight`]: t([cfg.num_experts, d]),
      [`${p}mlp.shared_expert.gate_proj.weight`]: t([S, d]),
      [`${p}mlp.shared_expert.up_proj.weight`]: t([S, d]),
      [`${p}mlp.shared_expert.down_proj.weight`]: t([d, S]),
      [`${p}mlp.shared_expert_gate.weight`]: t([1, d]),
    };
    if (type === "linear_attention") {
      const C = 2 * Hk * dk + Hv * dv;
      Object.assign(ts, {
        [`${p}linear_attn.in_proj_qkvz.weight`]: t([2 * Hk * dk + 2 * Hv * dv, d]),
        [`${p}linear_attn.in_proj_ba.weight`]: t([2 * Hv, d]),
        [`${p}linear_attn.conv1d.weight`]: t([C, 1, 4], 0.5),
        [`${p}linear_attn.A_log`]: t([Hv], 1),
        [`${p}linear_attn.dt_bias`]: t([Hv], 1),
        [`${p}linear_attn.norm.weight`]: t([dv], 1),
        [`${p}linear_attn.out_proj.weight`]: t([d, Hv * dv]),
      });
    } else {
      const H = cfg.num_attention_heads;
      const Hkv = cfg.num_key_value_heads;
      Object.assign(ts, {
        [`${p}self_attn.q_proj.weight`]: t([2 * H * hd, d]),
        [`${p}self_attn.k_proj.weight`]: t([Hkv * hd, d]),
        [`${p}self_attn.v_proj.weight`]: t([Hkv * hd, d]),
        [`${p}self_attn.o_proj.weight`]: t([d, H * hd]),
        [`${p}self_attn.q_norm.weight`]: t([hd], 0.1),
        [`${p}self_attn.k_norm.weight`]: t([hd], 0.1),
      });
    }
    for (let e = 0; e < cfg.num_experts; e++) {
      ts[`${p}mlp.experts.${e}.gate_proj.weight`] = t([I, d]);
      ts[`${p}mlp.experts.${e}.up_proj.weight`] = t([I, d]);
      ts[`${p}mlp.experts.${e}.down_proj.weight`] = t([d, I]);
    }
    shard(`model-layer${l}.safetensors`, ts);
  });
  writeFileSync(join(ckpt, "model.safetensors.index.json"), JSON.stringify({ metadata: {}, weight_map: weightMap }));
}

if (!existsSync(join(ckpt, "model.safetensors.index.json"))) {
  const t0 = performance.now();
  writeCheckpoint();
  console.log(`wrote the random checkpoint in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
}
for (const weights of ["q4", "bf16"] as const) {
  const out = join(root, `out-${weights}`);
  const r = await convertCheckpoint({ src: ckpt, out, weights, workers: flags.workers === undefined ? undefined : Number(flags.workers) });
  const gb = r.sourceBytes / 1e9;
  console.log(
    `${weights} (workers ${flags.workers ?? "default"}): ${gb.toFixed(2)} GB of bf16 checkpoint -> ${(r.bytes / 1e9).toFixed(2)} GB in ${r.seconds.toFixed(2)} s: ` +
      `${(gb / r.seconds).toFixed(3)} GB/s, ${(r.seconds / gb).toFixed(2)} s per GB`,
  );
  rmSync(out, { recursive: true, force: true });
}
if (!flags.keep) rmSync(root, { recursive: true, force: true });
