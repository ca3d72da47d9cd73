//! Weights of a pretrained model as the backend wants them: a [`Linear`] is either a
//! dense float matrix (→ `linear_forward`) or a block-quantized one (→
//! `quantized_matmul`, read straight from the blocks); an [`Embedding`] gathers rows of a
//! float or quantized table (→ `embedding`).

use fusebox::{ComputeBackend, DType, Error, Result, Tensor};

/// A projection `y = x · Wᵀ` with W `[out, in]`, no bias.
#[derive(Debug, Clone)]
pub enum Linear {
    /// F32 weights (F16/BF16 files are widened once at load), laid out by
    /// `preprocess_linear_weight`.
    Dense(Tensor),
    /// Q8_0, Q4_0, Q4_1, Q4_K, Q6_K or FP8 E4M3 blocks, multiplied without dequantizing.
    Quantized(Tensor),
}

impl Linear {
    /// Wraps a host weight `[out, in]` read from a file, checking its shape.
    pub fn new(b: &dyn ComputeBackend, name: &str, w: &Tensor, out: usize, inp: usize) -> Result<Linear> {
        check_shape(name, w, &[out, inp])?;
        let dtype = w.dtype();
        if dtype.is_quantized() || dtype == DType::F8E4M3 {
            Ok(Linear::Quantized(b.preprocess_linear_weight(&b.upload(w)?)?))
        } else if dtype.is_float() {
            let w = if dtype == DType::F32 { b.upload(w)? } else { b.cast(&b.upload(w)?, DType::F32)? };
            Ok(Linear::Dense(b.preprocess_linear_weight(&w)?))
        } else {
            Err(Error::Io(format!("tensor '{name}': dtype {dtype} cannot be a weight matrix")))
        }
    }

    /// `x · Wᵀ`: `x` `[..., in]` F32 → `[..., out]` F32.
    pub fn forward(&self, b: &dyn ComputeBackend, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Dense(w) => b.linear_forward(x, w, None),
            Linear::Quantized(w) => b.quantized_matmul(x, w),
        }
    }

    /// The stored weight.
    pub fn weight(&self) -> &Tensor {
        match self {
            Linear::Dense(w) | Linear::Quantized(w) => w,
        }
    }

    /// `[out, in]`.
    pub fn dims(&self) -> (usize, usize) {
        let d = self.weight().dims();
        (d[0], d[1])
    }
}

/// Several projections of the same input (q, k, v; gate, up). When their weights share
/// a storage format they are stacked into one matrix, so one matmul (one pass over x,
/// one parallel dispatch) computes them all; the output is then sliced.
#[derive(Debug, Clone)]
pub enum Projections {
    /// One matrix of the stacked rows, and each part's row count.
    Stacked(Linear, Vec<usize>),
    /// Separate matrices (their formats differ).
    Separate(Vec<Linear>),
}

impl Projections {
    /// Builds from host weights `(name, tensor, out)`, all with `inp` columns.
    pub fn new(b: &dyn ComputeBackend, parts: &[(&str, &Tensor, usize)], inp: usize) -> Result<Projections> {
        for (name, t, out) in parts {
            check_shape(name, t, &[*out, inp])?;
        }
        let dtype = parts.first().map(|p| p.1.dtype());
        let same = parts.iter().all(|p| Some(p.1.dtype()) == dtype && p.1.is_host());
        match dtype {
            Some(dtype) if same && parts.len() > 1 => {
                // Rows are independent (whole blocks along `in`), so stacking is concatenating bytes.
                let mut bytes = Vec::new();
                for (_, t, _) in parts {
                    bytes.extend_from_slice(t.host_bytes()?);
                }
                let rows: Vec<usize> = parts.iter().map(|p| p.2).collect();
                let total: usize = rows.iter().sum();
                let stacked = Tensor::from_bytes(&bytes, [total, inp], dtype)?;
                let names: Vec<&str> = parts.iter().map(|p| p.0).collect();
                Ok(Projections::Stacked(Linear::new(b, &names.join("+"), &stacked, total, inp)?, rows))
            }
            _ => Ok(Projections::Separate(
                parts.iter().map(|(name, t, out)| Linear::new(b, name, t, *out, inp)).collect::<Result<_>>()?,
            )),
        }
    }

    /// Each part's `x · Wᵀ`: `x` `[..., in]` → one `[..., out_i]` per part.
    pub fn forward(&self, b: &dyn ComputeBackend, x: &Tensor) -> Result<Vec<Tensor>> {
        match self {
            Projections::Separate(ws) => ws.iter().map(|w| w.forward(b, x)).collect(),
            Projections::Stacked(w, rows) => {
                let y = w.forward(b, x)?;
                let axis = y.rank() - 1;
                let mut start = 0;
                let mut parts = Vec::with_capacity(rows.len());
                for &r in rows {
                    parts.push(b.slice(&y, axis, start, r)?);
                    start += r;
                }
                Ok(parts)
            }
        }
    }

    /// The stored matrices.
    pub fn matrices(&self) -> Vec<&Linear> {
        match self {
            Projections::Stacked(w, _) => vec![w],
            Projections::Separate(ws) => ws.iter().collect(),
        }
    }
}

/// A token embedding table `[vocab, dim]`, float (widened to F32) or quantized.
#[derive(Debug, Clone)]
pub struct Embedding {
    /// The table.
    pub table: Tensor,
}

impl Embedding {
    /// Wraps a host table read from a file, checking its shape.
    pub fn new(b: &dyn ComputeBackend, name: &str, t: &Tensor, vocab: usize, dim: usize) -> Result<Embedding> {
        check_shape(name, t, &[vocab, dim])?;
        let dtype = t.dtype();
        let table = if dtype == DType::F16 || dtype == DType::BF16 {
            b.cast(&b.upload(t)?, DType::F32)?
        } else if dtype == DType::F32 || dtype.is_quantized() {
            b.upload(t)?
        } else {
            return Err(Error::Io(format!("tensor '{name}': dtype {dtype} cannot be an embedding table")));
        };
        Ok(Embedding { table })
    }

    /// Rows of `ids` `[1, T]` U32 → `[1, T, dim]` F32.
    pub fn forward(&self, b: &dyn ComputeBackend, ids: &Tensor) -> Result<Tensor> {
        b.embedding(ids, &self.table)
    }
}

/// A norm weight `[dim]` as F32.
pub fn vector(b: &dyn ComputeBackend, name: &str, t: &Tensor, dim: usize) -> Result<Tensor> {
    check_shape(name, t, &[dim])?;
    match t.dtype() {
        DType::F32 => b.upload(t),
        DType::F16 | DType::BF16 => b.cast(&b.upload(t)?, DType::F32),
        other => {
            Err(Error::Io(format!("tensor '{name}': dtype {other} for a norm weight (expected f32, f16 or bf16)")))
        }
    }
}

/// An error naming the tensor when its shape is not `want`.
pub fn check_shape(name: &str, t: &Tensor, want: &[usize]) -> Result<()> {
    if t.dims() != want {
        return Err(Error::Io(format!("tensor '{name}': shape {:?}, expected {want:?}", t.dims())));
    }
    Ok(())
}
