//! Matmul family: plain, batched and backward through the strided GEMM kernel. F16/BF16
//! operands are widened to f32 on the device and results stored in their dtype.

use fusebox::cpu;
use fusebox::{DType, MatmulGradients, Result, Shape, Tensor};

use crate::backend::WgpuBackend;
use crate::ops::convert::common_float;
use crate::ops::MatView;

/// What `matmul` computes for given operands: shapes and strided views.
#[derive(Debug, Clone)]
pub struct MatmulPlan {
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) batch: usize,
    pub(crate) a_view: MatView,
    pub(crate) b_view: MatView,
    pub(crate) b_shared: bool,
    pub(crate) ta: bool,
    pub(crate) tb: bool,
    pub(crate) out_dims: Vec<usize>,
    /// The operands' (and the result's) storage dtype.
    pub(crate) dtype: DType,
}

pub(crate) fn matmul(be: &WgpuBackend, a: &Tensor, b: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor> {
    match be.matmul_plan(a, b, transpose_a, transpose_b) {
        Some(p) => be.matmul_native("matmul", a, b, p),
        None => fallback!(be, cpu::matmul::matmul; [a, b], transpose_a, transpose_b),
    }
}

pub(crate) fn matmul_backward(
    be: &WgpuBackend,
    a: &Tensor,
    b: &Tensor,
    d_out: &Tensor,
    transpose_a: bool,
    transpose_b: bool,
) -> Result<MatmulGradients> {
    let plan = be.matmul_plan(a, b, transpose_a, transpose_b);
    match plan {
        Some(p) if common_float(&[a, b, d_out]).is_some() && d_out.dims() == p.out_dims.as_slice() => {
            be.matmul_backward_native(a, b, d_out, p)
        }
        _ => fallback!(be, cpu::matmul::matmul_backward; [a, b, d_out], transpose_a, transpose_b),
    }
}

pub(crate) fn batched_matmul(
    be: &WgpuBackend,
    a: &Tensor,
    b: &Tensor,
    transpose_a: bool,
    transpose_b: bool,
) -> Result<Tensor> {
    match be.matmul_plan(a, b, transpose_a, transpose_b) {
        Some(p) if a.rank() == 3 && b.rank() == 3 => be.matmul_native("batched_matmul", a, b, p),
        _ => fallback!(be, cpu::matmul::batched_matmul; [a, b], transpose_a, transpose_b),
    }
}

impl WgpuBackend {
    pub(crate) fn matmul_plan(&self, a: &Tensor, b: &Tensor, ta: bool, tb: bool) -> Option<MatmulPlan> {
        let dtype = common_float(&[a, b])?;
        if a.rank() < 2 || b.rank() < 2 {
            return None;
        }
        let (ad, bd) = (a.dims(), b.dims());
        let ar = ad.len();
        let (a0, a1) = (ad[ar - 2], ad[ar - 1]);
        let br = bd.len();
        let (b0, b1) = (bd[br - 2], bd[br - 1]);
        let (m, k) = if ta { (a1, a0) } else { (a0, a1) };
        let (kb, n) = if tb { (b1, b0) } else { (b0, b1) };
        let b_shared = br == 2;
        if k != kb || (!b_shared && bd[..br - 2] != ad[..ar - 2]) {
            return None;
        }
        let batch: usize = ad[..ar - 2].iter().product();
        let a_view = if ta { MatView::rows(m, a0 * a1).t() } else { MatView::rows(k, a0 * a1) };
        let bb = if b_shared { 0 } else { b0 * b1 };
        let b_view = if tb { MatView::rows(k, bb).t() } else { MatView::rows(n, bb) };
        let mut out_dims = ad[..ar - 2].to_vec();
        out_dims.extend([m, n]);
        Some(MatmulPlan { m, n, k, batch, a_view, b_view, b_shared, ta, tb, out_dims, dtype })
    }

    pub(crate) fn matmul_native(&self, op: &'static str, a: &Tensor, b: &Tensor, p: MatmulPlan) -> Result<Tensor> {
        let (a, b) = (self.widen(op, a)?, self.widen(op, b)?);
        let c = self.ctx.zeros(op, Shape::new(p.out_dims.clone()), DType::F32)?;
        if p.k > 0 {
            self.ctx.gemm(
                op,
                (&a, p.a_view),
                (&b, p.b_view),
                None,
                (&c, MatView::rows(p.n, p.m * p.n)),
                (p.m, p.n, p.k, p.batch),
                false,
            )?;
        }
        self.narrow(op, c, p.dtype)
    }

    pub(crate) fn matmul_backward_native(
        &self,
        a: &Tensor,
        b: &Tensor,
        d_out: &Tensor,
        p: MatmulPlan,
    ) -> Result<MatmulGradients> {
        const OP: &str = "matmul_backward";
        let (a, b, dc) = (self.widen(OP, a)?, self.widen(OP, b)?, self.widen(OP, d_out)?);
        let (m, n, k, batch) = (p.m, p.n, p.k, p.batch);
        let dc_view = MatView::rows(n, m * n);
        let da = self.ctx.zeros(OP, a.shape().clone(), DType::F32)?;
        let db = self.ctx.zeros(OP, b.shape().clone(), DType::F32)?;
        // op(A)·op(B) = C ⇒ d op(A) = dC·op(B)ᵀ (m×k), d op(B) = op(A)ᵀ·dC (k×n); a
        // transposed operand's gradient is the transposed product, written through
        // its own (transposed) view.
        let (a_rows, a_cols) = (a.dims()[a.rank() - 2], a.dims()[a.rank() - 1]);
        let da_view = MatView::rows(a_cols, a_rows * a_cols);
        if m > 0 && k > 0 && n > 0 {
            if !p.ta {
                self.ctx.gemm(OP, (&dc, dc_view), (&b, p.b_view.t()), None, (&da, da_view), (m, k, n, batch), false)?;
            } else {
                self.ctx.gemm(OP, (&b, p.b_view), (&dc, dc_view.t()), None, (&da, da_view), (k, m, n, batch), false)?;
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
            let a_view = p.a_view;
            if !p.tb {
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
