//! Unary elementwise ops and their in-place forms.

use fusebox::cpu;
use fusebox::spec::elementwise as spec;
use fusebox::{in_place_on_cpu, Result, Tensor};

use crate::backend::WgpuBackend;
use crate::ops::convert::word_aligned;
use crate::ops::Un;

pub(crate) fn exp(be: &WgpuBackend, x: &Tensor) -> Result<Tensor> {
    match be.unary_op("exp", x, Un::Exp, 0.0, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::exp; [x]),
    }
}

pub(crate) fn log(be: &WgpuBackend, x: &Tensor) -> Result<Tensor> {
    match be.unary_op("log", x, Un::Log, 0.0, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::log; [x]),
    }
}

pub(crate) fn sqrt(be: &WgpuBackend, x: &Tensor) -> Result<Tensor> {
    match be.unary_op("sqrt", x, Un::Sqrt, 0.0, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::sqrt; [x]),
    }
}

pub(crate) fn pow(be: &WgpuBackend, x: &Tensor, p: f32) -> Result<Tensor> {
    match be.unary_op("pow", x, Un::Pow, p, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::pow; [x], p),
    }
}

pub(crate) fn neg(be: &WgpuBackend, x: &Tensor) -> Result<Tensor> {
    match be.unary_op("neg", x, Un::Neg, 0.0, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::neg; [x]),
    }
}

pub(crate) fn abs(be: &WgpuBackend, x: &Tensor) -> Result<Tensor> {
    match be.unary_op("abs", x, Un::Abs, 0.0, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::abs; [x]),
    }
}

pub(crate) fn clamp(be: &WgpuBackend, x: &Tensor, lo: f32, hi: f32) -> Result<Tensor> {
    spec::clamp_bounds("clamp", lo, hi)?;
    match be.unary_op("clamp", x, Un::Clamp, lo, hi)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::elementwise::clamp; [x], lo, hi),
    }
}

pub(crate) fn exp_inplace(be: &WgpuBackend, x: &mut Tensor) -> Result<()> {
    spec::same("exp_inplace", &[("x", &*x)])?;
    if be.inplace_unary("exp_inplace", x, Un::Exp, 0.0, 0.0)? {
        return Ok(());
    }
    in_place_on_cpu(be, x, cpu::elementwise::exp_inplace)
}

pub(crate) fn log_inplace(be: &WgpuBackend, x: &mut Tensor) -> Result<()> {
    spec::same("log_inplace", &[("x", &*x)])?;
    if be.inplace_unary("log_inplace", x, Un::Log, 0.0, 0.0)? {
        return Ok(());
    }
    in_place_on_cpu(be, x, cpu::elementwise::log_inplace)
}

pub(crate) fn sqrt_inplace(be: &WgpuBackend, x: &mut Tensor) -> Result<()> {
    spec::same("sqrt_inplace", &[("x", &*x)])?;
    if be.inplace_unary("sqrt_inplace", x, Un::Sqrt, 0.0, 0.0)? {
        return Ok(());
    }
    in_place_on_cpu(be, x, cpu::elementwise::sqrt_inplace)
}

pub(crate) fn pow_inplace(be: &WgpuBackend, x: &mut Tensor, p: f32) -> Result<()> {
    spec::same("pow_inplace", &[("x", &*x)])?;
    if be.inplace_unary("pow_inplace", x, Un::Pow, p, 0.0)? {
        return Ok(());
    }
    in_place_on_cpu(be, x, |cpu, x| cpu::elementwise::pow_inplace(cpu, x, p))
}

pub(crate) fn neg_inplace(be: &WgpuBackend, x: &mut Tensor) -> Result<()> {
    spec::same("neg_inplace", &[("x", &*x)])?;
    if be.inplace_unary("neg_inplace", x, Un::Neg, 0.0, 0.0)? {
        return Ok(());
    }
    in_place_on_cpu(be, x, cpu::elementwise::neg_inplace)
}

pub(crate) fn abs_inplace(be: &WgpuBackend, x: &mut Tensor) -> Result<()> {
    spec::same("abs_inplace", &[("x", &*x)])?;
    if be.inplace_unary("abs_inplace", x, Un::Abs, 0.0, 0.0)? {
        return Ok(());
    }
    in_place_on_cpu(be, x, cpu::elementwise::abs_inplace)
}

pub(crate) fn clamp_inplace(be: &WgpuBackend, x: &mut Tensor, lo: f32, hi: f32) -> Result<()> {
    spec::clamp_bounds("clamp_inplace", lo, hi)?;
    spec::same("clamp_inplace", &[("x", &*x)])?;
    if be.inplace_unary("clamp_inplace", x, Un::Clamp, lo, hi)? {
        return Ok(());
    }
    in_place_on_cpu(be, x, |cpu, x| cpu::elementwise::clamp_inplace(cpu, x, lo, hi))
}

impl WgpuBackend {
    /// `unop(x)` of a call [`spec::same`] accepts; `None` when the kernel cannot bind x.
    pub(crate) fn unary_op(&self, op: &'static str, x: &Tensor, code: Un, p0: f32, p1: f32) -> Result<Option<Tensor>> {
        let dt = spec::same(op, &[("x", x)])?.dtype;
        if !word_aligned(&[x]) {
            return Ok(None);
        }
        let x = self.widen(op, x)?;
        let y = self.ctx.unary(op, &x, code, p0, p1)?;
        self.narrow(op, y, dt).map(Some)
    }
}
