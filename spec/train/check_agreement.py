"""Runs the PyTorch qwen4-exp (qwen4exp.py) on the cases written by make-check-fixture.ts and
writes what lib/reference must reproduce:
  python3 spec/train/check_agreement.py CASES_DIR OUT_DIR
Each case directory holds config.json, case.json and the weights: model.safetensors (f32, cherenkov
names) or, with case.json "model_dir", a cherenkov model directory read here (examples/models).
For each case OUT_DIR/torch-<case>.json gets, computed in float64 with the recurrent DeltaNet over
whole sequences from position 0 (no caches, no rollback: an independent form of the same model):
  - logits / mtpLogits: the prompt's trunk logits and MTP catch-up logits (row t: h_t, token t+1);
  - decode: the greedy continuation (torch's own argmax) and the logits at every position;
  - spec: speculative decoding as MODEL.md defines it, for each draft count: every step's drafts
    (MTP catch-up, then chained rows fed (out, draft)), the verify rows' logits, the accept count
    and the tokens; rows after a rejection are computed on the accepted sequence only, so the
    reference's state after each rollback is checked by the next step's logits.
Logit rows are little-endian f32 in base64: whole rows for small vocabularies, else the top 64
entries per row (ids i32, values f32) and the row's largest |logit|.
The chunked DeltaNet is checked against the recurrent one on the way (printed).
"""

import base64
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen4exp import Qwen4Exp, read_safetensors  # noqa: E402

torch.set_grad_enabled(False)
FULL_ROWS_UP_TO = 1024  # vocabularies up to this size store whole rows
TOP = 64


def b64(a, dtype="<f4"):
    return base64.b64encode(np.ascontiguousarray(a, dtype=dtype).tobytes()).decode()


def pack_rows(rows):
    """rows [R, V] (torch) -> the JSON form described above."""
    a = rows.detach().cpu().numpy().astype(np.float64)
    R, V = a.shape
    if V <= FULL_ROWS_UP_TO:
        return {"rows": R, "format": "full", "values": b64(a)}
    ids = np.argsort(-a, axis=1, kind="stable")[:, :TOP]
    vals = np.take_along_axis(a, ids, axis=1)
    return {"rows": R, "format": "top", "k": TOP, "ids": b64(ids, "<i4"), "values": b64(vals),
            "rowMaxAbs": b64(np.abs(a).max(axis=1))}


def margin(row):
    top = torch.topk(row, 2).values
    return float(top[0] - top[1])


# --- cherenkov model directories (dense.bin, experts.bin, ple.bin), numpy only ---------------

