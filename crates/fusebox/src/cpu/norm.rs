//! Normalization kernels: RMS norm and layer norm with their backwards, the fused
//! residual-add RMS norm, gated / channel / group norms, AdaLN modulation and plain
//! normalization.
//!
//! Every kernel computes in f32 (F16/BF16 inputs are converted once, outputs are
//! written back in the input dtype) and works one row at a time: a reduction over the
//! row (`Σx²`, or sum then squared deviations), then one sweep that writes the row while
//! it is still in cache. RMS norm, its backward and the residual-add RMS norm fold the
//! *next* row's reduction into the sweep that writes the current one (`simd::Fold`), so
//! the next row's loads overlap this row's stores instead of running as a pass of their
//! own; only a task's first row is reduced alone, by the same fold, so each row's result
//! does not depend on the blocking. Blocks of rows run in parallel and outputs are
//! bit-identical for any thread count. Backwards reduce dweight/dbias into one partial
//! per fixed block of rows and add the partials in block order (deterministic too).
//! Saved statistics (mean, rstd) are F32 with the input's shape minus its last dim.

use std::ops::Range;

use crate::cpu::convert::F32Output;

use crate::cpu::convert::{f32_data, from_f32};
use crate::cpu::output::{self, Dst, OutputSpec};
use crate::cpu::pool::SharedMut;
use crate::cpu::simd;
use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::Shape;
use crate::spec::norm::{self as spec, AdalnSpec, ChannelSpec, RowsSpec};
use crate::tensor::Tensor;
use crate::types::*;

/// Elements of work per parallel task in the row-wise forward kernels (16 rows of 4096:
/// a task's first row is reduced alone, the others while the previous row is written).
const TASK_ELEMS: usize = 1 << 16;
/// A backward splits its rows into at most this many fixed blocks, one partial
/// dweight (and dbias) each.
const MAX_PARTIALS: usize = 64;
/// Fewest elements per backward block: each block's partial dweight costs a `[d]`
/// buffer, a first row reduced on its own and one serial add at the end, so small
/// blocks pay for them (16 blocks of 64 rows of 4096 beat 64 blocks of 16 rows).
const MIN_BACKWARD_BLOCK_ELEMS: usize = 1 << 18;
/// Group norm statistics are computed over pieces of this many elements, in parallel.
const STAT_PIECE: usize = 1 << 14;
/// Time steps per task of `rms_norm_channel` (the per-step accumulators stay in registers/L1).
const CHANNEL_TILE: usize = 128;

/// `1/sqrt(Σx²/D + eps)`.
#[inline]
fn rms_rstd(sum_squares: f32, d: usize, eps: f32) -> f32 {
    1.0 / (sum_squares / d as f32 + eps).sqrt()
}

// ───────────────────────────── parallel row blocks ────────────────────────────

/// Splits each buffer into `blocks` consecutive pieces of its given length (the last
/// may be shorter, missing ones empty): block i gets piece i of every buffer.
fn split_blocks<const K: usize>(bufs: [(&mut [f32], usize); K], blocks: usize) -> Vec<[&mut [f32]; K]> {
    let mut iters = bufs.map(|(buf, len)| buf.chunks_mut(len.max(1)));
    (0..blocks).map(|_| iters.each_mut().map(|it| it.next().unwrap_or_default())).collect()
}

/// Calls `f(rows, pieces)` for consecutive blocks of `per_block` rows out of `rows`,
/// with `pieces[k]` the block's piece of buffer k (buffer k holds `bufs[k].1` elements
/// per block). Parallel when `rows · work_per_row` is large.
pub(crate) fn for_each_block<const K: usize>(
    cpu: &CpuBackend,
    rows: usize,
    per_block: usize,
    work_per_row: usize,
    bufs: [(&mut [f32], usize); K],
    f: impl Fn(Range<usize>, [&mut [f32]; K]) + Sync + Send,
) {
    let per_block = per_block.max(1);
    let mut blocks = split_blocks(bufs, rows.div_ceil(per_block));
    cpu.for_each_chunk(&mut blocks, 1, per_block.saturating_mul(work_per_row), |i, block| {
        let first = i * per_block;
        for pieces in block.iter_mut() {
            f(first..(first + per_block).min(rows), pieces.each_mut().map(|p| &mut **p));
        }
    });
}

/// The spec of a row-wise output shaped like `like` (in its dtype), `per` rows of `d` per task.
fn row_spec(like: &Tensor, per: usize, d: usize) -> OutputSpec {
    OutputSpec { shape: like.shape().clone(), dtype: like.dtype(), per_task: per * d }
}

/// The spec of a per-row F32 statistic of `x` (shape `stat_dims(x)`), `per` rows per task.
fn stat_spec(x: &Tensor, per: usize) -> OutputSpec {
    OutputSpec { shape: Shape::new(spec::stat_dims(x)), dtype: DType::F32, per_task: per }
}

/// The spec of `tasks` partial sums of a `[d]` parameter gradient, one row per task.
fn partial_spec(tasks: usize, d: usize) -> OutputSpec {
    OutputSpec { shape: Shape::new([tasks, d]), dtype: DType::F32, per_task: d }
}

/// Row `r + 1` of `xs` (rows of `d`), empty past the end: what a row kernel prefetches.
fn next_row(xs: &[f32], r: usize, d: usize) -> &[f32] {
    xs.get((r + 1) * d..(r + 2) * d).unwrap_or(&[])
}

/// `xs` from row `r + 1` (rows of `d`) to its end, empty past it: what a row kernel
/// prefetches far ahead (`simd::prefetch_far`).
fn rows_after(xs: &[f32], r: usize, d: usize) -> &[f32] {
    xs.get((r + 1) * d..).unwrap_or(&[])
}

/// Runs `f` on a zeroed f32 buffer of `dst`'s length (statistics a task collects row by
/// row, or partial sums it accumulates), then writes the buffer into `dst`.
fn fill_small<R>(dst: Dst<'_>, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut values = vec![0.0f32; dst.len()];
    let r = f(&mut values);
    dst.copy_from(&values);
    r
}

/// Rows per task of a row-wise forward over rows of `d` elements.
pub(crate) fn forward_block_rows(d: usize) -> usize {
    (TASK_ELEMS / d.max(1)).max(1)
}

/// Rows per block of a backward over rows of `d`: blocks of at least
/// `MIN_BACKWARD_BLOCK_ELEMS` elements, and at most `MAX_PARTIALS` blocks. The split
/// depends only on the shape, so the partial sums (and their order) never depend on
/// threads.
pub(crate) fn backward_block_rows(rows: usize, d: usize) -> usize {
    rows.div_ceil(MAX_PARTIALS).max(MIN_BACKWARD_BLOCK_ELEMS / d.max(1)).max(1)
}

/// `Σ_blocks partial[block]` in block order.
pub(crate) fn sum_partials(partials: &[f32], d: usize) -> Vec<f32> {
    let mut total = vec![0.0f32; d];
    for p in partials.chunks_exact(d) {
        simd::axpy(&mut total, 1.0, p);
    }
    total
}

// ─────────────────────────────── inner loops ──────────────────────────────────

/// The vectorized per-row loops, compiled per ISA. Slices are re-sliced to the length
/// of the output first so the compiler drops the bounds checks.
mod lanes {
    use crate::cpu::output::Dst;
    use crate::cpu::simd::{
        fast_exp, fold_sq, multiversion, prefetch, prefetch_far, prefetch_write, Fold, FOLD_LAG, OWN_AHEAD,
    };

    const LANES: usize = 16;

