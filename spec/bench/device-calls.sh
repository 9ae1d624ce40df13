#!/usr/bin/env bash
# Carrying Bun to the device machine and the issue-18 runs there, in two calls of the `run` tool
# (spec/bench/h200.sh is the older one-shot bench for a machine that already has Bun).
# CI never runs this. Bun is not installed on the device machine and one call carries at most
# 64 MiB (the tracked tree is ~34 MiB), so Bun's xz'd binary (38 MB) travels in two halves.
#
# Here, once per checkout (fills ignored folders; needs bun, xz, ../shared/device/ggml-anchor):
#   bash spec/bench/device-calls.sh prepare
# Device call A, carry [".dev/p1"]:                        bash spec/bench/device-calls.sh stash
# Device call B right after (the machine is still warm: it goes back after ~30 s idle), carry
# [".dev/p2", ".dev/small", ".anchor"]:
#   source spec/bench/device-calls.sh && h200_standard && h200_dec variant VAR=1 && ...
# Functions write under $OUT (the run tool brings it back); h200_dec appends one JSON line per
# run to $OUT/res.jsonl and prints a summary line. Every call copies the tree afresh (newer
# mtimes than the last call's build), so each call that runs the library starts with h200_build.
set -o pipefail
H200_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

h200_prepare() {
  cd "$H200_ROOT" || return 1
  mkdir -p .git/info && for d in /.dev/ /.anchor/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
  mkdir -p .dev/p1 .dev/p2 .dev/small
  local bun_exe; bun_exe=$(command -v bun) || { echo "prepare: bun not found"; return 1; }
  bun_exe=$(readlink -f "$bun_exe")
  xz -9e -T2 -c "$bun_exe" > /tmp/cherenkov-bun.xz || return 1
  (cd /tmp && rm -f cherenkov-bunpart.* && split -b 28m cherenkov-bun.xz cherenkov-bunpart.)
  mv /tmp/cherenkov-bunpart.aa .dev/p1/bunpart.aa && mv /tmp/cherenkov-bunpart.ab .dev/p2/bunpart.ab || return 1
  # The runtime dependencies and the ones spec/ imports (the device has no registry).
  tar -cJf .dev/small/nm.tar.xz -C node_modules $(cd node_modules && ls -d @huggingface zod ollama openai whatwg-fetch 2>/dev/null) || return 1
  rm -rf .anchor && cp -r ../shared/device/ggml-anchor .anchor || return 1
  # A baseline tree to time against (BASE=<rev>; h200_base builds it on the device).
  if [ -n "${BASE:-}" ]; then
    git archive "$BASE" lib kernels metal-shim spec/bench spec/golden spec/dispatch-names.ts package.json bunfig.toml tsconfig.json | xz -9 > .dev/small/base.tar.xz || return 1
    git rev-parse "$BASE" > .dev/small/base.rev
  fi
  du -sh .dev/p1 .dev/p2 .dev/small .anchor
}

# Call A: the first half of Bun's binary waits in /tmp for call B.
h200_stash() { cp "$H200_ROOT/.dev/p1/bunpart.aa" /tmp/ && ls -l /tmp/bunpart.aa; }

h200_setup() {
  cd "$H200_ROOT" || return 1
  mkdir -p /tmp/bunbin
  if [ ! -x /tmp/bunbin/bun ]; then
    [ -f /tmp/bunpart.aa ] || { echo "setup: /tmp/bunpart.aa missing (run call A first, on this machine)"; return 1; }
    cat /tmp/bunpart.aa .dev/p2/bunpart.ab | python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.decompress(sys.stdin.buffer.read()))" > /tmp/bunbin/bun || return 1
    chmod +x /tmp/bunbin/bun
  fi
  export PATH=/tmp/bunbin:$PATH
  [ -d node_modules ] || { mkdir node_modules && tar -xJf .dev/small/nm.tar.xz -C node_modules; } || return 1
  bun --version && nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
}

# The CUDA and CPU backends (~30 s on 16 cores).
h200_build() { (cd "$H200_ROOT" && bun metal-shim/build.ts --backend cuda --backend cpu 2>&1 | tail -3); }

# The baseline tree of `BASE=<rev> ... prepare` in /tmp/base, built (then TREE=/tmp/base h200_dec NAME ...).
h200_base() {
  [ -f "$H200_ROOT/.dev/small/base.tar.xz" ] || { echo "base: no .dev/small/base.tar.xz (prepare with BASE=<rev>)"; return 1; }
  rm -rf /tmp/base && mkdir -p /tmp/base && tar -xJf "$H200_ROOT/.dev/small/base.tar.xz" -C /tmp/base || return 1
  ln -s "$H200_ROOT/node_modules" /tmp/base/node_modules
  (cd /tmp/base && bun metal-shim/build.ts --backend cuda 2>&1 | tail -1) && echo "base: $(cat "$H200_ROOT/.dev/small/base.rev")"
}

