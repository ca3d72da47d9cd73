//! The backward entry points and the losses: from the logits' gradient through the
//! head, the final norm, every [`block`](super::block) from the last down, and the
//! embeddings, adding into every parameter's gradient (full training) or only the
//! LoRA adapters' (a frozen base).

use fusebox::{ComputeBackend, Result, Tensor};

use super::checkpointing::{Activations, Keep};
use super::forward::ForwardCache;
use super::{check_params, Sink, Transformer};
use crate::params::ParamSet;

/// Hears from the backward as gradients become final (see [`Transformer::backward_with`]).
/// Any `FnMut(&ParamSet, &[usize]) -> Result<()>` closure is one that hears only
/// [`ready`](Self::ready).
pub trait GradsListener {
    /// The gradients at `indices` of `grads` are complete: no later step of this backward
    /// adds to them.
    fn ready(&mut self, grads: &ParamSet, indices: &[usize]) -> Result<()>;

    /// Whether the embedding lookups' gradients are to be handed over as rows
    /// ([`rows`](Self::rows)) instead of added into the tables. The table of a lookup
    /// `y_i = E[id_i]` receives `dE[id_i] += dy_i`: only the rows of the tokens in the
    /// batch, while a tied table's other term, the head's `dW = dlogitsᵀ·h`, is dense. A
    /// listener that takes the rows hears the tables [`ready`](Self::ready) as soon as the
    /// head's gradient is in (the dense part, and what earlier micro-batches added, is then
    /// final) and gets the rows at the end. The same answer on every call.
    fn takes_rows(&self) -> bool {
        false
    }

    /// The rows of an embedding lookup's gradient for table `index` of `grads`:
    /// `grads[index][ids[i]]` would receive `rows[i]` (duplicates adding up). Called once
    /// per table at the end of the backward, and only when [`takes_rows`](Self::takes_rows).
    ///
    /// # Shapes
    /// `ids`: `[n]` U32; `rows`: `[n, D]` f32, the table `[V, D]`.
    fn rows(&mut self, grads: &ParamSet, index: usize, ids: &Tensor, rows: &Tensor) -> Result<()> {
        let _ = (grads, ids, rows);
        Err(fusebox::Error::unsupported("GradsListener::rows", format!("table {index}: this listener takes no rows")))
    }
}

impl<F: FnMut(&ParamSet, &[usize]) -> Result<()>> GradsListener for F {
    fn ready(&mut self, grads: &ParamSet, indices: &[usize]) -> Result<()> {
        self(grads, indices)
    }
}

/// A listener that ignores every report (plain, single-process training).
#[derive(Debug, Clone, Copy, Default)]
pub struct NotListening;

impl GradsListener for NotListening {
    fn ready(&mut self, _grads: &ParamSet, _indices: &[usize]) -> Result<()> {
        Ok(())
    }
}

/// The backward's listener for finished gradients (see [`GradsListener`]).
pub type GradsReady<'a> = dyn GradsListener + 'a;

/// How [`Transformer::train_loss_and_grads`] computes one micro-batch's loss and gradients.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossOptions {
    /// Positions whose target is this do not count (chat data: everything but the answers).
    pub ignore: Option<u32>,
    /// The gradients are added into the sums times this (1/accumulation steps).
    pub grad_scale: f32,
    /// What the forward keeps for the backward (activation checkpointing: `Recomputed`).
    pub activations: Activations,
}

impl Default for LossOptions {
    /// Every position counts, gradients as they are, activations saved.
    fn default() -> LossOptions {
        LossOptions { ignore: None, grad_scale: 1.0, activations: Activations::Saved }
    }
}

impl Transformer {
    /// Backward from `d_logits` `[B·T, V]`: adds every parameter's gradient into `grads`.
    pub fn backward(
        &self,
        b: &dyn ComputeBackend,
        cache: ForwardCache,
        d_logits: &Tensor,
        grads: &mut ParamSet,
    ) -> Result<()> {
        self.backward_with(b, cache, d_logits, grads, &mut NotListening)
    }

