//! The decoder block, forward and backward side by side, composed of its sublayers:
//! `x_mid = x + post_attn_norm(mixer(norm1(x)))`,
//! `x_out = x_mid + post_mlp_norm(mlp(norm2(x_mid)))`, the token mixer attention or
//! (a linear-attention layer) the Gated DeltaNet. Every pass runs this one block.

use fusebox::{ComputeBackend, NormOutput, Result, Tensor};

use super::attention::AttentionSaved;
use super::cache::RopeTables;
use super::delta::DeltaSaved;
use super::mlp::MlpSaved;
use super::norm::PostNormSaved;
use super::pass::Pass;
use super::{Sink, Transformer};

/// What a block's token mixer keeps for its backward.
#[derive(Debug)]
enum MixerSaved {
    Attention(AttentionSaved),
    Delta(DeltaSaved),
}

/// What one block's training forward keeps for its backward.
#[derive(Debug)]
pub(super) struct LayerSaved {
    /// The block input `[B, T, D]` and `norm1` of it.
    pub(super) x_in: Tensor,
    pub(super) norm1: NormOutput,
    mixer: MixerSaved,
    post_attn: PostNormSaved,
    /// After the attention's residual add, and `norm2` of it.
    x_mid: Tensor,
    norm2: NormOutput,
    pub(super) mlp: MlpSaved,
    post_mlp: PostNormSaved,
}

impl Transformer {
    /// Block `l` on `x` with `h = norm1(x)`; returns the block output and the next norm
    /// of it (the next block's `norm1`, or the final norm). A training pass saves the
    /// block's activations.
    pub(super) fn block(
        &self,
        b: &dyn ComputeBackend,
        l: usize,
        x: Tensor,
        h: NormOutput,
        pass: &mut Pass<'_, '_>,
    ) -> Result<(Tensor, NormOutput)> {
        let li = &self.index.layers[l];
        let (o, mixer) = if self.arch.is_linear(l) {
            let (o, s) = self.delta_mixer(b, l, &h.output, pass)?;
            (o, s.map(MixerSaved::Delta))
        } else {
            let (o, s) = self.attention(b, l, &h.output, pass)?;
            (o, s.map(MixerSaved::Attention))
        };
        let (o, post_attn) = self.post_norm(b, o, li.post_attn_norm)?;
        let (x_mid, norm2) = self.add_norm(b, &x, &o, li.norm2)?;
        let (m, mlp) = self.mlp(b, l, &norm2.output)?;
        let (m, post_mlp) = self.post_norm(b, m, li.post_mlp_norm)?;
        let next = self.index.layers.get(l + 1).map_or(self.index.norm_f, |n| n.norm1);
        let (x_out, h_next) = self.add_norm(b, &x_mid, &m, next)?;
        if let (Pass::Train { saved, .. }, Some(mixer)) = (pass, mixer) {
            saved.push(LayerSaved { x_in: x, norm1: h, mixer, post_attn, x_mid, norm2, mlp, post_mlp });
        }
        Ok((x_out, h_next))
    }

    /// Backward of [`block`](Self::block) `l` from `dx` (the gradient of its output);
    /// returns the gradient of its input.
    pub(super) fn block_backward(
        &self,
        b: &dyn ComputeBackend,
        l: usize,
        s: &LayerSaved,
        rope: &RopeTables,
        dx: &Tensor,
        sink: &mut Sink<'_>,
    ) -> Result<Tensor> {
        let li = &self.index.layers[l];
        let d_m = self.post_norm_backward(b, li.post_mlp_norm, &s.post_mlp, dx, sink)?;
        let dh2 = self.mlp_backward(b, l, &s.norm2.output, &s.mlp, &d_m, sink)?;
        let dn2 = self.norm_backward(b, &s.x_mid, li.norm2, &s.norm2, &dh2, sink)?;
        let dx_mid = b.add(dx, &dn2)?;
        let d_o = self.post_norm_backward(b, li.post_attn_norm, &s.post_attn, &dx_mid, sink)?;
        let dh1 = match &s.mixer {
            MixerSaved::Attention(a) => self.attention_backward(b, l, &s.norm1.output, a, rope, &d_o, sink)?,
            MixerSaved::Delta(d) => self.delta_mixer_backward(b, l, &s.norm1.output, d, &d_o, sink)?,
        };
        let dn1 = self.norm_backward(b, &s.x_in, li.norm1, &s.norm1, &dh1, sink)?;
        b.add(&dx_mid, &dn1)
    }
}
