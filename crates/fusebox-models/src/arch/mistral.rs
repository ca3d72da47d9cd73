//! Mistral: Llama with sliding-window attention on every layer (`sliding_window`,
//! null in later versions). llama.cpp runs it as `llama`.

use fusebox::Result;

use super::llama::Llama;
use super::{hf_llama_like, hf_sliding_window_all, Architecture, GgufFacts, GgufKeys, HfConfig, HfConfigOut, HfFacts};
use crate::transformer::{Arch, LayerAttention};

/// Mistral.
pub struct Mistral;

static HF: HfFacts = HfFacts { model_type: "mistral", class: "MistralForCausalLM", ..HfFacts::LLAMA_LIKE };
static GGUF: GgufFacts = GgufFacts { export_as: "llama", ..GgufFacts::named("mistral") };

/// A window of `w` positions on every layer.
pub fn set_window(arch: &mut Arch, w: usize) {
    arch.sliding_window = Some(w);
    arch.layer_attention = vec![LayerAttention::Local; arch.n_layers];
}

impl Architecture for Mistral {
    fn name(&self) -> &'static str {
        "mistral"
    }

    fn hf(&self) -> &'static HfFacts {
        &HF
    }

    fn gguf(&self) -> &'static GgufFacts {
        &GGUF
    }

    fn read_hf(&self, c: &HfConfig<'_>) -> Result<Arch> {
        let mut arch = hf_llama_like(c, "mistral", 1e-6)?;
        hf_sliding_window_all(c, &mut arch)?;
        Ok(arch)
    }

    fn read_gguf(&self, k: &GgufKeys<'_>) -> Result<Arch> {
        Llama.read_gguf(k)
    }

    fn write_hf(&self, arch: &Arch, c: &mut HfConfigOut) -> Result<()> {
        c.model(&HF);
        c.llama_sizes(arch);
        c.set("hidden_act", "silu".into());
        c.set("sliding_window", arch.sliding_window.into());
        if arch.sliding_window.is_some() {
            c.layer_types(arch);
        }
        c.rope(&arch.rope)
    }
}
