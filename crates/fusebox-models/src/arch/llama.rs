//! Llama 2 / Llama 3.x (and SmolLM2): RMS norms, SwiGLU, rope with `rope_scaling`
//! llama3 or linear, grouped-query attention, tied or untied head. The reference the
//! other files are written as a diff of.

use fusebox::{Result, RopeStyle};

use super::preset::{ModelConfig, Preset};
use super::{gguf_llama_like, hf_llama_like, Architecture, GgufFacts, GgufKeys, HfConfig, HfConfigOut, HfFacts};
use crate::transformer::{Arch, Biases, LayerAttention, Mlp, NormKind, Positions, Rope};

/// Llama.
pub struct Llama;

static HF: HfFacts = HfFacts { model_type: "llama", class: "LlamaForCausalLM", ..HfFacts::LLAMA_LIKE };
static GGUF: GgufFacts = GgufFacts::named("llama");

/// Trained from scratch: the block of [`block`] named `llama`; 2 key/value heads and an
/// MLP of 352 (≈ 8/3 · 128, as SwiGLU keeps the parameter count of a 4× GELU MLP) in
/// [`ModelConfig::tiny`].
pub static PRESET: Preset = Preset { block: |cfg| block(cfg, "llama"), tiny_kv_heads: 2, tiny_d_ff: 352 };

/// The Llama block of `cfg`'s sizes under `name`: RMS norms, SwiGLU, half-split rope of
/// base `rope_theta`, no biases, every layer global.
pub fn block(cfg: &ModelConfig, name: &str) -> Arch {
    Arch {
        name: name.to_string(),
        vocab_size: cfg.vocab_size,
        n_layers: cfg.n_layers,
        d_model: cfg.d_model,
        n_heads: cfg.n_heads,
        n_kv_heads: cfg.n_kv_heads,
        head_dim: cfg.head_dim(),
        d_ff: cfg.d_ff,
        context_length: cfg.max_seq,
        norm: NormKind::Rms,
        norm_eps: cfg.norm_eps,
        post_norms: false,
        qk_norm: false,
        qk_norm_whole: false,
        mlp: Mlp::SwiGlu,
        positions: Positions::Rope,
        rope: Rope::plain(f64::from(cfg.rope_theta), RopeStyle::HalfSplit),
        rope_local: None,
        sliding_window: None,
        layer_attention: vec![LayerAttention::Global; cfg.n_layers],
        bias: Biases::default(),
        attn_scale: 1.0 / (cfg.head_dim() as f32).sqrt(),
        embed_scale: 1.0,
        tied_embeddings: cfg.tied_embeddings,
        attn_sinks: false,
        moe: None,
        linear_attention: None,
        attn_output_gate: false,
        rotary_dim: None,
    }
}

impl Architecture for Llama {
    fn name(&self) -> &'static str {
        "llama"
    }

    fn hf(&self) -> &'static HfFacts {
        &HF
    }

    fn gguf(&self) -> &'static GgufFacts {
        &GGUF
    }

    fn read_hf(&self, c: &HfConfig<'_>) -> Result<Arch> {
        hf_llama_like(c, "llama", 1e-6)
    }

    /// llama.cpp's converter permutes the q and k rows of Llama weights so that rope
    /// pairs are adjacent (interleaved); a window makes it Mistral, experts Mixtral
    /// (`llama.expert_count`, renormalised softmax routing).
    fn read_gguf(&self, k: &GgufKeys<'_>) -> Result<Arch> {
        let mut arch = gguf_llama_like(k, RopeStyle::Interleaved)?;
        if let Some(w) = k.opt_size("attention.sliding_window")? {
            super::mistral::set_window(&mut arch, w);
        }
        if let Some(moe) = super::moe::gguf_moe(k, super::mixtral::NORMALIZED_IN_LLAMA_CPP)? {
            arch.name = "mixtral".into();
            arch.moe = Some(moe);
        }
        Ok(arch)
    }

    fn write_hf(&self, arch: &Arch, c: &mut HfConfigOut) -> Result<()> {
        // A Llama with experts is Mixtral in transformers, with a window Mistral.
        if arch.moe.is_some() {
            return super::mixtral::Mixtral.write_hf(arch, c);
        }
        if arch.sliding_window.is_some() {
            return super::mistral::Mistral.write_hf(arch, c);
        }
        c.model(&HF);
        c.llama_sizes(arch);
        c.set("hidden_act", "silu".into());
        c.set("attention_bias", arch.bias.qkv.into());
        c.set("mlp_bias", arch.bias.mlp.into());
        c.set("pretraining_tp", 1.into());
        c.rope(&arch.rope)
    }

    fn preset(&self) -> Option<&'static Preset> {
        Some(&PRESET)
    }
}
