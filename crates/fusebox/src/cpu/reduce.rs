//! Reductions: sum, mean, max, var, sum_abs (along an axis or over everything), argmax,
//! topk, and the gradients max_backward and sum_to_shape.
//!
//! A reduction along an axis views x as `[outer, n, inner]` and reduces n. F16/BF16
//! inputs are read as f32 and accumulate in f32. The work is cut into units whose
//! boundaries depend only on the shape (blocks of the reduced axis, chunks of the inner
//! axis), each unit accumulates in a fixed order, and the partial results are combined
//! in unit order: results are bit-identical whatever the thread count, and large
//! reductions — even of one long row — run in parallel.

use crate::cpu::convert::{f32_data, from_f32};
use crate::cpu::pool::SharedMut;
use crate::cpu::simd;
use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::Shape;
use crate::spec::{self, reduce::ReduceSpec};
use crate::tensor::Tensor;
use crate::types::*;

/// Elements of a contiguous row reduced by one unit.
const ROW_BLOCK: usize = 1 << 13;
/// Inner-axis columns one unit of a strided reduction accumulates (a 4 KiB accumulator).
const COL_BLOCK: usize = 1 << 10;
/// Target elements of work per unit of a strided reduction.
const UNIT_WORK: usize = 1 << 15;

/// Lane-wise loops compiled per ISA (see `simd::multiversion!`).
mod lanes {
    use crate::cpu::simd::multiversion;

    const LANES: usize = 16;

    multiversion! {
        /// `Σ |x[i]|` (16 partial sums, fixed order).
        pub fn sum_abs(x: &[f32]) -> f32 {
            let mut acc = [0.0f32; LANES];
            let mut c = x.chunks_exact(LANES);
            for v in &mut c {
                for l in 0..LANES {
                    acc[l] += v[l].abs();
                }
            }
            acc.iter().sum::<f32>() + c.remainder().iter().map(|v| v.abs()).sum::<f32>()
        }
    }

    multiversion! {
        /// `Σ (x[i] − m)²` (16 partial sums, fixed order).
        pub fn sum_sq_dev(x: &[f32], m: f32) -> f32 {
            let mut acc = [0.0f32; LANES];
            let mut c = x.chunks_exact(LANES);
            for v in &mut c {
                for l in 0..LANES {
                    let d = v[l] - m;
                    acc[l] += d * d;
                }
            }
            acc.iter().sum::<f32>() + c.remainder().iter().map(|v| (v - m) * (v - m)).sum::<f32>()
        }
    }

    multiversion! {
        /// `acc[i] += x[i]`.
        pub fn add_into(acc: &mut [f32], x: &[f32]) {
            for (a, &v) in acc.iter_mut().zip(x) {
                *a += v;
            }
        }
    }

    multiversion! {
        /// `acc[i] += |x[i]|`.
        pub fn add_abs_into(acc: &mut [f32], x: &[f32]) {
            for (a, &v) in acc.iter_mut().zip(x) {
                *a += v.abs();
            }
        }
    }

    multiversion! {
        /// `acc[i] = max(acc[i], x[i])`.
        pub fn max_into(acc: &mut [f32], x: &[f32]) {
            for (a, &v) in acc.iter_mut().zip(x) {
                *a = if v > *a { v } else { *a };
            }
        }
    }

    multiversion! {
        /// `acc[i] += (x[i] − m[i])²`.
        pub fn add_sq_dev_into(acc: &mut [f32], x: &[f32], m: &[f32]) {
            for ((a, &v), &c) in acc.iter_mut().zip(x).zip(m) {
                let d = v - c;
                *a += d * d;
            }
        }
    }

    multiversion! {
        /// Where `x[i] > best[i]` (strictly: the first maximum wins), `best[i] = x[i]` and `arg[i] = j`.
        pub fn argmax_into(best: &mut [f32], arg: &mut [u32], x: &[f32], j: u32) {
            for ((b, a), &v) in best.iter_mut().zip(arg.iter_mut()).zip(x) {
                let better = v > *b;
                *b = if better { v } else { *b };
                *a = if better { j } else { *a };
            }
        }
    }
}

/// What a reduction accumulates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `Σ x`
    Sum,
    /// `Σ |x|`
    SumAbs,
    /// `max x`
    Max,
    /// `Σ (x − c)²` around a centre per output element.
    SqDev,
}

impl Kind {
    fn identity(self) -> f32 {
        if self == Kind::Max {
            f32::NEG_INFINITY
        } else {
            0.0
        }
    }

