#!/usr/bin/env bash
# Runs `fusebox bench` and the peers (bench/peers/: PyTorch, numpy) on the same cases,
# alternating ours / peers per case for ROUNDS rounds, then prints a markdown table of
# the best median per side and the ratio ours/peer in throughput (>1: ours faster).
#
#   bench/compare.sh                 # every case (a few minutes on 2 cores)
#   PYTHON=/tmp/torchenv/bin/python THREADS=2 ROUNDS=2 MEMORY=1 bench/compare.sh
#   bench/compare.sh attention       # only cases whose name contains "attention"
#
# PYTHON: the interpreter for the peers (default python3; a peer without torch/numpy
# prints why and is skipped). THREADS: threads for ours and the peers (default: nproc).
# MEMORY=0 skips the attention peak-memory scaling check at T=16384. OUT: where the
# raw JSON lines go (default bench/results/last.jsonl).
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
THREADS=${THREADS:-$(nproc 2>/dev/null || echo 2)}
ROUNDS=${ROUNDS:-2}
MEMORY=${MEMORY:-1}
FILTER=${1:-}
OUT=${OUT:-bench/results/last.jsonl}
mkdir -p "$(dirname "$OUT")"
: >"$OUT"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')

echo "building release ..." >&2
cargo build --release -q -p fusebox-cli
BIN=target/release/fusebox

# case name | our arguments | peers (script:arguments, ';'-separated)
CASES=(
  "attention/fwd/b1_hq8_hkv8_t1024_d64|attention --batch 1 --heads 8 --kv-heads 8 --seq 1024 --head-dim 64 --pass fwd --speedup|torch_bench.py:attention --batch 1 --heads 8 --kv-heads 8 --seq 1024 --head-dim 64 --pass fwd"
  "attention/fwdbwd/b1_hq8_hkv8_t1024_d64|attention --batch 1 --heads 8 --kv-heads 8 --seq 1024 --head-dim 64 --pass fwdbwd --speedup|torch_bench.py:attention --batch 1 --heads 8 --kv-heads 8 --seq 1024 --head-dim 64 --pass fwdbwd"
  "attention/fwdbwd/b4_hq12_hkv12_t256_d64|attention --batch 4 --heads 12 --kv-heads 12 --seq 256 --head-dim 64 --pass fwdbwd --speedup|torch_bench.py:attention --batch 4 --heads 12 --kv-heads 12 --seq 256 --head-dim 64 --pass fwdbwd"
  "attention/fwdbwd/b1_hq32_hkv8_t512_d128|attention --batch 1 --heads 32 --kv-heads 8 --seq 512 --head-dim 128 --pass fwdbwd --speedup|torch_bench.py:attention --batch 1 --heads 32 --kv-heads 8 --seq 512 --head-dim 128 --pass fwdbwd"
  "attention/decode/b1_hq32_hkv8_t4096_d128|attention --batch 1 --heads 32 --kv-heads 8 --seq 4096 --head-dim 128 --pass decode --speedup|torch_bench.py:attention --batch 1 --heads 32 --kv-heads 8 --seq 4096 --head-dim 128 --pass decode"
  "matmul/1024x1024x1024|matmul --m 1024 --n 1024 --k 1024 --speedup|numpy_bench.py:matmul --m 1024 --n 1024 --k 1024;torch_bench.py:matmul --m 1024 --n 1024 --k 1024"
  "matmul/2048x2048x2048|matmul --m 2048 --n 2048 --k 2048 --speedup|numpy_bench.py:matmul --m 2048 --n 2048 --k 2048;torch_bench.py:matmul --m 2048 --n 2048 --k 2048"
  "ops|ops|torch_bench.py:ops"
)

# Appends each JSON line of a command's stdout to $OUT with "side" added.
record() {
  local side=$1
  shift
  "$@" 2>/dev/null | while IFS= read -r line; do
    case $line in
      \{*) printf '%s\n' "${line%\}}, \"side\": \"$side\"}" >>"$OUT" ;;
      skipped:*) echo "  $side: $line" >&2 ;;
    esac
  done || echo "  $side: failed: $*" >&2
}

for spec in "${CASES[@]}"; do
  IFS='|' read -r name ours peers <<<"$spec"
  [[ -n $FILTER && $name != *"$FILTER"* ]] && continue
  for ((r = 1; r <= ROUNDS; r++)); do
    echo "[$r/$ROUNDS] $name" >&2
    # shellcheck disable=SC2086 # the argument strings are meant to split
    record ours "$BIN" bench $ours --threads "$THREADS" --json
    IFS=';' read -ra list <<<"$peers"
    for p in "${list[@]}"; do
      script=${p%%:*}
      # shellcheck disable=SC2086
      record "${script%.py}" "$PYTHON" "bench/peers/$script" ${p#*:} --threads "$THREADS" --json
    done
  done
done

if [[ $MEMORY == 1 && ( -z $FILTER || memory == *"$FILTER"* || attention == *"$FILTER"* ) ]]; then
  echo "attention fwd+bwd peak memory at T=4096, 8192, 16384 ..." >&2
  record ours "$BIN" bench attention --batch 1 --heads 8 --seq 16384 --head-dim 64 --memory-scaling --threads "$THREADS" --json
fi

LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')
MODEL=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//')
MACHINE="Machine: ${MODEL:-$(uname -m)}, $(nproc) cores, $THREADS threads, $(date -u +%Y-%m-%d), fusebox $(git rev-parse --short HEAD 2>/dev/null || echo '?'), load average at start $LOAD_START, at end $LOAD_END; ratio = ours/peer throughput (>1: ours faster), best of $ROUNDS medians per side."
if command -v "$PYTHON" >/dev/null 2>&1; then
  "$PYTHON" bench/report.py "$OUT" "$MACHINE"
else
  echo "$MACHINE"
  echo "(no $PYTHON for the table; raw rows in $OUT)"
  cat "$OUT"
fi
