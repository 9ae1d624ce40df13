#!/usr/bin/env bash
# One call on the H200 machine for the pool's routing traces (issue 14): a qwen4-exp and a
# Qwen3-Next model with 64 experts per layer and top-8 (spec/train/qwen4-exp-64x8.config.json:
# the shipped models' shapes with 64 experts of intermediate 32 instead of 16 of 64), trained
# side by side on the shipped models' corpus, tokenized with the shipped tokenizer; both
# converted to q4 cherenkov folders with Bun; bench:io on this machine's disk meanwhile.
#   OUT=... bash spec/train/device-run-64x8.sh TRUNK_S MTP_S BUNDLES
# BUNDLES: a folder with bun (the binary), io.js and import.js (`bun build` bundles of
# spec/bench/io.ts and spec/train/import-models.ts, so that no node_modules need to travel).
# Comes back under $OUT: q4x.tar.part-*, q3n.tar.part-* (the q4 folders, split under 15 MB),
# misc.tar.gz (held-out files, corpus description, configs, metrics, logs), bench-io.json, log.
# The traces are recorded afterwards, on any machine: spec/train/pool-traces.ts.
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
: "${OUT:?OUT must name the output folder}"
TRUNK=${1:-80}
MTP=${2:-5}
B=${3:?BUNDLES folder}
START=$(date +%s)
W=/tmp/cherenkov-64x8
rm -rf "$W" && mkdir -p "$W"
CFG=spec/train/qwen4-exp-64x8.config.json
nvidia-smi -L

python3 spec/train/prepare_data.py --out "$W/data" --extra numpy,scipy,sympy,networkx,pandas --extra-chars 12000000 \
  --tokenizer examples/models/qwen4-exp-tiny/tokenizer.json || { echo "DATA PREP FAILED"; }
echo "data ready at $(( $(date +%s) - START )) s"

# bench:io reads the disk while the GPU trains (it needs no GPU, training needs little disk).
( CHERENKOV_SHIM_PATH=/nonexistent.so "$B/bun" "$B/io.js" --json --passes 3 --in-flight 4,8,16,32,64 > "$OUT/bench-io.json" 2> "$W/bench-io.log"
  echo "bench:io exit $? at $(( $(date +%s) - START )) s" >> "$W/bench-io.log" ) &
IO=$!

for arch in qwen4 qwen3next; do
  python3 spec/train/train.py --arch $arch --config "$CFG" --data "$W/data" --out "$W/$arch" \
    --trunk-seconds "$TRUNK" --mtp-seconds "$MTP" --val-windows 128 > "$W/$arch.log" 2>&1 &
done
for job in $(jobs -p); do [ "$job" != "$IO" ] && wait "$job"; done
echo "trained at $(( $(date +%s) - START )) s"
tail -n 6 "$W/qwen4.log" "$W/qwen3next.log"

mkdir -p "$W/src4" "$W/src3"
cp "$W"/qwen4/*.safetensors "$W/qwen4/config.json" "$W"/data/tokenizer*.json "$W/src4/" 2>/dev/null
cp "$W"/qwen3next/*.safetensors "$W/qwen3next/config.json" "$W"/data/tokenizer*.json "$W/src3/" 2>/dev/null
"$B/bun" "$B/import.js" "$W/src4" "$W/src3" "$W/q4x" "$W/q3n" > "$W/import.log" 2>&1 || echo "IMPORT FAILED"
tail -n 3 "$W/import.log"
(cd "$W" && tar cf - q4x | split -b 15000000 - "$OUT/q4x.tar.part-" && tar cf - q3n | split -b 15000000 - "$OUT/q3n.tar.part-")

wait "$IO"
cat "$W/bench-io.log"
tar czf "$OUT/misc.tar.gz" -C "$W" --ignore-failed-read data/corpus.json data/heldout.json qwen4/config.json qwen4/metrics.json \
  qwen3next/config.json qwen3next/metrics.json qwen4.log qwen3next.log import.log bench-io.log
ls -la "$OUT"
echo "done in $(( $(date +%s) - START )) s"
