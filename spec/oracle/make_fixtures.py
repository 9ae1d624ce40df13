"""Builds the oracle fixtures of spec/oracle/fixtures: tiny random Qwen3-Next and Qwen3.5-MoE
checkpoints with the logits transformers computes for them, MLX 4-bit variants, and an
op-level mHC fixture from transformers' DeepSeek-V4 hyper-connection code.

Runs where torch and transformers 5.17 are installed (the H200 machine; CPU is enough):
  python3 spec/oracle/make_fixtures.py --out /tmp/fixtures
See spec/oracle/fixtures/README.md for the exact command that regenerated the committed files.

Every fixture directory holds a checkpoint as its publisher would ship it (config.json +
safetensors, real tensor names), oracle.json (prompt, greedy tokens, margins, provenance) and
little-endian f32 logits files [positions, vocab].
"""

import argparse
import copy
import json
import os
import sys
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_numerics as N  # noqa: E402

torch.set_grad_enabled(False)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

PROMPT_LEN = 12
GREEDY_LEN = 8
# A greedy step must win by this fraction of the row's largest |logit|, and every routing
# decision by this much probability, so that f32 rounding in another implementation cannot
# flip it (the comparison tolerance is 1e-4 relative).
MIN_MARGIN = 2e-3
MIN_ROUTE_GAP = 1e-4

import transformers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402


# --- fixture specifications ------------------------------------------------------------------

SPECS = [
    dict(
        name="qwen3_next_r1", kind="qwen3_next", hidden=64, layers=["linear", "linear", "linear", "full"],
        hk=2, hv=2, dk=16, dv=16, heads=4, kv=2, head_dim=16, partial=0.25, theta=10000.0,
        experts=4, top_k=2, norm_topk=True, moe_i=32, shared_i=32, vocab=300, tie=False, mtp=True,
        dtype="BF16", layout="per_expert", save="own", shards=1, seed=11,
    ),
    dict(
        name="qwen3_next_r2", kind="qwen3_next", hidden=64, layers=["linear", "full", "linear"],
        hk=2, hv=4, dk=16, dv=24, heads=2, kv=1, head_dim=32, partial=0.5, theta=1e6,
        experts=4, top_k=1, norm_topk=False, moe_i=32, shared_i=64, vocab=300, tie=True, mtp=False,
        dtype="BF16", layout="transformers", save="save_pretrained", shards=2, seed=23,
    ),
    dict(
        name="qwen3_5_moe_r2", kind="qwen3_5_moe", hidden=64, layers=["linear", "linear", "linear", "full"],
        hk=2, hv=4, dk=16, dv=16, heads=4, kv=2, head_dim=16, partial=0.25, theta=1e7,
        experts=4, top_k=2, norm_topk=True, moe_i=32, shared_i=32, vocab=300, tie=False, mtp=True,
        dtype="BF16", layout="fused", save="own", shards=2, seed=37, composite=True,
    ),
    dict(
        name="qwen3_5_moe_r1", kind="qwen3_5_moe", hidden=96, layers=["linear", "full"],
        hk=4, hv=4, dk=32, dv=32, heads=4, kv=4, head_dim=32, partial=1.0, theta=10000.0,
        experts=4, top_k=3, norm_topk=True, moe_i=32, shared_i=32, vocab=300, tie=False, mtp=False,
        dtype="F16", layout="per_expert", save="own", shards=1, seed=41, composite=False,
    ),
]

MLX_SPECS = [
    dict(
        name="mlx_qwen3_next_g64", kind="qwen3_next", hidden=128, layers=["linear", "full"],
        hk=2, hv=4, dk=16, dv=16, heads=2, kv=1, head_dim=32, partial=0.25, theta=10000.0,
        experts=4, top_k=2, norm_topk=True, moe_i=64, shared_i=64, vocab=300, tie=False, mtp=False,
        group=64, seed=53,
    ),
    dict(
        name="mlx_qwen3_5_moe_g32", kind="qwen3_5_moe", hidden=64, layers=["linear", "full"],
        hk=2, hv=2, dk=16, dv=16, heads=2, kv=2, head_dim=16, partial=0.5, theta=10000.0,
        experts=4, top_k=2, norm_topk=True, moe_i=32, shared_i=32, vocab=300, tie=False, mtp=False,
        group=32, seed=59, composite=True,
    ),
]


# --- building models --------------------------------------------------------------------------

def hf_layer_types(spec):
    return ["linear_attention" if t == "linear" else "full_attention" for t in spec["layers"]]


