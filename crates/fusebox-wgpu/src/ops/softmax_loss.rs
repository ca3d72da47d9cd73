//! Softmax, log-softmax and cross-entropy. F16/BF16 inputs are widened to f32 on the
//! device; softmax results are stored in the input dtype, cross-entropy's loss and
//! d_logits are F32 whatever the logits' dtype, as on the CPU.

use fusebox::cpu;
use fusebox::{ComputeBackend, CrossEntropyOutput, DType, Result, Shape, Tensor, ToBackend};

use crate::backend::WgpuBackend;
use crate::kernels;
use crate::ops::convert::common_float;
use crate::ops::{f, u, Un};

pub(crate) fn softmax(be: &WgpuBackend, x: &Tensor, dim: usize) -> Result<Tensor> {
    match be.softmax_native("softmax", x, dim, 0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::softmax::softmax; [x], dim),
    }
}

pub(crate) fn softmax_backward(be: &WgpuBackend, y: &Tensor, d_out: &Tensor, dim: usize) -> Result<Tensor> {
    const OP: &str = "softmax_backward";
    let ok = y.rank() > 0 && dim + 1 == y.rank() && y.shape() == d_out.shape() && y.shape().last_dim() > 0;
    let Some(dtype) = common_float(&[y, d_out]).filter(|_| ok) else {
        return fallback!(be, cpu::softmax::softmax_backward; [y, d_out], dim);
    };
    let (y, dy) = (be.widen(OP, y)?, be.widen(OP, d_out)?);
    let d = y.shape().last_dim();
    let rows = y.elem_count() / d;
    let dx = be.ctx.empty(OP, y.shape().clone(), DType::F32)?;
    be.ctx.dispatch(OP, &kernels::SOFTMAX_BACKWARD, &[&y, &dy, &dx], &[u(rows)?, u(d)?], rows as u64)?;
    be.narrow(OP, dx, dtype)
}

pub(crate) fn log_softmax(be: &WgpuBackend, x: &Tensor, dim: usize) -> Result<Tensor> {
    match be.softmax_native("log_softmax", x, dim, 1)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::softmax::log_softmax; [x], dim),
    }
}

pub(crate) fn cross_entropy(
    be: &WgpuBackend,
    logits: &Tensor,
    targets: &Tensor,
    ignore_index: Option<u32>,
) -> Result<CrossEntropyOutput> {
    const OP: &str = "cross_entropy";
    let Some((row_loss, d_logits, count)) = be.cross_entropy_native(OP, logits, targets, ignore_index, 1.0)? else {
        return fallback!(be, cpu::loss::cross_entropy; [logits, targets], ignore_index);
    };
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
    match be.cross_entropy_native("cross_entropy_backward", logits, targets, ignore_index, d_loss)? {
        Some((_, d_logits, _)) => Ok(d_logits),
        None => fallback!(be, cpu::loss::cross_entropy_backward; [logits, targets], ignore_index, d_loss),
    }
}

impl WgpuBackend {
    /// Cross-entropy rows on the GPU: validated targets (read back), loss and gradient.
    pub(crate) fn cross_entropy_native(
        &self,
        op: &'static str,
        logits: &Tensor,
        targets: &Tensor,
        ignore: Option<u32>,
        d_loss: f32,
    ) -> Result<Option<(Tensor, Tensor, usize)>> {
        if common_float(&[logits]).is_none()
            || logits.rank() != 2
            || targets.dtype() != DType::U32
            || targets.rank() != 1
        {
            return Ok(None);
        }
        let (n, vocab) = (logits.dims()[0], logits.dims()[1]);
        if targets.dims()[0] != n || vocab == 0 {
            return Ok(None);
        }
        let host_t = self.to_host(targets)?;
        let ts = host_t.as_slice::<u32>()?;
        if ts.iter().any(|&t| Some(t) != ignore && t as usize >= vocab) {
            return Ok(None);
        }
        let count = ts.iter().filter(|&&t| Some(t) != ignore).count();
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
        Ok(Some((row_loss, d_logits, count)))
    }

    pub(crate) fn softmax_native(&self, op: &'static str, x: &Tensor, dim: usize, mode: u32) -> Result<Option<Tensor>> {
        let ok = x.rank() > 0 && dim + 1 == x.rank() && x.shape().last_dim() > 0;
        let Some(dt) = common_float(&[x]).filter(|_| ok) else {
            return Ok(None);
        };
        let x = self.widen(op, x)?;
        let d = x.shape().last_dim();
        let rows = x.elem_count() / d;
        let out = self.ctx.empty(op, x.shape().clone(), DType::F32)?;
        self.ctx.dispatch(op, &kernels::SOFTMAX, &[&x, &out], &[u(rows)?, u(d)?, mode], rows as u64)?;
        self.narrow(op, out, dt).map(Some)
    }
}
