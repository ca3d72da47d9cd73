//! RMS norm and layer norm, forward and backward. F16/BF16 inputs are widened to f32 on
//! the device and outputs and gradients stored in their dtype; the saved statistics
//! (mean, rstd) are F32 whatever the input dtype, as on the CPU.

use fusebox::cpu;
use fusebox::{ComputeBackend, DType, NormGradients, NormOutput, Result, Shape, Tensor, ToBackend};

use crate::backend::WgpuBackend;
use crate::kernels;
use crate::ops::convert::common_float;
use crate::ops::{f, is_f32, u};

/// The norms' `eps` rule (finite, ≥ 0); other values go to the CPU, which reports them.
pub(crate) fn eps_ok(eps: f32) -> bool {
    eps.is_finite() && eps >= 0.0
}

/// Rows the norms' weight-gradient kernel sums in one loop (more go to the CPU).
pub(crate) const MAX_DW_ROWS: usize = 32768;

pub(crate) fn rms_norm(be: &WgpuBackend, x: &Tensor, weight: &Tensor, eps: f32) -> Result<NormOutput> {
    const OP: &str = "rms_norm";
    let dims = WgpuBackend::norm_dims(x, weight).filter(|_| eps_ok(eps));
    let (Some((rows, d)), Some(dtype)) = (dims, common_float(&[x, weight])) else {
        return fallback!(be, cpu::norm::rms_norm; [x, weight], eps);
    };
    let (x, w) = (be.widen(OP, x)?, be.widen(OP, weight)?);
    let output = be.ctx.empty(OP, x.shape().clone(), DType::F32)?;
    let rstd = be.ctx.empty(OP, Shape::new(x.dims()[..x.rank() - 1].to_vec()), DType::F32)?;
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
    let dims = WgpuBackend::norm_dims(x, weight).filter(|&(rows, _)| {
        rows <= MAX_DW_ROWS
            && common_float(&[x, weight, d_out]).is_some()
            && WgpuBackend::stat_ok(rstd, x)
            && d_out.shape() == x.shape()
    });
    match dims {
        Some(rd) => be.norm_backward_native("rms_norm_backward", x, weight, None, rstd, d_out, rd),
        None => fallback!(be, cpu::norm::rms_norm_backward; [x, weight, rstd, d_out]),
    }
}

pub(crate) fn layer_norm(be: &WgpuBackend, x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<NormOutput> {
    const OP: &str = "layer_norm";
    let dims = WgpuBackend::norm_dims(x, weight).filter(|_| bias.shape() == weight.shape() && eps_ok(eps));
    let (Some((rows, d)), Some(dtype)) = (dims, common_float(&[x, weight, bias])) else {
        return fallback!(be, cpu::norm::layer_norm; [x, weight, bias], eps);
    };
    let (x, w, b) = (be.widen(OP, x)?, be.widen(OP, weight)?, be.widen(OP, bias)?);
    let output = be.ctx.empty(OP, x.shape().clone(), DType::F32)?;
    let stat = Shape::new(x.dims()[..x.rank() - 1].to_vec());
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
    let dims = WgpuBackend::norm_dims(x, weight).filter(|&(rows, _)| {
        rows <= MAX_DW_ROWS
            && common_float(&[x, weight, d_out]).is_some()
            && WgpuBackend::stat_ok(rstd, x)
            && WgpuBackend::stat_ok(mean, x)
            && d_out.shape() == x.shape()
    });
    match dims {
        Some(rd) => be.norm_backward_native("layer_norm_backward", x, weight, Some(mean), rstd, d_out, rd),
        None => fallback!(be, cpu::norm::layer_norm_backward; [x, weight, mean, rstd, d_out]),
    }
}

pub(crate) fn add_rms_norm(
    be: &WgpuBackend,
    a: &Tensor,
    b: &Tensor,
    weight: &Tensor,
    eps: f32,
) -> Result<(Tensor, NormOutput)> {
    const OP: &str = "add_rms_norm";
    let dims = WgpuBackend::norm_dims(a, weight).filter(|_| a.shape() == b.shape() && eps_ok(eps));
    let (Some((rows, d)), Some(dtype)) = (dims, common_float(&[a, b, weight])) else {
        return fallback!(be, cpu::norm::add_rms_norm; [a, b, weight], eps);
    };
    let (a, b, w) = (be.widen(OP, a)?, be.widen(OP, b)?, be.widen(OP, weight)?);
    let s = be.ctx.empty(OP, a.shape().clone(), DType::F32)?;
    let output = be.ctx.empty(OP, a.shape().clone(), DType::F32)?;
    let rstd = be.ctx.empty(OP, Shape::new(a.dims()[..a.rank() - 1].to_vec()), DType::F32)?;
    let params = [u(rows)?, u(d)?, f(eps)];
    be.ctx.dispatch(OP, &kernels::ADD_RMS_NORM, &[&a, &b, &w, &s, &output, &rstd], &params, rows as u64)?;
    Ok((be.narrow(OP, s, dtype)?, NormOutput { output: be.narrow(OP, output, dtype)?, mean: None, rstd }))
}

impl WgpuBackend {
    pub(crate) fn norm_dims(x: &Tensor, w: &Tensor) -> Option<(usize, usize)> {
        if x.rank() == 0 || w.rank() != 1 {
            return None;
        }
        let d = x.shape().last_dim();
        (w.dims()[0] == d && d > 0).then(|| (x.elem_count() / d, d))
    }

    pub(crate) fn stat_ok(t: &Tensor, x: &Tensor) -> bool {
        is_f32(t) && t.dims() == &x.dims()[..x.rank() - 1]
    }

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
        (rows, d): (usize, usize),
    ) -> Result<NormGradients> {
        let dtype = x.dtype();
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
