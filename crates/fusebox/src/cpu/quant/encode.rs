//! f32 → blocks: the rounding steps every quantizer shares, a loop over whole blocks
//! per format compiled per ISA (the block quantizers of `encode_32` and `encode_k`
//! inline into them), and [`quantize_into`], which picks the loop by dtype.

use half::f16;

use super::encode_32::{
    quantize_iq4_nl_block, quantize_mxfp4_block, quantize_q4_0_block, quantize_q4_1_block, quantize_q5_0_block,
    quantize_q5_1_block, quantize_q8_0_block,
};
use super::encode_k::{
    quantize_iq4_xs_block, quantize_q2_k_block, quantize_q3_k_block, quantize_q4_k_block, quantize_q5_k_block,
    quantize_q6_k_block,
};
use super::{QK, QK_K};
use crate::cpu::memory::f32_to_f8e4m3;
use crate::cpu::simd::multiversion;
use crate::dtype::DType;

/// ggml's threshold below which a group counts as all zeros (`GROUP_MAX_EPS`).
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// Writes `v` rounded to f16 (nearest even, as `GGML_FP32_TO_FP16`) at `bytes[at..at + 2]`
/// and returns the rounded value as f32.
#[inline(always)]
pub(super) fn put_f16(bytes: &mut [u8], at: usize, v: f32) -> f32 {
    let h = f16::from_f32(v);
    bytes[at..at + 2].copy_from_slice(&h.to_le_bytes());
    h.to_f32()
}

/// ggml's `nearest_int`: round half to even by adding 1.5·2²³, which leaves the rounded
/// integer in the low mantissa bits (exact for |v| ≤ 2²²; larger values, which ggml
/// asserts against, are clamped first). Inline and branch-free, unlike a libm `rintf` call.
#[inline(always)]
pub(super) fn nearest_int(v: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    let shifted = v.clamp(-4_194_303.0, 4_194_303.0) + MAGIC;
    (shifted.to_bits() & 0x007F_FFFF) as i32 - 0x0040_0000
}

// ─────────────── per-format loops over whole blocks, compiled per ISA ───────────────
// Rust never contracts `a·b + c` into an FMA on its own, so every ISA rounds exactly as
// the portable code does.

macro_rules! block_loops {
    ($($name:ident => $block:ident, $elems:expr, $bytes:literal;)*) => {$(
        multiversion! {
            #[doc = concat!(stringify!($name), ": `x` (n·block elements) → `out` (n·", $bytes, ").")]
            pub fn $name(x: &[f32], out: &mut [u8]) {
                for (xs, o) in x.chunks_exact($elems).zip(out.chunks_exact_mut($bytes)) {
                    $block(xs, o);
                }
            }
        }
    )*};
}
block_loops! {
    q8_0 => quantize_q8_0_block, QK, 34;
    q4_0 => quantize_q4_0_block, QK, 18;
    q4_1 => quantize_q4_1_block, QK, 20;
    q4_k => quantize_q4_k_block, QK_K, 144;
    q6_k => quantize_q6_k_block, QK_K, 210;
    q5_0 => quantize_q5_0_block, QK, 22;
    q5_1 => quantize_q5_1_block, QK, 24;
    iq4_nl => quantize_iq4_nl_block, QK, 18;
    q2_k => quantize_q2_k_block, QK_K, 84;
    q3_k => quantize_q3_k_block, QK_K, 110;
    q5_k => quantize_q5_k_block, QK_K, 176;
    iq4_xs => quantize_iq4_xs_block, QK_K, 136;
    mxfp4 => quantize_mxfp4_block, QK, 17;
}

/// Quantizes `x` (a whole number of blocks) into `out` (the matching bytes).
pub(super) fn quantize_into(dtype: DType, x: &[f32], out: &mut [u8]) {
    match dtype {
        DType::Q8_0 => q8_0(x, out),
        DType::Q4_0 => q4_0(x, out),
        DType::Q4_1 => q4_1(x, out),
        DType::Q4K => q4_k(x, out),
        DType::Q6K => q6_k(x, out),
        DType::Q5_0 => q5_0(x, out),
        DType::Q5_1 => q5_1(x, out),
        DType::IQ4NL => iq4_nl(x, out),
        DType::Q2K => q2_k(x, out),
        DType::Q3K => q3_k(x, out),
        DType::Q5K => q5_k(x, out),
        DType::IQ4XS => iq4_xs(x, out),
        DType::MXFP4 => mxfp4(x, out),
        _ => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = f32_to_f8e4m3(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        for (v, want) in [(0.5, 0), (1.5, 2), (2.5, 2), (-0.5, 0), (-1.5, -2), (-2.49, -2), (7.51, 8), (1e9, 4_194_303)]
        {
            assert_eq!(nearest_int(v), want, "{v}");
        }
    }
}
