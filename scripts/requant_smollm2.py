#!/usr/bin/env python3
"""Acceptance check of fusebox's block formats on a real model: SmolLM2-135M-Instruct
requantized by llama.cpp generates, greedily, the tokens of an f32 reference of the
same weights.

For each llama.cpp file type (Q5_0, Q5_1, Q3_K_M, Q5_K_M, Q2_K, IQ4_NL, and Q2_K with
`pure` and IQ4_XS, which put Q2_K and IQ4_XS tensors in the file):

1. `llama_cpp.llama_model_quantize` (allow_requantize) turns the Q4_1 GGUF into that
   type (its mix of Q4_0/Q5_0/Q5_1/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_NL/IQ4_XS/Q8_0 tensors;
   `Q2_K+pure` with llama.cpp's `pure` flag);
2. the same call with `LLAMA_FTYPE_ALL_F32` turns that file into an F32 GGUF: every
   tensor dequantized by ggml (the reference "dequantized f32" weights);
3. `fusebox generate --json --temperature 0` runs the quantized file, and llama.cpp
   (llama-cpp-python) runs the F32 file greedily from fusebox's prompt ids, keeping the
   gap between its two largest logits at every step;
4. the tokens must agree at every step up to the first one where the reference's top-2
   gap is below 0.3 (after that a tie-break may differ legitimately).

Also printed: whether fusebox on the F32 file gives the same tokens (fusebox's f32 path
on the same dequantized weights). Exit status 1 on any disagreement.

Usage (from the repository root, after `cargo build --release -p fusebox-cli`):

    /tmp/venv-py/bin/python scripts/requant_smollm2.py \\
        [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--fusebox target/release/fusebox] \\
        [--out /tmp/fusebox-requant] [--tokens 32] [--prompt P ...]
"""

import argparse
import json
import os
import subprocess
import sys

import llama_cpp
import numpy as np

# llama.cpp file types; "+pure" quantizes every tensor it can to the type's own format
# (SmolLM2's width 576 is not a multiple of 256, so the mixes above fall back to 32-element
# formats for most tensors, and Q2_K's mix holds no Q2_K tensor at all).
TYPES = ["Q5_0", "Q5_1", "Q3_K_M", "Q5_K_M", "Q2_K", "IQ4_NL", "Q2_K+pure", "IQ4_XS"]
MIN_GAP = 0.3


def quantize(src, dst, ftype, pure=False):
    if os.path.exists(dst):
        return
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.pure = pure
    params.nthread = os.cpu_count() or 1
    tmp = dst + ".tmp"
    rc = llama_cpp.llama_model_quantize(src.encode(), tmp.encode(), params)
    if rc != 0:
        sys.exit(f"llama_model_quantize({src} → {dst}) failed: {rc}")
    os.replace(tmp, dst)


def tensor_types(path):
    from gguf import GGUFReader

    counts = {}
    for t in GGUFReader(path).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


def fusebox_generate(binary, model, prompt, tokens):
    out = subprocess.run(
        [binary, "generate", "--model", model, "--prompt", prompt, "--temperature", "0",
         "--max-tokens", str(tokens), "--json"],
        capture_output=True, text=True, timeout=600,
    )
    if out.returncode != 0:
        return None, out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
    v = json.loads(out.stdout.strip().splitlines()[-1])
    return v, None


def llama_greedy(model, prompt_ids, tokens):
    llm = llama_cpp.Llama(model_path=model, n_ctx=512, n_batch=512, verbose=False, seed=0, logits_all=True)
    llm.eval(prompt_ids)
    ids, gaps = [], []
    for _ in range(tokens):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        top = np.argsort(logits)[::-1][:2]
        ids.append(int(top[0]))
        gaps.append(float(logits[top[0]] - logits[top[1]]))
        if int(top[0]) == llm.token_eos():
            break
        llm.eval([int(top[0])])
    return ids, gaps


def compare(got, want, gaps):
    """(steps checked, first disagreement or None): steps up to the first gap < MIN_GAP."""
    for i, (w, g) in enumerate(zip(want, gaps)):
        if g < MIN_GAP:
            return i, None
        if i >= len(got):
            return i, f"fusebox stopped after {len(got)} tokens"
        if got[i] != w:
            return i, f"step {i}: fusebox {got[i]}, reference {w} (gap {g:.3f})"
    return len(want), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--fusebox", default="target/release/fusebox")
    ap.add_argument("--out", default="/tmp/fusebox-requant")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--types", nargs="+", default=TYPES, help=f"a subset of {' '.join(TYPES)}")
    ap.add_argument("--prompt", nargs="+", default=["The capital of France is", "Once upon a time, in a small village,"])
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    failed = False
    rows = []
    for name in args.types:
        ftype, pure = name.removesuffix("+pure"), name.endswith("+pure")
        qpath = os.path.join(args.out, f"smollm2-{name}.gguf")
        fpath = os.path.join(args.out, f"smollm2-{name}.f32.gguf")
        quantize(args.model, qpath, getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}"), pure)
        quantize(qpath, fpath, llama_cpp.LLAMA_FTYPE_ALL_F32)
        types = ", ".join(f"{k}×{v}" for k, v in sorted(tensor_types(qpath).items()))
        for p, prompt in enumerate(args.prompt):
            got, err = fusebox_generate(args.fusebox, qpath, prompt, args.tokens)
            if err:
                failed = True
                rows.append((name, types if p == 0 else "″", str(p + 1), "-", "-", f"fusebox failed: {err}"))
                continue
            want, gaps = llama_greedy(fpath, got["prompt_ids"], args.tokens)
            checked, bad = compare(got["generated_ids"], want, gaps)
            f32_run, f32_err = fusebox_generate(args.fusebox, fpath, prompt, args.tokens)
            same = "error" if f32_err else ("same" if f32_run["generated_ids"] == got["generated_ids"] else "differs")
            failed |= bad is not None
            rows.append((name, types if p == 0 else "″", str(p + 1), f"{checked}/{len(want)}", same, bad or "agree"))
    for p, prompt in enumerate(args.prompt):
        print(f"prompt {p + 1}: {prompt!r}")
    print(f"{args.tokens} greedy tokens at most; reference: llama.cpp on the F32 dequantization of the same file")
    print("| file type | tensor types | prompt | steps checked (gap ≥ 0.3) | fusebox on the F32 file | result |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
