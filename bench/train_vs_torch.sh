#!/usr/bin/env bash
# GPT-2 124M training step time of fusebox against PyTorch eager, fp32 and mixed
# precision (`torch.autocast(bfloat16)`), same threads, same run, in rotated order, at
# batch 4 × 64 and batch 8 × 256 (bench/peers/torch_gpt2.py; the step is the same:
# forward, backward, clipping, AdamW). Prints each median and fusebox's time as a
# fraction of each peer's (below 1: fusebox faster).
#
#   cargo build --release -p fusebox-cli
#   PYTHON=/path/to/venv/bin/python bench/train_vs_torch.sh [THREADS] [STEPS]   # defaults 2 5
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
steps=${2:-5}
F=${FUSEBOX:-target/release/fusebox}
PY=${PYTHON:-python3}
[ -x "$F" ] || { echo "no fusebox binary at $F (cargo build --release -p fusebox-cli)" >&2; exit 1; }
# PyTorch's OpenMP threads spin at barriers otherwise (bench/peers/torch_gpt2.py).
export OMP_WAIT_POLICY=PASSIVE

field() { "$PY" -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])' "$1"; }

turn=0
for shape in "4 64" "8 256"; do
    set -- $shape
    batch=$1 seq=$2
    echo "== gpt2-124m train step, batch $batch x seq $seq, $threads threads, median of $steps"
    for who in $(echo "ours fp32 bf16 ours fp32" | cut -d' ' -f$((turn + 1))-$((turn + 3))); do
        case $who in
            ours) ours=$("$F" bench train --preset gpt2-124m --batch "$batch" --seq "$seq" --steps "$steps" --threads "$threads" --json | field seconds_per_step) ;;
            fp32) fp32=$("$PY" bench/peers/torch_gpt2.py --batch "$batch" --seq "$seq" --steps "$steps" --threads "$threads" --json | field seconds_per_step) ;;
            bf16) bf16=$("$PY" bench/peers/torch_gpt2.py --batch "$batch" --seq "$seq" --steps "$steps" --threads "$threads" --autocast bf16 --json | field seconds_per_step) ;;
        esac
    done
    turn=$(((turn + 1) % 3))
    "$PY" -c "o,f,b=$ours,$fp32,$bf16; print(f'  fusebox fp32 {o:.3f} s · torch fp32 {f:.3f} s ({o/f:.2f}x its time) · torch autocast bf16 {b:.3f} s ({o/b:.2f}x its time)')"
done
