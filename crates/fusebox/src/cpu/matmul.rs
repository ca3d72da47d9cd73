//! matmul kernels (skeleton: to be written).

#![allow(unused_variables, unused_imports)]

use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;
use crate::types::*;

pub fn matmul(cpu: &CpuBackend, a: &Tensor, b: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor> {
    todo!()
}

pub fn matmul_backward(
    cpu: &CpuBackend,
    a: &Tensor,
    b: &Tensor,
    d_out: &Tensor,
    transpose_a: bool,
    transpose_b: bool,
) -> Result<MatmulGradients> {
    todo!()
}

pub fn batched_matmul(
    cpu: &CpuBackend,
    a: &Tensor,
    b: &Tensor,
    transpose_a: bool,
    transpose_b: bool,
) -> Result<Tensor> {
    todo!()
}

pub fn linear_forward(cpu: &CpuBackend, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    todo!()
}

pub fn linear_backward(
    cpu: &CpuBackend,
    x: &Tensor,
    w: &Tensor,
    d_out: &Tensor,
    with_bias: bool,
) -> Result<LinearGradients> {
    todo!()
}

pub fn head_prefix_matmul(cpu: &CpuBackend, q: &Tensor, k_cache: &Tensor, len: usize) -> Result<Tensor> {
    todo!()
}
