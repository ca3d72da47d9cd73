//! quant kernels (skeleton: to be written).

#![allow(unused_variables, unused_imports)]

use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;
use crate::types::*;

pub fn quantize(cpu: &CpuBackend, x: &Tensor, dtype: DType) -> Result<Tensor> {
    todo!()
}

pub fn dequantize(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn quantized_matmul(cpu: &CpuBackend, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    todo!()
}