def build_config(spec):
    common = dict(
        vocab_size=spec["vocab"], hidden_size=spec["hidden"], num_hidden_layers=len(spec["layers"]),
        layer_types=hf_layer_types(spec), num_attention_heads=spec["heads"], num_key_value_heads=spec["kv"],
        head_dim=spec["head_dim"], linear_num_key_heads=spec["hk"], linear_num_value_heads=spec["hv"],
        linear_key_head_dim=spec["dk"], linear_value_head_dim=spec["dv"], linear_conv_kernel_dim=4,
        num_experts=spec["experts"], num_experts_per_tok=spec["top_k"], moe_intermediate_size=spec["moe_i"],
        shared_expert_intermediate_size=spec["shared_i"], rms_norm_eps=1e-6, tie_word_embeddings=spec["tie"],
        partial_rotary_factor=spec["partial"],
        rope_parameters={"rope_type": "default", "rope_theta": spec["theta"], "partial_rotary_factor": spec["partial"]},
        max_position_embeddings=512, bos_token_id=None, eos_token_id=spec["vocab"] - 1, pad_token_id=None,
    )
    kind = "qwen3_next" if spec["kind"] == "qwen3_next" else "qwen3_5_moe_text"
    extra = dict(intermediate_size=spec["moe_i"], norm_topk_prob=spec["norm_topk"], decoder_sparse_step=1,
                 mlp_only_layers=[]) if kind == "qwen3_next" else {}
    try:
        cfg = AutoConfig.for_model(kind, **extra, **common)
    except TypeError:  # a strict config that does not take partial_rotary_factor as a kwarg
        common.pop("partial_rotary_factor")
        cfg = AutoConfig.for_model(kind, **extra, **common)
    rp = getattr(cfg, "rope_parameters", None) or {}
    if rp.get("partial_rotary_factor") != spec["partial"]:
        rp["partial_rotary_factor"] = spec["partial"]
        cfg.rope_parameters = rp
    cfg._attn_implementation = "eager"
    return cfg


def effective_rotary(model):
    rot = find_rotary(model)
    return int(rot.inv_freq.shape[0]) * 2


def find_rotary(model):
    return model.model.rotary_emb


def randomize_(module, gen, scale_head=False):
    """Weights that make a tiny model do something: O(1) activations, distinct routing."""
    for name, p in module.named_parameters():
        shape = tuple(p.shape)
        if name.endswith("A_log"):
            v = torch.log(torch.empty(shape).uniform_(1.0, 16.0, generator=gen))
        elif name.endswith("dt_bias"):
            v = torch.empty(shape).uniform_(-1.0, 1.0, generator=gen)
        elif name.endswith("linear_attn.norm.weight"):
            v = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif len(shape) == 1:  # zero-centred RMSNorm weights (effective scale 1 + w)
            v = 0.1 * torch.randn(shape, generator=gen)
        elif "conv1d" in name:
            v = torch.empty(shape).uniform_(-0.6, 0.6, generator=gen)
        elif "embed_tokens" in name:
            v = torch.empty(shape).uniform_(-1.0, 1.0, generator=gen)
        else:
            fan_in = shape[-1]
            gain = 1.7
            if name.endswith("mlp.gate.weight"):
                gain = 4.0
            if scale_head and name.startswith("lm_head"):
                gain = 5.0
            v = torch.empty(shape).uniform_(-1.0, 1.0, generator=gen) * (gain / fan_in**0.5)
        p.copy_(v.to(p.dtype))


def make_model(spec, seed):
    cfg = build_config(spec)
    torch.manual_seed(seed)
    try:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    except ValueError:
        import transformers as tf
        cls = tf.Qwen3NextForCausalLM if spec["kind"] == "qwen3_next" else tf.Qwen3_5MoeForCausalLM
        model = cls(cfg)
    model = model.float()
    rd = effective_rotary(model)
    if rd != round(spec["head_dim"] * spec["partial"]):
        raise RuntimeError(f"rotary dim {rd} is not head_dim * partial_rotary_factor: config {cfg.rope_parameters}")
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    randomize_(model, gen, scale_head=True)
    if spec["tie"]:
        model.tie_weights()
    return model


def layer_class(model):
    return type(model.model.layers[0])


def make_mtp(model, spec, seed):
    """An MTP head as vLLM's qwen3_next_mtp defines it, from transformers' own modules."""
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = 1
    cfg.layer_types = ["full_attention"]
    cfg._attn_implementation = "eager"
    layer = layer_class(model)(cfg, 0).eval()
    norm_cls = type(model.model.norm)
    d = spec["hidden"]
    mtp = torch.nn.Module()
    mtp.fc = torch.nn.Linear(2 * d, d, bias=False)
    mtp.pre_fc_norm_embedding = norm_cls(d, eps=1e-6)
    mtp.pre_fc_norm_hidden = norm_cls(d, eps=1e-6)
    mtp.layers = torch.nn.ModuleList([layer])
    mtp.norm = norm_cls(d, eps=1e-6)
    gen = torch.Generator().manual_seed(seed + 7)
    randomize_(mtp, gen)
    return mtp.eval()


