//! Elementwise activations and their backwards.
//!
//! Every op reads its inputs as f32 (F16/BF16 converted once), runs a per-ISA kernel
//! over 16-lane chunks (`multiversion!`, exp through [`fast_exp`]), splits large
//! tensors into fixed chunks across the pool, and writes the result in the input
//! dtype. Backwards take the forward's input `x` and recompute what they need.
//!
//! Accuracy of the scalar maths (f32, against exact values):
//! - `σ(x) = 1/(1 + e^−x)`: a few ulp (fast_exp is ~2 ulp), exact 0/1 in the tails.
//! - `tanh`: odd Taylor series to x¹¹ for |x| < 0.3 (truncation < 1e-8 relative), else
//!   `(1 − e^−2|x|)/(1 + e^−2|x|)` with the sign restored (no cancellation there).
//! - `erfc` (GELU erf form): the Chebyshev fit of Numerical Recipes (`erfcc`),
//!   fractional error < 1.2e-7 everywhere, so `erf` and `Φ` are within ~2.5e-7 absolute.
//! - `ln(1 + u)` for `u ∈ [0, 1]` (softplus): `2·atanh(u/(2 + u))` by its odd series to
//!   the 15th power (truncation < 3e-9 relative), so tiny `u` keep full relative precision.

use std::borrow::Cow;

use crate::cpu::output::{self, Dst, OutputSpec};
use crate::cpu::simd::{fast_exp, multiversion, prefetch, stream_ahead, FAR_AHEAD};
use crate::cpu::{convert, CpuBackend};
use crate::error::Result;
use crate::spec::elementwise as spec;
use crate::tensor::Tensor;
use crate::types::{GeluForm, PairGradients};

/// Lanes of the kernels' inner loops (one AVX-512 register, two AVX2 ones).
const LANES: usize = 16;
/// Work units per element for the threading threshold: ops with an exp cost several plain ops.
const EXP_WORK: usize = 4;
/// Work units per element of the cheap ops (relu and its backward).
const CHEAP_WORK: usize = 1;

/// √(2/π), the GELU tanh form's scale.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic coefficient of the GELU tanh form.
const GELU_CUBIC: f32 = 0.044_715;

// ───────────────────────────── scalar maths (inlined into lanes) ─────────────────────────────

/// `σ(x) = 1/(1 + e^−x)`; `e^−x` overflowing to +∞ gives exactly 0.
#[inline(always)]
pub(crate) fn sigmoid1<const FMA: bool>(x: f32) -> f32 {
    1.0 / (1.0 + fast_exp::<FMA>(-x))
}

/// `tanh(x)`, branch-free: a short Taylor series near 0 (where `1 − e^−2|x|` would cancel),
/// the exp form elsewhere.
#[inline(always)]
fn tanh1<const FMA: bool>(x: f32) -> f32 {
    let a = x.abs();
    let e = fast_exp::<FMA>(-2.0 * a);
    let far = ((1.0 - e) / (1.0 + e)).copysign(x);
    // tanh x = x − x³/3 + 2x⁵/15 − 17x⁷/315 + 62x⁹/2835 − 1382x¹¹/155925 + …
    let x2 = x * x;
    let near = x
        * (1.0
            + x2 * (-1.0 / 3.0
                + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0 + x2 * (62.0 / 2835.0 + x2 * (-1382.0 / 155_925.0))))));
    if a < 0.3 {
        near
    } else {
        far
    }
}

