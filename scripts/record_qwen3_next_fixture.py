#!/usr/bin/env python3
"""Records the Hugging Face `transformers` reference for Qwen3-Next
(`Qwen3NextForCausalLM`) that crates/fusebox-models/tests/architectures.rs (module
`qwen3_next`) and crates/fusebox-models/tests/qwen3_next.rs check fusebox against.

The model is built from a config (no hub download) exactly as
scripts/record_arch_fixtures.py builds every other architecture (its `record`: seeded
random weights larger than the training init, norms perturbed, everything rounded to
bf16 and saved as a Hugging Face directory with a byte-level tokenizer; the reference
run in f64 on the same values), with weights of std 0.75 rather than 0.5. The std is chosen
for two things: all 8 greedy steps have a clear winner (top-2 gap ≥ 0.3; at 0.5 only 4
do), and the training step's gradients are well-conditioned. At std 0.7 they were not:
perturbing every weight by 6e-8 relative (f32 rounding) moved the exact f64 gradients of
the embedding and of layer 0's input norm, in_proj_qkvz and conv1d by 4e-4 relative (the
sensitivity enters between in_proj_qkvz's output and the first Gated DeltaNet's output
norm: perturbing the former by 6e-8 moved them 2e-4, the latter 1e-5), so no f32
implementation could be held to 1e-4 there; transformers' own f32 run had its largest
errors on the same four tensors. At 0.75 the same perturbation moves no gradient by more
than 4e-5. Qwen3-Next specifics exercised:

  * two Gated DeltaNet layers whose input projections are fused per key head
    (`in_proj_qkvz`, `in_proj_ba`), 2 key heads for 4 value heads, so the ordering
    transformers undoes in `fix_query_key_value_ordering` matters;
  * a gated full-attention layer (q_proj holds each head's query and gate), QK-norm,
    half of each head rotated;
  * a mixture of 5 experts, top-2 renormalised, beside a sigmoid-gated shared expert in
    every layer, and the load-balancing loss in the training loss;
  * `(1 + w)` norms everywhere but the Gated DeltaNet's.

Key and value heads are both 8 wide so the model can also be written as llama.cpp's
`qwen3next` (which sizes a value head as a key head).

Writes crates/fusebox-models/tests/fixtures/arch/qwen3_next/ (config.json,
model.safetensors, tokenizer.json) and qwen3_next.reference.safetensors beside it (ids,
logits, greedy, gaps, train_ids, loss, grad.<checkpoint name>: see
record_arch_fixtures.py).

Setup: a venv with torch and transformers 5 (with qwen3_next). From the repository root:
    /tmp/tvenv/bin/python scripts/record_qwen3_next_fixture.py
"""

import os
import sys

import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record_arch_fixtures as arch  # noqa: E402


def config():
    return transformers.Qwen3NextConfig(
        **{**arch.COMMON, "num_hidden_layers": 3, "initializer_range": 0.75},
        head_dim=8,
        layer_types=["linear_attention", "linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        num_experts=5,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        moe_intermediate_size=24,
        shared_expert_intermediate_size=40,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        output_router_logits=True,
        router_aux_loss_coef=0.02,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    )


def main():
    arch.record("qwen3_next", config())


if __name__ == "__main__":
    main()