def positions_for(spec, n):
    pos = torch.arange(n).unsqueeze(0)
    if spec["kind"] == "qwen3_5_moe":
        return pos, pos.view(1, 1, n).expand(3, 1, n)
    return pos, pos


def causal_mask(n):
    m = torch.full((n, n), torch.finfo(torch.float32).min)
    return torch.triu(m, diagonal=1).view(1, 1, n, n)


def mtp_logits(model, mtp, spec, tokens):
    """Row t: hidden h_t of the trunk (after the final norm) and token tokens[t+1], position t."""
    ids = torch.tensor([tokens])
    hidden = model.model(input_ids=ids).last_hidden_state  # [1, T, d]
    n = len(tokens) - 1
    emb = model.model.embed_tokens(ids[:, 1:])
    x = mtp.fc(torch.cat([mtp.pre_fc_norm_embedding(emb), mtp.pre_fc_norm_hidden(hidden[:, :n])], dim=-1))
    pos, rope_pos = positions_for(spec, n)
    pe = find_rotary(model)(x, rope_pos)
    out = mtp.layers[0](x, position_embeddings=pe, attention_mask=causal_mask(n), position_ids=pos)
    if isinstance(out, tuple):
        out = out[0]
    return model.lm_head(mtp.norm(out))[0]


# --- routing and greedy checks ------------------------------------------------------------------

class RouteRecorder:
    """Records the smallest gap between the k-th and (k+1)-th router probability."""

    def __init__(self, modules, top_k):
        self.top_k = top_k
        self.min_gap = float("inf")
        self.handles = [m.register_forward_hook(self.hook) for m in modules]

    def hook(self, module, inputs, output):
        x = inputs[0].reshape(-1, module.weight.shape[1])
        p = torch.softmax(x @ module.weight.T, dim=-1, dtype=torch.float32)
        s = torch.sort(p, dim=-1, descending=True).values
        if s.shape[-1] > self.top_k:
            gap = (s[:, self.top_k - 1] - s[:, self.top_k]).min().item()
            self.min_gap = min(self.min_gap, gap)

    def close(self):
        for h in self.handles:
            h.remove()


def routers(module):
    return [m for n, m in module.named_modules() if n.endswith("mlp.gate")]


def logits_of(model, tokens):
    return model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].float()


def relative_margin(row):
    top = torch.topk(row, 2).values
    return ((top[0] - top[1]) / row.abs().max()).item()


def greedy(model, prompt, steps):
    tokens = list(prompt)
    margins = []
    for _ in range(steps):
        row = logits_of(model, tokens)[-1]
        margins.append(relative_margin(row))
        tokens.append(int(torch.argmax(row)))
    return tokens[len(prompt):], margins


def generate_check(model, prompt, steps):
    """transformers' own cached generation (the recurrent DeltaNet path), for cross-checking."""
    try:
        out = model.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False, min_new_tokens=steps)
        return [int(t) for t in out[0, len(prompt):]]
    except Exception as e:  # noqa: BLE001
        return f"generate failed: {e!r}"


# --- checkpoint layouts -------------------------------------------------------------------------

MATRIX_SUFFIXES = (
    "embed_tokens.weight", "lm_head.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
    "in_proj_qkvz.weight", "in_proj_qkv.weight", "in_proj_z.weight", "out_proj.weight",
    "gate_proj.weight", "up_proj.weight", "down_proj.weight", "experts.gate_up_proj", "experts.down_proj",
    "fc.weight",
)
SMALL_SUFFIXES = ("mlp.gate.weight", "shared_expert_gate.weight", "in_proj_ba.weight", "in_proj_b.weight",
                  "in_proj_a.weight")


def role(name):
    """The storage role cherenkov's q4 writer gives the tensor this HF parameter becomes."""
    if name.endswith(SMALL_SUFFIXES):
        return "small"
    if name.endswith(MATRIX_SUFFIXES):
        return "matrix"
    return "vector"


def q4_oracle_value(name, value):
    """What a `--dtype q4` conversion stores for this parameter, decoded back to f32."""
    a = value.detach().float().numpy()
    r = role(name)
    if r == "matrix" and a.shape[-1] % 32 == 0:
        return torch.from_numpy(N.q4_roundtrip(a))
    if r in ("matrix", "small"):
        return torch.from_numpy(N.round_bf16(a))
    return value.detach().float().clone()


