//! norm kernels (skeleton: to be written).

#![allow(unused_variables, unused_imports)]

use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;
use crate::types::*;

pub fn rms_norm(cpu: &CpuBackend, x: &Tensor, weight: &Tensor, eps: f32) -> Result<NormOutput> {
    todo!()
}

pub fn rms_norm_backward(
    cpu: &CpuBackend,
    x: &Tensor,
    weight: &Tensor,
    rstd: &Tensor,
    d_out: &Tensor,
) -> Result<NormGradients> {
    todo!()
}

pub fn layer_norm(cpu: &CpuBackend, x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<NormOutput> {
    todo!()
}

pub fn layer_norm_backward(
    cpu: &CpuBackend,
    x: &Tensor,
    weight: &Tensor,
    mean: &Tensor,
    rstd: &Tensor,
    d_out: &Tensor,
) -> Result<NormGradients> {
    todo!()
}

pub fn add_rms_norm(
    cpu: &CpuBackend,
    a: &Tensor,
    b: &Tensor,
    weight: &Tensor,
    eps: f32,
) -> Result<(Tensor, NormOutput)> {
    todo!()
}

pub fn rms_norm_gated(cpu: &CpuBackend, x: &Tensor, z: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    todo!()
}

pub fn rms_norm_channel(cpu: &CpuBackend, x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    todo!()
}

pub fn group_norm(
    cpu: &CpuBackend,
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    groups: usize,
    eps: f32,
) -> Result<Tensor> {
    todo!()
}

pub fn adaln_modulate(
    cpu: &CpuBackend,
    x: &Tensor,
    weight: &Tensor,
    scale: &Tensor,
    shift: &Tensor,
    eps: f32,
) -> Result<Tensor> {
    todo!()
}

pub fn normalize(cpu: &CpuBackend, x: &Tensor, eps: f32) -> Result<Tensor> {
    todo!()
}
