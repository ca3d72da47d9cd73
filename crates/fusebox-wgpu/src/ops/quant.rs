//! Quantized (Q8_0 / Q4_1) matmul; an F16/BF16 x is widened on the device and the
//! result stored in x's dtype.

use fusebox::cpu;
use fusebox::{DType, Result, Shape, Tensor};

use crate::backend::WgpuBackend;
use crate::kernels;
use crate::ops::convert::common_float;
use crate::ops::u;

pub(crate) fn quantized_matmul(be: &WgpuBackend, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    const OP: &str = "quantized_matmul";
    let fmt = match w.dtype() {
        DType::Q8_0 => 0,
        DType::Q4_1 => 1,
        _ => u32::MAX,
    };
    let dtype = common_float(&[x]);
    let ok = fmt != u32::MAX
        && dtype.is_some()
        && x.rank() >= 1
        && w.rank() == 2
        && w.byte_offset().is_multiple_of(4)
        && x.shape().last_dim() == w.dims()[1]
        && w.dims()[1].is_multiple_of(32);
    if !ok {
        return fallback!(be, cpu::quant::quantized_matmul; [x, w]);
    }
    let (n_out, k) = (w.dims()[0], w.dims()[1]);
    let rows = x.elem_count() / k.max(1);
    let mut dims = x.dims().to_vec();
    *dims.last_mut().unwrap_or(&mut 0) = n_out;
    let dtype = dtype.unwrap_or(DType::F32);
    if k == 0 {
        return be.ctx.zeros(OP, Shape::new(dims), dtype);
    }
    let (x, w) = (be.widen(OP, x)?, be.dev(w)?);
    let y = be.ctx.empty(OP, Shape::new(dims), DType::F32)?;
    let params = [u(rows)?, u(n_out)?, u(k)?, fmt];
    be.ctx.dispatch(OP, &kernels::QUANTIZED_MATMUL, &[&x, &w, &y], &params, ((rows * n_out) as u64).div_ceil(64))?;
    be.narrow(OP, y, dtype)
}
