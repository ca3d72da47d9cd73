//! Layout kernels: permute, transpose, slice (and its backward), select, concat, expand.
//!
//! They move elements without arithmetic, so they accept every plain dtype (F32, F16,
//! BF16, U32, F8E4M3) and work on raw bits. Every op is one of two movements:
//! a strided gather (`out[i] = x[base + Σ_a idx_a(i)·stride_a]`, with stride 0 for
//! broadcast axes) or an assembly of rows from pieces (concat, slice backward). Both
//! copy whole contiguous runs with `copy_from_slice`, fill broadcast runs, go through
//! small tiles when the innermost output axis is strided in the input (transposes),
//! and split the output into fixed chunks that run in parallel for big tensors.

use crate::cpu::pool::SharedMut;
use crate::cpu::CpuBackend;
use crate::error::Result;
use crate::shape::Shape;
use crate::spec::layout::{self as spec, ExpandSpec, MoveSpec, PermuteSpec};
use crate::tensor::Tensor;

/// Output elements per parallel chunk of a contiguous or broadcast gather.
const CHUNK_ELEMS: usize = 1 << 14;
/// Side of the square tiles of a transposing gather: 32 × 32 four-byte elements = 4 KiB
/// on each side, so both the strided reads and the writes stay in L1.
const TILE: usize = 32;
/// Bytes per parallel chunk of the row assembler.
const CHUNK_BYTES: usize = 1 << 16;

/// Element types moved as raw bits: every bit pattern is a valid value.
trait Bits: Copy + Send + Sync + 'static {}
impl Bits for u8 {}
impl Bits for u16 {}
impl Bits for u32 {}

/// `bytes` as a slice of `T`. Tensor storage is 64-byte aligned and element offsets are
/// multiples of the element size, so the whole slice converts.
fn as_bits<T: Bits>(bytes: &[u8]) -> &[T] {
    // SAFETY: `T` is a plain integer, valid for any bit pattern.
    let (head, mid, tail) = unsafe { bytes.align_to::<T>() };
    assert!(head.is_empty() && tail.is_empty(), "tensor storage is aligned to its element size");
    mid
}

/// `bytes` as a mutable slice of `T` (see [`as_bits`]).
fn as_bits_mut<T: Bits>(bytes: &mut [u8]) -> &mut [T] {
    // SAFETY: as in `as_bits`.
    let (head, mid, tail) = unsafe { bytes.align_to_mut::<T>() };
    assert!(head.is_empty() && tail.is_empty(), "tensor storage is aligned to its element size");
    mid
}

/// A strided gather: output element at multi-index `i` (row-major over `dims`) reads
/// the source at `base + Σ_a i_a·strides[a]` (strides in elements, 0 for broadcast axes).
#[derive(Debug, Clone)]
pub(crate) struct Gather {
    dims: Vec<usize>,
    strides: Vec<usize>,
    base: usize,
}

impl Gather {
    /// A gather over output `dims` with source `strides`, simplified: size-1 axes are
    /// dropped and neighbours that walk the source as one axis are merged, so the
    /// innermost axis is the longest contiguous (or broadcast) run there is.
    pub(crate) fn new(dims: &[usize], strides: &[usize], base: usize) -> Gather {
        let mut d: Vec<usize> = Vec::with_capacity(dims.len());
        let mut s: Vec<usize> = Vec::with_capacity(dims.len());
        for (&n, &st) in dims.iter().zip(strides) {
            if n == 1 {
                continue;
            }
            match (d.last_mut(), s.last_mut()) {
                // The outer axis steps exactly over one full sweep of this one: merge.
                (Some(ld), Some(ls)) if *ls == st * n => {
                    *ld *= n;
                    *ls = st;
                }
                _ => {
                    d.push(n);
                    s.push(st);
                }
            }
        }
        if d.is_empty() {
            d.push(1);
            s.push(1);
        }
        Gather { dims: d, strides: s, base }
    }