def quantized_copy(model, mtp=None):
    qm = copy.deepcopy(model)
    sd = qm.state_dict()
    qm.load_state_dict({k: q4_oracle_value(k, v) for k, v in sd.items()})
    if model.config.tie_word_embeddings:
        qm.tie_weights()
    qmtp = None
    if mtp is not None:
        qmtp = copy.deepcopy(mtp)
        msd = qmtp.state_dict()
        qmtp.load_state_dict({k: q4_oracle_value(k, v) for k, v in msd.items()})
    return qm, qmtp


def ckpt_name(spec, key, mtp=False):
    """The checkpoint name of a state-dict key of the trunk model (or of the MTP module)."""
    if mtp:
        return "mtp." + key
    if spec.get("composite") and key.startswith("model."):
        return "model.language_model." + key[len("model."):]
    return key


def checkpoint_tensors(model, mtp, spec):
    """HF checkpoint names -> f32 tensors, in the fixture's expert layout and prefix."""
    out = {}
    E, I = spec["experts"], spec["moe_i"]
    for module, is_mtp in ((model, False), (mtp, True)):
        if module is None:
            continue
        sd = module.state_dict()
        for k, v in sd.items():
            name = ckpt_name(spec, k, is_mtp)
            if spec["tie"] and k == "lm_head.weight":
                continue
            if k.endswith("experts.down_proj"):
                continue
            if k.endswith("experts.gate_up_proj"):
                stem = name[: -len("gate_up_proj")]
                down = sd[k[: -len("gate_up_proj")] + "down_proj"]
                if spec["layout"] == "per_expert":
                    for e in range(E):
                        out[f"{stem}{e}.gate_proj.weight"] = v[e, :I]
                        out[f"{stem}{e}.up_proj.weight"] = v[e, I:]
                        out[f"{stem}{e}.down_proj.weight"] = down[e]
                else:
                    out[stem + "gate_up_proj"] = v
                    out[stem + "down_proj"] = down
                continue
            out[name] = v
    return out


def composite_config(model, spec):
    text = model.config.to_dict()
    text["model_type"] = "qwen3_5_moe_text"
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": text,
        "vision_config": {"model_type": "qwen3_5_moe_vision", "depth": 1, "hidden_size": 32, "num_heads": 2},
        "tie_word_embeddings": spec["tie"],
        "transformers_version": transformers.__version__,
    }


def store_weights(model, mtp, spec, directory):
    """Writes the checkpoint, then loads the stored values back into model (and mtp) so the
    oracle runs on exactly what a reader gets (bf16/f16 rounding included)."""
    if spec["save"] == "save_pretrained":
        # transformers' own writer and layout, in the fixture dtype
        for p in model.parameters():
            p.copy_(torch.from_numpy(N.round_bf16(p.detach().numpy())) if spec["dtype"] == "BF16" else p)
        half = copy.deepcopy(model).to(torch.bfloat16 if spec["dtype"] == "BF16" else torch.float32)
        shard = "60KB" if spec["shards"] > 1 else "10GB"
        half.save_pretrained(directory, max_shard_size=shard)
        return sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    tensors = checkpoint_tensors(model, mtp, spec)
    entries = {}
    stored = {}
    for k, v in tensors.items():
        entry, back = N.as_stored(v.detach().numpy(), spec["dtype"])
        entries[k] = entry
        stored[k] = back
    if spec.get("composite"):
        # a vision tower the converter must skip, as in real Qwen3.5 checkpoints
        entries["model.visual.blocks.0.norm1.weight"] = N.tensor_entry("F32", np.ones((32,), np.float32))
    if spec["shards"] > 1:
        N.write_sharded(directory, entries, spec["shards"], {"format": "pt"})
    else:
        N.write_safetensors(f"{directory}/model.safetensors", entries, {"format": "pt"})
    if spec.get("composite"):
        with open(f"{directory}/config.json", "w") as f:
            json.dump(composite_config(model, spec), f, indent=1)
    else:
        model.config.to_json_file(f"{directory}/config.json")
    reload_stored(model, mtp, spec, stored)
    return sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))


def reload_stored(model, mtp, spec, stored):
    E = spec["experts"]

    def value(name):
        return torch.from_numpy(np.ascontiguousarray(stored[name]))

    for module, is_mtp in ((model, False), (mtp, True)):
        if module is None:
            continue
        new = {}
        for k in module.state_dict():
            name = ckpt_name(spec, k, is_mtp)
            if k.endswith(("experts.gate_up_proj", "experts.down_proj")) and spec["layout"] == "per_expert":
                stem = name[: name.rindex(".") + 1]
                if k.endswith("gate_up_proj"):
                    new[k] = torch.stack([torch.cat([value(f"{stem}{e}.gate_proj.weight"),
                                                     value(f"{stem}{e}.up_proj.weight")]) for e in range(E)])
                else:
                    new[k] = torch.stack([value(f"{stem}{e}.down_proj.weight") for e in range(E)])
            elif name in stored:
                new[k] = value(name)
            elif spec["tie"] and k == "lm_head.weight":
                new[k] = value(ckpt_name(spec, "model.embed_tokens.weight"))
            else:
                raise KeyError(f"no stored value for {name}")
        module.load_state_dict(new)
    if spec["tie"]:
        model.tie_weights()


