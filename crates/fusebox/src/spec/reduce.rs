//! Reductions along an axis or over everything: sum, mean, max, var, sum_abs, argmax,
//! and max's gradient.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec::check;
use crate::tensor::Tensor;

/// A reduction seen as `[outer, n, inner]`, reducing `n` (over everything:
/// `[1, elements, 1]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReduceSpec {
    /// Product of the dims before the axis (1 over everything).
    pub outer: usize,
    /// Length of the reduced axis (every element over everything).
    pub n: usize,
    /// Product of the dims after the axis (1 for the last axis or over everything).
    pub inner: usize,
    /// x's dims without the axis (`[]` over everything): the output's shape.
    pub out_dims: Vec<usize>,
    /// The input dtype (F32, F16 or BF16); the output takes it (argmax: U32).
    pub dtype: DType,
}

impl ReduceSpec {
    /// Elements of the output (`outer · inner`).
    pub fn outputs(&self) -> usize {
        self.outer * self.inner
    }
}

/// `sum(x, axis)`: x float, `axis < rank` when given.
pub fn sum(x: &Tensor, axis: Option<usize>) -> Result<ReduceSpec> {
    reduction("sum", x, axis)
}

/// `mean(x, axis)`: as [`sum`] (an empty axis gives NaN).
pub fn mean(x: &Tensor, axis: Option<usize>) -> Result<ReduceSpec> {
    reduction("mean", x, axis)
}

/// `var(x, axis)`: as [`sum`].
pub fn var(x: &Tensor, axis: Option<usize>) -> Result<ReduceSpec> {
    reduction("var", x, axis)
}

/// `sum_abs(x, axis)`: as [`sum`].
pub fn sum_abs(x: &Tensor, axis: Option<usize>) -> Result<ReduceSpec> {
    reduction("sum_abs", x, axis)
}

/// `max(x, axis)`: as [`sum`], and the reduced axis must not be empty when there are
/// outputs (the maximum of nothing is undefined).
pub fn max(x: &Tensor, axis: Option<usize>) -> Result<ReduceSpec> {
    let s = reduction("max", x, axis)?;
    if s.n == 0 && s.outputs() > 0 {
        return Err(Error::shape("max", "x", "a non-empty reduced axis", x.shape()));
    }
    Ok(s)
}

/// `argmax(x, axis)`: x float, `axis < rank`, the axis non-empty and at most 2³²
/// long (indices are U32).
pub fn argmax(x: &Tensor, axis: usize) -> Result<ReduceSpec> {
    arg_reduction("argmax", x, axis)
}

/// `max_backward(x, d_out, axis)`: x as for [`argmax`]; `d_out` of x's dtype and the
/// output shape of `max(x, axis)`.
pub fn max_backward(x: &Tensor, d_out: &Tensor, axis: usize) -> Result<ReduceSpec> {
    const OP: &str = "max_backward";
    let s = arg_reduction(OP, x, axis)?;
    check::same_dtype(OP, "d_out", x, d_out)?;
    check::shape(OP, "d_out", d_out, &s.out_dims)?;
    Ok(s)
}

fn reduction(op: &'static str, x: &Tensor, axis: Option<usize>) -> Result<ReduceSpec> {
    check::float(op, "x", x)?;
    let dims = x.dims();
    Ok(match axis {
        Some(a) => {
            check::axis(op, a, x.rank())?;
            ReduceSpec {
                outer: dims[..a].iter().product(),
                n: dims[a],
                inner: dims[a + 1..].iter().product(),
                out_dims: dims.iter().enumerate().filter(|&(i, _)| i != a).map(|(_, &d)| d).collect(),
                dtype: x.dtype(),
            }
        }
        None => ReduceSpec { outer: 1, n: dims.iter().product(), inner: 1, out_dims: Vec::new(), dtype: x.dtype() },
    })
}

fn arg_reduction(op: &'static str, x: &Tensor, axis: usize) -> Result<ReduceSpec> {
    let s = reduction(op, x, Some(axis))?;
    if s.n == 0 {
        return Err(Error::shape(op, "x", format!("a non-empty axis {axis}"), x.shape()));
    }
    if s.n > u32::MAX as usize {
        return Err(Error::shape(op, "x", format!("axis {axis} of at most 2³² elements"), x.shape()));
    }
    Ok(s)
}
