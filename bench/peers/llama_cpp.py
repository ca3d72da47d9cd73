#!/usr/bin/env python3
"""llama.cpp (through llama-cpp-python) on the same work as `fusebox bench generate`:
one prefill pass of --prompt-tokens tokens (the same text repeated, as fusebox's
bench_prompt does), then --new-tokens greedy decode steps (EOS ignored); the median of
--repeats runs after a warm-up, in tokens per second.

    pip install llama-cpp-python      # compiles llama.cpp for this machine (~20 min on 2 cores)
    python3 bench/peers/llama_cpp.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf --threads 2 [--json]
        [--no-extra-bufts]   # where a native build dies with SIGILL (AMX advertised, not enabled)
"""

import argparse
import json
import os
import statistics
import sys
import time

# This file is named like the package: keep its own directory off the import path.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import numpy as np  # noqa: E402
import llama_cpp  # noqa: E402
from llama_cpp import Llama  # noqa: E402


def disable_extra_buffer_types():
    """Loads weights without ggml's extra CPU buffer types (AMX, repacked layouts): a
    native build on a CPU that advertises AMX dies with SIGILL where the VM does not
    enable it."""
    default = llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    llama_cpp.llama_model_default_params = params
    llama_cpp.llama.llama_cpp.llama_model_default_params = params

# Keep identical to crates/fusebox-cli/src/bench_generate.rs (bench_prompt).
TEXT = (
    "The history of the city begins with a small settlement on the river bank. "
    "Over the centuries, traders, farmers and craftsmen built houses, markets and bridges, "
    "and the town grew into a busy centre of commerce and learning. "
)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-extra-bufts", action="store_true",
                    help="no AMX/repacked weight buffers (needed where AMX is advertised but unusable)")
    a = ap.parse_args()
    if a.no_extra_bufts:
        disable_extra_buffer_types()

    n_ctx = a.prompt_tokens + a.new_tokens + 1
    llm = Llama(
        model_path=a.model,
        n_ctx=n_ctx,
        n_batch=max(a.prompt_tokens, 32),
        n_ubatch=max(a.prompt_tokens, 32),
        n_threads=a.threads,
        n_threads_batch=a.threads,
        logits_all=False,
        verbose=False,
    )
    unit = llm.tokenize(TEXT.encode(), add_bos=False, special=False)
    prompt = [unit[i % len(unit)] for i in range(a.prompt_tokens)]

    n_vocab = llm.n_vocab()

    def last_argmax():
        # The last evaluated position's logits, read in place (eval keeps no copy unless logits_all).
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
        return int(np.argmax(logits))

    # Warm-up.
    llm.reset()
    llm.eval(prompt[:32])
    for _ in range(4):
        llm.eval([last_argmax()])

    prefill, decode = [], []
    # Every decode step's seconds: on a busy machine the fastest tenth shows what a quiet
    # one would (fusebox bench generate reports the same figure).
    steps = []
    for _ in range(max(a.repeats, 1)):
        llm.reset()
        llm._ctx.kv_cache_clear()
        t = time.perf_counter()
        llm.eval(prompt)
        prefill.append(a.prompt_tokens / (time.perf_counter() - t))
        t = time.perf_counter()
        for _ in range(a.new_tokens):
            s = time.perf_counter()
            llm.eval([last_argmax()])
            steps.append(time.perf_counter() - s)
        if a.new_tokens:
            decode.append(a.new_tokens / (time.perf_counter() - t))

    pp = statistics.median(prefill)
    tg = statistics.median(decode) if decode else 0.0
    fastest = sorted(steps)[:max(1, (len(steps) + 9) // 10)] if steps else []
    tg_fast = len(fastest) / sum(fastest) if fastest else 0.0
    if a.json:
        print(json.dumps({"name": "generate", "peer": "llama.cpp", "model": a.model, "threads": a.threads,
                          "extra_buffer_types": not a.no_extra_bufts,
                          "prompt_tokens": a.prompt_tokens, "new_tokens": a.new_tokens, "repeats": a.repeats,
                          "prefill_tokens_per_s": pp, "decode_tokens_per_s": tg,
                          "decode_fastest_tenth_tokens_per_s": tg_fast}))
    else:
        print(f"llama.cpp ({a.threads} threads): prompt processing {a.prompt_tokens} tokens: {pp:.1f} tok/s · "
              f"decode {a.new_tokens} tokens: {tg:.1f} tok/s (median of {a.repeats})")


if __name__ == "__main__":
    main()
