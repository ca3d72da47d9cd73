//! Elementwise ops and activations: same-shape unary/binary/ternary maps, row and
//! column broadcasts, and the clamp bounds.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec::check;
use crate::tensor::Tensor;

/// A same-shape elementwise call: `len` elements of `dtype` per operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElementwiseSpec {
    /// Elements per operand.
    pub len: usize,
    /// The operands' dtype (F32, F16 or BF16); the output takes it.
    pub dtype: DType,
}

/// Operands of one elementwise call, each named: the first float, every other of its
/// dtype and shape (mixed dtypes are an error). Unary ops pass one, binary two, and so on.
pub fn same(op: &'static str, operands: &[(&str, &Tensor)]) -> Result<ElementwiseSpec> {
    let Some(&(name, first)) = operands.first() else {
        return Err(Error::value(op, "operands", "at least one", 0));
    };
    check::float(op, name, first)?;
    for &(what, t) in &operands[1..] {
        check::same_dtype(op, what, first, t)?;
        check::same_shape(op, what, first, t)?;
    }
    Ok(ElementwiseSpec { len: first.elem_count(), dtype: first.dtype() })
}

/// A broadcast of a vector over the rows (`x[..., j] ∘ row[j]`) or columns
/// (`x[i, j] ∘ col[i]`) of `x` `[..., N]` viewed as `rows × n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BroadcastSpec {
    /// Rows M: the product of x's dims but the last.
    pub rows: usize,
    /// Row length N (x's last dim).
    pub n: usize,
    /// x's dtype.
    pub dtype: DType,
}

fn matrix(op: &'static str, x: &Tensor, what: &str, v: &Tensor) -> Result<BroadcastSpec> {
    check::float(op, "x", x)?;
    check::min_rank(op, "x", x, 1)?;
    check::same_dtype(op, what, x, v)?;
    let n = x.shape().last_dim();
    Ok(BroadcastSpec { rows: x.dims()[..x.rank() - 1].iter().product(), n, dtype: x.dtype() })
}

/// `add_row(x, row)` and the like: x float `[..., N]`, row `[N]` of its dtype.
pub fn row_broadcast(op: &'static str, x: &Tensor, row: &Tensor) -> Result<BroadcastSpec> {
    let s = matrix(op, x, "row", row)?;
    check::shape(op, "row", row, &[s.n])?;
    Ok(s)
}

/// `add_col(x, col)` and the like: x float `[..., N]` with M rows, col of its dtype,
/// `[M]` or x's shape without its last dim.
pub fn col_broadcast(op: &'static str, x: &Tensor, col: &Tensor) -> Result<BroadcastSpec> {
    let s = matrix(op, x, "col", col)?;
    let lead = &x.dims()[..x.rank() - 1];
    if col.dims() != [s.rows] && col.dims() != lead {
        return Err(Error::shape(op, "col", format!("[{}] or {lead:?}", s.rows), col.shape()));
    }
    Ok(s)
}

/// Clamp bounds must be ordered and not NaN (`!(lo <= hi)` catches both).
pub fn clamp_bounds(op: &'static str, lo: f32, hi: f32) -> Result<()> {
    if lo <= hi {
        Ok(())
    } else {
        Err(Error::value(op, "bounds", "lo ≤ hi, neither NaN", format!("lo = {lo}, hi = {hi}")))
    }
}

/// The parameters of `clamped_swiglu` (and its backward): α finite, the limit finite and > 0.
pub fn clamped_swiglu_params(op: &'static str, alpha: f32, limit: f32) -> Result<()> {
    if !alpha.is_finite() {
        return Err(Error::value(op, "alpha", "a finite number", alpha));
    }
    if !(limit.is_finite() && limit > 0.0) {
        return Err(Error::value(op, "limit", "a finite number > 0", limit));
    }
    Ok(())
}
