#!/usr/bin/env bash
# Peak memory of LoRA on the quantized SmolLM2 base against full fine-tuning of the same
# model (the acceptance figure: LoRA ≤ 40% of full fine-tuning). Runs each for STEPS
# steps of 8 addition-chat conversations under /usr/bin/time -v (peak RSS) and prints
# both, their ratio, and the run's own VmHWM; exits non-zero above 40%.
#
# Usage, from the repository root:
#     cargo build --release -p fusebox-cli
#     bench/lora_memory.sh                 # STEPS=3 THREADS=2
set -euo pipefail
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
BIN=${FUSEBOX:-target/release/fusebox}
STEPS=${STEPS:-3}
THREADS=${THREADS:-2}
[ -f "$MODEL" ] || scripts/fetch-smollm2.sh
[ -x "$BIN" ] || { echo "no $BIN: run cargo build --release -p fusebox-cli" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
measure() { # name, extra flags…
    local name=$1; shift
    /usr/bin/time -v "$BIN" train --init "$MODEL" --data addition-chat --steps "$STEPS" --eval-every 0 \
        --threads "$THREADS" --out "$dir/$name" --json "$@" >"$dir/$name.json" 2>"$dir/$name.time" \
        || { cat "$dir/$name.time" >&2; exit 1; }
}
measure full
measure lora --lora-rank 16
python3 - "$dir" <<'PY'
import json, re, sys, os
d = sys.argv[1]
def peak(name):
    kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(os.path.join(d, name + ".time")).read()).group(1))
    v = json.loads(open(os.path.join(d, name + ".json")).read().strip().splitlines()[-1])
    return kib * 1024, v
(full, vf), (lora, vl) = peak("full"), peak("lora")
gib = lambda b: f"{b / 2**30:.2f} GiB"
print(f"full fine-tuning: peak RSS {gib(full)} (VmHWM {gib(vf['peak_rss_bytes'])}; parameters {gib(vf['parameter_bytes'])}, "
      f"gradients + moments {gib(vf['optimizer_bytes'])})")
print(f"LoRA r=16, Q4_1 base: peak RSS {gib(lora)} (VmHWM {gib(vl['peak_rss_bytes'])}; parameters {gib(vl['parameter_bytes'])}, "
      f"adapters {vl['adapter_bytes'] / 2**20:.1f} MiB, gradients + moments {vl['optimizer_bytes'] / 2**20:.1f} MiB)")
ratio = lora / full
print(f"LoRA / full peak memory: {100 * ratio:.1f}% (acceptance: <= 40%)")
sys.exit(0 if ratio <= 0.40 else 1)
PY
