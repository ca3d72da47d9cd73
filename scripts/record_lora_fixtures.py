#!/usr/bin/env python3
"""Records the PyTorch autograd reference that crates/fusebox-models/tests/lora.rs checks
fusebox's LoRA gradients against: one training step of Hugging Face PEFT adapters on the
tiny architecture fixtures (written by scripts/record_arch_fixtures.py).

For each architecture below it loads the fixture directory
crates/fusebox-models/tests/fixtures/arch/<name>/ with `transformers`, wraps it with PEFT
(`LoraConfig(r=R, lora_alpha=ALPHA, target_modules=all seven projections)`), fills every
`lora_A` and `lora_B` with seeded random values rounded to f32 (B nonzero, so the adapters
change the loss and dA is not trivially zero), and runs the step in f64, so the recorded
numbers are the exact answer up to f64 rounding and the test's tolerance measures
fusebox's f32 error alone.

<name>.lora.safetensors (all F32) holds:
  train_ids                 a sequence for one training step, [T + 1]
  loss                      mean cross-entropy of `model(train_ids, labels=train_ids)`, [1]
  a.<l>.<module>            lora_A of layer l's <module> (q_proj, …, down_proj), [r, in]
  b.<l>.<module>            lora_B, [out, r]
  grad_a.<l>.<module>       d loss / d lora_A
  grad_b.<l>.<module>       d loss / d lora_B

Setup: the shared venv (torch, transformers 5, peft). Run from the repository root:
    /tmp/venv-py/bin/python scripts/record_lora_fixtures.py
"""

import os

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

FIXTURES = "crates/fusebox-models/tests/fixtures/arch"
# Llama 3 (GQA, llama3 rope), Qwen3 (QK-norm, explicit head_dim), Gemma 3 (sliding and
# global layers, (1 + w) norms, scaled embeddings, GELU-tanh gate).
ARCHS = ["llama", "qwen3", "gemma3"]
R, ALPHA = 4, 8.0
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
T = 12


def record(name):
    torch.manual_seed(sum(map(ord, name)) + 1)
    model = AutoModelForCausalLM.from_pretrained(os.path.join(FIXTURES, name), dtype=torch.float32)
    config = LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=MODULES, bias="none")
    model = get_peft_model(model, config).to(torch.float64)
    tensors = {}
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "lora_" not in pname:
                continue
            bound = 1.0 / p.shape[1] ** 0.5 if "lora_A" in pname else 0.3
            p.copy_((torch.rand_like(p) * 2 - 1) * bound)
            p.copy_(p.to(torch.float32).to(torch.float64))
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(11)
    train_ids = torch.randint(3, vocab, (1, T + 1), generator=g)
    model.train()
    model.zero_grad()
    loss = model(input_ids=train_ids, labels=train_ids).loss
    loss.backward()
    tensors["train_ids"] = train_ids[0].float()
    tensors["loss"] = loss.detach().float().reshape(1)
    count = 0
    for pname, p in model.named_parameters():
        if "lora_" not in pname:
            continue
        # base_model.model.model.layers.{l}.{self_attn|mlp}.{module}.lora_{A|B}.default.weight
        parts = pname.split(".")
        layer = parts[parts.index("layers") + 1]
        module = next(m for m in MODULES if m in parts)
        which = "a" if "lora_A" in parts else "b"
        tensors[f"{which}.{layer}.{module}"] = p.detach().float().contiguous()
        tensors[f"grad_{which}.{layer}.{module}"] = p.grad.float().contiguous()
        count += 1
    path = os.path.join(FIXTURES, f"{name}.lora.safetensors")
    save_file(tensors, path)
    print(f"{name:8} loss {loss.item():.6f}  {count} adapter tensors  {os.path.getsize(path)} bytes")


def main():
    for name in ARCHS:
        record(name)


if __name__ == "__main__":
    main()
