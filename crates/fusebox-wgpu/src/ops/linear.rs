//! Linear layer forward and backward (weight row blocks, accumulating gradients). F16/BF16
//! operands are widened to f32 on the device, results and the accumulated gradients are
//! stored in that dtype.

use fusebox::cpu;
use fusebox::spec::matmul::{self as spec, LinearSpec};
use fusebox::{ComputeBackend, DType, LinearGradients, Result, Shape, Tensor, ToBackend};

use crate::backend::WgpuBackend;
use crate::context::Context;
use crate::ops::convert::word_aligned;
use crate::ops::MatView;

pub(crate) fn linear_forward(be: &WgpuBackend, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "linear_forward";
    let LinearSpec { rows: m, features_in: k, features_out: out, out_dims, dtype } = spec::linear_forward(x, w, bias)?;
    if !word_aligned(&[x, w]) || !bias.is_none_or(|b| word_aligned(&[b])) {
        let bias = bias.map(|b| be.to_host(b)).transpose()?;
        return fallback!(be, cpu::matmul::linear_forward; [x, w], bias.as_ref());
    }
    let (x, w) = (be.widen(OP, x)?, be.widen(OP, w)?);
    let bias = bias.map(|b| be.widen(OP, b)).transpose()?;
    let y = be.ctx.empty(OP, Shape::new(out_dims), DType::F32)?;
    if k == 0 {
        let z = be.ctx.zeros(OP, y.shape().clone(), DType::F32)?;
        let z = match bias {
            Some(b) => be.add_row(&z, &b)?,
            None => z,
        };
        return be.narrow(OP, z, dtype);
    }
    // W in row blocks that each fit one binding (a large vocabulary's lm head).
    let per = be.ctx.rows_per_binding(k);
    let mut r0 = 0;
    while r0 < out {
        let r1 = (r0 + per).min(out);
        let wb = Context::row_block(&w, k, r0, r1 - r0)?;
        let yb = y.view(r0, Shape::new(vec![y.elem_count() - r0]))?;
        let bb = bias.as_ref().map(|b| b.view(r0, Shape::new(vec![r1 - r0]))).transpose()?;
        be.ctx.gemm(
            OP,
            (&x, MatView::rows(k, 0)),
            (&wb, MatView::rows(k, 0).t()),
            bb.as_ref(),
            (&yb, MatView::rows(out, 0)),
            (m, r1 - r0, k, 1),
            false,
        )?;
        r0 = r1;
    }
    be.narrow(OP, y, dtype)
}

pub(crate) fn linear_backward(
    be: &WgpuBackend,
    x: &Tensor,
    w: &Tensor,
    d_out: &Tensor,
    with_bias: bool,
) -> Result<LinearGradients> {
    const OP: &str = "linear_backward";
    let s = spec::linear_backward(x, w, d_out)?;
    if !word_aligned(&[x, w, d_out]) {
        return fallback!(be, cpu::matmul::linear_backward; [x, w, d_out], with_bias);
    }
    let dtype = s.dtype;
    let dweight = be.ctx.empty(OP, w.shape().clone(), DType::F32)?;
    let dbias = if with_bias { Some(be.ctx.empty(OP, [s.features_out], DType::F32)?) } else { None };
    let dx = be.linear_backward_native(OP, x, w, d_out, &dweight, dbias.as_ref(), false, &s)?;
    Ok(LinearGradients {
        dx: be.narrow(OP, dx, dtype)?,
        dweight: be.narrow(OP, dweight, dtype)?,
        dbias: dbias.map(|b| be.narrow(OP, b, dtype)).transpose()?,
    })
}

