//! Softmax, log-softmax and cross-entropy. F16/BF16 inputs are widened to f32 on the
//! device; softmax results are stored in the input dtype, cross-entropy's loss and
//! d_logits are F32 whatever the logits' dtype, as on the CPU.

use fusebox::cpu;
use fusebox::spec::softmax::{self as spec, AxisSpec, CrossEntropySpec};
use fusebox::{ComputeBackend, CrossEntropyOutput, DType, Result, Shape, Tensor};

use crate::backend::WgpuBackend;
use crate::kernels;
use crate::ops::convert::word_aligned;
use crate::ops::{f, u, Un};

/// Whether the row kernels take a validated softmax call: rows along the last axis, at
/// least one element each, every tensor bindable.
fn native(s: &AxisSpec, ts: &[&Tensor]) -> bool {
    s.is_last() && s.len > 0 && word_aligned(ts)
}

pub(crate) fn softmax(be: &WgpuBackend, x: &Tensor, dim: usize) -> Result<Tensor> {
    let s = spec::softmax(x, dim)?;
    if !native(&s, &[x]) {
        return fallback!(be, cpu::softmax::softmax; [x], dim);
    }
    be.softmax_native("softmax", x, s, 0)
}

pub(crate) fn softmax_backward(be: &WgpuBackend, y: &Tensor, d_out: &Tensor, dim: usize) -> Result<Tensor> {
    const OP: &str = "softmax_backward";
    let s = spec::softmax_backward(y, d_out, dim)?;
    if !native(&s, &[y, d_out]) {
        return fallback!(be, cpu::softmax::softmax_backward; [y, d_out], dim);
    }
    let AxisSpec { outer: rows, len: d, dtype, .. } = s;
    let (y, dy) = (be.widen(OP, y)?, be.widen(OP, d_out)?);
    let dx = be.ctx.empty(OP, y.shape().clone(), DType::F32)?;
    be.ctx.dispatch(OP, &kernels::SOFTMAX_BACKWARD, &[&y, &dy, &dx], &[u(rows)?, u(d)?], rows as u64)?;
    be.narrow(OP, dx, dtype)
}

pub(crate) fn log_softmax(be: &WgpuBackend, x: &Tensor, dim: usize) -> Result<Tensor> {
    let s = spec::log_softmax(x, dim)?;
    if !native(&s, &[x]) {
        return fallback!(be, cpu::softmax::log_softmax; [x], dim);
    }
    be.softmax_native("log_softmax", x, s, 1)
}

pub(crate) fn cross_entropy(
    be: &WgpuBackend,
    logits: &Tensor,
    targets: &Tensor,
    ignore_index: Option<u32>,
) -> Result<CrossEntropyOutput> {
    const OP: &str = "cross_entropy";
    let s = spec::cross_entropy(OP, logits, targets)?;
    if s.vocab == 0 || !word_aligned(&[logits]) {
        return fallback!(be, cpu::loss::cross_entropy; [logits, targets], ignore_index);
    }
    let (row_loss, d_logits, count) = be.cross_entropy_native(OP, logits, targets, s, ignore_index, 1.0)?;
    let loss = be.ctx.empty(OP, Shape::new(vec![]), DType::F32)?;
    let n = row_loss.elem_count();
    let scale = if count > 0 { 1.0 / count as f32 } else { 0.0 };
    let sum = be.ctx.empty(OP, [1], DType::F32)?;
    be.ctx.sum_rows(OP, &row_loss, n, 1, &sum)?;
    let mean = be.ctx.unary(OP, &sum, Un::MulS, scale, 0.0)?;
    be.copy_device(&loss, &mean)?;
    Ok(CrossEntropyOutput { loss, d_logits, count })
}

pub(crate) fn cross_entropy_backward(
    be: &WgpuBackend,
    logits: &Tensor,
    targets: &Tensor,
    ignore_index: Option<u32>,
    d_loss: f32,
) -> Result<Tensor> {
    const OP: &str = "cross_entropy_backward";
    let s = spec::cross_entropy(OP, logits, targets)?;
    if s.vocab == 0 || !word_aligned(&[logits]) {
        return fallback!(be, cpu::loss::cross_entropy_backward; [logits, targets], ignore_index, d_loss);
    }
    Ok(be.cross_entropy_native(OP, logits, targets, s, ignore_index, d_loss)?.1)
}

impl WgpuBackend {
    /// Cross-entropy rows of a validated call on the GPU: the targets read back and
    /// checked, then per-row loss, gradient and the counted rows.
    pub(crate) fn cross_entropy_native(
        &self,
        op: &'static str,
        logits: &Tensor,
        targets: &Tensor,
        CrossEntropySpec { n, vocab, .. }: CrossEntropySpec,
        ignore: Option<u32>,
        d_loss: f32,
    ) -> Result<(Tensor, Tensor, usize)> {
        let host_t = self.to_host(targets)?;
        let count = spec::cross_entropy_targets(op, host_t.as_slice::<u32>()?, vocab, ignore)?;
        let (logits, targets) = (self.widen(op, logits)?, self.dev(targets)?);
        let row_loss = self.ctx.empty(op, [n], DType::F32)?;
        let d_logits = self.ctx.empty(op, [n, vocab], DType::F32)?;
        let scale = if count > 0 { d_loss / count as f32 } else { 0.0 };
        let params = [u(n)?, u(vocab)?, ignore.is_some() as u32, ignore.unwrap_or(0), f(scale)];
        self.ctx.dispatch(
            op,
            &kernels::CROSS_ENTROPY,
            &[&logits, &targets, &row_loss, &d_logits],
            &params,
            n as u64,
        )?;
        Ok((row_loss, d_logits, count))
    }

    /// Softmax (`mode` 0) or log-softmax (1) of a validated call over the last axis.
    pub(crate) fn softmax_native(&self, op: &'static str, x: &Tensor, s: AxisSpec, mode: u32) -> Result<Tensor> {
        let x = self.widen(op, x)?;
        let (rows, d) = (s.outer, s.len);
        let out = self.ctx.empty(op, x.shape().clone(), DType::F32)?;
        self.ctx.dispatch(op, &kernels::SOFTMAX, &[&x, &out], &[u(rows)?, u(d)?, mode], rows as u64)?;
        self.narrow(op, out, s.dtype)
    }
}
