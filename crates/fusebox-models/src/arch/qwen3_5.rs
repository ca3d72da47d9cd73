//! Qwen3.5 (dense, text): a hybrid of Gated DeltaNet linear-attention layers
//! (`layer_types` `linear_attention`; by default three of every four) and full-attention
//! layers whose output is gated by `σ(gate)` (the gate rows follow each query head's
//! rows in `q_proj`), with per-head QK-norm and partial rotary (`partial_rotary_factor`,
//! 0.25). Every RMS norm but the Gated DeltaNet's own is Gemma's `(1 + w)` form, stored
//! as `w` (the 1 is added at load, as for Gemma 3).
//!
//! transformers' rope is "mrope" with sections for image grids; for text every section
//! sees the same position, which is the plain rope over the rotated dims.

use fusebox::{Error, Result};
use serde_json::json;

use super::names::hf_derived;
use super::preset::{ModelConfig, Preset};
use super::{hf_llama_like, llama, Architecture, Fix, GgufFacts, GgufKeys, HfConfig, HfConfigOut, HfFacts, NameTable};
use crate::transformer::{Arch, LayerAttention, LinearAttention, Stacking};

/// Qwen3.5 (dense).
pub struct Qwen3_5;

/// Qwen3.5's HF names: the Llama ones with `(1 + w)` norms and the Gated DeltaNet's.
pub static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.",
    layer: &[
        ("norm1.weight", "input_layernorm.weight", Fix::PlusOne),
        ("norm2.weight", "post_attention_layernorm.weight", Fix::PlusOne),
        ("attn.q_norm.weight", "self_attn.q_norm.weight", Fix::PlusOne),
        ("attn.k_norm.weight", "self_attn.k_norm.weight", Fix::PlusOne),
        ("linear.qkv.weight", "linear_attn.in_proj_qkv.weight", Fix::None),
        ("linear.z.weight", "linear_attn.in_proj_z.weight", Fix::None),
        ("linear.b.weight", "linear_attn.in_proj_b.weight", Fix::None),
        ("linear.a.weight", "linear_attn.in_proj_a.weight", Fix::None),
        ("linear.conv.weight", "linear_attn.conv1d.weight", Fix::Depthwise),
        ("linear.dt_bias", "linear_attn.dt_bias", Fix::None),
        ("linear.a_log", "linear_attn.A_log", Fix::None),
        ("linear.norm.weight", "linear_attn.norm.weight", Fix::None),
        ("linear.out.weight", "linear_attn.out_proj.weight", Fix::None),
    ],
    global: &[("norm_f.weight", "model.norm.weight", Fix::PlusOne)],
    extends: Some(&super::HF_LLAMA_NAMES),
};

static HF: HfFacts = HfFacts {
    model_type: "qwen3_5_text",
    class: "Qwen3_5ForCausalLM",
    names: &HF_NAMES,
    stacking: Stacking { qkv: false, gate_up: false },
    ignored: hf_derived,
    export_prefix: "",
};
static GGUF: GgufFacts = GgufFacts::named("qwen35");

/// Trained from scratch: [`preset_block`].
pub static PRESET: Preset =
    Preset { block: preset_block, tiny_kv_heads: llama::PRESET.tiny_kv_heads, tiny_d_ff: llama::PRESET.tiny_d_ff };

/// Linear layers but every fourth and the last (full attention).
fn preset_layers(n_layers: usize) -> Vec<LayerAttention> {
    (0..n_layers)
        .map(|l| if (l + 1) % 4 == 0 || l + 1 == n_layers { LayerAttention::Global } else { LayerAttention::Linear })
        .collect()
}

/// The Llama block with Qwen3.5's changes: QK-norm, a gated output, a quarter of each
/// head rotated, and Gated DeltaNet layers (query/key heads half the attention heads,
/// value heads as many, both of the attention's head width, a 4-tap convolution).
pub fn preset_block(cfg: &ModelConfig) -> Arch {
    let mut arch = llama::block(cfg, "qwen3_5");
    arch.qk_norm = true;
    arch.attn_output_gate = true;
    arch.rotary_dim = Some((arch.head_dim / 4).max(2) & !1).filter(|&r| r < arch.head_dim);
    arch.layer_attention = preset_layers(cfg.n_layers);
    arch.linear_attention = Some(LinearAttention {
        k_heads: (cfg.n_heads / 2).max(1),
        v_heads: cfg.n_heads,
        k_dim: arch.head_dim,
        v_dim: arch.head_dim,
        conv_kernel: 4,
    });
    arch
}

