//! optim kernels (skeleton: to be written).

#![allow(unused_variables, unused_imports)]

use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;
use crate::types::*;

pub fn adamw_update(
    cpu: &CpuBackend,
    param: &mut Tensor,
    grad: &Tensor,
    m: &mut Tensor,
    v: &mut Tensor,
    config: &AdamWConfig,
    step: u64,
) -> Result<()> {
    todo!()
}

pub fn global_norm(cpu: &CpuBackend, tensors: &[Tensor]) -> Result<f32> {
    todo!()
}

pub fn clip_scale(global_norm: f32, max_norm: f32) -> Result<f32> {
    todo!()
}
