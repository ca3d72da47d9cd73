//! Layout ops: permute, transpose, head split/merge, row slices.

use fusebox::cpu;
use fusebox::{ComputeBackend, DType, Result, Shape, Tensor, ToBackend};

use crate::backend::WgpuBackend;
use crate::kernels;
use crate::ops::{is_f32, u};

pub(crate) fn split_heads(be: &WgpuBackend, x: &Tensor, heads: usize) -> Result<Tensor> {
    let ok = is_f32(x) && x.rank() == 3 && heads > 0 && x.dims()[2].is_multiple_of(heads);
    if !ok {
        return fallback!(be, cpu::attention::split_heads; [x], heads);
    }
    let (b, t, hd) = (x.dims()[0], x.dims()[1], x.dims()[2]);
    let x4 = be.dev(x)?.reshape([b, t, heads, hd / heads])?;
    be.permute_native("split_heads", &x4, &[0, 2, 1, 3])
}

pub(crate) fn merge_heads(be: &WgpuBackend, x: &Tensor) -> Result<Tensor> {
    if !is_f32(x) || x.rank() != 4 {
        return fallback!(be, cpu::attention::merge_heads; [x]);
    }
    let (b, h, t, d) = (x.dims()[0], x.dims()[1], x.dims()[2], x.dims()[3]);
    let x = be.dev(x)?;
    be.permute_native("merge_heads", &x, &[0, 2, 1, 3])?.reshape([b, t, h * d])
}

pub(crate) fn slice_rows(be: &WgpuBackend, x: &Tensor, start: usize, len: usize) -> Result<Tensor> {
    let ok = !x.is_host()
        && x.rank() >= 1
        && start.checked_add(len).is_some_and(|e| e <= x.dims()[0])
        && matches!(x.dtype(), DType::F32 | DType::U32);
    if !ok {
        return fallback!(be, cpu::embedding::slice_rows; [x], start, len);
    }
    let row = x.elem_count() / x.dims()[0].max(1);
    let mut dims = x.dims().to_vec();
    dims[0] = len;
    let view = x.view(start * row, Shape::new(dims))?;
    be.ctx.copy_tensor("slice_rows", &view)
}

pub(crate) fn permute(be: &WgpuBackend, x: &Tensor, perm: &[usize]) -> Result<Tensor> {
    let r = x.rank();
    let mut seen = [false; 6];
    let ok =
        is_f32(x) && r <= 6 && perm.len() == r && perm.iter().all(|&p| p < r && !std::mem::replace(&mut seen[p], true));
    if !ok {
        return fallback!(be, cpu::layout::permute; [x], perm);
    }
    let x = be.dev(x)?;
    be.permute_native("permute", &x, perm)
}

pub(crate) fn transpose(be: &WgpuBackend, x: &Tensor, dim0: usize, dim1: usize) -> Result<Tensor> {
    let r = x.rank();
    if !is_f32(x) || r > 6 || dim0 >= r || dim1 >= r {
        return fallback!(be, cpu::layout::transpose; [x], dim0, dim1);
    }
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(dim0, dim1);
    let x = be.dev(x)?;
    be.permute_native("transpose", &x, &perm)
}

impl WgpuBackend {
    /// The permutation kernel for f32 tensors of rank ≤ 6.
    pub(crate) fn permute_native(&self, op: &'static str, x: &Tensor, perm: &[usize]) -> Result<Tensor> {
        let dims = x.dims();
        let r = dims.len();
        let mut strides = vec![1usize; r];
        for d in (0..r.saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * dims[d + 1];
        }
        let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
        let out = self.ctx.empty(op, Shape::new(out_dims.clone()), DType::F32)?;
        let n = x.elem_count();
        let mut params = vec![u(n)?, r as u32];
        // Six dims (unused ones 1) and six input strides in output-axis order (unused 0).
        for &dim in out_dims.iter().chain(std::iter::repeat(&1)).take(6) {
            params.push(u(dim)?);
        }
        for i in 0..6 {
            params.push(if let Some(&p) = perm.get(i) { u(strides[p])? } else { 0 });
        }
        self.ctx.flat(op, &kernels::PERMUTE, &[x, &out], &params, n)?;
        Ok(out)
    }
}
