//! Softmax, log-softmax and the fused cross-entropy loss.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec::check;
use crate::tensor::Tensor;

/// A tensor seen along one axis: `outer` blocks of `len` × `inner` elements, the axis
/// of length `len` with stride `inner`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AxisSpec {
    /// Product of the dims before the axis.
    pub outer: usize,
    /// The axis' length.
    pub len: usize,
    /// Product of the dims after the axis (1 for the last axis).
    pub inner: usize,
    /// The input dtype (F32, F16 or BF16); the output takes it.
    pub dtype: DType,
}

impl AxisSpec {
    fn of(x: &Tensor, dim: usize) -> AxisSpec {
        let dims = x.dims();
        AxisSpec {
            outer: dims[..dim].iter().product(),
            len: dims[dim],
            inner: dims[dim + 1..].iter().product(),
            dtype: x.dtype(),
        }
    }

    /// Whether the axis is the last one (rows are contiguous).
    pub fn is_last(&self) -> bool {
        self.inner == 1
    }
}

/// `softmax(x, dim)`: x float of any rank, `dim < rank`.
pub fn softmax(x: &Tensor, dim: usize) -> Result<AxisSpec> {
    along("softmax", x, dim)
}

/// `log_softmax(x, dim)`: as [`softmax`].
pub fn log_softmax(x: &Tensor, dim: usize) -> Result<AxisSpec> {
    along("log_softmax", x, dim)
}

fn along(op: &'static str, x: &Tensor, dim: usize) -> Result<AxisSpec> {
    check::float(op, "x", x)?;
    check::axis(op, dim, x.rank())?;
    Ok(AxisSpec::of(x, dim))
}

/// `softmax_backward(y, d_out, dim)`: y float, d_out of its dtype and shape, `dim < rank`.
pub fn softmax_backward(y: &Tensor, d_out: &Tensor, dim: usize) -> Result<AxisSpec> {
    const OP: &str = "softmax_backward";
    check::float(OP, "y", y)?;
    check::same_dtype(OP, "d_out", y, d_out)?;
    check::same_shape(OP, "d_out", y, d_out)?;
    check::axis(OP, dim, y.rank())?;
    Ok(AxisSpec::of(y, dim))
}

/// A cross-entropy call: `n` rows of `vocab` logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrossEntropySpec {
    /// Rows N.
    pub n: usize,
    /// Vocabulary size V.
    pub vocab: usize,
    /// The logits' dtype (loss and d_logits are F32 whatever it is).
    pub dtype: DType,
}

/// `cross_entropy(logits, targets, ignore_index)` and its backward (`op` names which):
/// logits `[N, V]` float, targets `[N]` U32. The targets' values are checked by
/// [`cross_entropy_targets`] once they are read.
pub fn cross_entropy(op: &'static str, logits: &Tensor, targets: &Tensor) -> Result<CrossEntropySpec> {
    check::float(op, "logits", logits)?;
    check::rank(op, "logits", logits, 2)?;
    check::dtype(op, "targets", targets, DType::U32)?;
    let (n, vocab) = (logits.dims()[0], logits.dims()[1]);
    check::shape(op, "targets", targets, &[n])?;
    Ok(CrossEntropySpec { n, vocab, dtype: logits.dtype() })
}

/// Every target below `vocab` unless it is the ignore index; returns the number of
/// counted (not ignored) rows.
pub fn cross_entropy_targets(op: &'static str, ids: &[u32], vocab: usize, ignore: Option<u32>) -> Result<usize> {
    for (r, &t) in ids.iter().enumerate() {
        if ignore != Some(t) && t as usize >= vocab {
            return Err(Error::value(op, format!("target of row {r}"), format!("< {vocab} (the vocabulary size)"), t));
        }
    }
    Ok(ids.iter().filter(|&&t| ignore != Some(t)).count())
}
