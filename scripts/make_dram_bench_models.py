#!/usr/bin/env python3
"""Makes the DRAM-bound decode benchmark models: Llama-shaped models larger than any
last-level cache in sight, with random weights from `transformers` (no hub), converted by
llama.cpp's own `convert_hf_to_gguf.py` and quantized by llama.cpp
(`llama_model_quantize`), so fusebox and llama.cpp read the same files
(bench/decode_vs_llama_cpp.sh):

- `llama-1.5b`: 22 layers, d_model 2048, 32 query / 8 key-value heads of 64, SwiGLU of
  8,192, untied 49,152-token head — 1.54 B parameters (Llama 3.2 1B's widths);
- `llama-3b`: 28 layers, d_model 3072, 24 query / 8 key-value heads of 128, SwiGLU of
  8,192, untied head — 3.12 B parameters (Llama 3.2 3B's widths).

Each in Q4_0, Q4_K_M, Q5_K_M, Q6_K and Q8_0 (0.9–1.6 GB and 1.8–3.3 GB a file; making
one size needs its bf16 and f16 copies on disk for a while, 2 × 3 GB or 2 × 6 GB). The
tokenizer is SmolLM2's (exported from models/SmolLM2-135M-Instruct.Q4_1.gguf by
`fusebox export`); the weights never see text.

Usage, from the repository root (scripts/fetch-smollm2.sh first; a venv with torch,
transformers and llama-cpp-python; LLAMA_CPP_SRC the unpacked llama-cpp-python source
distribution, whose vendor/llama.cpp holds the converter):
    LLAMA_CPP_SRC=/tmp/lcp-src/llama_cpp_python-0.3.36 /tmp/venv/bin/python \\
        scripts/make_dram_bench_models.py [OUT_DIR] [SIZES] [FORMATS]
SIZES: comma-separated among 1.5b,3b (default both); FORMATS: among
q4_0,q4_k_m,q5_k_m,q6_k,q8_0 (default all). Writes OUT_DIR/llama-SIZE-FORMAT.gguf
(default OUT_DIR: models/); files already there are kept.
"""
import os
import sys

import transformers

# The model making and quantizing of the mixture-of-experts benchmark (same OUT_DIR,
# LLAMA_CPP_SRC and FUSEBOX).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_moe_bench_model import make  # noqa: E402


def llama(layers, d_model, heads, kv_heads, head_dim, ffn):
    return transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=d_model,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=ffn,
        max_position_embeddings=4096,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


SIZES = {
    "1.5b": llama(22, 2048, 32, 8, 64, 8192),
    "3b": llama(28, 3072, 24, 8, 128, 8192),
}
FORMATS = ("q4_0", "q4_k_m", "q5_k_m", "q6_k", "q8_0")

if __name__ == "__main__":
    sizes = sys.argv[2].split(",") if len(sys.argv) > 2 else list(SIZES)
    formats = tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else FORMATS
    for size in sizes:
        if size not in SIZES:
            sys.exit(f"unknown size {size!r}: expected one of {sorted(SIZES)}")
        make(SIZES[size], f"llama-{size}", formats=formats)