pub(crate) fn linear_backward_accumulate(
    be: &WgpuBackend,
    x: &Tensor,
    w: &Tensor,
    d_out: &Tensor,
    dweight: &mut Tensor,
    dbias: Option<&mut Tensor>,
) -> Result<Tensor> {
    const OP: &str = "linear_backward_accumulate";
    let s = spec::linear_backward_accumulate(x, w, d_out, dweight, dbias.as_deref())?;
    // The gradients are updated where they live: on the device, word-aligned, natively.
    let on_device = |t: &Tensor| !t.is_host() && word_aligned(&[t]);
    let native = word_aligned(&[x, w, d_out]) && on_device(dweight) && dbias.as_deref().is_none_or(on_device);
    if !native {
        be.ctx.note_fallback("in place");
        let (x, w, d_out) = (be.to_host(x)?, be.to_host(w)?, be.to_host(d_out)?);
        if dweight.is_host() && dbias.as_ref().is_none_or(|b| b.is_host()) {
            return cpu::matmul::linear_backward_accumulate(be.cpu(), &x, &w, &d_out, dweight, dbias)?.to_backend(be);
        }
        let mut dw_host = be.to_host(dweight)?;
        let mut db_host = dbias.as_deref().map(|b| be.to_host(b)).transpose()?;
        let dx = cpu::matmul::linear_backward_accumulate(be.cpu(), &x, &w, &d_out, &mut dw_host, db_host.as_mut())?;
        be.copy_into(dweight, &dw_host)?;
        if let (Some(dst), Some(host)) = (dbias, db_host) {
            be.copy_into(dst, &host)?;
        }
        return dx.to_backend(be);
    }
    dweight.ensure_writable(OP)?;
    if let Some(b) = dbias.as_ref() {
        b.ensure_writable(OP)?;
    }
    let mut grads = vec![&*dweight];
    grads.extend(dbias.as_deref());
    let dx =
        be.update_widened(OP, &grads, |g| be.linear_backward_native(OP, x, w, d_out, &g[0], g.get(1), true, &s))?;
    be.narrow(OP, dx, s.dtype)
}

impl WgpuBackend {
    /// dx = dy·W (returned, F32), dW (+)= dyᵀ·x, dbias (+)= Σ_rows dy into F32 device
    /// tensors, for operands validated as `s`; W in row blocks that each fit one binding.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn linear_backward_native(
        &self,
        op: &'static str,
        x: &Tensor,
        w: &Tensor,
        d_out: &Tensor,
        dweight: &Tensor,
        dbias: Option<&Tensor>,
        accumulate: bool,
        s: &LinearSpec,
    ) -> Result<Tensor> {
        let (out, k, m) = (s.features_out, s.features_in, s.rows);
        let (x, w, dy) = (self.widen(op, x)?, self.widen(op, w)?, self.widen(op, d_out)?);
        let dx = self.ctx.zeros(op, x.shape().clone(), DType::F32)?;
        if !accumulate && (m == 0 || k == 0) {
            self.ctx.zeros_into(op, dweight)?;
        }
        let per = self.ctx.rows_per_binding(k.max(m));
        let mut r0 = 0;
        while r0 < out {
            let r1 = (r0 + per).min(out);
            let wb = Context::row_block(&w, k, r0, r1 - r0)?;
            let dyb = dy.view(r0, Shape::new(vec![dy.elem_count() - r0]))?;
            // dx += dy[:, r0..r1] · W[r0..r1, :]
            self.ctx.gemm(
                op,
                (&dyb, MatView::rows(out, 0)),
                (&wb, MatView::rows(k, 0)),
                None,
                (&dx, MatView::rows(k, 0)),
                (m, k, r1 - r0, 1),
                true,
            )?;
            // dW[r0..r1, :] (+)= dy[:, r0..r1]ᵀ · x
            let dwb = Context::row_block(dweight, k, r0, r1 - r0)?;
            self.ctx.gemm(
                op,
                (&dyb, MatView::rows(out, 0).t()),
                (&x, MatView::rows(k, 0)),
                None,
                (&dwb, MatView::rows(k, 0)),
                (r1 - r0, k, m, 1),
                accumulate,
            )?;
            r0 = r1;
        }
        if let Some(db) = dbias {
            self.ctx.sum_rows_into(op, &dy, m, out, db, accumulate)?;
        }
        Ok(dx)
    }
}
