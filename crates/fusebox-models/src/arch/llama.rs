//! Llama 2 / Llama 3.x (and SmolLM2): RMS norms, SwiGLU, rope with `rope_scaling`
//! llama3 or linear, grouped-query attention, tied or untied head. The reference the
//! other files are written as a diff of.

use fusebox::{Result, RopeStyle};

use super::{gguf_llama_like, hf_llama_like, GgufKeys, HfConfig};
use crate::transformer::Arch;

/// From an HF `config.json` (`model_type` llama).
pub fn hf(c: &HfConfig<'_>) -> Result<Arch> {
    let arch = hf_llama_like(c, "llama", 1e-6)?;
    arch.validate()?;
    Ok(arch)
}

/// From GGUF `llama.*` (or `mistral.*`) metadata. llama.cpp's converter permutes the q
/// and k rows of Llama weights so that rope pairs are adjacent (interleaved).
pub fn gguf(k: &GgufKeys<'_>) -> Result<Arch> {
    let mut arch = gguf_llama_like(k, RopeStyle::Interleaved)?;
    if let Some(w) = k.opt_size("attention.sliding_window")? {
        super::mistral::set_window(&mut arch, w);
    }
    Ok(arch)
}