    fn combine(self, a: f32, b: f32) -> f32 {
        if self == Kind::Max {
            if b > a {
                b
            } else {
                a
            }
        } else {
            a + b
        }
    }

    /// The reduction of one contiguous block (`c`: the centre for `SqDev`).
    fn block(self, x: &[f32], c: f32) -> f32 {
        match self {
            Kind::Sum => simd::sum(x),
            Kind::SumAbs => lanes::sum_abs(x),
            Kind::Max => simd::max(x),
            Kind::SqDev => lanes::sum_sq_dev(x, c),
        }
    }

    /// `acc ⊕= row` elementwise (`c`: the centres of these columns for `SqDev`).
    fn accumulate(self, acc: &mut [f32], row: &[f32], c: &[f32]) {
        match self {
            Kind::Sum => lanes::add_into(acc, row),
            Kind::SumAbs => lanes::add_abs_into(acc, row),
            Kind::Max => lanes::max_into(acc, row),
            Kind::SqDev => lanes::add_sq_dev_into(acc, row, c),
        }
    }
}

/// A reduction viewed as `[outer, n, inner]`, reducing n.
#[derive(Debug, Clone, Copy)]
struct Split {
    outer: usize,
    n: usize,
    inner: usize,
}

impl Split {
    /// The `[outer, n, inner]` view a validated reduction describes.
    fn of(spec: &ReduceSpec) -> Split {
        Split { outer: spec.outer, n: spec.n, inner: spec.inner }
    }
}

/// Reduces `x` (`[outer, n, inner]`) to `[outer, inner]`; `centres` (one per output) for `SqDev`.
fn reduce(cpu: &CpuBackend, x: &[f32], s: Split, kind: Kind, centres: &[f32]) -> Vec<f32> {
    if s.inner == 1 {
        reduce_rows(cpu, x, s, kind, centres)
    } else {
        reduce_columns(cpu, x, s, kind, centres)
    }
}

/// `inner == 1`: each output reduces a contiguous row of n, in blocks of ROW_BLOCK
/// combined in order; units are (row, block) pairs.
fn reduce_rows(cpu: &CpuBackend, x: &[f32], s: Split, kind: Kind, centres: &[f32]) -> Vec<f32> {
    let blocks = s.n.div_ceil(ROW_BLOCK).max(1);
    let centre = |o: usize| if kind == Kind::SqDev { centres[o] } else { 0.0 };
    let partial = |o: usize, b: usize| {
        let lo = (o * s.n + b * ROW_BLOCK).min(o * s.n + s.n);
        let hi = (lo + ROW_BLOCK).min(o * s.n + s.n);
        kind.block(&x[lo..hi], centre(o))
    };
    if blocks == 1 {
        return cpu.map_indices(s.outer, s.n, |o| kind.combine(kind.identity(), partial(o, 0)));
    }
    let partials = cpu.map_indices(s.outer * blocks, ROW_BLOCK, |u| partial(u / blocks, u % blocks));
    partials.chunks(blocks).map(|p| p.iter().fold(kind.identity(), |a, &b| kind.combine(a, b))).collect()
}

/// `inner > 1`: units are (outer index, column block, block of rows of n); each unit
/// accumulates its rows in order into a column accumulator; row blocks are combined in order.
fn reduce_columns(cpu: &CpuBackend, x: &[f32], s: Split, kind: Kind, centres: &[f32]) -> Vec<f32> {
    let width = s.inner.min(COL_BLOCK);
    let col_blocks = s.inner.div_ceil(width);
    let rows_per_unit = (UNIT_WORK / width).max(1);
    let row_blocks = s.n.div_ceil(rows_per_unit).max(1);
    let unit = |u: usize| {
        let (o, rest) = (u / (col_blocks * row_blocks), u % (col_blocks * row_blocks));
        let (cb, rb) = (rest / row_blocks, rest % row_blocks);
        let (c0, c1) = (cb * width, (cb * width + width).min(s.inner));
        let (j0, j1) = ((rb * rows_per_unit).min(s.n), (rb * rows_per_unit + rows_per_unit).min(s.n));
        let c = if kind == Kind::SqDev { &centres[o * s.inner + c0..o * s.inner + c1] } else { &[][..] };
        let mut acc = vec![kind.identity(); c1 - c0];
        for j in j0..j1 {
            let row = (o * s.n + j) * s.inner;
            kind.accumulate(&mut acc, &x[row + c0..row + c1], c);
        }
        acc
    };
    let mut out = vec![0.0f32; s.outer * s.inner];
    if row_blocks == 1 {
        // One unit per output range: write it in place.
        let dst = SharedMut(out.as_mut_ptr());
        cpu.for_each_index(s.outer * col_blocks, width * s.n, |u| {
            let (o, cb) = (u / col_blocks, u % col_blocks);
            let acc = unit(u);
            // SAFETY: unit (o, cb) owns columns [cb·width, cb·width + acc.len()) of output row o.
            unsafe { dst.slice(o * s.inner + cb * width, acc.len()) }.copy_from_slice(&acc);
        });
        return out;
    }
    let partials = cpu.map_indices(s.outer * col_blocks * row_blocks, UNIT_WORK, unit);
    for (g, group) in partials.chunks(row_blocks).enumerate() {
        let (o, cb) = (g / col_blocks, g % col_blocks);
        let dst = &mut out[o * s.inner + cb * width..][..group[0].len()];
        dst.copy_from_slice(&group[0]);
        for p in &group[1..] {
            for (d, &v) in dst.iter_mut().zip(p) {
                *d = kind.combine(*d, v);
            }
        }
    }
    out
}

