//! Weight storage formats: `quantize`, `dequantize`, `quantized_matmul`,
//! `quantized_matmul_backward` and `preprocess_linear_weight`.
//!
//! A *storage format* is a GGUF block format ([`DType::is_quantized`]) or FP8 E4M3: what a
//! weight may be stored as, and what `quantize` may produce. A tensor of a block format
//! has a last dimension that is a whole number of blocks; `quantize` requires the same of
//! its input.

use crate::cpu::check;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The block over which `quantized_matmul` may round x to 8 bits when x has few rows
/// (decoding), for the formats that have integer kernels: `x̃ = d·round(x/d)` with
/// `d = max|x| / 127` per block of 32 (Q8_0, Q4_0, Q4_1, Q5_0, IQ4_NL, MXFP4; llama.cpp's
/// Q8_0) or 256 (Q4_K, Q5_K, Q6_K; llama.cpp's Q8_K), and then `y = x̃ · Wᵀ`. `None`:
/// the format is always multiplied with x in f32. `CpuBackend` rounds when built with
/// `exact_decode(false)`.
pub fn int_activation_block(dtype: DType) -> Option<usize> {
    match dtype {
        DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::IQ4NL | DType::MXFP4 => Some(32),
        DType::Q4K | DType::Q5K | DType::Q6K => Some(256),
        _ => None,
    }
}

/// What the errors of this family name as the accepted storage formats.
pub const STORAGE_FORMATS: &str =
    "a block format (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs) or f8e4m3";

/// Whether `dtype` is a storage format: a block format or FP8 E4M3.
pub fn is_storage_format(dtype: DType) -> bool {
    dtype.is_quantized() || dtype == DType::F8E4M3
}

/// A validated `quantize` or `dequantize`: `elems` elements of `dtype` storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageSpec {
    /// The storage format (the target of `quantize`, the input of `dequantize`).
    pub dtype: DType,
    /// Logical elements (a whole number of `dtype` blocks).
    pub elems: usize,
    /// The float side's dtype: `quantize`'s input (F32, F16 or BF16), `dequantize`'s
    /// output (F32).
    pub float: DType,
}

/// `quantize(x, dtype)`: x F32/F16/BF16 of rank ≥ 1 whose last dim is a multiple of
/// `dtype`'s block size; `dtype` a storage format.
pub fn quantize(x: &Tensor, dtype: DType) -> Result<StorageSpec> {
    const OP: &str = "quantize";
    check::float(OP, "x", x)?;
    if !is_storage_format(dtype) {
        return Err(Error::dtype(OP, "target", STORAGE_FORMATS, dtype));
    }
    check::min_rank(OP, "x", x, 1)?;
    let be = dtype.block_elems();
    if !x.shape().last_dim().is_multiple_of(be) {
        return Err(Error::shape(
            OP,
            format!("x (last dim for {dtype} blocks)"),
            format!("[..., multiple of {be}]"),
            x.shape(),
        ));
    }
    Ok(StorageSpec { dtype, elems: x.elem_count(), float: x.dtype() })
}

/// `dequantize(x)`: x of a storage format (any shape; its blocks are whole by
/// construction) → F32.
pub fn dequantize(x: &Tensor) -> Result<StorageSpec> {
    const OP: &str = "dequantize";
    let dtype = x.dtype();
    if !is_storage_format(dtype) {
        return Err(Error::dtype(OP, "x", STORAGE_FORMATS, dtype));
    }
    Ok(StorageSpec { dtype, elems: x.elem_count(), float: DType::F32 })
}

/// The checks `quantized_matmul` and its backward share: `a` (named `name`) F32, F16 or
/// BF16 of rank ≥ 1, `w` a rank-2 matrix of a storage format. Returns w's `(rows, cols)`.
fn float_rows_and_block_weight(op: &'static str, name: &str, a: &Tensor, w: &Tensor) -> Result<(usize, usize)> {
    check::float(op, name, a)?;
    check::min_rank(op, name, a, 1)?;
    if !is_storage_format(w.dtype()) {
        return Err(Error::dtype(op, "w", STORAGE_FORMATS, w.dtype()));
    }
    check::rank(op, "w", w, 2)?;
    Ok((w.dims()[0], w.dims()[1]))
}

/// A validated `quantized_matmul`: `[m, k] · [n, k]ᵀ → [m, n]` with x's leading dims
/// flattened into m.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantMatmulSpec {
    /// Rows of x (the product of its leading dims).
    pub m: usize,
    /// W's rows (outputs per x row).
    pub n: usize,
    /// The shared inner size (x's last dim, W's columns).
    pub k: usize,
    /// W's storage format.
    pub w_dtype: DType,
    /// x's dtype (F32, F16 or BF16), which the output takes.
    pub dtype: DType,
    /// The output's dims: x's leading dims, then n.
    pub out_dims: Vec<usize>,
}

/// `quantized_matmul(x, w)`: x F32/F16/BF16 `[..., k]` (rank ≥ 1), w `[n, k]` of a
/// storage format.
pub fn quantized_matmul(x: &Tensor, w: &Tensor) -> Result<QuantMatmulSpec> {
    const OP: &str = "quantized_matmul";
    let (n, k) = float_rows_and_block_weight(OP, "x", x, w)?;
    if x.shape().last_dim() != k {
        return Err(Error::shape(OP, "x (last dim = w's in)", format!("[..., {k}]"), x.shape()));
    }
    let lead = &x.dims()[..x.rank() - 1]; // rank ≥ 1 checked above
    let out_dims: Vec<usize> = lead.iter().copied().chain([n]).collect();
    Ok(QuantMatmulSpec { m: lead.iter().product(), n, k, w_dtype: w.dtype(), dtype: x.dtype(), out_dims })
}

