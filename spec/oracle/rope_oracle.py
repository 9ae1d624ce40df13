"""RoPE as transformers computes it for Qwen3-Next (Qwen3NextRotaryEmbedding and
apply_rotary_pos_emb, CPU, float32) at long positions, for the rotary settings of our presets
and of real checkpoints. lib/model/rope.ts and lib/reference must agree (spec/oracle/rope.test.ts).
  python3 spec/oracle/rope_oracle.py OUT_DIR      -> OUT_DIR/rope.json
"""

import base64
import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import AutoConfig
from transformers.models.qwen3_next import modeling_qwen3_next as qn

CONFIGS = [  # (name, rope_theta, head_dim, partial_rotary_factor)
    ("tiny", 10000.0, 16, 0.5),
    ("trained-tiny", 10000.0, 32, 0.5),
    ("small", 1e6, 32, 0.25),
    ("30b-a3b-shape", 1e7, 128, 0.25),
    ("qwen3-next-80b", 1e7, 256, 0.25),
    ("qwen3.5-full", 1e7, 64, 1.0),
]
POSITIONS = [0, 1, 7, 100, 4095, 4096, 4097, 5000, 8191, 12345, 32767, 65535, 100000, 131071, 262143]
HEADS = 2


def b64(a, dtype="<f4"):
    return base64.b64encode(np.ascontiguousarray(a, dtype=dtype).tobytes()).decode()


def config_for(theta, head_dim, partial):
    rp = {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": partial}
    common = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                  max_position_embeddings=1 << 19, rope_parameters=rp)
    try:
        cfg = AutoConfig.for_model("qwen3_next", partial_rotary_factor=partial, **common)
    except TypeError:
        cfg = AutoConfig.for_model("qwen3_next", **common)
    got = getattr(cfg, "rope_parameters", None) or {}
    if got.get("partial_rotary_factor") != partial or got.get("rope_theta") != theta:
        got = dict(got)
        got.update(rp)
        cfg.rope_parameters = got
    return cfg


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    cases = []
    for name, theta, hd, partial in CONFIGS:
        cfg = config_for(theta, hd, partial)
        rot = qn.Qwen3NextRotaryEmbedding(cfg)
        inv = rot.inv_freq.float().cpu()
        rd = int(inv.shape[0]) * 2
        assert rd == int(hd * partial), (name, rd)
        pos = torch.tensor([POSITIONS], dtype=torch.long)
        q = torch.randn(1, HEADS, len(POSITIONS), hd, dtype=torch.float32)
        cos, sin = rot(q, pos)  # [1, P, rd]
        q_embed, _ = qn.apply_rotary_pos_emb(q, q.clone(), cos, sin)
        # The f64 rule the reference used before: how far its angles are from these.
        inv64 = theta ** (-2 * np.arange(rd // 2) / rd)
        ang32 = (np.float32(POSITIONS)[:, None] * inv.numpy()[None, :]).astype(np.float32)
        drift = float(np.abs(np.array(POSITIONS, dtype=np.float64)[:, None] * inv64[None, :] - ang32.astype(np.float64)).max())
        cases.append({
            "name": name, "rope_theta": theta, "head_dim": hd, "partial_rotary_factor": partial, "rotary_dim": rd,
            "heads": HEADS, "inv_freq": b64(inv.numpy()),
            "cos": b64(cos[0].numpy()), "sin": b64(sin[0].numpy()),
            "q": b64(q[0].numpy()), "q_embed": b64(q_embed[0].numpy()),
            "f64_rule_max_angle_drift": drift,
        })
        print(f"{name}: rd {rd}, max |f64-rule angle - f32 angle| over the positions {drift:.3e} rad", flush=True)
    doc = {
        "source": f"transformers {transformers.__version__} Qwen3NextRotaryEmbedding.forward and apply_rotary_pos_emb "
                  f"(torch {torch.__version__}, CPU, float32); q [heads, positions, head_dim] ~ N(0, 1) seed 0",
        "positions": POSITIONS, "cases": cases,
    }
    with open(os.path.join(out_dir, "rope.json"), "w") as f:
        json.dump(doc, f)


if __name__ == "__main__":
    main()
