#!/usr/bin/env bash
# Data-parallel throughput on gpt2-124m-shaped training, in one run: 1 rank × 1 thread,
# then 2 ranks × 1 thread under mpirun (each rank its own micro-batch of batch × seq
# tokens, gradients averaged), the tokens/s ratio, and the 2-rank step time with and
# without the gradient all-reduce (the communication the backward did not hide). Then the
# all-reduce bus bandwidth over 2 ranks (4 KiB – 256 MiB). With PYTHON set to a venv
# with torch, PyTorch's own scaling on the same model and shapes in the same run: one
# process × 1 thread, then DistributedDataParallel over 2 processes × 1 thread (gloo;
# bench/peers/torch_gpt2.py --ddp 2).
#
#   cargo build --release -p fusebox-cli --features mpi
#   [PYTHON=/path/to/venv/bin/python] bench/data_parallel.sh [BATCH] [SEQ] [STEPS]   # defaults 4 256 3
#
# Needs Open MPI (Debian: openmpi-bin libopenmpi-dev). Timings on a loaded machine are
# indicative only.
set -euo pipefail
cd "$(dirname "$0")/.."
BATCH=${1:-4}
SEQ=${2:-256}
STEPS=${3:-3}
BIN=${FUSEBOX_BIN:-target/release/fusebox}
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to core -np 2)
ARGS=(bench train --preset gpt2-124m --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --threads 1 --json)

one=$("$BIN" "${ARGS[@]}" | tail -1)
two=$("${MPIRUN[@]}" "$BIN" "${ARGS[@]}" | tail -1)
python3 - "$one" "$two" <<'PY'
import json, sys
one, two = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"1 rank  × 1 thread: {one['seconds_per_step']:.3f} s/step, {one['tokens_per_s']:.1f} tokens/s")
print(f"2 ranks × 1 thread: {two['seconds_per_step']:.3f} s/step, {two['tokens_per_s']:.1f} tokens/s "
      f"(without the all-reduce: {two['seconds_per_step_no_comm']:.3f} s/step; exposed communication "
      f"{two['seconds_per_step'] - two['seconds_per_step_no_comm']:.3f} s/step)")
print(f"speedup: {two['tokens_per_s'] / one['tokens_per_s']:.2f}× (target ≥ 1.75×, and ≥ torch DDP's own factor)")
PY
if [ -n "${PYTHON:-}" ]; then
    TORCH=(bench/peers/torch_gpt2.py --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --threads 1 --json)
    tone=$(OMP_WAIT_POLICY=PASSIVE "$PYTHON" "${TORCH[@]}" | tail -1)
    ttwo=$(OMP_WAIT_POLICY=PASSIVE "$PYTHON" "${TORCH[@]}" --ddp 2 | tail -1)
    python3 - "$tone" "$ttwo" "$one" "$two" <<'PY'
import json, sys
tone, ttwo, one, two = (json.loads(a) for a in sys.argv[1:])
print(f"torch 1 process × 1 thread: {tone['seconds_per_step']:.3f} s/step, {tone['tokens_per_s']:.1f} tokens/s")
print(f"torch DDP 2 × 1 thread: {ttwo['seconds_per_step']:.3f} s/step, {ttwo['tokens_per_s']:.1f} tokens/s")
print(f"torch DDP speedup: {ttwo['tokens_per_s'] / tone['tokens_per_s']:.2f}× · fusebox 2 ranks / torch DDP 2 ranks: "
      f"{two['tokens_per_s'] / ttwo['tokens_per_s']:.2f}× the tokens/s")
PY
fi
FUSEBOX_THREADS=1 "${MPIRUN[@]}" "$BIN" bench allreduce
