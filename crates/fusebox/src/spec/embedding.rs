//! Embedding lookups and their gradient, row gathers, scatters and slices.
//!
//! The ids' *values* (each below a row count) are checked by [`ids`] where the ids
//! are read.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec::check;
use crate::tensor::Tensor;

/// The first id `≥ bound` is an error naming its position and value.
pub fn ids(op: &'static str, what: &str, ids: &[u32], bound: usize) -> Result<()> {
    match ids.iter().position(|&id| id as usize >= bound) {
        None => Ok(()),
        Some(p) => Err(Error::value(op, format!("{what}[{p}]"), format!("< {bound}"), ids[p])),
    }
}

/// U32 ids of rank 1: `[M]`; returns M.
pub fn id_vector(op: &'static str, ids: &Tensor) -> Result<usize> {
    check::dtype(op, "ids", ids, DType::U32)?;
    check::rank(op, "ids", ids, 1)?;
    Ok(ids.dims()[0])
}

/// A table of `rows` rows of `dim` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableSpec {
    /// Rows (the vocabulary size V, or N of an `[N, ...]` tensor).
    pub rows: usize,
    /// Elements per row.
    pub dim: usize,
    /// The table's dtype.
    pub dtype: DType,
}

/// `embedding(ids, table)`: ids U32 of any shape; table `[V, D]` F32, F16, BF16,
/// F8E4M3 or a block format (quantized tables give F32 rows).
pub fn embedding(ids: &Tensor, table: &Tensor) -> Result<TableSpec> {
    const OP: &str = "embedding";
    check::dtype(OP, "ids", ids, DType::U32)?;
    check::rank(OP, "table", table, 2)?;
    let dtype = table.dtype();
    if !(dtype.is_float() || dtype.is_quantized() || dtype == DType::F8E4M3) {
        return Err(Error::dtype(OP, "table", "f32, f16, bf16, f8e4m3 or a block format", dtype));
    }
    Ok(TableSpec { rows: table.dims()[0], dim: table.dims()[1], dtype })
}

/// `embedding_backward(ids, d_out, vocab)`: ids U32 `[...]`, d_out float `[..., D]`, the
/// `[vocab, D]` f32 gradient addressable. Returns the gradient's table.
pub fn embedding_backward(ids: &Tensor, d_out: &Tensor, vocab: usize) -> Result<TableSpec> {
    const OP: &str = "embedding_backward";
    check::dtype(OP, "ids", ids, DType::U32)?;
    check::float(OP, "d_out", d_out)?;
    let dim = d_out.dims().last().copied().unwrap_or(0);
    let mut want = ids.dims().to_vec();
    want.push(dim);
    check::shape(OP, "d_out", d_out, &want)?;
    if vocab.checked_mul(dim).and_then(|n| n.checked_mul(4)).is_none_or(|b| b > isize::MAX as usize) {
        return Err(Error::value(OP, "vocab", format!("a [vocab, {dim}] f32 table that fits in memory"), vocab));
    }
    Ok(TableSpec { rows: vocab, dim, dtype: d_out.dtype() })
}

/// `(rows, bytes per row)` of x viewed as `[N, rest]`; each row must be whole storage blocks.
pub fn row_layout(op: &'static str, x: &Tensor) -> Result<(usize, usize)> {
    check::min_rank(op, "x", x, 1)?;
    let rows = x.dims()[0];
    let row_elems: usize = x.dims()[1..].iter().product();
    if !row_elems.is_multiple_of(x.dtype().block_elems()) {
        return Err(Error::dtype(op, "x", "a dtype whose rows are whole storage blocks", x.dtype()));
    }
    Ok((rows, x.dtype().storage_bytes(row_elems)))
}

/// `index_select(x, ids)`: x `[N, ...]` of whole-block rows (any dtype), ids U32 `[M]`.
/// Returns `(N, bytes per row)`.
pub fn index_select(x: &Tensor, ids: &Tensor) -> Result<(usize, usize)> {
    const OP: &str = "index_select";
    let layout = row_layout(OP, x)?;
    id_vector(OP, ids)?;
    Ok(layout)
}

/// A row scatter `dst[ids[i]] += src[i]`: `rows` rows of `row` elements in `dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScatterSpec {
    /// Rows N of the destination.
    pub rows: usize,
    /// Elements per row.
    pub row: usize,
    /// Ids (and source rows) M.
    pub ids: usize,
    /// The destination's (and source's) dtype.
    pub dtype: DType,
}

/// `scatter_add_rows(dst, ids, src)` and `index_add(x, ids, src)` (`op`, and `what`
/// naming the destination): float destination `[N, ...]`, ids U32 `[M]`, src of the
/// destination's dtype and shape `[M, ...]`.
pub fn scatter(op: &'static str, what: &str, dst: &Tensor, ids: &Tensor, src: &Tensor) -> Result<ScatterSpec> {
    check::float(op, what, dst)?;
    check::same_dtype(op, "src", dst, src)?;
    let m = id_vector(op, ids)?;
    check::min_rank(op, what, dst, 1)?;
    let mut want = dst.dims().to_vec();
    want[0] = m;
    check::shape(op, "src", src, &want)?;
    Ok(ScatterSpec { rows: dst.dims()[0], row: dst.dims()[1..].iter().product(), ids: m, dtype: dst.dtype() })
}

/// `slice_rows(x, start, len)`: x `[N, ...]` of whole-block rows, `start + len ≤ N`.
/// Returns `(N, bytes per row)`.
pub fn slice_rows(x: &Tensor, start: usize, len: usize) -> Result<(usize, usize)> {
    const OP: &str = "slice_rows";
    let (rows, row_bytes) = row_layout(OP, x)?;
    if start.checked_add(len).is_none_or(|end| end > rows) {
        return Err(Error::value(OP, "start + len", format!("≤ {rows} rows"), format!("{start} + {len}")));
    }
    Ok((rows, row_bytes))
}
