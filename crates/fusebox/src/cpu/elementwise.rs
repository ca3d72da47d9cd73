//! Elementwise kernels: same-shape arithmetic, scalar forms, row and column broadcasts,
//! the fused `add3` / `exp_mul` / `sub_mul` / `add_scaled`, unary maths, and the
//! in-place forms.
//!
//! Every op is one line over a few generic drivers. A driver validates its inputs, then
//! walks the output in fixed chunks of `CHUNK` elements (in the pool when the work is
//! large; split by index, so results never depend on scheduling) and hands each chunk to
//! a lane-wise loop compiled per ISA, with the op's closure inlined into it. F32 data is
//! read and written where it lies; F16/BF16 data goes through a stack tile of `TILE`
//! f32 values per step, so no whole-tensor f32 copy is ever made.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::cpu::output::{self, Dst};
use crate::cpu::simd::{fast_exp, Isa};
use crate::cpu::{convert, CpuBackend};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec::elementwise as spec;
use crate::tensor::Tensor;

/// Elements per parallel task (64 KiB of f32): big enough to amortise scheduling.
const CHUNK: usize = 1 << 14;
/// F16/BF16 elements converted to f32 per step, through a stack buffer.
const TILE: usize = 512;

/// Relative cost per element, for the pool's serial-or-parallel decision.
const CHEAP: usize = 1;
/// `fast_exp`: a polynomial, vectorized.
const EXP_COST: usize = 4;
/// `ln`, `powf`: scalar libm calls.
const LIBM_COST: usize = 16;

/// Defines a generic lane-wise loop compiled for AVX-512, AVX2+FMA and the portable
/// baseline, dispatching on [`Isa::active`]: the generic counterpart of
/// `simd::multiversion!`. The body is expanded into each version, so the op closure and
/// the closures inside the body are vectorized for that ISA. Generic parameters go in square brackets.
macro_rules! lanewise {
    ($(#[$meta:meta])* fn $name:ident[$($gen:tt)*]($($arg:ident: $ty:ty),*) $body:block) => {
        $(#[$meta])*
        #[inline]
        fn $name<$($gen)*>($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                fn v4<$($gen)*>($($arg: $ty),*) $body
                #[target_feature(enable = "avx2,fma")]
                fn v3<$($gen)*>($($arg: $ty),*) $body
                match Isa::active() {
                    // SAFETY: the active ISA is available on this CPU (see `simd`).
                    Isa::Avx512 => return unsafe { v4($($arg),*) },
                    // SAFETY: as above.
                    Isa::Avx2 => return unsafe { v3($($arg),*) },
                    Isa::Scalar => {}
                }
            }
            $body
        }
    };
}

lanewise! {
    /// Piece `out` (flat elements `start..`) of `f(x)`.
    fn map1[F: Fn(f32) -> f32](out: Dst<'_>, start: usize, x: Src<'_>, f: F) {
        let mut tx = [0.0; output::TILE];
        // SAFETY: `x.get` returns the tile's length, so every slot is written.
        unsafe {
            out.write(#[inline(always)] |s, tile| {
                let xv = x.get(start + s, tile.len(), &mut tx);
                for (o, &x) in tile.iter_mut().zip(xv) {
                    o.write(f(x));
                }
            })
        }
    }
}

lanewise! {
    /// Piece `out` (flat elements `start..`) of `f(a, b)`.
    fn map2[F: Fn(f32, f32) -> f32](out: Dst<'_>, start: usize, a: Src<'_>, b: Src<'_>, f: F) {
        let (mut ta, mut tb) = ([0.0; output::TILE], [0.0; output::TILE]);
        // SAFETY: `get` returns the tile's length, so every slot is written.
        unsafe {
            out.write(#[inline(always)] |s, tile| {
                let n = tile.len();
                let (av, bv) = (a.get(start + s, n, &mut ta), b.get(start + s, n, &mut tb));
                for ((o, &a), &b) in tile.iter_mut().zip(av).zip(bv) {
                    o.write(f(a, b));
                }
            })
        }
    }
}

