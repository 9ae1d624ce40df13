# The peer figure for docs/performance.md's H200 section: transformers' own Qwen3-Next model
# (random bf16 weights made on the GPU) at the 30b-a3b-shape preset's dimensions, greedy decode
# timed with CUDA synchronisation. Run on the H200 machine (transformers and torch are there):
#   python3 spec/bench/peer-transformers.py LAYERS TOKENS
# Fewer layers than 48 keep init short; tok/s is also given scaled to 48 layers (decode time is
# per layer). Not the same weights as the synthetic q4 model cherenkov runs: the same shape.
import sys, time, json, importlib.util
import torch
from peer_config import random_model

L = int(sys.argv[1]) if len(sys.argv) > 1 else 8
T = int(sys.argv[2]) if len(sys.argv) > 2 else 16
model, init = random_model(L)
ids = torch.randint(0, 151936, (1, 16), device="cuda")
with torch.no_grad():
    model.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False)
    torch.cuda.synchronize(); t0 = time.time()
    model.generate(ids, max_new_tokens=T, min_new_tokens=T, do_sample=False)
    torch.cuda.synchronize(); dt = time.time() - t0
print(json.dumps({"peer": "transformers " + __import__("transformers").__version__, "torch": torch.__version__, "layers": L, "tokens": T,
    "fla": importlib.util.find_spec("fla") is not None, "init_s": round(init, 1), "tokens_per_s": T / dt, "tokens_per_s_48_layers": T / dt * L / 48,
    "note": "shared expert 768 (transformers' Qwen3-Next always has one; the preset has none)"}))
