//! The Gated DeltaNet gates: `gdn_gates` and its backward.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec::check;
use crate::tensor::Tensor;

/// A validated gates call: `rows` rows of `heads` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatesSpec {
    /// Rows: the product of every dim of `a` but the last.
    pub rows: usize,
    /// Heads H (a's last dim, ≥ 1).
    pub heads: usize,
    /// The dtype of `a` and `b` (F32, F16 or BF16); `da` and `db` take it.
    pub dtype: DType,
    /// The dtype of `a_log` and `dt_bias`; their gradients take it.
    pub param_dtype: DType,
}

/// `gdn_gates(a, b, a_log, dt_bias)`: a `[..., H]` float (rank ≥ 1, H ≥ 1), b of a's
/// dtype and shape, a_log and dt_bias `[H]` float of one dtype (F32 in models: the gates
/// are computed in f32 whatever the inputs).
pub fn gdn_gates(a: &Tensor, b: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<GatesSpec> {
    gates("gdn_gates", a, b, a_log, dt_bias)
}

/// `gdn_gates_backward(a, b, a_log, dt_bias, dg, dbeta)`: as [`gdn_gates`]; dg and
/// dbeta F32 (the dtype of g and β) of a's shape.
pub fn gdn_gates_backward(
    a: &Tensor,
    b: &Tensor,
    a_log: &Tensor,
    dt_bias: &Tensor,
    dg: &Tensor,
    dbeta: &Tensor,
) -> Result<GatesSpec> {
    const OP: &str = "gdn_gates_backward";
    let s = gates(OP, a, b, a_log, dt_bias)?;
    for (what, t) in [("dg (like g)", dg), ("dbeta (like beta)", dbeta)] {
        check::dtype(OP, what, t, DType::F32)?;
        check::shape(OP, what, t, a.dims())?;
    }
    Ok(s)
}

fn gates(op: &'static str, a: &Tensor, b: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<GatesSpec> {
    check::float(op, "a", a)?;
    check::min_rank(op, "a", a, 1)?;
    let heads = a.shape().last_dim();
    if heads == 0 {
        return Err(Error::shape(op, "a ([..., H], H ≥ 1)", "a last dim ≥ 1", a.shape()));
    }
    check::same_dtype(op, "b", a, b)?;
    check::shape(op, "b (like a)", b, a.dims())?;
    check::float(op, "a_log", a_log)?;
    check::shape(op, "a_log ([H])", a_log, &[heads])?;
    check::same_dtype(op, "dt_bias", a_log, dt_bias)?;
    check::shape(op, "dt_bias ([H])", dt_bias, &[heads])?;
    Ok(GatesSpec { rows: a.elem_count() / heads, heads, dtype: a.dtype(), param_dtype: a_log.dtype() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dims: &[usize]) -> Tensor {
        Tensor::zeros(dims.to_vec(), DType::F32).unwrap()
    }

    #[test]
    fn gates_describe_rows_and_heads() {
        let s = gdn_gates(&t(&[2, 5, 4]), &t(&[2, 5, 4]), &t(&[4]), &t(&[4])).unwrap();
        assert_eq!((s.rows, s.heads), (10, 4));
    }

    #[test]
    fn bad_gates_name_the_argument_and_shapes() {
        let e = gdn_gates(&t(&[2, 4]), &t(&[2, 4]), &t(&[3]), &t(&[4])).unwrap_err().to_string();
        assert!(e.contains("gdn_gates") && e.contains("a_log") && e.contains("[4]") && e.contains("[3]"), "{e}");
        let e = gdn_gates(&t(&[2, 4]), &t(&[4, 2]), &t(&[4]), &t(&[4])).unwrap_err().to_string();
        assert!(e.contains("b (like a)"), "{e}");
        let half = Tensor::zeros([2, 4], DType::F16).unwrap();
        let e = gdn_gates_backward(&t(&[2, 4]), &t(&[2, 4]), &t(&[4]), &t(&[4]), &half, &t(&[2, 4])).unwrap_err();
        assert!(e.to_string().contains("gdn_gates_backward") && e.to_string().contains("dg"), "{e}");
        assert!(gdn_gates(&t(&[3, 0]), &t(&[3, 0]), &t(&[0]), &t(&[0])).is_err());
    }
}
