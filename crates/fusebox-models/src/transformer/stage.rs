//! A pipeline stage: the consecutive blocks `layers` of a model that one process holds
//! and runs, with the token embeddings when it is the first stage and the final norm and
//! head when it is the last. A whole model is the one stage `0..n_layers`.
//!
//! Between stages passes what the blocks pass between themselves: the residual stream
//! `x` and the next block's `norm1(x)`, which the sending stage computes fused with its
//! last residual add (it holds that one norm weight of the next stage's first block).
//! The receiving stage starts from both, so a split model computes the same bits as
//! the whole one.
//!
//! The head may be split by vocabulary rows between the first and the last stage
//! ([`Stage::with_head_rows`]): the last stage applies the final norm and multiplies by
//! rows `V₀..V`, the first multiplies the same normed rows by rows `0..V₀` when they
//! come back to it (a tied first stage holds them apart from its embedding table). Each logit is one row's dot product either way, so the logits are
//! the whole head's bits; each stage's resident memory holds only its rows.

use std::ops::Range;

use fusebox::{ComputeBackend, Error, NormOutput, Result, Tensor};

use super::cache::KvCache;
use super::layout::ParamIndex;
use super::pass::Pass;
use super::Transformer;

/// Which blocks of an `n_layers` model a process holds (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// The blocks held, a non-empty range of `0..n_layers`.
    pub layers: Range<usize>,
    /// Blocks of the whole model.
    pub n_layers: usize,
    /// The vocabulary rows of the head this stage multiplies by, when the head is split
    /// ([`with_head_rows`](Self::with_head_rows)); `None`: all of them on the last stage,
    /// none elsewhere.
    pub head_rows: Option<Range<usize>>,
}

impl Stage {
    /// The whole model as one stage.
    pub fn whole(n_layers: usize) -> Stage {
        Stage { layers: 0..n_layers, n_layers, head_rows: None }
    }

    /// Blocks `layers` of an `n_layers` model; an error unless the range is non-empty and
    /// inside the model.
    pub fn new(layers: Range<usize>, n_layers: usize) -> Result<Stage> {
        if layers.is_empty() || layers.end > n_layers {
            return Err(Error::value(
                "Stage",
                "layers",
                format!("a non-empty range of the model's 0..{n_layers} blocks"),
                format!("{}..{}", layers.start, layers.end),
            ));
        }
        Ok(Stage { layers, n_layers, head_rows: None })
    }

    /// This stage multiplying by the head's vocabulary rows `rows` of `vocab`: a leading
    /// range `0..V₀` on the first stage, the rest `V₀..vocab` on the last; an error on a
    /// stage in between, for a range out of the vocabulary, or for one that is not
    /// leading (first stage) or trailing (last stage).
    pub fn with_head_rows(mut self, rows: Range<usize>, vocab: usize) -> Result<Stage> {
        let fits = rows.start <= rows.end && rows.end <= vocab;
        let placed = (self.is_first() && rows.start == 0) || (self.is_last() && rows.end == vocab);
        if !fits || !placed || self.is_whole() && rows != (0..vocab) {
            return Err(Error::value(
                "Stage::with_head_rows",
                "head rows",
                format!(
                    "rows 0..V₀ on the first stage or V₀..{vocab} on the last (this stage holds blocks {}..{} of {})",
                    self.layers.start, self.layers.end, self.n_layers
                ),
                format!("{}..{}", rows.start, rows.end),
            ));
        }
        self.head_rows = Some(rows);
        Ok(self)
    }

    /// The vocabulary rows of the head this stage multiplies by, out of `vocab`.
    pub fn head_share(&self, vocab: usize) -> Range<usize> {
        match &self.head_rows {
            Some(r) => r.clone(),
            None if self.is_last() => 0..vocab,
            None => 0..0,
        }
    }

    /// Whether the head is split, its rows not all on this stage.
    pub fn splits_head(&self, vocab: usize) -> bool {
        self.head_rows.as_ref().is_some_and(|r| *r != (0..vocab))
    }

    /// Whether it embeds the tokens (it holds block 0).
    pub fn is_first(&self) -> bool {
        self.layers.start == 0
    }

    /// Whether it applies the final norm and the head (it holds the last block).
    pub fn is_last(&self) -> bool {
        self.layers.end == self.n_layers
    }

    /// Whether it is the whole model.
    pub fn is_whole(&self) -> bool {
        self.is_first() && self.is_last()
    }

