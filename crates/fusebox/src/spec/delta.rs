//! Linear attention: the gated delta rule (`gated_delta_rule`, its backward, the
//! one-token `gated_delta_rule_step` and its ragged batched form).
//!
//! Every tensor is F32 (the state is carried in f32 from step to step, and the chunked
//! form's triangular solve needs f32). Value head `h` reads key head `h / (Hv/Hk)`.

use super::check;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// A validated delta-rule call: its sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaRuleSpec {
    /// Sequences (B), or rows of a batched step (N).
    pub batch: usize,
    /// Tokens per sequence (1 for the step forms).
    pub tokens: usize,
    /// Query/key heads (Hk).
    pub k_heads: usize,
    /// Value heads (Hv), a multiple of Hk.
    pub v_heads: usize,
    /// Key (and query) head size (Dk).
    pub dk: usize,
    /// Value head size (Dv).
    pub dv: usize,
}

impl DeltaRuleSpec {
    /// Value heads per key head (`Hv / Hk`).
    pub fn group(&self) -> usize {
        self.v_heads / self.k_heads
    }
    /// Dims of one state per sequence: `[B, Hv, Dk, Dv]`.
    pub fn state_dims(&self) -> [usize; 4] {
        [self.batch, self.v_heads, self.dk, self.dv]
    }
    /// Floats of one head's state (`Dk·Dv`).
    pub fn state_len(&self) -> usize {
        self.dk * self.dv
    }
}

fn f32_input(op: &'static str, what: &str, t: &Tensor) -> Result<()> {
    if t.dtype() == DType::F32 {
        Ok(())
    } else {
        Err(Error::dtype(op, what, "f32 (the delta rule computes and keeps its state in f32)", t.dtype()))
    }
}

fn dims_of(op: &'static str, what: &str, t: &Tensor, dims: &[usize]) -> Result<()> {
    f32_input(op, what, t)?;
    check::shape(op, what, t, dims)
}

fn check_scale(op: &'static str, scale: f32) -> Result<()> {
    if scale.is_finite() {
        Ok(())
    } else {
        Err(Error::value(op, "scale", "a finite number", scale))
    }
}

/// Reads `[lead..., H, D]` of q, k, v and checks what the sequence and the step forms
/// share: q and k equal, v's leading dims equal to q's, Hv a positive multiple of Hk,
/// nonzero head sizes. `lead` is 2 (`B, T`) or 1 (`B`).
fn heads(op: &'static str, q: &Tensor, k: &Tensor, v: &Tensor, lead: usize) -> Result<DeltaRuleSpec> {
    let rank = lead + 2;
    let layout = if lead == 2 { "[B, T, H, D]" } else { "[B, H, D]" };
    for (what, t) in [("q", q), ("k", k), ("v", v)] {
        f32_input(op, what, t)?;
        if t.rank() != rank {
            return Err(Error::shape(op, what, format!("rank {rank} {layout}"), t.shape()));
        }
    }
    check::same_shape(op, "k (q's shape)", q, k)?;
    let (qd, vd) = (q.dims(), v.dims());
    if vd[..lead] != qd[..lead] {
        let want = format!("{:?} leading dims (q's)", &qd[..lead]);
        return Err(Error::shape(op, "v", want, v.shape()));
    }
    let (hk, dk, hv, dv) = (qd[lead], qd[lead + 1], vd[lead], vd[lead + 1]);
    if hk == 0 || dk == 0 {
        return Err(Error::shape(op, "q", "at least one head of nonzero size", q.shape()));
    }
    if hv == 0 || dv == 0 || !hv.is_multiple_of(hk) {
        return Err(Error::shape(
            op,
            "v",
            format!("value heads a positive multiple of q's {hk} heads, Dv ≥ 1"),
            v.shape(),
        ));
    }
    let tokens = if lead == 2 { qd[1] } else { 1 };
    Ok(DeltaRuleSpec { batch: qd[0], tokens, k_heads: hk, v_heads: hv, dk, dv })
}

