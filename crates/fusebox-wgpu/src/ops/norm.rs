//! RMS norm and layer norm, forward and backward. F16/BF16 inputs are widened to f32 on
//! the device and outputs and gradients stored in their dtype; the saved statistics
//! (mean, rstd) are F32 whatever the input dtype, as on the CPU.

use fusebox::cpu;
use fusebox::spec::norm::{self as spec, RowsSpec};
use fusebox::{DType, NormGradients, NormOutput, Result, Shape, Tensor};

use crate::backend::WgpuBackend;
use crate::kernels;
use crate::ops::convert::word_aligned;
use crate::ops::{f, u};

/// Rows the norms' weight-gradient kernel sums in one loop (more go to the CPU).
pub(crate) const MAX_DW_ROWS: usize = 32768;

pub(crate) fn rms_norm(be: &WgpuBackend, x: &Tensor, weight: &Tensor, eps: f32) -> Result<NormOutput> {
    const OP: &str = "rms_norm";
    let RowsSpec { rows, d, dtype } = spec::rms_norm(x, weight, eps)?;
    if !word_aligned(&[x, weight]) {
        return fallback!(be, cpu::norm::rms_norm; [x, weight], eps);
    }
    let (x, w) = (be.widen(OP, x)?, be.widen(OP, weight)?);
    let output = be.ctx.empty(OP, x.shape().clone(), DType::F32)?;
    let rstd = be.ctx.empty(OP, Shape::new(spec::stat_dims(&x)), DType::F32)?;
    let params = [u(rows)?, u(d)?, f(eps)];
    be.ctx.dispatch(OP, &kernels::RMS_NORM, &[&x, &w, &output, &rstd], &params, rows as u64)?;
    Ok(NormOutput { output: be.narrow(OP, output, dtype)?, mean: None, rstd })
}

pub(crate) fn rms_norm_backward(
    be: &WgpuBackend,
    x: &Tensor,
    weight: &Tensor,
    rstd: &Tensor,
    d_out: &Tensor,
) -> Result<NormGradients> {
    let s = spec::rms_norm_backward(x, weight, rstd, d_out)?;
    if s.rows > MAX_DW_ROWS || !word_aligned(&[x, weight, d_out]) {
        return fallback!(be, cpu::norm::rms_norm_backward; [x, weight, rstd, d_out]);
    }
    be.norm_backward_native("rms_norm_backward", x, weight, None, rstd, d_out, s)
}

pub(crate) fn layer_norm(be: &WgpuBackend, x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<NormOutput> {
    const OP: &str = "layer_norm";
    let RowsSpec { rows, d, dtype } = spec::layer_norm(x, weight, bias, eps)?;
    if !word_aligned(&[x, weight, bias]) {
        return fallback!(be, cpu::norm::layer_norm; [x, weight, bias], eps);
    }
    let (x, w, b) = (be.widen(OP, x)?, be.widen(OP, weight)?, be.widen(OP, bias)?);
    let output = be.ctx.empty(OP, x.shape().clone(), DType::F32)?;
    let stat = Shape::new(spec::stat_dims(&x));
    let mean = be.ctx.empty(OP, stat.clone(), DType::F32)?;
    let rstd = be.ctx.empty(OP, stat, DType::F32)?;
    let params = [u(rows)?, u(d)?, f(eps)];
    be.ctx.dispatch(OP, &kernels::LAYER_NORM, &[&x, &w, &b, &output, &mean, &rstd], &params, rows as u64)?;
    Ok(NormOutput { output: be.narrow(OP, output, dtype)?, mean: Some(mean), rstd })
}

pub(crate) fn layer_norm_backward(
    be: &WgpuBackend,
    x: &Tensor,
    weight: &Tensor,
    mean: &Tensor,
    rstd: &Tensor,
    d_out: &Tensor,
) -> Result<NormGradients> {
    let s = spec::layer_norm_backward(x, weight, mean, rstd, d_out)?;
    if s.rows > MAX_DW_ROWS || !word_aligned(&[x, weight, d_out]) {
        return fallback!(be, cpu::norm::layer_norm_backward; [x, weight, mean, rstd, d_out]);
    }
    be.norm_backward_native("layer_norm_backward", x, weight, Some(mean), rstd, d_out, s)
}

pub(crate) fn add_rms_norm(
    be: &WgpuBackend,
    a: &Tensor,
    b: &Tensor,
    weight: &Tensor,
    eps: f32,
) -> Result<(Tensor, NormOutput)> {
    const OP: &str = "add_rms_norm";
    let RowsSpec { rows, d, dtype } = spec::add_rms_norm(a, b, weight, eps)?;
    if !word_aligned(&[a, b, weight]) {
        return fallback!(be, cpu::norm::add_rms_norm; [a, b, weight], eps);
    }
    let (a, b, w) = (be.widen(OP, a)?, be.widen(OP, b)?, be.widen(OP, weight)?);
    let s = be.ctx.empty(OP, a.shape().clone(), DType::F32)?;
    let output = be.ctx.empty(OP, a.shape().clone(), DType::F32)?;
    let rstd = be.ctx.empty(OP, Shape::new(spec::stat_dims(&a)), DType::F32)?;
    let params = [u(rows)?, u(d)?, f(eps)];
    be.ctx.dispatch(OP, &kernels::ADD_RMS_NORM, &[&a, &b, &w, &s, &output, &rstd], &params, rows as u64)?;
    Ok((be.narrow(OP, s, dtype)?, NormOutput { output: be.narrow(OP, output, dtype)?, mean: None, rstd }))
}

impl WgpuBackend {
    /// dx of rms (mean None) or layer norm, plus dw and db, in x's dtype (x, w and dy of
    /// one float dtype, the statistics F32).
    pub(crate) fn norm_backward_native(
        &self,
        op: &'static str,
        x: &Tensor,
        w: &Tensor,
        mean: Option<&Tensor>,
        rstd: &Tensor,
        dy: &Tensor,
        RowsSpec { rows, d, dtype }: RowsSpec,
    ) -> Result<NormGradients> {
        let (x, w, rstd, dy) = (self.widen(op, x)?, self.widen(op, w)?, self.dev(rstd)?, self.widen(op, dy)?);
        let mean = mean.map(|m| self.dev(m)).transpose()?;
        let has_mean = mean.is_some() as u32;
        let m = mean.as_ref().unwrap_or(&rstd);
        let dx = self.ctx.empty(op, x.shape().clone(), DType::F32)?;
        let dweight = self.ctx.empty(op, [d], DType::F32)?;
        let dbias = self.ctx.empty(op, [d], DType::F32)?;
        let params = [u(rows)?, u(d)?, has_mean];
        self.ctx.dispatch(op, &kernels::NORM_BACKWARD, &[&x, &w, m, &rstd, &dy, &dx], &params, rows as u64)?;
        self.ctx.flat(op, &kernels::NORM_DW, &[&x, m, &rstd, &dy, &dweight, &dbias], &params, d)?;
        Ok(NormGradients {
            dx: self.narrow(op, dx, dtype)?,
            dweight: self.narrow(op, dweight, dtype)?,
            dbias: mean.is_some().then(|| self.narrow(op, dbias, dtype)).transpose()?,
        })
    }
}
