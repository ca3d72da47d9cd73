#!/usr/bin/env python3
"""Records the Hugging Face `transformers` reference that
crates/fusebox-models/tests/architectures.rs checks fusebox's one transformer against,
for every architecture it supports.

For each architecture it builds a tiny model from a config (no hub download), with
seeded random weights larger than the training init (so logits have clear winners)
and random norm weights and biases (so every parameter carries signal), rounds every
weight to bf16, and saves it as a Hugging Face directory (config.json +
model.safetensors in bf16, which holds the rounded values exactly, and a byte-level
tokenizer.json of the 256 byte tokens, so `fusebox generate --model DIR` runs it)
under crates/fusebox-models/tests/fixtures/arch/<name>/, and the reference beside it. The reference then runs in f64 on
those same values, so the recorded numbers are the exact answer up to f64 rounding
and the test's tolerance measures fusebox's f32 error alone.

<name>.reference.safetensors (all F32) holds:
  ids            the prompt, [T]
  logits         last-position logits of the prompt, [V]
  greedy         `generate(do_sample=False)` through the KV cache, [N]
  gaps           top-1 minus top-2 logit at each greedy step, [N]
  train_ids      a sequence for one training step, [T + 1]
  loss           mean cross-entropy of `model(train_ids, labels=train_ids)`, [1]
  grad.<name>    d loss / d <name> for every parameter (HF names and layouts)

Setup: the shared venv (torch, transformers 5). Run from the repository root:
    /tmp/venv-py/bin/python scripts/record_arch_fixtures.py
"""

import copy
import os
import sys

import torch
from safetensors.torch import save_file
import transformers
from transformers import AutoModelForCausalLM

OUT = "crates/fusebox-models/tests/fixtures/arch"
VOCAB, D, LAYERS, HEADS, KV, FF, CTX = 272, 32, 2, 4, 2, 64, 64
PROMPT, NEW = 12, 8
# Windows smaller than the prompt, so local layers mask keys in prefill, decode and training.
WINDOW = int(os.environ.get("WINDOW", "5"))

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=D,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    num_key_value_heads=KV,
    intermediate_size=FF,
    max_position_embeddings=CTX,
    initializer_range=0.5,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    attention_dropout=0.0,
)

