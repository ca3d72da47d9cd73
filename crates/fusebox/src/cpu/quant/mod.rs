//! Weight storage formats: the GGUF block quantizations and FP8 E4M3. `quantize` turns
//! floats into blocks as ggml does without an importance matrix (see [`quantize`]),
//! `dequantize` turns them back into f32, and `quantized_matmul` computes `x · Wᵀ`
//! reading W's blocks directly, a few rows at a time.
//!
//! Block layouts, little-endian, exactly as ggml-common.h declares them:
//!
//! | dtype | elems | bytes | fields | element value |
//! |---|---|---|---|---|
//! | Q8_0 | 32 | 34 | `f16 d; i8 qs[32]` | `d·qs[j]` |
//! | Q4_0 | 32 | 18 | `f16 d; u8 qs[16]` | `d·(q − 8)`; element j < 16 is the low nibble of `qs[j]`, element j + 16 its high nibble |
//! | Q4_1 | 32 | 20 | `f16 d; f16 m; u8 qs[16]` | `d·q + m`, nibbles as Q4_0 |
//! | Q4_K | 256 | 144 | `f16 d; f16 dmin; u8 scales[12]; u8 qs[128]` | `d·sc·q − dmin·m` per sub-block of 32 with 6-bit `sc`, `m` (see [`scale_min_k4`]); sub-blocks 2i and 2i+1 are the low and high nibbles of `qs[32i..32i+32]` |
//! | Q6_K | 256 | 210 | `u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d` | `d·scales[s]·(q − 32)` per sub-block s of 16; q = 4 low bits from `ql`, 2 high bits from `qh` |
//! | Q5_0 | 32 | 22 | `f16 d; u8 qh[4]; u8 qs[16]` | `d·(q − 16)`; nibbles as Q4_0, the fifth bit of element j is bit j of the little-endian u32 `qh` |
//! | Q5_1 | 32 | 24 | `f16 d; f16 m; u8 qh[4]; u8 qs[16]` | `d·q + m`, bits as Q5_0 |
//! | IQ4_NL | 32 | 18 | `f16 d; u8 qs[16]` | `d·T[q]`, T = (−127, −104, …, 89, 113) ([`IQ4NL_VALUES`]), nibbles as Q4_0 |
//! | Q2_K | 256 | 84 | `u8 scales[16]; u8 qs[64]; f16 d; f16 dmin` | `d·sc·q − dmin·m` per sub-block of 16 (`sc`, `m` the nibbles of `scales[s]`); element 128h + 32g + l is bits 2g.. of `qs[32h + l]` |
//! | Q3_K | 256 | 110 | `u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d` | `d·(sc − 32)·(q − 4)` per sub-block of 16 (6-bit `sc`, see [`q3_k_scales`]); 2 low bits as Q2_K, the third is bit j/32 of `hmask[j % 32]` |
//! | Q5_K | 256 | 176 | `f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]` | as Q4_K, plus a fifth bit: bit s (the sub-block) of `qh[j % 32]` |
//! | MXFP4 | 32 | 17 | `u8 e; u8 qs[16]` | `2^(e−128)·T[q]`, T = (0, 1, 2, 3, 4, 6, 8, 12, 0, −1, …, −12) (FP4 E2M1 doubled, [`MXFP4_VALUES`]; e an E8M0 exponent), nibbles as Q4_0 |
//! | IQ4_XS | 256 | 136 | `f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]` | `d·(ls − 32)·T[q]` per sub-block of 32 (6-bit `ls`: a nibble of `scales_l`, 2 bits of `scales_h`); nibbles as Q4_0 within each sub-block's 16 bytes |
//!
//! One file per purpose:
//!
//! | file | what |
//! |---|---|
//! | `fields.rs` | readers of the packed block fields (f16, scales, fifth bits, E8M0), the IQ4 and MXFP4 tables, and the one description of the two table formats |
//! | `decode.rs` | blocks → f32, a loop per format compiled per ISA |
//! | `encode.rs`, `encode_32.rs`, `encode_k.rs` | f32 → blocks: shared rounding and the loops; the 32-element formats; the 256-element K formats |
//! | `quantize.rs` | the `quantize` and `dequantize` ops, and the row decoder `embedding` uses |
//! | `fused_dot.rs`, `fused_dot_x86.rs` | W rows dotted with f32 x rows straight from the blocks: portable loops compiled per ISA; hand-written AVX-512 / AVX2 kernels |
//! | `int.rs`, `int_avx2.rs`, `int_vnni.rs`, `int_vnni_k.rs` | the integer decode path (x rounded to 8 bits): the scheme and its portable twin; AVX2 kernels; AVX-512 VNNI kernels for the 32-block formats and for the K formats |
//! | `matmul.rs` | `quantized_matmul`: row runs for few x rows, decoded panels and gemm for many |
//! | `prefill.rs`, `prefill_vnni.rs`, `prefill_avx2.rs` | the integer prefill path (many x rows, x rounded to 8 bits): packed W panels, the portable twin, the AVX-512 VNNI tile kernel and the AVX2 one |
//! | `backward.rs` | `quantized_matmul_backward` |

mod backward;
mod decode;
mod encode;
mod encode_32;
mod encode_k;
mod fields;
mod fused_dot;
/// Hand-written AVX-512 / AVX2 forms of the Q8_0, Q4_0, Q4_1, Q5_0, IQ4_NL and MXFP4
/// fused row dots, and an AVX-512 form of Q4_K's.
#[cfg(target_arch = "x86_64")]
mod fused_dot_x86;
/// The integer decode path: x quantized to 8 bits, integer dots per block.
mod int;
/// AVX2 forms of the integer row dots.
#[cfg(target_arch = "x86_64")]
mod int_avx2;
/// AVX-512 VNNI forms of the 32-block integer dots, several x rows per weight pass.
#[cfg(target_arch = "x86_64")]
mod int_vnni;
/// AVX-512 VNNI forms of the K-format integer dots, several x rows per weight pass.
#[cfg(target_arch = "x86_64")]
mod int_vnni_k;
mod matmul;
/// The integer prefill path: x rounded to 8 bits, W panels packed, tiled integer dots.
mod prefill;
/// AVX2 tile kernel of the integer prefill path (no AVX-512 VNNI, or capped off).
#[cfg(target_arch = "x86_64")]
mod prefill_avx2;
/// AVX-512 VNNI tile kernel of the integer prefill path.
#[cfg(target_arch = "x86_64")]
mod prefill_vnni;
mod quantize;

pub(crate) use backward::accumulate as quantized_dx_accumulate;
pub use backward::quantized_matmul_backward;
pub use fields::{q3_k_scales, scale_min_k4, IQ4NL_VALUES, MXFP4_VALUES};
pub use matmul::quantized_matmul;
pub(crate) use matmul::{panel_product, RowOperand, PANEL_ROWS};
pub use quantize::{dequantize, dequantize_row_into, quantize};

/// Elements of a Q8_0 / Q4_0 / Q4_1 block.
const QK: usize = 32;
/// Elements of a Q4_K / Q6_K super-block.
const QK_K: usize = 256;

/// Inputs shared by the integer kernels' tests.
#[cfg(test)]
mod test_data {
    use crate::dtype::DType;

    /// `n` values in [−2, 2) from an xorshift stream seeded by `seed`.
    pub(super) fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32 - 0.5) * 4.0
            })
            .collect()
    }

    /// The formats with integer kernels (decode and prefill).
    pub(super) const FORMATS: [DType; 9] = [
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::IQ4NL,
        DType::MXFP4,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
    ];
}
