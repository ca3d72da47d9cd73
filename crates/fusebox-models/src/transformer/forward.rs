//! The forward entry points: training (activations saved for [`Transformer::backward`])
//! and one sequence over its KV cache (a prompt, then one token at a time). Both embed
//! the tokens and run every [`block`](super::block) in a [`Pass`].

use fusebox::{ComputeBackend, DType, Error, NormOutput, Result, Tensor};

use super::cache::{KvCache, RopeTables};
use super::checkpointing::{Keep, SavedLayers};
use super::pass::Pass;
use super::Transformer;

/// What the training forward keeps for [`Transformer::backward`].
#[derive(Debug)]
pub struct ForwardCache {
    pub(super) ids: Tensor,
    pub(super) batch: usize,
    pub(super) seq: usize,
    pub(super) rope: RopeTables,
    pub(super) layers: SavedLayers,
    pub(super) x_final: Tensor,
    pub(super) norm_f: NormOutput,
}

impl Transformer {
    /// Token (and learned position) embeddings of `ids` `[B, T]` at the pass's
    /// positions → `[B, T, D]` f32.
    pub(super) fn embed(&self, b: &dyn ComputeBackend, ids: &Tensor, pass: &Pass<'_, '_>) -> Result<Tensor> {
        let mut x = b.embedding(ids, self.p(self.index.embed))?;
        if x.dtype() != DType::F32 {
            x = b.cast(&x, DType::F32)?;
        }
        if self.arch.embed_scale != 1.0 {
            x = b.mul_scalar(&x, self.arch.embed_scale)?;
        }
        match self.index.pos_embed {
            Some(wpe) => pass.add_positions(b, &x, self.p(wpe)),
            None => Ok(x),
        }
    }

    /// The embedded input `x` through every block this model holds: the last block's
    /// output and its next norm (the final norm on the last stage).
    pub(super) fn blocks(
        &self,
        b: &dyn ComputeBackend,
        x: Tensor,
        pass: &mut Pass<'_, '_>,
    ) -> Result<(Tensor, NormOutput)> {
        let h = self.norm(b, &x, self.stage_entry_norm())?;
        self.stage_blocks(b, x, h, pass)
    }

    fn check_ids(&self, op: &'static str, ids: &Tensor, limit: usize) -> Result<(usize, usize)> {
        if ids.rank() != 2 || ids.dtype() != DType::U32 {
            return Err(Error::shape(op, "ids", "[batch, seq] u32", format!("{} {}", ids.shape(), ids.dtype())));
        }
        let (bsz, t) = (ids.dims()[0], ids.dims()[1]);
        if t == 0 || t > limit {
            return Err(Error::value(op, "sequence length", format!("1..={limit} positions"), format!("{t} tokens")));
        }
        Ok((bsz, t))
    }

    /// Training forward: logits `[B·T, V]` for ids `[B, T]`, and what the backward needs.
    pub fn forward(&self, b: &dyn ComputeBackend, ids: &Tensor) -> Result<(Tensor, ForwardCache)> {
        let cache = self.forward_trunk(b, ids, Keep::All)?;
        let h = cache.norm_f.output.reshape([cache.batch * cache.seq, self.arch.d_model])?;
        let logits = self.linear(b, &h, self.index.head_weight(), None)?;
        Ok((logits, cache))
    }

    /// The training forward up to the final norm (the head's input is
    /// `cache.norm_f.output`), keeping of each block what `keep` says.
    pub(super) fn forward_trunk(&self, b: &dyn ComputeBackend, ids: &Tensor, keep: Keep) -> Result<ForwardCache> {
        const OP: &str = "Transformer::forward";
        self.check_trainable(OP)?;
        self.check_whole(OP)?;
        let (bsz, t) = self.check_ids(OP, ids, self.arch.context_length)?;
        let rope = RopeTables::new(b, &self.arch, t)?;
        let mut saved = SavedLayers::new(keep, self.arch.n_layers);
        let mut pass = Pass::Train { rope: &rope, saved: &mut saved };
        let x = self.embed(b, ids, &pass)?;
        let (x_final, norm_f) = self.blocks(b, x, &mut pass)?;
        Ok(ForwardCache { ids: ids.clone(), batch: bsz, seq: t, rope, layers: saved, x_final, norm_f })
    }

    /// Runs `ids` at positions `cache.len ..`, appending their keys and values to the
    /// caches; returns the final-normed hidden states `[1, T, D]`.
    pub(super) fn forward_hidden(&self, b: &dyn ComputeBackend, ids: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        const OP: &str = "Transformer::forward_cached";
        self.check_whole(OP)?;
        self.prepare_cached_pass(OP, b, ids.len(), cache)?;
        self.check_vocab(OP, ids)?;
        Ok(self.forward_stage(b, super::StageInput::Tokens(ids), cache)?.h)
    }

    /// An error naming the first id outside the vocabulary.
    pub(super) fn check_vocab(&self, op: &'static str, ids: &[u32]) -> Result<()> {
        match ids.iter().find(|&&id| id as usize >= self.arch.vocab_size) {
            Some(&bad) => Err(Error::value(op, "token id", format!("< vocab size {}", self.arch.vocab_size), bad)),
            None => Ok(()),
        }
    }

    /// The head over the final-normed hidden rows `h` `[.., D]` → logits `[rows, V]`
    /// (f32, host).
    pub(super) fn logits_to_host(&self, b: &dyn ComputeBackend, h: &Tensor) -> Result<Tensor> {
        let rows = h.elem_count() / self.arch.d_model.max(1);
        let logits = self.linear(b, &h.reshape([rows, self.arch.d_model])?, self.index.head_weight(), None)?;
        b.to_host(&logits)
    }

    /// Runs `ids` at positions `cache.len ..`, appending their keys and values to the
    /// caches; returns the logits of the last position `[V]` (f32, host).
    ///
    /// # Shapes
    /// `ids`: T tokens, `cache.len + T ≤ cache.capacity` → `[V]`.
    pub fn forward_cached(&self, b: &dyn ComputeBackend, ids: &[u32], cache: &mut KvCache) -> Result<Vec<f32>> {
        let h = self.forward_hidden(b, ids, cache)?;
        let t = ids.len();
        let last = b.slice_rows(&h.reshape([t, self.arch.d_model])?, t - 1, 1)?;
        self.logits_to_host(b, &last)?.to_vec::<f32>()
    }

    /// As [`forward_cached`](Self::forward_cached) but returns the logits of every new
    /// position `[T, V]` (host).
    pub fn forward_cached_all(&self, b: &dyn ComputeBackend, ids: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        let h = self.forward_hidden(b, ids, cache)?;
        self.logits_to_host(b, &h)
    }
}
