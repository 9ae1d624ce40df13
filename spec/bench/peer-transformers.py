# The peer figure for docs/performance.md's H200 section: transformers' own Qwen3-Next model
# (random bf16 weights made on the GPU) at the 30b-a3b-shape preset's dimensions, greedy decode
# timed with CUDA synchronisation. Run on the H200 machine (transformers and torch are there):
#   python3 spec/bench/peer-transformers.py LAYERS TOKENS
# Fewer layers than 48 keep init short; tok/s is also given scaled to 48 layers (decode time is
# per layer). Not the same weights as the synthetic q4 model cherenkov runs: the same shape.
import sys, time, json, importlib.util
import torch
from transformers import Qwen3NextConfig, AutoModelForCausalLM

L = int(sys.argv[1]) if len(sys.argv) > 1 else 8
T = int(sys.argv[2]) if len(sys.argv) > 2 else 16
cfg = Qwen3NextConfig(vocab_size=151936, hidden_size=2048, num_hidden_layers=L, num_attention_heads=32, num_key_value_heads=4,
    head_dim=128, partial_rotary_factor=0.25, rope_theta=1e7, linear_num_value_heads=32, linear_num_key_heads=16,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=128, num_experts_per_tok=8,
    moe_intermediate_size=768, shared_expert_intermediate_size=768, intermediate_size=6144, full_attention_interval=4,
    decoder_sparse_step=1, norm_topk_prob=True, max_position_embeddings=8192)
torch.manual_seed(0)
t0 = time.time()
with torch.device("cuda"):
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
model.eval()
init = time.time() - t0
ids = torch.randint(0, 151936, (1, 16), device="cuda")
with torch.no_grad():
    model.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False)
    torch.cuda.synchronize(); t0 = time.time()
    model.generate(ids, max_new_tokens=T, min_new_tokens=T, do_sample=False)
    torch.cuda.synchronize(); dt = time.time() - t0
print(json.dumps({"peer": "transformers " + __import__("transformers").__version__, "torch": torch.__version__, "layers": L, "tokens": T,
    "fla": importlib.util.find_spec("fla") is not None, "init_s": round(init, 1), "tokens_per_s": T / dt, "tokens_per_s_48_layers": T / dt * L / 48,
    "note": "shared expert 768 (transformers' Qwen3-Next always has one; the preset has none)"}))
