#!/usr/bin/env bash
# Mutation campaign for the `fusebox` command line: well over 100 bad invocations (bad
# numbers, huge sizes, missing and corrupt files, conflicting flags), each run under a
# timeout. Every one must end with a clear error (exit 1, or 2 for a usage error) or a
# success; the campaign counts panics (exit 101 or "panicked"), deaths by signal
# (exit > 128: aborts, SIGSEGV, the OOM killer) and hangs (the timeout fired).
#
# Usage: scripts/cli_mutation_campaign.sh [path/to/fusebox]   (default: target/debug/fusebox)
# Env:   TIMEOUT (seconds per invocation, default 60), KEEP=1 keeps the scratch directory.
# Exit status: 0 when there were no panics, signals or hangs.
set -u
BIN=${1:-target/debug/fusebox}
BIN=$(realpath "$BIN")
TIMEOUT=${TIMEOUT:-60}
W=$(mktemp -d "${TMPDIR:-/tmp}/fusebox-mutation.XXXXXX")
cd "$W" || exit 2
trap '[ "${KEEP:-0}" = 1 ] || rm -rf "$W"' EXIT

# Fixtures: a finished tiny run, corrupt copies of it, bad data files, bad model files.
TINY="--layers 1 --d-model 32 --heads 2 --batch 4 --threads 1 --eval-every 0"
"$BIN" train $TINY --steps 2 --out ck >/dev/null 2>&1 || { echo "could not create the fixture run"; exit 2; }
cp -r ck ck_trunc; head -c 100 ck/step-2/model.safetensors > ck_trunc/step-2/model.safetensors
cp -r ck ck_badjson; echo '{"step": ' > ck_badjson/step-2/trainer.json
cp -r ck ck_badcfg; echo '{"style": "gpt2", "vocab_size": 0}' > ck_badcfg/step-2/config.json
cp -r ck ck_nomom; rm ck_nomom/step-2/optimizer.safetensors
cp -r ck ck_escape; echo '../../../../etc' > ck_escape/latest
cp -r ck ck_nolatest_target; echo 'step-99' > ck_nolatest_target/latest
cp -r ck ck_huge_cfg; sed -i 's/"n_layers": 1/"n_layers": 1000000000000/' ck_huge_cfg/step-2/config.json
cp -r ck ck_neg_step; sed -i 's/"step": 2/"step": -5/' ck_neg_step/step-2/trainer.json
mkdir emptydir
printf '' > empty.txt
head -c 4096 /dev/urandom > binary.bin
printf 'short' > short.txt
python3 -c "print('hello world ' * 500)" > text.txt 2>/dev/null || yes 'hello world' | head -c 6000 > text.txt
echo 'not a gguf' > garbage.gguf
printf 'GGUF\x03\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff' > hugecount.gguf
printf 'GGUF' > magic_only.gguf
mkdir hfdir; echo '{"model_type": "llama"}' > hfdir/config.json
mkdir hfbad; echo '{"model_type": "llama", "num_hidden_layers": -1}' > hfbad/config.json
echo 'x' > afile

