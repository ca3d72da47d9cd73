//! Linear layer forward and backward (weight row blocks, accumulating gradients). F16/BF16
//! operands are widened to f32 on the device, results and the accumulated gradients are
//! stored in that dtype.

use fusebox::cpu;
use fusebox::{ComputeBackend, DType, LinearGradients, Result, Shape, Tensor, ToBackend};

use crate::backend::WgpuBackend;
use crate::context::Context;
use crate::ops::convert::common_float;
use crate::ops::MatView;

pub(crate) fn linear_forward(be: &WgpuBackend, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "linear_forward";
    let mut operands = vec![x, w];
    operands.extend(bias);
    let dtype = common_float(&operands).filter(|_| {
        x.rank() >= 1
            && w.rank() == 2
            && x.shape().last_dim() == w.dims()[1]
            && bias.is_none_or(|b| b.rank() == 1 && b.dims()[0] == w.dims()[0])
    });
    let Some(dtype) = dtype else {
        if matches!(w.dtype(), DType::Q8_0 | DType::Q4_1) && bias.is_none() {
            return be.quantized_matmul(x, w);
        }
        let bias = bias.map(|b| be.to_host(b)).transpose()?;
        return fallback!(be, cpu::matmul::linear_forward; [x, w], bias.as_ref());
    };
    let (out, k) = (w.dims()[0], w.dims()[1]);
    let m = x.elem_count() / k.max(1);
    let mut dims = x.dims().to_vec();
    *dims.last_mut().unwrap_or(&mut 0) = out;
    let (x, w) = (be.widen(OP, x)?, be.widen(OP, w)?);
    let bias = bias.map(|b| be.widen(OP, b)).transpose()?;
    let y = be.ctx.empty(OP, Shape::new(dims), DType::F32)?;
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
    let Some(dtype) = WgpuBackend::linear_backward_dtype(x, w, d_out) else {
        return fallback!(be, cpu::matmul::linear_backward; [x, w, d_out], with_bias);
    };
    let dweight = be.ctx.empty(OP, w.shape().clone(), DType::F32)?;
    let dbias = if with_bias { Some(be.ctx.empty(OP, [w.dims()[0]], DType::F32)?) } else { None };
    let dx = be.linear_backward_native(OP, x, w, d_out, &dweight, dbias.as_ref(), false)?;
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
    let dtype = WgpuBackend::linear_backward_dtype(x, w, d_out);
    let same_dtype = |t: &Tensor| common_float(&[x, t]).is_some();
    let ok = dtype.is_some()
        && !dweight.is_host()
        && same_dtype(dweight)
        && dweight.shape() == w.shape()
        && dbias.as_ref().is_none_or(|b| !b.is_host() && same_dtype(b) && b.dims() == [w.dims()[0]]);
    if !ok {
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
    let dx = be.update_widened(OP, &grads, |g| be.linear_backward_native(OP, x, w, d_out, &g[0], g.get(1), true))?;
    be.narrow(OP, dx, dtype.unwrap_or(DType::F32))
}

impl WgpuBackend {
    /// The common dtype of a linear backward's operands when the kernels take them.
    pub(crate) fn linear_backward_dtype(x: &Tensor, w: &Tensor, d_out: &Tensor) -> Option<DType> {
        let ok = x.rank() >= 1
            && w.rank() == 2
            && x.shape().last_dim() == w.dims()[1]
            && d_out.rank() == x.rank()
            && d_out.dims()[..x.rank() - 1] == x.dims()[..x.rank() - 1]
            && d_out.shape().last_dim() == w.dims()[0];
        common_float(&[x, w, d_out]).filter(|_| ok)
    }

    /// dx = dy·W (returned, F32), dW (+)= dyᵀ·x, dbias (+)= Σ_rows dy into F32 device
    /// tensors; W in row blocks that each fit one binding.
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
    ) -> Result<Tensor> {
        let (out, k) = (w.dims()[0], w.dims()[1]);
        let m = x.elem_count() / k.max(1);
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