    // Each reduction keeps one array of 16 partial sums: a loop updating two arrays
    // gets paired into 2-wide vectors by the compiler instead of 16-wide ones, so two
    // quantities of one row are summed in two passes (the row is in L1).

    multiversion! {
        /// `Σ (x[i] − m)` (16 partial sums, fixed order).
        pub fn sum_dev(x: &[f32], m: f32) -> f32 {
            let mut acc = [0.0f32; LANES];
            let mut c = x.chunks_exact(LANES);
            for v in &mut c {
                for l in 0..LANES {
                    acc[l] += v[l] - m;
                }
            }
            acc.iter().sum::<f32>() + c.remainder().iter().map(|&v| v - m).sum::<f32>()
        }
    }

    multiversion! {
        /// `Σ (x[i] − m)²` (16 partial sums, fixed order).
        pub fn sum_sq_dev(x: &[f32], m: f32) -> f32 {
            let mut acc = [0.0f32; LANES];
            let mut c = x.chunks_exact(LANES);
            for v in &mut c {
                for l in 0..LANES {
                    acc[l] += (v[l] - m) * (v[l] - m);
                }
            }
            acc.iter().sum::<f32>() + c.remainder().iter().map(|&v| (v - m) * (v - m)).sum::<f32>()
        }
    }

