"""Numerics shared by the oracle scripts: bf16 rounding, the q4 quantizer of lib/model/q4.ts,
MLX's affine quantizer and its u32 packing, and a small safetensors writer.

Only numpy; no torch here, so this file can be checked on a machine without torch.

q4 (group 32 along the input dimension), exactly as lib/model/q4.ts does it:
  per group of 32 values: min, max (f32); scale = (max - min) / 15 computed in f64, rounded to
  f32 then to bf16 (nearest even); bias = bf16(min); q = floor((w - bias) / scale + 0.5) in f64
  (JavaScript's Math.round), clamped to 0..15; a group whose bf16 scale is not > 0 gets q = 0.
  Dequantized value = f32(scale * q + bias) computed in f64 and rounded once.
"""

import json
import struct

import numpy as np

GROUP = 32


def f32_to_bf16_bits(a):
    """bf16 bits of f32 values, round to nearest even (no NaNs expected)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_bf16(a):
    return bf16_bits_to_f32(f32_to_bf16_bits(a)).reshape(np.shape(a))


def q4_quantize(w):
    """q4 of lib/model/q4.ts. w: f32 array whose last dim is a multiple of 32.
    Returns (q uint8 [groups, 32], scale_bits uint16 [groups], bias_bits uint16 [groups])."""
    g = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, GROUP)
    mn = g.min(axis=1)
    mx = g.max(axis=1)
    s_f32 = ((mx.astype(np.float64) - mn.astype(np.float64)) / 15.0).astype(np.float32)
    s_bits = f32_to_bf16_bits(s_f32)
    b_bits = f32_to_bf16_bits(mn)
    s = bf16_bits_to_f32(s_bits).astype(np.float64)
    b = bf16_bits_to_f32(b_bits).astype(np.float64)
    ok = s > 0
    inv = 1.0 / np.where(ok, s, 1.0)
    q = np.floor((g.astype(np.float64) - b[:, None]) * inv[:, None] + 0.5)
    q = np.clip(q, 0, 15)
    q[~ok] = 0
    return q.astype(np.uint8), s_bits, b_bits


def affine_dequantize(q, s_bits, b_bits, shape, group=GROUP):
    """f32(scale * q + bias), f64 arithmetic rounded once (as lib/model/q4.ts dequantizes)."""
    q = np.asarray(q, dtype=np.float64).reshape(-1, group)
    s = bf16_bits_to_f32(s_bits).astype(np.float64).reshape(-1, 1)
    b = bf16_bits_to_f32(b_bits).astype(np.float64).reshape(-1, 1)
    return (s * q + b).astype(np.float32).reshape(shape)


def q4_roundtrip(w):
    """The f32 values a q4 tensor of w decodes to."""
    q, s, b = q4_quantize(w)
    return affine_dequantize(q, s, b, np.shape(w))


def q4_pack_nibbles(q):
    """q4 nibble bytes: element 2k in the low nibble of byte k."""
    q = np.asarray(q, dtype=np.uint8).reshape(-1)
    return (q[0::2] | (q[1::2] << 4)).astype(np.uint8)


def mlx_affine_quantize(w, group, bits):
    """MLX's affine quantizer (mlx/ops.cpp affine_quantize, as read): per group the scale's sign
    is chosen so the end with the larger magnitude is hit exactly; scales and biases are then
    stored as bf16. Returns (q uint8 [rows, in], scale_bits, bias_bits [rows, in/group])."""
    w = np.asarray(w, dtype=np.float32)
    rows = int(np.prod(w.shape[:-1]))
    g = w.reshape(rows, -1, group).astype(np.float32)
    n_bins = float(2**bits - 1)
    w_max = g.max(axis=-1, keepdims=True)
    w_min = g.min(axis=-1, keepdims=True)
    mask = np.abs(w_min) > np.abs(w_max)
    scales = np.maximum((w_max - w_min) / n_bins, np.float32(1e-7)).astype(np.float32)
    scales = np.where(mask, scales, -scales)
    edge = np.where(mask, w_min, w_max)
    q0 = np.round(edge / scales)
    scales = np.where(q0 != 0, edge / np.where(q0 != 0, q0, 1), scales).astype(np.float32)
    biases = np.where(q0 == 0, 0, edge).astype(np.float32)
    q = np.clip(np.round((g - biases) / scales), 0, n_bins).astype(np.uint8)
    return q.reshape(rows, -1), f32_to_bf16_bits(scales).reshape(rows, -1), f32_to_bf16_bits(biases).reshape(rows, -1)


def mlx_pack_u32(q, bits):
    """MLX packing: 32/bits values per uint32, value j of a word in bits [bits*j, bits*(j+1))."""
    per = 32 // bits
    q = np.asarray(q, dtype=np.uint32)
    rows, cols = q.reshape(-1, q.shape[-1]).shape
    q = q.reshape(rows, cols // per, per)
    word = np.zeros((rows, cols // per), dtype=np.uint32)
    for j in range(per):
        word |= q[:, :, j] << np.uint32(bits * j)
    return word


# --- safetensors ---------------------------------------------------------------------------

_DTYPES = {"F32": np.float32, "F16": np.float16, "U32": np.uint32, "U8": np.uint8, "BF16": np.uint16}


def tensor_entry(dtype, array):
    """(dtype, shape, bytes) for write_safetensors; BF16 arrays are given as uint16 bits."""
    arr = np.ascontiguousarray(array, dtype=_DTYPES[dtype])
    return dtype, list(arr.shape), arr.tobytes()


def as_stored(array, dtype):
    """An f32 array stored as dtype ("F32" | "BF16" | "F16"): the entry, and the f32 values a
    reader gets back (what the oracle model must hold)."""
    a = np.asarray(array, dtype=np.float32)
    if dtype == "F32":
        return tensor_entry("F32", a), a.copy()
    if dtype == "BF16":
        bits = f32_to_bf16_bits(a).reshape(a.shape)
        return tensor_entry("BF16", bits), bf16_bits_to_f32(bits).reshape(a.shape)
    if dtype == "F16":
        h = a.astype(np.float16)
        return tensor_entry("F16", h), h.astype(np.float32)
    raise ValueError(dtype)


def write_safetensors(path, tensors, metadata=None):
    """tensors: ordered dict name -> (dtype, shape, bytes)."""
    header = {}
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, (_, _, data) in tensors.items():
            f.write(data)


def write_sharded(directory, tensors, shards, metadata=None):
    """Splits tensors over `shards` files with a model.safetensors.index.json, as HF does."""
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map = {}
    total = 0
    for i in range(shards):
        part = {n: tensors[n] for n in names[i * per:(i + 1) * per]}
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(f"{directory}/{fname}", part, metadata)
        for n, (_, _, data) in part.items():
            weight_map[n] = fname
            total += len(data)
    with open(f"{directory}/model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)


def _exact_ties(groups):
    """Groups of bf16 values in which some (w - bias) / scale is exactly k + 1/2."""
    mn = groups.min(axis=1)
    mx = groups.max(axis=1)
    s = bf16_bits_to_f32(f32_to_bf16_bits(((mx.astype(np.float64) - mn) / 15.0).astype(np.float32))).astype(np.float64)
    b = bf16_bits_to_f32(f32_to_bf16_bits(mn)).astype(np.float64)
    x = (groups.astype(np.float64) - b[:, None]) / np.where(s > 0, s, 1.0)[:, None]
    return ((x - np.floor(x)) == 0.5).any(axis=1)


def write_q4_golden(directory, seed=3):
    """bf16-valued weights and the q4 bytes this mirror makes of them: half the groups hold an
    exact rounding tie, where the order of operations decides q. spec/oracle/q4-mirror.test.ts
    requires lib/model/q4.ts to produce the same bytes."""
    import os

    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    cand = round_bf16((rng.uniform(-1, 1, (200000, 32)) * rng.uniform(0.01, 2, (200000, 1))).astype(np.float32))
    tied = cand[_exact_ties(cand)][:128]
    plain = cand[~_exact_ties(cand)][:128]
    w = np.concatenate([tied, plain]).reshape(64, 128)
    w[5, :32] = 0.25  # a constant group
    w.astype("<f4").tofile(os.path.join(directory, "weights.f32"))
    q, s, b = q4_quantize(w)
    with open(os.path.join(directory, "weights.q4"), "wb") as f:
        f.write(q4_pack_nibbles(q).tobytes() + s.astype("<u2").tobytes() + b.astype("<u2").tobytes())
    return int(_exact_ties(w.reshape(-1, 32)).sum())


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "--q4-golden":
        print(f"{write_q4_golden(sys.argv[2])} groups with exact ties")
    else:
        print("usage: python3 spec/oracle/oracle_numerics.py --q4-golden DIR")