/// The layer kinds of a config without `layer_types`: linear but every
/// `full_attention_interval`-th (transformers' default 4).
fn interval_layers(n_layers: usize, interval: usize) -> Vec<LayerAttention> {
    (0..n_layers)
        .map(|l| if (l + 1) % interval == 0 { LayerAttention::Global } else { LayerAttention::Linear })
        .collect()
}

impl Architecture for Qwen3_5 {
    fn name(&self) -> &'static str {
        "qwen3_5"
    }

    fn hf(&self) -> &'static HfFacts {
        &HF
    }

    fn gguf(&self) -> &'static GgufFacts {
        &GGUF
    }

    fn read_hf(&self, c: &HfConfig<'_>) -> Result<Arch> {
        let mut arch = hf_llama_like(c, "qwen3_5", 1e-6)?;
        arch.qk_norm = true;
        arch.attn_output_gate = true;
        arch.layer_attention = match c.layer_types(arch.n_layers)? {
            Some(t) => t,
            None => match c.uint("full_attention_interval")? {
                Some(0) => return Err(Error::value("config.json", "'full_attention_interval'", "> 0", 0)),
                i => interval_layers(arch.n_layers, i.unwrap_or(4)),
            },
        };
        if arch.layer_attention.contains(&LayerAttention::Local) {
            return Err(Error::unsupported("config.json", "Qwen3.5 with sliding_attention layers"));
        }
        arch.linear_attention = Some(LinearAttention {
            k_heads: c.uint("linear_num_key_heads")?.unwrap_or(16),
            v_heads: c.uint("linear_num_value_heads")?.unwrap_or(32),
            k_dim: c.uint("linear_key_head_dim")?.unwrap_or(128),
            v_dim: c.uint("linear_value_head_dim")?.unwrap_or(128),
            conv_kernel: c.uint("linear_conv_kernel_dim")?.unwrap_or(4),
        });
        Ok(arch)
    }

    /// llama.cpp's `qwen35` files are not read yet: the Hugging Face checkpoint is.
    fn read_gguf(&self, _k: &GgufKeys<'_>) -> Result<Arch> {
        Err(Error::unsupported(
            "GGUF",
            "qwen35 files are not read yet (load the Hugging Face checkpoint: config.json + safetensors)",
        ))
    }

    fn write_hf(&self, arch: &Arch, c: &mut HfConfigOut) -> Result<()> {
        let la = arch
            .linear_attention
            .ok_or_else(|| Error::value("qwen3_5", "linear_attention", "the Gated DeltaNet sizes", "none"))?;
        if !(arch.qk_norm && arch.attn_output_gate) || arch.sliding_window.is_some() {
            return Err(Error::unsupported(
                "config.json",
                "a Qwen3.5 config needs QK-norm and the output gate, and has no sliding window",
            ));
        }
        c.model(&HF);
        c.llama_sizes(arch);
        c.set("hidden_act", "silu".into());
        c.set("attention_bias", arch.bias.qkv.into());
        c.set("tie_word_embeddings", arch.tied_embeddings.into());
        c.set("linear_num_key_heads", la.k_heads.into());
        c.set("linear_num_value_heads", la.v_heads.into());
        c.set("linear_key_head_dim", la.k_dim.into());
        c.set("linear_value_head_dim", la.v_dim.into());
        c.set("linear_conv_kernel_dim", la.conv_kernel.into());
        c.layer_types(arch);
        c.rope(&arch.rope)?;
        let mut params = super::hf::rope_parameters(&arch.rope)?;
        params["partial_rotary_factor"] = json!(arch.rotary_dims() as f64 / arch.head_dim as f64);
        c.set("rope_parameters", params);
        Ok(())
    }

    fn preset(&self) -> Option<&'static Preset> {
        Some(&PRESET)
    }
}
