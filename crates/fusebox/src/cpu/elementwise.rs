//! elementwise kernels (skeleton: to be written).

#![allow(unused_variables, unused_imports)]

use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;
use crate::types::*;

pub fn add(cpu: &CpuBackend, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn add_scalar(cpu: &CpuBackend, a: &Tensor, s: f32) -> Result<Tensor> {
    todo!()
}

pub fn add_assign(cpu: &CpuBackend, a: &mut Tensor, b: &Tensor) -> Result<()> {
    todo!()
}

pub fn add_row(cpu: &CpuBackend, x: &Tensor, row: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn add_col(cpu: &CpuBackend, x: &Tensor, col: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn sub(cpu: &CpuBackend, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn sub_scalar(cpu: &CpuBackend, a: &Tensor, s: f32) -> Result<Tensor> {
    todo!()
}

pub fn sub_assign(cpu: &CpuBackend, a: &mut Tensor, b: &Tensor) -> Result<()> {
    todo!()
}

pub fn sub_row(cpu: &CpuBackend, x: &Tensor, row: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn sub_col(cpu: &CpuBackend, x: &Tensor, col: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn mul(cpu: &CpuBackend, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn mul_scalar(cpu: &CpuBackend, a: &Tensor, s: f32) -> Result<Tensor> {
    todo!()
}

pub fn mul_assign(cpu: &CpuBackend, a: &mut Tensor, b: &Tensor) -> Result<()> {
    todo!()
}

pub fn mul_row(cpu: &CpuBackend, x: &Tensor, row: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn mul_col(cpu: &CpuBackend, x: &Tensor, col: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn div(cpu: &CpuBackend, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn div_scalar(cpu: &CpuBackend, a: &Tensor, s: f32) -> Result<Tensor> {
    todo!()
}

pub fn div_assign(cpu: &CpuBackend, a: &mut Tensor, b: &Tensor) -> Result<()> {
    todo!()
}

pub fn div_row(cpu: &CpuBackend, x: &Tensor, row: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn div_col(cpu: &CpuBackend, x: &Tensor, col: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn add3(cpu: &CpuBackend, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn exp_mul(cpu: &CpuBackend, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn sub_mul(cpu: &CpuBackend, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn add_scaled(cpu: &CpuBackend, a: &Tensor, b: &Tensor, c: f32) -> Result<Tensor> {
    todo!()
}

pub fn exp(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn exp_inplace(cpu: &CpuBackend, x: &mut Tensor) -> Result<()> {
    todo!()
}

pub fn log(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn log_inplace(cpu: &CpuBackend, x: &mut Tensor) -> Result<()> {
    todo!()
}

pub fn sqrt(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn sqrt_inplace(cpu: &CpuBackend, x: &mut Tensor) -> Result<()> {
    todo!()
}

pub fn pow(cpu: &CpuBackend, x: &Tensor, p: f32) -> Result<Tensor> {
    todo!()
}

pub fn pow_inplace(cpu: &CpuBackend, x: &mut Tensor, p: f32) -> Result<()> {
    todo!()
}

pub fn neg(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn neg_inplace(cpu: &CpuBackend, x: &mut Tensor) -> Result<()> {
    todo!()
}

pub fn abs(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn abs_inplace(cpu: &CpuBackend, x: &mut Tensor) -> Result<()> {
    todo!()
}

pub fn clamp(cpu: &CpuBackend, x: &Tensor, lo: f32, hi: f32) -> Result<Tensor> {
    todo!()
}

pub fn clamp_inplace(cpu: &CpuBackend, x: &mut Tensor, lo: f32, hi: f32) -> Result<()> {
    todo!()
}
