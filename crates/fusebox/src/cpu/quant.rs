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
/// Dequantizes one row of storage (`bytes` holds `out.len() / block_elems` whole blocks of
/// `dtype`, or `out.len()` plain F32/F16/BF16/F8E4M3 elements) into f32. Used by
/// `embedding` to gather rows of quantized tables.
pub fn dequantize_row_into(dtype: DType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    todo!()
}
