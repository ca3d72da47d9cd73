//! Softmax, its backward, and log-softmax along any dim.
//!
//! A tensor is viewed as `[outer, len, inner]` around `dim`. When `inner == 1` (the last
//! dim, the common case) every row is contiguous and one task runs max → exp/sum →
//! scale over it with the SIMD primitives. Otherwise each task takes a tile of up to
//! [`COLS`] adjacent columns of one outer block and walks its `len` strided rows,
//! keeping per-column max/sum in registers-sized arrays, so memory is read row by row
//! (contiguous) rather than column by column.
//!
//! A row (or column) of all `−∞` has no finite maximum: softmax gives zeros and
//! log-softmax `−∞`, never NaN (`−∞ − (−∞)` is never formed).

use crate::cpu::output::{self, Dst};
use crate::cpu::pool::SharedMut;
use crate::cpu::simd::{self, exp_lane, multiversion};
use crate::cpu::{check, convert, CpuBackend};
use crate::error::Result;
use crate::tensor::Tensor;

/// Columns per tile of the strided path (its per-column statistics live on the stack).
const COLS: usize = 64;
/// Work units per element (an exp, a sum, a scale).
const EXP_WORK: usize = 4;
/// Work units per element of the backward (a dot and an axpy).
const GRAD_WORK: usize = 2;

/// `[outer, len, inner]` around the softmax dim.
#[derive(Debug, Clone, Copy)]
struct Layout {
    outer: usize,
    len: usize,
    inner: usize,
}

impl Layout {
    fn of(dims: &[usize], dim: usize) -> Layout {
        Layout { outer: dims[..dim].iter().product(), len: dims[dim], inner: dims[dim + 1..].iter().product() }
    }
}

/// A tile of the strided path: `width` columns starting at flat index `base`, rows
/// `base + j·stride` for `j < len`.
#[derive(Debug, Clone, Copy)]
struct Tile {
    base: usize,
    len: usize,
    stride: usize,
    width: usize,
}

/// Runs `tile(tile, out)` over the disjoint column tiles of a strided layout
/// (`inner > 1`), in parallel when the work is large.
fn along_dim(
    cpu: &CpuBackend,
    layout: Layout,
    out: &mut [f32],
    work: usize,
    tile: impl Fn(Tile, SharedMut<f32>) + Sync + Send,
) {
    if layout.len == 0 || out.is_empty() {
        return;
    }
    let blocks = layout.inner.div_ceil(COLS);
    let out_ptr = SharedMut(out.as_mut_ptr());
    cpu.for_each_index(layout.outer * blocks, layout.len * COLS.min(layout.inner) * work, |t| {
        let (o, b) = (t / blocks, t % blocks);
        let c0 = b * COLS;
        let t = Tile {
            base: o * layout.len * layout.inner + c0,
            len: layout.len,
            stride: layout.inner,
            width: COLS.min(layout.inner - c0),
        };
        tile(t, out_ptr);
    });
}

