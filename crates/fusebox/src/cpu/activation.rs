//! activation kernels (skeleton: to be written).

#![allow(unused_variables, unused_imports)]

use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;
use crate::types::*;

pub fn silu(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn silu_backward(cpu: &CpuBackend, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn gelu(cpu: &CpuBackend, x: &Tensor, form: GeluForm) -> Result<Tensor> {
    todo!()
}

pub fn gelu_backward(cpu: &CpuBackend, x: &Tensor, d_out: &Tensor, form: GeluForm) -> Result<Tensor> {
    todo!()
}

pub fn relu(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn relu_backward(cpu: &CpuBackend, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn sigmoid(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn sigmoid_backward(cpu: &CpuBackend, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn tanh(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn tanh_backward(cpu: &CpuBackend, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn silu_mul(cpu: &CpuBackend, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn silu_mul_backward(cpu: &CpuBackend, gate: &Tensor, up: &Tensor, d_out: &Tensor) -> Result<PairGradients> {
    todo!()
}

pub fn stable_softplus(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    todo!()
}