cases=(
  # train: learning rate, clipping, decay, time limit
  "train $TINY --steps 1 --out o --lr -1"
  "train $TINY --steps 1 --out o --lr nan"
  "train $TINY --steps 1 --out o --lr inf"
  "train $TINY --steps 1 --out o --lr -inf"
  "train $TINY --steps 1 --out o --lr 0"
  "train $TINY --steps 1 --out o --lr 1e40"
  "train $TINY --steps 1 --out o --lr abc"
  "train $TINY --steps 1 --out o --lr"
  "train $TINY --steps 1 --out o --clip nan"
  "train $TINY --steps 1 --out o --clip -1"
  "train $TINY --steps 1 --out o --clip inf"
  "train $TINY --steps 1 --out o --weight-decay -1"
  "train $TINY --steps 1 --out o --weight-decay nan"
  "train $TINY --steps 1 --out o --time-limit nan"
  "train $TINY --steps 1 --out o --time-limit -1"
  "train $TINY --steps 1 --out o --time-limit inf"
  # train: sizes
  "train --threads 1 --steps 1 --out o --batch 0"
  "train --threads 1 --steps 1 --out o --batch -1"
  "train --threads 1 --steps 1 --out o --batch 1000000000"
  "train --threads 1 --steps 1 --out o --batch 18446744073709551615"
  "train --threads 1 --steps 1 --out o --batch 18446744073709551616"
  "train $TINY --steps 1 --out o --accumulation 0"
  "train $TINY --steps 1 --out o --seq 0"
  "train $TINY --steps 1 --out o --seq 1 --data text.txt"
  "train --threads 1 --steps 1 --out o --seq 1000000000 --data text.txt"
  "train --threads 1 --steps 1 --out o --seq 18446744073709551615 --data text.txt"
  "train --threads 1 --steps 1 --out o --layers 0"
  "train --threads 1 --steps 1 --out o --layers 1000000000"
  "train --threads 1 --steps 1 --out o --layers 18446744073709551615"
  "train --threads 1 --steps 1 --out o --d-model 0"
  "train --threads 1 --steps 1 --out o --d-model 100000 --heads 1"
  "train --threads 1 --steps 1 --out o --d-model 18446744073709551615 --heads 1"
  "train --threads 1 --steps 1 --out o --d-model 4294967296 --heads 1"
  "train --threads 1 --steps 1 --out o --heads 0"
  "train --threads 1 --steps 1 --out o --heads 3"
  "train --threads 1 --steps 1 --out o --heads 1000000"
  "train --threads 1 --steps 1 --out o --kv-heads 0"
  "train --threads 1 --steps 1 --out o --kv-heads 3 --preset tiny-llama"
  "train --threads 1 --steps 1 --out o --kv-heads 2"
  "train --threads 1 --steps 1 --out o --preset x"
  "train --threads 1 --steps 1 --out o --preset ''"
  "train --threads 1 --steps 1 --out o --preset gpt2-124m --batch 100000"
  "train $TINY --steps -1 --out o"
  "train $TINY --steps abc --out o"
  "train $TINY --steps 1 --out o --warmup -1"
  "train $TINY --steps 1 --out o --eval-every -1"
  "train $TINY --steps 1 --out o --save-every -1"
  "train $TINY --steps 1 --out o --seed -1"
  "train --threads 0 --steps 1 --out o"
  "train --threads 100000000 --steps 1 --out o"
  "train --steps 1 --out o --backend nosuch"
  "train --steps 1 --out o --backend cpu:0"
  "train --steps 1 --out o --backend cpu:abc"
  "train --steps 1 --out o --backend cpu:-1"
  "train --steps 1 --out o --backend ''"
  # train: files
  "train $TINY --steps 1 --out o --data /nonexistent/file.txt"
  "train $TINY --steps 1 --out o --data empty.txt"
  "train $TINY --steps 1 --out o --data binary.bin"
  "train $TINY --steps 1 --out o --data emptydir"
  "train $TINY --steps 1 --out o --data short.txt"
  "train $TINY --steps 1 --out /proc/fusebox-not-writable"
  "train $TINY --steps 1 --out afile"
  "train $TINY --steps 1 --out ck"
  "train $TINY --steps 1 --out emptydir/../ck"
  # train --resume
  "train --threads 1 --resume nosuch"
  "train --threads 1 --resume emptydir"
  "train --threads 1 --resume afile"
  "train --threads 1 --resume ck --batch 0"
  "train --threads 1 --resume ck --accumulation 0"
  "train --threads 1 --resume ck --lr -1"
  "train --threads 1 --resume ck --clip nan"
  "train --threads 1 --resume ck --time-limit -1"
  "train --threads 1 --resume ck --layers 2"
  "train --threads 1 --resume ck --preset tiny-llama"
  "train --threads 1 --resume ck --d-model 64"
  "train --threads 1 --resume ck --data text.txt --steps 5"
  "train --threads 1 --resume ck --batch 1000000000 --steps 5"
  "train --threads 1 --resume ck --out ck_trunc --steps 5"
  "train --threads 1 --resume ck_trunc --steps 5"
  "train --threads 1 --resume ck_badjson --steps 5"
  "train --threads 1 --resume ck_badcfg --steps 5"
  "train --threads 1 --resume ck_nomom --steps 5"
  "train --threads 1 --resume ck_escape --steps 5"
  "train --threads 1 --resume ck_nolatest_target/step-99 --steps 5"
  "train --threads 1 --resume ck_huge_cfg --steps 5"
  "train --threads 1 --resume ck_neg_step --steps 5"
  "train --threads 1 --resume ck/step-2/model.safetensors"
  # generate
  "generate --model nosuch"
  "generate --model emptydir"
  "generate --model afile"
  "generate --model garbage.gguf"
  "generate --model hugecount.gguf"
  "generate --model magic_only.gguf"
  "generate --model hfdir"
  "generate --model hfbad"
  "generate --model garbage.gguf --ctx-size 4294967295"
  "generate --model ck --temperature -1"
  "generate --model ck --temperature nan"
  "generate --model ck --temperature inf"
  "generate --model ck --top-p 0"
  "generate --model ck --top-p 2"
  "generate --model ck --top-p nan"
  "generate --model ck --top-k -1"
  "generate --model ck --repetition-penalty 0"
  "generate --model ck --repetition-penalty -1"
  "generate --model ck --repetition-penalty nan"
  "generate --model ck --ctx-size 0"
  "generate --model ck --ctx-size -1"
  "generate --model ck --threads 0"
  "generate --model ck --backend nosuch"
  "generate --model ck --prompt hello"
  "generate --model ck --prompt $(printf '1%.0s' $(seq 1 300))"
  "generate --model ck --max-tokens -1"
  "generate --model ck_trunc"
  "generate --model ck_badcfg"
  "generate --model ck_escape"
  "generate --model ck_huge_cfg"
  "generate"
  # demo
  "demo --seq 0"
  "demo --seq -1"
  "demo --heads 0"
  "demo --kv-heads 0"
  "demo --head-dim 0"
  "demo --heads 3 --kv-heads 2"
  "demo --heads 2 --kv-heads 16"
  "demo --seq 100000000000"
  "demo --head-dim 18446744073709551615"
  "demo --seq 18446744073709551615 --heads 18446744073709551615"
  "demo --backend nosuch"
  # bench
  "bench matmul --m 0"
  "bench matmul --n 0"
  "bench matmul --k 0"
  "bench matmul --m 18446744073709551615"
  "bench matmul --m 1000000 --n 1000000 --k 1000000"
  "bench matmul --threads 0"
  "bench attention --seq 0"
  "bench attention --heads 0"
  "bench attention --head-dim 0"
  "bench attention --batch 0"
  "bench attention --heads 8 --kv-heads 3"
  "bench attention --kv-heads 0"
  "bench attention --seq 100000000000"
  "bench attention --pass decode --q-len 0"
  "bench attention --pass nosuch"
  "bench attention --threads 0"
  "bench ops --rows 0"
  "bench ops --rows 18446744073709551615"
  "bench ops --threads 0"
  "bench train --batch 0 --preset tiny-llama"
  "bench train --seq 0 --preset tiny-llama"
  "bench train --preset nosuch"
  "bench train --preset tiny-llama --batch 1000000000"
  "bench train --preset tiny-llama --seq 1000000000"
  "bench train --threads 0 --preset tiny-llama"
  "bench generate --model nosuch.gguf"
  "bench generate --model garbage.gguf"
  "bench generate --model garbage.gguf --prompt-tokens 0"
  "bench generate --model hfdir"
  "bench nosuch"
  "info --bogus"
  "nosuch"
)

