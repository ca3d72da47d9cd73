//! The attention sublayer, forward and backward side by side:
//! `o = attention(rope(qk_norm(q)), rope(qk_norm(k)), v; sinks)·Woᵀ (+ b)` with
//! `q, k, v = split(h·Wqkvᵀ + b)`. Where keys and values come from and go is the
//! [`Pass`]'s.

use fusebox::{AttentionGradients, CausalAttentionResult, ComputeBackend, Error, NormOutput, Result, Tensor};

use super::arch::Positions;
use super::cache::RopeTables;
use super::lora::Group;
use super::pass::Pass;
use super::{Sink, Transformer};

/// q and k before the QK-norms, and the norms' outputs with their statistics.
type QkPre = Option<(Tensor, NormOutput, Tensor, NormOutput)>;

/// What the attention keeps for its backward (its input is the block's saved `norm1`
/// output).
#[derive(Debug)]
pub(super) struct AttentionSaved {
    /// q and k before their QK-norms, and those norms' statistics.
    qk_pre: QkPre,
    /// After rope, `[B, H, T, hd]`.
    q: Tensor,
    k: Tensor,
    v: Tensor,
    /// The fused attention's output and logsumexp.
    result: CausalAttentionResult,
    /// Attention output with heads merged, `[B, T, Hq·hd]`.
    merged: Tensor,
}

impl Transformer {
    /// Layer `l`'s attention on `h` `[B, T, D]` → `o` `[B, T, D]` (before any post-norm),
    /// and in a training pass what the backward needs.
    pub(super) fn attention(
        &self,
        b: &dyn ComputeBackend,
        l: usize,
        h: &Tensor,
        pass: &mut Pass<'_, '_>,
    ) -> Result<(Tensor, Option<AttentionSaved>)> {
        let arch = &self.arch;
        let li = &self.index.layers[l];
        let [q, k, v]: [Tensor; 3] = self
            .proj(b, h, &li.qkv, (l, Group::Qkv))?
            .try_into()
            .map_err(|_| Error::value("Transformer::attention", "q/k/v projections", "three", "another count"))?;
        // QK-norm per head after the split, or over all heads before it (OLMoE).
        let (q, k, whole_pre) = if arch.qk_norm_whole { self.qk_norm(b, l, q, k)? } else { (q, k, None) };
        let q = pass.split_heads(b, &q, arch.n_heads)?;
        let k = pass.split_heads(b, &k, arch.n_kv_heads)?;
        let v = pass.split_heads(b, &v, arch.n_kv_heads)?;
        let (q, k, qk_pre) = if arch.qk_norm_whole { (q, k, whole_pre) } else { self.qk_norm(b, l, q, k)? };
        let (q, k) = pass.rope(b, arch, l, q, k)?;
        let (merged, result) = pass.attend(b, arch, l, &q, &k, &v, li.sinks.map(|i| self.p(i)))?;
        let o = self.proj(b, &merged, &li.o, (l, Group::O))?.remove(0);
        Ok((o, result.map(|result| AttentionSaved { qk_pre, q, k, v, result, merged })))
    }

    /// The QK-norm of layer `l` (when it has one) on `q` and `k`: returns them normed
    /// and what the backward needs.
    fn qk_norm(&self, b: &dyn ComputeBackend, l: usize, q: Tensor, k: Tensor) -> Result<(Tensor, Tensor, QkPre)> {
        let li = &self.index.layers[l];
        let (Some(qn), Some(kn)) = (li.q_norm, li.k_norm) else { return Ok((q, k, None)) };
        let nq = b.rms_norm(&q, self.p(qn), self.arch.norm_eps)?;
        let nk = b.rms_norm(&k, self.p(kn), self.arch.norm_eps)?;
        Ok((nq.output.clone(), nk.output.clone(), Some((q, nq, k, nk))))
    }

    /// Backward of [`qk_norm`](Self::qk_norm): `(dq, dk)` before it, the norm weights'
    /// gradients added into the sink.
    fn qk_norm_backward(
        &self,
        b: &dyn ComputeBackend,
        l: usize,
        pre: &QkPre,
        dq: Tensor,
        dk: Tensor,
        sink: &mut Sink<'_>,
    ) -> Result<(Tensor, Tensor)> {
        let li = &self.index.layers[l];
        let (Some(qn), Some(kn), Some((q_pre, nq, k_pre, nk))) = (li.q_norm, li.k_norm, pre) else {
            return Ok((dq, dk));
        };
        let gq = b.rms_norm_backward(q_pre, self.p(qn), &nq.rstd, &dq)?;
        let gk = b.rms_norm_backward(k_pre, self.p(kn), &nk.rstd, &dk)?;
        if let Some(grads) = sink.base() {
            b.add_assign(&mut grads.tensors[qn], &gq.dweight)?;
            b.add_assign(&mut grads.tensors[kn], &gk.dweight)?;
        }
        Ok((gq.dx, gk.dx))
    }

    /// Backward of [`attention`](Self::attention) (a training pass, positions from 0) at
    /// input `h` from `d_o`; returns `dh`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_backward(
        &self,
        b: &dyn ComputeBackend,
        l: usize,
        h: &Tensor,
        s: &AttentionSaved,
        rope: &RopeTables,
        d_o: &Tensor,
        sink: &mut Sink<'_>,
    ) -> Result<Tensor> {
        let arch = &self.arch;
        let li = &self.index.layers[l];
        let d_merged = self.proj_backward(b, sink, &s.merged, &li.o, (l, Group::O), std::slice::from_ref(d_o))?;
        let d_attn = b.split_heads(&d_merged, arch.n_heads)?;
        let sinks = li.sinks.map(|i| self.p(i));
        let AttentionGradients { mut dq, mut dk, dv, dsinks } =
            b.causal_attention_backward(&s.q, &s.k, &s.v, &s.result, &d_attn, arch.window(l), sinks, arch.attn_scale)?;
        if let (Some(i), Some(ds), Some(grads)) = (li.sinks, dsinks, sink.base()) {
            b.add_assign(&mut grads.tensors[i], &ds)?;
        }
        if arch.positions == Positions::Rope {
            let (cos, sin) = rope.of(l)?;
            let style = arch.rope_of(l).style;
            dq = b.rope_backward(&dq, cos, sin, style, 0)?;
            dk = b.rope_backward(&dk, cos, sin, style, 0)?;
        }
        if !arch.qk_norm_whole {
            (dq, dk) = self.qk_norm_backward(b, l, &s.qk_pre, dq, dk, sink)?;
        }
        let (mut dq, mut dk) = (b.merge_heads(&dq)?, b.merge_heads(&dk)?);
        if arch.qk_norm_whole {
            (dq, dk) = self.qk_norm_backward(b, l, &s.qk_pre, dq, dk, sink)?;
        }
        let d_qkv = [dq, dk, b.merge_heads(&dv)?];
        self.proj_backward(b, sink, h, &li.qkv, (l, Group::Qkv), &d_qkv)
    }
}