lanewise! {
    /// Piece `out` (flat elements `start..`) of `f(a, b, c)`.
    fn map3[F: Fn(f32, f32, f32) -> f32](out: Dst<'_>, start: usize, a: Src<'_>, b: Src<'_>, c: Src<'_>, f: F) {
        let (mut ta, mut tb, mut tc) = ([0.0; output::TILE], [0.0; output::TILE], [0.0; output::TILE]);
        // SAFETY: `get` returns the tile's length, so every slot is written.
        unsafe {
            out.write(#[inline(always)] |s, tile| {
                let n = tile.len();
                let (av, bv, cv) =
                    (a.get(start + s, n, &mut ta), b.get(start + s, n, &mut tb), c.get(start + s, n, &mut tc));
                for (((o, &a), &b), &c) in tile.iter_mut().zip(av).zip(bv).zip(cv) {
                    o.write(f(a, b, c));
                }
            })
        }
    }
}

lanewise! {
    /// `v[i] ← f(v[i])`.
    fn update1[F: Fn(f32) -> f32](v: &mut [f32], f: F) {
        for v in v.iter_mut() {
            *v = f(*v);
        }
    }
}

lanewise! {
    /// `v[i] ← f(v[i], b[i])`.
    fn update2[F: Fn(f32, f32) -> f32](v: &mut [f32], b: &[f32], f: F) {
        for (v, &b) in v.iter_mut().zip(b) {
            *v = f(*v, b);
        }
    }
}

lanewise! {
    /// Row broadcast: piece `out` (flat elements `start..`) of a matrix with `row.len()`
    /// columns, `out[k] = f(x[k], row[(start + k) % n])`.
    fn map_rows[F: Fn(f32, f32) -> f32](out: Dst<'_>, start: usize, x: Src<'_>, row: &[f32], f: F) {
        let mut tx = [0.0; output::TILE];
        // SAFETY: the row segments cover the whole tile, so every slot is written.
        unsafe {
            out.write(#[inline(always)] |s, tile| {
                let xv = x.get(start + s, tile.len(), &mut tx);
                for (off, _, j, len) in row_segments(start + s, tile.len(), row.len()) {
                    let (o, x) = (&mut tile[off..off + len], &xv[off..off + len]);
                    for ((o, &x), &r) in o.iter_mut().zip(x).zip(&row[j..j + len]) {
                        o.write(f(x, r));
                    }
                }
            })
        }
    }
}

lanewise! {
    /// Column broadcast: piece `out` (flat elements `start..`) of a matrix with `n`
    /// columns, `out[k] = f(x[k], col[(start + k) / n])`.
    fn map_cols[F: Fn(f32, f32) -> f32](out: Dst<'_>, start: usize, x: Src<'_>, col: &[f32], n: usize, f: F) {
        let mut tx = [0.0; output::TILE];
        // SAFETY: the row segments cover the whole tile, so every slot is written.
        unsafe {
            out.write(#[inline(always)] |s, tile| {
                let xv = x.get(start + s, tile.len(), &mut tx);
                for (off, r, _, len) in row_segments(start + s, tile.len(), n) {
                    let c = col[r];
                    for (o, &x) in tile[off..off + len].iter_mut().zip(&xv[off..off + len]) {
                        o.write(f(x, c));
                    }
                }
            })
        }
    }
}

/// Splits flat elements `start..start + len` of a matrix with `n` columns at row ends,
/// yielding `(offset from start, row, first column, length)` per piece.
#[inline(always)]
fn row_segments(start: usize, len: usize, n: usize) -> impl Iterator<Item = (usize, usize, usize, usize)> {
    let mut off = 0;
    std::iter::from_fn(move || {
        if off >= len || n == 0 {
            return None;
        }
        let i = start + off;
        let (r, j) = (i / n, i % n);
        let seg = (n - j).min(len - off);
        let piece = (off, r, j, seg);
        off += seg;
        Some(piece)
    })
}

/// A float input read as f32 one piece at a time: F32 data is borrowed, F16/BF16
/// converted into the caller's stack tile.
#[derive(Clone, Copy)]
enum Src<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

