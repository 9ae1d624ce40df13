"""Runs the PyTorch qwen4-exp (qwen4exp.py) on the random-weight cases written by
make-check-fixture.ts and writes the logits lib/reference must reproduce:
  python3 spec/train/check_agreement.py CASES_DIR OUT_DIR
For each case: OUT_DIR/<case>.json with the prompt, per-position trunk logits and MTP logits
(little-endian f32, base64), computed in float64 with the recurrent DeltaNet; the chunked form
is checked against it on the way (printed).
"""

import base64
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen4exp import Qwen4Exp, read_safetensors  # noqa: E402

torch.set_grad_enabled(False)


def b64(a):
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode()


def run_case(case_dir):
    config = json.load(open(os.path.join(case_dir, "config.json")))
    case = json.load(open(os.path.join(case_dir, "case.json")))
    model = Qwen4Exp(config)
    model.load_cherenkov(read_safetensors(os.path.join(case_dir, "model.safetensors")))
    model = model.double()
    kv = config["attention"]["kv_cache"]
    tokens = torch.tensor([case["prompt"]])
    logits, hidden = model(tokens, kv=kv, deltanet_chunk=0)
    chunked, _ = model(tokens, kv=kv, deltanet_chunk=4)
    rel = ((chunked - logits).abs().amax(-1) / logits.abs().amax(-1)).max().item()
    out = {
        "name": case["name"], "seed": case["seed"], "features": case["features"], "prompt": case["prompt"],
        "vocab": config["vocab_size"],
        "logits": b64(logits[0].numpy()),
        "torch": torch.__version__, "dtype": "float64", "deltanet": "recurrent",
        "chunked_vs_recurrent": rel,
    }
    if config["mtp"]:
        mtp_logits, _ = model.mtp(hidden, tokens, kv=kv)
        out["mtpLogits"] = b64(mtp_logits[0].numpy())
    return out


def main():
    cases, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    for name in sorted(os.listdir(cases)):
        d = os.path.join(cases, name)
        if not os.path.exists(os.path.join(d, "case.json")):
            continue
        r = run_case(d)
        with open(os.path.join(out_dir, f"torch-{name}.json"), "w") as f:
            json.dump(r, f)
        print(f"{name}: chunked vs recurrent DeltaNet max rel diff {r['chunked_vs_recurrent']:.2e}", flush=True)


if __name__ == "__main__":
    main()
