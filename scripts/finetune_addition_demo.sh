#!/usr/bin/env bash
# The fine-tuning demonstration: SmolLM2-135M-Instruct (the Q4_1 GGUF, dequantized to
# f32 for full fine-tuning) learns 3-digit addition as chat turns ("What is 123 + 456?"
# → "579"). Prints the held-out greedy exact match (200 problems never trained on, nor
# their b + a twins) before and after, the minutes of training and the peak memory
# (RSS) of the run.
#
# Usage, from the repository root (builds the release binary first):
#     cargo build --release -p fusebox-cli
#     scripts/finetune_addition_demo.sh            # 200 steps of 8 conversations, 2 threads
#     STEPS=400 THREADS=4 scripts/finetune_addition_demo.sh
# The model comes from scripts/fetch-smollm2.sh when models/ does not hold it.
set -euo pipefail
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
BIN=${FUSEBOX:-target/release/fusebox}
STEPS=${STEPS:-200}
THREADS=${THREADS:-2}
OUT=${OUT:-runs/addition-chat-full}
[ -f "$MODEL" ] || scripts/fetch-smollm2.sh
[ -x "$BIN" ] || { echo "no $BIN: run cargo build --release -p fusebox-cli" >&2; exit 1; }
log=$(mktemp)
/usr/bin/time -v "$BIN" train --init "$MODEL" --data addition-chat --steps "$STEPS" --threads "$THREADS" \
    --out "$OUT" --overwrite --json >"$log.json" 2>"$log"
python3 - "$log.json" "$log" <<'PY'
import json, re, sys
v = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(sys.argv[2]).read())
print(f"steps {v['steps']}, {v['seconds'] / 60:.1f} min of training, {v['tokens_per_s']:.0f} tokens/s")
print(f"held-out exact match: {100 * v['initial_accuracy']:.1f}% -> {100 * v['accuracy']:.1f}%")
print(f"held-out loss: {v['initial_eval_loss']:.4f} -> {v['eval_loss']:.4f}")
if rss:
    print(f"peak memory (RSS): {int(rss.group(1)) / 2**20:.2f} GiB")
print(f"checkpoint: {v['checkpoint']}")
PY
rm -f "$log" "$log.json"
