"""qwen4-exp in PyTorch: the model of MODEL.md (shared/MODEL.md) exactly as lib/reference computes it
(docs/model.md, "Decisions where MODEL.md is silent"), over whole sequences from position 0.

Parameters carry cherenkov tensor names (lib/model/tensors.ts): dense tensors by their names,
routed experts stacked per expert layer (`experts.{l}.{gate|up|down}` [E, ...], exported as
`experts.{l}.{e}.{part}`), PLE tables `ple.{l}.{o}.{j}`. The same module trains (bf16 autocast,
f32 KV, chunked DeltaNet) and checks against lib/reference (float64, recurrent or chunked
DeltaNet, f32 or simulated q8 KV cache).

Only torch and numpy; runs on torch 1.13 (Debian) and 2.x.
"""

import json
import math
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# --- safetensors, numpy only ------------------------------------------------------------------

_ST = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64, "I32": np.int32, "U32": np.uint32,
       "I64": np.int64, "U8": np.uint8, "U16": np.uint16}


def read_safetensors(path):
    """name -> np.ndarray (BF16 comes back as float32)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=_ST[e["dtype"]]).reshape(e["shape"])
        if e["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = arr.copy()
    return out


def f32_to_bf16_bits(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors, dtype="F32", metadata=None):
    """tensors: name -> float array, stored as F32 or BF16 (round to nearest even)."""
    header = {}
    blobs = []
    offset = 0
    for name, arr in tensors.items():
        a = np.asarray(arr, dtype=np.float32)
        raw = f32_to_bf16_bits(a).tobytes() if dtype == "BF16" else np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# --- the tensor inventory (mirrors lib/model/tensors.ts) --------------------------------------

def _attention_specs(c, p, with_qsa):
    d = c["hidden_size"]
    at = c["attention"]
    hq, hkv = at["heads"] * at["head_dim"], at["kv_heads"] * at["head_dim"]
    t = [(f"{p}attn.q", [hq, d], "matrix"), (f"{p}attn.gate", [hq, d], "matrix"), (f"{p}attn.k", [hkv, d], "matrix"),
         (f"{p}attn.v", [hkv, d], "matrix"), (f"{p}attn.q_norm", [at["head_dim"]], "norm"),
         (f"{p}attn.k_norm", [at["head_dim"]], "norm"), (f"{p}attn.o", [d, hq], "out")]
    q = at["qsa"]
    if with_qsa and q:
        t += [(f"{p}attn.iq", [q["heads"] * q["head_dim"], d], "matrix"), (f"{p}attn.ik", [q["head_dim"], d], "matrix"),
              (f"{p}attn.ik_norm", [q["head_dim"]], "norm"), (f"{p}attn.iw", [q["heads"], d], "small")]
    return t


def _moe_specs(c, p):
    d = c["hidden_size"]
    m = c["moe"]
    t = [(f"{p}moe.router", [m["experts"], d], "router")]
    s = m["shared_intermediate"]
    if s > 0:
        t += [(f"{p}moe.shared_gate", [s, d], "matrix"), (f"{p}moe.shared_up", [s, d], "matrix"),
              (f"{p}moe.shared_down", [d, s], "out"), (f"{p}moe.shared_expert_gate", [1, d], "small")]
    return t


def dense_specs(c):
    """(name, shape, role) of every dense tensor, in denseTensorSpecs order. Roles are for
    training init: matrix, out (output projections), small, router, norm, plainNorm, and the
    named vectors."""
    d = c["hidden_size"]
    n = c["hc"]["streams"]
    dn = c["deltanet"]
    mix = 2 * n + n * n
    conv_c = 2 * dn["key_heads"] * dn["key_dim"] + dn["value_heads"] * dn["value_dim"]
    dv_all = dn["value_heads"] * dn["value_dim"]
    ple = c["ple"]
    ple_e = len(ple["orders"]) * ple["heads"] * ple["head_dim"] if ple else 0

    def hc(p):
        return [] if n == 1 else [(f"{p}.fn", [mix, n * d], "hc_fn"), (f"{p}.base", [mix], "hc_base"), (f"{p}.scale", [3], "hc_scale")]

    t = [("embed", [c["vocab_size"], d], "embed")]
    for l in range(c["num_layers"]):
        p = f"layers.{l}."
        if ple and l in ple["layers"]:
            K = ple["conv_kernel"]
            t += [(f"{p}ple.k", [d, ple_e], "ple_k"), (f"{p}ple.k_bias", [d], "bias"), (f"{p}ple.v", [d, ple_e], "ple_v"),
                  (f"{p}ple.v_bias", [d], "bias"), (f"{p}ple.k_norm", [d], "norm"), (f"{p}ple.q_norm", [d], "norm"),
                  (f"{p}ple.conv_norm", [d], "norm"), (f"{p}ple.conv", [d, K], "ple_conv")]
        t += hc(f"{p}hc_mixer") + [(f"{p}mixer_norm", [d], "norm")]
        if c["layer_types"][l] == "deltanet":
            t += [(f"{p}dn.qkv", [conv_c, d], "matrix"), (f"{p}dn.z", [dv_all, d], "matrix"),
                  (f"{p}dn.b", [dn["value_heads"], d], "small"), (f"{p}dn.a", [dn["value_heads"], d], "small"),
                  (f"{p}dn.conv", [conv_c, dn["conv_kernel"]], "dn_conv"), (f"{p}dn.A_log", [dn["value_heads"]], "a_log"),
                  (f"{p}dn.dt_bias", [dn["value_heads"]], "dt_bias"), (f"{p}dn.norm", [dn["value_dim"]], "plainNorm"),
                  (f"{p}dn.out", [d, dv_all], "out")]
        else:
            t += _attention_specs(c, p, True)
        t += hc(f"{p}hc_moe") + [(f"{p}moe_norm", [d], "norm")] + _moe_specs(c, p)
    if n > 1:
        t += [("hc_head.fn", [n, n * d], "hc_fn"), ("hc_head.base", [n], "bias"), ("hc_head.scale", [1], "hc_scale")]
    t += [("final_norm", [d], "norm")]
    if not c["tie_embeddings"]:
        t += [("lm_head", [c["vocab_size"], d], "matrix")]
    if c["mtp"]:
        t += [("mtp.embed_norm", [d], "norm"), ("mtp.hidden_norm", [d], "norm"), ("mtp.fc", [d, 2 * d], "matrix"),
              ("mtp.mixer_norm", [d], "norm")] + _attention_specs(c, "mtp.", False) + [("mtp.moe_norm", [d], "norm")] \
            + _moe_specs(c, "mtp.") + [("mtp.norm", [d], "norm")]
    return t


def expert_layers(c):
    return c["num_layers"] + (1 if c["mtp"] else 0)


def key(name):
    return name.replace(".", "__")


# --- elementary ops (lib/reference/ops.ts) ----------------------------------------------------

def up(x):
    """Half-precision activations to f32; f32/f64 stay."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def rms_norm(x, w, eps, centred=True):
    x = up(x)
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * r * ((1 + w) if centred else w).to(x.dtype)


