//! The gated delta rule (Gated DeltaNet) on the CPU.
//!
//! Per sequence b and value head h (reading key head `h / (Hv/Hk)`), a state S
//! (`Dk × Dv`) evolves token by token:
//!
//! ```text
//! S ← e^{g_t}·S;   u = Sᵀk_t;   S ← S + k_t·(β_t(v_t − u))ᵀ;   o_t = Sᵀ(scale·q_t)
//! ```
//!
//! - [`gated_delta_rule`] (`forward`) computes it 64 tokens at a time in the WY form
//!   (`chunk` holds the maths), parallel over (sequence, head) pairs, its products on
//!   the crate's f32 GEMM;
//! - [`gated_delta_rule_backward`] (`backward`) keeps S only at chunk boundaries and
//!   recomputes inside each chunk;
//! - [`gated_delta_rule_step`] and [`batched_gated_delta_rule_step`] (`step`) are the
//!   one-token recurrence for decoding, one pass over the state.

mod backward;
mod chunk;
mod forward;
mod step;

pub use backward::gated_delta_rule_backward;
pub use forward::gated_delta_rule;
pub use step::{batched_gated_delta_rule_step, gated_delta_rule_step};

use crate::cpu::matmul::sgemm_serial;
use crate::error::Result;
use crate::spec::delta::DeltaRuleSpec;
use crate::tensor::Tensor;

/// Tokens per chunk of the chunked form.
pub const CHUNK: usize = 64;

/// The f32 inputs of the sequence forms, as slices.
#[derive(Clone, Copy)]
struct Inputs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
}

impl<'a> Inputs<'a> {
    fn new(q: &'a Tensor, k: &'a Tensor, v: &'a Tensor, g: &'a Tensor, beta: &'a Tensor) -> Result<Self> {
        Ok(Inputs { q: q.as_slice()?, k: k.as_slice()?, v: v.as_slice()?, g: g.as_slice()?, beta: beta.as_slice()? })
    }
}

/// Where the rows of one (sequence b, value head h) pair lie in the `[B, T, H, D]`
/// inputs and outputs (pair index `b·Hv + h`, the order of the states).
#[derive(Clone, Copy)]
struct HeadAt {
    s: DeltaRuleSpec,
    b: usize,
    h: usize,
}

impl HeadAt {
    fn new(s: DeltaRuleSpec, pair: usize) -> Self {
        HeadAt { s, b: pair / s.v_heads, h: pair % s.v_heads }
    }
    /// Offset of token t's query/key row (of key head `h / group`).
    fn qk(&self, t: usize) -> usize {
        ((self.b * self.s.tokens + t) * self.s.k_heads + self.h / self.s.group()) * self.s.dk
    }
    /// Offset of token t's value (output, value gradient) row.
    fn v(&self, t: usize) -> usize {
        ((self.b * self.s.tokens + t) * self.s.v_heads + self.h) * self.s.dv
    }
    /// Index of token t's gate (g, β).
    fn gate(&self, t: usize) -> usize {
        (self.b * self.s.tokens + t) * self.s.v_heads + self.h
    }
}

/// `c (+)= a·b` for row-major `a` `[m, k]`, `b` `[k, n]`, `c` `[m, n]`.
#[allow(clippy::too_many_arguments)]
fn nn(c: &mut [f32], a: &[f32], b: &[f32], m: usize, n: usize, k: usize, accumulate: bool) {
    sgemm_serial(m, n, k, a, k, 1, b, n, 1, &mut c[..m * n], accumulate);
}

/// `c (+)= a·bᵀ` for row-major `a` `[m, k]`, `b` `[n, k]`.
#[allow(clippy::too_many_arguments)]
fn nt(c: &mut [f32], a: &[f32], b: &[f32], m: usize, n: usize, k: usize, accumulate: bool) {
    sgemm_serial(m, n, k, a, k, 1, b, 1, k, &mut c[..m * n], accumulate);
}

/// `c (+)= aᵀ·b` for row-major `a` `[k, m]`, `b` `[k, n]`.
#[allow(clippy::too_many_arguments)]
fn tn(c: &mut [f32], a: &[f32], b: &[f32], m: usize, n: usize, k: usize, accumulate: bool) {
    sgemm_serial(m, n, k, a, 1, m, b, n, 1, &mut c[..m * n], accumulate);
}

/// Lane-wise loops compiled per ISA (see `simd::multiversion!`).
mod lanes {
    use crate::cpu::simd::{fast_exp, madd, multiversion};

    multiversion! {
        /// Solves `(I + A)·X = R` in place (`x` holds R, `l` rows of `d`), A strictly lower
        /// triangular `[l, l]` row-major (its diagonal and upper part are not read):
        /// forward substitution, `X_j = R_j − Σ_{m<j} A_jm·X_m`.
        pub fn solve_unit_lower(a: &[f32], l: usize, x: &mut [f32], d: usize) {
            for j in 1..l {
                let (done, rest) = x.split_at_mut(j * d);
                let xj = &mut rest[..d];
                for (m, &c) in a[j * l..j * l + j].iter().enumerate() {
                    for (y, &s) in xj.iter_mut().zip(&done[m * d..(m + 1) * d]) {
                        *y = madd::<FMA>(-c, s, *y);
                    }
                }
            }
        }
    }

    multiversion! {
        /// Solves `(I + A)ᵀ·Y = R` in place (as [`solve_unit_lower`], transposed): back
        /// substitution, `Y_m = R_m − Σ_{j>m} A_jm·Y_j`, each finished row j subtracted
        /// from the rows above it.
        pub fn solve_unit_lower_transposed(a: &[f32], l: usize, y: &mut [f32], d: usize) {
            for j in (1..l).rev() {
                let (above, rest) = y.split_at_mut(j * d);
                let yj = &rest[..d];
                for (m, &c) in a[j * l..j * l + j].iter().enumerate() {
                    for (r, &s) in above[m * d..(m + 1) * d].iter_mut().zip(yj) {
                        *r = madd::<FMA>(-c, s, *r);
                    }
                }
            }
        }
    }

    multiversion! {
        /// The decay matrix of a chunk: `m[i, j] = e^{G_i − G_j}` for `j ≤ i`, 0 above the
        /// diagonal (never evaluated there, where it could overflow).
        pub fn decay_matrix(gcum: &[f32], m: &mut [f32]) {
            let l = gcum.len();
            for i in 0..l {
                let row = &mut m[i * l..(i + 1) * l];
                let gi = gcum[i];
                for (e, &gj) in row[..=i].iter_mut().zip(&gcum[..=i]) {
                    *e = fast_exp::<FMA>(gi - gj);
                }
                row[i + 1..].fill(0.0);
            }
        }
    }

    multiversion! {
        /// `Σ a[i]·b[i]` in 16 lanes (fixed order).
        pub fn dot(a: &[f32], b: &[f32]) -> f32 {
            let mut acc = [0.0f32; 16];
            let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
            let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
            for (x, y) in ca.zip(cb) {
                for l in 0..16 {
                    acc[l] = madd::<FMA>(x[l], y[l], acc[l]);
                }
            }
            acc.iter().sum::<f32>() + tail
        }
    }
}