impl<'a> Src<'a> {
    fn new(op: &'static str, what: &str, t: &'a Tensor) -> Result<Src<'a>> {
        Ok(match t.dtype() {
            DType::F32 => Src::F32(t.as_slice()?),
            DType::F16 => Src::F16(t.as_slice()?),
            DType::BF16 => Src::BF16(t.as_slice()?),
            other => return Err(Error::dtype(op, what, "f32, f16 or bf16", other)),
        })
    }

    /// Elements `start..start + len` as f32 (F16/BF16 converted into `tile`, which must
    /// hold `len`: pieces are at most `TILE` long in [`drive`], `output::TILE` in [`produce`]).
    #[inline]
    fn get<'b>(self, start: usize, len: usize, tile: &'b mut [f32]) -> &'b [f32]
    where
        'a: 'b,
    {
        match self {
            Src::F32(s) => &s[start..start + len],
            Src::F16(s) => {
                s[start..start + len].convert_to_f32_slice(&mut tile[..len]);
                &tile[..len]
            }
            Src::BF16(s) => {
                s[start..start + len].convert_to_f32_slice(&mut tile[..len]);
                &tile[..len]
            }
        }
    }
}

/// Runs `f(start, values)` over all of `dst` in pieces, in parallel when
/// `elements · cost` is large. `values` holds elements `start..start + values.len()` as
/// f32 and is stored back afterwards: F32 pieces are the tensor's memory (a whole
/// chunk), F16/BF16 pieces a converted stack tile.
fn drive(
    cpu: &CpuBackend,
    op: &'static str,
    dst: &mut Tensor,
    cost: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) -> Result<()> {
    match dst.dtype() {
        DType::F32 => cpu.for_each_chunk(dst.as_mut_slice::<f32>()?, CHUNK, cost, |c, v| f(c * CHUNK, v)),
        DType::F16 => drive_half(cpu, dst.as_mut_slice::<f16>()?, cost, &f),
        DType::BF16 => drive_half(cpu, dst.as_mut_slice::<bf16>()?, cost, &f),
        other => return Err(Error::dtype(op, "output", "f32, f16 or bf16", other)),
    }
    Ok(())
}

/// [`drive`] for F16/BF16 data: each chunk converted through a stack tile.
fn drive_half<H: Send>(cpu: &CpuBackend, data: &mut [H], cost: usize, f: &(impl Fn(usize, &mut [f32]) + Sync))
where
    [H]: HalfFloatSliceExt,
{
    cpu.for_each_chunk(data, CHUNK, cost, |c, chunk| {
        let mut tile = [0.0f32; TILE];
        for (t, half) in chunk.chunks_mut(TILE).enumerate() {
            let values = &mut tile[..half.len()];
            half.convert_to_f32_slice(values);
            f(c * CHUNK + t * TILE, values);
            half.convert_from_f32_slice(values);
        }
    });
}