    /// For each of the `n_params` parameters `index` places, whether this stage holds it:
    /// its blocks' parameters, the embeddings on the first stage, the final norm on the
    /// last, the head (the embedding when tied; only its [`head_rows`](Self::head_rows)
    /// when split) where it has rows of it, and the next stage's first `norm1`.
    pub fn holds(&self, index: &ParamIndex, n_params: usize) -> Vec<bool> {
        let mut held = vec![false; n_params];
        let mut hold = |i: usize| {
            if let Some(h) = held.get_mut(i) {
                *h = true;
            }
        };
        if self.is_first() {
            hold(index.embed);
            index.pos_embed.into_iter().for_each(&mut hold);
        }
        for l in self.layers.clone() {
            index.layers.get(l).into_iter().flat_map(|li| li.params()).for_each(&mut hold);
        }
        if let Some(next) = index.layers.get(self.layers.end) {
            hold(next.norm1.weight);
            next.norm1.bias.into_iter().for_each(&mut hold);
        }
        if self.is_last() {
            hold(index.norm_f.weight);
            index.norm_f.bias.into_iter().for_each(&mut hold);
        }
        if self.head_rows.as_ref().map_or(self.is_last(), |r| !r.is_empty()) {
            hold(index.head_weight());
        }
        held
    }
}

/// What a stage is given: token ids (the first stage) or the previous stage's output.
#[derive(Debug)]
pub enum StageInput<'a> {
    /// The new tokens of the sequence.
    Tokens(&'a [u32]),
    /// The residual stream `x` `[1, T, D]` after the previous stage's blocks and the
    /// norm of it this stage's first block starts from, `h` `[1, T, D]`.
    Hidden {
        /// Residual stream.
        x: Tensor,
        /// `norm1(x)` of this stage's first block.
        h: Tensor,
    },
}

/// What a stage hands on: `x` and `h` as [`StageInput::Hidden`] takes them; on the last
/// stage `h` is the final norm of `x`, the head's input.
#[derive(Debug)]
pub struct StageOutput {
    /// Residual stream `[1, T, D]`.
    pub x: Tensor,
    /// The next norm of it `[1, T, D]`.
    pub h: Tensor,
}

impl Transformer {
    /// The blocks this model holds (the whole model unless loaded as a pipeline stage).
    pub fn stage(&self) -> &Stage {
        &self.stage
    }

    /// Runs this stage's blocks on `input` at positions `cache.len ..`, appending their
    /// keys and values to `cache` (whose other layers stay empty); returns `x` and the
    /// next norm of it.
    ///
    /// # Shapes
    /// `Tokens`: T ids; `Hidden`: `x`, `h` `[1, T, D]` f32; `cache.len + T ≤
    /// cache.capacity` → `x`, `h` `[1, T, D]`.
    pub fn forward_stage(
        &self,
        b: &dyn ComputeBackend,
        input: StageInput<'_>,
        cache: &mut KvCache,
    ) -> Result<StageOutput> {
        const OP: &str = "Transformer::forward_stage";
        let t = match &input {
            StageInput::Tokens(ids) => ids.len(),
            StageInput::Hidden { x, .. } => x.dims().get(1).copied().unwrap_or(0),
        };
        let pos = cache.len;
        self.prepare_cached_pass(OP, b, t, cache)?;
        let (x, h) = self.stage_entry(OP, b, input, [1, t], &Pass::Cached { cache, pos })?;
        let mut pass = Pass::Cached { cache, pos };
        let (x, h) = self.stage_blocks(b, x, h, &mut pass)?;
        cache.len = pos + t;
        Ok(StageOutput { x, h: h.output })
    }

    /// The head's input from the last stage's output `h` `[1, T, D]`: every position's
    /// normed row `[T, D]` when `all`, else the last one's `[1, D]`.
    pub fn head_input(&self, b: &dyn ComputeBackend, h: &Tensor, all: bool) -> Result<Tensor> {
        const OP: &str = "Transformer::head_input";
        if !self.stage.is_last() {
            return Err(Error::unsupported(
                OP,
                format!("the stage of blocks {:?} has no final norm (the last stage has)", self.stage.layers),
            ));
        }
        let d = self.arch.d_model;
        let t = h.elem_count() / d.max(1);
        if h.elem_count() != t * d || t == 0 {
            return Err(Error::shape(OP, "h", format!("[1, T, {d}]"), h.shape()));
        }
        let h = h.reshape([t, d])?;
        if all {
            Ok(h)
        } else {
            b.slice_rows(&h, t - 1, 1)
        }
    }

    /// The logits of this stage's vocabulary rows ([`Stage::head_share`]) for the normed
    /// rows `h` `[N, D]` (what [`head_input`](Self::head_input) gives): `[N, rows]` f32
    /// on the host; `[N, V]` on the last stage of an unsplit head.
    pub fn head_logits(&self, b: &dyn ComputeBackend, h: &Tensor) -> Result<Tensor> {
        const OP: &str = "Transformer::head_logits";
        let (d, vocab) = (self.arch.d_model, self.arch.vocab_size);
        let n = h.dims().first().copied().unwrap_or(0);
        if h.dims() != [n, d] {
            return Err(Error::shape(OP, "h", format!("[N, {d}]"), h.shape()));
        }
        let rows = self.stage.head_share(vocab);
        if rows.is_empty() {
            return Tensor::zeros([n, 0], fusebox::DType::F32);
        }
        let w = self.head_weight();
        if w.dims() != [rows.len(), d] {
            return Err(Error::shape(OP, "head rows", format!("[{}, {d}]", rows.len()), w.shape()));
        }
        let logits = super::linear::linear_with(b, h, w, None, self.precision)?;
        b.to_host(&logits)
    }

