//! The Gated DeltaNet token mixer of a linear-attention layer (Qwen3.5, Qwen3-Next),
//! forward and backward side by side (see [`LinearAttention`](super::arch::LinearAttention)
//! for the maths). Where the convolution's previous inputs and the delta rule's state
//! come from and go is the [`Pass`]'s; the training forward keeps what the backward needs
//! (the delta rule's backward recomputes its states from q, k, v, g and β).

use fusebox::{ComputeBackend, DType, Error, NormOutput, Result, Shape, Tensor};

use super::arch::LinearAttention;
use super::layout::LinearIndex;
use super::lora::Group;
use super::pass::Pass;
use super::{Sink, Transformer};

/// The epsilon of the q/k L2 norms (transformers' and FLA's `l2norm`).
const L2_EPS: f32 = 1e-6;

/// What the mixer keeps for its backward (its input is the block's saved `norm1` output).
#[derive(Debug)]
pub(super) struct DeltaSaved {
    /// The convolution's input (the qkv projection, channels first), `[B, C, T]`.
    conv_in: Tensor,
    /// q and k after the convolution, before their L2 norms, `[B, T, Hk, dk]`.
    q_pre: Tensor,
    k_pre: Tensor,
    /// The L2-normed q and k with their inverse norms.
    q: NormOutput,
    k: NormOutput,
    /// Values `[B, T, Hv, dv]`.
    v: Tensor,
    /// The gates' inputs (`a`, `b` projections) and outputs (g, β), `[B, T, Hv]`.
    a: Tensor,
    b: Tensor,
    g: Tensor,
    beta: Tensor,
    /// The delta rule's output and the norm's gate, `[B, T, Hv, dv]`.
    core: Tensor,
    z: Tensor,
    /// The gated norm's output, `W_out`'s input, `[B, T, Hv·dv]`.
    normed: Tensor,
}

/// `[B, T, C]` → `[B, C, T]` (a reshape for one position).
fn channels_first(b: &dyn ComputeBackend, x: &Tensor) -> Result<Tensor> {
    match *x.dims() {
        [bsz, 1, c] => x.reshape([bsz, c, 1]),
        _ => b.transpose(x, 1, 2),
    }
}

/// `[B, C, T]` → `[B, T, C]`.
fn channels_last(b: &dyn ComputeBackend, x: &Tensor) -> Result<Tensor> {
    match *x.dims() {
        [bsz, c, 1] => x.reshape([bsz, 1, c]),
        _ => b.transpose(x, 1, 2),
    }
}

impl Transformer {
    /// Layer `l`'s sizes and extra parameters, or an error when it is not linear.
    fn linear_parts(&self, l: usize) -> Result<(&LinearAttention, LinearIndex)> {
        let la = self.arch.linear_attention.as_ref();
        match (la, self.index.layers[l].linear) {
            (Some(la), Some(li)) => Ok((la, li)),
            _ => Err(Error::value("Transformer::delta_mixer", "layer", "a linear-attention layer", l)),
        }
    }

    /// The convolution's zero bias `[C]` (Qwen3.5's convolution has none; the op takes one).
    fn zero_conv_bias(&self, b: &dyn ComputeBackend, la: &LinearAttention) -> Result<Tensor> {
        b.zeros(&Shape::new([la.conv_channels()]), DType::F32)
    }

