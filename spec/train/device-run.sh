#!/usr/bin/env bash
# One call on the H200 machine: the torch agreement check, the corpus + tokenizer (unless a
# prepared data directory is given), and both models trained side by side on the one GPU.
#   bash spec/train/device-run.sh smoke              # 30 s of training each, stdlib corpus
#   bash spec/train/device-run.sh full WALL_S MTP_S  # everything done WALL_S after the start
# In full mode the trunk trains for whatever the wall-clock budget leaves after the data
# preparation, the MTP phase and about 60 s for evaluation, export and packing.
# Inputs: .out/check (bun spec/train/make-check-fixture.ts .out/check), optionally $DATA.
# Everything comes back under $OUT (at most 8 files): the weight shards, data.tar.gz (when
# prepared here), misc.tar.gz (tokenizer, configs, metrics, logs, agreement fixtures), log.
set -o pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
: "${OUT:?OUT must name the output folder}"
mode=${1:-smoke}
START=$(date +%s)
W=/tmp/cherenkov-train
rm -rf "$W" && mkdir -p "$W"
EXTRA=numpy,scipy,sympy,networkx,pandas
if [ "$mode" = smoke ]; then TRUNK=30; MTP=10; VALW=128; EXTRA=; else WALL=${2:-540}; MTP=${3:-45}; VALW=512; fi

nvidia-smi -L
python3 -c "import torch, transformers, tokenizers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'cuda', torch.cuda.is_available())"

if [ -d .out/check ]; then
  python3 spec/train/check_agreement.py .out/check "$W/agreement" || echo "AGREEMENT CHECK FAILED"
fi

if [ -n "${DATA:-}" ]; then
  cp -r "$DATA" "$W/data"
else
  python3 spec/train/prepare_data.py --out "$W/data" --extra "$EXTRA" --extra-chars 12000000 || { echo "DATA PREP FAILED"; exit 1; }
  [ "$mode" = smoke ] && tar czf "$OUT/data.tar.gz" -C "$W" data/train.u16 data/val.u16 data/tokenizer.json data/tokenizer_config.json data/corpus.json data/heldout.json
fi
if [ "$mode" != smoke ]; then
  TRUNK=$(( START + WALL - 60 - MTP - $(date +%s) ))
  echo "trunk training: $TRUNK s, MTP: $MTP s"
fi

for arch in qwen4 qwen3next; do
  python3 spec/train/train.py --arch $arch --data "$W/data" --out "$W/$arch" \
    --trunk-seconds "$TRUNK" --mtp-seconds "$MTP" --val-windows "$VALW" > "$W/$arch.log" 2>&1 &
done
wait
tail -n 25 "$W/qwen4.log" "$W/qwen3next.log"

if [ "$mode" = smoke ]; then
  mv "$W"/qwen3next/*.safetensors "$OUT/" 2>/dev/null
else
  mv "$W"/qwen4/*.safetensors "$W"/qwen3next/*.safetensors "$OUT/" 2>/dev/null
fi
tar czf "$OUT/misc.tar.gz" -C "$W" --ignore-failed-read data/tokenizer.json data/tokenizer_config.json data/corpus.json data/heldout.json \
  qwen4/config.json qwen4/metrics.json qwen3next/config.json qwen3next/metrics.json qwen4.log qwen3next.log agreement
ls -la "$OUT"
echo "done in $(( $(date +%s) - START )) s"
