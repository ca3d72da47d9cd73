//! The MLP sublayer, forward and backward side by side:
//! `m = down(act(up(h)))` with `act` GELU (GPT-2), `silu(gate)·up` (SwiGLU) or
//! `gelu(gate)·up` (GeGLU), each a fused op with its fused backward.

use fusebox::{ComputeBackend, Error, GeluForm, PairGradients, Result, Tensor};

use super::arch::Mlp;
use super::lora::Group;
use super::{Sink, Transformer};

/// What the MLP keeps for its backward (its input is the block's saved `norm2` output).
#[derive(Debug)]
pub(super) struct MlpSaved {
    /// The up projections' outputs: `[fc]` or `[gate, up]`, `[.., F]`.
    up: Vec<Tensor>,
    /// The activation, input of the down projection, `[.., F]`.
    act: Tensor,
}

impl Transformer {
    /// `m = down(act(up(h)))` for layer `l`; `h` `[.., D]` → `[.., D]`.
    pub(super) fn mlp(&self, b: &dyn ComputeBackend, l: usize, h: &Tensor) -> Result<(Tensor, MlpSaved)> {
        let li = &self.index.layers[l];
        let up = self.proj(b, h, &li.up, (l, Group::Up))?;
        let act = match (self.arch.mlp, up.as_slice()) {
            (Mlp::Gelu, [fc]) => b.gelu(fc, GeluForm::Tanh)?,
            (Mlp::SwiGlu, [gate, up]) => b.silu_mul(gate, up)?,
            (Mlp::GeGlu, [gate, up]) => b.gelu_mul(gate, up, GeluForm::Tanh)?,
            _ => return Err(mlp_parts("Transformer::mlp", up.len())),
        };
        let m = self.proj(b, &act, &li.down, (l, Group::Down))?.remove(0);
        Ok((m, MlpSaved { up, act }))
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
        let li = &self.index.layers[l];
        let d_act = self.proj_backward(b, sink, &s.act, &li.down, (l, Group::Down), std::slice::from_ref(dm))?;
        let d_up = match (self.arch.mlp, s.up.as_slice()) {
            (Mlp::Gelu, [fc]) => vec![b.gelu_backward(fc, &d_act, GeluForm::Tanh)?],
            (Mlp::SwiGlu, [gate, up]) => {
                let PairGradients { da, db } = b.silu_mul_backward(gate, up, &d_act)?;
                vec![da, db]
            }
            (Mlp::GeGlu, [gate, up]) => {
                let PairGradients { da, db } = b.gelu_mul_backward(gate, up, &d_act, GeluForm::Tanh)?;
                vec![da, db]
            }
            _ => return Err(mlp_parts("Transformer::backward", s.up.len())),
        };
        self.proj_backward(b, sink, h, &li.up, (l, Group::Up), &d_up)
    }
}

fn mlp_parts(op: &'static str, got: usize) -> Error {
    Error::value(op, "MLP projections", "one (gelu) or two (gated)", got)
}
