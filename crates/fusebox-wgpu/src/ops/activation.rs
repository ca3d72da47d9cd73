//! Activations and their backward passes.

use fusebox::cpu;
use fusebox::spec::elementwise as spec;
use fusebox::{DType, GeluForm, PairGradients, Result, Tensor};

use crate::backend::WgpuBackend;
use crate::kernels;
use crate::ops::convert::word_aligned;
use crate::ops::{u, Bin, Un};

pub(crate) fn silu(be: &WgpuBackend, x: &Tensor) -> Result<Tensor> {
    match be.unary_op("silu", x, Un::Silu, 0.0, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::activation::silu; [x]),
    }
}

pub(crate) fn silu_backward(be: &WgpuBackend, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
    match be.binary_op("silu_backward", ("x", x), ("d_out", d_out), Bin::SiluBwd, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::activation::silu_backward; [x, d_out]),
    }
}

pub(crate) fn gelu(be: &WgpuBackend, x: &Tensor, form: GeluForm) -> Result<Tensor> {
    let code = if form == GeluForm::Tanh { Un::GeluTanh } else { Un::GeluErf };
    match be.unary_op("gelu", x, code, 0.0, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::activation::gelu; [x], form),
    }
}

pub(crate) fn gelu_backward(be: &WgpuBackend, x: &Tensor, d_out: &Tensor, form: GeluForm) -> Result<Tensor> {
    let code = if form == GeluForm::Tanh { Bin::GeluTanhBwd } else { Bin::GeluErfBwd };
    match be.binary_op("gelu_backward", ("x", x), ("d_out", d_out), code, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::activation::gelu_backward; [x, d_out], form),
    }
}

pub(crate) fn relu(be: &WgpuBackend, x: &Tensor) -> Result<Tensor> {
    match be.unary_op("relu", x, Un::Relu, 0.0, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::activation::relu; [x]),
    }
}

pub(crate) fn relu_backward(be: &WgpuBackend, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
    match be.binary_op("relu_backward", ("x", x), ("d_out", d_out), Bin::ReluBwd, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::activation::relu_backward; [x, d_out]),
    }
}

pub(crate) fn sigmoid(be: &WgpuBackend, x: &Tensor) -> Result<Tensor> {
    match be.unary_op("sigmoid", x, Un::Sigmoid, 0.0, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::activation::sigmoid; [x]),
    }
}

pub(crate) fn sigmoid_backward(be: &WgpuBackend, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
    match be.binary_op("sigmoid_backward", ("x", x), ("d_out", d_out), Bin::SigmoidBwd, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::activation::sigmoid_backward; [x, d_out]),
    }
}

pub(crate) fn tanh(be: &WgpuBackend, x: &Tensor) -> Result<Tensor> {
    match be.unary_op("tanh", x, Un::Tanh, 0.0, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::activation::tanh; [x]),
    }
}

pub(crate) fn tanh_backward(be: &WgpuBackend, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
    match be.binary_op("tanh_backward", ("x", x), ("d_out", d_out), Bin::TanhBwd, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::activation::tanh_backward; [x, d_out]),
    }
}

pub(crate) fn silu_mul(be: &WgpuBackend, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    match be.binary_op("silu_mul", ("gate", gate), ("up", up), Bin::SiluMul, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::activation::silu_mul; [gate, up]),
    }
}

pub(crate) fn silu_mul_backward(be: &WgpuBackend, gate: &Tensor, up: &Tensor, d_out: &Tensor) -> Result<PairGradients> {
    const OP: &str = "silu_mul_backward";
    let dtype = spec::same(OP, &[("gate", gate), ("up", up), ("d_out", d_out)])?.dtype;
    if !word_aligned(&[gate, up, d_out]) {
        return fallback!(be, cpu::activation::silu_mul_backward; [gate, up, d_out]);
    }
    let (g, up, dy) = (be.widen(OP, gate)?, be.widen(OP, up)?, be.widen(OP, d_out)?);
    let da = be.ctx.empty(OP, g.shape().clone(), DType::F32)?;
    let db = be.ctx.empty(OP, g.shape().clone(), DType::F32)?;
    let n = g.elem_count();
    be.ctx.flat(OP, &kernels::SILU_MUL_BACKWARD, &[&g, &up, &dy, &da, &db], &[0, u(n)?], n)?;
    Ok(PairGradients { da: be.narrow(OP, da, dtype)?, db: be.narrow(OP, db, dtype)? })
}

pub(crate) fn gelu_mul(be: &WgpuBackend, gate: &Tensor, up: &Tensor, form: GeluForm) -> Result<Tensor> {
    let code = if form == GeluForm::Tanh { Bin::GeluTanhMul } else { Bin::GeluErfMul };
    match be.binary_op("gelu_mul", ("gate", gate), ("up", up), code, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::activation::gelu_mul; [gate, up], form),
    }
}

pub(crate) fn gelu_mul_backward(
    be: &WgpuBackend,
    gate: &Tensor,
    up: &Tensor,
    d_out: &Tensor,
    form: GeluForm,
) -> Result<PairGradients> {
    const OP: &str = "gelu_mul_backward";
    let dtype = spec::same(OP, &[("gate", gate), ("up", up), ("d_out", d_out)])?.dtype;
    if !word_aligned(&[gate, up, d_out]) {
        return fallback!(be, cpu::activation::gelu_mul_backward; [gate, up, d_out], form);
    }
    let (g, up, dy) = (be.widen(OP, gate)?, be.widen(OP, up)?, be.widen(OP, d_out)?);
    let da = be.ctx.empty(OP, g.shape().clone(), DType::F32)?;
    let db = be.ctx.empty(OP, g.shape().clone(), DType::F32)?;
    let n = g.elem_count();
    let code = u32::from(form == GeluForm::Erf);
    be.ctx.flat(OP, &kernels::GELU_MUL_BACKWARD, &[&g, &up, &dy, &da, &db], &[code, u(n)?], n)?;
    Ok(PairGradients { da: be.narrow(OP, da, dtype)?, db: be.narrow(OP, db, dtype)? })
}

pub(crate) fn stable_softplus(be: &WgpuBackend, x: &Tensor) -> Result<Tensor> {
    match be.unary_op("stable_softplus", x, Un::Softplus, 0.0, 0.0)? {
        Some(t) => Ok(t),
        None => fallback!(be, cpu::activation::stable_softplus; [x]),
    }
}
