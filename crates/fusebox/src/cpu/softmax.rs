//! Softmax, its backward, and log-softmax along any dim.
//!
//! A tensor is viewed as `[outer, len, inner]` around `dim`. When `inner == 1` (the last
//! dim, the common case) every row is contiguous and one task runs max → exp/sum →
//! scale over it with the SIMD primitives. Otherwise each task takes a tile of up to
//! `COLS` adjacent columns of one outer block and walks its `len` strided rows,
//! keeping per-column max/sum in registers-sized arrays, so memory is read row by row
//! (contiguous) rather than column by column.
//!
//! A row (or column) of all `−∞` has no finite maximum: softmax gives zeros and
//! log-softmax `−∞`, never NaN (`−∞ − (−∞)` is never formed).

use std::mem::MaybeUninit;

use crate::cpu::output::{self, Dst};
use crate::cpu::pool::SharedMut;
use crate::cpu::simd::{self, exp_lane, fold_dot, fold_max, fold_max2, multiversion, Fold};
use crate::cpu::{convert, CpuBackend};
#[cfg(target_arch = "x86_64")]
use crate::cpu::{softmax_x86, stream_x86};
use crate::error::Result;
use crate::spec::softmax as spec;
use crate::tensor::Tensor;

/// Elements per task of the contiguous-row path.
const TASK_ELEMS: usize = 1 << 16;
/// Columns per tile of the strided path (its per-column statistics live on the stack).
const COLS: usize = 64;
/// Work units per element (an exp, a sum, a scale).
const EXP_WORK: usize = 4;
/// Lanes of the row kernels' inner loops (one AVX-512 register, two AVX2 ones).
const LANES: usize = 16;
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
///
/// `row(start, dst, folded, last)` writes the row at flat index `start`; `folded` is what
/// the task's previous row returned (a reduction of this row folded while that one was
/// written, `None` for a task's first row) and `last` says whether this is the task's
/// last row (so there is no next row to fold).
fn dim_output(
    cpu: &CpuBackend,
    op: &'static str,
    x: &Tensor,
    layout: Layout,
    work: usize,
    row: impl Fn(usize, Dst<'_>, Option<f32>, bool) -> f32 + Sync + Send,
    tile: impl Fn(Tile, SharedMut<f32>) + Sync + Send,
) -> Result<Tensor> {
    let len = layout.len;
    if layout.inner == 1 && len > 0 && x.shape().elem_count() > 0 {
        // Tasks of several rows (about 64 Ki elements a task): only a task's first row
        // is reduced on its own, the others while the row before is written.
        let rows_per_task = (TASK_ELEMS / len).max(1);
        let chunk = rows_per_task * len;
        return output::fresh_tensor(cpu, op, x.shape(), x.dtype(), chunk, work, |t, dst| {
            let rows_here = dst.len() / len;
            let mut folded = None;
            for (k, row_dst) in dst.into_chunks(len).enumerate() {
                folded = Some(row(t * chunk + k * len, row_dst, folded, k + 1 == rows_here));
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
    /// `dx = y·(dy − d)` (softmax backward with `d = Σ y·dy`), folding `Σ y'·dy'` of the
    /// next row (`next = [y', dy']`, empty at a task's last row) meanwhile, which it
    /// returns (see `simd::Fold`); `ahead` (y and dy from the next row on) is prefetched
    /// far ahead when `dx` streams (`simd::prefetch_far`).
    pub fn softmax_grad_row(y: &[f32], dy: &[f32], dx: Dst<'_>, d: f32, next: [&[f32]; 2], ahead: [&[f32]; 2]) -> f32 {
        let mut fold = Fold::new(next, 0.0);
        let own = dx.in_place();
        let ahead = ahead.map(|rest| dx.ahead(rest));
        // SAFETY: the chunks and the tail write every slot of the tile.
        unsafe {
            dx.write(#[inline(always)] |start, tile| {
                let n = tile.len();
                let (y, dy) = (&y[start..start + n], &dy[start..start + n]);
                let mut i = 0;
                while i + LANES <= n {
                    if own {
                        simd::prefetch_write(tile.as_ptr().wrapping_add(i + simd::OWN_AHEAD));
                    }
                    simd::prefetch_far(ahead, start + i);
                    let (yc, gc) = (&y[i..i + LANES], &dy[i..i + LANES]);
                    let mut v = [0.0f32; LANES];
                    for l in 0..LANES {
                        v[l] = yc[l] * (gc[l] - d);
                    }
                    tile[i..i + LANES].write_copy_of_slice(&v);
                    fold.fold_behind(start + i, fold_dot);
                    i += LANES;
                }
                for j in i..n {
                    tile[j].write(y[j] * (dy[j] - d));
                }
                fold.step(start + n, fold_dot);
            })
        }
        fold.finish(fold_dot, |a, b| a + b)
    }
}

multiversion! {
    /// `dst = s·src` for a row of equal length, less `minus.1` at index `minus.0` when
    /// given (cross-entropy's one-hot; an index past the row subtracts nothing), folding
    /// `max next` (the next row; empty at a task's last row) meanwhile, which it returns
    /// (see `simd::Fold`).
    pub fn scaled_fold_max(src: &[f32], dst: Dst<'_>, s: f32, minus: (usize, f32), next: &[f32]) -> f32 {
        let mut fold = Fold::new([next], f32::NEG_INFINITY);
        let (at, sub) = minus;
        // SAFETY: the chunks and the tail write every slot of the tile (`at` twice).
        unsafe {
            dst.write(#[inline(always)] |start, tile| {
                let n = tile.len();
                let src = &src[start..start + n];
                let mut i = 0;
                while i + LANES <= n {
                    let sc = &src[i..i + LANES];
                    let mut v = [0.0f32; LANES];
                    for l in 0..LANES {
                        v[l] = sc[l] * s;
                    }
                    tile[i..i + LANES].write_copy_of_slice(&v);
                    fold.fold_behind(start + i, fold_max);
                    i += LANES;
                }
                for j in i..n {
                    tile[j].write(src[j] * s);
                }
                if (start..start + n).contains(&at) {
                    tile[at - start].write(src[at - start] * s - sub);
                }
                fold.step(start + n, fold_max);
            })
        }
        fold.finish(fold_max, fold_max2)
    }
}

multiversion! {
    /// `row ← s·row`, less `minus.1` at index `minus.0` (see [`scaled_fold_max`]), folding
    /// `max next` meanwhile, which it returns: the second pass of a row whose exps were
    /// written into the output itself. `next` is prefetched into L1 [`simd::OWN_AHEAD`]
    /// elements ahead: this loop is too short to keep enough of its loads in flight by
    /// itself; into L1 because a prefetch into L2 left the fold waiting, and not the whole
    /// next row during the exp pass, which cross-entropy's 125 KiB rows cannot afford.
    pub fn scale_in_place_fold_max(row: &mut [f32], s: f32, minus: (usize, f32), next: &[f32]) -> f32 {
        let mut fold = Fold::new([next], f32::NEG_INFINITY);
        let mut chunks = row.chunks_exact_mut(LANES);
        for (k, c) in (&mut chunks).enumerate() {
            simd::prefetch_l1(next, k * LANES + simd::OWN_AHEAD);
            for v in c.iter_mut() {
                *v *= s;
            }
            fold.fold_behind(k * LANES, fold_max);
        }
        for v in chunks.into_remainder() {
            *v *= s;
        }
        let (at, sub) = minus;
        if let Some(v) = row.get_mut(at) {
            *v -= sub;
        }
        fold.step(row.len(), fold_max);
        fold.finish(fold_max, fold_max2)
    }
}

/// `scale·softmax(z)` (less `minus.1` at index `minus.0`) for a row whose max `m` is
/// known, returning `Σ e^(z − m)` and the max of `next` (the next row, folded while this
/// one is scaled).
///
/// When `dst` is written in place, the exps go straight into the output row (its lines
/// prefetched for writing 2 KiB ahead of the stores) and are scaled there: no scratch
/// row, so two fewer lines per 16 elements move between L2 and L1 — the pass is bound by
/// line fills, not arithmetic. With AVX-512 both passes run as the plain intrinsic loops
/// of `softmax_x86` (same bits). Otherwise (streamed or F16/BF16 outputs) the exps
/// go to a scratch row while `dst`'s lines, or the next row when `dst` streams, are
/// prefetched, and the scaled row is written once: for a streamed F32 row on x86-64 by
/// `stream_x86::scale_stream_fold_max`, with its streaming stores issued from registers,
/// else through `Dst::write`.
pub fn scaled_softmax_row(
    z: &[f32],
    m: f32,
    scale: f32,
    minus: (usize, f32),
    dst: Dst<'_>,
    next: &[f32],
) -> (f32, f32) {
    // The in-place path's safety rests on this: the exps fill the whole output row.
    assert_eq!(z.len(), dst.len(), "scaled_softmax_row: the row and its output differ in length");
    if dst.in_place() {
        let mut out = (0.0, f32::NEG_INFINITY);
        // SAFETY: `exp_sub_sum_into` writes every slot of the row (an in-place piece is
        // handed over whole, as one tile), so the row is initialised when it is read back.
        unsafe {
            dst.write(|_, row| {
                #[cfg(target_arch = "x86_64")]
                if softmax_x86::has_kernel() {
                    let s = softmax_x86::exp_sub_sum(z, row, m);
                    let row = &mut *(row as *mut [MaybeUninit<f32>] as *mut [f32]);
                    out = (s, softmax_x86::scale_fold_max(row, scale / s, minus, next));
                    return;
                }
                let ahead = row.as_ptr().cast::<f32>().wrapping_add(simd::OWN_AHEAD);
                let s = simd::exp_sub_sum_into(z, row, m, ahead, &[]);
                let row = &mut *(row as *mut [MaybeUninit<f32>] as *mut [f32]);
                out = (s, scale_in_place_fold_max(row, scale / s, minus, next));
            })
        };
        return out;
    }
    // Not in place, so there are no output lines of its own to prefetch for writing.
    let ahead = dst.ahead(next);
    output::with_scratch(z.len(), |e| {
        let s = simd::exp_sub_sum_into(z, output::as_uninit(e), m, std::ptr::null(), ahead);
        (s, store_scaled_fold_max(e, dst, scale / s, minus, next))
    })
}

/// `dst = s·e` less `minus` (see [`scaled_fold_max`]), returning the max of `next`: a
/// streamed F32 row on x86-64 by `stream_x86`, from registers, any other through
/// [`scaled_fold_max`].
fn store_scaled_fold_max(e: &[f32], dst: Dst<'_>, s: f32, minus: (usize, f32), next: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `scale_stream_fold_max` writes every slot of the row.
    let dst = match unsafe { stream_x86::streamed_row(dst) } {
        Ok(out) => return stream_x86::scale_stream_fold_max(e, out, s, minus, next),
        Err(dst) => dst,
    };
    scaled_fold_max(e, dst, s, minus, next)
}

/// `dst = softmax(src)` for one contiguous row whose max `m` is known (folded while the
/// previous row was written), returning the next row's max (see [`scaled_softmax_row`]).
fn softmax_row(src: &[f32], m: f32, dst: Dst<'_>, next: &[f32]) -> f32 {
    if m == f32::NEG_INFINITY {
        drop(dst); // dropped unwritten: zeros
        return simd::max(next);
    }
    scaled_softmax_row(src, m, 1.0, (usize::MAX, 0.0), dst, next).1
}

/// `dst = log_softmax(src)` for one contiguous row: `(x − m) − ln Σ e^(x − m)`.
fn log_softmax_row(src: &[f32], dst: Dst<'_>) {
    let m = simd::max(src);
    if m == f32::NEG_INFINITY {
        dst.fill(f32::NEG_INFINITY);
        return;
    }
    let s = output::with_scratch(src.len(), |e| {
        simd::exp_sub_sum_into(src, output::as_uninit(e), m, std::ptr::null(), &[])
    });
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
    spec::softmax(x, dim)?;
    let xs = convert::f32_data(OP, "x", x)?;
    let layout = Layout::of(x.dims(), dim);
    dim_output(
        cpu,
        OP,
        x,
        layout,
        EXP_WORK,
        |start, dst, folded_max, last| {
            let n = dst.len();
            let src = &xs[start..start + n];
            let next = if last { &[][..] } else { &xs[start + n..start + 2 * n] };
            softmax_row(src, folded_max.unwrap_or_else(|| simd::max(src)), dst, next)
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
    spec::softmax_backward(y, d_out, dim)?;
    let ys = convert::f32_data(OP, "y", y)?;
    let dys = convert::f32_data(OP, "d_out", d_out)?;
    let layout = Layout::of(y.dims(), dim);
    dim_output(
        cpu,
        OP,
        y,
        layout,
        GRAD_WORK,
        |start, dst, folded_dot, last| {
            let n = dst.len();
            let (yr, dyr) = (&ys[start..start + n], &dys[start..start + n]);
            let next =
                if last { [&[][..]; 2] } else { [&ys[start + n..start + 2 * n], &dys[start + n..start + 2 * n]] };
            let ahead = [&ys[start + n..], &dys[start + n..]];
            softmax_grad_row(yr, dyr, dst, folded_dot.unwrap_or_else(|| simd::dot(yr, dyr)), next, ahead)
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
    spec::log_softmax(x, dim)?;
    let xs = convert::f32_data(OP, "x", x)?;
    let layout = Layout::of(x.dims(), dim);
    dim_output(
        cpu,
        OP,
        x,
        layout,
        EXP_WORK,
        |start, dst, _, _| {
            log_softmax_row(&xs[start..start + dst.len()], dst);
            0.0
        },
        |t, o| tiles::log_softmax_tile(&xs, t, o),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(rows: usize, d: usize, seed: u32, scale: f32) -> Tensor {
        let v: Vec<f32> = (0..(rows * d) as u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / 8_388_608.0 - 1.0) * scale)
            .collect();
        Tensor::from_vec(v, [rows, d]).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.to_vec_f32().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// Rows streamed to memory (by `stream_x86` on x86-64, through `Dst::write` elsewhere)
    /// get the bits of rows written in cache, softmax and cross-entropy alike, whatever
    /// their alignment (row lengths off a multiple of 16) and wherever the target falls.
    #[test]
    fn streamed_rows_give_the_bits_of_cached_ones() {
        let backend = |bytes| CpuBackend::builder().threads(2).stream_min_bytes(bytes).build().unwrap();
        let (cached, streamed) = (backend(usize::MAX), backend(1));
        for d in [100usize, 1000, 4099] {
            let rows = 9;
            let x = tensor(rows, d, 3, 8.0);
            let targets: Vec<u32> = (0..rows as u32).map(|r| (r * 617) % d as u32).collect();
            let targets = Tensor::from_vec(targets, [rows]).unwrap();
            let run = |threshold: usize| {
                let cpu = if threshold == 1 { &streamed } else { &cached };
                let y = softmax(cpu, &x, 1).unwrap();
                let ce = crate::cpu::loss::cross_entropy(cpu, &x, &targets, None).unwrap();
                (bits(&y), bits(&ce.d_logits), bits(&ce.loss))
            };
            assert_eq!(run(usize::MAX), run(1), "d {d}");
        }
    }

    /// A row's max (or Σ y·dy) is folded alone or while the row before it is written:
    /// each row of a batch must match the same row computed on its own, bit for bit.
    #[test]
    fn a_row_gives_the_same_bits_wherever_it_falls_in_a_task() {
        let cpu = CpuBackend::with_threads(2).unwrap();
        for d in [100usize, 1000, 4096] {
            let rows = 37;
            let (x, dy) = (tensor(rows, d, 1, 8.0), tensor(rows, d, 2, 1.0));
            let y = softmax(&cpu, &x, 1).unwrap();
            let dx = softmax_backward(&cpu, &y, &dy, 1).unwrap();
            let (xv, yv, gv) = (x.to_vec_f32().unwrap(), y.to_vec_f32().unwrap(), dy.to_vec_f32().unwrap());
            let row_of = |v: &[f32], r: usize| Tensor::from_vec(v[r * d..(r + 1) * d].to_vec(), [1, d]).unwrap();
            for r in 0..rows {
                let want = |t: &Tensor| bits(t)[r * d..(r + 1) * d].to_vec();
                assert_eq!(bits(&softmax(&cpu, &row_of(&xv, r), 1).unwrap()), want(&y), "softmax d {d} row {r}");
                let g = softmax_backward(&cpu, &row_of(&yv, r), &row_of(&gv, r), 1).unwrap();
                assert_eq!(bits(&g), want(&dx), "softmax_backward d {d} row {r}");
            }
        }
    }
}
