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


def main():
    os.makedirs(OUT, exist_ok=True)
    hf = os.path.join(OUT, "qwen35-0.8b-hf")
    tok = os.path.join(OUT, "smollm2-tokenizer-hf")
    if not os.path.exists(os.path.join(tok, "tokenizer.json")):
        subprocess.run([FUSEBOX, "export", "--model", SMOLLM2, "--format", "hf", "--out", tok], check=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIG, dtype=torch.bfloat16)
    total = sum(p.numel() for p in model.parameters())
    print(f"{total / 1e9:.3f} B parameters")
    model.save_pretrained(hf)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok, f), os.path.join(hf, f))
    f16 = os.path.join(OUT, "qwen35-0.8b-f16.gguf")
    env = dict(os.environ, PYTHONPATH=os.path.join(LLAMA_CPP, "gguf-py"))
    # --no-mtp: the model has no multi-token-prediction layers (the converter expects them).
    convert = [sys.executable, os.path.join(LLAMA_CPP, "convert_hf_to_gguf.py"), hf, "--outtype", "f16", "--no-mtp"]
    subprocess.run(convert + ["--outfile", f16], check=True, env=env)
    import llama_cpp

    for name, ftype in (("q4_k_m", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M), ("q8_0", llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0)):
        out = os.path.join(OUT, f"qwen35-0.8b-{name}.gguf")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = ftype
        params.nthread = 2
        rc = llama_cpp.llama_model_quantize(f16.encode(), out.encode(), params)
        if rc != 0:
            sys.exit(f"llama_model_quantize {name}: {rc}")
        print(f"{out}: {os.path.getsize(out) / 1e9:.2f} GB")
    os.remove(f16)
    shutil.rmtree(hf)


if __name__ == "__main__":
    main()