/// Runs `kind` over the validated reduction `spec` of x; the result in x's dtype.
fn reduce_op(op: &'static str, cpu: &CpuBackend, x: &Tensor, spec: ReduceSpec, kind: Kind) -> Result<Tensor> {
    let data = f32_data(op, "x", x)?;
    let out = reduce(cpu, &data, Split::of(&spec), kind, &[]);
    from_f32(out, spec.out_dims, spec.dtype)
}

/// `mean` per output as f32 (the centres of `var`).
fn means(cpu: &CpuBackend, data: &[f32], s: Split) -> Vec<f32> {
    let mut m = reduce(cpu, data, s, Kind::Sum, &[]);
    for v in &mut m {
        *v /= s.n as f32;
    }
    m
}

/// `Σ x` along `axis` (removed), or over everything (`None` → a scalar); f32 accumulation.
///
/// # Shapes
/// `x`: any float → x's shape without `axis`, or `[]`; x's dtype.
pub fn sum(cpu: &CpuBackend, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
    reduce_op("sum", cpu, x, spec::reduce::sum(x, axis)?, Kind::Sum)
}

/// `Σ x / n` along `axis` (removed), or over everything; an empty axis gives NaN.
///
/// # Shapes
/// `x`: any float → x's shape without `axis`, or `[]`; x's dtype.
pub fn mean(cpu: &CpuBackend, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
    const OP: &str = "mean";
    let spec = spec::reduce::mean(x, axis)?;
    let data = f32_data(OP, "x", x)?;
    from_f32(means(cpu, &data, Split::of(&spec)), spec.out_dims, spec.dtype)
}

/// `max x` along `axis` (removed), or over everything; NaN inputs are skipped; an empty
/// axis is an error.
///
/// # Shapes
/// `x`: any float → x's shape without `axis`, or `[]`; x's dtype.
pub fn max(cpu: &CpuBackend, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
    reduce_op("max", cpu, x, spec::reduce::max(x, axis)?, Kind::Max)
}

/// Population variance `Σ (x − mean)² / n` along `axis` (removed), or over everything
/// (two passes: the mean, then squared deviations from it).
///
/// # Shapes
/// `x`: any float → x's shape without `axis`, or `[]`; x's dtype.
pub fn var(cpu: &CpuBackend, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
    const OP: &str = "var";
    let spec = spec::reduce::var(x, axis)?;
    let s = Split::of(&spec);
    let data = f32_data(OP, "x", x)?;
    let centres = means(cpu, &data, s);
    let mut out = reduce(cpu, &data, s, Kind::SqDev, &centres);
    for v in &mut out {
        *v /= s.n as f32;
    }
    from_f32(out, spec.out_dims, spec.dtype)
}

/// `Σ |x|` along `axis` (removed), or over everything; f32 accumulation.
///
/// # Shapes
/// `x`: any float → x's shape without `axis`, or `[]`; x's dtype.
pub fn sum_abs(cpu: &CpuBackend, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
    reduce_op("sum_abs", cpu, x, spec::reduce::sum_abs(x, axis)?, Kind::SumAbs)
}

