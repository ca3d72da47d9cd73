//! Row gathers and scatters: embedding (plain and quantized tables) and its backward,
//! index_select, scatter_add_rows, slice_rows, index_add.
//!
//! Gathers copy whole rows as bytes (any dtype whose rows are whole storage blocks).
//! Scatter-adds are deterministic without atomics: the ids are sorted (id, position)
//! so each destination row is owned by one task, which adds its source rows in
//! position order; results are identical whatever the thread count.

use std::ops::Range;
use std::sync::Mutex;

use half::{bf16, f16};

use crate::cpu::convert::f32_data;
use crate::cpu::layout::par_copy;
use crate::cpu::pool::SharedMut;
use crate::cpu::quant::dequantize_row_into;
use crate::cpu::simd;
use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec::embedding::{self as spec, TableSpec};
use crate::tensor::Tensor;

/// Bytes per parallel chunk of a row gather.
const CHUNK_BYTES: usize = 1 << 16;

/// `dst` row r ← `src` row `ids[r]`, rows of `row_bytes`; ids already checked.
fn gather_rows(cpu: &CpuBackend, src: &[u8], row_bytes: usize, ids: &[u32], dst: &mut [u8]) {
    if dst.is_empty() {
        return;
    }
    let rows_per_chunk = (CHUNK_BYTES / row_bytes).max(1);
    cpu.for_each_chunk(dst, rows_per_chunk * row_bytes, 1, |c, chunk| {
        for (out, &id) in chunk.chunks_exact_mut(row_bytes).zip(&ids[c * rows_per_chunk..]) {
            let from = id as usize * row_bytes;
            out.copy_from_slice(&src[from..from + row_bytes]);
        }
    });
}