    /// Layer `l`'s Gated DeltaNet on `h` `[B, T, D]` → `[B, T, D]`, and in a training
    /// pass what the backward needs.
    pub(super) fn delta_mixer(
        &self,
        b: &dyn ComputeBackend,
        l: usize,
        h: &Tensor,
        pass: &mut Pass<'_, '_>,
    ) -> Result<(Tensor, Option<DeltaSaved>)> {
        let (la, lx) = self.linear_parts(l)?;
        let li = &self.index.layers[l];
        let [qkv, z, b_in, a]: [Tensor; 4] = self
            .proj(b, h, &li.qkv, (l, Group::Qkv))?
            .try_into()
            .map_err(|_| Error::value("Transformer::delta_mixer", "input projections", "four", "another count"))?;
        let (bsz, t) = (h.dims()[0], h.dims()[1]);
        let (kw, vw, hk, hv) = (la.key_width(), la.value_width(), la.k_heads, la.v_heads);
        let conv_in = channels_first(b, &qkv)?;
        let bias = self.zero_conv_bias(b, la)?;
        let mixed = channels_last(b, &pass.linear_conv(b, l, &conv_in, self.p(lx.conv), &bias)?)?;
        let q_pre = b.slice(&mixed, 2, 0, kw)?.reshape([bsz, t, hk, la.k_dim])?;
        let k_pre = b.slice(&mixed, 2, kw, kw)?.reshape([bsz, t, hk, la.k_dim])?;
        let v = b.slice(&mixed, 2, 2 * kw, vw)?.reshape([bsz, t, hv, la.v_dim])?;
        let (q, k) = (b.l2_norm(&q_pre, L2_EPS)?, b.l2_norm(&k_pre, L2_EPS)?);
        let gates = b.gdn_gates(&a, &b_in, self.p(lx.a_log), self.p(lx.dt_bias))?;
        let scale = (la.k_dim as f32).powf(-0.5);
        let core = pass.delta_rule(b, l, [&q.output, &k.output, &v, &gates.g, &gates.beta], scale)?;
        let z = z.reshape([bsz, t, hv, la.v_dim])?;
        let normed = b.rms_norm_gated(&core, &z, self.p(lx.norm), self.arch.norm_eps)?.reshape([bsz, t, vw])?;
        let o = self.proj(b, &normed, &li.o, (l, Group::O))?.remove(0);
        let saved = matches!(pass, Pass::Train { .. }).then(|| DeltaSaved {
            conv_in,
            q_pre,
            k_pre,
            q,
            k,
            v,
            a,
            b: b_in,
            g: gates.g,
            beta: gates.beta,
            core,
            z,
            normed,
        });
        Ok((o, saved))
    }

    /// Backward of [`delta_mixer`](Self::delta_mixer) (a training pass) at input `h`
    /// from `d_o`; returns `dh`.
    pub(super) fn delta_mixer_backward(
        &self,
        b: &dyn ComputeBackend,
        l: usize,
        h: &Tensor,
        s: &DeltaSaved,
        d_o: &Tensor,
        sink: &mut Sink<'_>,
    ) -> Result<Tensor> {
        let (la, lx) = self.linear_parts(l)?;
        let li = &self.index.layers[l];
        let (bsz, t) = (h.dims()[0], h.dims()[1]);
        let (kw, vw) = (la.key_width(), la.value_width());
        let d_normed = self.proj_backward(b, sink, &s.normed, &li.o, (l, Group::O), std::slice::from_ref(d_o))?;
        let d_normed = d_normed.reshape([bsz, t, la.v_heads, la.v_dim])?;
        let gn = b.rms_norm_gated_backward(&s.core, &s.z, self.p(lx.norm), &d_normed, self.arch.norm_eps)?;
        let scale = (la.k_dim as f32).powf(-0.5);
        let gd =
            b.gated_delta_rule_backward(&s.q.output, &s.k.output, &s.v, &s.g, &s.beta, None, &gn.dx, None, scale)?;
        let dq = b.l2_norm_backward(&s.q_pre, &s.q.rstd, &gd.dq)?.reshape([bsz, t, kw])?;
        let dk = b.l2_norm_backward(&s.k_pre, &s.k.rstd, &gd.dk)?.reshape([bsz, t, kw])?;
        let gg = b.gdn_gates_backward(&s.a, &s.b, self.p(lx.a_log), self.p(lx.dt_bias), &gd.dg, &gd.dbeta)?;
        let d_mixed = b.concat(&[dq, dk, gd.dv.reshape([bsz, t, vw])?], 2)?;
        let bias = self.zero_conv_bias(b, la)?;
        let gc =
            b.depthwise_conv1d_silu_backward(None, &s.conv_in, self.p(lx.conv), &bias, &channels_first(b, &d_mixed)?)?;
        if let Some(grads) = sink.base() {
            b.add_assign(&mut grads.tensors[lx.conv], &gc.dw)?;
            b.add_assign(&mut grads.tensors[lx.a_log], &gg.da_log)?;
            b.add_assign(&mut grads.tensors[lx.dt_bias], &gg.ddt_bias)?;
            b.add_assign(&mut grads.tensors[lx.norm], &gn.dweight)?;
        }
        let d_parts = [channels_last(b, &gc.dx)?, gn.dz.reshape([bsz, t, vw])?, gg.db, gg.da];
        self.proj_backward(b, sink, h, &li.qkv, (l, Group::Qkv), &d_parts)
    }
}
