#!/usr/bin/env bash
# The fine-tuning demonstration: SmolLM2-135M-Instruct (the Q4_1 GGUF, dequantized to
# f32 for full fine-tuning) learns 3-digit addition as chat turns ("What is 123 + 456?"
# → "579"). Prints the held-out greedy exact match (200 problems never trained on, nor
# their b + a twins) before and after, the steps and minutes of training, the wall time
# of the whole run (loading and both evaluations included) and the peak memory (RSS).
# Exits non-zero unless the held-out exact match reaches TARGET (90%) within
# TIME_LIMIT seconds (20 minutes) of training: the run stops at the time limit and is
# evaluated as it stands.
#
# Usage, from the repository root (builds the release binary first):
#     cargo build --release -p fusebox-cli
#     scripts/finetune_addition_demo.sh                 # 2 threads, the settings below
#     STEPS=200 LR=2e-4 THREADS=4 scripts/finetune_addition_demo.sh
# The model comes from scripts/fetch-smollm2.sh when models/ does not hold it.
#
# The settings: batch 8 conversations, learning rate LR with WARMUP steps of linear
# warmup and cosine decay to LR/10 over STEPS, no evaluation during training
# (--eval-every 0: the 200-problem evaluation costs as much as several steps).
set -euo pipefail
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
BIN=${FUSEBOX:-target/release/fusebox}
STEPS=${STEPS:-300}
LR=${LR:-3e-4}
WARMUP=${WARMUP:-10}
BATCH=${BATCH:-8}
THREADS=${THREADS:-2}
TIME_LIMIT=${TIME_LIMIT:-1200}
TARGET=${TARGET:-0.90}
OUT=${OUT:-runs/addition-chat-full}
[ -f "$MODEL" ] || scripts/fetch-smollm2.sh
[ -x "$BIN" ] || { echo "no $BIN: run cargo build --release -p fusebox-cli" >&2; exit 1; }
log=$(mktemp)
trap 'rm -f "$log" "$log.json"' EXIT
start=$(date +%s)
/usr/bin/time -v "$BIN" train --init "$MODEL" --data addition-chat --steps "$STEPS" --lr "$LR" \
    --warmup "$WARMUP" --batch "$BATCH" --eval-every 0 --time-limit "$TIME_LIMIT" --threads "$THREADS" \
    --out "$OUT" --overwrite --json >"$log.json" 2>"$log" || { cat "$log" >&2; exit 1; }
wall=$(( $(date +%s) - start ))
python3 - "$log.json" "$log" "$wall" "$TARGET" "$TIME_LIMIT" <<'PY'
import json, re, sys
v = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(sys.argv[2]).read())
wall, target, limit = int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
print(f"steps {v['steps']}, {v['seconds'] / 60:.1f} min of training, {v['tokens_per_s']:.0f} tokens/s "
      f"({wall / 60:.1f} min wall in all, loading and both evaluations included)")
print(f"held-out exact match: {100 * v['initial_accuracy']:.1f}% -> {100 * v['accuracy']:.1f}%")
print(f"held-out loss: {v['initial_eval_loss']:.4f} -> {v['eval_loss']:.4f}")
if rss:
    print(f"peak memory (RSS): {int(rss.group(1)) / 2**20:.2f} GiB")
print(f"checkpoint: {v['checkpoint']}")
if v["accuracy"] < target:
    print(f"FAIL: {100 * v['accuracy']:.1f}% < {100 * target:.0f}% held-out exact match "
          f"after {v['steps']} steps in {v['seconds'] / 60:.1f} min (limit {limit / 60:.0f} min)")
    sys.exit(1)
print(f"PASS: ≥ {100 * target:.0f}% held-out exact match in ≤ {limit / 60:.0f} min of training")
PY
