//! F16/BF16 inputs are computed in f32: these helpers read any float tensor as f32
//! (borrowing F32 data, converting the others once) and write f32 results back in
//! the caller's dtype.

use std::borrow::Cow;

use half::{bf16, f16};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// The elements of a host float tensor as f32 (borrowed when already F32).
pub fn f32_data<'a>(op: &'static str, what: &str, t: &'a Tensor) -> Result<Cow<'a, [f32]>> {
    match t.dtype() {
        DType::F32 => Ok(Cow::Borrowed(t.as_slice::<f32>()?)),
        DType::F16 => Ok(Cow::Owned(t.as_slice::<f16>()?.iter().map(|v| v.to_f32()).collect())),
        DType::BF16 => Ok(Cow::Owned(t.as_slice::<bf16>()?.iter().map(|v| v.to_f32()).collect())),
        other => Err(Error::dtype(op, what, "f32, f16 or bf16", other)),
    }
}

/// A host tensor of `dtype` from f32 results (moved without copy when `dtype` is F32).
pub fn from_f32(data: Vec<f32>, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
    match dtype {
        DType::F32 => Tensor::from_vec(data, shape),
        _ => Tensor::from_f32_as(&data, shape, dtype),
    }
}

/// Writes f32 `values` into a writable float tensor of any float dtype.
pub fn store_f32(dst: &mut Tensor, values: &[f32]) -> Result<()> {
    match dst.dtype() {
        DType::F32 => dst.as_mut_slice::<f32>()?.copy_from_slice(values),
        DType::F16 => {
            for (d, &v) in dst.as_mut_slice::<f16>()?.iter_mut().zip(values) {
                *d = f16::from_f32(v);
            }
        }
        DType::BF16 => {
            for (d, &v) in dst.as_mut_slice::<bf16>()?.iter_mut().zip(values) {
                *d = bf16::from_f32(v);
            }
        }
        other => return Err(Error::dtype("store_f32", "destination", "f32, f16 or bf16", other)),
    }
    Ok(())
}

/// Applies `f` to a writable float tensor's values as f32, in place.
/// F32 tensors are modified directly; F16/BF16 ones round-trip through f32.
pub fn update_f32(op: &'static str, dst: &mut Tensor, f: impl FnOnce(&mut [f32])) -> Result<()> {
    dst.ensure_writable(op)?;
    if dst.dtype() == DType::F32 {
        f(dst.as_mut_slice::<f32>()?);
        return Ok(());
    }
    let mut values = f32_data(op, "tensor", dst)?.into_owned();
    f(&mut values);
    store_f32(dst, &values)
}