ARCHS = {
    # Llama 3: llama3 rope scaling (with an original context short enough to rescale), GQA, untied.
    "llama": transformers.LlamaConfig(
        **COMMON,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    # Llama 2 shaped: linear rope scaling, tied head.
    "llama_linear_tied": transformers.LlamaConfig(
        **COMMON,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    ),
    "mistral": transformers.MistralConfig(**COMMON, sliding_window=WINDOW, tie_word_embeddings=False),
    "qwen2": transformers.Qwen2Config(**COMMON, tie_word_embeddings=True, use_sliding_window=False),
    "qwen3": transformers.Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=False, use_sliding_window=False),
    # YaRN rope: 4× an original 16-position context (frequencies ramped between
    # interpolated and kept, cos/sin scaled by 0.1·ln 4 + 1).
    "qwen3_yarn": transformers.Qwen3Config(
        **COMMON,
        head_dim=16,
        tie_word_embeddings=False,
        use_sliding_window=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16},
    ),
    "phi3": transformers.Phi3Config(
        **COMMON, sliding_window=None, resid_pdrop=0.0, embd_pdrop=0.0, tie_word_embeddings=False
    ),
    "gemma3": transformers.Gemma3TextConfig(
        **COMMON,
        head_dim=16,
        query_pre_attn_scalar=24,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        },
    ),
    # Mixture of experts: top-2 of 8 renormalised (as llama.cpp runs every qwen3moe file),
    # and the load-balancing loss in the training loss (output_router_logits).
    "qwen3_moe": transformers.Qwen3MoeConfig(
        **COMMON,
        head_dim=16,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        output_router_logits=True,
        router_aux_loss_coef=0.02,
        tie_word_embeddings=False,
        use_sliding_window=False,
    ),
    # Softmax top-2 of 7 experts (not renormalised) beside a sigmoid-gated shared expert,
    # q/k/v biases.
    "qwen2_moe": transformers.Qwen2MoeConfig(
        **COMMON,
        moe_intermediate_size=24,
        shared_expert_intermediate_size=40,
        num_experts=7,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        output_router_logits=True,
        router_aux_loss_coef=0.02,
        tie_word_embeddings=False,
        use_sliding_window=False,
    ),
    # Renormalised top-2 of 5 experts, each as wide as the dense MLP.
    "mixtral": transformers.MixtralConfig(
        **COMMON,
        num_local_experts=5,
        num_experts_per_tok=2,
        sliding_window=None,
        output_router_logits=True,
        router_aux_loss_coef=0.02,
        tie_word_embeddings=False,
    ),
    # Softmax top-2 of 5 (not renormalised), QK-norms over all heads.
    "olmoe": transformers.OlmoeConfig(
        **COMMON,
        num_experts=5,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        output_router_logits=True,
        router_aux_loss_coef=0.02,
        tie_word_embeddings=False,
    ),
    # gpt-oss: top-2 of 5 experts by top-k then softmax, biases on attention, router and
    # experts, a sink logit per head, the clamped SwiGLU, YaRN without rounding (as
    # gpt-oss ships it), sliding-window and full layers alternating.
    "gpt_oss": transformers.GptOssConfig(
        **{**COMMON, "intermediate_size": 24},
        head_dim=16,
        num_local_experts=5,
        num_experts_per_tok=2,
        sliding_window=WINDOW,
        output_router_logits=True,
        router_aux_loss_coef=0.02,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 16,
        },
    ),
    # Qwen3.5 (dense): two Gated DeltaNet layers and a full-attention layer with its
    # output gate, QK-norm and half of each head rotated; GQA in both kinds of layer
    # (2 query/key heads for 4 value heads in the linear ones).
    "qwen3_5": transformers.Qwen3_5TextConfig(
        **{**COMMON, "num_hidden_layers": 3},
        head_dim=8,
        layer_types=["linear_attention", "linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=6,
        linear_conv_kernel_dim=4,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    ),
    # Qwen3.5-MoE: Qwen3.5's layers (two Gated DeltaNet, 2 query/key heads for 4 value
    # heads, and a gated full-attention layer) with top-2 of 5 experts renormalised beside
    # a sigmoid-gated shared expert in every layer, and the load-balancing loss. Its config
    # has no intermediate_size; key and value heads are both 8 wide (llama.cpp's qwen35moe
    # sizes a value head as a key head). Weights of std 0.65: at 0.5 the first greedy step
    # has no clear winner (top-2 gap < 0.3); at 0.75 (Qwen3-Next's) the gradients are
    # ill-conditioned (fusebox's f32 worst gradient 9e-5 from the f64 reference, and the
    # LoRA finite differences at h = 1e-3 off by 70%); at 0.65 all 8 steps are clear, the
    # worst gradient is 4e-5 off and the finite differences agree to 0.1%.
    "qwen3_5_moe": transformers.Qwen3_5MoeTextConfig(
        **{**{k: v for k, v in COMMON.items() if k != "intermediate_size"}, "num_hidden_layers": 3, "initializer_range": 0.65},
        head_dim=8,
        layer_types=["linear_attention", "linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        num_experts=5,
        num_experts_per_tok=2,
        moe_intermediate_size=24,
        shared_expert_intermediate_size=40,
        output_router_logits=True,
        router_aux_loss_coef=0.02,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    ),
    "gpt2": transformers.GPT2Config(
        vocab_size=VOCAB,
        n_embd=D,
        n_layer=LAYERS,
        n_head=HEADS,
        n_positions=CTX,
        n_inner=FF,
        initializer_range=0.5,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=1,
        eos_token_id=2,
    ),
}


def byte_tokenizer(path):
    """GPT-2's byte-level alphabet as 256 tokens (ids = byte values), no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    tok = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(path)


def perturb(model):
    """Random norm weights and biases (so every parameter carries signal), then every
    weight rounded to bf16 (which the saved checkpoint holds exactly)."""
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or "ln_" in pname:
                p.add_(0.1 * torch.randn_like(p))  # 1 ± 0.1 (Gemma: w in (1 + w) around 0)
            elif pname.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            p.copy_(p.to(torch.bfloat16).to(torch.float32))


def build(name, config):
    torch.manual_seed(sum(map(ord, name)))
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # float64: the grouped kernels take f32/bf16 only
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    perturb(model)
    return model


def record(name, config):
    model = build(name, config)
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    # A copy goes to bf16 for saving: `.to` converts in place, buffers too (rope's
    # inv_freq), and the reference must keep those in full precision.
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(out)
    byte_tokenizer(os.path.join(out, "tokenizer.json"))
    model = model.to(torch.float64)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, VOCAB, (1, PROMPT), generator=g)
    model.eval()
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
        gen = model.generate(
            ids,
            max_new_tokens=NEW,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
    greedy = gen.sequences[0, PROMPT:]
    gaps = []
    for s in gen.scores:
        top = torch.topk(s[0], 2).values
        gaps.append(float(top[0] - top[1]))
    train_ids = torch.randint(3, VOCAB, (1, PROMPT + 1), generator=g)
    model.train()
    model.zero_grad()
    loss = model(input_ids=train_ids, labels=train_ids).loss
    loss.backward()
    tensors = {
        "ids": ids[0].float(),
        "logits": logits.float(),
        "greedy": greedy.float(),
        "gaps": torch.tensor(gaps, dtype=torch.float32),
        "train_ids": train_ids[0].float(),
        "loss": loss.detach().float().reshape(1),
    }
    if any(".experts." in pname for pname, _ in model.named_parameters()):
        # transformers keeps experts as 3-D tensors in memory and writes one tensor per
        # expert: the gradients are saved the way the weights are, so they carry the
        # checkpoint's names.
        grads = copy.deepcopy(model)
        with torch.no_grad():
            for (_, g), (_, p) in zip(grads.named_parameters(), model.named_parameters()):
                g.copy_(p.grad)
        tmp = os.path.join(OUT, name + ".grads.tmp")
        grads.to(torch.float32).save_pretrained(tmp)
        from safetensors.torch import load_file

        for k, v in load_file(os.path.join(tmp, "model.safetensors")).items():
            tensors["grad." + k] = v.contiguous()
        for f in os.listdir(tmp):
            os.remove(os.path.join(tmp, f))
        os.rmdir(tmp)
    else:
        for pname, p in model.named_parameters():
            tensors["grad." + pname] = p.grad.float().contiguous()
    ref = os.path.join(OUT, name + ".reference.safetensors")
    save_file(tensors, ref)
    for f in os.listdir(out):
        if f not in ("config.json", "model.safetensors", "tokenizer.json"):
            os.remove(os.path.join(out, f))
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out)) + os.path.getsize(ref)
    sure = next((i for i, gap in enumerate(gaps) if gap < 0.3), len(gaps))
    print(f"{name:18} loss {loss.item():.4f}  greedy {greedy.tolist()}  sure steps {sure}  {size} bytes")


def main():
    names = sys.argv[1:] or list(ARCHS)
    for name in names:
        record(name, ARCHS[name])


if __name__ == "__main__":
    main()
