//! The attention sublayer, forward and backward side by side:
//! `o = attention(rope(qk_norm(q)), rope(qk_norm(k)), v; sinks)·Woᵀ (+ b)` with
//! `q, k, v = split(h·Wqkvᵀ + b)`; with an output gate (Qwen3.5) each query head's
//! projection is followed by as many gate rows, and `o = (attention(…)·σ(gate))·Woᵀ`.
//! Where keys and values come from and go is the [`Pass`]'s.

use fusebox::{AttentionGradients, CausalAttentionResult, ComputeBackend, Error, NormOutput, Result, Tensor};

use super::arch::Positions;
use super::cache::RopeTables;
use super::lora::Group;
use super::pass::Pass;
use super::{Sink, Transformer};

/// q and k before the QK-norms, and the norms' outputs with their statistics.
type QkPre = Option<(Tensor, NormOutput, Tensor, NormOutput)>;

/// The output gate's input and the attention output it multiplies (for the backward).
#[derive(Debug)]
struct GateSaved {
    /// The gate before its sigmoid, `[B, T, Hq·hd]`.
    pre: Tensor,
    /// The attention output with heads merged, before the gate.
    attn: Tensor,
}

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
    /// Attention output with heads merged (and gated), `[B, T, Hq·hd]`: `Wo`'s input.
    merged: Tensor,
    /// The output gate, when the layer has one.
    gate: Option<GateSaved>,
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
        let (q, gate) = if arch.attn_output_gate { self.split_gate(b, &q)? } else { (q, None) };
        // QK-norm per head after the split, or over all heads before it (OLMoE).
        let (q, k, whole_pre) = if arch.qk_norm_whole { self.qk_norm(b, l, q, k)? } else { (q, k, None) };
        let q = pass.split_heads(b, &q, arch.n_heads)?;
        let k = pass.split_heads(b, &k, arch.n_kv_heads)?;
        let v = pass.split_heads(b, &v, arch.n_kv_heads)?;
        let (q, k, qk_pre) = if arch.qk_norm_whole { (q, k, whole_pre) } else { self.qk_norm(b, l, q, k)? };
        let (q, k) = pass.rope(b, arch, l, q, k)?;
        let (attn, result) = pass.attend(b, arch, l, &q, &k, &v, li.sinks.map(|i| self.p(i)))?;
        let (merged, gate) = match gate {
            Some(pre) => (b.mul(&attn, &b.sigmoid(&pre)?)?, Some(GateSaved { pre, attn })),
            None => (attn, None),
        };
        let o = self.proj(b, &merged, &li.o, (l, Group::O))?.remove(0);
        Ok((o, result.map(|result| AttentionSaved { qk_pre, q, k, v, result, merged, gate })))
    }

    /// The query projection's output `[B, T, Hq·2·hd]` (per head: hd query rows, then hd
    /// gate rows) split into the queries and the output gate, each `[B, T, Hq·hd]`.
    fn split_gate(&self, b: &dyn ComputeBackend, q: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        let (hq, hd) = (self.arch.n_heads, self.arch.head_dim);
        let (bsz, t) = (q.dims()[0], q.dims()[1]);
        let heads = q.reshape([bsz, t, hq, 2 * hd])?;
        let part = |start| b.slice(&heads, 3, start, hd)?.reshape([bsz, t, hq * hd]);
        Ok((part(0)?, Some(part(hd)?)))
    }

    /// Backward of [`split_gate`](Self::split_gate): the query projection's gradient
    /// from those of the queries and the gate.
    fn join_gate(&self, b: &dyn ComputeBackend, dq: &Tensor, d_gate: &Tensor) -> Result<Tensor> {
        let (hq, hd) = (self.arch.n_heads, self.arch.head_dim);
        let (bsz, t) = (dq.dims()[0], dq.dims()[1]);
        let heads = |x: &Tensor| x.reshape([bsz, t, hq, hd]);
        b.concat(&[heads(dq)?, heads(d_gate)?], 3)?.reshape([bsz, t, hq * 2 * hd])
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
        let mut d_merged = self.proj_backward(b, sink, &s.merged, &li.o, (l, Group::O), std::slice::from_ref(d_o))?;
        // merged = attn·σ(pre): d_attn = d·σ(pre), d_pre = d·attn·σ'(pre).
        let d_gate = match &s.gate {
            Some(g) => {
                let d_pre = b.sigmoid_backward(&g.pre, &b.mul(&d_merged, &g.attn)?)?;
                d_merged = b.mul(&d_merged, &b.sigmoid(&g.pre)?)?;
                Some(d_pre)
            }
            None => None,
        };
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
        if let Some(d_gate) = &d_gate {
            dq = self.join_gate(b, &dq, d_gate)?;
        }
        let d_qkv = [dq, dk, b.merge_heads(&dv)?];
        self.proj_backward(b, sink, h, &li.qkv, (l, Group::Qkv), &d_qkv)
    }
}
