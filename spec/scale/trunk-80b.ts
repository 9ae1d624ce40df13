// The 80b-a3b trunk at a small hidden size (issue 23 item 2): 48 layers (3 DeltaNet : 1
// attention), attention 16 query / 2 KV heads of head_dim 256 with partial RoPE and QSA, 512
// routed experts top-10 plus a shared expert, 4 hyper-connection streams, the n-gram memory on
// layers 0 and 24, and the MTP head: what makes the real model deep and wide, with the widths
// that only scale the matrices (hidden, DeltaNet heads, expert width, vocabulary) cut so the
// whole model is a few MB and a step runs in well under a second on the CPU backend.
import { presetConfig } from "../../lib/convert/presets.ts";
import { parseConfig, type ModelConfig } from "../../lib/model/config.ts";

export function trunk80bSmall(kvCache: "q8" | "f32" = "f32"): ModelConfig {
  const c = structuredClone(presetConfig("80b-a3b-shape")) as unknown as Record<string, any>;
  c.vocab_size = 512;
  c.eos_token_id = 511;
  c.hidden_size = 64;
  c.deltanet = { key_heads: 2, key_dim: 32, value_heads: 4, value_dim: 32, conv_kernel: 4 };
  // QSA keeps 8 positions per row, so that a short sequence already selects.
  c.attention = { ...c.attention, kv_cache: kvCache, qsa: { heads: 2, head_dim: 32, topk: 8 } };
  c.moe = { ...c.moe, intermediate: 32, shared_intermediate: 32 };
  c.ple = { ...c.ple, head_dim: 16, rows: [[97, 101, 103, 107], [109, 113, 127, 131]] };
  return parseConfig(c, "trunk80bSmall");
}
