#!/usr/bin/env bash
# Two back-to-back calls on the H200 machine for the pool's routing traces (issue 14): a
# qwen4-exp and a Qwen3-Next model with 64 experts per layer and top-8
# (spec/train/qwen4-exp-64x8.config.json: the shipped models' shapes with 64 experts of
# intermediate 32 instead of 16 of 64), trained side by side on the shipped models' corpus,
# tokenized with the shipped tokenizer; then both converted to q4 cherenkov folders with Bun,
# and bench:io on that machine's disk.
#   OUT=... bash spec/train/device-run-64x8.sh train TRUNK_S MTP_S   # python only
#   OUT=... bash spec/train/device-run-64x8.sh finish BUNDLES        # the next call, same machine
# Two calls because Bun (38 MB compressed) and the tracked tree (29 MB) do not fit in one
# call's 64 MiB: the first carries half of bun.xz and leaves it in /tmp, the second the rest.
# BUNDLES: a folder two levels below the repository root (so that the bundle's import of
# ../../lib/shim.ts resolves) with bun, io.js and import.js (`bun build --target bun` bundles of
# spec/bench/io.ts, with lib/shim.ts external, and spec/train/import-models.ts: no
# node_modules travel). Comes back: train: misc-train.tar.gz (held-out files, corpus
# description, configs, metrics, logs), log; finish: q4x.tar.part-*, q3n.tar.part-* (the q4
# folders, split under 15 MB), bench-io.json, misc.tar.gz, log.
# The traces are recorded afterwards, on any machine: spec/train/pool-traces.ts.
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
: "${OUT:?OUT must name the output folder}"
START=$(date +%s)
W=/tmp/cherenkov-64x8
CFG=spec/train/qwen4-exp-64x8.config.json
mode=${1:?train or finish}

if [ "$mode" = train ]; then
  TRUNK=${2:-75}
  MTP=${3:-5}
  rm -rf "$W" && mkdir -p "$W"
  nvidia-smi -L
  python3 spec/train/prepare_data.py --out "$W/data" --extra numpy,scipy,sympy,networkx,pandas --extra-chars 12000000 \
    --tokenizer examples/models/qwen4-exp-tiny/tokenizer.json || echo "DATA PREP FAILED"
  echo "data ready at $(( $(date +%s) - START )) s"
  for arch in qwen4 qwen3next; do
    python3 spec/train/train.py --arch $arch --config "$CFG" --data "$W/data" --out "$W/$arch" \
      --trunk-seconds "$TRUNK" --mtp-seconds "$MTP" --val-windows 128 > "$W/$arch.log" 2>&1 &
  done
  wait
  echo "trained at $(( $(date +%s) - START )) s"
  tail -n 6 "$W/qwen4.log" "$W/qwen3next.log"
  ls -la "$W/qwen4" "$W/qwen3next"
  tar czf "$OUT/misc-train.tar.gz" -C "$W" --ignore-failed-read data/corpus.json data/heldout.json qwen4/config.json \
    qwen4/metrics.json qwen3next/config.json qwen3next/metrics.json qwen4.log qwen3next.log
  echo "done in $(( $(date +%s) - START )) s"
  exit 0
fi

B=${2:?BUNDLES folder}
( CHERENKOV_SHIM_PATH=/nonexistent.so "$B/bun" "$B/io.js" --json --passes 3 --in-flight 4,8,16,32,64 > "$OUT/bench-io.json" 2> "$W/bench-io.log"
  echo "bench:io exit $? at $(( $(date +%s) - START )) s" >> "$W/bench-io.log" ) &
IO=$!
if [ -d "$W/qwen4" ] && [ -d "$W/qwen3next" ]; then
  mkdir -p "$W/src4" "$W/src3"
  cp "$W"/qwen4/*.safetensors "$W/qwen4/config.json" "$W"/data/tokenizer*.json "$W/src4/"
  cp "$W"/qwen3next/*.safetensors "$W/qwen3next/config.json" "$W"/data/tokenizer*.json "$W/src3/"
  rm -rf "$W/q4x" "$W/q3n"
  "$B/bun" "$B/import.js" "$W/src4" "$W/src3" "$W/q4x" "$W/q3n" > "$W/import.log" 2>&1 || echo "IMPORT FAILED"
  tail -n 3 "$W/import.log"
  (cd "$W" && tar cf - q4x | split -b 15000000 - "$OUT/q4x.tar.part-" && tar cf - q3n | split -b 15000000 - "$OUT/q3n.tar.part-")
else
  echo "NO TRAINED MODELS in $W (the machine of the train call is gone?)"
fi
wait "$IO"
cat "$W/bench-io.log"
tar czf "$OUT/misc.tar.gz" -C "$W" --ignore-failed-read import.log bench-io.log
ls -la "$OUT"
echo "done in $(( $(date +%s) - START )) s"