# --- one fixture ----------------------------------------------------------------------------------

def write_f32(path, t):
    np.ascontiguousarray(t.detach().float().numpy(), dtype="<f4").tofile(path)


def run_fixture(spec, root, log):
    directory = os.path.join(root, spec["name"])
    os.makedirs(directory, exist_ok=True)
    for attempt in range(40):
        seed = spec["seed"] + 1000 * attempt
        for f in os.listdir(directory):
            os.remove(os.path.join(directory, f))
        model = make_model(spec, seed)
        mtp = make_mtp(model, spec, seed) if spec["mtp"] else None
        files = store_weights(model, mtp, spec, directory)
        gen = torch.Generator().manual_seed(seed + 1)
        prompt = torch.randint(0, spec["vocab"], (PROMPT_LEN,), generator=gen).tolist()
        rec = RouteRecorder(routers(model) + (routers(mtp) if mtp else []), spec["top_k"])
        cont, margins = greedy(model, prompt, GREEDY_LEN)
        tokens = prompt + cont
        logits = logits_of(model, tokens)
        m_logits = mtp_logits(model, mtp, spec, tokens) if mtp else None
        qmodel, qmtp = quantized_copy(model, mtp)
        rec.close()
        rec_q = RouteRecorder(routers(qmodel) + (routers(qmtp) if qmtp else []), spec["top_k"])
        q_cont, q_margins = greedy(qmodel, prompt, GREEDY_LEN)
        q_tokens = prompt + q_cont
        q_logits = logits_of(qmodel, q_tokens)
        qm_logits = mtp_logits(qmodel, qmtp, spec, q_tokens) if qmtp else None
        rec_q.close()
        # margins of every position we compare, not only the greedy ones
        all_margins = [relative_margin(r) for r in logits] + [relative_margin(r) for r in q_logits]
        gap = min(rec.min_gap, rec_q.min_gap)
        ok = min(margins + q_margins) > MIN_MARGIN and gap > MIN_ROUTE_GAP
        log(f"{spec['name']}: seed {seed} greedy margin {min(margins + q_margins):.2e} route gap {gap:.2e}"
            f" -> {'ok' if ok else 'retry'}")
        if ok:
            break
    else:
        raise RuntimeError(f"{spec['name']}: no seed gave clear margins")
    gen_tokens = generate_check(model, prompt, GREEDY_LEN)
    write_f32(os.path.join(directory, "logits.f32"), logits)
    write_f32(os.path.join(directory, "logits_q4.f32"), q_logits)
    if m_logits is not None:
        write_f32(os.path.join(directory, "mtp_logits.f32"), m_logits)
        write_f32(os.path.join(directory, "mtp_logits_q4.f32"), qm_logits)
    reload = reload_check(directory, tokens, logits)
    oracle = {
        "name": spec["name"],
        "kind": spec["kind"],
        "source": f"transformers {transformers.__version__}, torch {torch.__version__}, float32 on CPU, "
                  f"{type(model).__name__}",
        "seed": seed,
        "spec": {k: v for k, v in spec.items() if k not in ("name", "seed")},
        "rotary_dim": effective_rotary(model),
        "files": files,
        "prompt": prompt,
        "greedy": cont,
        "tokens": tokens,
        "greedy_margins": margins,
        "min_position_margin": min(all_margins),
        "min_route_gap": gap,
        "generate_greedy": gen_tokens,
        "generate_agrees": gen_tokens == cont,
        "reload_check": reload,
        "logits": {"file": "logits.f32", "shape": list(logits.shape), "tokens": "tokens"},
        "q4": {
            "greedy": q_cont, "tokens": q_tokens, "greedy_margins": q_margins,
            "logits": {"file": "logits_q4.f32", "shape": list(q_logits.shape)},
            "method": "every matrix quantized to q4 g32 as lib/model/q4.ts does (spec/oracle/oracle_numerics.py), "
                      "router/gates/in_proj_b,a rounded to bf16, the rest f32",
        },
    }
    if m_logits is not None:
        oracle["mtp"] = {
            "convention": "row t: trunk hidden h_t after the final norm, token tokens[t+1], rope position t "
                          "(vLLM qwen3_next_mtp), causal attention over rows 0..t; logits via lm_head",
            "logits": {"file": "mtp_logits.f32", "shape": list(m_logits.shape)},
            "logits_q4": {"file": "mtp_logits_q4.f32", "shape": list(qm_logits.shape), "tokens": "q4.tokens"},
        }
    with open(os.path.join(directory, "oracle.json"), "w") as f:
        json.dump(oracle, f, indent=1)
    log(f"{spec['name']}: tokens {tokens} generate agrees {gen_tokens == cont} reload {reload}")