    /// `s = a + b` for one row, chunk by chunk, with `Σ s²` folded (16 lanes in order, the
    /// remainder apart, as `simd::Fold`): `add_sum_squares` runs it over a whole row,
    /// `sum_and_scale` a few chunks at a time while it writes the previous row, so both
    /// give the same value.
    pub struct AddFold<'a> {
        a: &'a [f32],
        b: &'a [f32],
        s: &'a mut [f32],
        full: usize,
        acc: [f32; LANES],
        done: usize,
    }

    impl<'a> AddFold<'a> {
        /// Over rows `a`, `b` (one length, or empty: nothing to do) into `s` (as long).
        #[inline(always)]
        pub fn new(a: &'a [f32], b: &'a [f32], s: &'a mut [f32]) -> AddFold<'a> {
            let full = a.len().min(b.len()).min(s.len()) / LANES * LANES;
            AddFold { a, b, s, full, acc: [0.0; LANES], done: 0 }
        }

        /// Adds and folds the whole chunks that start below `end - FOLD_LAG` (behind a
        /// kernel's writes at `end`, see `Fold::fold_behind`).
        #[inline(always)]
        pub fn step_behind(&mut self, end: usize) {
            self.step(end.saturating_sub(FOLD_LAG));
        }

        /// Adds and folds the whole chunks below `end`.
        #[inline(always)]
        pub fn step(&mut self, end: usize) {
            let end = end.min(self.full);
            while self.done + LANES <= end {
                let c = self.done..self.done + LANES;
                let (ac, bc) = (&self.a[c.clone()], &self.b[c.clone()]);
                let mut v = [0.0f32; LANES];
                for l in 0..LANES {
                    v[l] = ac[l] + bc[l];
                    self.acc[l] += v[l] * v[l];
                }
                self.s[c].copy_from_slice(&v);
                self.done += LANES;
            }
        }

        /// Finishes the row; returns `Σ s²`.
        #[inline(always)]
        pub fn finish(mut self) -> f32 {
            self.step(self.full);
            let len = self.a.len().min(self.b.len()).min(self.s.len());
            let mut tail = 0.0;
            for i in self.full..len {
                self.s[i] = self.a[i] + self.b[i];
                tail += self.s[i] * self.s[i];
            }
            self.acc.iter().sum::<f32>() + tail
        }
    }

    multiversion! {
        /// `s = a + b`, returning `Σ s²` (see `AddFold`).
        pub fn add_sum_squares(s: &mut [f32], a: &[f32], b: &[f32]) -> f32 {
            AddFold::new(a, b, s).finish()
        }
    }

    multiversion! {
        /// `out = x·r·w` (RMS norm), written once, while folding `Σ next²` (the next row,
        /// empty at a task's last row), which it returns: the next row's loads overlap
        /// this row's stores (see `simd::Fold`). `ahead` (x from the next row on) is
        /// prefetched far ahead when `out` streams (`simd::prefetch_far`).
        pub fn scale_mul(out: Dst<'_>, x: &[f32], w: &[f32], r: f32, next: &[f32], ahead: &[f32]) -> f32 {
            let mut fold = Fold::new([next], 0.0);
            let own = out.in_place();
            let ahead = out.ahead(ahead);
            // SAFETY: the chunks and the tail write every slot of the tile.
            unsafe {
                out.write(#[inline(always)] |start, tile| {
                    let n = tile.len();
                    let (x, w) = (&x[start..start + n], &w[start..start + n]);
                    let mut i = 0;
                    while i + LANES <= n {
                        if own {
                            prefetch_write(tile.as_ptr().wrapping_add(i + OWN_AHEAD));
                        }
                        prefetch_far([ahead], start + i);
                        // Every load before any store, so the lanes vectorize without
                        // proving that `tile` and the inputs do not overlap.
                        let (xc, wc) = (&x[i..i + LANES], &w[i..i + LANES]);
                        let mut v = [0.0f32; LANES];
                        for l in 0..LANES {
                            v[l] = xc[l] * r * wc[l];
                        }
                        tile[i..i + LANES].write_copy_of_slice(&v);
                        fold.fold_behind(start + i, fold_sq);
                        i += LANES;
                    }
                    for j in i..n {
                        tile[j].write(x[j] * r * w[j]);
                    }
                    fold.step(start + n, fold_sq);
                })
            }
            fold.finish(fold_sq, |a, b| a + b)
        }
    }

    multiversion! {
        /// `out = (x − m)·r·w + b` (layer norm; `(x − m)·r` without affine), written once;
        /// prefetches `next` (the next row) when `out` streams.
        pub fn affine_norm(out: Dst<'_>, x: &[f32], affine: Option<(&[f32], &[f32])>, m: f32, r: f32, next: &[f32]) {
            let next = out.ahead(next);
            // SAFETY: either loop writes every slot of the tile.
            unsafe {
                out.write(#[inline(always)] |start, tile| {
                    let n = tile.len();
                    prefetch(next, start, n);
                    let x = &x[start..start + n];
                    match affine {
                        Some((w, b)) => {
                            let (w, b) = (&w[start..start + n], &b[start..start + n]);
                            for i in 0..n {
                                tile[i].write((x[i] - m) * r * w[i] + b[i]);
                            }
                        }
                        None => {
                            for i in 0..n {
                                tile[i].write((x[i] - m) * r);
                            }
                        }
                    }
                })
            }
        }
    }

    multiversion! {
        /// `sum = s` and `out = s·r·w` (the residual add RMS norm), both written once,
        /// while `s' = a' + b'` of the next row (`next = [a', b']`, empty at a task's last
        /// row) is computed into `s_next` with `Σ s'²` folded, which it returns (see
        /// `AddFold`); the outputs' lines are prefetched for writing ahead, and `ahead` (a
        /// and b from the next row on) far ahead when `out` streams (see `scale_mul`).
        pub fn sum_and_scale(
            sum: Dst<'_>,
            out: Dst<'_>,
            s: &[f32],
            w: &[f32],
            r: f32,
            next: [&[f32]; 2],
            ahead: [&[f32]; 2],
            s_next: &mut [f32]
        ) -> f32 {
            let mut fold = AddFold::new(next[0], next[1], s_next);
            let (own_sum, own_out) = (sum.own_lines(), out.own_lines());
            let ahead = ahead.map(|rest| out.ahead(rest));
            // SAFETY: the chunks and the tail write every slot of both tiles.
            unsafe {
                sum.write_pair(out, #[inline(always)] |start, ts, to| {
                    let n = ts.len();
                    let (s, w, to) = (&s[start..start + n], &w[start..start + n], &mut to[..n]);
                    let mut i = 0;
                    while i + LANES <= n {
                        if !own_sum.is_null() {
                            prefetch_write(own_sum.wrapping_add(start + i + OWN_AHEAD));
                            prefetch_write(own_out.wrapping_add(start + i + OWN_AHEAD));
                        }
                        prefetch_far(ahead, start + i);
                        let (sc, wc) = (&s[i..i + LANES], &w[i..i + LANES]);
                        let mut v = [0.0f32; LANES];
                        for l in 0..LANES {
                            v[l] = sc[l] * r * wc[l];
                        }
                        ts[i..i + LANES].write_copy_of_slice(sc);
                        to[i..i + LANES].write_copy_of_slice(&v);
                        fold.step_behind(start + i);
                        i += LANES;
                    }
                    for j in i..n {
                        ts[j].write(s[j]);
                        to[j].write(s[j] * r * w[j]);
                    }
                    fold.step_behind(start + n);
                })
            }
            fold.finish()
        }
    }

    multiversion! {
        /// `out = (x − m)·alpha + beta` (normalize, group norm per channel).
        pub fn center_affine(out: &mut [f32], x: &[f32], m: f32, alpha: f32, beta: f32) {
            let n = out.len();
            let x = &x[..n];
            for i in 0..n {
                out[i] = (x[i] - m) * alpha + beta;
            }
        }
    }

    multiversion! {
        /// `out = x·r·w·silu(z)` with `silu(z) = z/(1 + e^−z)`.
        pub fn gated(out: &mut [f32], x: &[f32], w: &[f32], z: &[f32], r: f32) {
            let n = out.len();
            let (x, w, z) = (&x[..n], &w[..n], &z[..n]);
            for i in 0..n {
                // e^−z overflows to +∞ for z < −88.7: z/∞ = −0, the right limit.
                let silu = z[i] / (1.0 + fast_exp::<FMA>(-z[i]));
                out[i] = x[i] * r * w[i] * silu;
            }
        }
    }

    multiversion! {
        /// `out = x·r` (L2 norm).
        pub fn scaled(out: &mut [f32], x: &[f32], r: f32) {
            let n = out.len();
            let x = &x[..n];
            for i in 0..n {
                out[i] = x[i] * r;
            }
        }
    }

    multiversion! {
        /// `out = p·a − q·b` (L2 norm backward: `dx = r·dy − r³·Σ(dy·x)·x`).
        pub fn scaled_difference(out: &mut [f32], a: &[f32], p: f32, b: &[f32], q: f32) {
            let n = out.len();
            let (a, b) = (&a[..n], &b[..n]);
            for i in 0..n {
                out[i] = p * a[i] - q * b[i];
            }
        }
    }

    multiversion! {
        /// Gated norm backward, first sweep of a row: with `s = σ(z)`,
        /// `u = dy·silu(z)` (the gradient reaching the RMS norm) into `u`,
        /// `dz = dy·x·r·w·s·(1 + z·(1 − s))` written; returns `Σ u·w·x` (16 partial sums).
        pub fn gated_grad_sweep(dz: &mut [f32], u: &mut [f32], x: &[f32], z: &[f32], w: &[f32], dy: &[f32], r: f32) -> f32 {
            let n = dz.len();
            let (u, x, z, w, dy) = (&mut u[..n], &x[..n], &z[..n], &w[..n], &dy[..n]);
            // e^−z overflows to +∞ for z < −88.7: s = 0, silu = −0 and silu' = 0.
            let sigmoid = |v: f32| 1.0 / (1.0 + fast_exp::<FMA>(-v));
            let mut acc = [0.0f32; LANES];
            let mut i = 0;
            while i + LANES <= n {
                // Every load before any store (see `scale_mul`).
                let c = i..i + LANES;
                let (xc, zc, wc, gc) = (&x[c.clone()], &z[c.clone()], &w[c.clone()], &dy[c.clone()]);
                let (mut uv, mut dzv) = ([0.0f32; LANES], [0.0f32; LANES]);
                for l in 0..LANES {
                    let s = sigmoid(zc[l]);
                    uv[l] = gc[l] * zc[l] * s;
                    dzv[l] = gc[l] * xc[l] * r * wc[l] * (s * (1.0 + zc[l] * (1.0 - s)));
                    acc[l] += uv[l] * wc[l] * xc[l];
                }
                u[c.clone()].copy_from_slice(&uv);
                dz[c].copy_from_slice(&dzv);
                i += LANES;
            }
            let mut tail = 0.0;
            for j in i..n {
                let s = sigmoid(z[j]);
                u[j] = dy[j] * z[j] * s;
                dz[j] = dy[j] * x[j] * r * w[j] * (s * (1.0 + z[j] * (1.0 - s)));
                tail += u[j] * w[j] * x[j];
            }
            acc.iter().sum::<f32>() + tail
        }
    }

    multiversion! {
        /// Gated norm backward, second sweep: the RMS norm backward of `u`:
        /// `dx = r·w·u − k·x`, `dw += u·x·r`.
        pub fn gated_grad_finish(dx: &mut [f32], dw: &mut [f32], u: &[f32], x: &[f32], w: &[f32], r: f32, k: f32) {
            let n = dx.len();
            let (dw, u, x, w) = (&mut dw[..n], &u[..n], &x[..n], &w[..n]);
            for i in 0..n {
                dx[i] = r * w[i] * u[i] - k * x[i];
                dw[i] += u[i] * x[i] * r;
            }
        }
    }

    multiversion! {
        /// `out = x·r·ew + shift` (AdaLN with `ew = w·(1 + scale)` precomputed).
        pub fn modulate(out: &mut [f32], x: &[f32], ew: &[f32], shift: &[f32], r: f32) {
            let n = out.len();
            let (x, ew, shift) = (&x[..n], &ew[..n], &shift[..n]);
            for i in 0..n {
                out[i] = x[i] * r * ew[i] + shift[i];
            }
        }
    }

    multiversion! {
        /// `acc += x²` elementwise (channel norm: sums of squares per time step).
        pub fn add_squares(acc: &mut [f32], x: &[f32]) {
            let n = acc.len();
            let x = &x[..n];
            for i in 0..n {
                acc[i] += x[i] * x[i];
            }
        }
    }

    multiversion! {
        /// `out = x·r·wc` with `r` per element (channel norm: rstd per time step).
        pub fn scale_cols(out: &mut [f32], x: &[f32], r: &[f32], wc: f32) {
            let n = out.len();
            let (x, r) = (&x[..n], &r[..n]);
            for i in 0..n {
                out[i] = x[i] * r[i] * wc;
            }
        }
    }

    multiversion! {
        /// RMS norm backward of one row: `dx = r·w·dy − k·x` (written once), `dw += dy·x·r`,
        /// while folding `Σ dy'·w·x'` of the next row (`next = [x', dy']`, empty at a
        /// task's last row, so nothing is folded), which it returns; `ahead` (x and dy from
        /// the next row on) is prefetched far ahead when `dx` streams (see `scale_mul`).
        pub fn rms_backward_row(
            dx: Dst<'_>,
            dw: &mut [f32],
            x: &[f32],
            dy: &[f32],
            w: &[f32],
            r: f32,
            k: f32,
            next: [&[f32]; 2],
            ahead: [&[f32]; 2]
        ) -> f32 {
            let [next_x, next_dy] = next;
            let mut fold = Fold::new([next_dy, w, next_x], 0.0);
            let own = dx.in_place();
            let ahead = ahead.map(|rest| dx.ahead(rest));
            // SAFETY: the chunks and the tail write every slot of the tile.
            unsafe {
                dx.write(#[inline(always)] |start, tile| {
                    let n = tile.len();
                    let range = start..start + n;
                    let (dw, x, dy, w) = (&mut dw[range.clone()], &x[range.clone()], &dy[range.clone()], &w[range]);
                    let mut i = 0;
                    while i + LANES <= n {
                        if own {
                            prefetch_write(tile.as_ptr().wrapping_add(i + OWN_AHEAD));
                        }
                        prefetch_far(ahead, start + i);
                        // Every load before any store (see `scale_mul`).
                        let c = i..i + LANES;
                        let (xc, gc, wc, dwc) = (&x[c.clone()], &dy[c.clone()], &w[c.clone()], &dw[c.clone()]);
                        let (mut v, mut g) = ([0.0f32; LANES], [0.0f32; LANES]);
                        for l in 0..LANES {
                            v[l] = r * wc[l] * gc[l] - k * xc[l];
                            g[l] = dwc[l] + gc[l] * xc[l] * r;
                        }
                        tile[c.clone()].write_copy_of_slice(&v);
                        dw[c].copy_from_slice(&g);
                        fold.fold_behind(start + i, fold_dot3);
                        i += LANES;
                    }
                    for j in i..n {
                        tile[j].write(r * w[j] * dy[j] - k * x[j]);
                        dw[j] += dy[j] * x[j] * r;
                    }
                    fold.step(start + n, fold_dot3);
                })
            }
            fold.finish(fold_dot3, |a, b| a + b)
        }
    }

    /// `Σ a·b·c` folded by `Fold` (the RMS norm backward's `Σ dy·w·x`).
    #[inline(always)]
    pub fn fold_dot3(acc: f32, [a, b, c]: [f32; 3]) -> f32 {
        acc + a * b * c
    }

    multiversion! {
        /// `Σ dy·w·x` of one row with `Fold` (what `rms_backward_row` folds for the next row).
        pub fn row_dot3(dy: &[f32], w: &[f32], x: &[f32]) -> f32 {
            Fold::new([dy, w, x], 0.0).finish(fold_dot3, |a, b| a + b)
        }
    }

    multiversion! {
        /// `Σ dy·w·(x − m)` (with `simd::dot(dy, w)`, the layer norm backward sums).
        pub fn dot_centered(x: &[f32], dy: &[f32], w: &[f32], m: f32) -> f32 {
            let mut acc = [0.0f32; LANES];
            let (mut cx, mut cy, mut cw) = (x.chunks_exact(LANES), dy.chunks_exact(LANES), w.chunks_exact(LANES));
            for ((vx, vy), vw) in (&mut cx).zip(&mut cy).zip(&mut cw) {
                for l in 0..LANES {
                    acc[l] += vy[l] * vw[l] * (vx[l] - m);
                }
            }
            let mut tail = 0.0;
            for ((vx, vy), vw) in cx.remainder().iter().zip(cy.remainder()).zip(cw.remainder()) {
                tail += vy * vw * (vx - m);
            }
            acc.iter().sum::<f32>() + tail
        }
    }

    multiversion! {
        /// Layer norm backward of one row, with `x̂ = (x − m)·r`:
        /// `dx = r·(dy·w − mg − x̂·mgx)` (written once), `dw += dy·x̂`, `db += dy`, with
        /// `stats = (m, r, mg, mgx)`; prefetches `next` (the next rows of x and dy) when `dx`
        /// streams.
        pub fn layer_backward_row(
            dx: Dst<'_>,
            dw: &mut [f32],
            db: &mut [f32],
            x: &[f32],
            dy: &[f32],
            w: &[f32],
            stats: (f32, f32, f32, f32),
            next: [&[f32]; 2]
        ) {
            let (m, r, mg, mgx) = stats;
            let next = next.map(|row| dx.ahead(row));
            // SAFETY: the loop writes every slot of the tile.
            unsafe {
                dx.write(#[inline(always)] |start, tile| {
                    let n = tile.len();
                    prefetch(next[0], start, n);
                    prefetch(next[1], start, n);
                    let range = start..start + n;
                    let (dw, db) = (&mut dw[range.clone()], &mut db[range.clone()]);
                    let (x, dy, w) = (&x[range.clone()], &dy[range.clone()], &w[range]);
                    for i in 0..n {
                        let xh = (x[i] - m) * r;
                        tile[i].write(r * (dy[i] * w[i] - mg - xh * mgx));
                        dw[i] += dy[i] * xh;
                        db[i] += dy[i];
                    }
                })
            }
        }
    }
}

