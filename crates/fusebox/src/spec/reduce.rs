//! Reductions along an axis or over everything: sum, mean, max, var, sum_abs, argmax,
//! max's gradient, topk, and sum_to_shape (the gradient of a broadcast).

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
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

/// A validated `topk`: `rows` rows of `n` elements, the `k` largest of each kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopkSpec {
    /// Rows: the product of every dim but the last.
    pub rows: usize,
    /// The last dim N (at most 2³², indices are U32).
    pub n: usize,
    /// Values kept per row (≤ N).
    pub k: usize,
    /// The outputs' dims: x's with the last dim `k`.
    pub out_dims: Vec<usize>,
    /// x's dtype (F32, F16 or BF16), kept by the values; the indices are U32.
    pub dtype: DType,
}

/// `topk(x, k)`: x float of rank ≥ 1 with a last dim N of at most 2³² elements, `k ≤ N`.
pub fn topk(x: &Tensor, k: usize) -> Result<TopkSpec> {
    const OP: &str = "topk";
    check::float(OP, "x", x)?;
    check::min_rank(OP, "x", x, 1)?;
    let n = x.shape().last_dim();
    if k > n {
        return Err(Error::value(OP, "k", format!("≤ {n} (the last dim)"), k));
    }
    if n > u32::MAX as usize {
        return Err(Error::shape(OP, "x", "a last dim of at most 2³² elements", x.shape()));
    }
    let lead = &x.dims()[..x.rank() - 1];
    let mut out_dims = lead.to_vec();
    out_dims.push(k);
    Ok(TopkSpec { rows: lead.iter().product(), n, k, out_dims, dtype: x.dtype() })
}

/// A validated `sum_to_shape`: x's axes grouped into runs that are all summed or all
/// kept (size-1 axes dropped, neighbours of the same kind merged), outermost first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SumToShapeSpec {
    /// `(elements, summed)` per run; a summed run is one reduction of `[outer, n, inner]`.
    pub runs: Vec<(usize, bool)>,
    /// x's dtype (F32, F16 or BF16), kept by the output.
    pub dtype: DType,
}

/// `sum_to_shape(x, shape)`: x float, `shape` one that broadcasts to x's shape (numpy
/// rules): x's extra leading dims, and the dims where `shape` has 1, are summed.
pub fn sum_to_shape(x: &Tensor, shape: &Shape) -> Result<SumToShapeSpec> {
    const OP: &str = "sum_to_shape";
    check::float(OP, "x", x)?;
    if crate::spec::layout::broadcast_strides(shape, x.dims()).is_none() {
        return Err(Error::shape(OP, "target", format!("a shape that broadcasts to {}", x.shape()), shape));
    }
    let lead = x.rank() - shape.rank();
    let mut runs: Vec<(usize, bool)> = Vec::new();
    for (a, &d) in x.dims().iter().enumerate() {
        let summed = a < lead || shape.dims()[a - lead] != d;
        if d == 1 {
            continue;
        }
        match runs.last_mut() {
            Some((size, s)) if *s == summed => *size *= d,
            _ => runs.push((d, summed)),
        }
    }
    Ok(SumToShapeSpec { runs, dtype: x.dtype() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dims: &[usize], dtype: DType) -> Tensor {
        Tensor::zeros(dims.to_vec(), dtype).unwrap()
    }

    #[test]
    fn topk_keeps_k_of_the_last_dim() {
        let s = topk(&t(&[2, 3, 8], DType::BF16), 5).unwrap();
        assert_eq!((s.rows, s.n, s.k, s.out_dims.as_slice()), (6, 8, 5, &[2, 3, 5][..]));
        let e = topk(&t(&[2, 4], DType::F32), 5).unwrap_err().to_string();
        assert!(e.contains("topk") && e.contains('k'), "{e}");
        assert!(topk(&t(&[4], DType::U32), 1).is_err());
    }

    #[test]
    fn sum_to_shape_groups_summed_and_kept_axes() {
        // x [5, 2, 3, 1, 4] → [2, 1, 1, 4]: 5 summed (leading), 2 kept, 3 summed, the
        // size-1 axis dropped, 4 kept.
        let s = sum_to_shape(&t(&[5, 2, 3, 1, 4], DType::F32), &Shape::new(vec![2, 1, 1, 4])).unwrap();
        assert_eq!(s.runs, [(5, true), (2, false), (3, true), (4, false)]);
        // Neighbours of one kind merge.
        let s = sum_to_shape(&t(&[2, 3, 4], DType::F16), &Shape::new(vec![4])).unwrap();
        assert_eq!(s.runs, [(6, true), (4, false)]);
        let e = sum_to_shape(&t(&[2, 3], DType::F32), &Shape::new(vec![2])).unwrap_err().to_string();
        assert!(e.contains("sum_to_shape") && e.contains("broadcasts"), "{e}");
    }
}
