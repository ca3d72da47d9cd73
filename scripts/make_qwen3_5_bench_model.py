#!/usr/bin/env python3
"""Makes the hybrid (Gated DeltaNet) benchmark model: a Qwen3.5 shaped as Qwen3.5-0.8B —
24 layers, d_model 1024, six groups of three Gated DeltaNet layers (16 query/key and 16
value heads of 128, conv kernel 4) and one gated full-attention layer (8 query / 2
key-value heads of 256, a quarter of each rotated), SwiGLU MLP of 3,584, a tied
248,320-token embedding — with random weights from `transformers` (no hub), converted by
llama.cpp's own `convert_hf_to_gguf.py` and quantized by llama.cpp
(`llama_model_quantize`) to Q4_K_M and Q8_0, so fusebox and llama.cpp read the same files
(bench/decode_vs_llama_cpp.sh).

The tokenizer is SmolLM2's (exported from models/SmolLM2-135M-Instruct.Q4_1.gguf by
`fusebox export`), which llama.cpp's converter recognises; it pads the vocabulary to the
config's 248,320 entries. The weights never see text, so the benchmark's prompts are
SmolLM2 token ids over Qwen3.5-sized tables.

Usage, from the repository root (scripts/fetch-smollm2.sh first; a venv with torch,
transformers ≥ 5 and llama-cpp-python; LLAMA_CPP_SRC the unpacked llama-cpp-python source
distribution, whose vendor/llama.cpp holds the converter):
    LLAMA_CPP_SRC=/tmp/lcp-src/llama_cpp_python-0.3.36 /tmp/venv/bin/python \\
        scripts/make_qwen3_5_bench_model.py [OUT_DIR]
writes OUT_DIR/qwen35-0.8b-{q4_k_m,q8_0}.gguf (default OUT_DIR: models/).
"""
import os
import sys

import transformers

# The model making and quantizing of the mixture-of-experts benchmark (same OUT_DIR,
# LLAMA_CPP_SRC and FUSEBOX).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_moe_bench_model import make  # noqa: E402

CONFIG = transformers.Qwen3_5TextConfig(
    vocab_size=248320,
    hidden_size=1024,
    num_hidden_layers=24,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=256,
    intermediate_size=3584,
    layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 6,
    linear_num_key_heads=16,
    linear_num_value_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
    bos_token_id=1,
    eos_token_id=2,
)


if __name__ == "__main__":
    # --no-mtp: the model has no multi-token-prediction layers (the converter expects them).
    make(CONFIG, "qwen35-0.8b", ["--no-mtp"])
