#!/usr/bin/env bash
# GPT-2 124M training step time of fusebox (f32, and `--precision bf16`) against PyTorch
# eager, fp32 and mixed precision (`torch.autocast(bfloat16)`), same threads, same run,
# in rotated order, at batch 4 × 64 and batch 8 × 256 (bench/peers/torch_gpt2.py; the
# step is the same: forward, backward, clipping, AdamW). Prints each median and
# fusebox's time as a fraction of its peer's (below 1: fusebox faster): f32 against
# PyTorch fp32, bf16 against PyTorch autocast.
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
    for who in $(echo "ours fp32 oursbf16 bf16 ours fp32 oursbf16" | cut -d' ' -f$((turn + 1))-$((turn + 4))); do
        case $who in
            ours) ours=$("$F" bench train --preset gpt2-124m --batch "$batch" --seq "$seq" --steps "$steps" --threads "$threads" --json | field seconds_per_step) ;;
            oursbf16) oursbf16=$("$F" bench train --preset gpt2-124m --batch "$batch" --seq "$seq" --steps "$steps" --threads "$threads" --precision bf16 --json | field seconds_per_step) ;;
            fp32) fp32=$("$PY" bench/peers/torch_gpt2.py --batch "$batch" --seq "$seq" --steps "$steps" --threads "$threads" --json | field seconds_per_step) ;;
            bf16) bf16=$("$PY" bench/peers/torch_gpt2.py --batch "$batch" --seq "$seq" --steps "$steps" --threads "$threads" --autocast bf16 --json | field seconds_per_step) ;;
        esac
    done
    turn=$(((turn + 1) % 4))
    "$PY" -c "o,ob,f,b=$ours,$oursbf16,$fp32,$bf16; print(f'  fusebox f32 {o:.3f} s · torch fp32 {f:.3f} s ({o/f:.2f}x its time)'); print(f'  fusebox bf16 {ob:.3f} s · torch autocast bf16 {b:.3f} s ({ob/b:.2f}x its time) · fusebox f32 / bf16 {o/ob:.2f}')"
done
