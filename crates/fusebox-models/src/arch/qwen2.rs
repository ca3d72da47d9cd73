//! Qwen2 / Qwen2.5: Llama with biases on q, k and v (not on the output projection).

use fusebox::{Error, Result, RopeStyle};

use super::{gguf_llama_like, hf_llama_like, GgufKeys, HfConfig};
use crate::transformer::{Arch, Biases, LayerAttention};

/// From an HF `config.json` (`model_type` qwen2).
pub fn hf(c: &HfConfig<'_>) -> Result<Arch> {
    let mut arch = hf_llama_like(c, "qwen2", 1e-6)?;
    arch.bias = Biases { qkv: true, o: false, mlp: false };
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
    arch.validate()?;
    Ok(arch)
}

/// From GGUF `qwen2.*` metadata (llama.cpp's NEOX rope: half-split pairs).
pub fn gguf(k: &GgufKeys<'_>) -> Result<Arch> {
    let mut arch = gguf_llama_like(k, RopeStyle::HalfSplit)?;
    arch.bias = Biases { qkv: true, o: false, mlp: false };
    Ok(arch)
}
