//! Phi-3: Llama with q, k, v in one `qkv_proj` matrix and gate, up in one
//! `gate_up_proj` (gate first); an optional sliding window on every layer.

use fusebox::{Error, Result, RopeStyle};

use super::{gguf_llama_like, hf_llama_like, hf_sliding_window_all, Fix, GgufKeys, HfConfig, NameTable, Plan};
use crate::transformer::{Arch, Stacking};

/// Phi-3's HF names.
pub static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.",
    layer: &[
        ("norm1.weight", "input_layernorm.weight", Fix::None),
        ("attn.qkv.weight", "self_attn.qkv_proj.weight", Fix::None),
        ("attn.o.weight", "self_attn.o_proj.weight", Fix::None),
        ("norm2.weight", "post_attention_layernorm.weight", Fix::None),
        ("mlp.gate_up.weight", "mlp.gate_up_proj.weight", Fix::None),
        ("mlp.down.weight", "mlp.down_proj.weight", Fix::None),
    ],
    global: &[
        ("wte", "model.embed_tokens.weight", Fix::None),
        ("norm_f.weight", "model.norm.weight", Fix::None),
        ("lm_head.weight", "lm_head.weight", Fix::None),
    ],
};

/// From an HF `config.json` (`model_type` phi3).
pub fn hf(c: &HfConfig<'_>) -> Result<Arch> {
    let mut arch = hf_llama_like(c, "phi3", 1e-5)?;
    if let Some(f) = c.float("partial_rotary_factor")? {
        if f != 1.0 {
            return Err(Error::unsupported("config.json", format!("partial_rotary_factor {f} (only 1.0)")));
        }
    }
    hf_sliding_window_all(c, &mut arch)?;
    arch.validate()?;
    Ok(arch)
}

/// The plan of an HF Phi-3 checkpoint.
pub fn hf_plan(c: &HfConfig<'_>) -> Result<Plan> {
    Ok(Plan {
        arch: hf(c)?,
        names: &HF_NAMES,
        prefix: String::new(),
        file_stacking: Stacking { qkv: true, gate_up: true },
        ignored: super::hf_ignored,
    })
}

/// From GGUF `phi3.*` metadata (NEOX rope; `attn_qkv`, and `ffn_up` holding gate and up).
pub fn gguf(k: &GgufKeys<'_>) -> Result<Arch> {
    let mut arch = gguf_llama_like(k, RopeStyle::HalfSplit)?;
    if let Some(w) = k.opt_size("attention.sliding_window")? {
        super::mistral::set_window(&mut arch, w);
    }
    Ok(arch)
}