    /// [`backward`](Self::backward), calling `ready.ready(grads, indices)` as soon as the
    /// gradients of `indices` are complete (no later step of this backward adds to them):
    /// an untied head first, then the final norm, then each block from the last down, then
    /// the embeddings. A listener that [takes rows](GradsListener::takes_rows) hears the
    /// embedding tables (a tied one included) first, with the head, and gets the lookups'
    /// gradient rows at the end instead. Every parameter is reported exactly once, in the
    /// same order on every call; a data-parallel trainer starts reducing them while the
    /// rest runs.
    pub fn backward_with(
        &self,
        b: &dyn ComputeBackend,
        cache: ForwardCache,
        d_logits: &Tensor,
        grads: &mut ParamSet,
        ready: &mut GradsReady<'_>,
    ) -> Result<()> {
        const OP: &str = "Transformer::backward";
        self.check_full_grads(OP, grads)?;
        self.backward_impl(b, cache, d_logits, &mut Sink::Full(grads), ready)
    }

    /// The backward from `d_logits` into `sink`: the head, then
    /// [`backward_below_head`](Self::backward_below_head).
    pub(super) fn backward_impl(
        &self,
        b: &dyn ComputeBackend,
        cache: ForwardCache,
        d_logits: &Tensor,
        sink: &mut Sink<'_>,
        ready: &mut GradsReady<'_>,
    ) -> Result<()> {
        let hf = cache.norm_f.output.reshape([cache.batch * cache.seq, self.arch.d_model])?;
        let dhf = self.linear_grad(b, sink, &hf, (self.index.head_weight(), None), d_logits)?;
        self.backward_below_head(b, cache, &dhf, sink, ready)
    }

    /// The backward from the head's input gradient `dhf` `[B·T, D]` (the head's own
    /// gradient already added): final norm, blocks, embeddings; `ready` as in
    /// [`backward_with`](Self::backward_with) (not called for a LoRA sink).
    pub(super) fn backward_below_head(
        &self,
        b: &dyn ComputeBackend,
        cache: ForwardCache,
        dhf: &Tensor,
        sink: &mut Sink<'_>,
        ready: &mut GradsReady<'_>,
    ) -> Result<()> {
        self.check_trainable("Transformer::backward")?;
        let ForwardCache { ids, batch: bsz, seq: t, rope, mut layers, x_final, norm_f: norm_f_out } = cache;
        let d = self.arch.d_model;
        let norm_f = self.index.norm_f;
        // The lookups' rows go to the listener; the tables' dense part is final now.
        let sparse = sink.base().is_some() && ready.takes_rows();
        let tables = [Some(self.index.embed), self.index.pos_embed].into_iter().flatten();
        if let Some(grads) = sink.base() {
            // The head's dW was added before this was called: an untied head is final, and
            // so (taking rows) is a tied table, whose lookup term comes only as rows.
            let early: Vec<usize> = self.index.head.into_iter().chain(tables.clone().filter(|_| sparse)).collect();
            if !early.is_empty() {
                ready.ready(grads, &early)?;
            }
        }
        let mut dx = self.norm_backward(b, &x_final, norm_f, &norm_f_out, &dhf.reshape([bsz, t, d])?, sink)?;
        if let Some(grads) = sink.base() {
            ready.ready(grads, &[Some(norm_f.weight), norm_f.bias].into_iter().flatten().collect::<Vec<_>>())?;
        }
        // Each block's activations (as saved, or recomputed from its input) are dropped as
        // soon as its backward is done.
        while let Some(block) = layers.pop(self, b, &rope) {
            let (l, saved) = block?;
            dx = self.block_backward(b, l, &saved, &rope, &dx, sink)?;
            drop(saved);
            if let Some(grads) = sink.base() {
                ready.ready(grads, &self.index.layers[l].params())?;
            }
        }
        let Some(grads) = sink.base() else { return Ok(()) };

        // Embeddings: token rows scatter-add into the (possibly tied) table's gradient
        // (times the embedding scale); positions sum over the batch. Taking rows, the
        // listener gets them instead.
        let ids = ids.reshape([bsz * t])?;
        let d_tok = if self.arch.embed_scale != 1.0 { b.mul_scalar(&dx, self.arch.embed_scale)? } else { dx.clone() };
        let d_tok = d_tok.reshape([bsz * t, d])?;
        if sparse {
            ready.rows(grads, self.index.embed, &ids, &d_tok)?;
        } else {
            b.scatter_add_rows(&mut grads.tensors[self.index.embed], &ids, &d_tok)?;
        }
        if let Some(wpe) = self.index.pos_embed {
            let dpos = b.sum(&dx.reshape([bsz, t * d])?, Some(0))?.reshape([t, d])?;
            let rows = b.upload(&Tensor::from_vec((0..t as u32).collect::<Vec<_>>(), [t])?)?;
            if sparse {
                ready.rows(grads, wpe, &rows, &dpos)?;
            } else {
                b.scatter_add_rows(&mut grads.tensors[wpe], &rows, &dpos)?;
            }
        }
        if sparse {
            return Ok(());
        }
        ready.ready(grads, &tables.collect::<Vec<_>>())
    }