/// Mean and (biased) variance of a non-empty row by the corrected two-pass method: with
/// `m` the plain f32 mean, `δ = Σ(x − m)` recovers its rounding error, so the mean is
/// `m + δ/D` and the variance `(Σ(x − m)² − δ²/D)/D`. A constant row gets its exact
/// value as mean and a variance of 0, instead of a rounding error amplified by rstd.
fn mean_var(x: &[f32]) -> (f32, f32) {
    let n = x.len() as f32;
    let m = simd::sum(x) / n;
    let (dev, dev_sq) = (lanes::sum_dev(x, m), lanes::sum_sq_dev(x, m));
    (m + dev / n, ((dev_sq - dev * dev / n) / n).max(0.0))
}

// ─────────────────────────────────── kernels ──────────────────────────────────

/// `y = x·w / sqrt(mean(x²) + eps)` over the last dim; saves rstd (F32).
///
/// # Shapes
/// `x`: `[..., D]`; `weight`: `[D]` → output `[..., D]`, rstd `[...]`.
pub fn rms_norm(cpu: &CpuBackend, x: &Tensor, weight: &Tensor, eps: f32) -> Result<NormOutput> {
    const OP: &str = "rms_norm";
    let RowsSpec { rows, d, .. } = spec::rms_norm(x, weight, eps)?;
    let (xs, w) = (f32_data(OP, "x", x)?, f32_data(OP, "weight", weight)?);
    let per = forward_block_rows(d);
    let specs = [row_spec(x, per, d), stat_spec(x, per)];
    let [output, rstd] = output::fresh_tensors(cpu, OP, rows.div_ceil(per), per * 2 * d, specs, |i, [out, rstd]| {
        fill_small(rstd, |rstd| {
            // Each row's Σx² is folded while the previous row is written (the task's
            // first row alone, by the same fold, so results do not depend on blocking).
            let rows_here = out.len() / d;
            let mut folded = None;
            for (k, out_row) in out.into_chunks(d).enumerate() {
                let r = i * per + k;
                let xr = &xs[r * d..][..d];
                let sum_sq = folded.take().unwrap_or_else(|| simd::sum_squares(xr));
                rstd[k] = rms_rstd(sum_sq, d, eps);
                let next = if k + 1 < rows_here { next_row(&xs, r, d) } else { &[] };
                folded = Some(lanes::scale_mul(out_row, xr, &w, rstd[k], next, rows_after(&xs, r, d)));
            }
        })
    })?;
    Ok(NormOutput { output, mean: None, rstd })
}

