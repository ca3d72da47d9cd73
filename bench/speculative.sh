#!/usr/bin/env bash
# Single-stream decode speed with and without speculative decoding on an input-copying
# task (rename a function in a piece of code and print the code again), greedy, with the
# acceptance rate. Usage:
#
#   bench/speculative.sh [MODEL] [RUNS] [extra fusebox generate flags...]
#
# MODEL defaults to models/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch-smollm2.sh);
# RUNS (default 3) repeats each configuration. FUSEBOX (default target/release/fusebox)
# is the binary. Every run prints one line: its configuration, decode tokens/s, tokens
# generated, drafted and accepted; the generated ids of every drafted run are checked
# equal to the plain run's (the greedy contract).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
RUNS=${2:-3}
shift $(( $# > 2 ? 2 : $# )) || true
FUSEBOX=${FUSEBOX:-target/release/fusebox}
PROMPT='Rename the function `area` to `rectangle_area` everywhere in this Python code. Reply with the whole code.

```python
def area(width, height):
    """Return the area of a width × height rectangle."""
    if width < 0 or height < 0:
        raise ValueError("sides must not be negative")
    return width * height


def total_area(rectangles):
    """The summed area of (width, height) pairs."""
    total = 0
    for width, height in rectangles:
        total += area(width, height)
    return total


def largest(rectangles):
    """The (width, height) pair of largest area."""
    return max(rectangles, key=lambda r: area(r[0], r[1]))


if __name__ == "__main__":
    shapes = [(2, 3), (4, 5), (1, 10)]
    print(total_area(shapes), largest(shapes))
```'
run() {
  "$FUSEBOX" generate --model "$MODEL" --chat --prompt "$PROMPT" --temperature 0 --max-tokens 256 --json "$@"
}
plain_ids=""
for r in $(seq 1 "$RUNS"); do
  for cfg in "plain" "--draft-ngram 3" "--draft-ngram 3 --draft-max 15"; do
    if [ "$cfg" = plain ]; then out=$(run "${@}"); else out=$(run $cfg "${@}"); fi
    python3 - "$cfg" "$out" "$plain_ids" <<'PY'
import json, sys
cfg, out, plain = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
d = out.get("draft") or {}
ids = json.dumps(out["generated_ids"])
if cfg != "plain" and plain and ids != plain:
    sys.exit(f"{cfg}: generated ids differ from the plain run's")
print(f"{cfg:32} decode {out['decode_tokens_per_s']:7.1f} tok/s  {out['generated_tokens']:4} tokens  "
      f"drafted {d.get('drafted_tokens', 0):4}  accepted {d.get('accepted_tokens', 0):4} "
      f"({100 * d.get('acceptance_rate', 0):.0f}%)")
PY
    if [ "$cfg" = plain ]; then plain_ids=$(echo "$out" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["generated_ids"]))'); fi
  done
done