    /// Source offsets (in elements) of `count` consecutive output rows starting at `first`,
    /// a row being one sweep of the innermost axis.
    fn row_offsets(&self, first: usize, count: usize) -> Vec<usize> {
        let outer = &self.dims[..self.dims.len() - 1];
        let strides = &self.strides[..self.dims.len() - 1];
        let mut idx = vec![0usize; outer.len()];
        let mut rest = first;
        for a in (0..outer.len()).rev() {
            idx[a] = rest % outer[a];
            rest /= outer[a];
        }
        let mut offset = self.base + idx.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>();
        let mut offsets = Vec::with_capacity(count);
        for _ in 0..count {
            offsets.push(offset);
            // Odometer step over the outer axes.
            for a in (0..outer.len()).rev() {
                idx[a] += 1;
                offset += strides[a];
                if idx[a] < outer[a] {
                    break;
                }
                offset -= strides[a] * outer[a];
                idx[a] = 0;
            }
        }
        offsets
    }

    /// Runs the gather from `src` into `dst` (both in elements of `elem_bytes` bytes).
    pub(crate) fn run_bytes(&self, cpu: &CpuBackend, src: &[u8], dst: &mut [u8], elem_bytes: usize) {
        match elem_bytes {
            4 => self.run(cpu, as_bits::<u32>(src), as_bits_mut::<u32>(dst)),
            2 => self.run(cpu, as_bits::<u16>(src), as_bits_mut::<u16>(dst)),
            1 => self.run(cpu, src, dst),
            n => {
                // Any other width: the same gather over bytes with one more contiguous axis.
                let mut dims = self.dims.clone();
                let mut strides: Vec<usize> = self.strides.iter().map(|s| s * n).collect();
                dims.push(n);
                strides.push(1);
                Gather::new(&dims, &strides, self.base * n).run(cpu, src, dst)
            }
        }
    }

    fn run<T: Bits>(&self, cpu: &CpuBackend, src: &[T], dst: &mut [T]) {
        if dst.is_empty() {
            return;
        }
        let cols = self.dims[self.dims.len() - 1];
        match self.strides[self.dims.len() - 1] {
            0 | 1 => self.run_runs(cpu, src, dst, cols),
            s => self.run_tiled(cpu, src, dst, cols, s),
        }
    }

    /// Innermost axis contiguous (stride 1: one memcpy per run) or broadcast (stride 0:
    /// one value repeated). The output splits into fixed element ranges, so even a
    /// single long run is copied in parallel.
    fn run_runs<T: Bits>(&self, cpu: &CpuBackend, src: &[T], dst: &mut [T], cols: usize) {
        let contiguous = self.strides[self.dims.len() - 1] == 1;
        cpu.for_each_chunk(dst, CHUNK_ELEMS, 1, |chunk_idx, chunk| {
            let lo = chunk_idx * CHUNK_ELEMS;
            let end = lo + chunk.len();
            let first_row = lo / cols;
            let offsets = self.row_offsets(first_row, (end - 1) / cols - first_row + 1);
            let mut pos = lo;
            while pos < end {
                let (row, col) = (pos / cols, pos % cols);
                let take = (cols - col).min(end - pos);
                let out = &mut chunk[pos - lo..pos - lo + take];
                let o = offsets[row - first_row];
                if contiguous {
                    out.copy_from_slice(&src[o + col..o + col + take]);
                } else {
                    out.fill(src[o]);
                }
                pos += take;
            }
        });
    }

    /// Innermost axis strided in the source (a transpose): the output is cut into tiles
    /// of TILE rows × TILE columns, visited in units of TILE rows × UNIT_COLS columns that
    /// run in parallel; within a tile the source lines it touches are reused across rows.
    fn run_tiled<T: Bits>(&self, cpu: &CpuBackend, src: &[T], dst: &mut [T], cols: usize, stride: usize) {
        const UNIT_COLS: usize = 16 * TILE;
        let rows = dst.len() / cols;
        let (row_units, col_units) = (rows.div_ceil(TILE), cols.div_ceil(UNIT_COLS));
        let out = SharedMut(dst.as_mut_ptr());
        cpu.for_each_index(row_units * col_units, TILE * UNIT_COLS, |unit| {
            let (r0, u0) = ((unit / col_units) * TILE, (unit % col_units) * UNIT_COLS);
            let (r1, u1) = ((r0 + TILE).min(rows), (u0 + UNIT_COLS).min(cols));
            let offsets = self.row_offsets(r0, r1 - r0);
            for c0 in (u0..u1).step_by(TILE) {
                let c1 = (c0 + TILE).min(u1);
                for (r, &o) in (r0..r1).zip(&offsets) {
                    // SAFETY: units cover disjoint (row, column) blocks of `dst`, and
                    // r < rows, c1 ≤ cols keep the range inside it.
                    let row = unsafe { out.slice(r * cols + c0, c1 - c0) };
                    let o = o + c0 * stride;
                    for (k, v) in row.iter_mut().enumerate() {
                        *v = src[o + k * stride];
                    }
                }
            }
        });
    }
}

