"""Trains one of the two example models on the corpus of prepare_data.py, within a wall-clock
budget, and exports it (runs on the H200 machine; bf16 autocast, fixed seed).

  python3 spec/train/train.py --arch qwen4 --data DIR --out DIR --trunk-seconds S --mtp-seconds S
  python3 spec/train/train.py --arch qwen3next ...

qwen4:     qwen4-exp (qwen4exp.py) with the config spec/train/qwen4-exp-tiny.config.json;
           exported under cherenkov names (shards *.safetensors, bf16) + config.json.
qwen3next: transformers' Qwen3-Next classes (3 DeltaNet : 1 attention, MoE with a shared
           expert) + an MTP head of vLLM's qwen3_next_mtp form (mtp.* names); exported as a
           Hugging Face checkpoint (bf16 shards + config.json) for `cherenkov convert`.

Both: trunk trained on next-token loss (+ router balance loss); the MTP head trained on the
trunk's detached final hidden with the shared embedding and LM head detached (the trunk never
sees its gradient), then alone on the frozen final trunk. Held-out loss (nats/token) and MTP
top-1 agreement are written to metrics.json.
"""

import argparse
import copy
import json
import math
import os
import sys
import time
import traceback

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import qwen4exp as Q  # noqa: E402

SEED = 1234
DEVICE = "cuda"


def autocast():
    return torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=DEVICE == "cuda")


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


# --- data -----------------------------------------------------------------------------------

class Data:
    def __init__(self, d, T, B, device):
        self.train = np.fromfile(os.path.join(d, "train.u16"), dtype=np.uint16).astype(np.int64)
        self.val = np.fromfile(os.path.join(d, "val.u16"), dtype=np.uint16).astype(np.int64)
        self.T, self.B, self.device = T, B, device
        self.rng = np.random.default_rng(SEED)

    def batch(self):
        starts = self.rng.integers(0, self.train.size - self.T - 1, size=self.B)
        x = np.stack([self.train[s:s + self.T] for s in starts])
        return torch.from_numpy(x).to(self.device, non_blocking=True)

    def val_batches(self, windows):
        n = min(windows, self.val.size // self.T)
        w = self.val[: n * self.T].reshape(n, self.T)
        for i in range(0, n, self.B):
            yield torch.from_numpy(w[i:i + self.B]).to(self.device)


def lr_at(frac, peak, warm=0.05, floor=0.1):
    if frac < warm:
        return peak * frac / warm
    p = min(1.0, (frac - warm) / (1 - warm))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))


def ce(logits, targets):
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


# --- q4 as cherenkov stores it (lib/model/q4.ts): affine 4-bit, group 32 along the last dim --

