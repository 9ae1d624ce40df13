"""Corpus and tokenizer for the trained example models (runs offline, on the H200 machine):
the Python standard library's own source (*.py of the running interpreter, PSF licence) and,
with --extra, the Python source of a few BSD-3-Clause packages installed there (at most
--extra-chars characters each), split into training and held-out files by a hash of the path,
and a byte-level BPE tokenizer trained on the training files with the `tokenizers` library.

  python3 spec/train/prepare_data.py --out DIR [--vocab 4096] [--extra numpy,scipy] [--max-files N]
                                     [--tokenizer FILE]   # reuse a tokenizer.json instead of training one

Writes DIR/tokenizer.json, DIR/tokenizer_config.json (ChatML template, <|endoftext|>),
DIR/train.u16 and DIR/val.u16 (token ids, documents joined by <|endoftext|>),
DIR/heldout.json (the held-out files: path and text, for traces) and DIR/corpus.json.
"""

import argparse
import json
import os
import sys
import sysconfig
import time
import zlib

import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MAX_FILE_BYTES = 400_000  # skips generated tables (unicode data and the like)


# Packages that may be added with --extra, and their licences (read from their distributions).
EXTRA_LICENCES = {"numpy": "BSD-3-Clause", "scipy": "BSD-3-Clause", "sympy": "BSD-3-Clause",
                  "networkx": "BSD-3-Clause", "pandas": "BSD-3-Clause", "sklearn": "BSD-3-Clause"}
DIST_NAMES = {"sklearn": "scikit-learn"}


def package_dir(name):
    import importlib.util
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def package_version(name):
    try:
        import importlib.metadata
        return importlib.metadata.version(DIST_NAMES.get(name, name))
    except Exception:  # noqa: BLE001
        return "unknown"


def heldout(rel):
    """One file in 20 is held out, by a stable hash of its path."""
    return zlib.crc32(rel.encode()) % 20 == 0


def collect(root, max_files, prefix="", max_chars=0):
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        for f in sorted(filenames):
            if f.endswith(".py"):
                files.append(os.path.join(dirpath, f))
    files.sort()
    if max_files:
        files = files[:: max(1, len(files) // max_files)][:max_files]
    docs = []
    for path in files:
        try:
            if os.path.getsize(path) > MAX_FILE_BYTES:
                continue
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            docs.append((prefix + os.path.relpath(path, root), text))
    if max_chars:  # an even spread of files up to the character budget
        docs.sort(key=lambda d: zlib.crc32(d[0].encode()))
        kept, total = [], 0
        for d in docs:
            if total + len(d[1]) > max_chars:
                continue
            kept.append(d)
            total += len(d[1])
        docs = sorted(kept)
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--max-files", type=int, default=0)
    ap.add_argument("--extra", default="")
    ap.add_argument("--extra-chars", type=int, default=20_000_000)
    ap.add_argument("--tokenizer", default="", help="an existing tokenizer.json (e.g. a shipped model's): no tokenizer training")
    args = ap.parse_args()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    root = sysconfig.get_paths()["stdlib"]
    docs = collect(root, args.max_files)
    sources = [{"name": "python-stdlib", "version": sys.version.split()[0], "licence": "PSF-2.0", "files": len(docs),
                "chars": sum(len(t) for _, t in docs)}]
    for name in [x for x in args.extra.split(",") if x]:
        if name not in EXTRA_LICENCES:
            raise SystemExit(f"--extra {name}: not in the list of packages with a known licence")
        where = package_dir(name)
        if where is None:
            print(f"extra package {name}: not installed, skipped", flush=True)
            continue
        got = collect(where, args.max_files, prefix=f"{name}/", max_chars=args.extra_chars)
        sources.append({"name": name, "version": package_version(name), "licence": EXTRA_LICENCES[name],
                        "files": len(got), "chars": sum(len(t) for _, t in got)})
        print(f"extra package {name} {sources[-1]['version']}: {len(got)} files, {sources[-1]['chars'] / 1e6:.1f} M chars", flush=True)
        docs += got
    train = [t for r, t in docs if not heldout(r)]
    val = [(r, t) for r, t in docs if heldout(r)]
    print(f"corpus: {root}: {len(docs)} files, {len(train)} train, {len(val)} held out, "
          f"{sum(len(t) for _, t in docs) / 1e6:.1f} M chars ({time.time() - t0:.1f} s)", flush=True)

    if args.tokenizer:
        tok = Tokenizer.from_file(args.tokenizer)
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=args.vocab, min_frequency=2, special_tokens=SPECIALS,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(train, trainer=trainer)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({
            "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096,
            "bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": None,
            "add_bos_token": False, "add_prefix_space": False, "chat_template": CHAT_TEMPLATE,
        }, f, indent=1)
    print(f"tokenizer: {tok.get_vocab_size()} tokens, <|endoftext|> = {eos} ({time.time() - t0:.1f} s)", flush=True)

    def encode(texts):
        ids = []
        for enc in tok.encode_batch(texts):
            ids.extend(enc.ids)
            ids.append(eos)
        return np.asarray(ids, dtype=np.uint16)

    tr = encode(train)
    va = encode([t for _, t in val])
    tr.tofile(os.path.join(args.out, "train.u16"))
    va.tofile(os.path.join(args.out, "val.u16"))
    with open(os.path.join(args.out, "heldout.json"), "w") as f:
        json.dump([{"path": r, "text": t} for r, t in val], f)
    info = {
        "source": f"Python source (*.py files up to {MAX_FILE_BYTES} bytes) of the standard library ({root}) and of the "
                  "packages listed in sources; held out: files whose path hash is 0 mod 20",
        "sources": sources,
        "files": len(docs), "train_files": len(train), "heldout_files": len(val),
        "train_tokens": int(tr.size), "heldout_tokens": int(va.size), "vocab": tok.get_vocab_size(), "eos": eos,
        "chars_per_token": sum(len(t) for t in train) / max(1, tr.size - len(train)),
        "heldout_paths": [r for r, _ in val],
    }
    with open(os.path.join(args.out, "corpus.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"tokens: {tr.size / 1e6:.2f} M train, {va.size / 1e6:.3f} M held out, "
          f"{info['chars_per_token']:.2f} chars/token ({time.time() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