def reload_check(directory, tokens, logits):
    """Loads the written checkpoint with transformers itself: the names and layout are ones it
    accepts, and the values are the ones the oracle ran on."""
    try:
        m = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager").eval()
        got = m(input_ids=torch.tensor([tokens])).logits[0].float()
        err = ((got - logits).abs().max() / logits.abs().max()).item()
        return {"class": type(m).__name__, "max_rel_err": err}
    except Exception as e:  # noqa: BLE001
        return {"error": repr(e)[:400]}


# --- MLX fixtures -----------------------------------------------------------------------------------

MLX_NORM_SUFFIXES = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                     ".q_norm.weight", ".k_norm.weight")


def run_mlx_fixture(spec, root, log):
    """An MLX (mlx-lm) 4-bit checkpoint: switch_mlp stacked experts, conv1d as [C, K, 1], shifted
    (1 + w) norms, 8-bit router gates, u32-packed weights with bf16 scales and biases."""
    directory = os.path.join(root, spec["name"])
    os.makedirs(directory, exist_ok=True)
    group = spec["group"]
    for attempt in range(40):
        seed = spec["seed"] + 1000 * attempt
        for f in os.listdir(directory):
            os.remove(os.path.join(directory, f))
        model = make_model(spec, seed)
        sd = model.state_dict()
        E, I = spec["experts"], spec["moe_i"]
        hf = {}
        for k, v in sd.items():
            if k.endswith("experts.gate_up_proj"):
                stem = k[: -len("experts.gate_up_proj")]
                hf[stem + "switch_mlp.gate_proj.weight"] = v[:, :I]
                hf[stem + "switch_mlp.up_proj.weight"] = v[:, I:]
            elif k.endswith("experts.down_proj"):
                hf[k[: -len("experts.down_proj")] + "switch_mlp.down_proj.weight"] = v
            else:
                hf[k] = v
        prefix = "language_model." if spec.get("composite") else ""
        entries = {}
        oracle_vals = {}
        quant_cfg = {"group_size": group, "bits": 4, "mode": "affine"}
        for k, v in hf.items():
            a = v.detach().float().numpy()
            key = prefix + k
            quantizable = (a.ndim >= 2 and a.shape[-1] % group == 0 and "conv1d" not in k)
            if quantizable:
                bits = 8 if k.endswith(("mlp.gate.weight", "shared_expert_gate.weight")) else 4
                q, s, b = N.mlx_affine_quantize(a, group, bits)
                deq = N.affine_dequantize(q, s, b, a.shape, group)
                base = key[: -len(".weight")]
                entries[base + ".weight"] = N.tensor_entry("U32", N.mlx_pack_u32(q, bits).reshape(*a.shape[:-1], -1))
                entries[base + ".scales"] = N.tensor_entry("BF16", s.reshape(*a.shape[:-1], -1))
                entries[base + ".biases"] = N.tensor_entry("BF16", b.reshape(*a.shape[:-1], -1))
                if bits != 4:
                    quant_cfg[base] = {"group_size": group, "bits": bits}
                oracle_vals[k] = deq
            elif "conv1d" in k:
                entry, back = N.as_stored(a.reshape(a.shape[0], a.shape[-1], 1), "BF16")
                entries[key] = entry
                oracle_vals[k] = back.reshape(a.shape)
            elif k.endswith("A_log"):
                entries[key] = N.tensor_entry("F32", a)
                oracle_vals[k] = a.copy()
            elif a.ndim == 1 and k.endswith(MLX_NORM_SUFFIXES):
                entry, back = N.as_stored(a + 1.0, "BF16")
                entries[key] = entry
                oracle_vals[k] = back - 1.0
            else:
                entry, back = N.as_stored(a, "BF16")
                entries[key] = entry
                oracle_vals[k] = back
        # what a q4 conversion stores: MLX 4-bit matrices pass through, small ones become bf16
        new_sd = {}
        for k in sd:
            if k.endswith("experts.gate_up_proj"):
                stem = k[: -len("experts.gate_up_proj")]
                v = np.concatenate([oracle_vals[stem + "switch_mlp.gate_proj.weight"],
                                    oracle_vals[stem + "switch_mlp.up_proj.weight"]], axis=1)
            elif k.endswith("experts.down_proj"):
                v = oracle_vals[k[: -len("experts.down_proj")] + "switch_mlp.down_proj.weight"]
            else:
                v = oracle_vals[k]
                if role(k) == "small":
                    v = N.round_bf16(v)
            new_sd[k] = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32))
        model.load_state_dict(new_sd)
        N.write_safetensors(f"{directory}/model.safetensors", entries, {"format": "mlx"})
        cfg = composite_config(model, spec) if spec.get("composite") else model.config.to_dict()
        cfg["quantization"] = quant_cfg
        cfg["quantization_config"] = quant_cfg
        with open(f"{directory}/config.json", "w") as f:
            json.dump(cfg, f, indent=1)
        gen = torch.Generator().manual_seed(seed + 1)
        prompt = torch.randint(0, spec["vocab"], (PROMPT_LEN,), generator=gen).tolist()
        rec = RouteRecorder(routers(model), spec["top_k"])
        cont, margins = greedy(model, prompt, GREEDY_LEN)
        tokens = prompt + cont
        logits = logits_of(model, tokens)
        rec.close()
        ok = min(margins) > MIN_MARGIN and rec.min_gap > MIN_ROUTE_GAP
        log(f"{spec['name']}: seed {seed} margin {min(margins):.2e} gap {rec.min_gap:.2e} -> {'ok' if ok else 'retry'}")
        if ok:
            break
    else:
        raise RuntimeError(f"{spec['name']}: no seed gave clear margins")
    write_f32(os.path.join(directory, "logits_q4.f32"), logits)
    oracle = {
        "name": spec["name"], "kind": spec["kind"], "seed": seed,
        "source": f"transformers {transformers.__version__}, torch {torch.__version__}, float32 on CPU, "
                  f"{type(model).__name__} holding the dequantized MLX weights",
        "spec": {k: v for k, v in spec.items() if k not in ("name", "seed")},
        "mlx": {"group_size": group, "bits": 4, "router_bits": 8,
                "notes": "mlx-lm layout: switch_mlp stacked experts, conv1d [C,K,1], norms stored as 1 + w, "
                         "8-bit mlp.gate and shared_expert_gate, scales/biases bf16; no mtp (mlx-lm drops it)"},
        "prompt": prompt, "greedy": cont, "tokens": tokens, "greedy_margins": margins,
        "min_route_gap": rec.min_gap,
        "q4": {"greedy": cont, "tokens": tokens, "greedy_margins": margins,
               "logits": {"file": "logits_q4.f32", "shape": list(logits.shape)},
               "method": "MLX 4-bit weights dequantized (bf16 scale * q + bf16 bias); 8-bit router and "
                         "in_proj_ba/b/a dequantized then rounded to bf16, as a q4 conversion stores them"},
    }
    with open(os.path.join(directory, "oracle.json"), "w") as f:
        json.dump(oracle, f, indent=1)
    log(f"{spec['name']}: tokens {tokens}")


