//! memory kernels (skeleton: to be written).

#![allow(unused_variables, unused_imports)]

use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;
use crate::types::*;

pub fn copy(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn copy_into(cpu: &CpuBackend, dst: &mut Tensor, src: &Tensor) -> Result<()> {
    todo!()
}

pub fn cast(cpu: &CpuBackend, x: &Tensor, dtype: DType) -> Result<Tensor> {
    todo!()
}

pub fn preprocess_linear_weight(cpu: &CpuBackend, w: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn f8e4m3_to(cpu: &CpuBackend, x: &Tensor, dtype: DType) -> Result<Tensor> {
    todo!()
}