/// `erfc(x)` (Numerical Recipes `erfcc`, fractional error < 1.2e-7): `t·exp(−z² + P(t))`,
/// `t = 1/(1 + z/2)`, `z = |x|`, reflected with `erfc(−z) = 2 − erfc(z)`.
#[inline(always)]
fn erfc1<const FMA: bool>(x: f32) -> f32 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_204 + t * (1.488_515_9 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * fast_exp::<FMA>(-z * z + p);
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// `Φ(x) = ½·erfc(−x/√2)`, the standard normal CDF (accurate in both tails).
#[inline(always)]
fn normal_cdf1<const FMA: bool>(x: f32) -> f32 {
    0.5 * erfc1::<FMA>(-x * std::f32::consts::FRAC_1_SQRT_2)
}

/// `φ(x) = e^(−x²/2)/√(2π)`, the standard normal density.
#[inline(always)]
fn normal_pdf1<const FMA: bool>(x: f32) -> f32 {
    const INV_SQRT_2PI: f32 = 0.398_942_3;
    INV_SQRT_2PI * fast_exp::<FMA>(-0.5 * x * x)
}

/// `ln(1 + u)` for `u ∈ [0, 1]`: `2·atanh(s)`, `s = u/(2 + u) ≤ 1/3`, by the odd series.
#[inline(always)]
fn ln_1p_unit(u: f32) -> f32 {
    let s = u / (2.0 + u);
    let s2 = s * s;
    let series = 1.0
        + s2 * (1.0 / 3.0
            + s2 * (1.0 / 5.0
                + s2 * (1.0 / 7.0 + s2 * (1.0 / 9.0 + s2 * (1.0 / 11.0 + s2 * (1.0 / 13.0 + s2 * (1.0 / 15.0)))))));
    2.0 * s * series
}

/// `gelu(x)` tanh form: `½x(1 + tanh u) = x·σ(2u)`, `u = √(2/π)(x + 0.044715x³)`; the σ form
/// does not cancel for large negative x.
#[inline(always)]
fn gelu_tanh1<const FMA: bool>(x: f32) -> f32 {
    let u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
    x * sigmoid1::<FMA>(2.0 * u)
}

/// `gelu'(x)` tanh form: with `s = σ(2u)`, `d/dx x·s = s + 2x·s(1 − s)·u'`, `u' = √(2/π)(1 + 3·0.044715x²)`.
#[inline(always)]
fn gelu_tanh_grad1<const FMA: bool>(x: f32) -> f32 {
    gelu_tanh_and_grad1::<FMA>(x).1
}

/// `(gelu(x), gelu'(x))`, tanh form, sharing `s = σ(2u)`: `x·s` and `s + 2x·s(1 − s)·u'`.
#[inline(always)]
fn gelu_tanh_and_grad1<const FMA: bool>(x: f32) -> (f32, f32) {
    let u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
    let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x);
    let s = sigmoid1::<FMA>(2.0 * u);
    (x * s, s + 2.0 * x * s * (1.0 - s) * du)
}

/// `(gelu(x), gelu'(x))`, erf form: `x·Φ(x)` and `Φ(x) + x·φ(x)`.
#[inline(always)]
fn gelu_erf_and_grad1<const FMA: bool>(x: f32) -> (f32, f32) {
    let cdf = normal_cdf1::<FMA>(x);
    (x * cdf, cdf + x * normal_pdf1::<FMA>(x))
}

/// `(silu(x), silu'(x))` sharing `s = σ(x)`: `x·s` and `s·(1 + x·(1 − s))`.
#[inline(always)]
fn silu_and_grad1<const FMA: bool>(x: f32) -> (f32, f32) {
    let s = sigmoid1::<FMA>(x);
    (x * s, s * (1.0 + x * (1.0 - s)))
}

/// `softplus(x) = max(x, 0) + ln(1 + e^−|x|)`: equal to `max(x, ln(1 + e^min(x, 88)))` within
/// f32 rounding, without overflow, and exact in relative terms for very negative x.
#[inline(always)]
pub(crate) fn softplus1<const FMA: bool>(x: f32) -> f32 {
    let pos = if x > 0.0 { x } else { 0.0 };
    pos + ln_1p_unit(fast_exp::<FMA>(-x.abs()))
}

// ──────────────────────────────────── per-ISA kernels ────────────────────────────────────

/// Defines a multiversioned `$name(src, out)` writing `out[i] = f(src[i])` tile by tile,
/// over 16-lane chunks.
macro_rules! unary_kernel {
    ($name:ident, $doc:literal, |$x:ident| $e:expr) => {
        multiversion! {
            #[doc = $doc]
            pub fn $name(src: &[f32], out: Dst<'_>) {
                let own = out.in_place();
                // SAFETY: the chunks and their remainder cover every slot of the tile.
                unsafe { out.write(#[inline(always)] |start, tile| {
                    let src = &src[start..start + tile.len()];
                    let mut sc = src.chunks_exact(LANES);
                    let tp = tile.as_ptr().cast::<f32>();
                    let mut dc = tile.chunks_exact_mut(LANES);
                    for (i, (sv, dv)) in (&mut sc).zip(&mut dc).enumerate() {
                        if own {
                            stream_ahead([src], tp, i * LANES);
                        }
                        for l in 0..LANES {
                            let $x = sv[l];
                            dv[l].write($e);
                        }
                    }
                    for (&$x, d) in sc.remainder().iter().zip(dc.into_remainder()) {
                        d.write($e);
                    }
                }) }
            }
        }
    };
}

