//! layout kernels (skeleton: to be written).

#![allow(unused_variables, unused_imports)]

use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;
use crate::types::*;

pub fn permute(cpu: &CpuBackend, x: &Tensor, perm: &[usize]) -> Result<Tensor> {
    todo!()
}

pub fn transpose(cpu: &CpuBackend, x: &Tensor, dim0: usize, dim1: usize) -> Result<Tensor> {
    todo!()
}

pub fn slice(cpu: &CpuBackend, x: &Tensor, axis: usize, start: usize, len: usize) -> Result<Tensor> {
    todo!()
}

pub fn slice_backward(
    cpu: &CpuBackend,
    d_out: &Tensor,
    input_shape: &Shape,
    axis: usize,
    start: usize,
) -> Result<Tensor> {
    todo!()
}

pub fn select(cpu: &CpuBackend, x: &Tensor, axis: usize, index: usize) -> Result<Tensor> {
    todo!()
}

pub fn concat(cpu: &CpuBackend, xs: &[Tensor], axis: usize) -> Result<Tensor> {
    todo!()
}

pub fn expand(cpu: &CpuBackend, x: &Tensor, shape: &Shape) -> Result<Tensor> {
    todo!()
}