/// With `x̂ = x·r`: `dx = r·(dy·w − x̂·mean(dy·w·x̂))`, `dw = Σ_rows dy·x̂`.
///
/// # Shapes
/// `x`, `d_out`: `[..., D]`; `weight`: `[D]`; `rstd`: `[...]` F32 → dx `[..., D]`, dweight `[D]`.
pub fn rms_norm_backward(
    cpu: &CpuBackend,
    x: &Tensor,
    weight: &Tensor,
    rstd: &Tensor,
    d_out: &Tensor,
) -> Result<NormGradients> {
    const OP: &str = "rms_norm_backward";
    let RowsSpec { rows, d, .. } = spec::rms_norm_backward(x, weight, rstd, d_out)?;
    let (xs, w, dy) = (f32_data(OP, "x", x)?, f32_data(OP, "weight", weight)?, f32_data(OP, "d_out", d_out)?);
    let rs = rstd.as_slice::<f32>()?;
    let per = backward_block_rows(rows, d);
    let tasks = rows.div_ceil(per);
    let specs = [row_spec(x, per, d), partial_spec(tasks, d)];
    let [dx, partial_dw] = output::fresh_tensors(cpu, OP, tasks, per * 4 * d, specs, |i, [dx, dw]| {
        fill_small(dw, |dw| {
            // Each row's Σ dy·w·x is folded while the previous row is written (see rms_norm).
            let rows_here = dx.len() / d;
            let mut folded = None;
            for (k, dx_row) in dx.into_chunks(d).enumerate() {
                let r = i * per + k;
                let (xr, gr, inv) = (&xs[r * d..][..d], &dy[r * d..][..d], rs[r]);
                let dot = folded.take().unwrap_or_else(|| lanes::row_dot3(gr, &w, xr));
                // mean(dy·w·x̂)·r = r³·Σ(dy·w·x)/D: the term through rstd's dependence on x.
                let k_coef = inv * inv * inv * dot / d as f32;
                let next = if k + 1 < rows_here { [next_row(&xs, r, d), next_row(&dy, r, d)] } else { [&[][..]; 2] };
                let ahead = [rows_after(&xs, r, d), rows_after(&dy, r, d)];
                folded = Some(lanes::rms_backward_row(dx_row, dw, xr, gr, &w, inv, k_coef, next, ahead));
            }
        })
    })?;
    Ok(NormGradients {
        dx,
        dweight: from_f32(sum_partials(partial_dw.as_slice()?, d), weight.shape().clone(), weight.dtype())?,
        dbias: None,
    })
}

/// Layer norm rows of `x` (its values `xs`): per row mean, rstd (two-pass variance, the
/// row in cache) and `out = (x − mean)·rstd·w + b` (or without affine), written once.
/// Returns (out in x's dtype, mean, rstd).
fn layer_norm_rows(
    cpu: &CpuBackend,
    op: &'static str,
    x: &Tensor,
    xs: &[f32],
    d: usize,
    eps: f32,
    affine: Option<(&[f32], &[f32])>,
) -> Result<[Tensor; 3]> {
    let rows = xs.len() / d;
    let per = forward_block_rows(d);
    let specs = [row_spec(x, per, d), stat_spec(x, per), stat_spec(x, per)];
    output::fresh_tensors(cpu, op, rows.div_ceil(per), per * 3 * d, specs, |i, [out, mean, rstd]| {
        fill_small(mean, |mean| {
            fill_small(rstd, |rstd| {
                for (k, out_row) in out.into_chunks(d).enumerate() {
                    let r = i * per + k;
                    let xr = &xs[r * d..][..d];
                    let (m, var) = mean_var(xr);
                    (mean[k], rstd[k]) = (m, 1.0 / (var + eps).sqrt());
                    lanes::affine_norm(out_row, xr, affine, m, rstd[k], next_row(xs, r, d));
                }
            })
        })
    })
}