def q4_roundtrip(w):
    g = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, 32)
    mn, mx = g.min(axis=1), g.max(axis=1)
    s = Q.f32_to_bf16_bits(((mx.astype(np.float64) - mn.astype(np.float64)) / 15.0).astype(np.float32))
    b = Q.f32_to_bf16_bits(mn)
    s = (s.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    b = (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    ok = s > 0
    q = np.clip(np.floor((g - b[:, None]) / np.where(ok, s, 1.0)[:, None] + 0.5), 0, 15)
    q[~ok] = 0
    return (s[:, None] * q + b[:, None]).astype(np.float32).reshape(np.shape(w))


def round_bf16(w):
    return (Q.f32_to_bf16_bits(w).astype(np.uint32) << 16).view(np.float32).reshape(np.shape(w))


def stored(w, role):
    """The values a q4 model directory holds for a tensor of this storage role."""
    if role == "matrix" and w.shape[-1] % 32 == 0:
        return q4_roundtrip(w)
    if role in ("matrix", "small"):
        return round_bf16(w)
    return w


# --- export ---------------------------------------------------------------------------------

def write_shards(tensors, out_dir, prefix, limit=15_000_000):
    """bf16 safetensors shards of at most `limit` bytes each."""
    os.makedirs(out_dir, exist_ok=True)
    shards, cur, size = [], {}, 0
    for name, a in tensors.items():
        nbytes = a.size * 2
        if cur and size + nbytes > limit:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = a
        size += nbytes
    if cur:
        shards.append(cur)
    paths = []
    for i, s in enumerate(shards):
        p = os.path.join(out_dir, f"{prefix}-{i + 1}-of-{len(shards)}.safetensors")
        Q.write_safetensors(p, s, dtype="BF16")
        paths.append(p)
    return paths


# --- qwen4-exp ------------------------------------------------------------------------------

CHERENKOV_ROLE = {"embed": "matrix", "matrix": "matrix", "out": "matrix", "ple_k": "matrix", "ple_v": "matrix",
                  "small": "small", "router": "small", "hc_fn": "small"}


class Qwen4Run:
    def __init__(self, args, device):
        self.cfg = json.load(open(args.config))
        torch.manual_seed(SEED)
        self.model = Q.Qwen4Exp(self.cfg, init_seed=SEED).to(device)
        self.device = device

    def mtp_names(self):
        L = self.cfg["num_layers"]
        return {Q.key(n) for n, _, _ in Q.dense_specs(self.cfg) if n.startswith("mtp.")} | {
            Q.key(f"experts.{L}.{p}") for p in ("gate", "up", "down")}

    def losses(self, x, phase, frac):
        m = self.model
        aux = {}
        if phase == "trunk":
            qsa = "dense" if frac < 0.15 else "select"
            logits, hidden = m(x, kv="f32", deltanet_chunk=64, qsa=qsa, aux=aux)
            main = ce(logits[:, :-1], x[:, 1:])
            mtp_logits = self.mtp_logits(hidden.detach(), x)
            mtp = ce(mtp_logits[:, :-1], x[:, 2:])
            loss = main + 0.01 * aux["balance"] + aux.get("indexer", 0) + 0.3 * mtp
            return loss, {"loss": main.item(), "mtp": mtp.item(), "indexer": float(aux.get("indexer", 0))}
        with torch.no_grad():
            _, hidden = m(x, kv="f32", deltanet_chunk=64, qsa="select")
        mtp = ce(self.mtp_logits(hidden, x)[:, :-1], x[:, 2:])
        return mtp, {"mtp": mtp.item()}

    def mtp_logits(self, hidden, x, kv="f32"):
        """The MTP head with the shared embedding and LM head detached (frozen for it)."""
        return self.model.mtp(hidden, x, kv=kv, detach_shared=True)[0]

    @torch.no_grad()
    def evaluate(self, data, windows, kv="f32"):
        tot, mt, n, agree, nm = 0.0, 0.0, 0, 0, 0
        for x in data.val_batches(windows):
            with autocast():
                logits, hidden = self.model(x, kv=kv, deltanet_chunk=64, qsa="select")
                ml, _ = self.model.mtp(hidden, x, kv=kv)
            tot += ce(logits[:, :-1], x[:, 1:]).item() * x[:, 1:].numel()
            n += x[:, 1:].numel()
            mt += ce(ml[:, :-1], x[:, 2:]).item() * x[:, 2:].numel()
            nm += x[:, 2:].numel()
            # draft 1 is accepted when the MTP argmax equals the trunk's argmax one step later
            agree += (ml[:, :-1].argmax(-1) == logits[:, 1:-1].argmax(-1)).sum().item()
        return {"loss": tot / n, "mtp_loss": mt / nm, "mtp_agree_trunk": agree / nm, "tokens": n}

    def quantize_(self):
        """Replaces every weight by what the q4 model directory stores."""
        roles = {n: CHERENKOV_ROLE.get(r, "vector") for n, _, r in Q.dense_specs(self.cfg)}
        with torch.no_grad():
            for k, p in self.model.params.items():
                name = k.replace("__", ".")
                role = roles.get(name, "matrix" if name.startswith("experts.") else "ple")
                a = p.detach().float().cpu().numpy()
                a = round_bf16(a) if role == "ple" else stored(a, role)
                p.copy_(torch.from_numpy(a))

    def export(self, out):
        paths = write_shards(self.model.export_cherenkov(), out, "qwen4-exp")
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(self.cfg, f, indent=1)
        return paths


# --- Qwen3-Next (transformers) --------------------------------------------------------------

class Qwen3NextRun:
    def __init__(self, args, device):
        from transformers import AutoConfig, AutoModelForCausalLM
        q = json.load(open(args.config))
        d, at, dn, m = q["hidden_size"], q["attention"], q["deltanet"], q["moe"]
        kw = dict(
            vocab_size=q["vocab_size"], hidden_size=d, num_hidden_layers=q["num_layers"],
            layer_types=["linear_attention" if t == "deltanet" else "full_attention" for t in q["layer_types"]],
            num_attention_heads=at["heads"], num_key_value_heads=at["kv_heads"], head_dim=at["head_dim"],
            linear_num_key_heads=dn["key_heads"], linear_num_value_heads=dn["value_heads"],
            linear_key_head_dim=dn["key_dim"], linear_value_head_dim=dn["value_dim"], linear_conv_kernel_dim=dn["conv_kernel"],
            num_experts=m["experts"], num_experts_per_tok=m["top_k"], moe_intermediate_size=m["intermediate"],
            shared_expert_intermediate_size=m["shared_intermediate"], intermediate_size=m["intermediate"],
            norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6, tie_word_embeddings=False,
            partial_rotary_factor=at["partial_rotary_factor"],
            rope_parameters={"rope_type": "default", "rope_theta": float(at["rope_theta"]),
                             "partial_rotary_factor": at["partial_rotary_factor"]},
            max_position_embeddings=4096, bos_token_id=None, eos_token_id=q["eos_token_id"], pad_token_id=q["eos_token_id"],
            router_aux_loss_coef=0.01, output_router_logits=False, initializer_range=0.02,
        )
        try:
            cfg = AutoConfig.for_model("qwen3_next", **kw)
        except TypeError:
            kw.pop("partial_rotary_factor")
            cfg = AutoConfig.for_model("qwen3_next", **kw)
        rp = getattr(cfg, "rope_parameters", None) or {}
        if rp.get("partial_rotary_factor") != at["partial_rotary_factor"]:
            rp["partial_rotary_factor"] = at["partial_rotary_factor"]
            cfg.rope_parameters = rp
        torch.manual_seed(SEED)
        self.model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").to(device)
        rot = self.model.model.rotary_emb
        rd = int(rot.inv_freq.shape[0]) * 2
        if rd != round(at["head_dim"] * at["partial_rotary_factor"]):
            raise RuntimeError(f"rotary dim {rd} != head_dim * partial_rotary_factor ({cfg.rope_parameters})")
        self.cfg = cfg
        self.device = device
        self.mtp = self.make_mtp().to(device)
        self.hidden = {}
        self.model.model.norm.register_forward_hook(lambda mod, i, o: self.hidden.__setitem__("h", o))
        log(f"qwen3next: {sum(p.numel() for p in self.model.parameters()) / 1e6:.2f} M trunk parameters, "
            f"{sum(p.numel() for p in self.mtp.parameters()) / 1e6:.2f} M MTP")

    def make_mtp(self):
        """vLLM qwen3_next_mtp: fc over [norm(embed) | norm(hidden)], one full-attention decoder
        layer, a final norm; the LM head is the trunk's."""
        cfg = copy.deepcopy(self.cfg)
        cfg.num_hidden_layers = 1
        cfg.layer_types = ["full_attention"]
        cfg._attn_implementation = "eager"
        layer = type(self.model.model.layers[0])(cfg, 0)
        norm_cls = type(self.model.model.norm)
        d = cfg.hidden_size
        mtp = torch.nn.Module()
        mtp.fc = torch.nn.Linear(2 * d, d, bias=False)
        mtp.pre_fc_norm_embedding = norm_cls(d, eps=cfg.rms_norm_eps)
        mtp.pre_fc_norm_hidden = norm_cls(d, eps=cfg.rms_norm_eps)
        mtp.layers = torch.nn.ModuleList([layer])
        mtp.norm = norm_cls(d, eps=cfg.rms_norm_eps)
        # start from the trunk's last attention layer (same class and shapes), fc and norms fresh
        last = [i for i, t in enumerate(self.cfg.layer_types) if t == "full_attention"][-1]
        layer.load_state_dict(self.model.model.layers[last].state_dict())
        g = torch.Generator().manual_seed(SEED + 1)
        with torch.no_grad():
            mtp.fc.weight.copy_(torch.randn(mtp.fc.weight.shape, generator=g) * 0.02)
            for nm in (mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.norm):
                nm.weight.zero_()
        return mtp

    def mtp_names(self):
        return None

    def mtp_logits(self, hidden, x):
        mtp, model = self.mtp, self.model
        n = x.shape[1] - 1
        emb = model.model.embed_tokens(x[:, 1:]).detach()
        h = mtp.fc(torch.cat([mtp.pre_fc_norm_embedding(emb), mtp.pre_fc_norm_hidden(hidden[:, :n])], dim=-1))
        pos = torch.arange(n, device=x.device).unsqueeze(0)
        pe = model.model.rotary_emb(h, pos)
        mask = torch.full((n, n), torch.finfo(h.dtype).min, device=x.device).triu(1).view(1, 1, n, n)
        out = mtp.layers[0](h, position_embeddings=pe, attention_mask=mask, position_ids=pos)
        if isinstance(out, tuple):
            out = out[0]
        return F.linear(mtp.norm(out), model.lm_head.weight.detach())

    def losses(self, x, phase, frac):
        if phase == "trunk":
            out = self.model(input_ids=x, output_router_logits=True, use_cache=False)
            main = ce(out.logits[:, :-1], x[:, 1:])
            aux = getattr(out, "aux_loss", None)
            loss = main + (0.01 * aux if aux is not None else 0)
            mtp = ce(self.mtp_logits(self.hidden["h"].detach(), x)[:, :-1], x[:, 2:])
            return loss + 0.3 * mtp, {"loss": main.item(), "mtp": mtp.item(), "aux": float(aux) if aux is not None else -1}
        with torch.no_grad():
            self.model.model(input_ids=x, use_cache=False)
        mtp = ce(self.mtp_logits(self.hidden["h"].detach(), x)[:, :-1], x[:, 2:])
        return mtp, {"mtp": mtp.item()}

    @torch.no_grad()
    def evaluate(self, data, windows, kv="f32"):
        tot, mt, n, agree, nm = 0.0, 0.0, 0, 0, 0
        for x in data.val_batches(windows):
            with autocast():
                logits = self.model(input_ids=x, use_cache=False).logits
                ml = self.mtp_logits(self.hidden["h"], x)
            tot += ce(logits[:, :-1], x[:, 1:]).item() * x[:, 1:].numel()
            n += x[:, 1:].numel()
            mt += ce(ml[:, :-1], x[:, 2:]).item() * x[:, 2:].numel()
            nm += x[:, 2:].numel()
            agree += (ml[:, :-1].argmax(-1) == logits[:, 1:-1].argmax(-1)).sum().item()
        return {"loss": tot / n, "mtp_loss": mt / nm, "mtp_agree_trunk": agree / nm, "tokens": n}

    @staticmethod
    def role(name):
        small = ("mlp.gate.weight", "shared_expert_gate.weight", "in_proj_ba.weight")
        matrix = ("embed_tokens.weight", "lm_head.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                  "in_proj_qkvz.weight", "out_proj.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight",
                  "experts.gate_up_proj", "experts.down_proj", "fc.weight")
        if name.endswith(small):
            return "small"
        return "matrix" if name.endswith(matrix) else "vector"

    def quantize_(self):
        with torch.no_grad():
            for mod, prefix in ((self.model, ""), (self.mtp, "mtp.")):
                for k, p in mod.state_dict().items():
                    a = stored(p.detach().float().cpu().numpy(), self.role(prefix + k))
                    p.copy_(torch.from_numpy(a))

    def export(self, out):
        tensors = {}
        for k, v in self.model.state_dict().items():
            tensors[k] = v.detach().float().cpu().numpy()
        for k, v in self.mtp.state_dict().items():
            tensors["mtp." + k] = v.detach().float().cpu().numpy()
        paths = write_shards(tensors, out, "model")
        d = self.cfg.to_dict()
        d["architectures"] = ["Qwen3NextForCausalLM"]
        d["model_type"] = "qwen3_next"
        d["torch_dtype"] = "bfloat16"
        d["num_nextn_predict_layers"] = 1
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(d, f, indent=1, default=str)
        return paths


# --- the loop -------------------------------------------------------------------------------

def train(run, data, seconds, phase, peak_lr, trainable, metrics):
    params = [p for p in trainable if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=peak_lr, betas=(0.9, 0.95), eps=1e-8)
    t0 = time.time()
    step = 0
    hist = []
    while True:
        frac = (time.time() - t0) / seconds
        if frac >= 1:
            break
        lr = lr_at(frac, peak_lr)
        for g in opt.param_groups:
            g["lr"] = lr
        x = data.batch()
        with autocast():
            loss, info = run.losses(x, phase, frac)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % 50 == 0 or step == 1:
            el = time.time() - t0
            log(f"{phase} step {step} {el:.0f}s lr {lr:.2e} gnorm {gn:.2f} " + " ".join(f"{k} {v:.4f}" for k, v in info.items())
                + f" ({step * x.numel() / el / 1e3:.0f} k tok/s)")
            hist.append({"step": step, "seconds": round(el, 1), **{k: round(v, 4) for k, v in info.items()}})
    metrics[f"{phase}_steps"] = step
    metrics[f"{phase}_tokens"] = step * data.B * data.T
    metrics[f"{phase}_history"] = hist
    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=["qwen4", "qwen3next"], required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--trunk-seconds", type=float, required=True)
    ap.add_argument("--mtp-seconds", type=float, required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--val-windows", type=int, default=512)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--config", default=os.path.join(HERE, "qwen4-exp-tiny.config.json"))
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 parts (DeltaNet, hc) stay f32
    device = args.device
    metrics = {"arch": args.arch, "seed": SEED, "batch": args.batch, "seq": args.seq, "lr": args.lr, "torch": torch.__version__}

    def save_metrics():
        with open(os.path.join(args.out, "metrics.json"), "w") as f:
            json.dump(metrics, f, indent=1)

    run = (Qwen4Run if args.arch == "qwen4" else Qwen3NextRun)(args, device)
    data = Data(args.data, args.seq, args.batch, device)
    trunk_params = list(run.model.parameters())
    if args.arch == "qwen3next":
        trunk_params += list(run.mtp.parameters())
    metrics["parameters"] = sum(p.numel() for p in trunk_params)
    try:
        train(run, data, args.trunk_seconds, "trunk", args.lr, trunk_params, metrics)
    except Exception:  # noqa: BLE001 - keep what was learned so far
        metrics["trunk_error"] = traceback.format_exc()
        log(metrics["trunk_error"])
    save_metrics()
    # the MTP head alone on the frozen trunk
    try:
        if args.arch == "qwen4":
            names = run.mtp_names()
            mtp_params = [p for k, p in run.model.params.items() if k in names]
            for k, p in run.model.params.items():
                p.requires_grad_(k in names)
        else:
            for p in run.model.parameters():
                p.requires_grad_(False)
            mtp_params = list(run.mtp.parameters())
        train(run, data, args.mtp_seconds, "mtp", args.lr / 3, mtp_params, metrics)
    except Exception:  # noqa: BLE001
        metrics["mtp_error"] = traceback.format_exc()
        log(metrics["mtp_error"])
    save_metrics()
    try:
        run.model.eval()
        metrics["paths"] = run.export(args.out)
        metrics["val"] = run.evaluate(data, args.val_windows)
        log("val", metrics["val"])
        if args.arch == "qwen4":
            metrics["val_q8"] = run.evaluate(data, args.val_windows, kv="q8")
            log("val q8 kv", metrics["val_q8"])
        run.quantize_()
        metrics["val_q4"] = run.evaluate(data, args.val_windows, kv="q8" if args.arch == "qwen4" else "f32")
        log("val q4 weights", metrics["val_q4"])
    except Exception:  # noqa: BLE001
        metrics["export_error"] = traceback.format_exc()
        log(metrics["export_error"])
    save_metrics()


if __name__ == "__main__":
    main()
