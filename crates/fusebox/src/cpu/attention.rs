//! attention kernels (skeleton: to be written).

#![allow(unused_variables, unused_imports)]

use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;
use crate::types::*;

pub fn attention(cpu: &CpuBackend, q: &Tensor, k: &Tensor, v: &Tensor, scale: f32, causal: bool) -> Result<Tensor> {
    todo!()
}

pub fn sdpa(
    cpu: &CpuBackend,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<AttentionMask<'_>>,
    causal: bool,
    scale: f32,
) -> Result<Tensor> {
    todo!()
}

pub fn causal_attention(
    cpu: &CpuBackend,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
) -> Result<CausalAttentionResult> {
    todo!()
}

pub fn causal_attention_backward(
    cpu: &CpuBackend,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    result: &CausalAttentionResult,
    d_out: &Tensor,
    scale: f32,
) -> Result<AttentionGradients> {
    todo!()
}

pub fn causal_mask(cpu: &CpuBackend, seq: usize, kv_len: usize) -> Result<Tensor> {
    todo!()
}

pub fn causal_softmax(cpu: &CpuBackend, scores: &Tensor, scale: f32) -> Result<Tensor> {
    todo!()
}

pub fn write_head_cache(cpu: &CpuBackend, cache: &mut Tensor, new: &Tensor, pos: usize) -> Result<()> {
    todo!()
}

pub fn decode_attention(
    cpu: &CpuBackend,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    kv_len: usize,
    scale: f32,
) -> Result<Tensor> {
    todo!()
}

pub fn split_heads(cpu: &CpuBackend, x: &Tensor, heads: usize) -> Result<Tensor> {
    todo!()
}

pub fn merge_heads(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    todo!()
}
