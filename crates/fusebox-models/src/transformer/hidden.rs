//! The final-normed hidden states of a sequence, for embeddings: what the head would
//! multiply, pooled by the caller (mean or last token).

use fusebox::{ComputeBackend, DType, Result, Tensor};

use super::cache::KvCache;
use super::Transformer;

impl Transformer {
    /// Runs `ids` at positions `cache.len ..` as
    /// [`forward_cached`](Self::forward_cached) does (appending their keys and values
    /// to the caches), and returns the hidden states after the final norm instead of
    /// logits (f32, host).
    ///
    /// # Shapes
    /// `ids`: T tokens, `cache.len + T ≤ cache.capacity` → `[T, D]`.
    pub fn forward_cached_hidden(&self, b: &dyn ComputeBackend, ids: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        let h = self.forward_hidden(b, ids, cache)?;
        let h = b.to_host(&h.reshape([ids.len(), self.arch.d_model])?)?;
        if h.dtype() == DType::F32 {
            Ok(h)
        } else {
            b.cast(&h, DType::F32)
        }
    }
}