/// Defines a multiversioned `$name(a, b, out)` writing `out[i] = f(a[i], b[i])` tile by
/// tile, over 16-lane chunks.
macro_rules! binary_kernel {
    ($name:ident, $doc:literal, |$a:ident, $b:ident| $e:expr) => {
        multiversion! {
            #[doc = $doc]
            pub fn $name(a: &[f32], b: &[f32], out: Dst<'_>) {
                let own = out.in_place();
                // SAFETY: the chunks and their remainder cover every slot of the tile.
                unsafe { out.write(#[inline(always)] |start, tile| {
                    let range = start..start + tile.len();
                    let (ar, br) = (&a[range.clone()], &b[range.clone()]);
                    let mut ac = ar.chunks_exact(LANES);
                    let mut bc = br.chunks_exact(LANES);
                    let tp = tile.as_ptr().cast::<f32>();
                    let mut dc = tile.chunks_exact_mut(LANES);
                    for (i, ((av, bv), dv)) in (&mut ac).zip(&mut bc).zip(&mut dc).enumerate() {
                        if own {
                            stream_ahead([ar, br], tp, i * LANES);
                        }
                        for l in 0..LANES {
                            let ($a, $b) = (av[l], bv[l]);
                            dv[l].write($e);
                        }
                    }
                    for ((&$a, &$b), d) in ac.remainder().iter().zip(bc.remainder()).zip(dc.into_remainder()) {
                        d.write($e);
                    }
                }) }
            }
        }
    };
}

/// Defines a multiversioned `$name(gate, up, dy, d_gate, d_up, rest)` for a gated unit
/// `act(gate)·up` whose `$both(g)` gives `(act(g), act'(g))`: `d_gate = dy·up·act'(gate)`,
/// `d_up = dy·act(gate)`. `rest` (the three inputs from this piece's start to their ends)
/// is prefetched far ahead when the outputs stream (`simd::prefetch_far`), not when they
/// stay in cache, whatever their size (unlike `Dst::ahead`): with cached outputs they only
/// slowed it down.
macro_rules! gated_grad_kernel {
    ($name:ident, $doc:literal, $both:ident) => {
        multiversion! {
            #[doc = $doc]
            pub fn $name(gate: &[f32], up: &[f32], dy: &[f32], d_gate: Dst<'_>, d_up: Dst<'_>, rest: [&[f32]; 3]) {
                let rest = if d_gate.streams() { rest } else { [&[][..]; 3] };
                // SAFETY: the loop writes every slot of both tiles.
                unsafe { d_gate.write_pair(d_up, #[inline(always)] |start, dg, du| {
                    let n = dg.len();
                    let (gate, up, dy) = (&gate[start..start + n], &up[start..start + n], &dy[start..start + n]);
                    let du = &mut du[..n];
                    // The lines FAR_AHEAD past this tile (4 lines when streamed), before the
                    // loop: a test inside it cost the loop its vectorization.
                    for r in rest {
                        prefetch(r, start + FAR_AHEAD, n);
                    }
                    for i in 0..n {
                        let (g, u, d) = (gate[i], up[i], dy[i]);
                        let (act, grad) = $both::<FMA>(g);
                        dg[i].write(d * u * grad);
                        du[i].write(d * act);
                    }
                }) }
            }
        }
    };
}

/// The kernels: `pub` only because `multiversion!` defines `pub fn`s; the module is private.
mod lanes {
    use super::*;

