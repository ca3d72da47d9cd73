//! embedding kernels (skeleton: to be written).

#![allow(unused_variables, unused_imports)]

use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;
use crate::types::*;

pub fn embedding(cpu: &CpuBackend, ids: &Tensor, table: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn embedding_backward(cpu: &CpuBackend, ids: &Tensor, d_out: &Tensor, vocab: usize) -> Result<Tensor> {
    todo!()
}

pub fn index_select(cpu: &CpuBackend, x: &Tensor, ids: &Tensor) -> Result<Tensor> {
    todo!()
}

pub fn scatter_add_rows(cpu: &CpuBackend, dst: &mut Tensor, ids: &Tensor, src: &Tensor) -> Result<()> {
    todo!()
}

pub fn slice_rows(cpu: &CpuBackend, x: &Tensor, start: usize, len: usize) -> Result<Tensor> {
    todo!()
}

pub fn index_add(cpu: &CpuBackend, x: &Tensor, ids: &Tensor, src: &Tensor) -> Result<Tensor> {
    todo!()
}