/// Index of the first maximum of each `[outer, ·, inner]` fibre (n ≥ 1).
fn argmax_indices(cpu: &CpuBackend, x: &[f32], s: Split) -> Vec<u32> {
    if s.inner == 1 {
        // Contiguous rows: the maximum by blocks, then its first position.
        let maxima = reduce_rows(cpu, x, s, Kind::Max, &[]);
        return cpu.map_indices(s.outer, s.n, |o| {
            let row = &x[o * s.n..(o + 1) * s.n];
            row.iter().position(|&v| v == maxima[o]).unwrap_or(0) as u32
        });
    }
    let width = s.inner.min(COL_BLOCK);
    let col_blocks = s.inner.div_ceil(width);
    let mut out = vec![0u32; s.outer * s.inner];
    let dst = SharedMut(out.as_mut_ptr());
    cpu.for_each_index(s.outer * col_blocks, width * s.n, |u| {
        let (o, cb) = (u / col_blocks, u % col_blocks);
        let (c0, c1) = (cb * width, (cb * width + width).min(s.inner));
        let mut best = vec![f32::NEG_INFINITY; c1 - c0];
        // SAFETY: unit (o, cb) owns columns [c0, c1) of output row o.
        let arg = unsafe { dst.slice(o * s.inner + c0, c1 - c0) };
        for j in 0..s.n {
            let row = (o * s.n + j) * s.inner;
            lanes::argmax_into(&mut best, arg, &x[row + c0..row + c1], j as u32);
        }
    });
    out
}

/// Index of the first maximum along `axis` (removed).
///
/// # Shapes
/// `x`: any float, `x.dims()[axis] ≥ 1` → x's shape without `axis`, U32.
pub fn argmax(cpu: &CpuBackend, x: &Tensor, axis: usize) -> Result<Tensor> {
    const OP: &str = "argmax";
    let spec = spec::reduce::argmax(x, axis)?;
    let data = f32_data(OP, "x", x)?;
    Tensor::from_vec(argmax_indices(cpu, &data, Split::of(&spec)), spec.out_dims)
}

/// The order of topk: larger values first (NaN above everything, −0 equal to +0), then
/// the lower index.
fn rank_key(v: f32) -> f32 {
    if v.is_nan() {
        f32::NAN
    } else {
        v + 0.0
    }
}

/// Up to this k, topk first tries a scan that keeps the best k in a sorted buffer
/// (O(N) when few elements beat the current k-th, as for typical rows); above it, or when
/// the scan inserts too often (nearly ascending rows), it selects with `select_nth_unstable`.
/// Both give the same indices: the order is total.
const SMALL_K: usize = 256;

/// Writes the indices of the `out.len()` largest values of `row` into `out`, in order.
pub(crate) fn topk_row(row: &[f32], out: &mut [u32], scratch: &mut Vec<u32>) {
    let k = out.len();
    if k == 0 {
        return;
    }
    scratch.clear();
    if k > SMALL_K || !topk_scan(row, k, scratch) {
        let before =
            |a: &u32, b: &u32| rank_key(row[*b as usize]).total_cmp(&rank_key(row[*a as usize])).then(a.cmp(b));
        scratch.clear();
        scratch.extend(0..row.len() as u32);
        if k < row.len() {
            scratch.select_nth_unstable_by(k, before);
        }
        scratch.truncate(k);
        scratch.sort_unstable_by(before);
    }
    out.copy_from_slice(scratch);
}

/// Small-k topk: one pass keeping the best k indices in order. Blocks of 16 whose values
/// are all `≤` the current k-th are skipped with one branch (NaN is never `≤`, so it is
/// always looked at); a later index never beats an equal value already kept. Gives up
/// (returns false) once insertions would cost more than a selection (`inserts·k > 8·N`).
fn topk_scan(row: &[f32], k: usize, kept: &mut Vec<u32>) -> bool {
    let budget = 8 * row.len() / k;
    let mut inserts = 0usize;
    // Inserts index i if it is among the best k so far; returns whether it did.
    let insert = |kept: &mut Vec<u32>, i: usize| {
        let key = rank_key(row[i]);
        if kept.len() == k && key.total_cmp(&rank_key(row[kept[k - 1] as usize])).is_le() {
            return false;
        }
        let at = kept.partition_point(|&j| rank_key(row[j as usize]).total_cmp(&key).is_ge());
        if kept.len() == k {
            kept.pop();
        }
        kept.insert(at, i as u32);
        true
    };
    let first = k.min(row.len());
    for i in 0..first {
        insert(kept, i);
    }
    let mut threshold = rank_key(row[kept[kept.len() - 1] as usize]);
    for (b, block) in row[first..].chunks(16).enumerate() {
        // `partial_cmp` is `Some(Less | Equal)` exactly when v ≤ threshold; NaN gives `None`.
        let any_above = block.iter().fold(false, |hit, &v| hit | v.partial_cmp(&threshold).is_none_or(|o| o.is_gt()));
        if any_above {
            let base = first + b * 16;
            for i in base..base + block.len() {
                inserts += usize::from(insert(kept, i));
            }
            threshold = rank_key(row[kept[k - 1] as usize]);
            if inserts > budget + k {
                return false;
            }
        }
    }
    true
}

