//! conv kernels (skeleton: to be written).

#![allow(unused_variables, unused_imports)]

use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;
use crate::types::*;

pub fn conv1d(
    cpu: &CpuBackend,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    config: &Conv1dConfig,
) -> Result<Tensor> {
    todo!()
}

pub fn conv_transpose1d(
    cpu: &CpuBackend,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    config: &Conv1dConfig,
) -> Result<Tensor> {
    todo!()
}

pub fn conv2d(
    cpu: &CpuBackend,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    config: &Conv2dConfig,
) -> Result<Tensor> {
    todo!()
}

pub fn depthwise_conv1d_silu(cpu: &CpuBackend, x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn depthwise_conv1d_bias(cpu: &CpuBackend, x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn depthwise_conv1d_bias_ctx(
    cpu: &CpuBackend,
    ctx: &Tensor,
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
) -> Result<Tensor> {
    todo!()
}
