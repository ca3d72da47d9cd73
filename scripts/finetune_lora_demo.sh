#!/usr/bin/env bash
# The LoRA (QLoRA) demonstration: SmolLM2-135M-Instruct learns 3-digit addition as chat
# turns ("What is 123 + 456?" → "579") through rank-16 LoRA adapters on every attention
# and MLP projection, the base kept frozen in its Q4_1 blocks. Prints the held-out greedy
# exact match (200 problems never trained on) before and after, the steps, the minutes of
# training, the memory figures and the peak RSS; exits non-zero when the final exact
# match is below 90%.
#
# Usage, from the repository root (builds the release binary first):
#     cargo build --release -p fusebox-cli
#     scripts/finetune_lora_demo.sh                 # 2 threads, stops at 20 minutes
#     STEPS=300 RANK=8 THREADS=4 scripts/finetune_lora_demo.sh
# The model comes from scripts/fetch-smollm2.sh when models/ does not hold it.
#
# The settings: batch 8 conversations (the default), rank RANK with α = 2·RANK, learning
# rate LR with 10 steps of linear warmup and cosine decay to LR/10 over STEPS, no
# evaluation during training (--eval-every 0), stopped at TIME_LIMIT seconds of training
# if it gets there first (240 steps take about 16 minutes on 2 cores).
set -euo pipefail
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
BIN=${FUSEBOX:-target/release/fusebox}
STEPS=${STEPS:-240}
RANK=${RANK:-16}
LR=${LR:-1e-3}
THREADS=${THREADS:-2}
TIME_LIMIT=${TIME_LIMIT:-1200}
OUT=${OUT:-runs/addition-chat-lora}
[ -f "$MODEL" ] || scripts/fetch-smollm2.sh
[ -x "$BIN" ] || { echo "no $BIN: run cargo build --release -p fusebox-cli" >&2; exit 1; }
log=$(mktemp)
trap 'rm -f "$log" "$log.json"' EXIT
start=$(date +%s)
/usr/bin/time -v "$BIN" train --init "$MODEL" --data addition-chat --lora-rank "$RANK" --lr "$LR" \
    --steps "$STEPS" --eval-every 0 --time-limit "$TIME_LIMIT" --threads "$THREADS" \
    --out "$OUT" --overwrite --json >"$log.json" 2>"$log" || { cat "$log" >&2; exit 1; }
wall=$(( $(date +%s) - start ))
python3 - "$log.json" "$log" "$wall" <<'PY'
import json, re, sys
v = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
wall = int(sys.argv[3])
rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(sys.argv[2]).read())
mib = lambda b: f"{b / 2**20:.1f} MiB"
print(f"LoRA steps {v['steps']}, {v['seconds'] / 60:.1f} min of training, {v['tokens_per_s']:.0f} tokens/s "
      f"({wall / 60:.1f} min wall in all, loading and both evaluations included)")
print(f"held-out exact match: {100 * v['initial_accuracy']:.1f}% -> {100 * v['accuracy']:.1f}%")
print(f"held-out loss: {v['initial_eval_loss']:.4f} -> {v['eval_loss']:.4f}")
print(f"parameters {mib(v['parameter_bytes'])}, adapters {mib(v['adapter_bytes'])}, "
      f"gradients + AdamW moments {mib(v['optimizer_bytes'])}")
if rss:
    print(f"peak memory (RSS): {int(rss.group(1)) / 2**20:.2f} GiB")
print(f"checkpoint: {v['checkpoint']}")
if v["accuracy"] < 0.9:
    print(f"FAIL: final exact match {100 * v['accuracy']:.1f}% < 90%")
    sys.exit(1)
print("PASS: ≥ 90% held-out exact match")
PY