/// One piece of every output row of [`assemble_rows`]: `bytes` bytes per row, taken
/// from row r of `src` (`src[r·bytes ..]`), or left zero when `src` is `None`.
pub(crate) struct Piece<'a> {
    pub src: Option<&'a [u8]>,
    pub bytes: usize,
}

/// Fills `dst` (zero-initialised), viewed as rows that are the concatenation of `pieces`.
/// The output is split into fixed byte ranges that run in parallel, whatever the shape.
pub(crate) fn assemble_rows(cpu: &CpuBackend, dst: &mut [u8], pieces: &[Piece<'_>]) {
    let row_bytes: usize = pieces.iter().map(|p| p.bytes).sum();
    if dst.is_empty() || row_bytes == 0 {
        return;
    }
    // starts[k]: offset of piece k within a row.
    let starts: Vec<usize> = pieces
        .iter()
        .scan(0, |acc, p| {
            let s = *acc;
            *acc += p.bytes;
            Some(s)
        })
        .collect();
    cpu.for_each_chunk(dst, CHUNK_BYTES, 1, |chunk_idx, chunk| {
        let lo = chunk_idx * CHUNK_BYTES;
        let mut pos = lo;
        let end = lo + chunk.len();
        while pos < end {
            let (row, within) = (pos / row_bytes, pos % row_bytes);
            // The piece holding `within`: the last one starting at or before it (pieces of
            // zero bytes start where the next one does and are skipped).
            let k = starts.partition_point(|&s| s <= within) - 1;
            let piece = &pieces[k];
            let take = (starts[k] + piece.bytes - within).min(end - pos);
            if let Some(src) = piece.src {
                let from = row * piece.bytes + (within - starts[k]);
                chunk[pos - lo..pos - lo + take].copy_from_slice(&src[from..from + take]);
            }
            pos += take;
        }
    });
}

/// Copies `src` into `dst` (equal lengths) in parallel fixed-size pieces.
pub(crate) fn par_copy(cpu: &CpuBackend, dst: &mut [u8], src: &[u8]) {
    cpu.for_each_chunk(dst, CHUNK_BYTES, 1, |i, chunk| {
        let lo = i * CHUNK_BYTES;
        chunk.copy_from_slice(&src[lo..lo + chunk.len()]);
    });
}

/// Runs `gather` from `x` into a new tensor of `dims` and x's dtype.
fn gather_into_new(
    cpu: &CpuBackend,
    x: &Tensor,
    elem_bytes: usize,
    dims: Vec<usize>,
    gather: &Gather,
) -> Result<Tensor> {
    let mut out = Tensor::zeros(dims, x.dtype())?;
    gather.run_bytes(cpu, x.host_bytes()?, out.host_bytes_mut()?, elem_bytes);
    Ok(out)
}

/// Runs a validated permutation of `x`.
fn permute_spec(cpu: &CpuBackend, x: &Tensor, p: PermuteSpec) -> Result<Tensor> {
    let in_strides = x.shape().strides();
    let strides: Vec<usize> = p.perm.iter().map(|&a| in_strides[a]).collect();
    gather_into_new(cpu, x, p.elem_bytes, p.out_dims.clone(), &Gather::new(&p.out_dims, &strides, 0))
}

/// Reorders the axes: output dim i is x's dim `perm[i]` (materialised).
///
/// # Shapes
/// `x`: rank r, any plain dtype; `perm`: a permutation of `0..r` → permuted shape.
pub fn permute(cpu: &CpuBackend, x: &Tensor, perm: &[usize]) -> Result<Tensor> {
    let p = spec::permute(x, perm)?;
    permute_spec(cpu, x, p)
}

/// Swaps axes `dim0` and `dim1` (materialised).
///
/// # Shapes
/// `x`: rank r, `dim0, dim1 < r` → those dims swapped.
pub fn transpose(cpu: &CpuBackend, x: &Tensor, dim0: usize, dim1: usize) -> Result<Tensor> {
    let p = spec::transpose(x, dim0, dim1)?;
    permute_spec(cpu, x, p)
}

/// Elements `start .. start + len` along `axis` (materialised).
///
/// # Shapes
/// `x`: `[..., N, ...]`, `start + len ≤ N` → `[..., len, ...]`.
pub fn slice(cpu: &CpuBackend, x: &Tensor, axis: usize, start: usize, len: usize) -> Result<Tensor> {
    let MoveSpec { out_dims, elem_bytes, .. } = spec::slice(x, axis, start, len)?;
    let strides = x.shape().strides();
    let gather = Gather::new(&out_dims, &strides, start * strides[axis]);
    gather_into_new(cpu, x, elem_bytes, out_dims, &gather)
}

/// Gradient of `slice`: `d_out` written at `start ..` along `axis` of zeros of `input_shape`.
///
/// # Shapes
/// `d_out`: float, `input_shape` with `len` along `axis` (`start + len ≤ input_shape[axis]`)
/// → `input_shape`, d_out's dtype.
pub fn slice_backward(
    cpu: &CpuBackend,
    d_out: &Tensor,
    input_shape: &Shape,
    axis: usize,
    start: usize,
) -> Result<Tensor> {
    let MoveSpec { elem_bytes, .. } = spec::slice_backward(d_out, input_shape, axis, start)?;
    let dims = input_shape.dims();
    let len = d_out.dims()[axis];
    let inner: usize = dims[axis + 1..].iter().product::<usize>() * elem_bytes;
    let mut out = Tensor::zeros(input_shape.clone(), d_out.dtype())?;
    let pieces = [
        Piece { src: None, bytes: start * inner },
        Piece { src: Some(d_out.host_bytes()?), bytes: len * inner },
        Piece { src: None, bytes: (dims[axis] - start - len) * inner },
    ];
    assemble_rows(cpu, out.host_bytes_mut()?, &pieces);
    Ok(out)
}

/// Index `index` along `axis`, which is removed.
///
/// # Shapes
/// `x`: `[..., N, ...]`, `index < N` → `[..., ...]`.
pub fn select(cpu: &CpuBackend, x: &Tensor, axis: usize, index: usize) -> Result<Tensor> {
    let MoveSpec { out_dims, elem_bytes, .. } = spec::select(x, axis, index)?;
    let mut strides = x.shape().strides();
    let step = strides.remove(axis);
    let gather = Gather::new(&out_dims, &strides, index * step);
    gather_into_new(cpu, x, elem_bytes, out_dims, &gather)
}

/// Joins tensors along `axis`; every other dim and the dtype must agree.
///
/// # Shapes
/// `[..., Nᵢ, ...]` each (at least one) → `[..., ΣNᵢ, ...]`.
pub fn concat(cpu: &CpuBackend, xs: &[Tensor], axis: usize) -> Result<Tensor> {
    // Called directly by backends (not through `on_cpu!`): hold this backend's ISA.
    let _isa = cpu.enter();
    let MoveSpec { out_dims, elem_bytes, dtype } = spec::concat(xs, axis)?;
    let inner: usize = out_dims[axis + 1..].iter().product::<usize>() * elem_bytes;
    let mut out = Tensor::zeros(out_dims, dtype)?;
    let pieces = xs
        .iter()
        .map(|x| Ok(Piece { src: Some(x.host_bytes()?), bytes: x.dims()[axis] * inner }))
        .collect::<Result<Vec<_>>>()?;
    assemble_rows(cpu, out.host_bytes_mut()?, &pieces);
    Ok(out)
}

/// Broadcasts to `shape` (numpy rules: new leading dims, size-1 dims repeated; materialised).
///
/// # Shapes
/// `x`: broadcastable to `shape` → `shape`.
pub fn expand(cpu: &CpuBackend, x: &Tensor, shape: &Shape) -> Result<Tensor> {
    let ExpandSpec { strides, elem_bytes, .. } = spec::expand(x, shape)?;
    gather_into_new(cpu, x, elem_bytes, shape.dims().to_vec(), &Gather::new(shape.dims(), &strides, 0))
}
