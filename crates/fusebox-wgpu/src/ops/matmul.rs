//! Matmul family: plain, batched and backward through the strided GEMM kernel. F16/BF16
//! operands are widened to f32 on the device and results stored in their dtype.

use fusebox::cpu;
use fusebox::spec::matmul::{self as spec, MatmulSpec};
use fusebox::{DType, MatmulGradients, Result, Shape, Tensor};

use crate::backend::WgpuBackend;
use crate::ops::convert::word_aligned;
use crate::ops::MatView;

pub(crate) fn matmul(be: &WgpuBackend, a: &Tensor, b: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor> {
    let p = spec::matmul(a, b, transpose_a, transpose_b)?;
    if !word_aligned(&[a, b]) {
        return fallback!(be, cpu::matmul::matmul; [a, b], transpose_a, transpose_b);
    }
    be.matmul_native("matmul", a, b, &p)
}

pub(crate) fn matmul_backward(
    be: &WgpuBackend,
    a: &Tensor,
    b: &Tensor,
    d_out: &Tensor,
    transpose_a: bool,
    transpose_b: bool,
) -> Result<MatmulGradients> {
    let p = spec::matmul_backward(a, b, d_out, transpose_a, transpose_b)?;
    if !word_aligned(&[a, b, d_out]) {
        return fallback!(be, cpu::matmul::matmul_backward; [a, b, d_out], transpose_a, transpose_b);
    }
    be.matmul_backward_native(a, b, d_out, &p)
}

pub(crate) fn batched_matmul(
    be: &WgpuBackend,
    a: &Tensor,
    b: &Tensor,
    transpose_a: bool,
    transpose_b: bool,
) -> Result<Tensor> {
    let p = spec::batched_matmul(a, b, transpose_a, transpose_b)?;
    if !word_aligned(&[a, b]) {
        return fallback!(be, cpu::matmul::batched_matmul; [a, b], transpose_a, transpose_b);
    }
    be.matmul_native("batched_matmul", a, b, &p)
}

/// The GEMM kernel's view of `op(a)` per batch.
fn a_view(p: &MatmulSpec) -> MatView {
    if p.transpose_a {
        MatView::rows(p.m, p.m * p.k).t()
    } else {
        MatView::rows(p.k, p.m * p.k)
    }
}

/// The GEMM kernel's view of `op(b)` per batch (batch stride 0 when shared).
fn b_view(p: &MatmulSpec) -> MatView {
    let batch = if p.b_shared { 0 } else { p.k * p.n };
    if p.transpose_b {
        MatView::rows(p.k, batch).t()
    } else {
        MatView::rows(p.n, batch)
    }
}

impl WgpuBackend {
    /// `op(a)·op(b)` for a validated product of word-aligned operands.
    pub(crate) fn matmul_native(&self, op: &'static str, a: &Tensor, b: &Tensor, p: &MatmulSpec) -> Result<Tensor> {
        let (a, b) = (self.widen(op, a)?, self.widen(op, b)?);
        let c = self.ctx.zeros(op, Shape::new(p.out_dims()), DType::F32)?;
        if p.k > 0 {
            self.ctx.gemm(
                op,
                (&a, a_view(p)),
                (&b, b_view(p)),
                None,
                (&c, MatView::rows(p.n, p.m * p.n)),
                (p.m, p.n, p.k, p.batches),
                false,
            )?;
        }
        self.narrow(op, c, p.dtype)
    }

    /// The gradients of a validated product of word-aligned operands.
    pub(crate) fn matmul_backward_native(
        &self,
        a: &Tensor,
        b: &Tensor,
        d_out: &Tensor,
        p: &MatmulSpec,
    ) -> Result<MatmulGradients> {
        const OP: &str = "matmul_backward";
        let (a, b, dc) = (self.widen(OP, a)?, self.widen(OP, b)?, self.widen(OP, d_out)?);
        let (m, n, k, batch) = (p.m, p.n, p.k, p.batches);
        let dc_view = MatView::rows(n, m * n);
        let da = self.ctx.zeros(OP, a.shape().clone(), DType::F32)?;
        let db = self.ctx.zeros(OP, b.shape().clone(), DType::F32)?;
        // op(A)·op(B) = C ⇒ d op(A) = dC·op(B)ᵀ (m×k), d op(B) = op(A)ᵀ·dC (k×n); a
        // transposed operand's gradient is the transposed product, written through
        // its own (transposed) view.
        let (a_rows, a_cols) = (a.dims()[a.rank() - 2], a.dims()[a.rank() - 1]);
        let da_view = MatView::rows(a_cols, a_rows * a_cols);
        if m > 0 && k > 0 && n > 0 {
            if !p.transpose_a {
                self.ctx.gemm(
                    OP,
                    (&dc, dc_view),
                    (&b, b_view(p).t()),
                    None,
                    (&da, da_view),
                    (m, k, n, batch),
                    false,
                )?;
            } else {
                self.ctx.gemm(
                    OP,
                    (&b, b_view(p)),
                    (&dc, dc_view.t()),
                    None,
                    (&da, da_view),
                    (k, m, n, batch),
                    false,
                )?;
            }
            let (b_rows, b_cols) = (b.dims()[b.rank() - 2], b.dims()[b.rank() - 1]);
            let tmp;
            let (db_target, db_batch) = if p.b_shared && batch > 1 {
                tmp = self.ctx.empty(OP, [batch, b_rows, b_cols], DType::F32)?;
                (&tmp, b_rows * b_cols)
            } else {
                (&db, if p.b_shared { 0 } else { b_rows * b_cols })
            };
            let db_view = MatView::rows(b_cols, db_batch);
            let a_view = a_view(p);
            if !p.transpose_b {
                self.ctx.gemm(
                    OP,
                    (&a, a_view.t()),
                    (&dc, dc_view),
                    None,
                    (db_target, db_view),
                    (k, n, m, batch),
                    false,
                )?;
            } else {
                self.ctx.gemm(
                    OP,
                    (&dc, dc_view.t()),
                    (&a, a_view),
                    None,
                    (db_target, db_view),
                    (n, k, m, batch),
                    false,
                )?;
            }
            if p.b_shared && batch > 1 {
                self.ctx.sum_rows(OP, db_target, batch, b_rows * b_cols, &db)?;
            }
        }
        Ok(MatmulGradients { da: self.narrow(OP, da, p.dtype)?, db: self.narrow(OP, db, p.dtype)? })
    }
}
