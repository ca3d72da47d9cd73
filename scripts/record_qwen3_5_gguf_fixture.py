#!/usr/bin/env python3
"""Records llama.cpp's side of Qwen3.5 (`qwen35`) GGUF files, which
crates/fusebox-models/tests/qwen3_5_gguf.rs checks fusebox's reader and writer against.

A tiny dense Qwen3.5 (three Gated DeltaNet layers and one gated full-attention layer;
2 query/key heads for 4 value heads, so llama.cpp's converter reorders the value heads;
partial rotary; random weights larger than the training init, rounded to bf16, norms
1 ± 0.1) is built with `transformers` from a config, saved as a Hugging Face directory
with a byte-level tokenizer (the 256 bytes and 8 merges), and converted by llama.cpp's
own `convert_hf_to_gguf.py --outtype f32` (its BPE pre-tokenizer check, which knows
only the hashes of released tokenizers, is told `gpt-2`). Written under
crates/fusebox-models/tests/fixtures/qwen3_5_gguf/:

  model.gguf                 the converter's file
  reference.safetensors      (all F32)
    ids          the prompt, [T]
    llama_logits llama-cpp-python's logits of every prompt position, [T, V]
    hf_logits    transformers' (f64, eager) logits of every prompt position, [T, V]
    greedy       llama.cpp's greedy continuation through its cache, [N]
    gaps         top-1 minus top-2 logit at each greedy step, [N]

With `--check-export FILE.gguf --ids 1,2,3` it instead loads FILE (a fusebox export)
with llama-cpp-python and prints {"logits": [[...], ...]} for every position of the ids
(the test `fusebox_export_loads_in_llama_cpp` runs this when llama_cpp imports).

Setup: a venv with torch, transformers 5 (with qwen3_5) and llama-cpp-python (which
holds llama.cpp's sources as its sdist's vendor/llama.cpp). From the repository root:
    LLAMA_CPP_SRC=/tmp/lcp-src/llama_cpp_python-0.3.36 /tmp/lvenv/bin/python \\
        scripts/record_qwen3_5_gguf_fixture.py
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

SRC = os.environ.get("LLAMA_CPP_SRC", "/tmp/lcp-src/llama_cpp_python-0.3.36")
LLAMA_CPP = os.path.join(SRC, "vendor", "llama.cpp")
OUT = "crates/fusebox-models/tests/fixtures/qwen3_5_gguf"
VOCAB, PROMPT, NEW = 272, 12, 8

# Runs llama.cpp's converter with its pre-tokenizer check answered: the byte tokenizer
# here is no released model's, so its hash is in no list.
CONVERT = """
import runpy, sys
sys.path.insert(0, {src!r})
sys.argv = [{script!r}] + {args!r}
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
runpy.run_path({script!r}, run_name="__main__")
"""


def config():
    import transformers

    return transformers.Qwen3_5TextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        # llama.cpp's rope sections (Qwen3.5's [11, 11, 10]) must fit in a head.
        head_dim=32,
        max_position_embeddings=64,
        initializer_range=0.5,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        # llama.cpp sizes a value head as a key head (`ssm.state_size`).
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )


def merges_tokenizer(path):
    """GPT-2's byte-level alphabet as 256 tokens (ids = byte values) and a few merges
    (llama.cpp refuses a BPE vocabulary without any)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    vocab = {chars[b]: b for b in range(256)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġ", "a"), ("i", "n"), ("e", "r"), ("o", "n"), ("Ġt", "he"), ("r", "e")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(path)


def build():
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(35)
    cfg = config()
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    return model


def convert(hf, gguf):
    script = os.path.join(LLAMA_CPP, "convert_hf_to_gguf.py")
    code = CONVERT.format(src=LLAMA_CPP, script=script, args=[hf, "--outtype", "f32", "--no-mtp", "--outfile", gguf])
    env = dict(os.environ, PYTHONPATH=os.path.join(LLAMA_CPP, "gguf-py"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{r.stderr[-3000:]}")


def llama_logits(path, ids):
    """llama-cpp-python's logits of every position of `ids`, [T, V] (an f32 KV cache:
    llama.cpp's default f16 one rounds the keys and values)."""
    import llama_cpp

    f32 = llama_cpp.GGML_TYPE_F32
    llm = llama_cpp.Llama(
        model_path=path, n_ctx=64, n_threads=2, logits_all=True, verbose=False, seed=0, type_k=f32, type_v=f32
    )
    llm.eval(ids)
    return llm, np.array(llm.scores[: len(ids)], dtype=np.float32)


def record():
    import torch
    from safetensors.torch import save_file

    model = build()
    os.makedirs(OUT, exist_ok=True)
    gguf = os.path.join(OUT, "model.gguf")
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        merges_tokenizer(os.path.join(tmp, "tokenizer.json"))
        convert(tmp, gguf)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, VOCAB, (PROMPT,), generator=g).tolist()
    llm, theirs = llama_logits(gguf, ids)
    greedy, gaps = [], []
    for _ in range(NEW):
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        top = np.argsort(-last)[:2]
        greedy.append(int(top[0]))
        gaps.append(float(last[top[0]] - last[top[1]]))
        llm.eval([int(top[0])])
    model = model.to(torch.float64).eval()
    with torch.no_grad():
        hf = model(torch.tensor([ids])).logits[0].float()
    save_file(
        {
            "ids": torch.tensor(ids, dtype=torch.float32),
            "llama_logits": torch.from_numpy(theirs),
            "hf_logits": hf.contiguous(),
            "greedy": torch.tensor(greedy, dtype=torch.float32),
            "gaps": torch.tensor(gaps, dtype=torch.float32),
        },
        os.path.join(OUT, "reference.safetensors"),
    )
    diff = float(np.abs(theirs - hf.numpy()).max() / np.abs(hf.numpy()).max())
    size = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"qwen35: llama.cpp vs transformers logits rel {diff:.2e}; greedy {greedy}; gaps "
          f"{[round(x, 2) for x in gaps]}; {size} bytes")


def check_export(path, ids):
    _, logits = llama_logits(path, ids)
    print(json.dumps({"logits": logits.tolist()}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check-export")
    p.add_argument("--ids", default="")
    args = p.parse_args()
    if args.check_export:
        check_export(args.check_export, [int(x) for x in args.ids.split(",") if x])
    else:
        record()


if __name__ == "__main__":
    main()