/// `out[..., :] = table[ids[...], :]`. F32/F16/BF16 tables give their own dtype (rows
/// copied as they are); quantized and FP8 tables are dequantized row by row into F32.
///
/// # Shapes
/// `ids`: `[...]` U32, every id < V; `table`: `[V, D]` → `[..., D]`.
pub fn embedding(cpu: &CpuBackend, ids: &Tensor, table: &Tensor) -> Result<Tensor> {
    const OP: &str = "embedding";
    let TableSpec { rows: vocab, dim, dtype } = spec::embedding(ids, table)?;
    let id_values = ids.as_slice::<u32>()?;
    spec::ids(OP, "ids", id_values, vocab)?;
    let mut dims = ids.dims().to_vec();
    dims.push(dim);
    let row_bytes = dtype.storage_bytes(dim);
    let bytes = table.host_bytes()?;
    if dtype.is_float() {
        let mut out = Tensor::zeros(dims, dtype)?;
        gather_rows(cpu, bytes, row_bytes, id_values, out.host_bytes_mut()?);
        return Ok(out);
    }
    let mut out = Tensor::zeros(dims, DType::F32)?;
    if dim == 0 {
        return Ok(out);
    }
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    let rows_per_chunk = (CHUNK_BYTES / (4 * dim)).max(1);
    cpu.for_each_chunk(out.as_mut_slice::<f32>()?, rows_per_chunk * dim, 4, |c, chunk| {
        for (row, &id) in chunk.chunks_exact_mut(dim).zip(&id_values[c * rows_per_chunk..]) {
            let from = id as usize * row_bytes;
            if let Err(e) = dequantize_row_into(dtype, &bytes[from..from + row_bytes], row) {
                first_error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                return;
            }
        }
    });
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Positions of the ids grouped by id: ids ascending, positions ascending within a group.
struct RowGroups {
    /// Positions sorted by (id, position).
    positions: Vec<usize>,
    /// `(id, range of positions)` per distinct id.
    groups: Vec<(usize, Range<usize>)>,
}

impl RowGroups {
    fn new(ids: &[u32]) -> RowGroups {
        let mut pairs: Vec<(u32, usize)> = ids.iter().copied().zip(0..).collect();
        pairs.sort_unstable();
        let mut groups: Vec<(usize, Range<usize>)> = Vec::new();
        for (k, &(id, _)) in pairs.iter().enumerate() {
            match groups.last_mut() {
                Some((g, range)) if *g == id as usize => range.end = k + 1,
                _ => groups.push((id as usize, k..k + 1)),
            }
        }
        RowGroups { positions: pairs.into_iter().map(|(_, p)| p).collect(), groups }
    }
}

/// Float element types a scatter-add writes, through f32.
trait Stored: Copy + Send + Sync + 'static {
    fn load(self) -> f32;
    fn store(v: f32) -> Self;
}
impl Stored for f16 {
    fn load(self) -> f32 {
        self.to_f32()
    }
    fn store(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl Stored for bf16 {
    fn load(self) -> f32 {
        self.to_f32()
    }
    fn store(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

/// `dst[ids[i]] += src[i]` for f32 rows of `row` elements: one task per distinct id,
/// adding its source rows in position order.
fn add_rows_f32(cpu: &CpuBackend, dst: &mut [f32], row: usize, ids: &[u32], src: &[f32]) {
    let rg = RowGroups::new(ids);
    let out = SharedMut(dst.as_mut_ptr());
    let work = row * (ids.len() / rg.groups.len().max(1)).max(1);
    cpu.for_each_index(rg.groups.len(), work, |g| {
        let (id, range) = &rg.groups[g];
        // SAFETY: ids are distinct across groups and checked < rows, so rows are disjoint and in bounds.
        let d = unsafe { out.slice(id * row, row) };
        for &p in &rg.positions[range.clone()] {
            simd::axpy(d, 1.0, &src[p * row..(p + 1) * row]);
        }
    });
}

/// As [`add_rows_f32`] for f16/bf16 rows: each touched row accumulates in f32 and is
/// rounded once.
fn add_rows_half<T: Stored>(cpu: &CpuBackend, dst: &mut [T], row: usize, ids: &[u32], src: &[f32]) {
    let rg = RowGroups::new(ids);
    let out = SharedMut(dst.as_mut_ptr());
    let work = row * (ids.len() / rg.groups.len().max(1)).max(1);
    cpu.for_each_index(rg.groups.len(), work, |g| {
        let (id, range) = &rg.groups[g];
        // SAFETY: as in `add_rows_f32`.
        let d = unsafe { out.slice(id * row, row) };
        let mut acc: Vec<f32> = d.iter().map(|v| v.load()).collect();
        for &p in &rg.positions[range.clone()] {
            simd::axpy(&mut acc, 1.0, &src[p * row..(p + 1) * row]);
        }
        for (v, &a) in d.iter_mut().zip(&acc) {
            *v = T::store(a);
        }
    });
}

/// Validates `dst[ids[i]] += src[i]` ([`spec::scatter`], then every id < N). Returns
/// the row length.
fn check_scatter(op: &'static str, what: &str, dst: &Tensor, ids: &Tensor, src: &Tensor) -> Result<usize> {
    let s = spec::scatter(op, what, dst, ids, src)?;
    spec::ids(op, "ids", ids.as_slice::<u32>()?, s.rows)?;
    Ok(s.row)
}

/// Adds the rows after [`check_scatter`]; `dst` must be writable.
fn add_rows(
    op: &'static str,
    cpu: &CpuBackend,
    dst: &mut Tensor,
    ids: &Tensor,
    src: &Tensor,
    row: usize,
) -> Result<()> {
    let src = f32_data(op, "src", src)?;
    let ids = ids.as_slice::<u32>()?;
    match dst.dtype() {
        DType::F32 => add_rows_f32(cpu, dst.as_mut_slice::<f32>()?, row, ids, &src),
        DType::F16 => add_rows_half(cpu, dst.as_mut_slice::<f16>()?, row, ids, &src),
        DType::BF16 => add_rows_half(cpu, dst.as_mut_slice::<bf16>()?, row, ids, &src),
        other => return Err(Error::dtype(op, "destination", "f32, f16 or bf16", other)),
    }
    Ok(())
}

/// `dtable[ids[n], :] += d_out[n, :]` into zeros, f32; deterministic (rows owned by one task each).
///
/// # Shapes
/// `ids`: `[...]` U32, every id < vocab; `d_out`: `[..., D]` float → `[vocab, D]` f32.
pub fn embedding_backward(cpu: &CpuBackend, ids: &Tensor, d_out: &Tensor, vocab: usize) -> Result<Tensor> {
    const OP: &str = "embedding_backward";
    let TableSpec { dim, .. } = spec::embedding_backward(ids, d_out, vocab)?;
    let id_values = ids.as_slice::<u32>()?;
    spec::ids(OP, "ids", id_values, vocab)?;
    let dy = f32_data(OP, "d_out", d_out)?;
    let mut out = Tensor::zeros([vocab, dim], DType::F32)?;
    add_rows_f32(cpu, out.as_mut_slice::<f32>()?, dim, id_values, &dy);
    Ok(out)
}

/// Gathers rows (first-axis slices): `out[i] = x[ids[i]]`, any dtype whose rows are whole
/// storage blocks.
///
/// # Shapes
/// `x`: `[N, ...]`; `ids`: `[M]` U32, every id < N → `[M, ...]`.
pub fn index_select(cpu: &CpuBackend, x: &Tensor, ids: &Tensor) -> Result<Tensor> {
    const OP: &str = "index_select";
    let (rows, row_bytes) = spec::index_select(x, ids)?;
    let id_values = ids.as_slice::<u32>()?;
    spec::ids(OP, "ids", id_values, rows)?;
    let mut dims = x.dims().to_vec();
    dims[0] = id_values.len();
    let mut out = Tensor::zeros(dims, x.dtype())?;
    gather_rows(cpu, x.host_bytes()?, row_bytes, id_values, out.host_bytes_mut()?);
    Ok(out)
}

/// `dst[ids[i]] += src[i]`, in place (dst must be writable); repeated ids accumulate
/// in position order.
///
/// # Shapes
/// `dst`: `[N, ...]` float; `ids`: `[M]` U32, every id < N; `src`: `[M, ...]`, dst's dtype.
pub fn scatter_add_rows(cpu: &CpuBackend, dst: &mut Tensor, ids: &Tensor, src: &Tensor) -> Result<()> {
    const OP: &str = "scatter_add_rows";
    let row = check_scatter(OP, "dst", dst, ids, src)?;
    dst.ensure_writable(OP)?;
    add_rows(OP, cpu, dst, ids, src, row)
}

/// Rows `start .. start + len` along the first axis.
///
/// # Shapes
/// `x`: `[N, ...]`, `start + len ≤ N` → `[len, ...]`.
pub fn slice_rows(cpu: &CpuBackend, x: &Tensor, start: usize, len: usize) -> Result<Tensor> {
    let (_, row_bytes) = spec::slice_rows(x, start, len)?;
    let mut dims = x.dims().to_vec();
    dims[0] = len;
    let mut out = Tensor::zeros(dims, x.dtype())?;
    par_copy(cpu, out.host_bytes_mut()?, &x.host_bytes()?[start * row_bytes..(start + len) * row_bytes]);
    Ok(out)
}

/// `out = x` with `out[ids[i]] += src[i]`: a new tensor (the gradient of `index_select`).
///
/// # Shapes
/// `x`: `[N, ...]` float; `ids`: `[M]` U32, every id < N; `src`: `[M, ...]`, x's dtype → `[N, ...]`.
pub fn index_add(cpu: &CpuBackend, x: &Tensor, ids: &Tensor, src: &Tensor) -> Result<Tensor> {
    const OP: &str = "index_add";
    let row = check_scatter(OP, "x", x, ids, src)?;
    let mut out = Tensor::zeros(x.shape().clone(), x.dtype())?;
    par_copy(cpu, out.host_bytes_mut()?, x.host_bytes()?);
    add_rows(OP, cpu, &mut out, ids, src, row)?;
    Ok(out)
}