# --- mHC op fixture ---------------------------------------------------------------------------------

def run_mhc(root, log):
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as dsv4

    directory = os.path.join(root, "mhc")
    os.makedirs(directory, exist_ok=True)
    cases = [dict(n=4, d=64, rows=6, iters=20, eps=1e-6, seed=5), dict(n=2, d=32, rows=3, iters=3, eps=1e-6, seed=6),
             dict(n=3, d=32, rows=4, iters=1, eps=1e-6, seed=7)]
    entries = {}
    meta = []
    for i, c in enumerate(cases):
        n, d, S = c["n"], c["d"], c["rows"]
        cfg = AutoConfig.for_model("deepseek_v4", hidden_size=d, hc_mult=n, hc_sinkhorn_iters=c["iters"],
                                   hc_eps=c["eps"], rms_norm_eps=c["eps"])
        hc = dsv4.DeepseekV4HyperConnection(cfg).float()
        head = dsv4.DeepseekV4HyperHead(cfg).float()
        g = torch.Generator().manual_seed(c["seed"])
        mix = (2 + n) * n
        with torch.no_grad():
            hc.fn.copy_(torch.randn(mix, n * d, generator=g) * (2.0 / (n * d) ** 0.5))
            hc.base.copy_(torch.randn(mix, generator=g) * 0.5)
            hc.scale.copy_(torch.rand(3, generator=g) + 0.5)
            head.hc_fn.copy_(torch.randn(n, n * d, generator=g) * (2.0 / (n * d) ** 0.5))
            head.hc_base.copy_(torch.randn(n, generator=g) * 0.5)
            head.hc_scale.copy_(torch.rand(1, generator=g) + 0.5)
        X = torch.randn(1, S, n, d, generator=g) * (torch.rand(1, 1, n, 1, generator=g) * 2 + 0.25)
        y = torch.randn(1, S, d, generator=g)
        post, comb, collapsed = hc(X)
        written = post.unsqueeze(-1) * y.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), X)
        final = head(X)
        # pre is consumed inside transformers' module: recompute it with DeepSeek's reference
        # hc_split_sinkhorn formula and check that both agree on every output
        flat = X.reshape(1, S, n * d)
        mixes = (flat @ hc.fn.T) * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + c["eps"])
        sc, base = hc.scale, hc.base
        pre = torch.sigmoid(mixes[..., :n] * sc[0] + base[:n]) + c["eps"]
        post_ref = 2 * torch.sigmoid(mixes[..., n:2 * n] * sc[1] + base[n:2 * n])
        comb_ref = torch.softmax((mixes[..., 2 * n:] * sc[2] + base[2 * n:]).view(1, S, n, n), -1) + c["eps"]
        comb_ref = comb_ref / (comb_ref.sum(-2, keepdim=True) + c["eps"])
        for _ in range(c["iters"] - 1):
            comb_ref = comb_ref / (comb_ref.sum(-1, keepdim=True) + c["eps"])
            comb_ref = comb_ref / (comb_ref.sum(-2, keepdim=True) + c["eps"])
        read_ref = (pre.unsqueeze(-1) * X).sum(2)
        agree = {
            "post": (post - post_ref).abs().max().item(),
            "comb": (comb - comb_ref).abs().max().item(),
            "read": (collapsed - read_ref).abs().max().item(),
        }
        p = f"case{i}."
        for name, t in [("X", X[0]), ("fn", hc.fn), ("base", hc.base), ("scale", hc.scale), ("y", y[0]),
                        ("pre", pre[0]), ("post", post[0]), ("comb", comb[0]), ("read", collapsed[0]),
                        ("written", written[0]), ("head_fn", head.hc_fn), ("head_base", head.hc_base),
                        ("head_scale", head.hc_scale), ("head_read", final[0])]:
            entries[p + name] = N.tensor_entry("F32", t.detach().float().numpy())
        meta.append({**c, "prefix": p, "reference_agreement": agree})
        log(f"mhc case {i}: {c} transformers vs reference formula {agree}")
    N.write_safetensors(os.path.join(directory, "mhc.safetensors"), entries)
    doc = {
        "source": f"transformers {transformers.__version__} DeepseekV4HyperConnection.forward (post, comb, read) "
                  "and DeepseekV4HyperHead.forward (head_read); written = post * y + comb^T X as "
                  "DeepseekV4DecoderLayer does; pre from DeepSeek's hc_split_sinkhorn formula",
        "layout": "X [rows, n, d]; fn [(2+n)n, n*d]; base [(2+n)n]; scale [3]; y [rows, d]; pre, post [rows, n]; "
                  "comb [rows, n, n] (comb[i][j] weighs input stream i into output stream j); read [rows, d]; "
                  "written [rows, n, d]; head_fn [n, n*d]; head_base [n]; head_scale [1]; head_read [rows, d]",
        "norm_eps_note": "transformers normalises the flattened streams with rms_norm_eps, MODEL.md with hc.eps; "
                         "both are eps here",
        "cases": meta,
    }
    with open(os.path.join(directory, "mhc.json"), "w") as f:
        json.dump(doc, f, indent=1)


