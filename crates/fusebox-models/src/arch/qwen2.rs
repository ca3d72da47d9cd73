//! Qwen2 / Qwen2.5: Llama with biases on q, k and v (not on the output projection),
//! and a window on the layers from `max_window_layers` on when `use_sliding_window`.

use fusebox::{Error, Result, RopeStyle};

use super::{gguf_llama_like, hf_llama_like, Architecture, GgufFacts, GgufKeys, HfConfig, HfConfigOut, HfFacts};
use crate::transformer::{Arch, Biases, LayerAttention};

/// Qwen2.
pub struct Qwen2;

static HF: HfFacts = HfFacts { model_type: "qwen2", class: "Qwen2ForCausalLM", ..HfFacts::LLAMA_LIKE };
static GGUF: GgufFacts = GgufFacts::named("qwen2");

/// The sliding-window fields of a Qwen `config.json` (Qwen2 and Qwen3 write them alike).
pub fn write_window(arch: &Arch, c: &mut HfConfigOut) {
    let window = arch.sliding_window;
    c.set("use_sliding_window", window.is_some().into());
    c.set("sliding_window", window.into());
    // Layers from `max_window_layers` on use the window.
    let first_local = arch.layer_attention.iter().position(|a| *a == LayerAttention::Local);
    c.set("max_window_layers", first_local.unwrap_or(arch.n_layers).into());
    c.layer_types(arch);
}

impl Architecture for Qwen2 {
    fn name(&self) -> &'static str {
        "qwen2"
    }

    fn hf(&self) -> &'static HfFacts {
        &HF
    }

    fn gguf(&self) -> &'static GgufFacts {
        &GGUF
    }

    fn read_hf(&self, c: &HfConfig<'_>) -> Result<Arch> {
        let mut arch = hf_llama_like(c, "qwen2", 1e-6)?;
        arch.bias = Biases { qkv: true, ..Biases::default() };
        if c.flag("use_sliding_window")?.unwrap_or(false) {
            let w = c.uint("sliding_window")?.filter(|&w| w > 0).ok_or_else(|| {
                Error::Io("config.json: use_sliding_window is true but 'sliding_window' is not a size > 0".into())
            })?;
            // Layers from `max_window_layers` on use the window (transformers' Qwen2).
            let from = c.uint("max_window_layers")?.unwrap_or(arch.n_layers);
            arch.sliding_window = Some(w);
            arch.layer_attention = match c.layer_types(arch.n_layers)? {
                Some(t) => t,
                None => (0..arch.n_layers)
                    .map(|l| if l >= from { LayerAttention::Local } else { LayerAttention::Global })
                    .collect(),
            };
        }
        Ok(arch)
    }

    /// llama.cpp's NEOX rope: half-split pairs.
    fn read_gguf(&self, k: &GgufKeys<'_>) -> Result<Arch> {
        let mut arch = gguf_llama_like(k, RopeStyle::HalfSplit)?;
        arch.bias = Biases { qkv: true, ..Biases::default() };
        Ok(arch)
    }

    fn write_hf(&self, arch: &Arch, c: &mut HfConfigOut) -> Result<()> {
        c.model(&HF);
        c.llama_sizes(arch);
        c.set("hidden_act", "silu".into());
        write_window(arch, c);
        c.rope(&arch.rope)
    }
}
