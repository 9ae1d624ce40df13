# The same-weights peer of docs/performance.md's H200 section: transformers' own Qwen3-Next at the
# 30b-a3b-shape preset's dimensions (LAYERS layers, random bf16 weights made on the GPU), saved as a
# Hugging Face checkpoint for `cherenkov convert`, and its greedy decode timed on the same weights.
# Run on the H200 machine (torch and transformers are there):
#   python3 spec/bench/peer-same-weights.py LAYERS PROMPT TOKENS OUT_DIR
# then `bun lib/cli/main.ts convert OUT_DIR MODEL_DIR` and
# `bun spec/bench/decode.ts --json --only-model --model MODEL_DIR --prompt PROMPT --tokens TOKENS`.
# The prompt is decode.ts's: ids (37 i + 11) mod 256. transformers runs bf16, cherenkov the q4
# conversion of the same tensors (so: the same model, not the same bytes).
import sys, time, json, importlib.util
import torch
from peer_config import random_model

L, P, T, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
model, init = random_model(L)
t0 = time.time()
model.save_pretrained(out, safe_serialization=True, max_shard_size="4GB")
save = time.time() - t0
ids = torch.tensor([[(37 * i + 11) % 256 for i in range(P)]], device="cuda")
with torch.no_grad():
    model.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False)  # warm-up
    torch.cuda.synchronize(); t0 = time.time()
    model(ids)
    torch.cuda.synchronize(); prefill = time.time() - t0
    t0 = time.time()
    gen = model.generate(ids, max_new_tokens=T, min_new_tokens=T, do_sample=False)
    torch.cuda.synchronize(); dt = time.time() - t0
# generate() includes the prompt's forward: decode time = total - one prefill.
decode = max(dt - prefill, 1e-9)
print(json.dumps({"peer": "transformers " + __import__("transformers").__version__, "torch": torch.__version__, "same_weights": out,
    "layers": L, "prompt": P, "tokens": T, "fla": importlib.util.find_spec("fla") is not None, "init_s": round(init, 1),
    "save_s": round(save, 1), "prefill_tokens_per_s": P / prefill, "tokens_per_s": T / decode, "generate_tokens_per_s_incl_prefill": T / dt,
    "generated": gen[0, P:].tolist()}))
