//! Qwen3: Llama with a per-head RMS norm of q and k before rope (`q_norm`, `k_norm`)
//! and an explicit `head_dim`.

use fusebox::{Result, RopeStyle};

use super::preset::Preset;
use super::{
    gguf_llama_like, hf_llama_like, hf_sliding_window_all, llama, qwen2, Architecture, GgufFacts, GgufKeys, HfConfig,
    HfConfigOut, HfFacts,
};
use crate::transformer::Arch;

/// Qwen3.
pub struct Qwen3;

static HF: HfFacts = HfFacts { model_type: "qwen3", class: "Qwen3ForCausalLM", ..HfFacts::LLAMA_LIKE };
static GGUF: GgufFacts = GgufFacts::named("qwen3");

/// Trained from scratch: the Llama block with QK-norm.
pub static PRESET: Preset = Preset {
    block: |cfg| Arch { qk_norm: true, ..llama::block(cfg, "qwen3") },
    tiny_kv_heads: llama::PRESET.tiny_kv_heads,
    tiny_d_ff: llama::PRESET.tiny_d_ff,
};

impl Architecture for Qwen3 {
    fn name(&self) -> &'static str {
        "qwen3"
    }

    fn hf(&self) -> &'static HfFacts {
        &HF
    }

    fn gguf(&self) -> &'static GgufFacts {
        &GGUF
    }

    fn read_hf(&self, c: &HfConfig<'_>) -> Result<Arch> {
        let mut arch = hf_llama_like(c, "qwen3", 1e-6)?;
        arch.qk_norm = true;
        if c.flag("use_sliding_window")?.unwrap_or(false) {
            hf_sliding_window_all(c, &mut arch)?;
        }
        Ok(arch)
    }

    /// NEOX rope: half-split pairs.
    fn read_gguf(&self, k: &GgufKeys<'_>) -> Result<Arch> {
        let mut arch = gguf_llama_like(k, RopeStyle::HalfSplit)?;
        arch.qk_norm = true;
        Ok(arch)
    }

    fn write_hf(&self, arch: &Arch, c: &mut HfConfigOut) -> Result<()> {
        c.model(&HF);
        c.llama_sizes(arch);
        c.set("hidden_act", "silu".into());
        c.set("attention_bias", arch.bias.qkv.into());
        qwen2::write_window(arch, c);
        c.rope(&arch.rope)
    }

    fn preset(&self) -> Option<&'static Preset> {
        Some(&PRESET)
    }
}
