//! Layout ops: permute, transpose, head split/merge, row slices. They move bits: F32
//! through the 32-bit permutation kernel, F16/BF16 through the 16-bit one (no
//! conversion, so every bit pattern survives).

use fusebox::cpu;
use fusebox::spec::attention::{self as spec, HeadsLayout};
use fusebox::spec::layout::{self as layout_spec, PermuteSpec};
use fusebox::{DType, Result, Shape, Tensor};

use crate::backend::WgpuBackend;
use crate::kernels;
use crate::ops::convert::{common_float, word_aligned};
use crate::ops::u;

pub(crate) fn split_heads(be: &WgpuBackend, x: &Tensor, heads: usize) -> Result<Tensor> {
    let HeadsLayout { batch, seq, d, .. } = spec::split_heads(x, heads)?;
    if !movable(x) {
        return fallback!(be, cpu::attention::split_heads; [x], heads);
    }
    let x4 = be.dev(x)?.reshape([batch, seq, heads, d])?;
    be.permute_native("split_heads", &x4, &[0, 2, 1, 3])
}

pub(crate) fn merge_heads(be: &WgpuBackend, x: &Tensor) -> Result<Tensor> {
    let HeadsLayout { batch, heads, seq, d, .. } = spec::merge_heads(x)?;
    if !movable(x) {
        return fallback!(be, cpu::attention::merge_heads; [x]);
    }
    let x = be.dev(x)?;
    be.permute_native("merge_heads", &x, &[0, 2, 1, 3])?.reshape([batch, seq, heads * d])
}

pub(crate) fn slice_rows(be: &WgpuBackend, x: &Tensor, start: usize, len: usize) -> Result<Tensor> {
    const OP: &str = "slice_rows";
    let (rows, _) = fusebox::spec::embedding::slice_rows(x, start, len)?;
    if x.is_host() || !(x.dtype() == DType::U32 || movable(x)) {
        return fallback!(be, cpu::embedding::slice_rows; [x], start, len);
    }
    let row = x.elem_count() / rows.max(1);
    let mut dims = x.dims().to_vec();
    dims[0] = len;
    let first = start * row;
    if x.dtype().storage_bytes(first).is_multiple_of(4) {
        return be.ctx.copy_tensor(OP, &x.view(first, Shape::new(dims))?);
    }
    // A 16-bit slice starting inside a word: the identity permutation from element `first`.
    let shape = Shape::new(dims);
    let perm: Vec<usize> = (0..shape.rank()).collect();
    be.permute_from(OP, x, first, &shape, &perm)
}

pub(crate) fn permute(be: &WgpuBackend, x: &Tensor, perm: &[usize]) -> Result<Tensor> {
    let p = layout_spec::permute(x, perm)?;
    if !permutable(x, &p) {
        return fallback!(be, cpu::layout::permute; [x], perm);
    }
    let x = be.dev(x)?;
    be.permute_native("permute", &x, &p.perm)
}

pub(crate) fn transpose(be: &WgpuBackend, x: &Tensor, dim0: usize, dim1: usize) -> Result<Tensor> {
    let p = layout_spec::transpose(x, dim0, dim1)?;
    if !permutable(x, &p) {
        return fallback!(be, cpu::layout::transpose; [x], dim0, dim1);
    }
    let x = be.dev(x)?;
    be.permute_native("transpose", &x, &p.perm)
}

/// The permutation kernels take at most this many axes.
const MAX_PERMUTE_RANK: usize = 6;

/// Whether the permutation kernels run a validated permutation of `x`: a float dtype
/// (32- or 16-bit) at a word-aligned offset, rank ≤ [`MAX_PERMUTE_RANK`].
fn permutable(x: &Tensor, p: &PermuteSpec) -> bool {
    p.dtype.is_float() && p.perm.len() <= MAX_PERMUTE_RANK && word_aligned(&[x])
}

/// Whether the permutation kernels move `x`: F32, F16 or BF16 at a word-aligned offset.
fn movable(x: &Tensor) -> bool {
    common_float(&[x]).is_some()
}

impl WgpuBackend {
    /// The permutation kernel (32- or 16-bit by x's dtype) for tensors of rank ≤ [`MAX_PERMUTE_RANK`].
    pub(crate) fn permute_native(&self, op: &'static str, x: &Tensor, perm: &[usize]) -> Result<Tensor> {
        self.permute_from(op, x, 0, x.shape(), perm)
    }

    /// `permute_native` of the `shape`-shaped tensor that starts `first` elements into
    /// `x` (16-bit `x` only when `first` > 0).
    pub(crate) fn permute_from(
        &self,
        op: &'static str,
        x: &Tensor,
        first: usize,
        shape: &Shape,
        perm: &[usize],
    ) -> Result<Tensor> {
        let out_dims: Vec<usize> = perm.iter().map(|&p| shape.dims()[p]).collect();
        let out = self.ctx.empty(op, Shape::new(out_dims), x.dtype())?;
        self.permute_into(op, (x, first), shape, perm, (&out, 0))?;
        Ok(out)
    }

    /// Permutes the `shape`-shaped tensor starting `first` elements into `x`, storing
    /// it from element `at` of `out` on (out of x's dtype; 32-bit tensors only with
    /// both offsets 0).
    pub(crate) fn permute_into(
        &self,
        op: &'static str,
        (x, first): (&Tensor, usize),
        shape: &Shape,
        perm: &[usize],
        (out, at): (&Tensor, usize),
    ) -> Result<()> {
        let dims = shape.dims();
        let r = dims.len();
        let mut strides = vec![1usize; r];
        for d in (0..r.saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * dims[d + 1];
        }
        let n = shape.elem_count();
        let mut params = vec![u(n)?, r as u32];
        // Six dims (unused ones 1) and six input strides in output-axis order (unused 0).
        for &p in perm.iter().chain(std::iter::repeat(&usize::MAX)).take(MAX_PERMUTE_RANK) {
            params.push(if p == usize::MAX { 1 } else { u(dims[p])? });
        }
        for i in 0..MAX_PERMUTE_RANK {
            params.push(if let Some(&p) = perm.get(i) { u(strides[p])? } else { 0 });
        }
        if x.dtype() == DType::F32 && first == 0 && at == 0 {
            self.ctx.flat(op, &kernels::PERMUTE, &[x, out], &params, n)
        } else {
            params.extend([u(first)?, u(at)?]);
            // One thread per output word touched.
            let words = u(at + n)?.div_ceil(2) - (at / 2) as u32;
            self.ctx.flat(op, &kernels::PERMUTE16, &[x, out], &params, words as usize)
        }
    }
}
