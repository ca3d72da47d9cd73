//! The MLP sublayer, forward and backward side by side: dense,
//! `m = down(act(up(h)))` with `act` GELU (GPT-2), `silu(gate)·up` (SwiGLU) or
//! `gelu(gate)·up` (GeGLU) or gpt-oss's clamped SwiGLU, each a fused op with its fused
//! backward; or a mixture of experts (`experts.rs`) with the same gated activation.

use fusebox::{ComputeBackend, Error, GeluForm, PairGradients, Result, Tensor};

use super::arch::Mlp;
use super::experts::ExpertsSaved;
use super::layout::{Ffn, Proj};
use super::lora::Group;
use super::{Sink, Transformer};

/// What the MLP keeps for its backward (its input is the block's saved `norm2` output).
#[derive(Debug)]
pub(super) enum MlpSaved {
    /// A dense MLP.
    Dense {
        /// The up projections' outputs: `[fc]` or `[gate, up]`, `[.., F]`.
        up: Vec<Tensor>,
        /// The activation, input of the down projection, `[.., F]`.
        act: Tensor,
    },
    /// A mixture of experts.
    Experts(Box<ExpertsSaved>),
}

/// The LoRA groups of a dense MLP's projections.
pub(super) const ADAPTED: (Group, Group) = (Group::Up, Group::Down);

/// The gated activation `act(gate)·up` of `mlp` (SwiGLU, GeGLU, clamped SwiGLU).
pub(super) fn gated(b: &dyn ComputeBackend, mlp: Mlp, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    match mlp {
        Mlp::SwiGlu => b.silu_mul(gate, up),
        Mlp::GeGlu => b.gelu_mul(gate, up, GeluForm::Tanh),
        Mlp::ClampedSwiGlu { alpha, limit } => b.clamped_swiglu(gate, up, alpha, limit),
        Mlp::Gelu => Err(mlp_parts("Transformer::mlp", 2)),
    }
}

/// Backward of [`gated`]: `(d_gate, d_up)`.
pub(super) fn gated_backward(
    b: &dyn ComputeBackend,
    mlp: Mlp,
    gate: &Tensor,
    up: &Tensor,
    d_act: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let PairGradients { da, db } = match mlp {
        Mlp::SwiGlu => b.silu_mul_backward(gate, up, d_act)?,
        Mlp::GeGlu => b.gelu_mul_backward(gate, up, d_act, GeluForm::Tanh)?,
        Mlp::ClampedSwiGlu { alpha, limit } => b.clamped_swiglu_backward(gate, up, d_act, alpha, limit)?,
        Mlp::Gelu => return Err(mlp_parts("Transformer::backward", 2)),
    };
    Ok((da, db))
}

impl Transformer {
    /// The MLP of layer `l` on `h` `[.., D]` → `[.., D]`.
    pub(super) fn mlp(&self, b: &dyn ComputeBackend, l: usize, h: &Tensor) -> Result<(Tensor, MlpSaved)> {
        match &self.index.layers[l].ffn {
            Ffn::Dense { up, down } => self.dense_mlp(b, l, h, (up, down), ADAPTED),
            Ffn::Experts(e) => {
                let (m, saved) = self.experts(b, l, e, h)?;
                Ok((m, MlpSaved::Experts(Box::new(saved))))
            }
        }
    }

    /// `m = down(act(up(h)))`, with the LoRA adapters of `groups` (`ADAPTED`, or
    /// `Unadapted` twice for a mixture's shared expert).
    pub(super) fn dense_mlp(
        &self,
        b: &dyn ComputeBackend,
        l: usize,
        h: &Tensor,
        (up, down): (&Proj, &Proj),
        groups: (Group, Group),
    ) -> Result<(Tensor, MlpSaved)> {
        let up = self.proj(b, h, up, (l, groups.0))?;
        let act = match up.as_slice() {
            [fc] if self.arch.mlp == Mlp::Gelu => b.gelu(fc, GeluForm::Tanh)?,
            [gate, up] => gated(b, self.arch.mlp, gate, up)?,
            _ => return Err(mlp_parts("Transformer::mlp", up.len())),
        };
        let m = self.proj(b, &act, down, (l, groups.1))?.remove(0);
        Ok((m, MlpSaved::Dense { up, act }))
    }

    /// Backward of [`mlp`](Self::mlp) at input `h` from `dm`; returns `dh`.
    pub(super) fn mlp_backward(
        &self,
        b: &dyn ComputeBackend,
        l: usize,
        h: &Tensor,
        s: &MlpSaved,
        dm: &Tensor,
        sink: &mut Sink<'_>,
    ) -> Result<Tensor> {
        match (&self.index.layers[l].ffn, s) {
            (Ffn::Dense { up: up_proj, down }, saved @ MlpSaved::Dense { .. }) => {
                self.dense_mlp_backward(b, l, h, (up_proj, down), ADAPTED, saved, dm, sink)
            }
            (Ffn::Experts(e), MlpSaved::Experts(saved)) => self.experts_backward(b, l, e, h, saved, dm, sink),
            _ => Err(Error::value("Transformer::backward", "saved MLP activations", "the layer's MLP kind", l)),
        }
    }
}

impl Transformer {
    /// Backward of [`dense_mlp`](Self::dense_mlp) with projections `(up, down)` at input
    /// `h` from `dm`; returns `dh`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dense_mlp_backward(
        &self,
        b: &dyn ComputeBackend,
        l: usize,
        h: &Tensor,
        (up_proj, down): (&Proj, &Proj),
        groups: (Group, Group),
        s: &MlpSaved,
        dm: &Tensor,
        sink: &mut Sink<'_>,
    ) -> Result<Tensor> {
        let MlpSaved::Dense { up, act } = s else {
            return Err(Error::value("Transformer::backward", "saved MLP activations", "a dense MLP's", l));
        };
        let d_act = self.proj_backward(b, sink, act, down, (l, groups.1), std::slice::from_ref(dm))?;
        let d_up = match up.as_slice() {
            [fc] if self.arch.mlp == Mlp::Gelu => vec![b.gelu_backward(fc, &d_act, GeluForm::Tanh)?],
            [gate, up] => {
                let (dg, du) = gated_backward(b, self.arch.mlp, gate, up, &d_act)?;
                vec![dg, du]
            }
            _ => return Err(mlp_parts("Transformer::backward", up.len())),
        };
        self.proj_backward(b, sink, h, up_proj, (l, groups.0), &d_up)
    }
}

fn mlp_parts(op: &'static str, got: usize) -> Error {
    Error::value(op, "MLP projections", "one (gelu) or two (gated)", got)
}
