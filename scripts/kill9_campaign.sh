#!/usr/bin/env bash
# kill -9 campaign for checkpoint saves: starts short training runs that save often,
# SIGKILLs each at a chosen moment, then checks that `fusebox train --resume` continues
# from `latest` every time (and that `latest` names a complete step directory).
#
# The moments: plain delays (anywhere in training or a save), and phases of a save made
# observable by polling for what it creates: `step-N.tmp/` (writing), the weights in it,
# `step-N.old/` (an earlier copy moved aside, in a run rewound to an earlier checkpoint),
# `latest.tmp` (about to be switched), each also at the last step, where the final save
# and a --save-every save coincide.
#
# Usage: scripts/kill9_campaign.sh [path/to/fusebox]   (default: target/debug/fusebox)
# Env:   ROUNDS (repetitions of the list of moments, default 2), KEEP=1 keeps the scratch.
# Exit status: 0 when every kill left a resumable run.
set -u
BIN=${1:-target/debug/fusebox}
BIN=$(realpath "$BIN")
ROUNDS=${ROUNDS:-2}
W=$(mktemp -d "${TMPDIR:-/tmp}/fusebox-kill9.XXXXXX")
trap '[ "${KEEP:-0}" = 1 ] || rm -rf "$W"' EXIT
# Big enough that a save takes a few milliseconds (about 3M parameters, 50 MB with the moments).
MODEL="--preset small-llama --batch 2 --threads 1 --eval-every 0"
STEPS=6

kills=0 resumed=0 failed=0 finished_first=0 nothing_saved=0
# Waits (up to 60 s) until the path exists; fails when the run ended first.
wait_for() {
  local path=$1 pid=$2
  local deadline=$((SECONDS + 60))
  while [ ! -e "$path" ]; do
    kill -0 "$pid" 2>/dev/null || return 1
    [ $SECONDS -lt $deadline ] || return 1
  done
}

one() {
  local name=$1 target=$2 extra=$3
  local out="$W/$name"
  rm -rf "$out"
  "$BIN" train $MODEL --steps $STEPS --out "$out" $extra >"$out.log" 2>&1 &
  local pid=$!
  case $target in
    # A delay after the first checkpoint: anywhere in later training steps or saves.
    after-first:*) wait_for "$out/latest" $pid && sleep "${target#after-first:}" ;;
    delay:*) sleep "${target#delay:}" ;;
    *) wait_for "$out/$target" $pid || true ;;
  esac
  local how
  if kill -9 $pid 2>/dev/null; then
    kills=$((kills + 1))
    how="killed at $target"
  else
    finished_first=$((finished_first + 1))
    how="finished before the kill at $target"
  fi
  wait $pid 2>/dev/null
  # Nothing to resume only when no save ever wrote its last file (trainer.json).
  if ! ls "$out"/step-*/trainer.json >/dev/null 2>&1; then
    nothing_saved=$((nothing_saved + 1))
    echo "  $name: $how, before the first save completed; nothing to resume"
    return
  fi
  if "$BIN" train --threads 1 --resume "$out" --steps $((STEPS + 2)) --json >"$out.resume" 2>"$out.resume.err" &&
     grep -q "\"steps\":$((STEPS + 2))" "$out.resume" && [ -f "$out/step-$((STEPS + 2))/model.safetensors" ]; then
    resumed=$((resumed + 1))
    local notes
    notes=$(grep -c '^note:' "$out.resume.err")
    echo "  $name: $how; resumed to step $((STEPS + 2)) ($notes recovery notes)"
  else
    failed=$((failed + 1))
    echo "  FAILED $name: $how; resume did not complete:"
    sed 's/^/      /' "$out.resume.err" | tail -n 5
    ls -la "$out" | sed 's/^/      /'
  fi
}

# A run rewound to an earlier checkpoint saves steps that already exist: the earlier copy
# is moved aside to step-N.old while the new one takes its place.
rewind() {
  local name=$1 target=$2
  local out="$W/$name"
  rm -rf "$out"
  "$BIN" train $MODEL --steps $STEPS --save-every 1 --out "$out" >"$out.log" 2>&1 || { failed=$((failed + 1)); return; }
  "$BIN" train --threads 1 --resume "$out/step-2" --save-every 1 >"$out.log2" 2>&1 &
  local pid=$!
  wait_for "$out/$target" $pid || true
  local how
  if kill -9 $pid 2>/dev/null; then
    kills=$((kills + 1))
    how="killed at $target of a rewound run"
  else
    finished_first=$((finished_first + 1))
    how="finished before the kill at $target of a rewound run"
  fi
  wait $pid 2>/dev/null
  if "$BIN" train --threads 1 --resume "$out" --steps $((STEPS + 2)) --json >"$out.resume" 2>"$out.resume.err" &&
     grep -q "\"steps\":$((STEPS + 2))" "$out.resume"; then
    resumed=$((resumed + 1))
    echo "  $name: $how; resumed to step $((STEPS + 2)) ($(grep -c '^note:' "$out.resume.err") recovery notes)"
  else
    failed=$((failed + 1))
    echo "  FAILED $name: $how; resume did not complete:"
    sed 's/^/      /' "$out.resume.err" | tail -n 5
  fi
}

for r in $(seq 1 "$ROUNDS"); do
  echo "round $r"
  # Phases of a save at the last step (the final save coincides with --save-every).
  one "r$r-last-tmp" "step-$STEPS.tmp" "--save-every 3"
  one "r$r-last-weights" "step-$STEPS.tmp/model.safetensors" "--save-every 3"
  one "r$r-last-optimizer" "step-$STEPS.tmp/optimizer.safetensors" "--save-every 3"
  one "r$r-last-trainer" "step-$STEPS.tmp/trainer.json" "--save-every 3"
  one "r$r-last-renamed" "step-$STEPS" "--save-every 3"
  one "r$r-last-latest" "latest.tmp" "--save-every $STEPS"
  one "r$r-last-metrics" "loss.tmp.png" "--save-every 3"
  # Phases of a save mid-run.
  one "r$r-mid-tmp" "step-2.tmp" "--save-every 1"
  one "r$r-mid-weights" "step-3.tmp/model.safetensors" "--save-every 1"
  one "r$r-mid-trainer" "step-4.tmp/config.json" "--save-every 1"
  one "r$r-mid-renamed" "step-2" "--save-every 1"
  # Plain delays after the first checkpoint: anywhere in training or in a save.
  for d in 0.01 0.05 0.1 0.2 0.4; do
    one "r$r-after-first-$d" "after-first:$d" "--save-every 1"
  done
  # An earlier copy of the same step moved aside, in a run rewound to step 2.
  rewind "r$r-rewind-old" "step-3.old"
  rewind "r$r-rewind-tmp" "step-4.tmp/model.safetensors"
  # Before any checkpoint: nothing to resume.
  one "r$r-early" "delay:0.05" "--save-every 1"
done
echo "runs: $((kills + finished_first)) · kill -9s: $kills · resumed from latest: $resumed · failed: $failed"
echo "killed before the first save completed (nothing to resume): $nothing_saved · finished before the kill: $finished_first"
[ "$failed" = 0 ]