/// A validated `quantized_matmul_backward`: `dx = dy · W`, `[m, n] · [n, k] → [m, k]`
/// with dy's leading dims flattened into m.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantMatmulBackwardSpec {
    /// Rows of dy (the product of its leading dims).
    pub m: usize,
    /// W's rows (dy's last dim, the forward's outputs).
    pub n: usize,
    /// W's columns (dx's last dim, the forward's inputs).
    pub k: usize,
    /// W's storage format.
    pub w_dtype: DType,
    /// dy's dtype (F32, F16 or BF16), which dx takes.
    pub dtype: DType,
    /// dx's dims: dy's leading dims, then k.
    pub out_dims: Vec<usize>,
}

/// `quantized_matmul_backward(dy, w)`: dy F32/F16/BF16 `[..., n]` (rank ≥ 1), w `[n, k]`
/// of a storage format (the W of the forward `y = quantized_matmul(x, w)`).
pub fn quantized_matmul_backward(dy: &Tensor, w: &Tensor) -> Result<QuantMatmulBackwardSpec> {
    const OP: &str = "quantized_matmul_backward";
    let (n, k) = float_rows_and_block_weight(OP, "dy", dy, w)?;
    if dy.shape().last_dim() != n {
        return Err(Error::shape(OP, "dy (last dim = w's out, its rows)", format!("[..., {n}]"), dy.shape()));
    }
    let lead = &dy.dims()[..dy.rank() - 1]; // rank ≥ 1 checked above
    let out_dims: Vec<usize> = lead.iter().copied().chain([k]).collect();
    Ok(QuantMatmulBackwardSpec { m: lead.iter().product(), n, k, w_dtype: w.dtype(), dtype: dy.dtype(), out_dims })
}

/// A validated linear weight `[out, in]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearWeightSpec {
    /// Rows (outputs).
    pub out: usize,
    /// Columns (inputs).
    pub inputs: usize,
    /// The weight's dtype: F32/F16/BF16 or a storage format.
    pub dtype: DType,
}

/// `preprocess_linear_weight(w)`: w `[out, in]` of F32/F16/BF16 or a storage format.
pub fn preprocess_linear_weight(w: &Tensor) -> Result<LinearWeightSpec> {
    const OP: &str = "preprocess_linear_weight";
    check::rank(OP, "weight", w, 2)?;
    let dtype = w.dtype();
    if !(dtype.is_float() || is_storage_format(dtype)) {
        return Err(Error::dtype(OP, "weight", "f32, f16, bf16, f8e4m3 or a block format", dtype));
    }
    Ok(LinearWeightSpec { out: w.dims()[0], inputs: w.dims()[1], dtype })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_that_does_not_divide_the_last_dim_is_an_error_naming_the_block() {
        let x = Tensor::zeros([2, 48], DType::F32).unwrap();
        let err = quantize(&x, DType::Q5_0).unwrap_err().to_string();
        assert!(err.contains("quantize") && err.contains("q5_0") && err.contains("multiple of 32"), "{err}");
        let err = quantize(&Tensor::zeros([2, 288], DType::F32).unwrap(), DType::IQ4XS).unwrap_err().to_string();
        assert!(err.contains("multiple of 256"), "{err}");
        assert_eq!(
            quantize(&Tensor::zeros([2, 512], DType::BF16).unwrap(), DType::Q3K).unwrap(),
            StorageSpec { dtype: DType::Q3K, elems: 1024, float: DType::BF16 }
        );
    }

    #[test]
    fn matmul_describes_the_flattened_call() {
        let x = Tensor::zeros([2, 3, 64], DType::F16).unwrap();
        let w = Tensor::zeros([5, 64], DType::IQ4NL).unwrap();
        let s = quantized_matmul(&x, &w).unwrap();
        assert_eq!((s.m, s.n, s.k, s.w_dtype, s.dtype), (6, 5, 64, DType::IQ4NL, DType::F16));
        assert_eq!(s.out_dims, vec![2, 3, 5]);
        let err = quantized_matmul(&x, &Tensor::zeros([5, 64], DType::F32).unwrap()).unwrap_err().to_string();
        assert!(err.contains("quantized_matmul") && err.contains("w") && err.contains("f32"), "{err}");
    }

    #[test]
    fn matmul_backward_describes_the_flattened_call_and_names_bad_arguments() {
        let dy = Tensor::zeros([2, 3, 5], DType::BF16).unwrap();
        let w = Tensor::zeros([5, 256], DType::Q4K).unwrap();
        let s = quantized_matmul_backward(&dy, &w).unwrap();
        assert_eq!((s.m, s.n, s.k, s.w_dtype, s.dtype), (6, 5, 256, DType::Q4K, DType::BF16));
        assert_eq!(s.out_dims, vec![2, 3, 256]);
        let err = quantized_matmul_backward(&Tensor::zeros([2, 256], DType::F32).unwrap(), &w).unwrap_err().to_string();
        assert!(err.contains("quantized_matmul_backward") && err.contains("dy") && err.contains("[..., 5]"), "{err}");
        let err =
            quantized_matmul_backward(&dy, &Tensor::zeros([5, 256], DType::F32).unwrap()).unwrap_err().to_string();
        assert!(err.contains("quantized_matmul_backward") && err.contains("w") && err.contains("f32"), "{err}");
        let err = quantized_matmul_backward(&Tensor::zeros([2, 5], DType::U32).unwrap(), &w).unwrap_err().to_string();
        assert!(err.contains("dy") && err.contains("u32"), "{err}");
    }
}
