//! Gemma 3 (text): embeddings × √d_model; four norms per block (before and after both
//! attention and the MLP) of Gemma's `(1 + w)` RMS form; per-head QK-norm; GeGLU with
//! the tanh GELU; attention scale `query_pre_attn_scalar^−½`; local sliding-window
//! layers with their own rope base and a global layer every `sliding_window_pattern`;
//! tied head.
//!
//! HF stores the norm weights as `w` (the model computes `1 + w`): the 1 is added at
//! load, as llama.cpp's converter does for GGUF, so the block runs a plain RMS norm.

use fusebox::{Error, Result, RopeStyle};

use super::{gguf_llama_like, hf_sizes, Fix, GgufKeys, HfConfig, NameTable, Plan};
use crate::transformer::{Arch, LayerAttention, Mlp, Rope, RopeScaling, Stacking};

/// Gemma 3's HF names (every norm stored as `w` of `1 + w`).
pub static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.",
    layer: &[
        ("norm1.weight", "input_layernorm.weight", Fix::PlusOne),
        ("attn.q.weight", "self_attn.q_proj.weight", Fix::None),
        ("attn.q.bias", "self_attn.q_proj.bias", Fix::None),
        ("attn.k.weight", "self_attn.k_proj.weight", Fix::None),
        ("attn.k.bias", "self_attn.k_proj.bias", Fix::None),
        ("attn.v.weight", "self_attn.v_proj.weight", Fix::None),
        ("attn.v.bias", "self_attn.v_proj.bias", Fix::None),
        ("attn.q_norm.weight", "self_attn.q_norm.weight", Fix::PlusOne),
        ("attn.k_norm.weight", "self_attn.k_norm.weight", Fix::PlusOne),
        ("attn.o.weight", "self_attn.o_proj.weight", Fix::None),
        ("attn.o.bias", "self_attn.o_proj.bias", Fix::None),
        ("post_attn_norm.weight", "post_attention_layernorm.weight", Fix::PlusOne),
        ("norm2.weight", "pre_feedforward_layernorm.weight", Fix::PlusOne),
        ("mlp.gate.weight", "mlp.gate_proj.weight", Fix::None),
        ("mlp.up.weight", "mlp.up_proj.weight", Fix::None),
        ("mlp.down.weight", "mlp.down_proj.weight", Fix::None),
        ("post_mlp_norm.weight", "post_feedforward_layernorm.weight", Fix::PlusOne),
    ],
    global: &[
        ("wte", "model.embed_tokens.weight", Fix::None),
        ("norm_f.weight", "model.norm.weight", Fix::PlusOne),
        ("lm_head.weight", "lm_head.weight", Fix::None),
    ],
};

/// Local layers: all but every `pattern`-th (`(l + 1) % pattern == 0` is global).
fn pattern_layers(n_layers: usize, pattern: usize) -> Vec<LayerAttention> {
    (0..n_layers).map(|l| if (l + 1) % pattern == 0 { LayerAttention::Global } else { LayerAttention::Local }).collect()
}

/// What Gemma 3 changes in a Llama-shaped description.
fn gemma(mut arch: Arch, window: usize, layers: Vec<LayerAttention>, local: Rope, scalar: f64) -> Arch {
    arch.post_norms = true;
    arch.qk_norm = true;
    arch.mlp = Mlp::GeGlu;
    arch.embed_scale = (arch.d_model as f32).sqrt();
    arch.attn_scale = (1.0 / scalar.sqrt()) as f32;
    arch.sliding_window = Some(window);
    arch.layer_attention = layers;
    arch.rope_local = Some(local);
    arch
}

/// From an HF `config.json` (`model_type` gemma3_text).
pub fn hf(c: &HfConfig<'_>) -> Result<Arch> {
    let act = c.string("hidden_activation")?.or(c.string("hidden_act")?).unwrap_or("gelu_pytorch_tanh");
    if !matches!(act, "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast") {
        return Err(Error::unsupported(
            "config.json",
            format!("Gemma 3 hidden_activation '{act}' (only the tanh GELU: gelu_pytorch_tanh)"),
        ));
    }
    for option in ["final_logit_softcapping", "attn_logit_softcapping"] {
        c.refuse(option)?;
    }
    if c.flag("use_bidirectional_attention")?.unwrap_or(false) {
        return Err(Error::unsupported("config.json", "use_bidirectional_attention = true"));
    }
    let mut arch = hf_sizes(c, "gemma3", 1e-6)?;
    arch.tied_embeddings = c.flag("tie_word_embeddings")?.unwrap_or(true);
    arch.rope = c.rope(Some("full_attention"), 1_000_000.0)?;
    let local = match c.field("rope_parameters").and_then(|p| p.get("sliding_attention")) {
        Some(_) => c.rope(Some("sliding_attention"), 10_000.0)?,
        None => Rope::plain(c.float("rope_local_base_freq")?.unwrap_or(10_000.0), RopeStyle::HalfSplit),
    };
    let window = c
        .uint("sliding_window")?
        .filter(|&w| w > 0)
        .ok_or_else(|| Error::Io("config.json: Gemma 3 needs 'sliding_window' (a size > 0)".into()))?;
    let layers = match c.layer_types(arch.n_layers)? {
        Some(t) => t,
        None => {
            let pattern = match c.uint("sliding_window_pattern")?.or(c.uint("_sliding_window_pattern")?) {
                Some(0) => return Err(Error::value("config.json", "'sliding_window_pattern'", "> 0", 0)),
                Some(p) => p,
                None => 6,
            };
            pattern_layers(arch.n_layers, pattern)
        }
    };
    let scalar = c.float("query_pre_attn_scalar")?.unwrap_or(arch.head_dim as f64);
    if !(scalar > 0.0 && scalar.is_finite()) {
        return Err(Error::value("config.json", "'query_pre_attn_scalar'", "a finite value > 0", scalar));
    }
    let arch = gemma(arch, window, layers, local, scalar);
    arch.validate()?;
    Ok(arch)
}

/// The plan of an HF Gemma 3 checkpoint.
pub fn hf_plan(c: &HfConfig<'_>) -> Result<Plan> {
    Ok(Plan {
        arch: hf(c)?,
        names: &HF_NAMES,
        prefix: String::new(),
        file_stacking: Stacking::default(),
        ignored: super::hf_ignored,
    })
}

/// From GGUF `gemma3.*` metadata, as llama.cpp reads it: local layers everywhere but
/// every sixth, their rope base 10000, the global base `rope.freq_base` (with the
/// file's scaling); the attention scale `1/sqrt(key_length)`, except the 27B model
/// (62 layers), which uses `1/sqrt(d_model / heads)`.
pub fn gguf(k: &GgufKeys<'_>) -> Result<Arch> {
    let arch = gguf_llama_like(k, RopeStyle::HalfSplit)?;
    let window = k.size("attention.sliding_window")?;
    let layers = pattern_layers(arch.n_layers, 6);
    let local = Rope { theta: 10_000.0, scaling: RopeScaling::None, style: RopeStyle::HalfSplit };
    let scalar = if arch.n_layers == 62 { (arch.d_model / arch.n_heads) as f64 } else { arch.head_dim as f64 };
    Ok(gemma(arch, window, layers, local, scalar))
}
