#!/usr/bin/env python3
"""llama.cpp's greedy continuations of the twelve agreement prompts, for
`examples/decode_agreement.rs` and `tests/llama_cpp_agreement.rs`.

For each prompt (the list below is the example's `PROMPTS`, in the same order), the
prompt is tokenized by llama.cpp (its BOS rule from the GGUF), then NEW greedy tokens
are decoded at llama.cpp's defaults (activations rounded to 8 bits for its quantized
dot products). Each step records the chosen token, the gap between the top two
logits, and the TOP largest logits with their ids, so that a reader can compare
its own logits at those ids and its own choice wherever the gap is clear.

Setup: a venv with llama-cpp-python (`pip install llama-cpp-python`, built with
`CMAKE_ARGS="-DGGML_NATIVE=ON"`). Run from the repository root:

    /tmp/lvenv/bin/python scripts/record_llama_cpp_greedy.py \\
        models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        crates/fusebox-models/tests/fixtures/llama_cpp_greedy/smollm2-q4_1.json
    /tmp/lvenv/bin/python scripts/record_llama_cpp_greedy.py \\
        models/gemma-3-270m-q4_k_m.gguf \\
        crates/fusebox-models/tests/fixtures/llama_cpp_greedy/gemma3-q4_k_m.json

Optional third and fourth arguments: NEW (default 32) and TOP (default 8).
"""

import hashlib
import json
import os
import sys

import numpy as np
from llama_cpp import Llama, __version__

PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little girl who",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three primary colors are",
    "Water boils at a temperature of",
    "The largest planet in the solar system is",
    "To make a cup of tea, first",
    "In 1969, the first humans landed on",
    "The quick brown fox",
    "Photosynthesis is the process by which",
    "A haiku about the sea:\n",
    "Q: What is 12 times 12?\nA:",
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    model_path, out = sys.argv[1], sys.argv[2]
    new = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    llm = Llama(model_path, n_ctx=256, n_threads=2, logits_all=True, verbose=False)
    prompts = []
    for text in PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=True, special=False)
        llm.reset()
        llm.eval(ids)
        steps = []
        for _ in range(new):
            logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            order = np.argsort(-logits, kind="stable")[:top]
            chosen = int(order[0])
            steps.append(
                {
                    "token": chosen,
                    "gap": float(logits[order[0]] - logits[order[1]]),
                    "top": [[int(i), float(logits[i])] for i in order],
                }
            )
            llm.eval([chosen])
        prompts.append({"text": text, "ids": [int(i) for i in ids], "steps": steps})
    record = {
        "model": os.path.basename(model_path),
        "sha256": sha256(model_path),
        "reference": f"llama-cpp-python {__version__}, 2 threads, default settings",
        "command": " ".join(["scripts/record_llama_cpp_greedy.py"] + sys.argv[1:]),
        "prompts": prompts,
    }
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, separators=(",", ":"))
        f.write("\n")
    os.replace(tmp, out)
    print(f"{out}: {len(prompts)} prompts x {new} steps (top {top})")


if __name__ == "__main__":
    main()
