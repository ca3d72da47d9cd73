#!/usr/bin/env python3
"""The mixture-of-experts architectures as llama.cpp's own converter writes them, run by
llama.cpp and by fusebox on the same GGUF: greedy continuations must be equal.

For each of qwen3_moe, mixtral, olmoe, qwen2_moe and gpt_oss a small model (2 layers, d_model 64,
8 experts, top-2; random weights from `transformers` with a large init so logits have
clear winners; SmolLM2's tokenizer, which the converter recognises) is saved, converted
by `convert_hf_to_gguf.py --outtype f32` and, for each of 4 prompts, continued for 16
tokens at temperature 0 by llama-cpp-python (`generate`, top-k 1) and by
`fusebox generate --temperature 0 --json`, token ids compared (prompt and continuation).
gpt_oss is also quantized by llama.cpp (`llama_model_quantize`, MXFP4_MOE: experts in
MXFP4, the rest Q8_0) and compared the same way with `fusebox generate --int8`, which
rounds activations to 8 bits as llama.cpp does for these weights (this random model's
top-2 logit gaps are small enough, e.g. 0.07, that f32 activations choose otherwise). Prints both where they differ; exits
non-zero if any does.

Usage, from the repository root (scripts/fetch-smollm2.sh and a release build first; a
venv with torch, transformers and llama-cpp-python; LLAMA_CPP_SRC the unpacked
llama-cpp-python source distribution):
    LLAMA_CPP_SRC=/tmp/lcp-src/llama_cpp_python-0.3.36 /tmp/venv/bin/python \\
        scripts/moe_gguf_vs_llama_cpp.py
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers
import llama_cpp
from llama_cpp import Llama

SRC = os.environ.get("LLAMA_CPP_SRC", "/tmp/lcp-src/llama_cpp_python-0.3.36")
LLAMA_CPP = os.path.join(SRC, "vendor", "llama.cpp")
FUSEBOX = os.environ.get("FUSEBOX", "target/release/fusebox")
SMOLLM2 = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,"]
NEW = 16
# llama.cpp quantizations checked beside f32: (name, llama_ftype).
QUANTIZED = {"gpt_oss": [("mxfp4_moe", llama_cpp.LLAMA_FTYPE_MOSTLY_MXFP4_MOE)]}

COMMON = dict(
    vocab_size=49152,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    max_position_embeddings=256,
    initializer_range=0.3,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)
CONFIGS = {
    "qwen3_moe": transformers.Qwen3MoeConfig(
        **COMMON, head_dim=16, moe_intermediate_size=48, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True
    ),
    "mixtral": transformers.MixtralConfig(**COMMON, num_local_experts=8, num_experts_per_tok=2),
    # llama.cpp's olmoe sizes the k norm by d_model: no grouped-query attention (nor has
    # OLMoE-1B-7B any).
    "olmoe": transformers.OlmoeConfig(
        **{**COMMON, "num_key_value_heads": 4}, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False
    ),
    "qwen2_moe": transformers.Qwen2MoeConfig(
        **COMMON,
        moe_intermediate_size=48,
        shared_expert_intermediate_size=80,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        use_sliding_window=False,
    ),
    # Sinks, biases, the clamped SwiGLU, YaRN (gpt-oss's default: 32× a 4,096 context) and
    # a window of 8 on every other layer, shorter than prompt + continuation.
    "gpt_oss": transformers.GptOssConfig(**COMMON, head_dim=16, num_local_experts=8, num_experts_per_tok=2, sliding_window=8),
}


def tokenizer_dir(tmp):
    out = os.path.join(tmp, "tokenizer")
    subprocess.run([FUSEBOX, "export", "--model", SMOLLM2, "--format", "hf", "--out", out], check=True, capture_output=True)
    return out


def main():
    differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        tok = tokenizer_dir(tmp)
        for name, config in CONFIGS.items():
            torch.manual_seed(sum(map(ord, name)))
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            hf = os.path.join(tmp, name)
            model.save_pretrained(hf)
            for f in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(os.path.join(tok, f), os.path.join(hf, f))
            gguf = os.path.join(tmp, name + ".gguf")
            env = dict(os.environ, PYTHONPATH=os.path.join(LLAMA_CPP, "gguf-py"))
            subprocess.run(
                [sys.executable, os.path.join(LLAMA_CPP, "convert_hf_to_gguf.py"), hf, "--outtype", "f32", "--outfile", gguf],
                check=True,
                env=env,
                capture_output=True,
            )
            variants = [(name, gguf)]
            for label, ftype in QUANTIZED.get(name, []):
                out = os.path.join(tmp, f"{name}-{label}.gguf")
                params = llama_cpp.llama_model_quantize_default_params()
                params.ftype = ftype
                if llama_cpp.llama_model_quantize(gguf.encode(), out.encode(), params) != 0:
                    raise RuntimeError(f"llama.cpp could not quantize {name} to {label}")
                variants.append((f"{name} {label}", out))
            for label, path in variants:
                differ += compare(label, path, ["--int8"] if label != name else [])
    sys.exit(1 if differ else 0)


def compare(label, gguf, flags):
    """Greedy continuations of every prompt by llama.cpp and fusebox; returns how many differ."""
    llm = Llama(model_path=gguf, n_ctx=256, n_threads=2, verbose=False)
    same = 0
    for prompt in PROMPTS:
        theirs_prompt = llm.tokenize(prompt.encode())
        theirs = []
        for t in llm.generate(theirs_prompt, temp=0.0, top_k=1, repeat_penalty=1.0):
            if t == llm.token_eos() or len(theirs) == NEW:
                break
            theirs.append(t)
        out = subprocess.run(
            [FUSEBOX, "generate", "--model", gguf, "--prompt", prompt, "--temperature", "0", "--max-tokens",
             str(NEW), "--threads", "2", "--json"] + flags,
            capture_output=True, text=True, check=True,
        ).stdout
        ours = json.loads(out.strip().splitlines()[-1])
        if ours["prompt_ids"] == theirs_prompt and ours["generated_ids"] == theirs:
            same += 1
        else:
            print(f"  {label} {prompt!r}: fusebox {ours['prompt_ids']} → {ours['generated_ids']}")
            print(f"  {' ' * len(label)} llama.cpp {theirs_prompt} → {theirs}")
    print(f"{label}: fusebox == llama.cpp on {same}/{len(PROMPTS)} prompts ({NEW} greedy tokens each)")
    return len(PROMPTS) - same


if __name__ == "__main__":
    main()
