//! rope kernels (skeleton: to be written).

#![allow(unused_variables, unused_imports)]

use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;
use crate::types::*;

pub fn rope(
    cpu: &CpuBackend,
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    style: RopeStyle,
    offset: usize,
) -> Result<Tensor> {
    todo!()
}

pub fn rope_backward(
    cpu: &CpuBackend,
    d_out: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    style: RopeStyle,
    offset: usize,
) -> Result<Tensor> {
    todo!()
}