/// The output of an op along `dim`: contiguous rows (`inner == 1`) are written row by row
/// into a fresh tensor through [`Dst`] (no zeroing pass, streaming stores beyond the
/// caches, F16/BF16 rounded on store); strided tiles go through [`along_dim`].
fn dim_output(
    cpu: &CpuBackend,
    op: &'static str,
    x: &Tensor,
    layout: Layout,
    work: usize,
    row: impl Fn(usize, Dst<'_>) + Sync + Send,
    tile: impl Fn(Tile, SharedMut<f32>) + Sync + Send,
) -> Result<Tensor> {
    let len = layout.len;
    if layout.inner == 1 && len > 0 && x.shape().elem_count() > 0 {
        // Tasks of several rows when rows are short (about 16 Ki elements a task).
        let rows_per_task = ((1 << 14) / len).max(1);
        let chunk = rows_per_task * len;
        return output::fresh_tensor(cpu, op, x.shape(), x.dtype(), chunk, work, |t, dst| {
            for (k, row_dst) in dst.into_chunks(len).enumerate() {
                row(t * chunk + k * len, row_dst);
            }
        });
    }
    convert::f32_output(cpu, x.shape(), x.dtype(), |out| along_dim(cpu, layout, out, work, tile))
}

/// Row `j` of a tile in a read-only buffer.
#[inline(always)]
fn tile_row(src: &[f32], t: Tile, j: usize) -> &[f32] {
    let start = t.base + j * t.stride;
    &src[start..start + t.width]
}

/// Row `j` of a tile in the output.
///
/// # Safety
/// Only one task may hold a tile's rows, and `t` must lie inside the buffer.
#[allow(clippy::mut_from_ref)]
#[inline(always)]
unsafe fn tile_row_mut(out: &SharedMut<f32>, t: Tile, j: usize) -> &mut [f32] {
    // SAFETY: guaranteed by the caller.
    unsafe { out.slice(t.base + j * t.stride, t.width) }
}

multiversion! {
    /// `dst = (src − a) − b` (log-softmax: subtract the max, then ln Σ).
    pub fn shift2(src: &[f32], dst: Dst<'_>, a: f32, b: f32) {
        // SAFETY: `src` has the row's length, so the loop writes every slot.
        unsafe {
            dst.write(#[inline(always)] |start, tile| {
                let n = tile.len();
                for (d, &s) in tile.iter_mut().zip(&src[start..start + n]) {
                    d.write((s - a) - b);
                }
            })
        }
    }
}

multiversion! {
    /// `dx = y·(dy − d)` (softmax backward with `d = Σ y·dy`), prefetching the next rows
    /// of y and dy (`next_y`, `next_dy`).
    pub fn softmax_grad_row(y: &[f32], dy: &[f32], dx: Dst<'_>, d: f32, next_y: &[f32], next_dy: &[f32]) {
        let (next_y, next_dy) = (dx.ahead(next_y), dx.ahead(next_dy));
        // SAFETY: `y` and `dy` have the row's length, so the loop writes every slot.
        unsafe {
            dx.write(#[inline(always)] |start, tile| {
                let n = tile.len();
                simd::prefetch(next_y, start, n);
                simd::prefetch(next_dy, start, n);
                for ((o, &y), &g) in tile.iter_mut().zip(&y[start..start + n]).zip(&dy[start..start + n]) {
                    o.write(y * (g - d));
                }
            })
        }
    }
}

multiversion! {
    /// `dst = s·src` for a row of equal length.
    pub fn scaled(src: &[f32], dst: Dst<'_>, s: f32) {
        // SAFETY: `src` has the row's length, so the loop writes every slot.
        unsafe {
            dst.write(#[inline(always)] |start, tile| {
                let n = tile.len();
                for (d, &x) in tile.iter_mut().zip(&src[start..start + n]) {
                    d.write(x * s);
                }
            })
        }
    }
}

/// `dst = softmax(src)` for one contiguous row: the max, then `e^(x − max)` into a
/// scratch row with its sum (prefetching `next`, the next row, meanwhile when `dst`
/// streams, so its reads overlap this row's compute), then the scaled row written once.
fn softmax_row(src: &[f32], dst: Dst<'_>, next: &[f32]) {
    let m = simd::max(src);
    if m == f32::NEG_INFINITY {
        return; // dropped unwritten: zeros
    }
    let next = dst.ahead(next);
    output::with_scratch(src.len(), |e| {
        let s = simd::exp_sub_sum_into(src, e, m, next);
        scaled(e, dst, 1.0 / s);
    })
}

/// `dst = log_softmax(src)` for one contiguous row: `(x − m) − ln Σ e^(x − m)`.
fn log_softmax_row(src: &[f32], dst: Dst<'_>) {
    let m = simd::max(src);
    if m == f32::NEG_INFINITY {
        dst.fill(f32::NEG_INFINITY);
        return;
    }
    let s = output::with_scratch(src.len(), |e| simd::exp_sub_sum_into(src, e, m, &[]));
    shift2(src, dst, m, s.ln());
}

