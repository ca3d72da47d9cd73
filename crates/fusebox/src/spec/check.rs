//! The checks the specs are written with: each returns an [`Error`] naming the op, the
//! argument, what was expected and what came.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// `t` must be F32, F16 or BF16.
pub fn float(op: &'static str, what: &str, t: &Tensor) -> Result<()> {
    if t.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::dtype(op, what, "f32, f16 or bf16", t.dtype()))
    }
}

/// `t` must have exactly `dtype`.
pub fn dtype(op: &'static str, what: &str, t: &Tensor, dtype: DType) -> Result<()> {
    if t.dtype() == dtype {
        Ok(())
    } else {
        Err(Error::dtype(op, what, dtype, t.dtype()))
    }
}

/// `b` must have the dtype of `a` (mixed dtypes are an error).
pub fn same_dtype(op: &'static str, what: &str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dtype() == b.dtype() {
        Ok(())
    } else {
        Err(Error::dtype(op, what, a.dtype(), b.dtype()))
    }
}

/// `b` must have the shape of `a`.
pub fn same_shape(op: &'static str, what: &str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.shape() == b.shape() {
        Ok(())
    } else {
        Err(Error::shape(op, what, a.shape(), b.shape()))
    }
}

/// `t` must have exactly the dims `dims`.
pub fn shape(op: &'static str, what: &str, t: &Tensor, dims: &[usize]) -> Result<()> {
    if t.dims() == dims {
        Ok(())
    } else {
        Err(Error::shape(op, what, Shape::new(dims), t.shape()))
    }
}

/// `t` must have rank `rank`.
pub fn rank(op: &'static str, what: &str, t: &Tensor, rank: usize) -> Result<()> {
    if t.rank() == rank {
        Ok(())
    } else {
        Err(Error::shape(op, what, format!("rank {rank}"), t.shape()))
    }
}

/// `t` must have rank at least `min`.
pub fn min_rank(op: &'static str, what: &str, t: &Tensor, min: usize) -> Result<()> {
    if t.rank() >= min {
        Ok(())
    } else {
        Err(Error::shape(op, what, format!("rank ≥ {min}"), t.shape()))
    }
}

/// `axis` must be a valid axis of a rank-`rank` tensor.
pub fn axis(op: &'static str, axis: usize, rank: usize) -> Result<()> {
    if axis < rank {
        Ok(())
    } else {
        Err(Error::value(op, "axis", format!("< {rank}"), axis))
    }
}