/// `gated_delta_rule(q, k, v, g, beta, initial_state, scale)`: q, k `[B, T, Hk, Dk]`;
/// v `[B, T, Hv, Dv]` with `Hv % Hk == 0`; g, beta `[B, T, Hv]`; initial_state
/// `[B, Hv, Dk, Dv]`; all F32; scale finite.
pub fn gated_delta_rule(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    initial_state: Option<&Tensor>,
    scale: f32,
) -> Result<DeltaRuleSpec> {
    sequence("gated_delta_rule", q, k, v, g, beta, initial_state, scale)
}

#[allow(clippy::too_many_arguments)]
fn sequence(
    op: &'static str,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    initial_state: Option<&Tensor>,
    scale: f32,
) -> Result<DeltaRuleSpec> {
    let s = heads(op, q, k, v, 2)?;
    let gates = [s.batch, s.tokens, s.v_heads];
    dims_of(op, "g", g, &gates)?;
    dims_of(op, "beta", beta, &gates)?;
    if let Some(state) = initial_state {
        dims_of(op, "initial_state", state, &s.state_dims())?;
    }
    check_scale(op, scale)?;
    Ok(s)
}

/// `gated_delta_rule_backward(q, k, v, g, beta, initial_state, d_out, d_state, scale)`:
/// the forward's rules, d_out `[B, T, Hv, Dv]` and d_state `[B, Hv, Dk, Dv]`, F32.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    initial_state: Option<&Tensor>,
    d_out: &Tensor,
    d_state: Option<&Tensor>,
    scale: f32,
) -> Result<DeltaRuleSpec> {
    const OP: &str = "gated_delta_rule_backward";
    let s = sequence(OP, q, k, v, g, beta, initial_state, scale)?;
    dims_of(OP, "d_out (v's shape)", d_out, v.dims())?;
    if let Some(d_state) = d_state {
        dims_of(OP, "d_state", d_state, &s.state_dims())?;
    }
    Ok(s)
}

/// `gated_delta_rule_step(q, k, v, g, beta, state, scale)`: q, k `[B, Hk, Dk]`; v
/// `[B, Hv, Dv]`, `Hv % Hk == 0`; g, beta `[B, Hv]`; state `[B, Hv, Dk, Dv]`; all F32.
/// (Writability of the state is the kernel's check.)
pub fn gated_delta_rule_step(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
    scale: f32,
) -> Result<DeltaRuleSpec> {
    const OP: &str = "gated_delta_rule_step";
    let s = step_rows(OP, q, k, v, g, beta, scale)?;
    dims_of(OP, "state", state, &s.state_dims())?;
    Ok(s)
}

fn step_rows(
    op: &'static str,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    scale: f32,
) -> Result<DeltaRuleSpec> {
    let s = heads(op, q, k, v, 1)?;
    let gates = [s.batch, s.v_heads];
    dims_of(op, "g", g, &gates)?;
    dims_of(op, "beta", beta, &gates)?;
    check_scale(op, scale)?;
    Ok(s)
}

/// `batched_gated_delta_rule_step(q, k, v, g, beta, states, scale)`: the step's rules
/// with N rows (`q`'s first dim) and `states.len() == N`, each `[1, Hv, Dk, Dv]` F32.
pub fn batched_gated_delta_rule_step(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    states: &[&Tensor],
    scale: f32,
) -> Result<DeltaRuleSpec> {
    const OP: &str = "batched_gated_delta_rule_step";
    let s = step_rows(OP, q, k, v, g, beta, scale)?;
    if states.len() != s.batch {
        return Err(Error::value(OP, "states", format!("one per row of q ({})", s.batch), states.len()));
    }
    let one = Shape::new([1, s.v_heads, s.dk, s.dv]);
    for (i, state) in states.iter().enumerate() {
        f32_input(OP, &format!("states[{i}]"), state)?;
        if state.shape() != &one {
            return Err(Error::shape(OP, format!("states[{i}]"), &one, state.shape()));
        }
    }
    Ok(s)
}