/// Per-column statistics of a tile (only the first `width` entries are used).
struct ColumnStats {
    /// Column max, or 0 for a dead column (all `−∞`), so `x − max` stays `−∞`, never NaN.
    max: [f32; COLS],
    /// Whether the column is all `−∞`.
    dead: [bool; COLS],
    /// `Σ_j e^(x_j − max)` (exactly 0 for a dead column).
    sum: [f32; COLS],
}

/// Per-column max over a tile's rows, then `out = e^(x − max)` with per-column sums.
///
/// # Safety
/// As [`tile_row_mut`].
#[inline(always)]
unsafe fn tile_exp<const FMA: bool>(src: &[f32], t: Tile, out: &SharedMut<f32>) -> ColumnStats {
    let mut st = ColumnStats { max: [f32::NEG_INFINITY; COLS], dead: [false; COLS], sum: [0.0; COLS] };
    for j in 0..t.len {
        for (m, &x) in st.max.iter_mut().zip(tile_row(src, t, j)) {
            *m = if x > *m { x } else { *m };
        }
    }
    for (m, dead) in st.max.iter_mut().zip(st.dead.iter_mut()) {
        *dead = *m == f32::NEG_INFINITY;
        *m = if *dead { 0.0 } else { *m };
    }
    for j in 0..t.len {
        // SAFETY: forwarded from the caller.
        let dst = unsafe { tile_row_mut(out, t, j) };
        for (((d, &x), &m), s) in dst.iter_mut().zip(tile_row(src, t, j)).zip(&st.max).zip(st.sum.iter_mut()) {
            *d = exp_lane::<FMA>(x - m);
            *s += *d;
        }
    }
    st
}

/// The strided tiles, compiled per ISA: `pub` only because `multiversion!` defines `pub fn`s.
mod tiles {
    use super::*;

    multiversion! {
        /// Softmax of one strided tile.
        pub fn softmax_tile(src: &[f32], t: Tile, out: SharedMut<f32>) {
            // SAFETY: `along_dim` gives each tile to exactly one task and tiles lie inside `out`.
            let st = unsafe { tile_exp::<FMA>(src, t, &out) };
            // A dead column summed exactly 0 (every e^−∞ is 0): its scale is 0, not 1/0.
            let inv: [f32; COLS] = std::array::from_fn(|c| if st.sum[c] > 0.0 { 1.0 / st.sum[c] } else { 0.0 });
            for j in 0..t.len {
                // SAFETY: as above.
                let dst = unsafe { tile_row_mut(&out, t, j) };
                for (d, &k) in dst.iter_mut().zip(&inv) {
                    *d *= k;
                }
            }
        }
    }

    multiversion! {
        /// Log-softmax of one strided tile: `(x − max) − ln Σ`, `−∞` for a dead column.
        pub fn log_softmax_tile(src: &[f32], t: Tile, out: SharedMut<f32>) {
            // SAFETY: `along_dim` gives each tile to exactly one task and tiles lie inside `out`.
            let st = unsafe { tile_exp::<FMA>(src, t, &out) };
            // Dead columns: shift by +∞ so that (x − 0) − ∞ = −∞ (x is −∞ or finite there).
            let shift: [f32; COLS] = std::array::from_fn(|c| if st.dead[c] { f32::INFINITY } else { st.sum[c].ln() });
            for j in 0..t.len {
                // SAFETY: as above.
                let dst = unsafe { tile_row_mut(&out, t, j) };
                for (((d, &x), &m), &k) in dst.iter_mut().zip(tile_row(src, t, j)).zip(&st.max).zip(&shift) {
                    *d = (x - m) - k;
                }
            }
        }
    }

