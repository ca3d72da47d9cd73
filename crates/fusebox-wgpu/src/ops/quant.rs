//! Quantized matmul: Q8_0 and Q4_1 weights natively (quant.wgsl); an F16/BF16 x is
//! widened on the device and the result stored in x's dtype. Arguments are checked by
//! `fusebox::spec::quant`; the other storage formats (Q4_0, Q5_0, Q5_1, IQ4_NL, MXFP4,
//! the K-quants, IQ4_XS, FP8) run on the CPU, reported as a fallback.

use fusebox::cpu;
use fusebox::spec::quant::{self as spec, QuantMatmulSpec};
use fusebox::{DType, Result, Shape, Tensor};

use crate::backend::WgpuBackend;
use crate::kernels;
use crate::ops::convert::common_float;
use crate::ops::u;

/// The shader's format code for a weight dtype it reads, if it reads it.
fn shader_format(dtype: DType) -> Option<u32> {
    match dtype {
        DType::Q8_0 => Some(0),
        DType::Q4_1 => Some(1),
        _ => None,
    }
}

/// Whether the native kernel takes a validated call: a format it reads, a float x it can
/// bind, and W at a word-aligned offset.
fn native(x: &Tensor, w: &Tensor, s: &QuantMatmulSpec) -> Option<u32> {
    let fmt = shader_format(s.w_dtype)?;
    (common_float(&[x]).is_some() && w.byte_offset().is_multiple_of(4)).then_some(fmt)
}

pub(crate) fn quantized_matmul(be: &WgpuBackend, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    const OP: &str = "quantized_matmul";
    let s = spec::quantized_matmul(x, w)?;
    let Some(fmt) = native(x, w, &s) else {
        return fallback!(be, cpu::quant::quantized_matmul; [x, w]);
    };
    if s.k == 0 {
        return be.ctx.zeros(OP, Shape::new(s.out_dims), s.dtype);
    }
    let (x, w) = (be.widen(OP, x)?, be.dev(w)?);
    let y = be.ctx.empty(OP, Shape::new(s.out_dims.clone()), DType::F32)?;
    let params = [u(s.m)?, u(s.n)?, u(s.k)?, fmt];
    be.ctx.dispatch(OP, &kernels::QUANTIZED_MATMUL, &[&x, &w, &y], &params, ((s.m * s.n) as u64).div_ceil(64))?;
    be.narrow(OP, y, s.dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_q8_0_and_q4_1_have_a_shader_and_every_other_format_falls_back() {
        for dtype in DType::ALL {
            let want = matches!(dtype, DType::Q8_0 | DType::Q4_1);
            assert_eq!(shader_format(dtype).is_some(), want, "{dtype}");
        }
    }
}
