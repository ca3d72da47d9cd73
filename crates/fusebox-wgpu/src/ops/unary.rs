//! Unary elementwise ops and their in-place forms.

use fusebox::cpu;
use fusebox::{in_place_on_cpu, Result, Tensor};

use crate::backend::WgpuBackend;
use crate::ops::convert::common_float;
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
    // lo > hi (or NaN bounds) go to the CPU, which reports them.
    if lo <= hi {
        if let Some(t) = be.unary_op("clamp", x, Un::Clamp, lo, hi)? {
            return Ok(t);
        }
    }
    fallback!(be, cpu::elementwise::clamp; [x], lo, hi)
}

pub(crate) fn exp_inplace(be: &WgpuBackend, x: &mut Tensor) -> Result<()> {
    if be.inplace_unary("exp_inplace", x, Un::Exp, 0.0, 0.0)? {
        return Ok(());
    }
    in_place_on_cpu(be, x, cpu::elementwise::exp_inplace)
}

pub(crate) fn log_inplace(be: &WgpuBackend, x: &mut Tensor) -> Result<()> {
    if be.inplace_unary("log_inplace", x, Un::Log, 0.0, 0.0)? {
        return Ok(());
    }
    in_place_on_cpu(be, x, cpu::elementwise::log_inplace)
}

pub(crate) fn sqrt_inplace(be: &WgpuBackend, x: &mut Tensor) -> Result<()> {
    if be.inplace_unary("sqrt_inplace", x, Un::Sqrt, 0.0, 0.0)? {
        return Ok(());
    }
    in_place_on_cpu(be, x, cpu::elementwise::sqrt_inplace)
}

pub(crate) fn pow_inplace(be: &WgpuBackend, x: &mut Tensor, p: f32) -> Result<()> {
    if be.inplace_unary("pow_inplace", x, Un::Pow, p, 0.0)? {
        return Ok(());
    }
    in_place_on_cpu(be, x, |cpu, x| cpu::elementwise::pow_inplace(cpu, x, p))
}

pub(crate) fn neg_inplace(be: &WgpuBackend, x: &mut Tensor) -> Result<()> {
    if be.inplace_unary("neg_inplace", x, Un::Neg, 0.0, 0.0)? {
        return Ok(());
    }
    in_place_on_cpu(be, x, cpu::elementwise::neg_inplace)
}

pub(crate) fn abs_inplace(be: &WgpuBackend, x: &mut Tensor) -> Result<()> {
    if be.inplace_unary("abs_inplace", x, Un::Abs, 0.0, 0.0)? {
        return Ok(());
    }
    in_place_on_cpu(be, x, cpu::elementwise::abs_inplace)
}

pub(crate) fn clamp_inplace(be: &WgpuBackend, x: &mut Tensor, lo: f32, hi: f32) -> Result<()> {
    if lo <= hi && be.inplace_unary("clamp_inplace", x, Un::Clamp, lo, hi)? {
        return Ok(());
    }
    in_place_on_cpu(be, x, |cpu, x| cpu::elementwise::clamp_inplace(cpu, x, lo, hi))
}

impl WgpuBackend {
    pub(crate) fn unary_op(&self, op: &'static str, x: &Tensor, code: Un, p0: f32, p1: f32) -> Result<Option<Tensor>> {
        let Some(dt) = common_float(&[x]) else {
            return Ok(None);
        };
        let x = self.widen(op, x)?;
        let y = self.ctx.unary(op, &x, code, p0, p1)?;
        self.narrow(op, y, dt).map(Some)
    }
}
