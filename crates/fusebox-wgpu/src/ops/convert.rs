//! Float storage conversions (`cast` between F32, F16 and BF16) on the GPU.

use fusebox::cpu;
use fusebox::spec::memory::{self as spec, CastKind};
use fusebox::{DType, Result, Tensor};

use crate::backend::WgpuBackend;
use crate::kernels;
use crate::ops::u;

/// The convert kernel's code for a float storage dtype.
pub(crate) fn float_kind(d: DType) -> Option<u32> {
    match d {
        DType::F32 => Some(0),
        DType::F16 => Some(1),
        DType::BF16 => Some(2),
        _ => None,
    }
}

/// `x` (F32/F16/BF16, word-aligned view) converted to `dtype` on the device.
pub(crate) fn convert(
    be: &WgpuBackend,
    op: &'static str,
    x: &Tensor,
    ik: u32,
    ok: u32,
    dtype: DType,
) -> Result<Tensor> {
    let out = be.ctx.empty(op, x.shape().clone(), dtype)?;
    convert_into(be, op, x, ik, &out, ok)?;
    Ok(out)
}

/// `x` (kind `ik`) converted into the existing device tensor `out` (kind `ok`, same
/// element count, word-aligned); only `out`'s own elements are written. Tensors beyond
/// one storage binding (as f32) go in pieces of an even element count, so every piece
/// starts on a word in either dtype.
fn convert_into(be: &WgpuBackend, op: &'static str, x: &Tensor, ik: u32, out: &Tensor, ok: u32) -> Result<()> {
    let x = be.dev(x)?;
    let n = x.elem_count();
    let per = (be.ctx.rows_per_binding(1) & !1).max(2);
    let mut e0 = 0;
    while e0 < n {
        let len = per.min(n - e0);
        let (xp, outp) = if len == n { (x.clone(), out.clone()) } else { (x.view(e0, [len])?, out.view(e0, [len])?) };
        let items = if ok == 0 { len } else { len.div_ceil(2) };
        be.ctx.flat(op, &kernels::CAST, &[&xp, &outp], &[u(len)?, ik, ok], items)?;
        e0 += len;
    }
    Ok(())
}

pub(crate) fn cast(be: &WgpuBackend, x: &Tensor, dtype: DType) -> Result<Tensor> {
    let s = spec::cast(x, dtype)?;
    match (s.kind, float_kind(s.from), float_kind(s.to)) {
        (CastKind::Float, Some(ik), Some(ok)) if word_aligned(&[x]) => convert(be, "cast", x, ik, ok, dtype),
        _ => fallback!(be, cpu::memory::cast; [x], dtype),
    }
}

/// The common float storage dtype of `ts` when all are F32, or all F16, or all BF16
/// (16-bit ones at word-aligned offsets): what the f32 kernels take after `widen`.
pub(crate) fn common_float(ts: &[&Tensor]) -> Option<DType> {
    let d = ts.first()?.dtype();
    let aligned = |t: &Tensor| d == DType::F32 || t.is_host() || t.byte_offset().is_multiple_of(4);
    (float_kind(d).is_some() && ts.iter().all(|t| t.dtype() == d && aligned(t))).then_some(d)
}

/// Whether the kernels can bind every tensor of `ts`: host tensors (uploaded whole) and
/// device tensors at a word-aligned offset (a 16-bit view may start mid-word).
pub(crate) fn word_aligned(ts: &[&Tensor]) -> bool {
    ts.iter().all(|t| t.is_host() || t.byte_offset().is_multiple_of(4))
}

impl WgpuBackend {
    /// `t` as an F32 device tensor (F16/BF16 storage converted on the GPU).
    pub(crate) fn widen(&self, op: &'static str, t: &Tensor) -> Result<Tensor> {
        match float_kind(t.dtype()) {
            Some(k) if k != 0 => convert(self, op, t, k, 0, DType::F32),
            _ => self.dev(t),
        }
    }

    /// An F32 result stored as `dtype` (the inputs' F32, F16 or BF16).
    pub(crate) fn narrow(&self, op: &'static str, t: Tensor, dtype: DType) -> Result<Tensor> {
        match float_kind(dtype) {
            Some(k) if k != 0 => convert(self, op, &t, 0, k, dtype),
            _ => Ok(t),
        }
    }

    /// Stores the F32 device tensor `src` into `dst` (F32, F16 or BF16, same element
    /// count, a word-aligned device tensor), rounding each element once.
    pub(crate) fn narrow_into(&self, op: &'static str, src: &Tensor, dst: &Tensor) -> Result<()> {
        match float_kind(dst.dtype()) {
            Some(0) => self.copy_device(dst, src),
            Some(k) => convert_into(self, op, src, 0, dst, k),
            None => Err(fusebox::Error::dtype(op, "destination", "f32, f16 or bf16", dst.dtype())),
        }
    }
}