def _decode(raw, dtype, shape):
    n = int(np.prod(shape))
    if dtype == "f32":
        return np.frombuffer(raw, dtype="<f4", count=n).reshape(shape).astype(np.float32)
    if dtype == "f16":
        return np.frombuffer(raw, dtype="<f2", count=n).reshape(shape).astype(np.float32)
    if dtype == "bf16":
        b = np.frombuffer(raw, dtype="<u2", count=n).astype(np.uint32) << 16
        return b.view(np.float32).reshape(shape)
    if dtype == "q4":  # lib/model/q4.ts: nibbles (low first), bf16 scales, bf16 biases, group 32
        nib = np.frombuffer(raw, dtype=np.uint8, count=n // 2)
        q = np.empty(n, dtype=np.float64)
        q[0::2] = nib & 15
        q[1::2] = nib >> 4
        g = n // 32
        s = (np.frombuffer(raw, dtype="<u2", count=g, offset=n // 2).astype(np.uint32) << 16).view(np.float32)
        b = (np.frombuffer(raw, dtype="<u2", count=g, offset=n // 2 + 2 * g).astype(np.uint32) << 16).view(np.float32)
        v = s.astype(np.float32)[:, None] * q.reshape(g, 32).astype(np.float32) + b.astype(np.float32)[:, None]
        return v.astype(np.float32).reshape(shape)
    raise ValueError(f"unknown dtype {dtype}")


def read_cherenkov(model_dir):
    """name -> f32 array in cherenkov names (experts.{l}.{e}.{part}, ple.{l}.{o}.{j})."""
    m = json.load(open(os.path.join(model_dir, "cherenkov.json")))
    c = m["config"]
    out = {}
    dense = open(os.path.join(model_dir, "dense.bin"), "rb").read()
    for t in m["tensors"]:
        out[t["name"]] = _decode(dense[t["offset"]:t["offset"] + t["bytes"]], t["dtype"], t["shape"])
    ex = m["experts"]
    experts = open(os.path.join(model_dir, "experts.bin"), "rb").read()
    E = c["moe"]["experts"]
    for l in range(ex["layers"]):
        for e in range(E):
            base = (l * E + e) * ex["stride"]
            for p in ex["parts"]:
                at = base + p["offset"]
                out[f"experts.{l}.{e}.{p['name']}"] = _decode(experts[at:at + p["bytes"]], p["dtype"], p["shape"])
    if m.get("ple"):
        ple = open(os.path.join(model_dir, "ple.bin"), "rb").read()
        hd = c["ple"]["head_dim"]
        for t in m["ple"]["tables"]:
            raw = ple[t["offset"]:t["offset"] + t["bytes"]]
            out[f"ple.{t['layer']}.{t['order_index']}.{t['head']}"] = _decode(raw, m["ple"]["dtype"], [t["rows"], hd])
    return c, out


# --- the runs ---------------------------------------------------------------------------------

class Runner:
    def __init__(self, model, kv):
        self.model, self.kv = model, kv

    def trunk(self, seq):
        logits, hidden = self.model(torch.tensor([seq]), kv=self.kv, deltanet_chunk=0)
        return logits[0], hidden[0]

    def mtp(self, hidden_rows, tokens):
        logits, out = self.model.mtp_rows(torch.stack(hidden_rows)[None], torch.tensor([tokens]), kv=self.kv)
        return logits[0], out[0]


def greedy(run, prompt, n):
    seq = list(prompt)
    margins = []
    for _ in range(n):
        logits, _ = run.trunk(seq)
        seq.append(int(torch.argmax(logits[-1])))
        margins.append(margin(logits[-1]))
    logits, _ = run.trunk(seq)
    return seq, logits, margins


def speculative(run, prompt, max_tokens, drafts):
    """MODEL.md's speculative greedy decoding, each forward recomputed from position 0."""
    seq = list(prompt)  # tokens run through the trunk (committed)
    logits, hidden = run.trunk(seq)
    nxt = int(torch.argmax(logits[-1]))
    emitted = [nxt]
    steps, verify_rows, chain_rows = [], [], []
    min_draft_margin, min_verify_margin = float("inf"), float("inf")
    while len(emitted) < max_tokens:
        k = min(drafts, max_tokens - len(emitted) - 1)
        ds = []
        if k > 0:
            # MTP entry p = (h_p, tok[p+1]) for every committed position, then chained rows.
            h_in = [hidden[p] for p in range(len(seq))]
            t_in = seq[1:] + [nxt]
            lg, out = run.mtp(h_in, t_in)
            row = lg[-1]
            while True:
                chain_rows.append(row)
                min_draft_margin = min(min_draft_margin, margin(row))
                ds.append(int(torch.argmax(row)))
                if len(ds) == k:
                    break
                h_in = h_in + [out[-1]]
                t_in = t_in + [ds[-1]]
                lg, out = run.mtp(h_in, t_in)
                row = lg[-1]
        vl, vh = run.trunk(seq + [nxt] + ds)
        rows = vl[len(seq):]
        verify_rows.append(rows)
        for r in rows:
            min_verify_margin = min(min_verify_margin, margin(r))
        a = 0
        while a < len(ds) and int(torch.argmax(rows[a])) == ds[a]:
            a += 1
        bonus = int(torch.argmax(rows[a]))
        steps.append({"position": len(seq), "next": nxt, "drafts": ds, "accepted": a, "bonus": bonus})
        seq = seq + [nxt] + ds[:a]
        emitted += ds[:a] + [bonus]
        nxt = bonus
        hidden = vh[:len(seq)]  # causal: the committed rows' hidden, as if run alone
    emitted = emitted[:max_tokens]
    by_position = [sum(1 for s in steps if s["accepted"] > j) for j in range(drafts)]
    proposed_by_position = [sum(1 for s in steps if len(s["drafts"]) > j) for j in range(drafts)]
    return {
        "drafts": drafts, "maxTokens": max_tokens, "tokens": emitted, "steps": steps,
        "byPosition": by_position, "proposedByPosition": proposed_by_position,
        "verify": pack_rows(torch.cat(verify_rows)),
        "chain": pack_rows(torch.stack(chain_rows)) if chain_rows else None,
        "minDraftMargin": min_draft_margin if chain_rows else None, "minVerifyMargin": min_verify_margin,
    }


def run_case(case_dir):
    case = json.load(open(os.path.join(case_dir, "case.json")))
    if case.get("model_dir"):
        config, tensors = read_cherenkov(case["model_dir"])
    else:
        config = json.load(open(os.path.join(case_dir, "config.json")))
        tensors = read_safetensors(os.path.join(case_dir, "model.safetensors"))
    model = Qwen4Exp(config)
    model.load_cherenkov(tensors)
    model = model.double()
    kv = config["attention"]["kv_cache"]
    run = Runner(model, kv)
    prompt = case["prompt"]
    tokens = torch.tensor([prompt])
    logits, hidden = model(tokens, kv=kv, deltanet_chunk=0)
    chunked, _ = model(tokens, kv=kv, deltanet_chunk=4)
    rel = ((chunked - logits).abs().amax(-1) / logits.abs().amax(-1)).max().item()
    out = {
        "name": case["name"], "seed": case.get("seed"), "features": case.get("features"), "prompt": prompt,
        "vocab": config["vocab_size"],
        "logits": pack_rows(logits[0]),
        "torch": torch.__version__, "dtype": "float64", "deltanet": "recurrent",
        "chunked_vs_recurrent": rel,
    }
    if config["mtp"]:
        mtp_logits, _ = model.mtp(hidden, tokens, kv=kv)
        out["mtpLogits"] = pack_rows(mtp_logits[0])
    if case.get("decode"):
        seq, dl, margins = greedy(run, prompt, case["decode"])
        out["decode"] = {"tokens": seq, "logits": pack_rows(dl), "minMargin": min(margins)}
    if config["mtp"] and case.get("spec"):
        out["spec"] = [speculative(run, prompt, case["spec"]["maxTokens"], k) for k in case["spec"]["drafts"]]
    return out


def main():
    cases, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    for name in sorted(os.listdir(cases)):
        d = os.path.join(cases, name)
        if not os.path.exists(os.path.join(d, "case.json")):
            continue
        t0 = time.time()
        try:
            r = run_case(d)
        except Exception as e:  # keep going: the log says which case failed and why
            import traceback
            traceback.print_exc()
            print(f"{name}: FAILED {e!r}", flush=True)
            continue
        with open(os.path.join(out_dir, f"torch-{name}.json"), "w") as f:
            json.dump(r, f)
        line = f"{name}: chunked vs recurrent DeltaNet max rel diff {r['chunked_vs_recurrent']:.2e}"
        if "decode" in r:
            line += f"; decode {len(r['decode']['tokens']) - len(r['prompt'])} tokens, min margin {r['decode']['minMargin']:.3e}"
        for s in r.get("spec", []):
            line += (f"; {s['drafts']} drafts: accepted {s['byPosition']} of {s['proposedByPosition']}, "
                     f"min draft margin {s['minDraftMargin']}, min verify margin {s['minVerifyMargin']:.3e}")
        print(f"{line} ({time.time() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
