//! Autoregressive generation: prefill the prompt through the KV cache, then one token
//! at a time through `decode_attention`, sampling each next token.

use fusebox::{ComputeBackend, Error, Result};

use crate::model::Model;
use crate::sampler::Sampler;

/// Generates up to `max_new` tokens after `prompt`, stopping after any token in `stop`
/// (which is returned). `on_token` sees each new token as it comes.
pub fn generate(
    model: &Model,
    b: &dyn ComputeBackend,
    prompt: &[u32],
    max_new: usize,
    sampler: &mut Sampler,
    stop: &[u32],
    mut on_token: impl FnMut(u32) -> Result<()>,
) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        return Err(Error::value("generate", "prompt", "at least one token", 0));
    }
    let vocab = model.config.vocab_size as u32;
    if let Some(&bad) = prompt.iter().find(|&&t| t >= vocab) {
        return Err(Error::value("generate", "prompt token", format!("< vocab size {vocab}"), bad));
    }
    let capacity = (prompt.len() + max_new).min(model.config.max_seq);
    if prompt.len() > capacity {
        return Err(Error::value(
            "generate",
            "prompt length",
            format!("≤ context {}", model.config.max_seq),
            prompt.len(),
        ));
    }
    let mut cache = model.new_cache(b, capacity)?;
    let mut logits = model.forward_cached(b, prompt, &mut cache)?;
    let mut seen = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..max_new {
        let next = sampler.sample(&logits, &seen)?;
        out.push(next);
        seen.push(next);
        on_token(next)?;
        if stop.contains(&next) || cache.len >= capacity {
            break;
        }
        logits = model.forward_cached(b, &[next], &mut cache)?;
    }
    Ok(out)
}