    /// Mean cross-entropy of next-token predictions and its gradient, added into `grads`
    /// scaled by `grad_scale` (1/accumulation steps). `targets` `[B, T]` U32; positions
    /// whose target is `ignore` do not count. Returns the loss. When at most half the
    /// positions count (chat data: loss on the answers only), the head's logits are
    /// computed at the counted positions only: the same loss and gradients, without
    /// the `[B·T, V]` logits.
    pub fn loss_and_grads(
        &self,
        b: &dyn ComputeBackend,
        ids: &Tensor,
        targets: &Tensor,
        ignore: Option<u32>,
        grad_scale: f32,
        grads: &mut ParamSet,
    ) -> Result<f32> {
        self.loss_and_grads_with(b, ids, targets, ignore, grad_scale, grads, &mut NotListening)
    }

    /// [`loss_and_grads`](Self::loss_and_grads) with the backward's `ready` callback (see
    /// [`backward_with`](Self::backward_with)).
    #[allow(clippy::too_many_arguments)]
    pub fn loss_and_grads_with(
        &self,
        b: &dyn ComputeBackend,
        ids: &Tensor,
        targets: &Tensor,
        ignore: Option<u32>,
        grad_scale: f32,
        grads: &mut ParamSet,
        ready: &mut GradsReady<'_>,
    ) -> Result<f32> {
        const OP: &str = "Transformer::loss_and_grads";
        self.check_full_grads(OP, grads)?;
        let opts = LossOptions { ignore, grad_scale, activations: Activations::Saved };
        self.loss_and_grads_into(b, ids, targets, opts, &mut Sink::Full(grads), ready)
    }

    /// LoRA training: the mean cross-entropy, and its gradient with respect to the
    /// adapters only (the base frozen), added into `grads` (laid out as the adapters'
    /// specs) scaled by `grad_scale`. `targets` as in
    /// [`loss_and_grads`](Self::loss_and_grads); chat data takes the same counted-rows
    /// path.
    pub fn lora_loss_and_grads(
        &self,
        b: &dyn ComputeBackend,
        ids: &Tensor,
        targets: &Tensor,
        ignore: Option<u32>,
        grad_scale: f32,
        grads: &mut ParamSet,
    ) -> Result<f32> {
        const OP: &str = "Transformer::lora_loss_and_grads";
        self.check_lora_grads(OP, grads)?;
        let opts = LossOptions { ignore, grad_scale, activations: Activations::Saved };
        self.loss_and_grads_into(b, ids, targets, opts, &mut Sink::Lora(grads), &mut NotListening)
    }

