#!/usr/bin/env python3
"""Makes the mixture-of-experts benchmark model: a Qwen3-MoE of about 0.95 B parameters
of which about 0.19 B are read per token (16 layers, d_model 1024, 16 query / 4 key-value
heads of 64, 32 experts of 512, top-4, untied 49,152-token head), with random weights
from `transformers` (no hub), converted by llama.cpp's own `convert_hf_to_gguf.py` and
quantized by llama.cpp (`llama_model_quantize`) to Q4_K_M and Q8_0, so fusebox and
llama.cpp read the same files (bench/decode_vs_llama_cpp.sh).

The tokenizer is SmolLM2's (exported from models/SmolLM2-135M-Instruct.Q4_1.gguf by
`fusebox export`), which llama.cpp's converter recognises; the weights never see it.

Usage, from the repository root (scripts/fetch-smollm2.sh first; a venv with torch,
transformers and llama-cpp-python; LLAMA_CPP_SRC the unpacked llama-cpp-python source
distribution, whose vendor/llama.cpp holds the converter):
    LLAMA_CPP_SRC=/tmp/lcp-src/llama_cpp_python-0.3.36 /tmp/venv/bin/python \\
        scripts/make_moe_bench_model.py [OUT_DIR]
writes OUT_DIR/qwen3moe-1b-{q4_k_m,q8_0}.gguf (default OUT_DIR: models/).
"""
import os
import shutil
import subprocess
import sys

import torch
import transformers

OUT = sys.argv[1] if len(sys.argv) > 1 else "models"
SRC = os.environ.get("LLAMA_CPP_SRC", "/tmp/lcp-src/llama_cpp_python-0.3.36")
LLAMA_CPP = os.path.join(SRC, "vendor", "llama.cpp")
FUSEBOX = os.environ.get("FUSEBOX", "target/release/fusebox")
SMOLLM2 = "models/SmolLM2-135M-Instruct.Q4_1.gguf"

CONFIG = transformers.Qwen3MoeConfig(
    vocab_size=49152,
    hidden_size=1024,
    num_hidden_layers=16,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=64,
    intermediate_size=2816,
    moe_intermediate_size=512,
    num_experts=32,
    num_experts_per_tok=4,
    norm_topk_prob=True,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)


def make(config, stem, convert_args=(), formats=("q4_k_m", "q8_0")):
    """Random weights for `config` (seed 0, bf16), SmolLM2's tokenizer, llama.cpp's
    converter (with `convert_args`) to f16 and its quantizer to each of `formats` (q4_0,
    q4_k_m, q5_k_m, q6_k, q8_0): writes OUT/STEM-FORMAT.gguf and removes the intermediate
    files. Formats whose file exists already are not made again."""
    import llama_cpp

    ftypes = {
        "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
        "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
        "q5_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M,
        "q6_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K,
        "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    }
    unknown = [f for f in formats if f not in ftypes]
    if unknown:
        sys.exit(f"unknown formats {unknown}: expected some of {sorted(ftypes)}")
    formats = [f for f in formats if not os.path.exists(os.path.join(OUT, f"{stem}-{f}.gguf"))]
    if not formats:
        return
    os.makedirs(OUT, exist_ok=True)
    hf = os.path.join(OUT, f"{stem}-hf")
    tok = os.path.join(OUT, "smollm2-tokenizer-hf")
    if not os.path.exists(os.path.join(tok, "tokenizer.json")):
        subprocess.run([FUSEBOX, "export", "--model", SMOLLM2, "--format", "hf", "--out", tok], check=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    total = sum(p.numel() for p in model.parameters())
    print(f"{total / 1e9:.3f} B parameters")
    model.save_pretrained(hf)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok, f), os.path.join(hf, f))
    f16 = os.path.join(OUT, f"{stem}-f16.gguf")
    env = dict(os.environ, PYTHONPATH=os.path.join(LLAMA_CPP, "gguf-py"))
    convert = [sys.executable, os.path.join(LLAMA_CPP, "convert_hf_to_gguf.py"), hf, "--outtype", "f16"]
    subprocess.run(convert + list(convert_args) + ["--outfile", f16], check=True, env=env)
    for name in formats:
        out = os.path.join(OUT, f"{stem}-{name}.gguf")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = ftypes[name]
        params.nthread = 2
        rc = llama_cpp.llama_model_quantize(f16.encode(), out.encode(), params)
        if rc != 0:
            sys.exit(f"llama_model_quantize {name}: {rc}")
        print(f"{out}: {os.path.getsize(out) / 1e9:.2f} GB")
    os.remove(f16)
    shutil.rmtree(hf)


if __name__ == "__main__":
    make(CONFIG, "qwen3moe-1b")
