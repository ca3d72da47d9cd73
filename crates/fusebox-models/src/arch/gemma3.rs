//! Gemma 3 (text): embeddings × √d_model; four norms per block (before and after both
//! attention and the MLP) of Gemma's `(1 + w)` RMS form; per-head QK-norm; GeGLU with
//! the tanh GELU; attention scale `query_pre_attn_scalar^−½`; local sliding-window
//! layers with their own rope base and a global layer every `sliding_window_pattern`;
//! tied head.
//!
//! HF stores the norm weights as `w` (the model computes `1 + w`): the 1 is added at
//! load, as llama.cpp's converter does for GGUF, so the block runs a plain RMS norm.

use fusebox::{Error, Result, RopeStyle};

use super::names::hf_derived;
use super::preset::{ModelConfig, Preset};
use super::{
    gguf, gguf_llama_like, hf_sizes, llama, Architecture, Fix, GgufFacts, GgufKeys, GgufMetaOut, HfConfig, HfConfigOut,
    HfFacts, NameTable,
};
use crate::transformer::{Arch, LayerAttention, Mlp, Rope, RopeScaling, Stacking};

/// Gemma 3 (text).
pub struct Gemma3;

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
    extends: None,
};

static HF: HfFacts = HfFacts {
    model_type: "gemma3_text",
    class: "Gemma3ForCausalLM",
    names: &HF_NAMES,
    stacking: Stacking { qkv: false, gate_up: false },
    ignored: hf_derived,
    export_prefix: "",
};
static GGUF: GgufFacts = GgufFacts::named("gemma3");

/// Trained from scratch: [`preset_block`].
pub static PRESET: Preset =
    Preset { block: preset_block, tiny_kv_heads: llama::PRESET.tiny_kv_heads, tiny_d_ff: llama::PRESET.tiny_d_ff };

/// The Llama block with Gemma's changes, local layers (a window of half the context,
/// rope base 10000) alternating with global ones (every second layer, rope base
/// `rope_theta`); the attention scale stays `1/sqrt(head_dim)`.
pub fn preset_block(cfg: &ModelConfig) -> Arch {
    let mut arch = llama::block(cfg, "gemma3");
    arch.qk_norm = true;
    arch.post_norms = true;
    arch.mlp = Mlp::GeGlu;
    arch.embed_scale = (cfg.d_model as f32).sqrt();
    arch.sliding_window = Some(cfg.max_seq.div_ceil(2));
    arch.layer_attention =
        (0..cfg.n_layers).map(|l| if l % 2 == 1 { LayerAttention::Global } else { LayerAttention::Local }).collect();
    arch.rope_local = Some(Rope::plain(10_000.0, RopeStyle::HalfSplit));
    arch
}

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

impl Architecture for Gemma3 {
    fn name(&self) -> &'static str {
        "gemma3"
    }

    fn hf(&self) -> &'static HfFacts {
        &HF
    }

    fn gguf(&self) -> &'static GgufFacts {
        &GGUF
    }

    fn read_hf(&self, c: &HfConfig<'_>) -> Result<Arch> {
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
        Ok(gemma(arch, window, layers, local, scalar))
    }

    /// As llama.cpp reads it: local layers everywhere but every sixth, their rope base
    /// 10000, the global base `rope.freq_base` (with the file's scaling); the attention
    /// scale `1/sqrt(key_length)`, except the 27B model (62 layers), which uses
    /// `1/sqrt(d_model / heads)`.
    fn read_gguf(&self, k: &GgufKeys<'_>) -> Result<Arch> {
        let arch = gguf_llama_like(k, RopeStyle::HalfSplit)?;
        let window = k.size("attention.sliding_window")?;
        let layers = pattern_layers(arch.n_layers, 6);
        let local = Rope { theta: 10_000.0, scaling: RopeScaling::None, style: RopeStyle::HalfSplit };
        let scalar = if arch.n_layers == 62 { (arch.d_model / arch.n_heads) as f64 } else { arch.head_dim as f64 };
        Ok(gemma(arch, window, layers, local, scalar))
    }

    fn write_hf(&self, arch: &Arch, c: &mut HfConfigOut) -> Result<()> {
        c.model(&HF);
        c.llama_sizes(arch);
        c.set("hidden_activation", "gelu_pytorch_tanh".into());
        let scalar = 1.0 / (f64::from(arch.attn_scale) * f64::from(arch.attn_scale));
        let rounded = scalar.round();
        // transformers types it as an integer.
        if (scalar - rounded).abs() < 1e-3 * rounded.max(1.0) {
            c.set("query_pre_attn_scalar", (rounded as u64).into());
        } else {
            c.set("query_pre_attn_scalar", scalar.into());
        }
        c.set("sliding_window", arch.sliding_window.into());
        c.layer_types(arch);
        c.set("final_logit_softcapping", serde_json::Value::Null);
        c.set("attn_logit_softcapping", serde_json::Value::Null);
        let local = arch.rope_local.clone().unwrap_or_else(|| arch.rope.clone());
        c.set("rope_local_base_freq", local.theta.into());
        c.rope(&arch.rope)?;
        // transformers 5 keeps one rope per layer type.
        c.set(
            "rope_parameters",
            serde_json::json!({"full_attention": super::hf::rope_parameters(&arch.rope)?,
                               "sliding_attention": super::hf::rope_parameters(&local)?}),
        );
        Ok(())
    }

    /// llama.cpp's converter writes the head size of every Gemma 3.
    fn write_gguf(&self, arch: &Arch, m: &mut GgufMetaOut) -> Result<()> {
        m.size("attention.head_count_kv", "n_kv_heads", arch.n_kv_heads)?;
        gguf::write_head_size(arch, m)
    }

    fn preset(&self) -> Option<&'static Preset> {
        Some(&PRESET)
    }
}
