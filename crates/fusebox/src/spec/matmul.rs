//! Linear algebra: `matmul` (+ backward), `batched_matmul`, `linear_forward` and its two
//! backwards. (`head_prefix_matmul` reads a KV cache and is specified with the
//! attention ops, [`spec::attention::head_prefix_matmul`](crate::spec::attention::head_prefix_matmul).)

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec::check;
use crate::tensor::Tensor;

/// A validated product `op(a)·op(b)`, batched over a's leading dims, where `op` is the
/// identity or, with the flag set, a transpose of the last two dims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatmulSpec {
    /// a's dims before its last two (`[]` for a matrix): the output's leading dims.
    pub batch_dims: Vec<usize>,
    /// Products: the product of `batch_dims` (1 for a matrix).
    pub batches: usize,
    /// Rows of `op(a)` and of the output.
    pub m: usize,
    /// Columns of `op(b)` and of the output.
    pub n: usize,
    /// The inner dim shared by `op(a)` (columns) and `op(b)` (rows); may be 0.
    pub k: usize,
    /// a is stored as `[..., k, m]`.
    pub transpose_a: bool,
    /// b is stored as `[..., n, k]`.
    pub transpose_b: bool,
    /// b is one matrix used by every batch of a (b is 2-d, a has batch dims).
    pub b_shared: bool,
    /// The operands' dtype (F32, F16 or BF16); the output takes it.
    pub dtype: DType,
}

impl MatmulSpec {
    /// The output's dims: `[..batch_dims, m, n]`.
    pub fn out_dims(&self) -> Vec<usize> {
        let mut d = self.batch_dims.clone();
        d.extend([self.m, self.n]);
        d
    }
}

