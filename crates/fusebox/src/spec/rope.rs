//! Rotary position embedding, forward and backward.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec::check;
use crate::tensor::Tensor;

/// A rope call: `x` `[B, H, T, D]` rotated by positions `offset .. offset + T` of
/// tables with `positions` rows of `D/2` angles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeSpec {
    /// Positions T per head.
    pub seq: usize,
    /// Head dimension D (even).
    pub d: usize,
    /// Rows of the cos/sin tables.
    pub positions: usize,
    /// The rotated tensor's dtype (the tables are F32).
    pub dtype: DType,
}

/// `rope(x, cos, sin, style, offset)` and `rope_backward(d_out, ...)` (`op` and `what`
/// name which): x float `[B, H, T, D]` with D even; cos and sin F32 `[P, D/2]`;
/// `offset + T ≤ P`.
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
    let positions = cos.dims()[0];
    check::shape(op, "cos", cos, &[positions, d / 2])?;
    check::same_shape(op, "sin", cos, sin)?;
    if offset > positions || seq > positions - offset {
        return Err(Error::value(
            op,
            "offset + T",
            format!("at most the {positions} table positions"),
            format!("{offset} + {seq}"),
        ));
    }
    Ok(RopeSpec { seq, d, positions, dtype: x.dtype() })
}
