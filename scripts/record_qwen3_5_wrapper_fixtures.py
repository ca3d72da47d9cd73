#!/usr/bin/env python3
"""Records the Qwen3.5 checkpoints as they are published — the vision-language wrapper
(`model_type` `qwen3_5` / `qwen3_5_moe`, `Qwen3_5[Moe]ForConditionalGeneration`: the
text model's config under `text_config` beside a `vision_config`, its tensors under
`model.language_model.*`, the vision tower's under `model.visual.*`) — for
crates/fusebox-models/tests/architectures.rs, which runs them text only.

Tiny models from a config (no hub download), weights made as
scripts/record_arch_fixtures.py makes them (seeded, norms and biases random, rounded
to bf16 and saved in bf16), a vision tower of one block. Under
crates/fusebox-models/tests/fixtures/arch/:

  qwen3_5_vl/             dense; the head tied by the wrapper's `tie_word_embeddings`
                          (true) over its text_config's (false), as transformers ties it
  qwen3_5_moe_vl/         MoE, experts one tensor per expert (as transformers saves them)
  qwen3_5_moe_vl_fused/   the same weights with every layer's experts fused into 3-D
                          tensors (`mlp.experts.gate_up_proj` [E, 2F, D], each expert's gate
                          rows then its up rows; `mlp.experts.down_proj` [E, D, F]) and a
                          multi-token-prediction tensor (`mtp.fc.weight`) that transformers
                          does not load; transformers loads it to the same logits (checked)

and beside each, <name>.reference.safetensors (F32): `ids` the prompt [T], `logits` the
last-position logits of the ForConditionalGeneration model on the text-only prompt in
f64 [V], `greedy` its `generate(do_sample=False)` tokens [N] and `gaps` the top-1 minus
top-2 logit of each step [N]. Each saved directory is loaded back by transformers and
must give the reference's logits.

Setup: torch and transformers 5 (/tmp/tvenv). Run from the repository root:
    /tmp/tvenv/bin/python scripts/record_qwen3_5_wrapper_fixtures.py
"""

import copy
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record_arch_fixtures import NEW, OUT, PROMPT, VOCAB, byte_tokenizer, perturb  # noqa: E402

# Qwen3.5's text model as record_arch_fixtures.py's qwen3_5 (value heads as wide as key
# heads, as llama.cpp's qwen35 needs), the rope's multimodal sections sized to the 2
# rotary pairs of a head (text sees one position in every section).
TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    attention_dropout=0.0,
    head_dim=8,
    layer_types=["linear_attention", "linear_attention", "full_attention"],
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "mrope_section": [1, 1, 0],
        "mrope_interleaved": True,
    },
)
VISION = dict(
    depth=1,
    hidden_size=16,
    intermediate_size=32,
    num_heads=2,
    patch_size=4,
    spatial_merge_size=2,
    temporal_patch_size=2,
    out_hidden_size=32,
    num_position_embeddings=16,
)
# Weights of std 0.65 (dense) and 0.75 (MoE): the first greedy steps have clear winners
# (top-2 gaps ≥ 0.3: all 8 dense, 6 of 8 MoE; at 0.5–0.6 the first steps are close calls).
# The image/video tokens past the vocabulary: a text prompt never holds them.
SPECIAL = dict(image_token_id=VOCAB + 4, video_token_id=VOCAB + 5, vision_start_token_id=VOCAB + 6, vision_end_token_id=VOCAB + 7)

MODELS = {
    "qwen3_5_vl": (
        transformers.Qwen3_5Config,
        transformers.Qwen3_5ForConditionalGeneration,
        dict(
            text_config={**TEXT, "intermediate_size": 64, "initializer_range": 0.65, "tie_word_embeddings": False},
            tie_word_embeddings=True,
        ),
    ),
    # record_arch_fixtures.py's qwen3_5_moe text model, untied.
    "qwen3_5_moe_vl": (
        transformers.Qwen3_5MoeConfig,
        transformers.Qwen3_5MoeForConditionalGeneration,
        dict(
            text_config={
                **TEXT,
                "initializer_range": 0.75,
                "num_experts": 5,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 24,
                "shared_expert_intermediate_size": 40,
                "tie_word_embeddings": False,
            },
            tie_word_embeddings=False,
        ),
    ),
}


