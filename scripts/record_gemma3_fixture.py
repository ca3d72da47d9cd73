#!/usr/bin/env python3
"""Records llama.cpp's greedy continuation of prompts on Gemma 3 270M Q4_K_M, with the
top-2 logit gap at every step, for crates/fusebox-models/tests/gemma3.rs.

    scripts/fetch-gemma3.sh
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install numpy llama-cpp-python
    /tmp/venv/bin/python scripts/record_gemma3_fixture.py \
        > crates/fusebox-models/tests/fixtures/gemma3_greedy.json

The prompt ids are llama.cpp's (BOS added, no special parsing); the test feeds the same
ids to fusebox and compares greedy tokens up to the first step whose gap is below 0.3.
"""
import json, sys
import numpy as np
from llama_cpp import Llama

PROMPTS = ["The capital of France is", "Once upon a time, in a small village,",
           "def fibonacci(n):", "Water boils at"]
path = sys.argv[1] if len(sys.argv) > 1 else "models/gemma-3-270m-q4_k_m.gguf"
m = Llama(model_path=path, n_ctx=256, n_threads=2, logits_all=True, verbose=False)
cases = []
for text in PROMPTS:
    m.reset()
    ids = m.tokenize(text.encode(), add_bos=True, special=False)
    m.eval(ids)
    out, gaps = [], []
    for _ in range(16):
        logits = np.array(m.scores[m.n_tokens - 1], dtype=np.float64)
        top = np.sort(logits)[::-1]
        t = int(np.argmax(logits))
        out.append(t)
        gaps.append(round(float(top[0] - top[1]), 4))
        m.eval([t])
    cases.append({"prompt": text, "ids": ids, "greedy": out, "gaps": gaps})
json.dump({"model": "gemma-3-270m-q4_k_m.gguf", "reference": "llama-cpp-python",
           "cases": cases}, sys.stdout, indent=1)
print()