    unary_kernel!(silu, "`x·σ(x)`", |x| x * sigmoid1::<FMA>(x));
    unary_kernel!(sigmoid, "`σ(x)`", |x| sigmoid1::<FMA>(x));
    unary_kernel!(tanh, "`tanh(x)`", |x| tanh1::<FMA>(x));
    unary_kernel!(relu, "`max(x, 0)` (NaN stays NaN)", |x| if x < 0.0 { 0.0 } else { x });
    unary_kernel!(gelu_tanh, "GELU, tanh form", |x| gelu_tanh1::<FMA>(x));
    unary_kernel!(gelu_erf, "GELU, erf form: `x·Φ(x)`", |x| x * normal_cdf1::<FMA>(x));
    unary_kernel!(softplus, "`max(x, 0) + ln(1 + e^−|x|)`", |x| softplus1::<FMA>(x));

    binary_kernel!(silu_grad, "`dy·σ(x)·(1 + x·(1 − σ(x)))`", |x, dy| {
        let s = sigmoid1::<FMA>(x);
        dy * s * (1.0 + x * (1.0 - s))
    });
    binary_kernel!(sigmoid_grad, "`dy·σ(x)·(1 − σ(x))`", |x, dy| {
        let s = sigmoid1::<FMA>(x);
        dy * s * (1.0 - s)
    });
    binary_kernel!(tanh_grad, "`dy·(1 − tanh²(x))`", |x, dy| {
        let t = tanh1::<FMA>(x);
        dy * (1.0 - t * t)
    });
    binary_kernel!(relu_grad, "`dy·[x > 0]`", |x, dy| if x > 0.0 { dy } else { 0.0 });
    binary_kernel!(gelu_tanh_grad, "`dy·gelu'(x)`, tanh form", |x, dy| dy * gelu_tanh_grad1::<FMA>(x));
    binary_kernel!(gelu_erf_grad, "`dy·(Φ(x) + x·φ(x))`, erf form", |x, dy| dy
        * (normal_cdf1::<FMA>(x) + x * normal_pdf1::<FMA>(x)));
    binary_kernel!(silu_mul, "`silu(gate)·up`", |g, u| g * sigmoid1::<FMA>(g) * u);
    binary_kernel!(gelu_tanh_mul, "`gelu(gate)·up`, tanh form", |g, u| gelu_tanh1::<FMA>(g) * u);
    binary_kernel!(gelu_erf_mul, "`gelu(gate)·up`, erf form", |g, u| g * normal_cdf1::<FMA>(g) * u);

    multiversion! {
        /// gpt-oss's clamped SwiGLU: `(u' + 1)·g'·σ(α·g')`, `g' = min(g, limit)`,
        /// `u' = clamp(u, −limit, limit)`.
        pub fn clamped_swiglu(gate: &[f32], up: &[f32], out: Dst<'_>, alpha: f32, limit: f32) {
            // SAFETY: the loop writes every slot of the tile.
            unsafe { out.write(#[inline(always)] |start, tile| {
                for (i, d) in tile.iter_mut().enumerate() {
                    let (g, u) = (gate[start + i].min(limit), up[start + i].clamp(-limit, limit));
                    d.write((u + 1.0) * g * sigmoid1::<FMA>(alpha * g));
                }
            }) }
        }
    }

    multiversion! {
        /// Backward of [`clamped_swiglu`]: with `s = σ(α·g')`, `d_gate = dy·(u' + 1)·(s + α·g'·s·(1 − s))`
        /// where `g ≤ limit` (0 above), `d_up = dy·g'·s` where `|u| ≤ limit` (0 outside):
        /// a clamp passes the gradient on its closed interval, as PyTorch's does.
        pub fn clamped_swiglu_grad(gate: &[f32], up: &[f32], dy: &[f32], d_gate: Dst<'_>, d_up: Dst<'_>, alpha: f32, limit: f32) {
            // SAFETY: the loop writes every slot of both tiles.
            unsafe { d_gate.write_pair(d_up, #[inline(always)] |start, dg, du| {
                for i in 0..dg.len() {
                    let (g, u, d) = (gate[start + i], up[start + i], dy[start + i]);
                    let (gc, uc) = (g.min(limit), u.clamp(-limit, limit));
                    let s = sigmoid1::<FMA>(alpha * gc);
                    let dg_val = if g <= limit { d * (uc + 1.0) * (s + alpha * gc * s * (1.0 - s)) } else { 0.0 };
                    let du_val = if (-limit..=limit).contains(&u) { d * gc * s } else { 0.0 };
                    dg[i].write(dg_val);
                    du[i].write(du_val);
                }
            }) }
        }
    }

    gated_grad_kernel!(silu_mul_grad, "`d_gate = dy·up·σ(g)(1 + g(1 − σ(g)))`, `d_up = dy·g·σ(g)`", silu_and_grad1);
    gated_grad_kernel!(
        gelu_tanh_mul_grad,
        "`d_gate = dy·up·gelu'(g)`, `d_up = dy·gelu(g)`, tanh form",
        gelu_tanh_and_grad1
    );
    gated_grad_kernel!(
        gelu_erf_mul_grad,
        "`d_gate = dy·up·gelu'(g)`, `d_up = dy·gelu(g)`, erf form",
        gelu_erf_and_grad1
    );
}