/// `matmul(a, b, transpose_a, transpose_b)`: a float of rank ≥ 2, b of a's dtype, either
/// 2-d (shared by every batch) or with a's batch dims, and the inner dims equal.
pub fn matmul(a: &Tensor, b: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<MatmulSpec> {
    product("matmul", a, b, transpose_a, transpose_b)
}

/// `matmul_backward(a, b, d_out, transpose_a, transpose_b)`: as [`matmul`]; d_out of
/// a's dtype with the output's shape.
pub fn matmul_backward(
    a: &Tensor,
    b: &Tensor,
    d_out: &Tensor,
    transpose_a: bool,
    transpose_b: bool,
) -> Result<MatmulSpec> {
    const OP: &str = "matmul_backward";
    let s = product(OP, a, b, transpose_a, transpose_b)?;
    check::same_dtype(OP, "d_out", a, d_out)?;
    check::shape(OP, "d_out", d_out, &s.out_dims())?;
    Ok(s)
}

/// `batched_matmul(a, b, transpose_a, transpose_b)`: both of rank 3 with the same batch,
/// otherwise as [`matmul`].
pub fn batched_matmul(a: &Tensor, b: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<MatmulSpec> {
    const OP: &str = "batched_matmul";
    check::rank(OP, "a", a, 3)?;
    check::rank(OP, "b", b, 3)?;
    product(OP, a, b, transpose_a, transpose_b)
}

fn product(op: &'static str, a: &Tensor, b: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<MatmulSpec> {
    check::float(op, "a", a)?;
    check::same_dtype(op, "b", a, b)?;
    check::min_rank(op, "a", a, 2)?;
    check::min_rank(op, "b", b, 2)?;
    let (ra, rb) = (a.rank(), b.rank());
    let batch_dims = a.dims()[..ra - 2].to_vec();
    let b_shared = rb == 2 && ra > 2;
    if rb != 2 && b.dims()[..rb - 2] != batch_dims[..] {
        return Err(Error::shape(
            op,
            "b batch dims (b must be 2-d or share a's batch dims)",
            format!("{batch_dims:?}"),
            b.shape(),
        ));
    }
    let (a0, a1) = (a.dims()[ra - 2], a.dims()[ra - 1]);
    let (b0, b1) = (b.dims()[rb - 2], b.dims()[rb - 1]);
    let (m, ka) = if transpose_a { (a1, a0) } else { (a0, a1) };
    let (kb, n) = if transpose_b { (b1, b0) } else { (b0, b1) };
    if ka != kb {
        let what = if transpose_b { "b (transposed: [.., n, k])" } else { "b ([.., k, n])" };
        return Err(Error::shape(op, format!("{what}: inner dim k = {ka} of a"), ka, b.shape()));
    }
    let batches = batch_dims.iter().product();
    Ok(MatmulSpec { batch_dims, batches, m, n, k: ka, transpose_a, transpose_b, b_shared, dtype: a.dtype() })
}

/// A validated linear layer `y = x·Wᵀ (+ bias)` over x viewed as `[rows, in]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinearSpec {
    /// Rows of x: the product of every dim but the last (rows of zero features count).
    pub rows: usize,
    /// Input features: x's last dim, W's dim 1.
    pub features_in: usize,
    /// Output features: W's dim 0.
    pub features_out: usize,
    /// y's dims (x's with the last dim `features_out`); also d_out's.
    pub out_dims: Vec<usize>,
    /// The dtype of every operand (F32, F16 or BF16).
    pub dtype: DType,
}

/// `linear_forward(x, w, bias)`: x float `[..., in]`, w `[out, in]` and bias `[out]` of
/// x's dtype.
pub fn linear_forward(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<LinearSpec> {
    linear_forward_as("linear_forward", x, w, bias)
}

/// `linear_forward_bf16(x, w, bias)`: as [`linear_forward`].
pub fn linear_forward_bf16(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<LinearSpec> {
    linear_forward_as("linear_forward_bf16", x, w, bias)
}

fn linear_forward_as(op: &'static str, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<LinearSpec> {
    let s = layer(op, x, w)?;
    if let Some(bias) = bias {
        check::same_dtype(op, "bias", x, bias)?;
        check::shape(op, "bias", bias, &[s.features_out])?;
    }
    Ok(s)
}

/// `linear_backward(x, w, d_out)`: as [`linear_forward`]; d_out of x's dtype, shape
/// `[..., out]`.
pub fn linear_backward(x: &Tensor, w: &Tensor, d_out: &Tensor) -> Result<LinearSpec> {
    const OP: &str = "linear_backward";
    let s = layer(OP, x, w)?;
    check::same_dtype(OP, "d_out", x, d_out)?;
    check::shape(OP, "d_out", d_out, &s.out_dims)?;
    Ok(s)
}

/// `linear_backward_accumulate(x, w, d_out, dweight, dbias)`: as [`linear_backward`];
/// dweight like w, dbias `[out]`, both of x's dtype. (That they are writable is a
/// property of their storage, checked where they are written.)
pub fn linear_backward_accumulate(
    x: &Tensor,
    w: &Tensor,
    d_out: &Tensor,
    dweight: &Tensor,
    dbias: Option<&Tensor>,
) -> Result<LinearSpec> {
    linear_backward_accumulate_as("linear_backward_accumulate", x, w, d_out, dweight, dbias)
}

/// `linear_backward_accumulate_bf16(x, w, d_out, dweight, dbias)`: as
/// [`linear_backward_accumulate`].
pub fn linear_backward_accumulate_bf16(
    x: &Tensor,
    w: &Tensor,
    d_out: &Tensor,
    dweight: &Tensor,
    dbias: Option<&Tensor>,
) -> Result<LinearSpec> {
    linear_backward_accumulate_as("linear_backward_accumulate_bf16", x, w, d_out, dweight, dbias)
}

fn linear_backward_accumulate_as(
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    d_out: &Tensor,
    dweight: &Tensor,
    dbias: Option<&Tensor>,
) -> Result<LinearSpec> {
    let s = layer(op, x, w)?;
    check::same_dtype(op, "d_out", x, d_out)?;
    check::shape(op, "d_out", d_out, &s.out_dims)?;
    check::same_dtype(op, "dweight", x, dweight)?;
    check::same_shape(op, "dweight", w, dweight)?;
    if let Some(db) = dbias {
        check::same_dtype(op, "dbias", x, db)?;
        check::shape(op, "dbias", db, &[s.features_out])?;
    }
    Ok(s)
}

fn layer(op: &'static str, x: &Tensor, w: &Tensor) -> Result<LinearSpec> {
    check::float(op, "x", x)?;
    check::min_rank(op, "x", x, 1)?;
    check::same_dtype(op, "w", x, w)?;
    check::rank(op, "w", w, 2)?;
    let features_in = x.shape().last_dim();
    let features_out = w.dims()[0];
    check::shape(op, "w ([out, in])", w, &[features_out, features_in])?;
    let lead = &x.dims()[..x.rank() - 1];
    let mut out_dims = lead.to_vec();
    out_dims.push(features_out);
    Ok(LinearSpec { rows: lead.iter().product(), features_in, features_out, out_dims, dtype: x.dtype() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dims: &[usize], dtype: DType) -> Tensor {
        Tensor::zeros(dims.to_vec(), dtype).unwrap()
    }

    #[test]
    fn a_product_is_described_by_its_sizes_and_layout() {
        // a [2, 3, 5, 4] transposed is [.., 4, 5]; b [6, 5] is shared by the 6 batches.
        let s = matmul(&t(&[2, 3, 5, 4], DType::F32), &t(&[6, 5], DType::F32), true, true).unwrap();
        assert_eq!((s.batches, s.m, s.n, s.k, s.b_shared), (6, 4, 6, 5, true));
        assert_eq!(s.out_dims(), [2, 3, 4, 6]);
        let s = batched_matmul(&t(&[2, 3, 4], DType::BF16), &t(&[2, 4, 7], DType::BF16), false, false).unwrap();
        assert_eq!((s.batches, s.m, s.n, s.k, s.b_shared, s.dtype), (2, 3, 7, 4, false, DType::BF16));
    }

    #[test]
    fn bad_products_name_the_argument() {
        let a = t(&[3, 4], DType::F32);
        let e = matmul(&a, &t(&[5, 2], DType::F32), false, false).unwrap_err().to_string();
        assert!(e.contains("matmul") && e.contains("inner dim k = 4"), "{e}");
        let e = matmul(&a, &t(&[4, 2], DType::F16), false, false).unwrap_err().to_string();
        assert!(e.contains("matmul") && e.contains('b'), "{e}");
        let e = matmul(&t(&[2, 3, 4], DType::F32), &t(&[3, 4, 2], DType::F32), false, false).unwrap_err();
        assert!(e.to_string().contains("batch dims"), "{e}");
        let e = batched_matmul(&a, &t(&[4, 2], DType::F32), false, false).unwrap_err().to_string();
        assert!(e.contains("batched_matmul") && e.contains("rank 3"), "{e}");
        let e = matmul_backward(&a, &t(&[4, 2], DType::F32), &t(&[3, 3], DType::F32), false, false);
        assert!(e.unwrap_err().to_string().contains("d_out"));
    }

    #[test]
    fn a_linear_layer_counts_the_rows_of_x_even_without_features() {
        let s = linear_forward(&t(&[2, 3, 0], DType::F32), &t(&[5, 0], DType::F32), None).unwrap();
        assert_eq!((s.rows, s.features_in, s.features_out), (6, 0, 5));
        assert_eq!(s.out_dims, [2, 3, 5]);
        let x = t(&[4, 3], DType::F32);
        let w = t(&[5, 3], DType::F32);
        let e = linear_forward(&x, &w, Some(&t(&[4], DType::F32))).unwrap_err().to_string();
        assert!(e.contains("linear_forward") && e.contains("bias"), "{e}");
        let e = linear_forward(&x, &t(&[5, 32], DType::Q8_0), None).unwrap_err().to_string();
        assert!(e.contains("linear_forward") && e.contains('w'), "{e}");
        let e = linear_backward(&x, &w, &t(&[4, 4], DType::F32)).unwrap_err().to_string();
        assert!(e.contains("linear_backward") && e.contains("d_out"), "{e}");
        let d_out = t(&[4, 5], DType::F32);
        let e = linear_backward_accumulate(&x, &w, &d_out, &t(&[5, 3], DType::F16), None).unwrap_err();
        assert!(e.to_string().contains("dweight"), "{e}");
        let e = linear_backward_accumulate(&x, &w, &d_out, &w, Some(&t(&[3], DType::F32))).unwrap_err();
        assert!(e.to_string().contains("dbias"), "{e}");
    }
}
