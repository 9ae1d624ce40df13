#!/bin/bash
# The H200 bench of docs/performance.md in one run (device machine, bun on PATH, CUDA built):
#  1. synthesizes the 30b-a3b-shape preset (q4) on the machine's disk (skipped when present);
#  2. measures the disk's direct-read bandwidth: one dd stream, and four at once (the engine
#     reads in parallel, so the four-stream figure is the disk bound's bandwidth);
#  3. bench:decode on it: pool 100% after a 256-token prompt (warm: every record read once), then
#     pool 100/50/25% after a 16-token prompt with lookahead on and off (cold: records read as
#     routed), each with CHERENKOV_BACKEND=cuda;
#     then bench:kernels (bytes, GB/s, % of a streaming kernel) and a per-kernel profile of decode steps;
#  4. the same-weights peer: transformers' Qwen3-Next at the preset's dimensions with LAYERS
#     (default 8) layers, timed on the GPU and saved (peer-same-weights.py), converted with
#     `cherenkov convert`, and bench:decode on the conversion with the same prompt.
# Every result is a line of $OUT/h200.jsonl; bound.ts makes the table.
#   OUT=/some/dir bash spec/bench/h200.sh
set -u
cd "$(dirname "$0")/../.."
export CHERENKOV_BACKEND=cuda
M=${M:-/tmp/m30}
LAYERS=${LAYERS:-8}
J=$OUT/h200.jsonl
if [ ! -f $M/cherenkov.json ]; then
  start=$(date +%s)
  timeout 300 bun lib/cli/main.ts synth --preset 30b-a3b-shape --out $M --seed 1 || exit 1
  echo "{\"synth_s\": $(( $(date +%s) - start )), \"bytes\": $(du -sb $M | cut -f1)}" | tee -a $J
fi
# Disk: 4 GiB from one stream, then 4 x 1 GiB from four streams at once (page cache dropped, O_DIRECT).
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
dd if=$M/experts.bin of=/dev/null bs=16M count=256 iflag=direct 2>&1 | tail -1 | tee $OUT/disk.txt
start=$(date +%s.%N)
for i in 0 1 2 3; do dd if=$M/experts.bin of=/dev/null bs=16M count=64 skip=$(( 300 + 64 * i )) iflag=direct 2> /dev/null & done; wait
echo "{\"disk_parallel_4x1GiB_bytes_per_s\": $(python3 -c "print(round(4 * 2**30 / ($(date +%s.%N) - $start)))")}" | tee -a $J
run() { timeout 150 bun spec/bench/decode.ts --json --only-model --model "$@" > $OUT/one.json 2>> $OUT/bench.err && cat $OUT/one.json >> $J && echo "ok $*" || echo "failed $*"; }
run $M --tokens 32 --prompt 256 --pool 100%
# Per-kernel times with bytes and GB/s beside a streaming kernel's (bench:kernels), and the
# per-kernel GPU profile of decode steps, each in a file of its own (the profile is written at
# exit: never name it like the bench's JSON).
timeout 300 bun spec/bench/kernels.ts --preset 30b-a3b-shape --storage device > $OUT/kernels.txt 2>&1 || echo "failed bench:kernels"
CHERENKOV_CUDA_PROFILE=$OUT/profile-decode.json timeout 150 bun spec/bench/decode.ts --json --only-model --model $M --tokens 32 --prompt 1 --pool 100% > $OUT/profile-run.json 2>> $OUT/bench.err || echo "failed profile"
for P in 100% 50% 25%; do
  run $M --tokens 16 --prompt 16 --pool $P
  run $M --tokens 16 --prompt 16 --pool $P --no-lookahead
done
# The same-weights peer (bf16 checkpoint on disk, its cherenkov q4 conversion).
H=/tmp/peer-hf; C=/tmp/peer-ck
rm -rf $H $C
timeout 240 python3 spec/bench/peer-same-weights.py $LAYERS 256 32 $H 2>> $OUT/peer.err | tail -1 | tee -a $J
start=$(date +%s)
timeout 240 bun lib/cli/main.ts convert $H $C --dtype q4 >> $OUT/convert.log 2>&1 && echo "{\"convert_s\": $(( $(date +%s) - start ))}" | tee -a $J
run $C --tokens 32 --prompt 256 --pool 100%