def l2_normalize(x, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def softplus_exact(x):
    return torch.relu(x) + torch.log1p(torch.exp(-x.abs()))


def q8_roundtrip(x):
    """The q8 KV cache (docs/model.md decision 4): per vector over the last dim, scale =
    f32(max|x| / 127), q = round half away from zero, clamp +-127, read back f32(q * scale)."""
    x32 = x.float().to(x.dtype) if x.dtype == torch.float64 else x
    m = x32.abs().amax(-1, keepdim=True)
    scale = (m / 127).float().to(x.dtype)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    v = x32 / safe
    q = torch.sign(v) * torch.floor(v.abs() + 0.5)
    q = q.clamp(-127, 127)
    q = torch.where(scale > 0, q, torch.zeros_like(q))
    return (q * scale).float().to(x.dtype)


def rope_inv_freq(rd, theta, device=None):
    """inv_freq as transformers computes it for Qwen models and lib/model/rope.ts follows:
    f32(1 / f32(theta ** f32(2i / rd)))."""
    exponent = torch.arange(0, rd, 2, dtype=torch.int64, device=device).float() / rd
    return 1.0 / (float(theta) ** exponent)


def rope_neox(x, positions, rd, theta):
    """NeoX rotate-half on the first rd dims of the last axis; x [..., T, heads, hd], positions [T].
    The angle is the f32 product f32(pos) * inv_freq (docs/model.md); its cos/sin are taken in the
    activations' precision (f64 in the agreement check, as the reference's Math.cos)."""
    half = rd // 2
    inv = rope_inv_freq(rd, theta, x.device)
    ang = positions.float()[:, None] * inv[None, :]  # [T, half], f32 as the rule says
    dt = up(x).dtype
    cos = torch.cos(ang.to(dt))[:, None, :]
    sin = torch.sin(ang.to(dt))[:, None, :]
    x = up(x)
    x1, x2, rest = x[..., :half], x[..., half:rd], x[..., rd:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def causal_depthwise_conv(x, w, dilation=1):
    """x [B, T, C], w [C, K]: out_t = w[:, K-1] x_t + sum_{k<K-1} w[:, k] x_{t-(K-1-k)*dilation}."""
    K = w.shape[1]
    xt = F.pad(x.transpose(1, 2), ((K - 1) * dilation, 0))
    return F.conv1d(xt, w.to(xt.dtype).unsqueeze(1), groups=x.shape[2], dilation=dilation).transpose(1, 2)


def sorted_topk(values, k):
    """Indices of the k largest along the last axis, in rank order; equal values: lower index."""
    order = torch.sort(values, dim=-1, descending=True, stable=True).indices
    return order[..., :k]


# --- gated DeltaNet ---------------------------------------------------------------------------

def deltanet_recurrent(q, k, v, beta, g):
    """q, k [B, T, H, dk], v [B, T, H, dv], beta, g [B, T, H] -> o [B, T, H, dv] (state from 0)."""
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    S = q.new_zeros(B, H, dk, dv)
    outs = []
    for t in range(T):
        S = S * torch.exp(g[:, t])[..., None, None]
        m = torch.einsum("bhkv,bhk->bhv", S, k[:, t])
        delta = beta[:, t][..., None] * (v[:, t] - m)
        S = S + k[:, t][..., :, None] * delta[..., None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return torch.stack(outs, dim=1)


def deltanet_chunked(q, k, v, beta, g, chunk=64):
    """The chunked (forward-substitution) form of deltanet_recurrent, as lib/reference's
    deltanetChunked: within a chunk with cumulative decays G, u solves (I + A) u = beta (v -
    e^G K S0), A[t,i] = beta_t e^(G_t - G_i) k_t.k_i (i < t)."""
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    q, k, v, beta, g = (x.transpose(1, 2) for x in (q, k, v, beta, g))  # [B, H, T, ...]
    S = q.new_zeros(B, H, dk, dv)
    outs = []
    for c0 in range(0, T, chunk):
        qc, kc, vc, bc, gc = (x[:, :, c0:c0 + chunk] for x in (q, k, v, beta, g))
        C = qc.shape[2]
        G = torch.cumsum(gc, dim=-1)  # [B, H, C]
        diff = G[..., :, None] - G[..., None, :]  # [t, i] = G_t - G_i
        lower = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device), diagonal=-1)
        incl = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device))
        decay_strict = torch.exp(diff.masked_fill(~lower, float("-inf")))
        decay_incl = torch.exp(diff.masked_fill(~incl, float("-inf")))
        eG = torch.exp(G)[..., None]  # [B, H, C, 1]
        A = bc[..., None] * decay_strict * (kc @ kc.transpose(-1, -2))
        rhs = bc[..., None] * (vc - eG * (kc @ S))
        eye = torch.eye(C, dtype=q.dtype, device=q.device)
        u = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
        o = eG * (qc @ S) + (decay_incl * (qc @ kc.transpose(-1, -2))) @ u
        outs.append(o)
        last = G[..., -1:]  # [B, H, 1]
        w = torch.exp(last - G)[..., None]  # [B, H, C, 1]
        S = torch.exp(last)[..., None] * S + (kc * w).transpose(-1, -2) @ u
    return torch.cat(outs, dim=2).transpose(1, 2)