/// The `k` largest values along the last dim, in descending order (ties: lower index
/// first), with their indices.
///
/// # Shapes
/// `x`: `[..., N]` float, `k ≤ N` → values `[..., k]` (x's dtype), indices `[..., k]` U32.
pub fn topk(cpu: &CpuBackend, x: &Tensor, k: usize) -> Result<TopK> {
    const OP: &str = "topk";
    let spec::reduce::TopkSpec { rows, n, k, out_dims: dims, .. } = spec::reduce::topk(x, k)?;
    let data = f32_data(OP, "x", x)?;
    let mut indices = vec![0u32; rows * k];
    let rows_per_chunk = (4096 / n.max(1)).max(1);
    cpu.for_each_chunk(&mut indices, rows_per_chunk * k, n.div_ceil(k.max(1)), |c, chunk| {
        let mut scratch = Vec::new();
        for (r, out) in chunk.chunks_exact_mut(k).enumerate() {
            let row = c * rows_per_chunk + r;
            topk_row(&data[row * n..(row + 1) * n], out, &mut scratch);
        }
    });
    let values: Vec<f32> = indices.iter().enumerate().map(|(i, &j)| data[(i / k.max(1)) * n + j as usize]).collect();
    Ok(TopK { values: from_f32(values, dims.clone(), x.dtype())?, indices: Tensor::from_vec(indices, dims)? })
}

/// Gradient of `max` along `axis`: `d_out` routed to the first arg-max, zeros elsewhere.
///
/// # Shapes
/// `x`: any float; `d_out`: x's shape without `axis`, x's dtype → like x.
pub fn max_backward(cpu: &CpuBackend, x: &Tensor, d_out: &Tensor, axis: usize) -> Result<Tensor> {
    const OP: &str = "max_backward";
    let s = Split::of(&spec::reduce::max_backward(x, d_out, axis)?);
    let data = f32_data(OP, "x", x)?;
    let dy = f32_data(OP, "d_out", d_out)?;
    let arg = argmax_indices(cpu, &data, s);
    let mut dx = Tensor::zeros(x.shape().clone(), DType::F32)?;
    // Output block o (n·inner elements) receives d_out[o, i] at row arg[o, i], column i.
    cpu.for_each_chunk(dx.as_mut_slice::<f32>()?, (s.n * s.inner).max(1), 1, |o, block| {
        for i in 0..s.inner {
            let p = o * s.inner + i;
            block[arg[p] as usize * s.inner + i] = dy[p];
        }
    });
    if x.dtype() == DType::F32 {
        return Ok(dx);
    }
    Tensor::from_f32_as(dx.as_slice::<f32>()?, x.shape().clone(), x.dtype())
}

/// Sums a broadcast gradient back to `shape` (numpy rules: leading dims summed away,
/// size-1 dims summed and kept). Each summed run of axes the spec finds is one strided
/// reduction.
///
/// # Shapes
/// `x`: float, a shape that `shape` broadcasts to → `shape`, x's dtype.
pub fn sum_to_shape(cpu: &CpuBackend, x: &Tensor, shape: &Shape) -> Result<Tensor> {
    const OP: &str = "sum_to_shape";
    let spec::reduce::SumToShapeSpec { runs, .. } = spec::reduce::sum_to_shape(x, shape)?;
    let data = f32_data(OP, "x", x)?;
    let mut current: Vec<f32> = Vec::new();
    let mut reduced = false;
    let mut sizes: Vec<usize> = runs.iter().map(|r| r.0).collect();
    for g in (0..runs.len()).rev().filter(|&g| runs[g].1) {
        let s = Split { outer: sizes[..g].iter().product(), n: sizes[g], inner: sizes[g + 1..].iter().product() };
        current = reduce(cpu, if reduced { &current } else { &data }, s, Kind::Sum, &[]);
        reduced = true;
        sizes[g] = 1;
    }
    let out = if reduced { current } else { data.into_owned() };
    from_f32(out, shape.clone(), x.dtype())
}