    multiversion! {
        /// Softmax backward of one strided tile: `dx = y·(dy − Σ_j y·dy)` per column.
        pub fn softmax_grad_tile(y: &[f32], dy: &[f32], t: Tile, out: SharedMut<f32>) {
            let mut dot = [0.0f32; COLS];
            for j in 0..t.len {
                for ((d, &yv), &g) in dot.iter_mut().zip(tile_row(y, t, j)).zip(tile_row(dy, t, j)) {
                    *d += yv * g;
                }
            }
            for j in 0..t.len {
                // SAFETY: `along_dim` gives each tile to exactly one task and tiles lie inside `out`.
                let dst = unsafe { tile_row_mut(&out, t, j) };
                for (((o, &yv), &g), &d) in dst.iter_mut().zip(tile_row(y, t, j)).zip(tile_row(dy, t, j)).zip(&dot) {
                    *o = yv * (g - d);
                }
            }
        }
    }
}

/// `y = exp(x − max)/Σ exp(x − max)` along `dim`; a row of all `−∞` gives zeros.
///
/// # Shapes
/// any, `dim < rank` → same.
pub fn softmax(cpu: &CpuBackend, x: &Tensor, dim: usize) -> Result<Tensor> {
    const OP: &str = "softmax";
    check::float(OP, "x", x)?;
    check::axis(OP, dim, x.rank())?;
    let xs = convert::f32_data(OP, "x", x)?;
    let layout = Layout::of(x.dims(), dim);
    dim_output(
        cpu,
        OP,
        x,
        layout,
        EXP_WORK,
        |start, dst| {
            let n = dst.len();
            softmax_row(&xs[start..start + n], dst, xs.get(start + n..start + 2 * n).unwrap_or(&[]))
        },
        |t, o| tiles::softmax_tile(&xs, t, o),
    )
}

/// `dx = y·(dy − Σ(dy·y))` along `dim`, from the forward's output `y`.
///
/// # Shapes
/// `y`, `d_out`: equal, `dim < rank` → same.
pub fn softmax_backward(cpu: &CpuBackend, y: &Tensor, d_out: &Tensor, dim: usize) -> Result<Tensor> {
    const OP: &str = "softmax_backward";
    check::float(OP, "y", y)?;
    check::same_dtype(OP, "d_out", y, d_out)?;
    check::same_shape(OP, "d_out", y, d_out)?;
    check::axis(OP, dim, y.rank())?;
    let ys = convert::f32_data(OP, "y", y)?;
    let dys = convert::f32_data(OP, "d_out", d_out)?;
    let layout = Layout::of(y.dims(), dim);
    dim_output(
        cpu,
        OP,
        y,
        layout,
        GRAD_WORK,
        |start, dst| {
            let n = dst.len();
            let (yr, dyr) = (&ys[start..start + n], &dys[start..start + n]);
            let next = start + n..start + 2 * n;
            let (next_y, next_dy) = (ys.get(next.clone()).unwrap_or(&[]), dys.get(next).unwrap_or(&[]));
            softmax_grad_row(yr, dyr, dst, simd::dot(yr, dyr), next_y, next_dy);
        },
        |t, o| tiles::softmax_grad_tile(&ys, &dys, t, o),
    )
}

/// `x − max − ln Σ exp(x − max)` along `dim`; a row of all `−∞` gives `−∞`, never NaN.
///
/// # Shapes
/// any, `dim < rank` → same.
pub fn log_softmax(cpu: &CpuBackend, x: &Tensor, dim: usize) -> Result<Tensor> {
    const OP: &str = "log_softmax";
    check::float(OP, "x", x)?;
    check::axis(OP, dim, x.rank())?;
    let xs = convert::f32_data(OP, "x", x)?;
    let layout = Layout::of(x.dims(), dim);
    dim_output(
        cpu,
        OP,
        x,
        layout,
        EXP_WORK,
        |start, dst| log_softmax_row(&xs[start..start + dst.len()], dst),
        |t, o| tiles::log_softmax_tile(&xs, t, o),
    )
}