def no_autocast(x):
    """A region computed in the activations' own precision (f32 or f64), not bf16."""
    return torch.autocast(device_type=x.device.type, enabled=False)


def deltanet_core(q, k, v, beta, g, mode):
    """The recurrence in f32 (or f64): mode 0 = recurrent, else chunked with that chunk size."""
    with no_autocast(q):
        dt = torch.float64 if q.dtype == torch.float64 else torch.float32
        q, k, v, beta, g = (x.to(dt) for x in (q, k, v, beta, g))
        return deltanet_recurrent(q, k, v, beta, g) if mode == 0 else deltanet_chunked(q, k, v, beta, g, chunk=mode)


# --- the model --------------------------------------------------------------------------------

class Qwen4Exp(nn.Module):
    def __init__(self, config, init_seed=None):
        super().__init__()
        self.c = c = config
        self.params = nn.ParameterDict()
        for name, shape, role in dense_specs(c):
            self.params[key(name)] = nn.Parameter(torch.zeros(shape))
        m = c["moe"]
        d = c["hidden_size"]
        for l in range(expert_layers(c)):
            self.params[key(f"experts.{l}.gate")] = nn.Parameter(torch.zeros(m["experts"], m["intermediate"], d))
            self.params[key(f"experts.{l}.up")] = nn.Parameter(torch.zeros(m["experts"], m["intermediate"], d))
            self.params[key(f"experts.{l}.down")] = nn.Parameter(torch.zeros(m["experts"], d, m["intermediate"]))
        p = c["ple"]
        if p:
            for l in p["layers"]:
                for o in range(len(p["orders"])):
                    for j in range(p["heads"]):
                        self.params[key(f"ple.{l}.{o}.{j}")] = nn.Parameter(torch.zeros(p["rows"][o][j], p["head_dim"]))
        if init_seed is not None:
            self.init_weights(init_seed)

    def w(self, name):
        return self.params[key(name)]

    # -- weights in and out --

    def load_cherenkov(self, tensors):
        """Loads name -> array in cherenkov names (experts per expert)."""
        c = self.c
        with torch.no_grad():
            for name, shape, _ in dense_specs(c):
                self.w(name).copy_(torch.as_tensor(np.asarray(tensors[name], dtype=np.float32)).reshape(shape))
            for l in range(expert_layers(c)):
                for part in ("gate", "up", "down"):
                    stack = np.stack([tensors[f"experts.{l}.{e}.{part}"] for e in range(c["moe"]["experts"])])
                    self.w(f"experts.{l}.{part}").copy_(torch.as_tensor(stack.astype(np.float32)))
            p = c["ple"]
            if p:
                for l in p["layers"]:
                    for o in range(len(p["orders"])):
                        for j in range(p["heads"]):
                            self.w(f"ple.{l}.{o}.{j}").copy_(torch.as_tensor(tensors[f"ple.{l}.{o}.{j}"].astype(np.float32)))

    def export_cherenkov(self):
        """name -> float32 numpy, cherenkov names, experts split per expert."""
        out = {}
        c = self.c
        for name, _, _ in dense_specs(c):
            out[name] = self.w(name).detach().float().cpu().numpy()
        for l in range(expert_layers(c)):
            for part in ("gate", "up", "down"):
                t = self.w(f"experts.{l}.{part}").detach().float().cpu().numpy()
                for e in range(c["moe"]["experts"]):
                    out[f"experts.{l}.{e}.{part}"] = t[e]
        p = c["ple"]
        if p:
            for l in p["layers"]:
                for o in range(len(p["orders"])):
                    for j in range(p["heads"]):
                        out[f"ple.{l}.{o}.{j}"] = self.w(f"ple.{l}.{o}.{j}").detach().float().cpu().numpy()
        return out

    def init_weights(self, seed):
        """Training init: small normal projections, zero-centred norms at 0, DeltaNet constants as
        Qwen3-Next, hyper-connections near a plain residual (comb near identity, post 1, small
        dynamic scales, as HC / mHC start), the n-gram memory near silent."""
        c = self.c
        gen = torch.Generator().manual_seed(seed)
        L = c["num_layers"]
        n = c["hc"]["streams"]

        def normal(shape, std):
            return torch.randn(shape, generator=gen) * std

        with torch.no_grad():
            for name, shape, role in dense_specs(c):
                t = self.w(name)
                if role in ("matrix", "small", "embed"):
                    t.copy_(normal(shape, 0.02))
                elif role == "router":
                    t.copy_(normal(shape, 0.01))
                elif role == "out":
                    t.copy_(normal(shape, 0.02 / math.sqrt(2 * L)))
                elif role == "plainNorm":
                    t.fill_(1.0)
                elif role == "a_log":
                    t.copy_(torch.log(torch.rand(shape, generator=gen) * 15 + 1))
                elif role == "dt_bias":
                    dt = torch.exp(torch.rand(shape, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
                    t.copy_(dt + torch.log(-torch.expm1(-dt)))
                elif role == "dn_conv":
                    K = shape[1]
                    t.copy_((torch.rand(shape, generator=gen) * 2 - 1) / math.sqrt(K))
                elif role == "ple_conv":
                    t.zero_()  # the conv branch starts silent: RMSNorm(v) has unit scale
                elif role == "ple_k":
                    t.copy_(normal(shape, 0.02))
                elif role == "ple_v":
                    t.copy_(normal(shape, 0.005))
                elif role == "hc_fn":
                    t.copy_(normal(shape, 0.02 / math.sqrt(shape[1])))
                elif role == "hc_base":
                    base = torch.zeros(shape)
                    base[2 * n:] = (torch.eye(n) * 4.0).reshape(-1)
                    t.copy_(base)
                elif role == "hc_scale":
                    t.fill_(0.01)
                else:  # norm, bias
                    t.zero_()
            for l in range(expert_layers(c)):
                self.w(f"experts.{l}.gate").copy_(normal(self.w(f"experts.{l}.gate").shape, 0.02))
                self.w(f"experts.{l}.up").copy_(normal(self.w(f"experts.{l}.up").shape, 0.02))
                self.w(f"experts.{l}.down").copy_(normal(self.w(f"experts.{l}.down").shape, 0.02 / math.sqrt(2 * L)))
            p = c["ple"]
            if p:
                for l in p["layers"]:
                    for o in range(len(p["orders"])):
                        for j in range(p["heads"]):
                            t = self.w(f"ple.{l}.{o}.{j}")
                            t.copy_(normal(t.shape, 0.1))

    # -- sub-layers --

    def hc_coefficients(self, X, site):
        """X [B, T, n, d] -> pre [B,T,n], post [B,T,n], comb [B,T,n,n] (comb[i][j]: stream i to j)."""
        hc = self.c["hc"]
        n, eps = hc["streams"], hc["eps"]
        B, T, _, d = X.shape
        flat = up(X).reshape(B, T, n * d)
        r = torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + eps)
        with no_autocast(flat):
            mixes = F.linear(flat, self.w(f"{site}.fn").to(flat.dtype)) * r
        base = self.w(f"{site}.base").to(mixes.dtype)
        scale = self.w(f"{site}.scale").to(mixes.dtype)
        pre = torch.sigmoid(mixes[..., :n] * scale[0] + base[:n]) + eps
        post = 2 * torch.sigmoid(mixes[..., n:2 * n] * scale[1] + base[n:2 * n])
        logits = (mixes[..., 2 * n:] * scale[2] + base[2 * n:]).reshape(B, T, n, n)
        comb = torch.softmax(logits, dim=-1) + eps
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
        for _ in range(hc["sinkhorn_iters"] - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + eps)
            comb = comb / (comb.sum(-2, keepdim=True) + eps)
        return pre, post, comb

    def residual_site(self, X, site, norm, sub):
        """One site: read, RMSNorm, sub-layer, write (n = 1: X + F(RMSNorm(X)))."""
        eps = self.c["rms_norm_eps"]
        if self.c["hc"]["streams"] == 1:
            y = sub(rms_norm(X[:, :, 0], self.w(norm), eps))
            return X + up(y)[:, :, None, :]
        pre, post, comb = self.hc_coefficients(X, site)
        Xf = up(X)
        # Read and write as f32 elementwise sums: under autocast an einsum would round the
        # residual streams to bf16 at every site.
        x = (pre[..., None] * Xf).sum(-2)
        y = up(sub(rms_norm(x, self.w(norm), eps)))
        mixed = (comb[..., None] * Xf[:, :, :, None, :]).sum(-3)  # [B,T,j,d] = sum_i comb[i][j] X_i
        return post[..., None] * y[:, :, None, :] + mixed

    def final_read(self, X):
        hc = self.c["hc"]
        n, eps = hc["streams"], hc["eps"]
        if n == 1:
            return up(X[:, :, 0])
        B, T, _, d = X.shape
        flat = up(X).reshape(B, T, n * d)
        r = torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + eps)
        with no_autocast(flat):
            mixes = F.linear(flat, self.w("hc_head.fn").to(flat.dtype)) * r
        pre = torch.sigmoid(mixes * self.w("hc_head.scale").to(mixes.dtype)[0] + self.w("hc_head.base").to(mixes.dtype)) + eps
        return (pre[..., None] * up(X)).sum(-2)

    def deltanet(self, xn, l, mode):
        c = self.c
        dn = c["deltanet"]
        Hk, dk, Hv, dv = dn["key_heads"], dn["key_dim"], dn["value_heads"], dn["value_dim"]
        p = f"layers.{l}.dn."
        B, T, _ = xn.shape
        qkv = up(F.linear(xn, self.w(p + "qkv").to(xn.dtype)))
        with no_autocast(qkv):
            conv = F.silu(causal_depthwise_conv(qkv, self.w(p + "conv").to(qkv.dtype)))
        q = conv[..., :Hk * dk].reshape(B, T, Hk, dk)
        k = conv[..., Hk * dk:2 * Hk * dk].reshape(B, T, Hk, dk)
        v = conv[..., 2 * Hk * dk:].reshape(B, T, Hv, dv)
        q = l2_normalize(q) * (dk ** -0.5)
        k = l2_normalize(k)
        r = Hv // Hk
        q = q.repeat_interleave(r, dim=2)
        k = k.repeat_interleave(r, dim=2)
        beta = torch.sigmoid(up(F.linear(xn, self.w(p + "b").to(xn.dtype))))
        a = up(F.linear(xn, self.w(p + "a").to(xn.dtype)))
        g = -torch.exp(self.w(p + "A_log").to(a.dtype)) * softplus_exact(a + self.w(p + "dt_bias").to(a.dtype))
        z = up(F.linear(xn, self.w(p + "z").to(xn.dtype))).reshape(B, T, Hv, dv)
        o = deltanet_core(q, k, v, beta, g, mode)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"]) * self.w(p + "norm").to(o.dtype) * F.silu(z)
        return F.linear(o.reshape(B, T, Hv * dv).to(xn.dtype), self.w(p + "out").to(xn.dtype))

    def attention(self, xn, prefix, kv, qsa, aux):
        """Gated attention over positions 0..T-1 of xn [B, T, d]; qsa: None | "select" | "dense"
        (dense: train the indexer only). aux gets the indexer's KL loss when qsa is set."""
        c = self.c
        at = c["attention"]
        H, Hkv, hd = at["heads"], at["kv_heads"], at["head_dim"]
        rd = round(hd * at["partial_rotary_factor"])
        eps = c["rms_norm_eps"]
        B, T, _ = xn.shape
        p = prefix + "attn."
        lin = lambda name: up(F.linear(xn, self.w(p + name).to(xn.dtype)))  # noqa: E731
        q = rms_norm(lin("q").reshape(B, T, H, hd), self.w(p + "q_norm"), eps)
        gate = lin("gate").reshape(B, T, H, hd)
        k = rms_norm(lin("k").reshape(B, T, Hkv, hd), self.w(p + "k_norm"), eps)
        v = lin("v").reshape(B, T, Hkv, hd)
        pos = torch.arange(T, device=xn.device)
        q = rope_neox(q, pos, rd, at["rope_theta"])
        k = rope_neox(k, pos, rd, at["rope_theta"])
        if kv == "q8":
            k, v = q8_roundtrip(k), q8_roundtrip(v)
        k = k.repeat_interleave(H // Hkv, dim=2)
        v = v.repeat_interleave(H // Hkv, dim=2)
        logits = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=xn.device))
        mask = causal
        cfg = at["qsa"]
        if qsa and cfg:
            Hi, di, topk = cfg["heads"], cfg["head_dim"], cfg["topk"]
            # The indexer learns from its own loss only (DSA). Its scores are computed in f32
            # (f64 in the check) outside autocast, as inference computes them: bf16 scores
            # would tie far more often than inference's do.
            xi = up(xn.detach())
            with no_autocast(xi):
                ilin = lambda name: F.linear(xi, self.w(p + name).to(xi.dtype))  # noqa: E731
                iq = ilin("iq").reshape(B, T, Hi, di)
                ik = rms_norm(ilin("ik"), self.w(p + "ik_norm"), eps)
                if kv == "q8":
                    ik = q8_roundtrip(ik)
                iw = ilin("iw")  # [B, T, Hi]
                score = torch.einsum("bthd,bsd->bths", iq, ik).relu()
                score = torch.einsum("bths,bth->bts", score, iw) / math.sqrt(di)
            masked = score.masked_fill(~causal, float("-inf"))
            if qsa == "select":
                order = torch.sort(masked.detach(), dim=-1, descending=True, stable=True).indices
                rank = torch.empty_like(order)
                rank.scatter_(-1, order, torch.arange(T, device=xn.device).expand_as(order))
                mask = causal & (rank < topk)[:, None]  # [B, 1, T, T]
            if aux is not None:
                # DSA-style indexer training: match the heads' mean attention distribution.
                with torch.no_grad():
                    target = torch.softmax(logits.float().masked_fill(~causal, float("-inf")), dim=-1).mean(1)
                logq = torch.log_softmax(masked.float(), dim=-1)
                kl = (target * (torch.log(target.clamp_min(1e-20)) - logq.masked_fill(~causal, 0))).sum(-1)
                aux["indexer"] = aux.get("indexer", 0) + kl.mean()
        probs = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
        o = torch.einsum("bhts,bshd->bthd", probs, v)
        o = o * torch.sigmoid(gate)
        return F.linear(o.reshape(B, T, H * hd).to(xn.dtype), self.w(p + "o").to(xn.dtype))

    def moe(self, xn, prefix, layer, aux):
        c = self.c
        m = c["moe"]
        E, k = m["experts"], m["top_k"]
        p = prefix + "moe."
        # Router logits in f32 (f64 in the check) outside autocast, as inference computes them.
        xr = up(xn)
        with no_autocast(xr):
            logits = F.linear(xr, self.w(p + "router").to(xr.dtype))  # [B, T, E]
        probs = torch.softmax(logits.float() if logits.dtype != torch.float64 else logits, dim=-1)
        idx = sorted_topk(logits.detach(), k)
        w = probs.gather(-1, idx)
        if m["norm_topk_prob"]:
            w = w / w.sum(-1, keepdim=True)
        gates = torch.zeros_like(probs).scatter(-1, idx, w).to(xn.dtype)
        G, U, D = (self.w(f"experts.{layer}.{s}").to(xn.dtype) for s in ("gate", "up", "down"))
        h = F.silu(torch.einsum("btd,eid->btei", xn, G)) * torch.einsum("btd,eid->btei", xn, U)
        y = torch.einsum("btei,edi->btd", h * gates[..., None], D)
        if m["shared_intermediate"] > 0:
            sg = torch.sigmoid(up(F.linear(xn, self.w(p + "shared_expert_gate").to(xn.dtype))))
            hs = F.silu(F.linear(xn, self.w(p + "shared_gate").to(xn.dtype))) * F.linear(xn, self.w(p + "shared_up").to(xn.dtype))
            y = up(y) + sg * up(F.linear(hs, self.w(p + "shared_down").to(xn.dtype)))
        if aux is not None:
            f = torch.zeros_like(probs).scatter(-1, idx, 1.0).reshape(-1, E).mean(0) / k
            aux["balance"] = aux.get("balance", 0) + E * (f * probs.reshape(-1, E).mean(0)).sum()
            aux.setdefault("routes", []).append(idx)
        return up(y)

    def ple_rows(self, tokens, o, j):
        """Row indices [B, T] of order index o, head j (lib/reference pleRowIndex)."""
        p = self.c["ple"]
        B, T = tokens.shape
        mix = torch.zeros_like(tokens)
        for i, mult in enumerate(p["mult"][o][j]):
            shifted = torch.full_like(tokens, p["pad_id"])
            if i < T:
                shifted[:, i:] = tokens[:, :T - i]
            mix = mix ^ ((shifted * int(mult)) & 0xFFFFFFFF)
        return mix % p["rows"][o][j]

    def ple(self, X, tokens, l):
        c = self.c
        p = c["ple"]
        d = c["hidden_size"]
        eps = c["rms_norm_eps"]
        pre = f"layers.{l}.ple."
        parts = []
        for o in range(len(p["orders"])):
            for j in range(p["heads"]):
                parts.append(F.embedding(self.ple_rows(tokens, o, j), self.w(f"ple.{l}.{o}.{j}")))
        e = torch.cat(parts, dim=-1).to(up(X).dtype)
        h = up(X).mean(dim=2)
        qn = rms_norm(h, self.w(pre + "q_norm"), eps)
        kn = rms_norm(F.linear(e, self.w(pre + "k").to(e.dtype)) + self.w(pre + "k_bias").to(e.dtype), self.w(pre + "k_norm"), eps)
        s = (kn * qn).sum(-1) / math.sqrt(d)
        s = torch.sign(s) * torch.sqrt(torch.clamp(s.abs(), min=1e-6))
        alpha = torch.sigmoid(s)[..., None]
        v = alpha * (F.linear(e, self.w(pre + "v").to(e.dtype)) + self.w(pre + "v_bias").to(e.dtype))
        u = rms_norm(v, self.w(pre + "conv_norm"), eps)
        conv = causal_depthwise_conv(u, self.w(pre + "conv"), dilation=max(p["orders"]))
        y = v + F.silu(conv)
        return up(X) + y[:, :, None, :]

    # -- whole passes --

    def forward(self, tokens, kv="f32", deltanet_chunk=64, qsa="select", aux=None):
        """tokens [B, T] (positions 0..T-1) -> (logits [B, T, V], hidden [B, T, d]).
        deltanet_chunk 0 = recurrent. aux (a dict) collects training losses and routes."""
        c = self.c
        n = c["hc"]["streams"]
        emb = F.embedding(tokens, self.w("embed"))
        X = emb[:, :, None, :].expand(-1, -1, n, -1)
        ple_layers = c["ple"]["layers"] if c["ple"] else []
        for l, kind in enumerate(c["layer_types"]):
            if l in ple_layers:
                X = self.ple(X, tokens, l)
            if kind == "deltanet":
                sub = lambda xs, l=l: self.deltanet(xs, l, deltanet_chunk)  # noqa: E731
            else:
                sub = lambda xs, l=l: self.attention(xs, f"layers.{l}.", kv, qsa, aux)  # noqa: E731
            X = self.residual_site(X, f"layers.{l}.hc_mixer", f"layers.{l}.mixer_norm", sub)
            X = self.residual_site(X, f"layers.{l}.hc_moe", f"layers.{l}.moe_norm",
                                   lambda xs, l=l: self.moe(xs, f"layers.{l}.", l, aux))
        x = self.final_read(X)
        hidden = rms_norm(x, self.w("final_norm"), c["rms_norm_eps"])
        head = self.w("embed") if c["tie_embeddings"] else self.w("lm_head")
        return F.linear(hidden, head.to(hidden.dtype)), hidden

    def mtp(self, hidden, tokens, kv="f32", aux=None, detach_shared=False):
        """MTP rows t = 0..T-2 from (hidden[t], tokens[t+1]) at MTP positions t -> (logits, out).
        The row's argmax drafts tokens[t+2]. detach_shared: the embedding and LM head, shared with
        the trunk, get no gradient from the head."""
        return self.mtp_rows(hidden[:, :-1], tokens[:, 1:], kv=kv, aux=aux, detach_shared=detach_shared)

    def mtp_rows(self, hidden_in, tokens_in, kv="f32", aux=None, detach_shared=False):
        """MTP rows at positions 0..T-1 from explicit inputs (hidden_in [B, T, d], tokens_in [B, T]):
        catch-up rows (trunk hidden h_t, token t+1) and chained rows (the previous row's out, its
        draft) alike -> (logits, out)."""
        c = self.c
        eps = c["rms_norm_eps"]
        shared = (lambda t: t.detach()) if detach_shared else (lambda t: t)  # noqa: E731
        emb = F.embedding(tokens_in, shared(self.w("embed")))
        h = hidden_in
        cat = torch.cat([rms_norm(emb, self.w("mtp.embed_norm"), eps), rms_norm(h, self.w("mtp.hidden_norm"), eps)], dim=-1)
        x = up(F.linear(cat.to(hidden_in.dtype), self.w("mtp.fc").to(hidden_in.dtype)))
        x = x + up(self.attention(rms_norm(x, self.w("mtp.mixer_norm"), eps).to(hidden_in.dtype), "mtp.", kv, None, None))
        x = x + self.moe(rms_norm(x, self.w("mtp.moe_norm"), eps).to(hidden_in.dtype), "mtp.", c["num_layers"], aux)
        out = rms_norm(x, self.w("mtp.norm"), eps)
        head = shared(self.w("embed") if c["tie_embeddings"] else self.w("lm_head"))
        return F.linear(out.to(hidden_in.dtype), head.to(hidden_in.dtype)), out
