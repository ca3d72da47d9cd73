//! softmax kernels (skeleton: to be written).

#![allow(unused_variables, unused_imports)]

use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;
use crate::types::*;

pub fn softmax(cpu: &CpuBackend, x: &Tensor, dim: usize) -> Result<Tensor> {
    todo!()
}

pub fn softmax_backward(cpu: &CpuBackend, y: &Tensor, d_out: &Tensor, dim: usize) -> Result<Tensor> {
    todo!()
}

pub fn log_softmax(cpu: &CpuBackend, x: &Tensor, dim: usize) -> Result<Tensor> {
    todo!()
}