/// The kernel of a gated unit's backward (see `gated_grad_kernel!`).
type GatedGradKernel = fn(&[f32], &[f32], &[f32], Dst<'_>, Dst<'_>, [&[f32]; 3]);

// ─────────────────────────────────────── drivers ───────────────────────────────────────

/// Elements per parallel task of the elementwise maps (written tile by tile through
/// `output::Dst`); a multiple of the lanes.
const OUT_BLOCK: usize = 8192;

/// `y = kernel(x)` elementwise, in x's dtype.
fn map_unary(
    cpu: &CpuBackend,
    op: &'static str,
    x: &Tensor,
    work: usize,
    kernel: fn(&[f32], Dst<'_>),
) -> Result<Tensor> {
    spec::same(op, &[("x", x)])?;
    let xs = convert::f32_data(op, "x", x)?;
    output::fresh_tensor(cpu, op, x.shape(), x.dtype(), OUT_BLOCK, work, |i, dst| {
        let at = i * OUT_BLOCK;
        kernel(&xs[at..at + dst.len()], dst)
    })
}

/// Two inputs read as f32.
type F32Pair<'a> = (Cow<'a, [f32]>, Cow<'a, [f32]>);

/// Validates two same-dtype, same-shape float inputs and reads them as f32.
fn read_pair<'a>(
    op: &'static str,
    (a_name, a): (&str, &'a Tensor),
    (b_name, b): (&str, &'a Tensor),
) -> Result<F32Pair<'a>> {
    spec::same(op, &[(a_name, a), (b_name, b)])?;
    Ok((convert::f32_data(op, a_name, a)?, convert::f32_data(op, b_name, b)?))
}

/// `out = kernel(a, b)` elementwise for two equally shaped inputs, in a's dtype.
fn map_binary(
    cpu: &CpuBackend,
    op: &'static str,
    a: (&str, &Tensor),
    b: (&str, &Tensor),
    work: usize,
    kernel: impl Fn(&[f32], &[f32], Dst<'_>) + Sync + Send,
) -> Result<Tensor> {
    let (av, bv) = read_pair(op, a, b)?;
    output::fresh_tensor(cpu, op, a.1.shape(), a.1.dtype(), OUT_BLOCK, work, |i, dst| {
        let range = i * OUT_BLOCK..i * OUT_BLOCK + dst.len();
        kernel(&av[range.clone()], &bv[range], dst)
    })
}

/// `dx = backward(x, d_out)` for a unary activation.
fn unary_backward(
    cpu: &CpuBackend,
    op: &'static str,
    x: &Tensor,
    d_out: &Tensor,
    work: usize,
    kernel: fn(&[f32], &[f32], Dst<'_>),
) -> Result<Tensor> {
    map_binary(cpu, op, ("x", x), ("d_out", d_out), work, kernel)
}

// ─────────────────────────────────────── the ops ───────────────────────────────────────

/// `silu(x) = x·σ(x)`.
///
/// # Shapes
/// any → same.
pub fn silu(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    map_unary(cpu, "silu", x, EXP_WORK, lanes::silu)
}

/// `dx = dy·σ(x)·(1 + x·(1 − σ(x)))`.
///
/// # Shapes
/// `x`, `d_out`: equal → same.
pub fn silu_backward(cpu: &CpuBackend, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
    unary_backward(cpu, "silu_backward", x, d_out, EXP_WORK, lanes::silu_grad)
}

/// GELU: `x·σ(2u)` (= `½x(1 + tanh u)`, `u = √(2/π)(x + 0.044715x³)`) or `x·Φ(x)` (erf form).
///
/// # Shapes
/// any → same.
pub fn gelu(cpu: &CpuBackend, x: &Tensor, form: GeluForm) -> Result<Tensor> {
    let kernel = match form {
        GeluForm::Tanh => lanes::gelu_tanh,
        GeluForm::Erf => lanes::gelu_erf,
    };
    map_unary(cpu, "gelu", x, EXP_WORK, kernel)
}

/// `dx = dy·gelu'(x)` for the chosen form (erf form: `gelu' = Φ(x) + x·φ(x)`).
///
/// # Shapes
/// `x`, `d_out`: equal → same.
pub fn gelu_backward(cpu: &CpuBackend, x: &Tensor, d_out: &Tensor, form: GeluForm) -> Result<Tensor> {
    let kernel = match form {
        GeluForm::Tanh => lanes::gelu_tanh_grad,
        GeluForm::Erf => lanes::gelu_erf_grad,
    };
    unary_backward(cpu, "gelu_backward", x, d_out, EXP_WORK, kernel)
}

/// `max(x, 0)`.
///
/// # Shapes
/// any → same.
pub fn relu(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    map_unary(cpu, "relu", x, CHEAP_WORK, lanes::relu)
}

/// `dx = dy·[x > 0]`.
///
/// # Shapes
/// `x`, `d_out`: equal → same.
pub fn relu_backward(cpu: &CpuBackend, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
    unary_backward(cpu, "relu_backward", x, d_out, CHEAP_WORK, lanes::relu_grad)
}

/// `σ(x) = 1/(1 + e^−x)`.
///
/// # Shapes
/// any → same.
pub fn sigmoid(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    map_unary(cpu, "sigmoid", x, EXP_WORK, lanes::sigmoid)
}

/// `dx = dy·σ(x)·(1 − σ(x))`.
///
/// # Shapes
/// `x`, `d_out`: equal → same.
pub fn sigmoid_backward(cpu: &CpuBackend, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
    unary_backward(cpu, "sigmoid_backward", x, d_out, EXP_WORK, lanes::sigmoid_grad)
}

/// `tanh(x)`.
///
/// # Shapes
/// any → same.
pub fn tanh(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    map_unary(cpu, "tanh", x, EXP_WORK, lanes::tanh)
}

/// `dx = dy·(1 − tanh²(x))`.
///
/// # Shapes
/// `x`, `d_out`: equal → same.
pub fn tanh_backward(cpu: &CpuBackend, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
    unary_backward(cpu, "tanh_backward", x, d_out, EXP_WORK, lanes::tanh_grad)
}

/// The SwiGLU gate: `silu(gate)·up`.
///
/// # Shapes
/// `gate`, `up`: equal → same.
pub fn silu_mul(cpu: &CpuBackend, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    map_binary(cpu, "silu_mul", ("gate", gate), ("up", up), EXP_WORK, lanes::silu_mul)
}

/// `d_gate = dy·up·silu'(gate)`, `d_up = dy·silu(gate)`, returned as `da`, `db`.
///
/// # Shapes
/// `gate`, `up`, `d_out`: equal → two tensors of that shape.
pub fn silu_mul_backward(cpu: &CpuBackend, gate: &Tensor, up: &Tensor, d_out: &Tensor) -> Result<PairGradients> {
    gated_backward(cpu, "silu_mul_backward", gate, up, d_out, lanes::silu_mul_grad)
}

/// The GeGLU gate: `gelu(gate)·up` in one pass (the tanh form is Gemma's MLP).
///
/// # Shapes
/// `gate`, `up`: equal → same.
pub fn gelu_mul(cpu: &CpuBackend, gate: &Tensor, up: &Tensor, form: GeluForm) -> Result<Tensor> {
    let kernel = match form {
        GeluForm::Tanh => lanes::gelu_tanh_mul,
        GeluForm::Erf => lanes::gelu_erf_mul,
    };
    map_binary(cpu, "gelu_mul", ("gate", gate), ("up", up), EXP_WORK, kernel)
}

/// gpt-oss's clamped SwiGLU: `(u' + 1)·g'·σ(α·g')` with `g' = min(gate, limit)` and
/// `u' = clamp(up, −limit, limit)` (gpt-oss: α = 1.702, limit 7).
///
/// # Shapes
/// `gate`, `up`: equal → same.
pub fn clamped_swiglu(cpu: &CpuBackend, gate: &Tensor, up: &Tensor, alpha: f32, limit: f32) -> Result<Tensor> {
    const OP: &str = "clamped_swiglu";
    spec::clamped_swiglu_params(OP, alpha, limit)?;
    map_binary(cpu, OP, ("gate", gate), ("up", up), EXP_WORK, move |g, u, d| {
        lanes::clamped_swiglu(g, u, d, alpha, limit)
    })
}

/// Backward of [`clamped_swiglu`]: `(d_gate, d_up)` as `da`, `db` (see the kernel's
/// docs for the maths; zero where the forward's clamps cut).
///
/// # Shapes
/// `gate`, `up`, `d_out`: equal → two tensors of that shape.
pub fn clamped_swiglu_backward(
    cpu: &CpuBackend,
    gate: &Tensor,
    up: &Tensor,
    d_out: &Tensor,
    alpha: f32,
    limit: f32,
) -> Result<PairGradients> {
    const OP: &str = "clamped_swiglu_backward";
    spec::clamped_swiglu_params(OP, alpha, limit)?;
    gated_backward(cpu, OP, gate, up, d_out, move |g, u, dy, dg, du, _rest| {
        lanes::clamped_swiglu_grad(g, u, dy, dg, du, alpha, limit)
    })
}

/// `d_gate = dy·up·gelu'(gate)`, `d_up = dy·gelu(gate)` for the chosen form, returned as
/// `da`, `db`.
///
/// # Shapes
/// `gate`, `up`, `d_out`: equal → two tensors of that shape.
pub fn gelu_mul_backward(
    cpu: &CpuBackend,
    gate: &Tensor,
    up: &Tensor,
    d_out: &Tensor,
    form: GeluForm,
) -> Result<PairGradients> {
    let kernel: GatedGradKernel = match form {
        GeluForm::Tanh => lanes::gelu_tanh_mul_grad,
        GeluForm::Erf => lanes::gelu_erf_mul_grad,
    };
    gated_backward(cpu, "gelu_mul_backward", gate, up, d_out, kernel)
}

/// The backward of a gated unit `act(gate)·up` (`op`) through its `kernel`.
fn gated_backward(
    cpu: &CpuBackend,
    op: &'static str,
    gate: &Tensor,
    up: &Tensor,
    d_out: &Tensor,
    kernel: impl Fn(&[f32], &[f32], &[f32], Dst<'_>, Dst<'_>, [&[f32]; 3]) + Sync + Send,
) -> Result<PairGradients> {
    spec::same(op, &[("gate", gate), ("up", up), ("d_out", d_out)])?;
    let (g, u) = (convert::f32_data(op, "gate", gate)?, convert::f32_data(op, "up", up)?);
    let dy = convert::f32_data(op, "d_out", d_out)?;
    let (shape, dtype) = (gate.shape(), gate.dtype());
    let spec = || OutputSpec { shape: shape.clone(), dtype, per_task: OUT_BLOCK };
    let tasks = g.len().div_ceil(OUT_BLOCK);
    let [d_gate, d_up] =
        output::fresh_tensors(cpu, op, tasks, OUT_BLOCK * EXP_WORK, [spec(), spec()], |i, [dg, du]| {
            let range = i * OUT_BLOCK..i * OUT_BLOCK + dg.len();
            let rest = [&g[range.start..], &u[range.start..], &dy[range.start..]];
            kernel(&g[range.clone()], &u[range.clone()], &dy[range], dg, du, rest)
        })?;
    Ok(PairGradients { da: d_gate, db: d_up })
}

/// `max(x, ln(1 + exp(min(x, 88))))`, computed as `max(x, 0) + ln(1 + e^−|x|)` (the same
/// within f32 rounding; never overflows, keeps relative precision for very negative x).
///
/// # Shapes
/// any → same.
pub fn stable_softplus(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    map_unary(cpu, "stable_softplus", x, EXP_WORK, lanes::softplus)
}
