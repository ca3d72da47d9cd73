//! Qwen3: Llama with a per-head RMS norm of q and k before rope (`q_norm`, `k_norm`)
//! and an explicit `head_dim`.

use fusebox::{Result, RopeStyle};

use super::{gguf_llama_like, hf_llama_like, hf_sliding_window_all, GgufKeys, HfConfig};
use crate::transformer::Arch;

/// From an HF `config.json` (`model_type` qwen3).
pub fn hf(c: &HfConfig<'_>) -> Result<Arch> {
    let mut arch = hf_llama_like(c, "qwen3", 1e-6)?;
    arch.qk_norm = true;
    if c.flag("use_sliding_window")?.unwrap_or(false) {
        hf_sliding_window_all(c, &mut arch)?;
    }
    arch.validate()?;
    Ok(arch)
}

/// From GGUF `qwen3.*` metadata (NEOX rope: half-split pairs).
pub fn gguf(k: &GgufKeys<'_>) -> Result<Arch> {
    let mut arch = gguf_llama_like(k, RopeStyle::HalfSplit)?;
    arch.qk_norm = true;
    Ok(arch)
}
