#!/usr/bin/env bash
# Prefill and decode tokens/s of fusebox (8-bit activations, the default, and --exact's f32)
# against llama.cpp (bench/peers/llama_cpp.py, llama-cpp-python) on the same GGUF files,
# same threads, same run; prints the ratios to llama.cpp. Short context: a 16-token
# prompt; long: a 1,500-token prompt (decode then reads a 1.5k KV cache). Prefill is
# taken from a 512-token prompt.
#
#   bench/decode_vs_llama_cpp.sh [THREADS] [MODEL.gguf ...]
#
# Env: FUSEBOX (default target/release/fusebox), PYTHON (default /tmp/venv-py/bin/python
# or python3), NEW_TOKENS (default 64), REPEATS (default 3). fusebox's own settings pass
# through (FUSEBOX_ISA=avx2 caps its kernels at AVX2 + FMA; the header names it); match
# llama.cpp with a build of the same ISA (PYTHON of a venv holding that build).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
shift || true
models=("$@")
if [ ${#models[@]} -eq 0 ]; then
    models=(models/SmolLM2-135M-Instruct.Q4_1.gguf models/gemma-3-270m-q4_k_m.gguf)
fi
F=${FUSEBOX:-target/release/fusebox}
PY=${PYTHON:-$( [ -x /tmp/venv-py/bin/python ] && echo /tmp/venv-py/bin/python || echo python3 )}
new=${NEW_TOKENS:-64}
reps=${REPEATS:-3}
[ -x "$F" ] || { echo "no fusebox binary at $F (cargo build --release -p fusebox-cli)" >&2; exit 1; }

field() { "$PY" -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])' "$1"; }

for model in "${models[@]}"; do
    [ -f "$model" ] || { echo "skipping $model: not found"; continue; }
    echo "== $model, $threads threads, $new new tokens, median of $reps${FUSEBOX_ISA:+, fusebox at FUSEBOX_ISA=$FUSEBOX_ISA}"
    # The three runs of a prompt length go in a rotated order (int8, f32, llama.cpp;
    # then f32, llama.cpp, int8; …) so none is always the first after another program.
    turn=0
    for prompt in 16 1500 512; do
        fb=(bench generate --model "$model" --threads "$threads" --prompt-tokens $prompt --new-tokens "$new" --repeats "$reps" --bandwidth-contexts= --json)
        for who in $(echo "int exact peer int exact" | cut -d' ' -f$((turn + 1))-$((turn + 3))); do
            case $who in
                int) int=$("$F" "${fb[@]}") ;;
                exact) exact=$("$F" --exact "${fb[@]}") ;;
                peer) peer=$("$PY" bench/peers/llama_cpp.py --model "$model" --threads "$threads" --prompt-tokens $prompt --new-tokens "$new" --repeats "$reps" --json) ;;
            esac
        done
        turn=$(((turn + 1) % 3))
        if [ $prompt = 512 ]; then key=prefill_tokens_per_s; what="prefill 512"; else key=decode_tokens_per_s; what="decode after $prompt"; fi
        i=$(echo "$int" | field $key); e=$(echo "$exact" | field $key); p=$(echo "$peer" | field $key)
        "$PY" -c "i,e,p=$i,$e,$p; print(f'  {\"$what\":<18} fusebox {i:8.1f} tok/s ({i/p:.2f}x llama.cpp)   --exact {e:8.1f} ({e/p:.2f}x)   llama.cpp {p:8.1f}')"
    done
done