    /// The training engine's one call per micro-batch: the mean cross-entropy of `ids`
    /// `[B, T]` against `targets` `[B, T]` (U32) and its gradient with respect to what is
    /// trained — the LoRA adapters when attached (`grads` laid out as their specs; the
    /// base frozen), else every parameter — added into `grads` times `opts.grad_scale`.
    /// `ready` hears of every gradient once it is final: block by block for every
    /// parameter (see [`backward_with`](Self::backward_with)), all at once after the
    /// backward for adapters. With `opts.activations` `Recomputed` the forward keeps only
    /// each block's input and the backward recomputes the block: the same loss and
    /// gradients, bit for bit, in less memory.
    pub fn train_loss_and_grads(
        &self,
        b: &dyn ComputeBackend,
        ids: &Tensor,
        targets: &Tensor,
        opts: LossOptions,
        grads: &mut ParamSet,
        ready: &mut GradsReady<'_>,
    ) -> Result<f32> {
        const OP: &str = "Transformer::train_loss_and_grads";
        if self.lora.is_none() {
            self.check_full_grads(OP, grads)?;
            return self.loss_and_grads_into(b, ids, targets, opts, &mut Sink::Full(grads), ready);
        }
        self.check_lora_grads(OP, grads)?;
        let loss = self.loss_and_grads_into(b, ids, targets, opts, &mut Sink::Lora(grads), &mut NotListening)?;
        ready.ready(grads, &(0..grads.tensors.len()).collect::<Vec<_>>())?;
        Ok(loss)
    }

    /// An error unless adapters are attached and `grads` is laid out as their specs.
    fn check_lora_grads(&self, op: &'static str, grads: &ParamSet) -> Result<()> {
        let ad = self.lora.as_ref().ok_or_else(|| fusebox::Error::unsupported(op, "no LoRA adapters are attached"))?;
        check_params(&ad.specs, grads)
    }

    /// The loss and its gradients into `sink`: the counted-rows path when it applies,
    /// else the dense head.
    fn loss_and_grads_into(
        &self,
        b: &dyn ComputeBackend,
        ids: &Tensor,
        targets: &Tensor,
        opts: LossOptions,
        sink: &mut Sink<'_>,
        ready: &mut GradsReady<'_>,
    ) -> Result<f32> {
        if let Some(loss) = self.counted_loss_and_grads(b, ids, targets, opts, sink, ready)? {
            return Ok(loss);
        }
        let LossOptions { ignore, grad_scale, activations } = opts;
        let mut cache = self.forward_trunk(b, ids, Keep::from(activations))?;
        let aux = self.router_aux_loss(b, &mut cache.layers, grad_scale)?;
        let h = cache.norm_f.output.reshape([cache.batch * cache.seq, self.arch.d_model])?;
        let logits = self.linear(b, &h, self.index.head_weight(), None)?;
        let n = logits.dims()[0];
        let ce = b.cross_entropy(&logits, &targets.reshape([n])?, ignore)?;
        // The logits `[B·T, V]` (the largest activation of a small model with a large
        // vocabulary) are not needed by the backward; only their gradient is.
        drop(logits);
        let loss = b.to_host(&ce.loss)?.to_vec::<f32>()?[0];
        let d_logits = match ce.d_logits {
            d if grad_scale == 1.0 => d,
            d => b.mul_scalar(&d, grad_scale)?, // the unscaled `d` freed here
        };
        self.backward_impl(b, cache, &d_logits, sink, ready)?;
        Ok(loss + aux)
    }

    /// Mean cross-entropy without gradients (evaluation; a mixture of experts' load-balancing
    /// loss is a training term and is not part of it).
    pub fn loss(&self, b: &dyn ComputeBackend, ids: &Tensor, targets: &Tensor, ignore: Option<u32>) -> Result<f32> {
        let logits = self.forward_logits(b, ids)?;
        let n = logits.dims()[0];
        let ce = b.cross_entropy(&logits, &targets.reshape([n])?, ignore)?;
        Ok(b.to_host(&ce.loss)?.to_vec::<f32>()?[0])
    }
}
