//! Rotary position embedding, forward and backward.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec::check;
use crate::tensor::Tensor;

/// A rope call: the first `2·pairs` dims of `x` `[B, H, T, D]` rotated by positions
/// `offset .. offset + T` of tables with `positions` rows of `pairs` angles (the rest
/// pass through: partial rotary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeSpec {
    /// Positions T per head.
    pub seq: usize,
    /// Head dimension D (even).
    pub d: usize,
    /// Rows of the cos/sin tables.
    pub positions: usize,
    /// Rotated pairs per row (the tables' width, `1..=D/2`).
    pub pairs: usize,
    /// The rotated tensor's dtype (the tables are F32).
    pub dtype: DType,
}

/// `rope(x, cos, sin, style, offset)` and `rope_backward(d_out, ...)` (`op` and `what`
/// name which): x float `[B, H, T, D]` with D even; cos and sin F32 `[P, R/2]` with
/// `2 ≤ R ≤ D` (R < D: only the first R dims rotate); `offset + T ≤ P`.
pub fn rope(op: &'static str, what: &str, x: &Tensor, cos: &Tensor, sin: &Tensor, offset: usize) -> Result<RopeSpec> {
    check::float(op, what, x)?;
    check::rank(op, what, x, 4)?;
    let (seq, d) = (x.dims()[2], x.dims()[3]);
    if d % 2 != 0 {
        return Err(Error::shape(op, format!("{what} head dim"), "an even head dim", x.shape()));
    }
    check::dtype(op, "cos", cos, DType::F32)?;
    check::dtype(op, "sin", sin, DType::F32)?;
    check::rank(op, "cos", cos, 2)?;
    let (positions, pairs) = (cos.dims()[0], cos.dims()[1]);
    if pairs == 0 || pairs > d / 2 {
        return Err(Error::shape(
            op,
            "cos",
            format!("[P, R/2] with 1 ≤ R/2 ≤ D/2 = {} (the rotated pairs)", d / 2),
            cos.shape(),
        ));
    }
    check::same_shape(op, "sin", cos, sin)?;
    if offset > positions || seq > positions - offset {
        return Err(Error::value(
            op,
            "offset + T",
            format!("at most the {positions} table positions"),
            format!("{offset} + {seq}"),
        ));
    }
    Ok(RopeSpec { seq, d, positions, pairs, dtype: x.dtype() })
}
