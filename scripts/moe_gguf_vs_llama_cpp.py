#!/usr/bin/env python3
"""The mixture-of-experts architectures as llama.cpp's own converter writes them, run by
llama.cpp and by fusebox on the same GGUF: greedy continuations must be equal.

For each of qwen3_moe, mixtral, olmoe, qwen2_moe, gpt_oss and qwen3_5_moe a small model (2
layers — qwen3_5_moe 4: three Gated DeltaNet and one full-attention —, d_model 64, 8
experts, top-2; random weights from `transformers` with a large init so logits have
clear winners; SmolLM2's tokenizer, which the converter recognises) is saved, converted
by `convert_hf_to_gguf.py --outtype f32` (`--no-mtp` for qwen3_5_moe, which has no
multi-token-prediction block) and, for each of 4 prompts, continued for 16
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
        scripts/moe_gguf_vs_llama_cpp.py [NAME ...]
(NAMEs: only those architectures.)
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
    # Qwen3.5-MoE (no intermediate_size: every MLP is experts, beside a shared expert):
    # 2 query/key heads for 4 value heads, so the converter tiles the value heads; heads of
    # 32 so llama.cpp's rope sections ([11, 11, 10]) fit; key and value heads alike wide
    # (llama.cpp sizes a value head as a key head).
    "qwen3_5_moe": transformers.Qwen3_5MoeTextConfig(
        **{**{k: v for k, v in COMMON.items() if k != "intermediate_size"}, "num_hidden_layers": 4},
        head_dim=32,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        moe_intermediate_size=48,
        shared_expert_intermediate_size=80,
        num_experts=8,
        num_experts_per_tok=2,
    ),
}
# Runs llama.cpp's converter with its pre-tokenizer check answered "smollm" (what it
# answers for SmolLM2's tokenizer when the hash of the exported tokenizer.json matches its
# list; under transformers 5 it may not).
CONVERT = """
import runpy, sys
sys.path.insert(0, {src!r})
sys.argv = [{script!r}] + {args!r}
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "smollm"
runpy.run_path({script!r}, run_name="__main__")
"""
# Converter flags beyond the output type, per architecture.
CONVERT_FLAGS = {"qwen3_5_moe": ["--no-mtp"]}


def tokenizer_dir(tmp):
    out = os.path.join(tmp, "tokenizer")
    subprocess.run([FUSEBOX, "export", "--model", SMOLLM2, "--format", "hf", "--out", out], check=True, capture_output=True)
    return out


def main():
    differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        tok = tokenizer_dir(tmp)
        for name in sys.argv[1:] or list(CONFIGS):
            config = CONFIGS[name]
            torch.manual_seed(sum(map(ord, name)))
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            hf = os.path.join(tmp, name)
            model.save_pretrained(hf)
            for f in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(os.path.join(tok, f), os.path.join(hf, f))
            gguf = os.path.join(tmp, name + ".gguf")
            env = dict(os.environ, PYTHONPATH=os.path.join(LLAMA_CPP, "gguf-py"))
            script = os.path.join(LLAMA_CPP, "convert_hf_to_gguf.py")
            args = [hf, "--outtype", "f32", "--outfile", gguf] + CONVERT_FLAGS.get(name, [])
            subprocess.run(
                [sys.executable, "-c", CONVERT.format(src=LLAMA_CPP, script=script, args=args)],
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