def build(name):
    config_class, model_class, kw = MODELS[name]
    config = config_class(vision_config=dict(VISION, initializer_range=0.5), **SPECIAL, **kw)
    for c in (config, config.text_config, config.vision_config):
        c._attn_implementation = "eager"
        c._experts_implementation = "eager"  # float64: the grouped kernels take f32/bf16 only
    torch.manual_seed(sum(map(ord, name)))
    model = model_class(config).to(torch.float32)
    perturb(model)
    return model


def reference(model):
    model = model.to(torch.float64).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, VOCAB, (1, PROMPT), generator=g)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1]
        gen = model.generate(ids, max_new_tokens=NEW, do_sample=False, output_scores=True, return_dict_in_generate=True)
    gaps = [float(torch.topk(s[0], 2).values[0] - torch.topk(s[0], 2).values[1]) for s in gen.scores]
    return {
        "ids": ids[0].float(),
        "logits": logits.float(),
        "greedy": gen.sequences[0, PROMPT:].float(),
        "gaps": torch.tensor(gaps, dtype=torch.float32),
    }


def check_loads(name, model_class, ref):
    """transformers loads the saved directory back to the reference's logits."""
    m = model_class.from_pretrained(os.path.join(OUT, name), dtype=torch.float64, attn_implementation="eager")
    m.config.text_config._experts_implementation = "eager"
    with torch.no_grad():
        got = m(input_ids=ref["ids"].long()[None]).logits[0, -1].float()
    err = float((got - ref["logits"]).abs().max() / ref["logits"].abs().max())
    assert err < 1e-6, f"{name}: transformers loads it to logits {err:.2e} off"
    print(f"{name}: transformers loads it back (logits rel {err:.1e})")


def write(name, tensors):
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(OUT, name + ".reference.safetensors"))


def fuse_experts(src, dst):
    """`src`'s per-expert tensors as 3-D ones (and an `mtp.*` tensor added) in `dst`."""
    os.makedirs(dst, exist_ok=True)
    w = load_file(os.path.join(src, "model.safetensors"))
    out, layers = {}, set()
    for k, v in w.items():
        if ".mlp.experts." in k:
            layers.add(k.split(".mlp.experts.")[0])
        else:
            out[k] = v
    for layer in sorted(layers):
        e = 0
        gate_up, down = [], []
        while f"{layer}.mlp.experts.{e}.gate_proj.weight" in w:
            p = f"{layer}.mlp.experts.{e}."
            gate_up.append(torch.cat([w[p + "gate_proj.weight"], w[p + "up_proj.weight"]], dim=0))
            down.append(w[p + "down_proj.weight"])
            e += 1
        out[f"{layer}.mlp.experts.gate_up_proj"] = torch.stack(gate_up)
        out[f"{layer}.mlp.experts.down_proj"] = torch.stack(down)
    d = w["model.language_model.embed_tokens.weight"].shape[1]
    out["mtp.fc.weight"] = torch.zeros(d, 2 * d, dtype=torch.bfloat16)
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    for f in ("config.json", "tokenizer.json"):
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))


def record(name):
    model = build(name)
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(out)
    byte_tokenizer(os.path.join(out, "tokenizer.json"))
    ref = reference(model)
    write(name, ref)
    model_class = MODELS[name][1]
    check_loads(name, model_class, ref)
    if name == "qwen3_5_moe_vl":
        fused = name + "_fused"
        fuse_experts(out, os.path.join(OUT, fused))
        write(fused, ref)
        check_loads(fused, model_class, ref)


def main():
    for name in sys.argv[1:] or list(MODELS):
        record(name)


if __name__ == "__main__":
    main()