# The 30b-a3b-shape q4 model (~60-70 s), unless it is there.
h200_synth() {
  local out=${1:-/tmp/m30}
  [ -f "$out/cherenkov.json" ] || (cd "$H200_ROOT" && bun lib/cli/main.ts synth --preset 30b-a3b-shape --out "$out" --seed 1 > /tmp/synth.log 2>&1) || { tail -5 /tmp/synth.log; return 1; }
}

# ggml-cuda's test-backend-ops: h200_anchor_start builds it in the background (~2.5-3 min, CPU
# only; setsid: the build outlives the call), h200_anchor_report then times it alone on the GPU
# (after this session's benches, so neither disturbs the other) with .anchor/run.sh's cases.
# The cmake and ninja lines are run.sh's (it builds and times in one go), the build niced and
# four cores narrower so the benches beside it keep the host's attention.
h200_anchor_start() {
  [ -x /tmp/anchor/build/bin/test-backend-ops ] && return 0
  (rm -rf /tmp/anchor && mkdir -p /tmp/anchor && cd /tmp/anchor && tar -xJf "$H200_ROOT/.anchor/ggml.tar.xz" && setsid nohup bash -c '
    cmake -S ggml -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_CUDA_FA=OFF -DGGML_BUILD_TESTS=ON \
      -DGGML_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA_NCCL=OFF > cmake.log 2>&1 &&
    nice -n 19 ninja -C build test-backend-ops -j"$(( $(nproc) - 4 ))" > ninja.log 2>&1; echo $? > built' > /dev/null 2>&1 &)
}
h200_anchor_report() {
  local i B=/tmp/anchor/build/bin/test-backend-ops
  for i in $(seq 1 300); do [ -f /tmp/anchor/built ] && break; sleep 1; done
  [ "$(cat /tmp/anchor/built 2>/dev/null)" = 0 ] || { echo "anchor: build failed or unfinished"; tail -5 /tmp/anchor/ninja.log /tmp/anchor/cmake.log 2>/dev/null; return 1; }
  { $B perf -b CUDA0 -o MUL_MAT_ID -p "type_a=q4_0" 2>&1 | grep "n_mats=128"
    $B perf -b CUDA0 -o MUL_MAT -p "type_a=q4_0,type_b=f32,m=4096,n=(1|512)," 2>&1 | grep "MUL_MAT"; } > "$OUT/anchor.txt"
  grep -E "n=1,|n_mats=128.*n=1," "$OUT/anchor.txt" | head -8
}

# h200_dec NAME [VAR=VALUE ...] [-- bench args]: bench:decode on the CUDA backend (default
# args: the 30b model, 64 tokens after a 256-token prompt, pool 100%); TREE=/tmp/base h200_dec ...
# runs the baseline tree's bench.
h200_dec() {
  local name=$1; shift; local envs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  [ "$1" = "--" ] && shift
  local args=("$@"); [ ${#args[@]} -eq 0 ] && args=(--only-model --model /tmp/m30 --tokens 64 --prompt 256 --pool 100% --no-round-trip)
  (cd "${TREE:-$H200_ROOT}" && env CHERENKOV_BACKEND=cuda "${envs[@]}" bun spec/bench/decode.ts --json "${args[@]}" > /tmp/dec.json 2> /tmp/dec.err) || { tail -5 /tmp/dec.err; return 1; }
  python3 - "$name" "${envs[*]}" <<'PY' >> "$OUT/res.jsonl"
import json, sys
r = json.load(open("/tmp/dec.json")); print(json.dumps({"name": sys.argv[1], "env": sys.argv[2], "r": r}))
PY
  python3 - "$name" <<'PY'
import json, sys
r = json.load(open("/tmp/dec.json")); m = r["models"][-1]; p = m["phasesPerToken"]; s = m.get("speculative")
line = f"{sys.argv[1]}: {m['tokensPerSecond']:.1f} tok/s, gpu {p.get('gpu', 0):.3f} encode {p.get('encode', 0):.3f} ms/token, {m['commandsPerToken']:.0f} cmds, {m['handshakesPerToken']:.1f} handshakes"
if s: line += f"; drafts {s['drafts']}: {s['tokensPerSecond']:.1f} tok/s ({s['tokensPerSecond'] / m['tokensPerSecond']:.2f}x), {s['commandsPerCycle']:.0f} cmds/cycle, {s.get('msPerCycle', 0):.3f} ms/cycle, step {s.get('phasesPerCycle', {}).get('step', 0):.3f}, prepare {s.get('phasesPerCycle', {}).get('prepare', 0):.3f}, overran {s.get('preparesOverran', '-')}, {s.get('tokensPerCycle', 0):.2f} tokens a cycle, {s.get('plainStepsPerCycle', 0):.2f} plain steps a cycle"
if s and s.get("pairs"): line += f"; {len(s['pairs']['plain'])} pairs {s['pairs']['pairedRatio']:.2f}x (median {s['pairs']['medianRatio']:.2f}x; plain {'/'.join(f'{x:.0f}' for x in s['pairs']['plain'])}, spec {'/'.join(f'{x:.0f}' for x in s['pairs']['speculative'])})"
a = m.get("auto")
med = lambda xs: sorted(xs)[len(xs) // 2] if len(xs) % 2 else sum(sorted(xs)[len(xs) // 2 - 1:len(xs) // 2 + 1]) / 2
if a: line += f"; auto {'/'.join(f'{x:.1f}' for x in a['auto'])} vs plain {'/'.join(f'{x:.1f}' for x in a['plain'])} tok/s (medians {med(a['auto']) / med(a['plain']):.3f}x, pairs {a.get('pairedRatio', float('nan')):.3f}x), steps {a.get('stepsPerRun', a['steps'])}"
print(line)
PY
}

# h200_sweep "NAME VAR=VALUE [VAR=VALUE ...]" ...: the default and each variant of environment
# switches (docs/engine.md's table) alternately in one call: base, variant 1, variant 2, base,
# ... (a base row after every two variants), so a variant's rows sit beside a base row timed
# moments before or after it on the same machine.
h200_sweep() {
  local i=0 v
  h200_dec sweep-base0 || return 1
  for v in "$@"; do
    # shellcheck disable=SC2086
    h200_dec $v
    i=$((i + 1)); [ $((i % 2)) -eq 0 ] && h200_dec "sweep-base$i"
  done
  [ $((i % 2)) -eq 1 ] && h200_dec "sweep-base$i"
  return 0
}

# bench:kernels at the 30b shape, one decode row, device storage (KNAME=name: $OUT/name.txt instead of kernels.txt).
h200_kernels() { (cd "$H200_ROOT" && CHERENKOV_BACKEND=cuda bun spec/bench/kernels.ts --preset 30b-a3b-shape --nb 1 --storage device "$@" 2>&1 | tee "$OUT/${KNAME:-kernels}.txt" | tail -40); }

# h200_ncu FILTER KERNEL_REGEX [LAUNCHES]: Nsight Compute on bench:kernels' case FILTER (one decode
# row, 30b shape), the first LAUNCHES (default 2) launches whose name matches KERNEL_REGEX after
# the warm-up's: speed of light, memory, occupancy, launch and warp-state sections (~1 min a kernel).
h200_ncu() {
  local filter=$1 kregex=$2 n=${3:-2} f; f="$OUT/ncu-$(echo "$1" | tr -c 'a-zA-Z0-9\n' _).txt"
  (cd "$H200_ROOT" && CHERENKOV_BACKEND=cuda timeout 400 ncu --target-processes all --kernel-name "regex:$kregex" --launch-skip "$n" --launch-count "$n" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
    bun spec/bench/kernels.ts --preset 30b-a3b-shape --nb 1 --storage device --filter "$filter" --iters 1 --reps 1 > "$f" 2>&1)
  grep -E "ckg_|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued" "$f" | head -40
}

# h200_ncu_decode KERNEL_REGEX [LAUNCHES]: Nsight Compute on a 30b decode run's kernels (4 tokens
# after a 1-token prompt), the first LAUNCHES (default 2) matching launches after 48 skipped (the
# prompt's): for kernels bench:kernels runs in another form (the out projections' hc epilogue).
h200_ncu_decode() {
  local kregex=$1 n=${2:-2} f; f="$OUT/ncu-decode-$(echo "$1" | tr -c 'a-zA-Z0-9\n' _).txt"
  (cd "$H200_ROOT" && CHERENKOV_BACKEND=cuda CHERENKOV_RECORDED_STEPS=0 timeout 400 ncu --target-processes all --kernel-name "regex:$kregex" --launch-skip 48 --launch-count "$n" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
    bun spec/bench/decode.ts --only-model --model /tmp/m30 --tokens 4 --prompt 1 --pool 100% --no-round-trip > "$f" 2>&1)
  grep -E "ckg_|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued" "$f" | head -40
}

# h200_ncu_stalls KERNEL_REGEX [LAUNCHES]: where a decode step's kernel spends its warps' cycles
# (as h200_ncu_decode, ~1 min a kernel): instructions executed and warps launched (their ratio
# is a warp's instruction count) and the stall reasons per issued instruction, largest first.
h200_ncu_stalls() {
  local kregex=$1 n=${2:-1} f; f="$OUT/ncu-stalls-$(echo "$1" | tr -c 'a-zA-Z0-9\n' _).txt"
  (cd "$H200_ROOT" && CHERENKOV_BACKEND=cuda CHERENKOV_RECORDED_STEPS=0 timeout 400 ncu --target-processes all --kernel-name "regex:$kregex" --launch-skip 48 --launch-count "$n" \
    --metrics "smsp__inst_executed.sum,sm__warps_launched.sum,gpu__time_duration.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    bun spec/bench/decode.ts --only-model --model /tmp/m30 --tokens 4 --prompt 1 --pool 100% --no-round-trip > "$f" 2>&1)
  python3 - "$f" <<'PY'
import re, sys
kernel = None; rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"\s+(ckg_\w+)", line)
    if m: kernel = m.group(1); rows.setdefault(kernel, {}); continue
    m = re.match(r"\s+(\S+)\s+(\S+)?\s+([\d.,]+)$", line)
    if kernel and m: rows[kernel][m.group(1)] = float(m.group(3).replace(",", "")) * {"ns": 1e-3, "ms": 1e3, "s": 1e6}.get(m.group(2) or "", 1)
for k, r in rows.items():
    inst, warps = r.get("smsp__inst_executed.sum", 0), r.get("sm__warps_launched.sum", 1)
    stalls = sorted(((v, n.replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", "")) for n, v in r.items() if "stalled" in n), reverse=True)
    print(f"{k}: {r.get('gpu__time_duration.sum', 0):.2f} us, {inst / warps:.0f} instructions a warp ({warps:.0f} warps); stalls per issue: " + ", ".join(f"{n} {v:.2f}" for v, n in stalls[:7]))
PY
}

# h200_ncu_source KERNEL_REGEX: where in its SASS a decode step's kernel stalls (as
# h200_ncu_stalls, one launch): Nsight Compute's warp-state sampling per instruction (the
# SourceCounters section), printed as the 30 instructions with the most samples and the
# samples summed over 16-instruction windows (which code the warps wait in: a long straight
# run waiting on instruction fetch shows as one hot window after another). CSV kept in $OUT.
h200_ncu_source() {
  local kregex=$1 f; f="$OUT/ncu-source-$(echo "$1" | tr -c 'a-zA-Z0-9\n' _)"
  (cd "$H200_ROOT" && CHERENKOV_BACKEND=cuda CHERENKOV_RECORDED_STEPS=0 timeout 400 ncu --target-processes all --kernel-name "regex:$kregex" --launch-skip 48 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --export "$f" --force-overwrite \
    bun spec/bench/decode.ts --only-model --model /tmp/m30 --tokens 4 --prompt 1 --pool 100% --no-round-trip > "$f.log" 2>&1)
  ncu --import "$f.ncu-rep" --page source --print-source sass --csv > "$f.csv" 2> "$f.err" || { tail -3 "$f.err" "$f.log"; return 1; }
  python3 - "$f.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next((i for i, r in enumerate(rows) if any("Sampling" in c for c in r)), None)
if head is None:
    print("no sampling columns; header:", rows[:2]); sys.exit(0)
cols = rows[head]
num = lambda v: float(v.replace(",", "") or 0) if v.replace(",", "").replace(".", "").isdigit() else 0.0
samp = next(i for i, c in enumerate(cols) if "Sampling" in c and "All" in c) if any("Sampling" in c and "All" in c for c in cols) else next(i for i, c in enumerate(cols) if "Sampling" in c)
src = next((i for i, c in enumerate(cols) if c.strip() in ("Source", "# Source")), 1)
body = [r for r in rows[head + 1:] if len(r) == len(cols)]
total = sum(num(r[samp]) for r in body) or 1
print(f"{len(body)} instructions, {total:.0f} samples ({cols[samp]})")
for k, r in sorted(enumerate(body), key=lambda kr: -num(kr[1][samp]))[:30]:
    print(f"  #{k:5d} {100 * num(r[samp]) / total:5.1f}%  {r[src][:70]}")
win = [sum(num(r[samp]) for r in body[i:i + 16]) for i in range(0, len(body), 16)]
print("by 16-instruction windows (start, share):", ", ".join(f"{16 * i}:{100 * w / total:.1f}%" for i, w in sorted(enumerate(win), key=lambda iw: -iw[1])[:20]))
PY
}

# h200_profile NAME [bench args]: a per-kernel CUDA profile of a decode run (default: 16 tokens of
# the 30b model after a 1-token prompt), its top rows printed (spec/bench/profile.ts).
h200_profile() {
  local name=$1; shift; [ "${1:-}" = "--" ] && shift; local args=("$@")
  [ ${#args[@]} -eq 0 ] && args=(--only-model --model /tmp/m30 --tokens 16 --prompt 1 --pool 100% --no-round-trip)
  (cd "$H200_ROOT" && CHERENKOV_BACKEND=cuda CHERENKOV_CUDA_PROFILE="$OUT/profile-$name.json" bun spec/bench/decode.ts --json "${args[@]}" > /tmp/prof.json 2> /tmp/prof.err) || { tail -5 /tmp/prof.err; return 1; }
  (cd "$H200_ROOT" && bun spec/bench/profile.ts "$OUT/profile-$name.json" --top 25 | tee "$OUT/profile-$name.txt")
}

# h200_standard: the measurements every session's first call after `stash` repeats (~5-6 min
# with the model's synthesis; the anchor is built meanwhile and timed alone at the end): the 30b
# decode twice (and the baseline tree's twice, when prepared), drafts "auto" through the Model
# API, the tiny model's 2- and 3-draft cycles, bench:kernels' issue-18 cases, ggml's anchor.
# Extra variants go after it in the same call:
#   source spec/bench/device-calls.sh && h200_standard && h200_dec name VAR=1 ...
h200_standard() {
  local tiny="--only-model --model $H200_ROOT/examples/models/qwen4-exp-tiny --tokens 64 --prompt 16 --no-round-trip"
  h200_setup && h200_anchor_start && h200_build || return 1
  # With a baseline tree (.dev/small/base.tar.xz: `BASE=<rev> ... prepare`), it is built while
  # the model is made, and timed alternately with this tree's rows (base1, base2).
  local base=""; [ -f "$H200_ROOT/.dev/small/base.tar.xz" ] && { h200_base > /tmp/base.log 2>&1 & base=$!; }
  h200_synth || return 1
  [ -n "$base" ] && { wait "$base"; tail -1 /tmp/base.log; }
  # A first run the numbers leave out: the thirteenth session's first row took 7.9 ms a token
  # where the next took 4.5 (the GPU's clocks coming up from idle, the anchor's build at full
  # width beside it); the anchor now builds niced on all but four cores.
  h200_dec warmup || return 1
  h200_dec head1 || return 1
  [ -n "$base" ] && TREE=/tmp/base h200_dec base1
  h200_dec head2 || return 1
  [ -n "$base" ] && TREE=/tmp/base h200_dec base2
  h200_dec auto -- --only-model --model /tmp/m30 --tokens 64 --prompt 256 --pool 100% --auto --auto-runs 6 --no-round-trip
  local d; for d in 2 3; do h200_dec "tiny-d$d" -- $tiny --drafts $d; done
  h200_kernels --filter "stream|routed experts|projection|anchor|logits|loads only" | grep -v "^gemm"
  h200_anchor_report
}

# h200_memcheck TEST_FILE...: compute-sanitizer's memcheck over kernel tests on the CUDA backend.
h200_memcheck() {
  (cd "$H200_ROOT" && CHERENKOV_BACKEND=cuda timeout 500 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 3 \
    bun test --timeout 300000 "$@" > "$OUT/memcheck.txt" 2>&1; echo "memcheck exit $?"; grep -E "ERROR SUMMARY|^ *[0-9]+ (pass|fail)" "$OUT/memcheck.txt" | tail -4)
}

# A test directory on the CUDA backend, with a time limit (seconds).
h200_tests() { (cd "$H200_ROOT" && CHERENKOV_BACKEND=cuda timeout "${2:-300}" bun test --timeout 300000 "$1" > "$OUT/tests-$(basename "$1").txt" 2>&1; grep -E "^\(fail|^ *[0-9]+ (pass|fail|skip)" "$OUT/tests-$(basename "$1").txt"); }

case "${1:-}" in
  prepare) h200_prepare ;;
  stash) h200_stash ;;
  "") ;;
  *) echo "usage: bash spec/bench/device-calls.sh prepare|stash, or source it for the h200_* functions"; exit 2 ;;
esac
