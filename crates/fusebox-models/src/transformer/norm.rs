//! Norms, forward and backward side by side: LayerNorm (with a bias) or RMSNorm by the
//! layout's [`NormIndex`], the residual add fused with the norm that follows it, and the
//! optional post-norms of a sublayer's output (Gemma).

use fusebox::{ComputeBackend, NormGradients, NormOutput, Result, Tensor};

use super::layout::NormIndex;
use super::{Sink, Transformer};

/// What a post-norm keeps for its backward: its input and statistics.
pub(super) type PostNormSaved = Option<(Tensor, NormOutput)>;

impl Transformer {
    /// `norm(x)` with the weight (and bias) at `n`.
    pub(super) fn norm(&self, b: &dyn ComputeBackend, x: &Tensor, n: NormIndex) -> Result<NormOutput> {
        match n.bias {
            Some(bias) => b.layer_norm(x, self.p(n.weight), self.p(bias), self.arch.norm_eps),
            None => b.rms_norm(x, self.p(n.weight), self.arch.norm_eps),
        }
    }

    /// `(x + y, norm(x + y))`, in one pass for RMS norms.
    pub(super) fn add_norm(
        &self,
        b: &dyn ComputeBackend,
        x: &Tensor,
        y: &Tensor,
        n: NormIndex,
    ) -> Result<(Tensor, NormOutput)> {
        match n.bias {
            Some(_) => {
                let s = b.add(x, y)?;
                let out = self.norm(b, &s, n)?;
                Ok((s, out))
            }
            None => b.add_rms_norm(x, y, self.p(n.weight), self.arch.norm_eps),
        }
    }

    /// Backward of [`norm`](Self::norm) at input `x` with its saved `stats`: adds the
    /// weight (and bias) gradients into the sink when the base trains; returns `dx`.
    pub(super) fn norm_backward(
        &self,
        b: &dyn ComputeBackend,
        x: &Tensor,
        n: NormIndex,
        stats: &NormOutput,
        dy: &Tensor,
        sink: &mut Sink<'_>,
    ) -> Result<Tensor> {
        let NormGradients { dx, dweight, dbias } = match &stats.mean {
            Some(mean) => b.layer_norm_backward(x, self.p(n.weight), mean, &stats.rstd, dy)?,
            None => b.rms_norm_backward(x, self.p(n.weight), &stats.rstd, dy)?,
        };
        if let Some(grads) = sink.base() {
            b.add_assign(&mut grads.tensors[n.weight], &dweight)?;
            if let (Some(i), Some(g)) = (n.bias, dbias) {
                b.add_assign(&mut grads.tensors[i], &g)?;
            }
        }
        Ok(dx)
    }

    /// A sublayer output `y` through its post-norm when the block has one (else `y`);
    /// with what the backward needs.
    pub(super) fn post_norm(
        &self,
        b: &dyn ComputeBackend,
        y: Tensor,
        n: Option<NormIndex>,
    ) -> Result<(Tensor, PostNormSaved)> {
        match n {
            Some(n) => {
                let out = self.norm(b, &y, n)?;
                Ok((out.output.clone(), Some((y, out))))
            }
            None => Ok((y, None)),
        }
    }

    /// Backward of [`post_norm`](Self::post_norm); `dy` unchanged without one.
    pub(super) fn post_norm_backward(
        &self,
        b: &dyn ComputeBackend,
        n: Option<NormIndex>,
        saved: &PostNormSaved,
        dy: &Tensor,
        sink: &mut Sink<'_>,
    ) -> Result<Tensor> {
        match (n, saved) {
            (Some(n), Some((y, stats))) => self.norm_backward(b, y, n, stats, dy, sink),
            _ => Ok(dy.clone()),
        }
    }
}
