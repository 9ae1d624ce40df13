#!/bin/bash
# The H200 bench of docs/performance.md in one run (device machine, bun on PATH, CUDA built):
# synthesizes the 30b-a3b-shape preset (q4) on the machine's disk, measures the disk's direct
# read bandwidth, runs bench:decode on it at pool 100/50/25% with lookahead on/off, and the
# transformers peer. Each result is a line of $OUT/h200.jsonl; bound.ts makes the table.
#   OUT=/some/dir bash spec/bench/h200.sh
set -u
cd "$(dirname "$0")/../.."
export CHERENKOV_BACKEND=cuda
M=/tmp/m30
if [ ! -f $M/manifest.json ]; then
  start=$(date +%s)
  timeout 300 bun lib/cli/main.ts synth --preset 30b-a3b-shape --out $M --seed 1 || exit 1
  echo "{\"synth_s\": $(( $(date +%s) - start )), \"bytes\": $(du -sb $M | cut -f1)}" | tee -a $OUT/h200.jsonl
fi
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
dd if=$M/experts.bin of=/dev/null bs=16M count=256 iflag=direct 2>&1 | tail -1 | tee $OUT/disk.txt
run() { timeout 120 bun spec/bench/decode.ts --json --only-model --model $M --tokens 16 --prompt 16 "$@" > $OUT/one.json 2>> $OUT/bench.err && cat $OUT/one.json >> $OUT/h200.jsonl && echo "ok $*" || echo "failed $*"; }
run --pool 100%
[ "${SKIP_PEER:-}" = 1 ] || timeout 150 python3 spec/bench/peer-transformers.py 8 16 2>> $OUT/peer.err | tee -a $OUT/h200.jsonl
run --pool 25%
run --pool 50%
run --pool 25% --no-lookahead
run --pool 50% --no-lookahead
