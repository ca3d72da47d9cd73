//! The backward entry points and the losses: from the logits' gradient through the
//! head, the final norm, every [`block`](super::block) from the last down, and the
//! embeddings, adding into every parameter's gradient (full training) or only the
//! LoRA adapters' (a frozen base).

use fusebox::{ComputeBackend, Result, Tensor};

use super::forward::ForwardCache;
use super::{check_params, Sink, Transformer};
use crate::params::ParamSet;

/// The backward's report that the gradients at some parameter indices are complete (see
/// [`Transformer::backward_with`]).
pub type GradsReady<'a> = dyn FnMut(&ParamSet, &[usize]) -> Result<()> + 'a;

impl Transformer {
    /// Backward from `d_logits` `[B·T, V]`: adds every parameter's gradient into `grads`.
    pub fn backward(
        &self,
        b: &dyn ComputeBackend,
        cache: ForwardCache,
        d_logits: &Tensor,
        grads: &mut ParamSet,
    ) -> Result<()> {
        self.backward_with(b, cache, d_logits, grads, &mut |_, _| Ok(()))
    }

    /// [`backward`](Self::backward), calling `ready(grads, indices)` as soon as the
    /// gradients of `indices` are complete (no later step of this backward adds to them):
    /// the final norm and an untied head first, then each block from the last down, then
    /// the embeddings. Every parameter is reported exactly once, in the same order on every
    /// call; a data-parallel trainer starts reducing them while the rest runs.
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
        let ForwardCache { ids, batch: bsz, seq: t, rope, layers, x_final, norm_f: norm_f_out } = cache;
        let d = self.arch.d_model;
        let norm_f = self.index.norm_f;
        let mut dx = self.norm_backward(b, &x_final, norm_f, &norm_f_out, &dhf.reshape([bsz, t, d])?, sink)?;
        if let Some(grads) = sink.base() {
            let done = [Some(norm_f.weight), norm_f.bias, self.index.head].into_iter().flatten().collect::<Vec<_>>();
            ready(grads, &done)?;
        }
        // Each block's activations are dropped as soon as its backward is done.
        for (l, saved) in layers.into_iter().enumerate().rev() {
            dx = self.block_backward(b, l, &saved, &rope, &dx, sink)?;
            if let Some(grads) = sink.base() {
                ready(grads, &self.index.layers[l].params())?;
            }
        }
        let Some(grads) = sink.base() else { return Ok(()) };

        // Embeddings: token rows scatter-add straight into the (possibly tied) table's
        // gradient (times the embedding scale); positions sum over the batch.
        let ids = ids.reshape([bsz * t])?;
        let d_tok = if self.arch.embed_scale != 1.0 { b.mul_scalar(&dx, self.arch.embed_scale)? } else { dx.clone() };
        b.scatter_add_rows(&mut grads.tensors[self.index.embed], &ids, &d_tok.reshape([bsz * t, d])?)?;
        if let Some(wpe) = self.index.pos_embed {
            let dpos = b.sum(&dx.reshape([bsz, t * d])?, Some(0))?.reshape([t, d])?;
            let rows = b.upload(&Tensor::from_vec((0..t as u32).collect::<Vec<_>>(), [t])?)?;
            b.scatter_add_rows(&mut grads.tensors[wpe], &rows, &dpos)?;
        }
        ready(grads, &[Some(self.index.embed), self.index.pos_embed].into_iter().flatten().collect::<Vec<_>>())
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
        self.loss_and_grads_with(b, ids, targets, ignore, grad_scale, grads, &mut |_, _| Ok(()))
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
        self.loss_and_grads_into(b, ids, targets, ignore, grad_scale, &mut Sink::Full(grads), ready)
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
        let ad = self.lora.as_ref().ok_or_else(|| fusebox::Error::unsupported(OP, "no LoRA adapters are attached"))?;
        check_params(&ad.specs, grads)?;
        self.loss_and_grads_into(b, ids, targets, ignore, grad_scale, &mut Sink::Lora(grads), &mut |_, _| Ok(()))
    }

    /// The loss and its gradients into `sink`: the counted-rows path when it applies,
    /// else the dense head.
    #[allow(clippy::too_many_arguments)]
    fn loss_and_grads_into(
        &self,
        b: &dyn ComputeBackend,
        ids: &Tensor,
        targets: &Tensor,
        ignore: Option<u32>,
        grad_scale: f32,
        sink: &mut Sink<'_>,
        ready: &mut GradsReady<'_>,
    ) -> Result<f32> {
        if let Some(loss) = self.counted_loss_and_grads(b, ids, targets, ignore, grad_scale, sink, ready)? {
            return Ok(loss);
        }
        let (logits, mut cache) = self.forward(b, ids)?;
        let aux = self.router_aux_loss(b, &mut cache.layers, grad_scale)?;
        let n = logits.dims()[0];
        let ce = b.cross_entropy(&logits, &targets.reshape([n])?, ignore)?;
        let loss = b.to_host(&ce.loss)?.to_vec::<f32>()?[0];
        let d_logits = if grad_scale == 1.0 { ce.d_logits } else { b.mul_scalar(&ce.d_logits, grad_scale)? };
        self.backward_impl(b, cache, &d_logits, sink, ready)?;
        Ok(loss + aux)
    }

    /// Mean cross-entropy without gradients (evaluation; a mixture of experts' load-balancing
    /// loss is a training term and is not part of it).
    pub fn loss(&self, b: &dyn ComputeBackend, ids: &Tensor, targets: &Tensor, ignore: Option<u32>) -> Result<f32> {
        let (logits, _) = self.forward(b, ids)?;
        let n = logits.dims()[0];
        let ce = b.cross_entropy(&logits, &targets.reshape([n])?, ignore)?;
        Ok(b.to_host(&ce.loss)?.to_vec::<f32>()?[0])
    }
}
