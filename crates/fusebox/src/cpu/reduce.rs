//! reduce kernels (skeleton: to be written).

#![allow(unused_variables, unused_imports)]

use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;
use crate::types::*;

pub fn sum(cpu: &CpuBackend, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
    todo!()
}

pub fn mean(cpu: &CpuBackend, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
    todo!()
}

pub fn max(cpu: &CpuBackend, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
    todo!()
}

pub fn var(cpu: &CpuBackend, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
    todo!()
}

pub fn sum_abs(cpu: &CpuBackend, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
    todo!()
}

pub fn argmax(cpu: &CpuBackend, x: &Tensor, axis: usize) -> Result<Tensor> {
    todo!()
}

pub fn topk(cpu: &CpuBackend, x: &Tensor, k: usize) -> Result<TopK> {
    todo!()
}

pub fn max_backward(cpu: &CpuBackend, x: &Tensor, d_out: &Tensor, axis: usize) -> Result<Tensor> {
    todo!()
}

pub fn sum_to_shape(cpu: &CpuBackend, x: &Tensor, shape: &Shape) -> Result<Tensor> {
    todo!()
}
