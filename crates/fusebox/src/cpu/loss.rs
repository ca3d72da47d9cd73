//! loss kernels (skeleton: to be written).

#![allow(unused_variables, unused_imports)]

use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;
use crate::types::*;

pub fn cross_entropy(
    cpu: &CpuBackend,
    logits: &Tensor,
    targets: &Tensor,
    ignore_index: Option<u32>,
) -> Result<CrossEntropyOutput> {
    todo!()
}

pub fn cross_entropy_backward(
    cpu: &CpuBackend,
    logits: &Tensor,
    targets: &Tensor,
    ignore_index: Option<u32>,
    d_loss: f32,
) -> Result<Tensor> {
    todo!()
}
