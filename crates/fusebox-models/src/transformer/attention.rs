//! The attention sublayer, forward and backward side by side:
//! `o = attention(rope(qk_norm(q)), rope(qk_norm(k)), v)·Woᵀ (+ b)` with
//! `q, k, v = split(h·Wqkvᵀ + b)`. Where keys and values come from and go is the
//! [`Pass`]'s.

use fusebox::{AttentionGradients, CausalAttentionResult, ComputeBackend, Error, NormOutput, Result, Tensor};

use super::arch::Positions;
use super::cache::RopeTables;
use super::lora::Group;
use super::pass::Pass;
use super::{Sink, Transformer};

/// What the attention keeps for its backward (its input is the block's saved `norm1`
/// output).
#[derive(Debug)]
pub(super) struct AttentionSaved {
    /// q and k before their per-head norms, and those norms' statistics (QK-norm).
    qk_pre: Option<(Tensor, NormOutput, Tensor, NormOutput)>,
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
        let mut q = pass.split_heads(b, &q, arch.n_heads)?;
        let mut k = pass.split_heads(b, &k, arch.n_kv_heads)?;
        let v = pass.split_heads(b, &v, arch.n_kv_heads)?;
        let qk_pre = match (li.q_norm, li.k_norm) {
            (Some(qn), Some(kn)) => {
                let nq = b.rms_norm(&q, self.p(qn), arch.norm_eps)?;
                let nk = b.rms_norm(&k, self.p(kn), arch.norm_eps)?;
                let pre_q = std::mem::replace(&mut q, nq.output.clone());
                let pre_k = std::mem::replace(&mut k, nk.output.clone());
                Some((pre_q, nq, pre_k, nk))
            }
            _ => None,
        };
        let (q, k) = pass.rope(b, arch, l, q, k)?;
        let (merged, result) = pass.attend(b, arch, l, &q, &k, &v)?;
        let o = self.proj(b, &merged, &li.o, (l, Group::O))?.remove(0);
        Ok((o, result.map(|result| AttentionSaved { qk_pre, q, k, v, result, merged })))
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
        let AttentionGradients { mut dq, mut dk, dv } =
            b.causal_attention_backward(&s.q, &s.k, &s.v, &s.result, &d_attn, arch.window(l), arch.attn_scale)?;
        if arch.positions == Positions::Rope {
            let (cos, sin) = rope.of(l)?;
            let style = arch.rope_of(l).style;
            dq = b.rope_backward(&dq, cos, sin, style, 0)?;
            dk = b.rope_backward(&dk, cos, sin, style, 0)?;
        }
        if let (Some(qn), Some(kn), Some((q_pre, nq, k_pre, nk))) = (li.q_norm, li.k_norm, &s.qk_pre) {
            let gq = b.rms_norm_backward(q_pre, self.p(qn), &nq.rstd, &dq)?;
            let gk = b.rms_norm_backward(k_pre, self.p(kn), &nk.rstd, &dk)?;
            if let Some(grads) = sink.base() {
                b.add_assign(&mut grads.tensors[qn], &gq.dweight)?;
                b.add_assign(&mut grads.tensors[kn], &gk.dweight)?;
            }
            (dq, dk) = (gq.dx, gk.dx);
        }
        let d_qkv = [b.merge_heads(&dq)?, b.merge_heads(&dk)?, b.merge_heads(&dv)?];
        self.proj_backward(b, sink, h, &li.qkv, (l, Group::Qkv), &d_qkv)
    }
}