/// `y = (x − mean)/sqrt(var + eps)·w + b` over the last dim; saves mean and rstd (F32).
///
/// # Shapes
/// `x`: `[..., D]`; `weight`, `bias`: `[D]` → output `[..., D]`, mean and rstd `[...]`.
pub fn layer_norm(cpu: &CpuBackend, x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<NormOutput> {
    const OP: &str = "layer_norm";
    let RowsSpec { d, .. } = spec::layer_norm(x, weight, bias, eps)?;
    let (xs, w, b) = (f32_data(OP, "x", x)?, f32_data(OP, "weight", weight)?, f32_data(OP, "bias", bias)?);
    let [output, mean, rstd] = layer_norm_rows(cpu, OP, x, &xs, d, eps, Some((&w, &b)))?;
    Ok(NormOutput { output, mean: Some(mean), rstd })
}

/// With `x̂ = (x − μ)·r`, `g = dy·w`: `dx = r·(g − mean(g) − x̂·mean(g·x̂))`,
/// `dw = Σ_rows dy·x̂`, `db = Σ_rows dy`.
///
/// # Shapes
/// `x`, `d_out`: `[..., D]`; `weight`: `[D]`; `mean`, `rstd`: `[...]` F32 → dx, dweight `[D]`, dbias `[D]`.
pub fn layer_norm_backward(
    cpu: &CpuBackend,
    x: &Tensor,
    weight: &Tensor,
    mean: &Tensor,
    rstd: &Tensor,
    d_out: &Tensor,
) -> Result<NormGradients> {
    const OP: &str = "layer_norm_backward";
    let RowsSpec { rows, d, .. } = spec::layer_norm_backward(x, weight, mean, rstd, d_out)?;
    let (xs, w, dy) = (f32_data(OP, "x", x)?, f32_data(OP, "weight", weight)?, f32_data(OP, "d_out", d_out)?);
    let (ms, rs) = (mean.as_slice::<f32>()?, rstd.as_slice::<f32>()?);
    let per = backward_block_rows(rows, d);
    let tasks = rows.div_ceil(per);
    let specs = [row_spec(x, per, d), partial_spec(tasks, d), partial_spec(tasks, d)];
    let [dx, partial_dw, partial_db] = output::fresh_tensors(cpu, OP, tasks, per * 5 * d, specs, |i, [dx, dw, db]| {
        fill_small(dw, |dw| {
            fill_small(db, |db| {
                for (k, dx_row) in dx.into_chunks(d).enumerate() {
                    let r = i * per + k;
                    let (xr, gr, m, inv) = (&xs[r * d..][..d], &dy[r * d..][..d], ms[r], rs[r]);
                    // mean(g) and mean(g·x̂) with g = dy·w, x̂ = (x − m)·r.
                    let mg = simd::dot(gr, &w) / d as f32;
                    let mgx = lanes::dot_centered(xr, gr, &w, m) * inv / d as f32;
                    let next = [next_row(&xs, r, d), next_row(&dy, r, d)];
                    lanes::layer_backward_row(dx_row, dw, db, xr, gr, &w, (m, inv, mg, mgx), next);
                }
            })
        })
    })?;
    let partial = |p: &Tensor| -> Result<Tensor> {
        from_f32(sum_partials(p.as_slice()?, d), weight.shape().clone(), weight.dtype())
    };
    Ok(NormGradients { dx, dweight: partial(&partial_dw)?, dbias: Some(partial(&partial_db)?) })
}

/// `s = a + b` and `rms_norm(s, w)` in one pass over the row. The norm is taken of the
/// f32 sum (before `s` is rounded to an F16/BF16 output).
///
/// # Shapes
/// `a`, `b`: `[..., D]`; `weight`: `[D]` → (`s` `[..., D]`, output `[..., D]`, rstd `[...]`).
pub fn add_rms_norm(
    cpu: &CpuBackend,
    a: &Tensor,
    b: &Tensor,
    weight: &Tensor,
    eps: f32,
) -> Result<(Tensor, NormOutput)> {
    const OP: &str = "add_rms_norm";
    let RowsSpec { rows, d, .. } = spec::add_rms_norm(a, b, weight, eps)?;
    let (av, bv, w) = (f32_data(OP, "a", a)?, f32_data(OP, "b", b)?, f32_data(OP, "weight", weight)?);
    let per = forward_block_rows(d);
    let specs = [row_spec(a, per, d), row_spec(a, per, d), stat_spec(a, per)];
    let [sum, output, rstd] =
        output::fresh_tensors(cpu, OP, rows.div_ceil(per), per * 3 * d, specs, |i, [sum, out, rstd]| {
            fill_small(rstd, |rstd| {
                // Two scratch rows: this row's s = a + b, and the next row's, computed
                // (with its Σs²) while this row is written.
                output::with_scratch(2 * d, |scratch| {
                    let (mut s, mut s_next) = scratch.split_at_mut(d);
                    let rows_here = sum.len() / d;
                    let mut folded = None;
                    for (k, (sum_row, out_row)) in sum.into_chunks(d).zip(out.into_chunks(d)).enumerate() {
                        let r = i * per + k;
                        let sum_sq = match folded.take() {
                            Some(v) => v,
                            None => lanes::add_sum_squares(s, &av[r * d..][..d], &bv[r * d..][..d]),
                        };
                        rstd[k] = rms_rstd(sum_sq, d, eps);
                        let next =
                            if k + 1 < rows_here { [next_row(&av, r, d), next_row(&bv, r, d)] } else { [&[][..]; 2] };
                        let ahead = [rows_after(&av, r, d), rows_after(&bv, r, d)];
                        folded = Some(lanes::sum_and_scale(sum_row, out_row, s, &w, rstd[k], next, ahead, s_next));
                        std::mem::swap(&mut s, &mut s_next);
                    }
                })
            })
        })?;
    Ok((sum, NormOutput { output, mean: None, rstd }))
}

/// `rms_norm(x, w)·silu(z)`.
///
/// # Shapes
/// `x`, `z`: `[..., D]`; `weight`: `[D]` → `[..., D]`.
pub fn rms_norm_gated(cpu: &CpuBackend, x: &Tensor, z: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    const OP: &str = "rms_norm_gated";
    let RowsSpec { rows, d, .. } = spec::rms_norm_gated(x, z, weight, eps)?;
    let (xs, zs, w) = (f32_data(OP, "x", x)?, f32_data(OP, "z", z)?, f32_data(OP, "weight", weight)?);
    let mut out = F32Output::new(x.shape(), x.dtype())?;
    let per = forward_block_rows(d);
    for_each_block(cpu, rows, per, 4 * d, [(out.values()?, per * d)], |range, [out]| {
        for (k, r) in range.enumerate() {
            let xr = &xs[r * d..][..d];
            let inv = rms_rstd(simd::sum_squares(xr), d, eps);
            lanes::gated(&mut out[k * d..][..d], xr, &w, &zs[r * d..][..d], inv);
        }
    });
    out.finish(cpu)
}

/// Backward of `rms_norm_gated` (`y = x·r·w·silu(z)`, `r = 1/sqrt(mean(x²) + eps)`),
/// recomputing r: with `u = dy·silu(z)` and `x̂ = x·r`,
/// `dx = r·(u·w − x̂·mean(u·w·x̂))`, `dz = dy·x̂·w·silu'(z)`, `dw = Σ_rows u·x̂`.
/// Two sweeps per row (the row in cache); dweight from one partial per fixed block of
/// rows, added in block order.
///
/// # Shapes
/// `x`, `z`, `d_out`: `[..., D]`; `weight`: `[D]` → dx, dz `[..., D]`, dweight `[D]`.
pub fn rms_norm_gated_backward(
    cpu: &CpuBackend,
    x: &Tensor,
    z: &Tensor,
    weight: &Tensor,
    d_out: &Tensor,
    eps: f32,
) -> Result<GatedNormGradients> {
    const OP: &str = "rms_norm_gated_backward";
    let RowsSpec { rows, d, .. } = spec::rms_norm_gated_backward(x, z, weight, d_out, eps)?;
    let (xs, zs, w) = (f32_data(OP, "x", x)?, f32_data(OP, "z", z)?, f32_data(OP, "weight", weight)?);
    let dy = f32_data(OP, "d_out", d_out)?;
    let (mut dx, mut dz) = (F32Output::new(x.shape(), x.dtype())?, F32Output::new(z.shape(), z.dtype())?);
    let per = backward_block_rows(rows, d);
    let mut partial_dw = vec![0.0f32; rows.div_ceil(per) * d];
    let bufs = [(dx.values()?, per * d), (dz.values()?, per * d), (&mut partial_dw[..], d)];
    for_each_block(cpu, rows, per, 8 * d, bufs, |range, [dx, dz, dw]| {
        let mut u = vec![0.0f32; d];
        for (k, r) in range.enumerate() {
            let at = r * d;
            let (xr, zr, gr) = (&xs[at..][..d], &zs[at..][..d], &dy[at..][..d]);
            let inv = rms_rstd(simd::sum_squares(xr), d, eps);
            let dot = lanes::gated_grad_sweep(&mut dz[k * d..][..d], &mut u, xr, zr, &w, gr, inv);
            // mean(u·w·x̂)·r = r³·Σ(u·w·x)/D: the term through r's dependence on x.
            let k_coef = inv * inv * inv * dot / d as f32;
            lanes::gated_grad_finish(&mut dx[k * d..][..d], dw, &u, xr, &w, inv, k_coef);
        }
    });
    Ok(GatedNormGradients {
        dx: dx.finish(cpu)?,
        dz: dz.finish(cpu)?,
        dweight: from_f32(sum_partials(&partial_dw, d), weight.shape().clone(), weight.dtype())?,
    })
}

/// `y = x / sqrt(Σx² + eps)` over the last dim (a sum, eps inside the root: FLA's and
/// transformers' `l2norm`); saves `rnorm = 1/sqrt(Σx² + eps)` (F32) in `rstd`.
///
/// # Shapes
/// `x`: `[..., D]` → output `[..., D]`, rstd (rnorm) `[...]`, mean `None`.
pub fn l2_norm(cpu: &CpuBackend, x: &Tensor, eps: f32) -> Result<NormOutput> {
    const OP: &str = "l2_norm";
    let RowsSpec { rows, d, .. } = spec::l2_norm(x, eps)?;
    let xs = f32_data(OP, "x", x)?;
    let mut out = F32Output::new(x.shape(), x.dtype())?;
    let mut rnorm = vec![0.0f32; rows];
    let per = forward_block_rows(d);
    let bufs = [(out.values()?, per * d), (&mut rnorm[..], per)];
    for_each_block(cpu, rows, per, 2 * d, bufs, |range, [out, rn]| {
        for (k, r) in range.enumerate() {
            let xr = &xs[r * d..][..d];
            rn[k] = 1.0 / (simd::sum_squares(xr) + eps).sqrt();
            lanes::scaled(&mut out[k * d..][..d], xr, rn[k]);
        }
    });
    Ok(NormOutput { output: out.finish(cpu)?, mean: None, rstd: Tensor::from_vec(rnorm, spec::stat_dims(x))? })
}

/// With `x̂ = x·r`: `dx = r·(dy − x̂·Σ(dy·x̂)) = r·dy − r³·Σ(dy·x)·x`.
///
/// # Shapes
/// `x`, `d_out`: `[..., D]`; `rnorm`: `[...]` F32 → dx `[..., D]`.
pub fn l2_norm_backward(cpu: &CpuBackend, x: &Tensor, rnorm: &Tensor, d_out: &Tensor) -> Result<Tensor> {
    const OP: &str = "l2_norm_backward";
    let RowsSpec { rows, d, .. } = spec::l2_norm_backward(x, rnorm, d_out)?;
    let (xs, dy) = (f32_data(OP, "x", x)?, f32_data(OP, "d_out", d_out)?);
    let rs = rnorm.as_slice::<f32>()?;
    let mut dx = F32Output::new(x.shape(), x.dtype())?;
    let per = forward_block_rows(d);
    for_each_block(cpu, rows, per, 3 * d, [(dx.values()?, per * d)], |range, [dx]| {
        for (k, r) in range.enumerate() {
            let (xr, gr, inv) = (&xs[r * d..][..d], &dy[r * d..][..d], rs[r]);
            let k_coef = inv * inv * inv * simd::dot(gr, xr);
            lanes::scaled_difference(&mut dx[k * d..][..d], gr, inv, xr, k_coef);
        }
    });
    dx.finish(cpu)
}

/// RMS norm over channels: `y[b,c,t] = x[b,c,t]·w[c] / sqrt(mean_c(x[b,·,t]²) + eps)`.
/// Vectorized over t: each task takes one batch and a tile of time steps, accumulates
/// the squares of its C row segments, then scales them while they are in cache.
///
/// # Shapes
/// `x`: `[B, C, T]`; `weight`: `[C]` → `[B, C, T]`.
pub fn rms_norm_channel(cpu: &CpuBackend, x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    const OP: &str = "rms_norm_channel";
    let ChannelSpec { batch: b, channels: c, spatial: t, .. } = spec::rms_norm_channel(x, weight, eps)?;
    let (xs, w) = (f32_data(OP, "x", x)?, f32_data(OP, "weight", weight)?);
    let mut out = F32Output::new(x.shape(), x.dtype())?;
    let tiles = t.div_ceil(CHANNEL_TILE);
    let dst = SharedMut(out.values()?.as_mut_ptr());
    cpu.for_each_index(b * tiles, 3 * c * CHANNEL_TILE.min(t), |task| {
        let (bi, t0) = (task / tiles, (task % tiles) * CHANNEL_TILE);
        let len = CHANNEL_TILE.min(t - t0);
        let base = bi * c * t + t0;
        let mut acc = [0.0f32; CHANNEL_TILE];
        let r = &mut acc[..len];
        for ci in 0..c {
            lanes::add_squares(r, &xs[base + ci * t..][..len]);
        }
        for v in r.iter_mut() {
            *v = rms_rstd(*v, c, eps);
        }
        for (ci, &wc) in w.iter().enumerate() {
            let at = base + ci * t;
            // SAFETY: task (bi, tile) alone writes time steps t0..t0+len of batch bi, so the
            // ranges [at, at + len) of different tasks are disjoint; they lie inside `out`
            // (at + len ≤ (bi·C + ci)·T + T ≤ B·C·T), which outlives the loop and is not
            // otherwise touched while it runs.
            let o = unsafe { dst.slice(at, len) };
            lanes::scale_cols(o, &xs[at..][..len], r, wc);
        }
    });
    out.finish(cpu)
}

/// Count, mean and sum of squared deviations of a slice (f64 for combining).
fn moments(x: &[f32]) -> (f64, f64, f64) {
    if x.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let (mean, var) = mean_var(x);
    (x.len() as f64, mean as f64, var as f64 * x.len() as f64)
}

/// Combines the moments of two disjoint pieces (Chan, Golub & LeVeque).
fn combine_moments(a: (f64, f64, f64), b: (f64, f64, f64)) -> (f64, f64, f64) {
    let n = a.0 + b.0;
    if n == 0.0 {
        return a;
    }
    let delta = b.1 - a.1;
    (n, a.1 + delta * b.0 / n, a.2 + b.2 + delta * delta * a.0 * b.0 / n)
}

/// Group norm: channels split into `groups`; each (batch, group) is normalized over its
/// channels and spatial positions, then `·w[c] + b[c]`. Statistics come from fixed
/// pieces computed in parallel and combined in order; the output pass runs over
/// (batch, channel) rows in parallel.
///
/// # Shapes
/// `x`: `[B, C, ...]`, `C % groups == 0`; `weight`, `bias`: `[C]` → same as x.
pub fn group_norm(
    cpu: &CpuBackend,
    x: &Tensor,
    groups: usize,
    weight: &Tensor,
    bias: &Tensor,
    eps: f32,
) -> Result<Tensor> {
    const OP: &str = "group_norm";
    let ChannelSpec { batch: b, channels: c, spatial, .. } = spec::group_norm(x, groups, weight, bias, eps)?;
    let (xs, w, bs) = (f32_data(OP, "x", x)?, f32_data(OP, "weight", weight)?, f32_data(OP, "bias", bias)?);
    let channels_per_group = c / groups;
    let seg = channels_per_group * spatial;

    // Statistics of each (batch, group) segment, from pieces of at most STAT_PIECE elements.
    let pieces = seg.div_ceil(STAT_PIECE).max(1);
    let piece_moments = cpu.map_indices(b * groups * pieces, 2 * STAT_PIECE.min(seg), |i| {
        let (s, p) = (i / pieces, i % pieces);
        let start = (p * STAT_PIECE).min(seg);
        let end = (start + STAT_PIECE).min(seg);
        moments(&xs[s * seg + start..s * seg + end])
    });
    let stats: Vec<(f32, f32)> = piece_moments
        .chunks(pieces)
        .map(|ps| {
            let (n, mean, m2) = ps.iter().copied().fold((0.0, 0.0, 0.0), combine_moments);
            let var = if n > 0.0 { m2 / n } else { 0.0 };
            (mean as f32, (1.0 / (var + eps as f64).sqrt()) as f32)
        })
        .collect();

    let mut out = F32Output::new(x.shape(), x.dtype())?;
    let per = forward_block_rows(spatial);
    for_each_block(cpu, b * c, per, 2 * spatial, [(out.values()?, per * spatial)], |range, [out]| {
        for (k, r) in range.enumerate() {
            let (bi, ci) = (r / c, r % c);
            let (m, inv) = stats[bi * groups + ci / channels_per_group];
            let o = &mut out[k * spatial..][..spatial];
            lanes::center_affine(o, &xs[r * spatial..][..spatial], m, inv * w[ci], bs[ci]);
        }
    });
    out.finish(cpu)
}

/// `rms_norm(x, w)·(1 + scale) + shift`, scale and shift per batch row.
///
/// # Shapes
/// `x`: `[B, T, D]`; `weight`: `[D]`; `scale`, `shift`: `[B, D]` → `[B, T, D]`.
pub fn adaln_modulate(
    cpu: &CpuBackend,
    x: &Tensor,
    weight: &Tensor,
    scale: &Tensor,
    shift: &Tensor,
    eps: f32,
) -> Result<Tensor> {
    const OP: &str = "adaln_modulate";
    let AdalnSpec { batch: b, seq: t, d, .. } = spec::adaln_modulate(x, weight, scale, shift, eps)?;
    let xs = f32_data(OP, "x", x)?;
    let (w, sc, sh) = (f32_data(OP, "weight", weight)?, f32_data(OP, "scale", scale)?, f32_data(OP, "shift", shift)?);
    // The effective weight of batch row bi: w·(1 + scale[bi]), once per batch row.
    let ew: Vec<f32> = sc.iter().enumerate().map(|(i, &s)| w[i % d] * (1.0 + s)).collect();
    let rows = b * t;
    let mut out = F32Output::new(x.shape(), x.dtype())?;
    let per = forward_block_rows(d);
    for_each_block(cpu, rows, per, 3 * d, [(out.values()?, per * d)], |range, [out]| {
        for (k, r) in range.enumerate() {
            let bi = r / t;
            let xr = &xs[r * d..][..d];
            let inv = rms_rstd(simd::sum_squares(xr), d, eps);
            lanes::modulate(&mut out[k * d..][..d], xr, &ew[bi * d..][..d], &sh[bi * d..][..d], inv);
        }
    });
    out.finish(cpu)
}

/// `(x − mean)/sqrt(var + eps)` per row, no affine (the core of layer_norm).
///
/// # Shapes
/// `x`: `[..., D]` → same.
pub fn normalize(cpu: &CpuBackend, x: &Tensor, eps: f32) -> Result<Tensor> {
    const OP: &str = "normalize";
    let RowsSpec { d, .. } = spec::normalize(x, eps)?;
    let xs = f32_data(OP, "x", x)?;
    let [out, _, _] = layer_norm_rows(cpu, OP, x, &xs, d, eps, None)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / 8_388_608.0 - 1.0)
            .collect()
    }

    fn tensor(shape: &[usize], seed: u32) -> Tensor {
        Tensor::from_vec(values(shape.iter().product(), seed), shape).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.to_vec_f32().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// Every threaded path (row blocks, backward partials, group statistics pieces,
    /// channel tiles) gives the same bits with 1 thread and with 3.
    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        let (x, dy) = (tensor(&[300, 120], 1), tensor(&[300, 120], 2));
        let (w, b) = (tensor(&[120], 3), tensor(&[120], 4));
        let xg = tensor(&[2, 4, 9000], 5);
        let wg = tensor(&[4], 6);
        let run = |cpu: &CpuBackend| -> Vec<Vec<u32>> {
            let f = rms_norm(cpu, &x, &w, 1e-5).unwrap();
            let g = rms_norm_backward(cpu, &x, &w, &f.rstd, &dy).unwrap();
            let l = layer_norm(cpu, &x, &w, &b, 1e-5).unwrap();
            let mean = l.mean.clone().unwrap();
            let lg = layer_norm_backward(cpu, &x, &w, &mean, &l.rstd, &dy).unwrap();
            let gn = group_norm(cpu, &xg, 2, &wg, &wg, 1e-5).unwrap();
            let ch = rms_norm_channel(cpu, &xg, &wg, 1e-5).unwrap();
            [&f.output, &f.rstd, &g.dx, &g.dweight, &l.output, &mean, &lg.dx, &lg.dweight, &gn, &ch]
                .iter()
                .map(|t| bits(t))
                .chain(lg.dbias.iter().map(bits))
                .collect()
        };
        let one = run(&CpuBackend::with_threads(1).unwrap());
        let three = run(&CpuBackend::with_threads(3).unwrap());
        assert_eq!(one.len(), 11);
        for (i, (a, b)) in one.iter().zip(&three).enumerate() {
            assert!(a == b, "output {i} differs between 1 and 3 threads");
        }
    }

    /// The Gated DeltaNet norms (gated backward with its dweight partials, L2 and its
    /// backward) give the same bits with 1 thread and with 3.
    #[test]
    fn gated_and_l2_norms_do_not_depend_on_the_thread_count() {
        let (x, z, dy, w) =
            (tensor(&[2000, 128], 1), tensor(&[2000, 128], 2), tensor(&[2000, 128], 3), tensor(&[128], 4));
        let run = |cpu: &CpuBackend| -> Vec<Vec<u32>> {
            let g = rms_norm_gated_backward(cpu, &x, &z, &w, &dy, 1e-6).unwrap();
            let l = l2_norm(cpu, &x, 1e-6).unwrap();
            let dl = l2_norm_backward(cpu, &x, &l.rstd, &dy).unwrap();
            [&g.dx, &g.dz, &g.dweight, &l.output, &l.rstd, &dl].iter().map(|t| bits(t)).collect()
        };
        assert_eq!(run(&CpuBackend::with_threads(1).unwrap()), run(&CpuBackend::with_threads(3).unwrap()));
    }

    /// A row's reduction is folded alone (a task's first row) or while the row before it
    /// is written (every other row): both must give the same bits, so each row of a
    /// batch matches the same row normalized on its own. Widths below and above the
    /// fold's lag, with and without a remainder past the 16-lane chunks.
    #[test]
    fn a_row_gives_the_same_bits_wherever_it_falls_in_a_task() {
        let cpu = CpuBackend::with_threads(2).unwrap();
        for d in [100usize, 1000, 4096] {
            let rows = 37;
            let (x, b, dy, w) = (tensor(&[rows, d], 1), tensor(&[rows, d], 7), tensor(&[rows, d], 2), tensor(&[d], 3));
            let batch = rms_norm(&cpu, &x, &w, 1e-5).unwrap();
            let grads = rms_norm_backward(&cpu, &x, &w, &batch.rstd, &dy).unwrap();
            let (sum, added) = add_rms_norm(&cpu, &x, &b, &w, 1e-5).unwrap();
            let (xv, bv, gv) = (x.to_vec_f32().unwrap(), b.to_vec_f32().unwrap(), dy.to_vec_f32().unwrap());
            let row_of = |v: &[f32], r: usize| Tensor::from_vec(v[r * d..(r + 1) * d].to_vec(), [1, d]).unwrap();
            let slice = |t: &Tensor, r: usize| bits(t)[r * d..(r + 1) * d].to_vec();
            for r in 0..rows {
                let one = rms_norm(&cpu, &row_of(&xv, r), &w, 1e-5).unwrap();
                assert_eq!(bits(&one.output), slice(&batch.output, r), "rms_norm d {d} row {r}");
                assert_eq!(bits(&one.rstd)[0], bits(&batch.rstd)[r], "rms_norm rstd d {d} row {r}");
                let g = rms_norm_backward(&cpu, &row_of(&xv, r), &w, &one.rstd, &row_of(&gv, r)).unwrap();
                assert_eq!(bits(&g.dx), slice(&grads.dx, r), "rms_norm_backward d {d} row {r}");
                let (s1, a1) = add_rms_norm(&cpu, &row_of(&xv, r), &row_of(&bv, r), &w, 1e-5).unwrap();
                assert_eq!(bits(&s1), slice(&sum, r), "add_rms_norm sum d {d} row {r}");
                assert_eq!(bits(&a1.output), slice(&added.output, r), "add_rms_norm d {d} row {r}");
            }
        }
    }

    /// Staged (F16/BF16) and direct (F32) outputs hold what was written, in their dtype.
    #[test]
    fn outputs_keep_their_dtype() {
        let cpu = CpuBackend::with_threads(2).unwrap();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let mut out = F32Output::new(&Shape::new([3, 5]), dtype).unwrap();
            for (i, v) in out.values().unwrap().iter_mut().enumerate() {
                *v = i as f32 * 0.5;
            }
            let t = out.finish(&cpu).unwrap();
            assert_eq!((t.dtype(), t.dims()), (dtype, &[3usize, 5][..]));
            let want: Vec<f32> = (0..15).map(|i| i as f32 * 0.5).collect();
            assert_eq!(t.to_vec_f32().unwrap(), want);
            let empty = F32Output::new(&Shape::new([0, 5]), dtype).unwrap().finish(&cpu).unwrap();
            assert_eq!(empty.dims(), &[0, 5]);
        }
    }
}