/// A new tensor of `like`'s shape and dtype, written by `f(start, piece)` for its pieces
/// of `CHUNK` elements (one task each; see [`output::Dst`]: no zero-fill pass, streaming
/// stores beyond the caches, F16/BF16 rounded on store).
fn produce(
    cpu: &CpuBackend,
    op: &'static str,
    like: &Tensor,
    cost: usize,
    f: impl Fn(usize, Dst<'_>) + Sync + Send,
) -> Result<Tensor> {
    output::fresh_tensor(cpu, op, like.shape(), like.dtype(), CHUNK, cost, |c, dst| f(c * CHUNK, dst))
}

/// `out = f(x)` elementwise, any shape.
fn unary(
    cpu: &CpuBackend,
    op: &'static str,
    x: &Tensor,
    cost: usize,
    f: impl Fn(f32) -> f32 + Copy + Sync + Send,
) -> Result<Tensor> {
    spec::same(op, &[("x", x)])?;
    let xs = Src::new(op, "x", x)?;
    produce(cpu, op, x, cost, |start, out| map1(out, start, xs, f))
}

/// `x ← f(x)` in place; `x` must be writable.
fn unary_inplace(
    cpu: &CpuBackend,
    op: &'static str,
    x: &mut Tensor,
    cost: usize,
    f: impl Fn(f32) -> f32 + Copy + Sync + Send,
) -> Result<()> {
    x.ensure_writable(op)?;
    spec::same(op, &[("x", x)])?;
    drive(cpu, op, x, cost, |_, values| update1(values, f))
}

/// `out = f(a, b)` elementwise over equal shapes and dtypes.
fn binary(
    cpu: &CpuBackend,
    op: &'static str,
    a: &Tensor,
    b: &Tensor,
    cost: usize,
    f: impl Fn(f32, f32) -> f32 + Copy + Sync + Send,
) -> Result<Tensor> {
    spec::same(op, &[("a", a), ("b", b)])?;
    let (sa, sb) = (Src::new(op, "a", a)?, Src::new(op, "b", b)?);
    produce(cpu, op, a, cost, |start, out| map2(out, start, sa, sb, f))
}

/// `a ← f(a, b)` in place over equal shapes and dtypes; `a` must be writable.
fn binary_inplace(
    cpu: &CpuBackend,
    op: &'static str,
    a: &mut Tensor,
    b: &Tensor,
    f: impl Fn(f32, f32) -> f32 + Copy + Sync + Send,
) -> Result<()> {
    a.ensure_writable(op)?;
    spec::same(op, &[("a", a), ("b", b)])?;
    let sb = Src::new(op, "b", b)?;
    drive(cpu, op, a, CHEAP, |start, values| {
        let mut tb = [0.0; TILE];
        let n = values.len();
        update2(values, sb.get(start, n, &mut tb), f)
    })
}

/// `out = f(a, b, c)` elementwise over equal shapes and dtypes.
fn ternary(
    cpu: &CpuBackend,
    op: &'static str,
    (a, b, c): (&Tensor, &Tensor, &Tensor),
    f: impl Fn(f32, f32, f32) -> f32 + Copy + Sync + Send,
) -> Result<Tensor> {
    spec::same(op, &[("a", a), ("b", b), ("c", c)])?;
    let (sa, sb, sc) = (Src::new(op, "a", a)?, Src::new(op, "b", b)?, Src::new(op, "c", c)?);
    produce(cpu, op, a, CHEAP, |start, out| map3(out, start, sa, sb, sc, f))
}

/// `out[..., j] = f(x[..., j], row[j])` for x `[..., N]` and row `[N]`.
fn row_broadcast(
    cpu: &CpuBackend,
    op: &'static str,
    x: &Tensor,
    row: &Tensor,
    f: impl Fn(f32, f32) -> f32 + Copy + Sync + Send,
) -> Result<Tensor> {
    spec::row_broadcast(op, x, row)?;
    let xs = Src::new(op, "x", x)?;
    // The row is short: read it as f32 once.
    let row = convert::f32_data(op, "row", row)?;
    produce(cpu, op, x, CHEAP, |start, out| map_rows(out, start, xs, &row, f))
}

/// `out[i, j] = f(x[i, j], col[i])` for x `[..., N]` with M rows and col `[M]` or
/// x's shape without its last dim.
fn col_broadcast(
    cpu: &CpuBackend,
    op: &'static str,
    x: &Tensor,
    col: &Tensor,
    f: impl Fn(f32, f32) -> f32 + Copy + Sync + Send,
) -> Result<Tensor> {
    let n = spec::col_broadcast(op, x, col)?.n;
    let xs = Src::new(op, "x", x)?;
    // One value per row: read it as f32 once.
    let col = convert::f32_data(op, "col", col)?;
    produce(cpu, op, x, CHEAP, |start, out| map_cols(out, start, xs, &col, n, f))
}

/// `min(max(x, lo), hi)`, written with comparisons so a NaN `x` stays NaN.
#[inline(always)]
fn clamp_value(x: f32, lo: f32, hi: f32) -> f32 {
    if x < lo {
        lo
    } else if x > hi {
        hi
    } else {
        x
    }
}

/// `a + b`, elementwise.
pub fn add(cpu: &CpuBackend, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(cpu, "add", a, b, CHEAP, |x, y| x + y)
}

/// `a + s`.
pub fn add_scalar(cpu: &CpuBackend, a: &Tensor, s: f32) -> Result<Tensor> {
    unary(cpu, "add_scalar", a, CHEAP, move |x| x + s)
}

/// `a ← a + b`, in place.
pub fn add_assign(cpu: &CpuBackend, a: &mut Tensor, b: &Tensor) -> Result<()> {
    binary_inplace(cpu, "add_assign", a, b, |x, y| x + y)
}

/// `x[..., j] + row[j]`.
pub fn add_row(cpu: &CpuBackend, x: &Tensor, row: &Tensor) -> Result<Tensor> {
    row_broadcast(cpu, "add_row", x, row, |x, r| x + r)
}

/// `x[i, j] + col[i]`.
pub fn add_col(cpu: &CpuBackend, x: &Tensor, col: &Tensor) -> Result<Tensor> {
    col_broadcast(cpu, "add_col", x, col, |x, c| x + c)
}

/// `a − b`, elementwise.
pub fn sub(cpu: &CpuBackend, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(cpu, "sub", a, b, CHEAP, |x, y| x - y)
}

/// `a − s`.
pub fn sub_scalar(cpu: &CpuBackend, a: &Tensor, s: f32) -> Result<Tensor> {
    unary(cpu, "sub_scalar", a, CHEAP, move |x| x - s)
}

/// `a ← a − b`, in place.
pub fn sub_assign(cpu: &CpuBackend, a: &mut Tensor, b: &Tensor) -> Result<()> {
    binary_inplace(cpu, "sub_assign", a, b, |x, y| x - y)
}

/// `x[..., j] − row[j]`.
pub fn sub_row(cpu: &CpuBackend, x: &Tensor, row: &Tensor) -> Result<Tensor> {
    row_broadcast(cpu, "sub_row", x, row, |x, r| x - r)
}

/// `x[i, j] − col[i]`.
pub fn sub_col(cpu: &CpuBackend, x: &Tensor, col: &Tensor) -> Result<Tensor> {
    col_broadcast(cpu, "sub_col", x, col, |x, c| x - c)
}

/// `a · b`, elementwise.
pub fn mul(cpu: &CpuBackend, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(cpu, "mul", a, b, CHEAP, |x, y| x * y)
}

/// `a · s`.
pub fn mul_scalar(cpu: &CpuBackend, a: &Tensor, s: f32) -> Result<Tensor> {
    unary(cpu, "mul_scalar", a, CHEAP, move |x| x * s)
}

/// `a ← a · b`, in place.
pub fn mul_assign(cpu: &CpuBackend, a: &mut Tensor, b: &Tensor) -> Result<()> {
    binary_inplace(cpu, "mul_assign", a, b, |x, y| x * y)
}

/// `x[..., j] · row[j]`.
pub fn mul_row(cpu: &CpuBackend, x: &Tensor, row: &Tensor) -> Result<Tensor> {
    row_broadcast(cpu, "mul_row", x, row, |x, r| x * r)
}

/// `x[i, j] · col[i]`.
pub fn mul_col(cpu: &CpuBackend, x: &Tensor, col: &Tensor) -> Result<Tensor> {
    col_broadcast(cpu, "mul_col", x, col, |x, c| x * c)
}

/// `a / b`, elementwise.
pub fn div(cpu: &CpuBackend, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(cpu, "div", a, b, CHEAP, |x, y| x / y)
}

/// `a / s` (a true division, not a multiplication by `1/s`).
pub fn div_scalar(cpu: &CpuBackend, a: &Tensor, s: f32) -> Result<Tensor> {
    unary(cpu, "div_scalar", a, CHEAP, move |x| x / s)
}

/// `a ← a / b`, in place.
pub fn div_assign(cpu: &CpuBackend, a: &mut Tensor, b: &Tensor) -> Result<()> {
    binary_inplace(cpu, "div_assign", a, b, |x, y| x / y)
}

/// `x[..., j] / row[j]`.
pub fn div_row(cpu: &CpuBackend, x: &Tensor, row: &Tensor) -> Result<Tensor> {
    row_broadcast(cpu, "div_row", x, row, |x, r| x / r)
}

/// `x[i, j] / col[i]`.
pub fn div_col(cpu: &CpuBackend, x: &Tensor, col: &Tensor) -> Result<Tensor> {
    col_broadcast(cpu, "div_col", x, col, |x, c| x / c)
}

/// `a + b + c` (summed left to right in f32).
pub fn add3(cpu: &CpuBackend, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<Tensor> {
    ternary(cpu, "add3", (a, b, c), |a, b, c| a + b + c)
}

/// `x · exp(y)`.
pub fn exp_mul(cpu: &CpuBackend, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    binary(cpu, "exp_mul", x, y, EXP_COST, |x, y| x * fast_exp::<false>(y))
}

/// `(a − b) · c`.
pub fn sub_mul(cpu: &CpuBackend, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<Tensor> {
    ternary(cpu, "sub_mul", (a, b, c), |a, b, c| (a - b) * c)
}

/// `a + b · c` with a scalar `c` (separate multiply and add: no fused rounding, so every
/// ISA gives the same bits).
pub fn add_scaled(cpu: &CpuBackend, a: &Tensor, b: &Tensor, c: f32) -> Result<Tensor> {
    binary(cpu, "add_scaled", a, b, CHEAP, move |x, y| x + y * c)
}

/// `exp(x)` (by [`fast_exp`], about 2 ulp).
pub fn exp(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    unary(cpu, "exp", x, EXP_COST, fast_exp::<false>)
}

/// `x ← exp(x)`, in place.
pub fn exp_inplace(cpu: &CpuBackend, x: &mut Tensor) -> Result<()> {
    unary_inplace(cpu, "exp_inplace", x, EXP_COST, fast_exp::<false>)
}

/// `ln(x)` (NaN for x < 0, −∞ at 0).
pub fn log(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    unary(cpu, "log", x, LIBM_COST, f32::ln)
}

/// `x ← ln(x)`, in place.
pub fn log_inplace(cpu: &CpuBackend, x: &mut Tensor) -> Result<()> {
    unary_inplace(cpu, "log_inplace", x, LIBM_COST, f32::ln)
}

/// `√x` (NaN for x < 0).
pub fn sqrt(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    unary(cpu, "sqrt", x, CHEAP, f32::sqrt)
}

/// `x ← √x`, in place.
pub fn sqrt_inplace(cpu: &CpuBackend, x: &mut Tensor) -> Result<()> {
    unary_inplace(cpu, "sqrt_inplace", x, CHEAP, f32::sqrt)
}

/// `x^p` (`powf`; p = 1 and p = 2 take exact shortcuts that give the same bits).
pub fn pow(cpu: &CpuBackend, x: &Tensor, p: f32) -> Result<Tensor> {
    if p == 1.0 {
        unary(cpu, "pow", x, CHEAP, |v| v)
    } else if p == 2.0 {
        unary(cpu, "pow", x, CHEAP, |v| v * v)
    } else {
        unary(cpu, "pow", x, LIBM_COST, move |v| v.powf(p))
    }
}

/// `x ← x^p`, in place.
pub fn pow_inplace(cpu: &CpuBackend, x: &mut Tensor, p: f32) -> Result<()> {
    if p == 1.0 {
        unary_inplace(cpu, "pow_inplace", x, CHEAP, |v| v)
    } else if p == 2.0 {
        unary_inplace(cpu, "pow_inplace", x, CHEAP, |v| v * v)
    } else {
        unary_inplace(cpu, "pow_inplace", x, LIBM_COST, move |v| v.powf(p))
    }
}

/// `−x`.
pub fn neg(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    unary(cpu, "neg", x, CHEAP, |v| -v)
}

/// `x ← −x`, in place.
pub fn neg_inplace(cpu: &CpuBackend, x: &mut Tensor) -> Result<()> {
    unary_inplace(cpu, "neg_inplace", x, CHEAP, |v| -v)
}

/// `|x|`.
pub fn abs(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    unary(cpu, "abs", x, CHEAP, f32::abs)
}

/// `x ← |x|`, in place.
pub fn abs_inplace(cpu: &CpuBackend, x: &mut Tensor) -> Result<()> {
    unary_inplace(cpu, "abs_inplace", x, CHEAP, f32::abs)
}

/// `min(max(x, lo), hi)`; `lo > hi` or a NaN bound is an error, a NaN `x` stays NaN.
pub fn clamp(cpu: &CpuBackend, x: &Tensor, lo: f32, hi: f32) -> Result<Tensor> {
    spec::clamp_bounds("clamp", lo, hi)?;
    unary(cpu, "clamp", x, CHEAP, move |v| clamp_value(v, lo, hi))
}

/// `x ← min(max(x, lo), hi)`, in place.
pub fn clamp_inplace(cpu: &CpuBackend, x: &mut Tensor, lo: f32, hi: f32) -> Result<()> {
    spec::clamp_bounds("clamp_inplace", lo, hi)?;
    unary_inplace(cpu, "clamp_inplace", x, CHEAP, move |v| clamp_value(v, lo, hi))
}