total=0 ok=0 errors=0 usage=0 panics=0 signals=0 hangs=0
for c in "${cases[@]}"; do
  total=$((total + 1))
  rm -rf o
  # timeout exits 124 when the time ran out (SIGTERM, then SIGKILL 10 s later).
  eval "timeout -k 10 $TIMEOUT \"\$BIN\" $c" >out.txt 2>err.txt </dev/null
  rc=$?
  kind=""
  if grep -q "panicked" err.txt; then kind=PANIC; panics=$((panics + 1))
  elif [ "$rc" = 124 ]; then kind=HANG; hangs=$((hangs + 1))
  elif [ "$rc" = 101 ]; then kind=PANIC; panics=$((panics + 1))
  elif [ "$rc" -gt 128 ]; then kind="SIGNAL($((rc - 128)))"; signals=$((signals + 1))
  elif [ "$rc" = 0 ]; then ok=$((ok + 1))
  elif [ "$rc" = 1 ]; then errors=$((errors + 1))
  elif [ "$rc" = 2 ]; then usage=$((usage + 1))
  else kind="EXIT($rc)"; signals=$((signals + 1))
  fi
  if [ -n "$kind" ]; then
    echo "$kind: fusebox $c"; tail -n 3 err.txt | sed 's/^/    /'
  elif [ "${VERBOSE:-0}" = 1 ]; then
    echo "exit $rc: fusebox $c"; { tail -n 1 err.txt; tail -n 1 out.txt; } | cut -c1-200 | sed 's/^/    /'
  fi
done
echo "invocations: $total · succeeded: $ok · clear errors: $errors · usage errors: $usage · panics: $panics · signals: $signals · hangs: $hangs"
[ $((panics + signals + hangs)) = 0 ]