    /// The head over the last stage's output `h` `[1, T, D]`: the logits of every
    /// position `[T, V]` when `all`, else of the last `[1, V]` (f32, host) — of this
    /// stage's vocabulary rows only when the head is split.
    pub fn stage_logits(&self, b: &dyn ComputeBackend, h: &Tensor, all: bool) -> Result<Tensor> {
        self.head_logits(b, &self.head_input(b, h, all)?)
    }

    /// The norm this stage's first block starts from.
    /// What a stage's blocks start from: token ids, shaped `rows` (`[1, T]` for one
    /// sequence, `[N, 1]` for a batch), embedded and normed for the first block (the first
    /// stage only), or the previous stage's `x` and `h`, which must be `[rows…, D]` f32.
    pub(super) fn stage_entry(
        &self,
        op: &'static str,
        b: &dyn ComputeBackend,
        input: StageInput<'_>,
        rows: [usize; 2],
        pass: &Pass<'_, '_>,
    ) -> Result<(Tensor, NormOutput)> {
        match input {
            StageInput::Tokens(ids) => {
                if !self.stage.is_first() {
                    return Err(Error::unsupported(
                        op,
                        format!(
                            "token ids given to the stage of blocks {:?}, which has no embeddings",
                            self.stage.layers
                        ),
                    ));
                }
                self.check_vocab(op, ids)?;
                let ids_t = b.upload(&Tensor::from_vec(ids.to_vec(), rows)?)?;
                let x = self.embed(b, &ids_t, pass)?;
                let h = self.norm(b, &x, self.stage_entry_norm())?;
                Ok((x, h))
            }
            StageInput::Hidden { x, h } => {
                let want = [rows[0], rows[1], self.arch.d_model];
                for (what, v) in [("x", &x), ("h", &h)] {
                    if v.dims() != want || v.dtype() != fusebox::DType::F32 {
                        return Err(Error::shape(
                            op,
                            what,
                            format!("{want:?} f32"),
                            format!("{} {}", v.shape(), v.dtype()),
                        ));
                    }
                }
                Ok((x, NormOutput { output: h, rstd: Tensor::zeros([0], fusebox::DType::F32)?, mean: None }))
            }
        }
    }

    pub(super) fn stage_entry_norm(&self) -> super::layout::NormIndex {
        self.index.layers.get(self.stage.layers.start).map_or(self.index.norm_f, |l| l.norm1)
    }

    /// `x` with `h = norm1(x)` through this stage's blocks: the last one's output and the
    /// next norm of it.
    pub(super) fn stage_blocks(
        &self,
        b: &dyn ComputeBackend,
        mut x: Tensor,
        mut h: NormOutput,
        pass: &mut Pass<'_, '_>,
    ) -> Result<(Tensor, NormOutput)> {
        for l in self.stage.layers.clone() {
            (x, h) = self.block(b, l, x, h, pass)?;
        }
        Ok((x, h))
    }

    /// An error unless `t` new positions fit `cache` and it is laid out for this model;
    /// then backs them ([`KvCache::reserve`]).
    pub(super) fn prepare_cached_pass(
        &self,
        op: &'static str,
        b: &dyn ComputeBackend,
        t: usize,
        cache: &mut KvCache,
    ) -> Result<()> {
        let pos = cache.len;
        if t == 0 {
            return Err(Error::value(op, "tokens", "at least one", 0));
        }
        if pos + t > cache.capacity {
            return Err(Error::value(
                op,
                "context",
                format!("at most {} positions (the cache size, --ctx-size)", cache.capacity),
                format!("{pos} cached + {t} new"),
            ));
        }
        if cache.k.len() != self.arch.n_layers {
            return Err(Error::value(op, "cache", format!("{} layers", self.arch.n_layers), cache.k.len()));
        }
        cache.reserve(b, pos + t)
    }

    /// An error unless this model is the whole network (training and the batched server
    /// step run every block in one process).
    pub(super) fn check_whole(&self, op: &'static str) -> Result<()> {
        if self.stage.is_whole() {
            Ok(())
        } else {
            Err(Error::unsupported(
                op,
                format!(
                    "this process holds blocks {}..{} of {} (a pipeline stage); the pass needs the whole model",
                    self.stage.layers.start, self.stage.layers.end, self.stage.n_layers
                ),
            ))
        }
    }
}
