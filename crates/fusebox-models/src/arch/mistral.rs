//! Mistral: Llama with sliding-window attention on every layer (`sliding_window`,
//! null in later versions).

use fusebox::Result;

use super::{hf_llama_like, hf_sliding_window_all, HfConfig};
use crate::transformer::{Arch, LayerAttention};

/// From an HF `config.json` (`model_type` mistral).
pub fn hf(c: &HfConfig<'_>) -> Result<Arch> {
    let mut arch = hf_llama_like(c, "mistral", 1e-6)?;
    hf_sliding_window_all(c, &mut arch)?;
    arch.validate()?;
    Ok(arch)
}

/// A window of `w` positions on every layer.
pub fn set_window(arch: &mut Arch, w: usize) {
    arch.sliding_window = Some(w);
    arch.layer_attention = vec![LayerAttention::Local; arch.n_layers];
}
