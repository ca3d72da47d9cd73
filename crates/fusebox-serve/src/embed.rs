//! `/v1/embeddings` on the model thread: each input's final-normed hidden states
//! ([`forward_cached_hidden`](fusebox_models::transformer::Transformer::forward_cached_hidden)),
//! pooled over its tokens (the mean by default, or the last token's, as
//! Qwen3-Embedding pools) and L2-normalised.
//!
//! An input runs in its own sequence (a cache of `--ctx-size` positions kept for
//! embeddings), read in chunks of `--prefill-chunk` tokens; a request's inputs are
//! computed together between two decode steps of the running generations.

use std::sync::atomic::Ordering;
use std::time::Instant;

use fusebox::ComputeBackend;
use fusebox_models::pretrained::Pretrained;
use fusebox_models::transformer::KvCache;

use crate::engine::EngineConfig;
use crate::metrics::Metrics;
use crate::openai::ApiError;

/// How an input's hidden states become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over the input's tokens.
    Mean,
    /// The last token's (for models trained to put the summary there).
    Last,
}

/// An embeddings request for the model thread.
#[derive(Debug)]
pub struct EmbedJob {
    /// Each input's token ids (1 ..= ctx each).
    pub inputs: Vec<Vec<u32>>,
    /// The pooling.
    pub pooling: Pooling,
    /// Where the unit vectors go, one per input in order.
    pub reply: tokio::sync::oneshot::Sender<Result<Vec<Vec<f32>>, ApiError>>,
}

/// Computes a request's embeddings and sends them (or why not).
pub fn run(
    model: &Pretrained,
    b: &dyn ComputeBackend,
    config: &EngineConfig,
    cache: &mut Option<KvCache>,
    job: EmbedJob,
    m: &Metrics,
) {
    if job.reply.is_closed() {
        return;
    }
    let result = embed_all(model, b, config, cache, &job.inputs, job.pooling, m);
    let _ = job.reply.send(result);
}

fn embed_all(
    model: &Pretrained,
    b: &dyn ComputeBackend,
    config: &EngineConfig,
    cache: &mut Option<KvCache>,
    inputs: &[Vec<u32>],
    pooling: Pooling,
    m: &Metrics,
) -> Result<Vec<Vec<f32>>, ApiError> {
    let failed = |e: fusebox::Error| ApiError::internal(format!("embedding failed: {e}"));
    let cache = match cache {
        Some(c) => c,
        None => cache.insert(model.network.new_cache_of(b, config.ctx_size, config.cache_type).map_err(failed)?),
    };
    let d = model.network.arch.d_model;
    let mut out = Vec::with_capacity(inputs.len());
    for ids in inputs {
        cache.clear();
        let mut pooled = vec![0f64; d];
        for chunk in ids.chunks(config.prefill_chunk.max(1)) {
            let start = Instant::now();
            let h = model.network.forward_cached_hidden(b, chunk, cache).map_err(failed)?;
            m.add_prefill(chunk.len(), start.elapsed());
            let h = h.to_vec::<f32>().map_err(failed)?;
            match pooling {
                Pooling::Mean => {
                    for row in h.chunks_exact(d) {
                        pooled.iter_mut().zip(row).for_each(|(p, &x)| *p += f64::from(x));
                    }
                }
                Pooling::Last => {
                    let last = &h[h.len() - d..];
                    pooled.iter_mut().zip(last).for_each(|(p, &x)| *p = f64::from(x));
                }
            }
        }
        out.push(normalize(&pooled));
        m.embedding_inputs.fetch_add(1, Ordering::Relaxed);
    }
    Ok(out)
}

/// `v / ‖v‖₂` (the mean's 1/T cancels); a zero vector stays zero.
fn normalize(v: &[f64]) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let scale = if norm > 0.0 && norm.is_finite() { 1.0 / norm } else { 0.0 };
    v.iter().map(|x| (x * scale) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_gives_unit_vectors() {
        let v = normalize(&[3.0, 4.0]);
        assert_eq!(v, [0.6, 0.8]);
        assert_eq!(normalize(&[0.0, 0.0]), [0.0, 0.0]);
    }
}
