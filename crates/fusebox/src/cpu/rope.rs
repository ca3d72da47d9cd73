//! Rotary position embedding and its backward.
//!
//! Each pair `(a, b)` of a row at position `p = offset + t` is rotated by the angle of
//! `cos[p, i]`, `sin[p, i]`: `(a·cos − b·sin, a·sin + b·cos)`. The backward is the
//! inverse (transposed) rotation, the same loop with `sin → −sin`. Tables narrower than
//! `D/2` rotate only the first `R = 2·width` dims of a row and copy the rest (partial
//! rotary: pairs `(i, i + R/2)` or `(2i, 2i + 1)` with `i < R/2`). Rows of `(b, h)`
//! run in parallel; F16/BF16 inputs are computed in f32 and written back in their dtype.

use crate::cpu::convert::f32_data;
use crate::cpu::convert::F32Output;
use crate::cpu::CpuBackend;
use crate::error::Result;
use crate::spec::rope::{self as spec, RopeSpec};
use crate::tensor::Tensor;
use crate::types::*;

/// The vectorized rotations of one row, compiled per ISA.
mod lanes {
    use crate::cpu::simd::multiversion;

    multiversion! {
        /// Pairs `(i, i + R/2)` of the row's first `R = 2·cos.len()` elements:
        /// `(x₁, x₂) → (x₁·c − x₂·s, x₁·s + x₂·c)` with `s = sign·sin`.
        pub fn rotate_half(out: &mut [f32], x: &[f32], cos: &[f32], sin: &[f32], sign: f32) {
            let h = cos.len();
            let (o1, o2) = out.split_at_mut(h);
            let (x1, x2) = x.split_at(h);
            let (o2, x1, x2, sin) = (&mut o2[..h], &x1[..h], &x2[..h], &sin[..h]);
            for i in 0..h {
                let (a, b, c, s) = (x1[i], x2[i], cos[i], sign * sin[i]);
                o1[i] = a * c - b * s;
                o2[i] = a * s + b * c;
            }
        }
    }

    multiversion! {
        /// Pairs `(2i, 2i + 1)`: the same rotation on adjacent elements.
        pub fn rotate_pairs(out: &mut [f32], x: &[f32], cos: &[f32], sin: &[f32], sign: f32) {
            for (((o, v), &c), &s) in out.chunks_exact_mut(2).zip(x.chunks_exact(2)).zip(cos).zip(sin) {
                let (a, b, s) = (v[0], v[1], sign * s);
                o[0] = a * c - b * s;
                o[1] = a * s + b * c;
            }
        }
    }
}

/// Rotates every row of `x` by the angles of positions `offset..offset + T`, `sign = −1`
/// for the inverse rotation.
fn rotate(
    cpu: &CpuBackend,
    op: &'static str,
    what: &str,
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    style: RopeStyle,
    offset: usize,
    sign: f32,
) -> Result<Tensor> {
    let RopeSpec { seq: t, d, pairs: half, .. } = spec::rope(op, what, x, cos, sin, offset)?;
    let rotated = 2 * half;
    let xs = f32_data(op, what, x)?;
    let (cs, ss) = (cos.as_slice::<f32>()?, sin.as_slice::<f32>()?);
    let mut out = F32Output::new(x.shape(), x.dtype())?;
    let row = t * d;
    cpu.for_each_chunk(out.values()?, row, 4, |bh, o| {
        let xr = &xs[bh * row..][..row];
        for (ti, (orow, xrow)) in o.chunks_exact_mut(d).zip(xr.chunks_exact(d)).enumerate() {
            let p = offset + ti;
            let (c, s) = (&cs[p * half..][..half], &ss[p * half..][..half]);
            let (orot, opass) = orow.split_at_mut(rotated);
            let (xrot, xpass) = xrow.split_at(rotated);
            match style {
                RopeStyle::HalfSplit => lanes::rotate_half(orot, xrot, c, s, sign),
                RopeStyle::Interleaved => lanes::rotate_pairs(orot, xrot, c, s, sign),
            }
            opass.copy_from_slice(xpass);
        }
    });
    out.finish(cpu)
}

/// Rotary embedding at positions `offset + t`: each pair `(a, b)` becomes
/// `(a·cos − b·sin, a·sin + b·cos)`; pairs are `(i, i + D/2)` (HalfSplit) or
/// `(2i, 2i + 1)` (Interleaved); tables of `R/2 < D/2` angles rotate the first R dims
/// only (partial rotary) and pass the rest through.
///
/// # Shapes
/// `x`: `[B, H, T, D]`, D even; `cos`, `sin`: `[P, R/2]` F32, `2 ≤ R ≤ D`, `offset + T ≤ P`
/// → same as x.
pub fn rope(
    cpu: &CpuBackend,
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    style: RopeStyle,
    offset: usize,
) -> Result<Tensor> {
    rotate(cpu, "rope", "x", x, cos, sin, style, offset, 1.0)
}

/// Backward of `rope`: the inverse rotation of `d_out` (`sin → −sin`).
///
/// # Shapes
/// `d_out`: `[B, H, T, D]`, D even; `cos`, `sin`: `[P, R/2]` F32, `2 ≤ R ≤ D`,
/// `offset + T ≤ P` → same as d_out.
pub fn rope_backward(
    cpu: &CpuBackend,
    d_out: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    style: RopeStyle,
    offset: usize,
) -> Result<Tensor> {
    rotate(cpu, "rope_backward", "d_out", d_out, cos, sin, style, offset, -1.0)
}