# --- sources, for the record ------------------------------------------------------------------------

def dump_sources(root):
    import inspect

    directory = os.path.join(root, "sources")
    os.makedirs(directory, exist_ok=True)
    names = ["transformers.models.qwen3_next.modeling_qwen3_next", "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
             "transformers.models.qwen3_next.configuration_qwen3_next",
             "transformers.models.qwen3_5_moe.configuration_qwen3_5_moe",
             "transformers.models.deepseek_v4.modeling_deepseek_v4", "transformers.conversion_mapping"]
    for mod in names:
        try:
            m = __import__(mod, fromlist=["x"])
            with open(os.path.join(directory, mod.split(".")[-1] + ".py"), "w") as f:
                f.write(inspect.getsource(m))
        except Exception as e:  # noqa: BLE001
            with open(os.path.join(directory, mod.split(".")[-1] + ".error"), "w") as f:
                f.write(repr(e))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--sources", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(s)

    log(f"transformers {transformers.__version__} torch {torch.__version__} numpy {np.__version__}")
    failures = 0
    jobs = [(s["name"], run_fixture, s) for s in SPECS] + [(s["name"], run_mlx_fixture, s) for s in MLX_SPECS]
    jobs.append(("mhc", lambda _s, root, lg: run_mhc(root, lg), None))
    for name, fn, spec in jobs:
        if args.only and name not in args.only.split(","):
            continue
        try:
            fn(spec, args.out, log)
        except Exception:  # noqa: BLE001
            failures += 1
            log(f"FAILED {name}:\n{traceback.format_exc()}")
    if args.sources:
        dump_sources(args.out)
    with open(os.path.join(args.out, "make_fixtures.log"), "w") as f:
        f.write("\n".join(lines) + "\n")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
