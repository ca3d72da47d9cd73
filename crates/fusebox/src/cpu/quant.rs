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
//! | IQ4_XS | 256 | 136 | `f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]` | `d·(ls − 32)·T[q]` per sub-block of 32 (6-bit `ls`: a nibble of `scales_l`, 2 bits of `scales_h`); nibbles as Q4_0 within each sub-block's 16 bytes |

use half::f16;

use crate::cpu::memory::{f32_to_f8e4m3, f8e4m3_table, host};
use crate::cpu::pool::SharedMut;
use crate::cpu::simd::{self, multiversion};
use crate::cpu::{convert, CpuBackend};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::spec;
use crate::tensor::Tensor;

/// Hand-written AVX-512 / AVX2 forms of the Q8_0, Q4_0 and Q4_1 fused row dots, and an
/// AVX2 form of Q5_0's.
#[cfg(target_arch = "x86_64")]
#[path = "quant_x86.rs"]
mod x86;

/// The integer decode path: x quantized to 8 bits, integer dots per block.
#[path = "quant_int.rs"]
mod int;

/// `quantized_matmul_backward`: `dx = dy · W` from W's blocks, a decoded panel at a time.
#[path = "quant_backward.rs"]
mod backward;
pub use backward::quantized_matmul_backward;

/// Elements of a Q8_0 / Q4_0 / Q4_1 block.
const QK: usize = 32;
/// Elements of a Q4_K / Q6_K super-block.
const QK_K: usize = 256;
/// ggml's threshold below which a group counts as all zeros (`GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;
/// Blocks per parallel task of `quantize` / `dequantize`.
const BLOCKS_PER_TASK: usize = 64;
/// Up to this many rows of x, `quantized_matmul` dots each x row with the W blocks as it
/// does for one row (a row's result does not depend on how many rows come with it: a
/// server batching 1..=16 sequences relies on it); above it, it decodes panels of W rows
/// and runs gemm on them.
const SMALL_M: usize = 16;

/// The little-endian f16 at `bytes[at..at + 2]`, as f32.
#[inline(always)]
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Writes `v` rounded to f16 (nearest even, as `GGML_FP32_TO_FP16`) at `bytes[at..at + 2]`
/// and returns the rounded value as f32.
#[inline(always)]
fn put_f16(bytes: &mut [u8], at: usize, v: f32) -> f32 {
    let h = f16::from_f32(v);
    bytes[at..at + 2].copy_from_slice(&h.to_le_bytes());
    h.to_f32()
}

/// ggml's `nearest_int`: round half to even by adding 1.5·2²³, which leaves the rounded
/// integer in the low mantissa bits (exact for |v| ≤ 2²²; larger values, which ggml
/// asserts against, are clamped first). Inline and branch-free, unlike a libm `rintf` call.
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    let shifted = v.clamp(-4_194_303.0, 4_194_303.0) + MAGIC;
    (shifted.to_bits() & 0x007F_FFFF) as i32 - 0x0040_0000
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K block from its 12 packed
/// bytes (ggml's `get_scale_min_k4`): sub-blocks 0–3 keep theirs in the low 6 bits of
/// bytes j and j + 4; sub-blocks 4–7 keep 4 low bits in byte j + 4 (scale low nibble,
/// min high nibble) and their top 2 bits in the top bits of bytes j − 4 (scale) and j (min).
#[inline(always)]
pub fn scale_min_k4(j: usize, scales: &[u8]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        ((scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4), (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4))
    }
}

// ─────────────────────────────── decoding ───────────────────────────────

#[inline(always)]
fn decode_q8_0_block(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let (qs, out) = (&b[2..2 + QK], &mut out[..QK]);
    for j in 0..QK {
        out[j] = d * f32::from(qs[j] as i8);
    }
}

#[inline(always)]
fn decode_q4_0_block(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let (qs, out) = (&b[2..2 + QK / 2], &mut out[..QK]);
    let (lo, hi) = out.split_at_mut(QK / 2);
    for j in 0..QK / 2 {
        lo[j] = d * f32::from(i16::from(qs[j] & 0x0F) - 8);
        hi[j] = d * f32::from(i16::from(qs[j] >> 4) - 8);
    }
}

#[inline(always)]
fn decode_q4_1_block(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let (qs, out) = (&b[4..4 + QK / 2], &mut out[..QK]);
    let (lo, hi) = out.split_at_mut(QK / 2);
    for j in 0..QK / 2 {
        lo[j] = d * f32::from(qs[j] & 0x0F) + m;
        hi[j] = d * f32::from(qs[j] >> 4) + m;
    }
}

#[inline(always)]
fn decode_q4_k_block(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for pair in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * pair, scales);
        let (sc2, m2) = scale_min_k4(2 * pair + 1, scales);
        let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
        let q = &qs[32 * pair..32 * pair + 32];
        let (lo, hi) = out[64 * pair..64 * pair + 64].split_at_mut(32);
        for l in 0..32 {
            lo[l] = d1 * f32::from(q[l] & 0x0F) - min1;
            hi[l] = d2 * f32::from(q[l] >> 4) - min2;
        }
    }
}

#[inline(always)]
fn decode_q6_k_block(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 208);
    for half in 0..2 {
        // Each half of 128 elements: 64 bytes of ql, 32 of qh, 8 scales; element 32g + l
        // (g = 0..4, l = 0..32) takes ql[l + 32(g % 2)] (low nibble for g < 2, else high),
        // bits 2g..2g+2 of qh[l], and scale 2g + l/16.
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let out = &mut out[128 * half..128 * half + 128];
        for part in 0..2 {
            let s = |g: usize| d * f32::from(sc[part + 2 * g] as i8);
            let (s0, s1, s2, s3) = (s(0), s(1), s(2), s(3));
            for l in 16 * part..16 * part + 16 {
                let q1 = i16::from((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32;
                let q2 = i16::from((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
                let q3 = i16::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                let q4 = i16::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                out[l] = s0 * f32::from(q1);
                out[l + 32] = s1 * f32::from(q2);
                out[l + 64] = s2 * f32::from(q3);
                out[l + 96] = s3 * f32::from(q4);
            }
        }
    }
}

/// IQ4_NL's (and IQ4_XS's) 16 non-linear levels (ggml's `kvalues_iq4nl`).
pub const IQ4NL_VALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// The little-endian u32 at `bytes[at..at + 4]`.
#[inline(always)]
fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// The 5-bit values of a Q5_0 / Q5_1 block: element j < 16 is the low nibble of `qs[j]`
/// with bit j of `qh` on top, element j + 16 the high nibble with bit j + 16.
#[inline(always)]
fn q5_levels(qh: u32, qs: &[u8]) -> [u8; QK] {
    let mut q = [0u8; QK];
    for j in 0..QK / 2 {
        q[j] = (qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

#[inline(always)]
fn decode_q5_0_block(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let q = q5_levels(u32_at(b, 2), &b[6..22]);
    for (o, &q) in out[..QK].iter_mut().zip(&q) {
        *o = f32::from(i16::from(q) - 16) * d;
    }
}

#[inline(always)]
fn decode_q5_1_block(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let q = q5_levels(u32_at(b, 4), &b[8..24]);
    for (o, &q) in out[..QK].iter_mut().zip(&q) {
        *o = f32::from(q) * d + m;
    }
}

#[inline(always)]
fn decode_iq4_nl_block(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let (lo, hi) = out[..QK].split_at_mut(QK / 2);
    for j in 0..QK / 2 {
        lo[j] = d * f32::from(IQ4NL_VALUES[usize::from(b[2 + j] & 0x0F)]);
        hi[j] = d * f32::from(IQ4NL_VALUES[usize::from(b[2 + j] >> 4)]);
    }
}

#[inline(always)]
fn decode_q2_k_block(b: &[u8], out: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    // Element 128h + 32j + 16t + l takes bits 2j..2j+2 of qs[32h + 16t + l] and scale
    // byte 8h + 2j + t (low nibble: scale, high nibble: min).
    for h in 0..2 {
        for j in 0..4 {
            for t in 0..2 {
                let sc = scales[8 * h + 2 * j + t];
                let (dl, ml) = (d * f32::from(sc & 0x0F), dmin * f32::from(sc >> 4));
                let q = &qs[32 * h + 16 * t..32 * h + 16 * t + 16];
                let o = &mut out[128 * h + 32 * j + 16 * t..][..16];
                for l in 0..16 {
                    o[l] = dl * f32::from((q[l] >> (2 * j)) & 3) - ml;
                }
            }
        }
    }
}

/// The 16 signed 6-bit scales (`−32..32`) of a Q3_K block from its 12 packed bytes:
/// scale s keeps its low 4 bits in byte s (s < 8, low nibble) or s − 8 (high nibble), and
/// its top 2 bits at bits 2(s/4).. of byte 8 + s % 4.
#[inline(always)]
pub fn q3_k_scales(packed: &[u8]) -> [i8; 16] {
    std::array::from_fn(|s| {
        let low = if s < 8 { packed[s] & 0x0F } else { packed[s - 8] >> 4 };
        let high = (packed[8 + s % 4] >> (2 * (s / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    })
}

#[inline(always)]
fn decode_q3_k_block(b: &[u8], out: &mut [f32]) {
    let (hmask, qs) = (&b[0..32], &b[32..96]);
    let scales = q3_k_scales(&b[96..108]);
    let d = f16_at(b, 108);
    // Element 128h + 32j + 16t + l: 2 low bits at 2j.. of qs[32h + 16t + l], high bit
    // 4h + j of hmask[16t + l] (clear: subtract 4), scale 8h + 2j + t.
    for h in 0..2 {
        for j in 0..4 {
            for t in 0..2 {
                let dl = d * f32::from(scales[8 * h + 2 * j + t]);
                let q = &qs[32 * h + 16 * t..32 * h + 16 * t + 16];
                let hm = &hmask[16 * t..16 * t + 16];
                let o = &mut out[128 * h + 32 * j + 16 * t..][..16];
                for l in 0..16 {
                    let high = if hm[l] & (1 << (4 * h + j)) != 0 { 0 } else { 4 };
                    o[l] = dl * f32::from(((q[l] >> (2 * j)) & 3) as i8 - high);
                }
            }
        }
    }
}

#[inline(always)]
fn decode_q5_k_block(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for pair in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * pair, scales);
        let (sc2, m2) = scale_min_k4(2 * pair + 1, scales);
        let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
        let q = &qs[32 * pair..32 * pair + 32];
        let (lo, hi) = out[64 * pair..64 * pair + 64].split_at_mut(32);
        for l in 0..32 {
            let h1 = ((qh[l] >> (2 * pair)) & 1) << 4;
            let h2 = ((qh[l] >> (2 * pair + 1)) & 1) << 4;
            lo[l] = d1 * f32::from((q[l] & 0x0F) | h1) - min1;
            hi[l] = d2 * f32::from((q[l] >> 4) | h2) - min2;
        }
    }
}

/// The signed 6-bit scale (`−32..32`) of sub-block `ib` (0..8) of an IQ4_XS block: 4 low
/// bits in a nibble of `scales_l[ib / 2]`, 2 high bits at 2·ib of `scales_h`.
#[inline(always)]
fn iq4_xs_scale(b: &[u8], ib: usize) -> i32 {
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
    let high = ((scales_h >> (2 * ib)) & 3) as u8;
    i32::from(low | (high << 4)) - 32
}

#[inline(always)]
fn decode_iq4_xs_block(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for ib in 0..8 {
        let dl = d * iq4_xs_scale(b, ib) as f32;
        let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
        let (lo, hi) = out[32 * ib..32 * ib + 32].split_at_mut(16);
        for j in 0..16 {
            lo[j] = dl * f32::from(IQ4NL_VALUES[usize::from(qs[j] & 0x0F)]);
            hi[j] = dl * f32::from(IQ4NL_VALUES[usize::from(qs[j] >> 4)]);
        }
    }
}

/// Per-format loops over whole blocks, compiled per ISA (the block decoders inline into them).
mod decode {
    use super::*;

    multiversion! {
        /// Q8_0 blocks (`bytes`: n·34) → `out` (n·32).
        pub fn q8_0(bytes: &[u8], out: &mut [f32]) {
            for (b, o) in bytes.chunks_exact(34).zip(out.chunks_exact_mut(QK)) {
                decode_q8_0_block(b, o);
            }
        }
    }
    multiversion! {
        /// Q4_0 blocks (`bytes`: n·18) → `out` (n·32).
        pub fn q4_0(bytes: &[u8], out: &mut [f32]) {
            for (b, o) in bytes.chunks_exact(18).zip(out.chunks_exact_mut(QK)) {
                decode_q4_0_block(b, o);
            }
        }
    }
    multiversion! {
        /// Q4_1 blocks (`bytes`: n·20) → `out` (n·32).
        pub fn q4_1(bytes: &[u8], out: &mut [f32]) {
            for (b, o) in bytes.chunks_exact(20).zip(out.chunks_exact_mut(QK)) {
                decode_q4_1_block(b, o);
            }
        }
    }
    multiversion! {
        /// Q4_K blocks (`bytes`: n·144) → `out` (n·256).
        pub fn q4_k(bytes: &[u8], out: &mut [f32]) {
            for (b, o) in bytes.chunks_exact(144).zip(out.chunks_exact_mut(QK_K)) {
                decode_q4_k_block(b, o);
            }
        }
    }
    multiversion! {
        /// Q6_K blocks (`bytes`: n·210) → `out` (n·256).
        pub fn q6_k(bytes: &[u8], out: &mut [f32]) {
            for (b, o) in bytes.chunks_exact(210).zip(out.chunks_exact_mut(QK_K)) {
                decode_q6_k_block(b, o);
            }
        }
    }
    macro_rules! block_loops {
        ($($name:ident => $block:ident, $bytes:literal, $elems:expr;)*) => {$(
            multiversion! {
                #[doc = concat!(stringify!($name), " blocks (`bytes`: n·", $bytes, ") → `out` (n·block elements).")]
                pub fn $name(bytes: &[u8], out: &mut [f32]) {
                    for (b, o) in bytes.chunks_exact($bytes).zip(out.chunks_exact_mut($elems)) {
                        $block(b, o);
                    }
                }
            }
        )*};
    }
    block_loops! {
        q5_0 => decode_q5_0_block, 22, QK;
        q5_1 => decode_q5_1_block, 24, QK;
        iq4_nl => decode_iq4_nl_block, 18, QK;
        q2_k => decode_q2_k_block, 84, QK_K;
        q3_k => decode_q3_k_block, 110, QK_K;
        q5_k => decode_q5_k_block, 176, QK_K;
        iq4_xs => decode_iq4_xs_block, 136, QK_K;
    }
}

/// Decodes `bytes` (whole blocks of a storage format, or F8E4M3 codes) into `out`; the
/// caller has checked that `bytes.len() == dtype.storage_bytes(out.len())`.
fn decode_into(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        DType::Q8_0 => decode::q8_0(bytes, out),
        DType::Q4_0 => decode::q4_0(bytes, out),
        DType::Q4_1 => decode::q4_1(bytes, out),
        DType::Q4K => decode::q4_k(bytes, out),
        DType::Q6K => decode::q6_k(bytes, out),
        DType::Q5_0 => decode::q5_0(bytes, out),
        DType::Q5_1 => decode::q5_1(bytes, out),
        DType::IQ4NL => decode::iq4_nl(bytes, out),
        DType::Q2K => decode::q2_k(bytes, out),
        DType::Q3K => decode::q3_k(bytes, out),
        DType::Q5K => decode::q5_k(bytes, out),
        DType::IQ4XS => decode::iq4_xs(bytes, out),
        DType::F8E4M3 => {
            let table = f8e4m3_table();
            for (o, &c) in out.iter_mut().zip(bytes) {
                *o = table[c as usize];
            }
        }
        // Plain dtypes are handled by `dequantize_row_into`; nothing else reaches here.
        _ => out.fill(f32::NAN),
    }
}

// ─────────────────────────── fused row dots ───────────────────────────

/// `Σ_j x[j]·w[j]` with w one row of blocks, decoded on the fly (never written out):
/// per block the scale multiplies a 16-lane partial sum of `x·q`, and a block's offset
/// (`m` of Q4_1, `dmin·m` of Q4_K) multiplies the precomputed sum of x over its 32
/// elements (`xsum32`), since `Σ x·(d·q + m) = d·Σ x·q + m·Σ x`. Used for token-by-token
/// decoding, where W is read once per output and decoding to a row buffer would double
/// the work. `mul_add` makes the FMA explicit (fused on the AVX paths; the portable
/// path without FMA hardware calls libm's exact `fmaf`).
mod fused_dot {
    use super::*;

    /// `a + b` lane-wise.
    #[inline(always)]
    fn add16(a: &[f32; 16], b: &[f32; 16]) -> [f32; 16] {
        let mut out = [0.0f32; 16];
        for l in 0..16 {
            out[l] = a[l] + b[l];
        }
        out
    }

    /// Sum of 16 lanes as a tree: 4 dependent adds rather than 15. Out of line: inlined,
    /// it leads the vectorizer to split the accumulator loops into narrow pieces.
    #[inline(never)]
    fn hsum16(acc: &[f32; 16]) -> f32 {
        let mut v = *acc;
        for width in [8, 4, 2, 1] {
            for l in 0..width {
                v[l] += v[l + width];
            }
        }
        v[0]
    }

    /// The little-endian f16 at `b[at..at + 2]` as f32 (one 16-bit load).
    #[inline(always)]
    fn f16_le(b: &[u8], at: usize) -> f32 {
        let bits: [u8; 2] = b[at..at + 2].try_into().unwrap_or([0, 0]);
        f16::from_bits(u16::from_le_bytes(bits)).to_f32()
    }

    /// One Q8_0 block into `acc`: `acc += d·(x·q)` lane-wise.
    #[inline(always)]
    fn q8_0_block(b: &[u8], xs: &[f32], acc: &mut [f32; 16]) {
        let d = f16_le(b, 0);
        let (qs, (xl, xh)) = (&b[2..2 + QK], xs.split_at(16));
        for l in 0..16 {
            let t = xl[l].mul_add(f32::from(qs[l] as i8), xh[l] * f32::from(qs[l + 16] as i8));
            acc[l] = d.mul_add(t, acc[l]);
        }
    }

    /// Q8_0: `Σ_blocks d·Σ x·q` (two blocks a step into two accumulators).
    #[inline(always)]
    fn q8_0_row(bytes: &[u8], x: &[f32], _xsum32: &[f32]) -> f32 {
        let (mut acc0, mut acc1) = ([0.0f32; 16], [0.0f32; 16]);
        for (b, xs) in bytes.chunks_exact(68).zip(x.chunks_exact(2 * QK)) {
            q8_0_block(&b[..34], &xs[..QK], &mut acc0);
            q8_0_block(&b[34..], &xs[QK..], &mut acc1);
        }
        let n = bytes.len() / 34;
        if n % 2 == 1 {
            q8_0_block(&bytes[(n - 1) * 34..], &x[(n - 1) * QK..], &mut acc0);
        }
        hsum16(&add16(&acc0, &acc1))
    }
    /// Q4_0: `Σ_blocks d·Σ x·(q − 8)`.
    #[inline(always)]
    fn q4_0_row(bytes: &[u8], x: &[f32], _xsum32: &[f32]) -> f32 {
        let mut acc = [0.0f32; 16];
        for (b, xs) in bytes.chunks_exact(18).zip(x.chunks_exact(QK)) {
            let d = f16_at(b, 0);
            let (qs, (xl, xh)) = (&b[2..2 + QK / 2], xs.split_at(16));
            for l in 0..16 {
                let lo = f32::from(i16::from(qs[l] & 0x0F) - 8);
                let hi = f32::from(i16::from(qs[l] >> 4) - 8);
                acc[l] = d.mul_add(xl[l].mul_add(lo, xh[l] * hi), acc[l]);
            }
        }
        acc.iter().sum::<f32>()
    }
    /// One Q4_1 block: `acc += d·(x·q)` lane-wise, `offset += m·Σx`.
    #[inline(always)]
    fn q4_1_block(b: &[u8], xs: &[f32], sx: f32, acc: &mut [f32; 16], offset: &mut f32) {
        let (d, m) = (f16_le(b, 0), f16_le(b, 2));
        let (qs, (xl, xh)) = (&b[4..4 + QK / 2], xs.split_at(16));
        for l in 0..16 {
            let t = xl[l].mul_add(f32::from(qs[l] & 0x0F), xh[l] * f32::from(qs[l] >> 4));
            acc[l] = d.mul_add(t, acc[l]);
        }
        *offset = m.mul_add(sx, *offset);
    }

    /// Q4_1: `Σ_blocks d·Σ x·q + m·Σ x` (two blocks a step into two accumulators).
    #[inline(always)]
    fn q4_1_row(bytes: &[u8], x: &[f32], xsum32: &[f32]) -> f32 {
        let (mut acc0, mut acc1) = ([0.0f32; 16], [0.0f32; 16]);
        let (mut off0, mut off1) = (0.0f32, 0.0f32);
        for ((b, xs), sx) in bytes.chunks_exact(40).zip(x.chunks_exact(2 * QK)).zip(xsum32.chunks_exact(2)) {
            q4_1_block(&b[..20], &xs[..QK], sx[0], &mut acc0, &mut off0);
            q4_1_block(&b[20..], &xs[QK..], sx[1], &mut acc1, &mut off1);
        }
        let n = bytes.len() / 20;
        if n % 2 == 1 {
            q4_1_block(&bytes[(n - 1) * 20..], &x[(n - 1) * QK..], xsum32[n - 1], &mut acc0, &mut off0);
        }
        hsum16(&add16(&acc0, &acc1)) + (off0 + off1)
    }
    /// Q4_K: per sub-block of 32, `d·sc·Σ x·q − dmin·m·Σ x`.
    #[inline(always)]
    fn q4_k_row(bytes: &[u8], x: &[f32], xsum32: &[f32]) -> f32 {
        // Four accumulators (pair parity × half) keep each FMA chain a quarter as long.
        let mut acc = [[0.0f32; 16]; 4];
        let mut offsets = 0.0f32;
        for ((b, xs), sums) in bytes.chunks_exact(144).zip(x.chunks_exact(QK_K)).zip(xsum32.chunks_exact(8)) {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let (scales, qs) = (&b[4..16], &b[16..144]);
            for pair in 0..4 {
                let (sc1, m1) = scale_min_k4(2 * pair, scales);
                let (sc2, m2) = scale_min_k4(2 * pair + 1, scales);
                let (d1, d2) = (d * f32::from(sc1), d * f32::from(sc2));
                offsets += dmin * (f32::from(m1) * sums[2 * pair] + f32::from(m2) * sums[2 * pair + 1]);
                let q = &qs[32 * pair..32 * pair + 32];
                let (xl, xh) = xs[64 * pair..64 * pair + 64].split_at(32);
                for half in 0..2 {
                    let (q, xl, xh) = (&q[16 * half..16 * half + 16], &xl[16 * half..], &xh[16 * half..]);
                    let acc = &mut acc[2 * (pair % 2) + half];
                    for l in 0..16 {
                        let lo = xl[l] * f32::from(q[l] & 0x0F);
                        acc[l] = d2.mul_add(xh[l] * f32::from(q[l] >> 4), d1.mul_add(lo, acc[l]));
                    }
                }
            }
        }
        hsum16(&add16(&add16(&acc[0], &acc[1]), &add16(&acc[2], &acc[3]))) - offsets
    }
    /// Q6_K: per sub-block of 16, `d·scale·Σ x·(q − 32)`.
    #[inline(always)]
    fn q6_k_row(bytes: &[u8], x: &[f32], _xsum32: &[f32]) -> f32 {
        // Four accumulators (half × part) keep each FMA chain a quarter as long.
        let mut acc = [[0.0f32; 16]; 4];
        for (b, xs) in bytes.chunks_exact(210).zip(x.chunks_exact(QK_K)) {
            let d = f16_at(b, 208);
            for half in 0..2 {
                // As `decode_q6_k_block`: element 32g + l of this half takes ql[l + 32(g % 2)]
                // (low nibble for g < 2), bits 2g..2g+2 of qh[l], and scale 2g + l/16.
                let ql = &b[64 * half..64 * half + 64];
                let qh = &b[128 + 32 * half..128 + 32 * half + 32];
                let sc = &b[192 + 8 * half..192 + 8 * half + 8];
                let x = &xs[128 * half..128 * half + 128];
                for part in 0..2 {
                    let s = |g: usize| d * f32::from(sc[part + 2 * g] as i8);
                    let (s0, s1, s2, s3) = (s(0), s(1), s(2), s(3));
                    let o = 16 * part;
                    let acc = &mut acc[2 * half + part];
                    let (ql0, ql1, qh) = (&ql[o..o + 16], &ql[o + 32..o + 48], &qh[o..o + 16]);
                    let (x0, x1, x2, x3) = (&x[o..o + 16], &x[o + 32..o + 48], &x[o + 64..o + 80], &x[o + 96..o + 112]);
                    for l in 0..16 {
                        let q1 = f32::from(i16::from((ql0[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32);
                        let q2 = f32::from(i16::from((ql1[l] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32);
                        let q3 = f32::from(i16::from((ql0[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                        let q4 = f32::from(i16::from((ql1[l] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                        let a = s0.mul_add(x0[l] * q1, acc[l]);
                        let a = s1.mul_add(x1[l] * q2, a);
                        let a = s2.mul_add(x2[l] * q3, a);
                        acc[l] = s3.mul_add(x3[l] * q4, a);
                    }
                }
            }
        }
        hsum16(&add16(&add16(&acc[0], &acc[1]), &add16(&acc[2], &acc[3])))
    }

    /// Q5_0: `Σ_blocks d·Σ x·(q − 16)`.
    #[inline(always)]
    fn q5_0_row(bytes: &[u8], x: &[f32], _xsum32: &[f32]) -> f32 {
        let mut acc = [0.0f32; 16];
        for (b, xs) in bytes.chunks_exact(22).zip(x.chunks_exact(QK)) {
            let d = f16_le(b, 0);
            let q = q5_levels(u32_at(b, 2), &b[6..22]);
            let (xl, xh) = xs.split_at(16);
            for l in 0..16 {
                let lo = f32::from(i16::from(q[l]) - 16);
                let hi = f32::from(i16::from(q[l + 16]) - 16);
                acc[l] = d.mul_add(xl[l].mul_add(lo, xh[l] * hi), acc[l]);
            }
        }
        hsum16(&acc)
    }
    /// Q5_1: `Σ_blocks d·Σ x·q + m·Σ x`.
    #[inline(always)]
    fn q5_1_row(bytes: &[u8], x: &[f32], xsum32: &[f32]) -> f32 {
        let mut acc = [0.0f32; 16];
        let mut offset = 0.0f32;
        for ((b, xs), &sx) in bytes.chunks_exact(24).zip(x.chunks_exact(QK)).zip(xsum32) {
            let (d, m) = (f16_le(b, 0), f16_le(b, 2));
            let q = q5_levels(u32_at(b, 4), &b[8..24]);
            let (xl, xh) = xs.split_at(16);
            for l in 0..16 {
                let t = xl[l].mul_add(f32::from(q[l]), xh[l] * f32::from(q[l + 16]));
                acc[l] = d.mul_add(t, acc[l]);
            }
            offset = m.mul_add(sx, offset);
        }
        hsum16(&acc) + offset
    }
    /// IQ4_NL: `Σ_blocks d·Σ x·table[q]`.
    #[inline(always)]
    fn iq4_nl_row(bytes: &[u8], x: &[f32], _xsum32: &[f32]) -> f32 {
        let mut acc = [0.0f32; 16];
        for (b, xs) in bytes.chunks_exact(18).zip(x.chunks_exact(QK)) {
            let d = f16_le(b, 0);
            let (qs, (xl, xh)) = (&b[2..18], xs.split_at(16));
            for l in 0..16 {
                let lo = f32::from(IQ4NL_VALUES[usize::from(qs[l] & 0x0F)]);
                let hi = f32::from(IQ4NL_VALUES[usize::from(qs[l] >> 4)]);
                acc[l] = d.mul_add(xl[l].mul_add(lo, xh[l] * hi), acc[l]);
            }
        }
        hsum16(&acc)
    }
    /// Q2_K: per sub-block of 16, `d·sc·Σ x·q − dmin·m·Σ x`.
    #[inline(always)]
    fn q2_k_row(bytes: &[u8], x: &[f32], _xsum32: &[f32]) -> f32 {
        let mut acc = [0.0f32; 16];
        let mut offsets = 0.0f32;
        for (b, xs) in bytes.chunks_exact(84).zip(x.chunks_exact(QK_K)) {
            let (scales, qs) = (&b[0..16], &b[16..80]);
            let (d, dmin) = (f16_le(b, 80), f16_le(b, 82));
            for h in 0..2 {
                for j in 0..4 {
                    for t in 0..2 {
                        let sc = scales[8 * h + 2 * j + t];
                        let dl = d * f32::from(sc & 0x0F);
                        let q = &qs[32 * h + 16 * t..32 * h + 16 * t + 16];
                        let xs = &xs[128 * h + 32 * j + 16 * t..][..16];
                        let mut sx = 0.0f32;
                        for l in 0..16 {
                            acc[l] = dl.mul_add(xs[l] * f32::from((q[l] >> (2 * j)) & 3), acc[l]);
                            sx += xs[l];
                        }
                        offsets = (dmin * f32::from(sc >> 4)).mul_add(sx, offsets);
                    }
                }
            }
        }
        hsum16(&acc) - offsets
    }
    /// Q3_K: per sub-block of 16, `d·(sc − 32)·Σ x·(q − 4)`.
    #[inline(always)]
    fn q3_k_row(bytes: &[u8], x: &[f32], _xsum32: &[f32]) -> f32 {
        let mut acc = [0.0f32; 16];
        for (b, xs) in bytes.chunks_exact(110).zip(x.chunks_exact(QK_K)) {
            let (hmask, qs) = (&b[0..32], &b[32..96]);
            let scales = q3_k_scales(&b[96..108]);
            let d = f16_le(b, 108);
            for h in 0..2 {
                for j in 0..4 {
                    for t in 0..2 {
                        let dl = d * f32::from(scales[8 * h + 2 * j + t]);
                        let q = &qs[32 * h + 16 * t..32 * h + 16 * t + 16];
                        let hm = &hmask[16 * t..16 * t + 16];
                        let xs = &xs[128 * h + 32 * j + 16 * t..][..16];
                        for l in 0..16 {
                            let high = if hm[l] & (1 << (4 * h + j)) != 0 { 0 } else { 4 };
                            let q = f32::from(((q[l] >> (2 * j)) & 3) as i8 - high);
                            acc[l] = dl.mul_add(xs[l] * q, acc[l]);
                        }
                    }
                }
            }
        }
        hsum16(&acc)
    }
    /// Q5_K: per sub-block of 32, `d·sc·Σ x·q − dmin·m·Σ x`.
    #[inline(always)]
    fn q5_k_row(bytes: &[u8], x: &[f32], xsum32: &[f32]) -> f32 {
        // Four accumulators (pair parity × half) keep each FMA chain a quarter as long.
        let mut acc = [[0.0f32; 16]; 4];
        let mut offsets = 0.0f32;
        for ((b, xs), sums) in bytes.chunks_exact(176).zip(x.chunks_exact(QK_K)).zip(xsum32.chunks_exact(8)) {
            let (d, dmin) = (f16_le(b, 0), f16_le(b, 2));
            let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
            for pair in 0..4 {
                let (sc1, m1) = scale_min_k4(2 * pair, scales);
                let (sc2, m2) = scale_min_k4(2 * pair + 1, scales);
                let (d1, d2) = (d * f32::from(sc1), d * f32::from(sc2));
                offsets += dmin * (f32::from(m1) * sums[2 * pair] + f32::from(m2) * sums[2 * pair + 1]);
                let q = &qs[32 * pair..32 * pair + 32];
                let (xl, xh) = xs[64 * pair..64 * pair + 64].split_at(32);
                for half in 0..2 {
                    let r = 16 * half..16 * half + 16;
                    let (q, qh, xl, xh) = (&q[r.clone()], &qh[r.clone()], &xl[r.clone()], &xh[r]);
                    let acc = &mut acc[2 * (pair % 2) + half];
                    for l in 0..16 {
                        let lo = (q[l] & 0x0F) | (((qh[l] >> (2 * pair)) & 1) << 4);
                        let hi = (q[l] >> 4) | (((qh[l] >> (2 * pair + 1)) & 1) << 4);
                        let a = d1.mul_add(xl[l] * f32::from(lo), acc[l]);
                        acc[l] = d2.mul_add(xh[l] * f32::from(hi), a);
                    }
                }
            }
        }
        hsum16(&add16(&add16(&acc[0], &acc[1]), &add16(&acc[2], &acc[3]))) - offsets
    }
    /// IQ4_XS: per sub-block of 32, `d·(ls − 32)·Σ x·table[q]`.
    #[inline(always)]
    fn iq4_xs_row(bytes: &[u8], x: &[f32], _xsum32: &[f32]) -> f32 {
        let mut acc = [0.0f32; 16];
        for (b, xs) in bytes.chunks_exact(136).zip(x.chunks_exact(QK_K)) {
            let d = f16_le(b, 0);
            for ib in 0..8 {
                let dl = d * iq4_xs_scale(b, ib) as f32;
                let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
                let (xl, xh) = xs[32 * ib..32 * ib + 32].split_at(16);
                for l in 0..16 {
                    let lo = f32::from(IQ4NL_VALUES[usize::from(qs[l] & 0x0F)]);
                    let hi = f32::from(IQ4NL_VALUES[usize::from(qs[l] >> 4)]);
                    acc[l] = dl.mul_add(xl[l].mul_add(lo, xh[l] * hi), acc[l]);
                }
            }
        }
        hsum16(&acc)
    }

    /// Asks for the cache lines of `bytes` ahead of use (W rows stream from memory).
    #[inline(always)]
    fn prefetch(bytes: &[u8]) {
        #[cfg(target_arch = "x86_64")]
        for line in bytes.chunks(64) {
            // SAFETY: a prefetch is only a hint; the address lies inside `bytes`.
            unsafe { std::arch::x86_64::_mm_prefetch(line.as_ptr() as *const i8, std::arch::x86_64::_MM_HINT_T0) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = bytes;
    }

    macro_rules! rows_of {
        ($($name:ident => $row:ident),*) => {$(
            multiversion! {
                /// `out[r] = Σ_j x[j]·W[r, j]` for the `out.len()` rows of blocks in `w`.
                pub fn $name(w: &[u8], x: &[f32], xsum32: &[f32], out: &mut [f32]) {
                    let row_bytes = w.len() / out.len().max(1);
                    for (r, (o, row)) in out.iter_mut().zip(w.chunks_exact(row_bytes.max(1))).enumerate() {
                        // Two rows ahead, so the lines arrive while this row is computed.
                        prefetch(w.get((r + 2) * row_bytes..(r + 3) * row_bytes).unwrap_or(&[]));
                        *o = $row(row, x, xsum32);
                    }
                }
            }
        )*};
    }
    rows_of!(
        q8_0 => q8_0_row, q4_0 => q4_0_row, q4_1 => q4_1_row, q4_k => q4_k_row, q6_k => q6_k_row,
        q5_0 => q5_0_row, q5_1 => q5_1_row, iq4_nl => iq4_nl_row, q2_k => q2_k_row, q3_k => q3_k_row,
        q5_k => q5_k_row, iq4_xs => iq4_xs_row
    );
}

/// `out[r] = Σ_j x[j]·W[r, j]` for the `out.len()` rows of `w` (whole rows of a block
/// format; see [`fused_dot`]); `xsum32` holds the sums of x over each run of 32.
/// Returns false for FP8, which has no fused form.
fn fused_rows(dtype: DType, w: &[u8], x: &[f32], xsum32: &[f32], out: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if x86::fused_rows(dtype, w, x, xsum32, out) {
        return true;
    }
    match dtype {
        DType::Q8_0 => fused_dot::q8_0(w, x, xsum32, out),
        DType::Q4_0 => fused_dot::q4_0(w, x, xsum32, out),
        DType::Q4_1 => fused_dot::q4_1(w, x, xsum32, out),
        DType::Q4K => fused_dot::q4_k(w, x, xsum32, out),
        DType::Q6K => fused_dot::q6_k(w, x, xsum32, out),
        DType::Q5_0 => fused_dot::q5_0(w, x, xsum32, out),
        DType::Q5_1 => fused_dot::q5_1(w, x, xsum32, out),
        DType::IQ4NL => fused_dot::iq4_nl(w, x, xsum32, out),
        DType::Q2K => fused_dot::q2_k(w, x, xsum32, out),
        DType::Q3K => fused_dot::q3_k(w, x, xsum32, out),
        DType::Q5K => fused_dot::q5_k(w, x, xsum32, out),
        DType::IQ4XS => fused_dot::iq4_xs(w, x, xsum32, out),
        _ => return false,
    }
    true
}

/// `out[r·m + i] = Σ_j x_i[j]·W[r, j]` for the `out.len() / m` rows of `w` and the `m`
/// rows `x_i` of `xs` (`k` elements each; `xsum32` holds each row's `nb` = ⌈k/32⌉ sums
/// over runs of 32). Every `out[r·m + i]` has the bits [`fused_rows`] gives for x_i
/// alone: the x86 kernels that decode a block once for several x rows repeat the one-row
/// kernel's operations per x row; elsewhere each x row runs the one-row kernel. Returns
/// false for FP8, which has no fused form.
#[allow(clippy::too_many_arguments)]
fn fused_rows_multi(
    dtype: DType,
    w: &[u8],
    xs: &[f32],
    k: usize,
    nb: usize,
    xsum32: &[f32],
    m: usize,
    out: &mut [f32],
) -> bool {
    if m == 1 {
        return fused_rows(dtype, w, xs, xsum32, out);
    }
    #[cfg(target_arch = "x86_64")]
    if x86::fused_rows_multi(dtype, w, xs, k, xsum32, m, out) {
        return true;
    }
    let mut col = vec![0.0f32; out.len() / m];
    for (i, (x, sums)) in xs.chunks_exact(k).zip(xsum32.chunks_exact(nb)).enumerate() {
        if !fused_rows(dtype, w, x, sums, &mut col) {
            return false;
        }
        for (outs, &v) in out.chunks_exact_mut(m).zip(&col) {
            outs[i] = v;
        }
    }
    true
}

// ─────────────────────────────── quantizing ───────────────────────────────

/// `quantize_row_q8_0_ref`: d = max|x|/127, q = round(x/d) (half away from zero).
#[inline(always)]
fn quantize_q8_0_block(x: &[f32], out: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(out, 0, d);
    for (q, &v) in out[2..2 + QK].iter_mut().zip(x) {
        *q = (v * id).round() as i8 as u8;
    }
}

/// The value of largest magnitude in `x` (the first one on ties), as ggml's Q4_0 picks it.
#[inline(always)]
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// `quantize_row_q4_0_ref`: d = max/−8 for the value `max` of largest magnitude, so that
/// value lands exactly on q = 0; q = min(15, trunc(x/d + 8.5)).
#[inline(always)]
fn quantize_q4_0_block(x: &[f32], out: &mut [u8]) {
    let d = signed_absmax(x) / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(out, 0, d);
    let nibble = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
    for j in 0..QK / 2 {
        out[2 + j] = nibble(x[j]) | (nibble(x[j + QK / 2]) << 4);
    }
}

/// The block's minimum and maximum as ggml's `_1` quantizers find them (starting from
/// ±FLT_MAX, strict comparisons: a NaN never replaces either).
#[inline(always)]
fn block_min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `quantize_row_q4_1_ref`: d = (max − min)/15, m = min, q = min(15, trunc((x − min)/d + 0.5)).
#[inline(always)]
fn quantize_q4_1_block(x: &[f32], out: &mut [u8]) {
    let (min, max) = block_min_max(x);
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(out, 0, d);
    put_f16(out, 2, min);
    let nibble = |v: f32| (((v - min) * id + 0.5) as i32).clamp(0, 15) as u8;
    for j in 0..QK / 2 {
        out[4 + j] = nibble(x[j]) | (nibble(x[j + QK / 2]) << 4);
    }
}

/// ggml's `make_qkx2_quants` with its Q4_K arguments: fits `x ≈ scale·L − min` (L in
/// 0..=nmax, min ≥ 0) minimising the `weights`-weighted squared error, starting from the
/// plain min/max grid and trying `nstep + 1` nearby grids (`rmin + rdelta·is` extra levels),
/// each refined by weighted least squares. Returns `(scale, min)`; `levels` gets L.
#[inline(always)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        min = min.min(x[i]);
        max = max.max(x[i]);
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    let level = |iscale: f32, v: f32, min: f32| nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;
    // ggml weighs |diff| (`use_mad`) or diff², then multiplies by the weight.
    let error_of = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        levels[i] = level(iscale, x[i], min);
        best_error += weights[i] * error_of(scale * f32::from(levels[i]) + min - x[i]);
    }
    let mut trial = [0u8; QK];
    let trial = &mut trial[..n];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            trial[i] = level(iscale, x[i], min);
            let (w, l) = (weights[i], f32::from(trial[i]));
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut error = 0.0f32;
            for i in 0..n {
                error += weights[i] * error_of(this_scale * f32::from(trial[i]) + this_min - x[i]);
            }
            if error < best_error {
                levels.copy_from_slice(trial);
                best_error = error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Quantizes the 8 sub-block scales and mins of a Q4_K / Q5_K block to 6 bits against
/// the largest of each (`63/max`) and packs them into the 12 bytes `packed` (the layout
/// [`scale_min_k4`] reads).
#[inline(always)]
fn pack_k4_scales(scales: &[f32; 8], mins: &[f32; 8], max_scale: f32, max_min: f32, packed: &mut [u8]) {
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    packed.fill(0);
    for j in 0..8 {
        let ls = nearest_int(inv_scale * scales[j]).clamp(0, 63) as u8;
        let lm = nearest_int(inv_min * mins[j]).clamp(0, 63) as u8;
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
}

/// The shared part of the Q4_K and Q5_K quantizers (`quantize_row_q{4,5}_K_ref`): per
/// sub-block of 32 a weighted (weights `√mean(x²) + |x|`) scale/min fit with `nmax + 1`
/// levels (`make_qkx2_quants(nmax, …, rmin, 0.1, nstep)`); the 8 scales and mins are
/// quantized to 6 bits against the largest (`d = max_scale/63`, `dmin = max_min/63`) into
/// `head` (d, dmin, 12 scale bytes), and the levels recomputed with the scales as stored.
#[inline(always)]
fn k4_header_and_levels(x: &[f32], head: &mut [u8], nmax: i32, rmin: f32, nstep: i32) -> [u8; QK_K] {
    let mut levels = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let av_x = (xs.iter().map(|v| v * v).sum::<f32>() / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|l| av_x + xs[l].abs());
        let (scale, min) =
            make_qkx2_quants(nmax, xs, &weights, &mut levels[32 * j..32 * j + 32], rmin, 0.1, nstep, false);
        scales[j] = scale;
        mins[j] = min;
        max_scale = max_scale.max(scale);
        max_min = max_min.max(min);
    }
    pack_k4_scales(&scales, &mins, max_scale, max_min, &mut head[4..16]);
    let d = put_f16(head, 0, max_scale / 63.0);
    let dmin = put_f16(head, 2, max_min / 63.0);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &head[4..16]);
        let dj = d * f32::from(sc);
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * f32::from(m);
        for ii in 0..32 {
            levels[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    levels
}

/// `quantize_row_q4_K_ref`: [`k4_header_and_levels`] with 16 levels (`rmin = −1`, `nstep = 20`),
/// two 4-bit levels a byte.
#[inline(always)]
fn quantize_q4_k_block(x: &[f32], out: &mut [u8]) {
    let levels = k4_header_and_levels(x, &mut out[..16], 15, -1.0, 20);
    let qs = &mut out[16..144];
    for pair in 0..4 {
        for l in 0..32 {
            qs[32 * pair + l] = levels[64 * pair + l] | (levels[64 * pair + l + 32] << 4);
        }
    }
}

/// ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights: a signed scale
/// for `x ≈ scale·(L − nmax)` (L in 0..2·nmax) maximising `(Σ w·x·l)²/Σ w·l²` with
/// `w = x²`, over 19 grids around `−nmax/max`. Returns the scale; `levels` gets L.
#[inline(always)]
fn make_qx_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let l = level(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let assign = |iscale: f32, levels: &mut [i8]| {
        for (slot, &v) in levels.iter_mut().zip(x) {
            *slot = (nmax + level(iscale, v)) as i8;
        }
    };
    let iscale = -(nmax as f32) / max;
    assign(iscale, levels);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            assign(iscale, levels);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `quantize_row_q6_K_ref`: a signed scale per sub-block of 16 (`make_qx_quants`, 32
/// levels each side), the 16 scales quantized to i8 against the largest in magnitude
/// (`d = −max_scale/128`), then the 6-bit levels recomputed with the stored scales.
#[inline(always)]
fn quantize_q6_k_block(x: &[f32], out: &mut [u8]) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for ib in 0..16 {
        let scale = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut levels[16 * ib..16 * ib + 16]);
        scales[ib] = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    out.fill(0);
    if max_abs_scale < GROUP_MAX_EPS {
        return; // all zeros: d = 0 and every field 0
    }
    let iscale = -128.0 / max_scale;
    let d = put_f16(out, 208, 1.0 / iscale);
    let mut stored = [0i8; 16];
    for ib in 0..16 {
        stored[ib] = nearest_int(iscale * scales[ib]).clamp(-128, 127) as i8;
        out[192 + ib] = stored[ib] as u8;
    }
    for j in 0..16 {
        let dj = d * f32::from(stored[j]);
        if dj == 0.0 {
            continue;
        }
        for ii in 0..16 {
            levels[16 * j + ii] = (nearest_int(x[16 * j + ii] / dj).clamp(-32, 31) + 32) as i8;
        }
    }
    for half in 0..2 {
        let l6 = |i: usize| levels[128 * half + i] as u8;
        for l in 0..32 {
            out[64 * half + l] = (l6(l) & 0x0F) | ((l6(l + 64) & 0x0F) << 4);
            out[64 * half + l + 32] = (l6(l + 32) & 0x0F) | ((l6(l + 96) & 0x0F) << 4);
            out[128 + 32 * half + l] =
                (l6(l) >> 4) | ((l6(l + 32) >> 4) << 2) | ((l6(l + 64) >> 4) << 4) | ((l6(l + 96) >> 4) << 6);
        }
    }
}

/// Packs the 5-bit levels `q` of a Q5_0 / Q5_1 block: nibbles into `qs` as Q4_0, the
/// fifth bits into the little-endian u32 `qh` (bit j for element j).
#[inline(always)]
fn put_q5_levels(q: &[u8; QK], qh_out: &mut [u8], qs: &mut [u8]) {
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        qs[j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
        qh |= u32::from((q[j] & 0x10) >> 4) << j;
        qh |= u32::from((q[j + 16] & 0x10) >> 4) << (j + 16);
    }
    qh_out.copy_from_slice(&qh.to_le_bytes());
}

/// `quantize_row_q5_0_ref`: d = max/−16 for the value `max` of largest magnitude;
/// q = min(31, trunc(x/d + 16.5)).
#[inline(always)]
fn quantize_q5_0_block(x: &[f32], out: &mut [u8]) {
    let d = signed_absmax(x) / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(out, 0, d);
    let q: [u8; QK] = std::array::from_fn(|j| ((x[j] * id + 16.5) as i32).clamp(0, 31) as u8);
    let (qh, qs) = out[2..22].split_at_mut(4);
    put_q5_levels(&q, qh, qs);
}

/// `quantize_row_q5_1_ref`: d = (max − min)/31, m = min, q = trunc((x − min)/d + 0.5).
#[inline(always)]
fn quantize_q5_1_block(x: &[f32], out: &mut [u8]) {
    let (min, max) = block_min_max(x);
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(out, 0, d);
    put_f16(out, 2, min);
    // ggml stores the level unclamped through a u8 and keeps 5 bits of it.
    let q: [u8; QK] = std::array::from_fn(|j| (((x[j] - min) * id + 0.5) as i32) as u8);
    let (qh, qs) = out[4..24].split_at_mut(4);
    put_q5_levels(&q, qh, qs);
}

/// ggml's `best_index_int8`: the index of the entry of the ascending `values` nearest to
/// `x` (the upper one on ties), by bisection.
#[inline(always)]
fn best_index_int8(values: &[i8; 16], x: f32) -> u8 {
    if x <= f32::from(values[0]) {
        return 0;
    }
    if x >= f32::from(values[15]) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < f32::from(values[mav]) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - f32::from(values[mu - 1]) < f32::from(values[mu]) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// The sub-block fit of ggml's `quantize_row_iq4_nl_impl` without importance weights
/// (weights x², 7 tries each side): the scale d of `x ≈ d·table[L]` maximising
/// `(Σ w·x·q)²/Σ w·q²` over grids `(−127 + t)/max`, t = −7..7, where `max` is the value of
/// largest magnitude. Returns 0 for an all-zero group (and leaves `levels` alone).
#[inline(always)]
fn iq4_fit(x: &[f32], levels: &mut [u8]) -> f32 {
    let values = &IQ4NL_VALUES;
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let sums = |id: f32, levels: Option<&mut [u8]>| {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        let mut levels = levels;
        for (j, &v) in x.iter().enumerate() {
            let l = best_index_int8(values, id * v);
            if let Some(levels) = levels.as_deref_mut() {
                levels[j] = l;
            }
            let q = f32::from(values[usize::from(l)]);
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let d = -max / f32::from(values[0]);
    let (sumqx, sumq2) = sums(1.0 / d, Some(levels));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -7..=7 {
        let id = (itry + i32::from(values[0])) as f32 / max;
        let (sumqx, sumq2) = sums(id, None);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs 32 IQ4 indices: element j < 16 in the low nibble of byte j, element j + 16 in
/// its high nibble.
#[inline(always)]
fn put_nibbles32(levels: &[u8], qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = levels[j] | (levels[j + 16] << 4);
    }
}

/// ggml's `quantize_iq4_nl` without importance weights (what `ggml_quantize_chunk`
/// writes): the scale from [`iq4_fit`] stored as f16, the indices recomputed against the
/// unrounded scale.
#[inline(always)]
fn quantize_iq4_nl_block(x: &[f32], out: &mut [u8]) {
    let mut levels = [0u8; QK];
    let d = iq4_fit(x, &mut levels);
    put_f16(out, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (l, &v) in levels.iter_mut().zip(x) {
        *l = best_index_int8(&IQ4NL_VALUES, id * v);
    }
    put_nibbles32(&levels, &mut out[2..18]);
}

/// ggml's `quantize_iq4_xs` without importance weights: a scale per sub-block of 32 from
/// [`iq4_fit`], the 8 scales quantized to signed 6 bits against the largest in magnitude
/// (`d = −max_scale/32`), the indices recomputed against each `d·l` (unrounded `d`).
#[inline(always)]
fn quantize_iq4_xs_block(x: &[f32], out: &mut [u8]) {
    let mut levels = [0u8; QK];
    let mut scales = [0.0f32; 8];
    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    for ib in 0..8 {
        scales[ib] = iq4_fit(&x[32 * ib..32 * ib + 32], &mut levels);
        if scales[ib].abs() > amax_scale {
            amax_scale = scales[ib].abs();
            max_scale = scales[ib];
        }
    }
    out.fill(0);
    let d = -max_scale / 32.0;
    put_f16(out, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut scales_h = 0u16;
    for ib in 0..8 {
        let l = nearest_int(id * scales[ib]).clamp(-32, 31);
        let dl = d * l as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        let xb = &x[32 * ib..32 * ib + 32];
        for (slot, &v) in levels.iter_mut().zip(xb) {
            *slot = best_index_int8(&IQ4NL_VALUES, idl * v);
        }
        put_nibbles32(&levels, &mut out[8 + 16 * ib..8 + 16 * ib + 16]);
        let l = (l + 32) as u8;
        out[4 + ib / 2] |= (l & 0x0F) << (4 * (ib % 2));
        scales_h |= u16::from(l >> 4) << (2 * ib);
    }
    out[2..4].copy_from_slice(&scales_h.to_le_bytes());
}

/// Packs 256 2-bit values (the low 2 bits of `levels`) as Q2_K / Q3_K do: element
/// 128h + 32j + l goes to bits 2j.. of byte 32h + l.
#[inline(always)]
fn put_2bit_levels(levels: &[u8], qs: &mut [u8]) {
    for h in 0..2 {
        for l in 0..32 {
            let at = 128 * h + l;
            qs[32 * h + l] = levels[at] | (levels[at + 32] << 2) | (levels[at + 64] << 4) | (levels[at + 96] << 6);
        }
    }
}

/// `quantize_row_q2_K_ref`: per sub-block of 16 a `|x|`-weighted scale/min fit with 4
/// levels (`make_qkx2_quants`, absolute error); scales and mins quantized to 4 bits
/// against the block's largest (`d = max_scale/15`, `dmin = max_min/15`), then the
/// levels recomputed with the stored values.
#[inline(always)]
fn quantize_q2_k_block(x: &[f32], out: &mut [u8]) {
    let mut levels = [0u8; QK_K];
    let mut scales = [0.0f32; 16];
    let mut mins = [0.0f32; 16];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        let weights: [f32; 16] = std::array::from_fn(|l| xs[l].abs());
        let (scale, min) = make_qkx2_quants(3, xs, &weights, &mut levels[16 * j..16 * j + 16], -0.5, 0.1, 15, true);
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    out.fill(0);
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for j in 0..16 {
            out[j] = nearest_int(iscale * scales[j]) as u8;
        }
        put_f16(out, 80, max_scale / 15.0);
    } else {
        put_f16(out, 80, 0.0);
    }
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for j in 0..16 {
            out[j] |= (nearest_int(iscale * mins[j]) as u8) << 4;
        }
        put_f16(out, 82, max_min / 15.0);
    } else {
        put_f16(out, 82, 0.0);
    }
    let (d, dmin) = (f16_at(out, 80), f16_at(out, 82));
    for j in 0..16 {
        let dj = d * f32::from(out[j] & 0x0F);
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * f32::from(out[j] >> 4);
        for ii in 0..16 {
            levels[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / dj).clamp(0, 3) as u8;
        }
    }
    put_2bit_levels(&levels, &mut out[16..80]);
}

/// ggml's `make_q3_quants` with `do_rmse`: a signed scale for `x ≈ scale·l`
/// (l in −nmax..nmax) starting from `−nmax/max`, then up to 5 passes that move single
/// levels where that raises `(Σ w·x·l)²/Σ w·l²` (w = x²). Returns the scale; `levels`
/// gets l + nmax (0 for an all-zero group).
#[inline(always)]
fn make_q3_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (slot, &v) in levels.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *slot = l as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (slot, &v) in levels.iter_mut().zip(x) {
            let w = v * v;
            let old = f32::from(*slot);
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != i32::from(*slot) {
                    let nl = new_l as f32;
                    slx += w * v * nl;
                    sl2 += w * nl * nl;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *slot = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for slot in levels.iter_mut() {
        *slot += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// `quantize_row_q3_K_ref`: a signed scale per sub-block of 16 (`make_q3_quants`, 8
/// levels), the 16 scales quantized to signed 6 bits against the largest in magnitude
/// (`d = −max_scale/32`), then the levels recomputed with the stored scales; the third
/// bit of each level goes to `hmask`, the low two to `qs`.
#[inline(always)]
fn quantize_q3_k_block(x: &[f32], out: &mut [u8]) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut levels[16 * j..16 * j + 16]);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    out.fill(0);
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        let packed = &mut out[96..108];
        for j in 0..16 {
            let l = (nearest_int(iscale * scales[j]).clamp(-32, 31) + 32) as u8;
            if j < 8 {
                packed[j] = l & 0x0F;
            } else {
                packed[j - 8] |= (l & 0x0F) << 4;
            }
            packed[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
        }
        put_f16(out, 108, 1.0 / iscale);
    } else {
        put_f16(out, 108, 0.0);
    }
    let stored = q3_k_scales(&out[96..108]);
    let d = f16_at(out, 108);
    for j in 0..16 {
        let dj = d * f32::from(stored[j]);
        if dj == 0.0 {
            continue;
        }
        for ii in 0..16 {
            levels[16 * j + ii] = (nearest_int(x[16 * j + ii] / dj).clamp(-4, 3) + 4) as i8;
        }
    }
    let mut low = [0u8; QK_K];
    for (i, (&l, slot)) in levels.iter().zip(low.iter_mut()).enumerate() {
        let mut l = l as u8;
        if l > 3 {
            // Element i's high bit: bit i / 32 of hmask[i % 32].
            out[i % 32] |= 1 << (i / 32);
            l -= 4;
        }
        *slot = l;
    }
    put_2bit_levels(&low, &mut out[32..96]);
}

/// `quantize_row_q5_K_ref`: [`k4_header_and_levels`] with 32 levels (`rmin = −0.5`, `nstep = 15`),
/// the fifth bit of each level in `qh`.
#[inline(always)]
fn quantize_q5_k_block(x: &[f32], out: &mut [u8]) {
    out.fill(0);
    let levels = k4_header_and_levels(x, &mut out[..16], 31, -0.5, 15);
    let (qh, qs) = out[16..176].split_at_mut(32);
    for pair in 0..4 {
        for l in 0..32 {
            let (l1, l2) = (levels[64 * pair + l], levels[64 * pair + l + 32]);
            qh[l] |= ((l1 >> 4) << (2 * pair)) | ((l2 >> 4) << (2 * pair + 1));
            qs[32 * pair + l] = (l1 & 0x0F) | ((l2 & 0x0F) << 4);
        }
    }
}

/// Per-format loops over whole blocks, compiled per ISA. Rust never contracts `a·b + c`
/// into an FMA on its own, so every ISA rounds exactly as the portable code does.
mod encode {
    use super::*;

    multiversion! {
        /// Q8_0: `x` (n·32) → `out` (n·34).
        pub fn q8_0(x: &[f32], out: &mut [u8]) {
            for (xs, o) in x.chunks_exact(QK).zip(out.chunks_exact_mut(34)) {
                quantize_q8_0_block(xs, o);
            }
        }
    }
    multiversion! {
        /// Q4_0: `x` (n·32) → `out` (n·18).
        pub fn q4_0(x: &[f32], out: &mut [u8]) {
            for (xs, o) in x.chunks_exact(QK).zip(out.chunks_exact_mut(18)) {
                quantize_q4_0_block(xs, o);
            }
        }
    }
    multiversion! {
        /// Q4_1: `x` (n·32) → `out` (n·20).
        pub fn q4_1(x: &[f32], out: &mut [u8]) {
            for (xs, o) in x.chunks_exact(QK).zip(out.chunks_exact_mut(20)) {
                quantize_q4_1_block(xs, o);
            }
        }
    }
    multiversion! {
        /// Q4_K: `x` (n·256) → `out` (n·144).
        pub fn q4_k(x: &[f32], out: &mut [u8]) {
            for (xs, o) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(144)) {
                quantize_q4_k_block(xs, o);
            }
        }
    }
    multiversion! {
        /// Q6_K: `x` (n·256) → `out` (n·210).
        pub fn q6_k(x: &[f32], out: &mut [u8]) {
            for (xs, o) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(210)) {
                quantize_q6_k_block(xs, o);
            }
        }
    }
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
        q5_0 => quantize_q5_0_block, QK, 22;
        q5_1 => quantize_q5_1_block, QK, 24;
        iq4_nl => quantize_iq4_nl_block, QK, 18;
        q2_k => quantize_q2_k_block, QK_K, 84;
        q3_k => quantize_q3_k_block, QK_K, 110;
        q5_k => quantize_q5_k_block, QK_K, 176;
        iq4_xs => quantize_iq4_xs_block, QK_K, 136;
    }
}

/// Quantizes `x` (a whole number of blocks) into `out` (the matching bytes).
fn quantize_into(dtype: DType, x: &[f32], out: &mut [u8]) {
    match dtype {
        DType::Q8_0 => encode::q8_0(x, out),
        DType::Q4_0 => encode::q4_0(x, out),
        DType::Q4_1 => encode::q4_1(x, out),
        DType::Q4K => encode::q4_k(x, out),
        DType::Q6K => encode::q6_k(x, out),
        DType::Q5_0 => encode::q5_0(x, out),
        DType::Q5_1 => encode::q5_1(x, out),
        DType::IQ4NL => encode::iq4_nl(x, out),
        DType::Q2K => encode::q2_k(x, out),
        DType::Q3K => encode::q3_k(x, out),
        DType::Q5K => encode::q5_k(x, out),
        DType::IQ4XS => encode::iq4_xs(x, out),
        _ => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = f32_to_f8e4m3(v);
            }
        }
    }
}

/// Quantizes float values into a GGUF block format or FP8 E4M3. The block formats follow
/// what ggml's `ggml_quantize_chunk` does without an importance matrix, step for step and
/// in the same f32 operation order: `quantize_row_*_ref` for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1
/// and the K-quants (Q2_K, Q4_K and Q5_K with `make_qkx2_quants`, Q3_K with
/// `make_q3_quants`, Q6_K with `make_qx_quants`), and `quantize_iq4_nl` / `quantize_iq4_xs`
/// (7 scale tries each side) for the IQ4 formats. FP8 rounds to nearest even and saturates
/// at ±448.
///
/// # Shapes
/// `[..., n]` F32/F16/BF16, n a multiple of the block size → same shape, dtype `dtype`.
pub fn quantize(cpu: &CpuBackend, x: &Tensor, dtype: DType) -> Result<Tensor> {
    const OP: &str = "quantize";
    host(OP, x)?;
    spec::quant::quantize(x, dtype)?;
    let be = dtype.block_elems();
    let values = convert::f32_data(OP, "x", x)?;
    let mut out = Tensor::zeros(x.shape().clone(), dtype)?;
    // FP8 "blocks" are single bytes: give its tasks as many elements as 64 Q4_K blocks.
    let blocks_per_task = if be == 1 { BLOCKS_PER_TASK * QK_K } else { BLOCKS_PER_TASK };
    let (bb, elems_per_task) = (dtype.block_bytes(), blocks_per_task * be);
    let work = if be == QK_K { 256 } else { 8 };
    cpu.for_each_chunk(out.host_bytes_mut()?, blocks_per_task * bb, work, |i, bytes| {
        let start = i * elems_per_task;
        quantize_into(dtype, &values[start..start + bytes.len() / bb * be], bytes);
    });
    Ok(out)
}

/// Block format or FP8 E4M3 → f32 values.
///
/// # Shapes
/// any (block format or F8E4M3) → same shape, F32.
pub fn dequantize(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    const OP: &str = "dequantize";
    host(OP, x)?;
    let dtype = spec::quant::dequantize(x)?.dtype;
    let bytes = x.host_bytes()?;
    let mut out = Tensor::zeros(x.shape().clone(), DType::F32)?;
    let (be, bb) = (dtype.block_elems(), dtype.block_bytes());
    let elems_per_task = BLOCKS_PER_TASK * be.max(QK);
    cpu.for_each_chunk(out.as_mut_slice::<f32>()?, elems_per_task, 2, |i, chunk| {
        let start = i * elems_per_task / be * bb;
        decode_into(dtype, &bytes[start..start + chunk.len() / be * bb], chunk);
    });
    Ok(out)
}

// ─────────────────────────────── matmul ───────────────────────────────

/// `y = x · Wᵀ` straight from W's blocks (block format or FP8 E4M3), in x's dtype.
///
/// W is never materialised in f32. For up to `SMALL_M` rows of x (token-by-token
/// decoding) each task takes W rows one at a time: for the formats with integer kernels
/// (when the backend was built with `exact_decode(false)`) it dots them in integers with
/// x rounded to 8 bits once per call (see `int`); otherwise it dots the blocks with each
/// x row in f32, each x row with the arithmetic of the one-row kernel (the AVX-512 and
/// AVX2 Q4_0, Q4_1 and Q8_0 kernels decode a block once for up to 4 x rows), so each row's result
/// is bit-identical whatever the number of rows up to `SMALL_M` (FP8 weights: decoded
/// into a buffer and dotted with every x row); for more rows (prompt prefill) each task decodes a panel of W rows and
/// multiplies x by it with gemm. Tasks own disjoint output columns, and each output is
/// computed by one task in a fixed order, so results do not depend on scheduling.
///
/// # Shapes
/// `x`: `[..., in]` F32/F16/BF16; `w`: `[out, in]` → `[..., out]`.
pub fn quantized_matmul(cpu: &CpuBackend, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    const OP: &str = "quantized_matmul";
    host(OP, x)?;
    host(OP, w)?;
    let spec::quant::QuantMatmulSpec { m, n, k, out_dims, .. } = spec::quant::quantized_matmul(x, w)?;
    let xs = convert::f32_data(OP, "x", x)?;
    let wb = w.host_bytes()?;
    let out = if k == 0 || m == 0 || n == 0 {
        vec![0.0; m * n]
    } else if m <= SMALL_M {
        matmul_by_rows(cpu, &xs, m, w.dtype(), wb, n, k)
    } else {
        matmul_by_panels(cpu, &xs, m, w.dtype(), wb, n, k)
    };
    convert::from_f32(out, Shape::new(out_dims), x.dtype())
}

/// Few x rows: each task takes a run of W rows and dots them with all `m` x rows —
/// straight from the blocks (block formats; see `fused_rows_multi`), else decoding each
/// W row once into a buffer and reusing it.
fn matmul_by_rows(cpu: &CpuBackend, xs: &[f32], m: usize, dtype: DType, wb: &[u8], n: usize, k: usize) -> Vec<f32> {
    let row_bytes = dtype.storage_bytes(k);
    let rows_per_task = n.div_ceil(cpu.threads() * 4).max(1);
    let integer = !cpu.exact_decode() && int::activation_block(dtype).is_some_and(|b| k.is_multiple_of(b));
    if integer {
        // x quantized once per call; each task dots its W rows with every x row in integers.
        let xq: Vec<int::Q8Row> = xs.chunks_exact(k).map(|x| int::quantize_row(x, dtype)).collect();
        return by_row_runs(cpu, n, m, k, rows_per_task, |task, chunk| {
            let first = task * rows_per_task;
            let w = &wb[first * row_bytes..(first + chunk.len() / m) * row_bytes];
            if !int::int_rows_multi(dtype, w, &xq, chunk) {
                chunk.fill(f32::NAN);
            }
        });
    }
    if dtype.is_quantized() {
        // Each x row is dotted with the blocks by the one-row kernel's arithmetic (see
        // `fused_rows_multi`), so a row's result is the same, bit for bit, for every m.
        let nb = k.div_ceil(QK);
        let xsum32: Vec<f32> = xs.chunks_exact(k).flat_map(|x| x.chunks(QK).map(simd::sum)).collect();
        return by_row_runs(cpu, n, m, k, rows_per_task, |task, chunk| {
            let first = task * rows_per_task;
            let w = &wb[first * row_bytes..(first + chunk.len() / m) * row_bytes];
            if !fused_rows_multi(dtype, w, xs, k, nb, &xsum32, m, chunk) {
                chunk.fill(f32::NAN);
            }
        });
    }
    by_row_runs(cpu, n, m, k, rows_per_task, |task, chunk| {
        let mut row = vec![0.0f32; k];
        for (r, outs) in chunk.chunks_exact_mut(m).enumerate() {
            let j = task * rows_per_task + r;
            let wrow = &wb[j * row_bytes..(j + 1) * row_bytes];
            decode_into(dtype, wrow, &mut row);
            for (i, o) in outs.iter_mut().enumerate() {
                *o = simd::dot(&xs[i * k..(i + 1) * k], &row);
            }
        }
    })
}

/// The `[m, n]` product from `compute(task, chunk)`, run for each run of `rows_per_task`
/// W rows (task t's run starts at row `t·rows_per_task`), `chunk` holding the run's outputs
/// row by row (`[rows, m]`: W row r's m results together). With several x rows each task
/// then writes its own columns of the output, so no serial transpose follows.
fn by_row_runs(
    cpu: &CpuBackend,
    n: usize,
    m: usize,
    k: usize,
    rows_per_task: usize,
    compute: impl Fn(usize, &mut [f32]) + Sync + Send,
) -> Vec<f32> {
    let mut out = vec![0.0f32; m * n];
    if m == 1 {
        cpu.for_each_chunk(&mut out, rows_per_task, k, compute);
        return out;
    }
    let dst = SharedMut(out.as_mut_ptr());
    cpu.for_each_index(n.div_ceil(rows_per_task), rows_per_task * m * k, |task| {
        let dst = &dst; // borrow the whole `SharedMut` (Sync), not its raw-pointer field
        let first = task * rows_per_task;
        let mut chunk = vec![0.0f32; rows_per_task.min(n - first) * m];
        compute(task, &mut chunk);
        for (r, outs) in chunk.chunks_exact(m).enumerate() {
            for (i, &v) in outs.iter().enumerate() {
                // SAFETY: column first + r < n of row i < m lies inside the m × n output,
                // only this task writes columns first..first + rows, and `out` outlives
                // the loop.
                unsafe { *dst.0.add(i * n + first + r) = v };
            }
        }
    });
    out
}

/// Many x rows: each task decodes a panel of W rows into f32 and computes that panel's
/// output columns for every x row with a single-threaded gemm.
fn matmul_by_panels(cpu: &CpuBackend, xs: &[f32], m: usize, dtype: DType, wb: &[u8], n: usize, k: usize) -> Vec<f32> {
    thread_local! {
        /// Each thread's decoded panel, kept between calls (its largest size so far:
        /// `PANEL_ROWS · in` f32) so a prompt's matmuls neither allocate nor zero one.
        static PANEL: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    /// At most 256 W rows per task: the gemm repacks x for every panel, so larger
    /// panels pay that less often (Gemma 3 prefill of 512 tokens, 2 threads: 952–1021
    /// tokens/s with 128 and zeroed buffers, 992–1091 with 256, 1084–1104 with 256 and
    /// no zeroing).
    const PANEL_ROWS: usize = 256;
    let row_bytes = dtype.storage_bytes(k);
    // Enough panels to feed every thread.
    let panel_rows = n.div_ceil(cpu.threads() * 2).clamp(16, PANEL_ROWS);
    let panels = n.div_ceil(panel_rows);
    // Every element is written below (the panels cover all n columns of all m rows, and
    // the gemm does not read its destination), so the buffer is not zeroed first.
    let mut out: Vec<f32> = Vec::with_capacity(m * n);
    let dst = SharedMut(out.as_mut_ptr());
    cpu.for_each_index(panels, panel_rows * m * k, |p| {
        let dst = &dst; // borrow the whole `SharedMut` (Sync), not its raw-pointer field
        let first = p * panel_rows;
        let rows = panel_rows.min(n - first);
        PANEL.with_borrow_mut(|panel| {
            if panel.len() < rows * k {
                panel.resize(rows * k, 0.0);
            }
            let panel = &mut panel[..rows * k];
            decode_into(dtype, &wb[first * row_bytes..(first + rows) * row_bytes], panel);
            // SAFETY: `xs` holds m rows of k values and `panel` rows·k values; the
            // destination is columns first..first+rows of the m × n output (inside its
            // capacity), which only this task writes, and `out` outlives the loop.
            unsafe {
                gemm::gemm(
                    m,
                    rows,
                    k,
                    dst.0.add(first),
                    1,
                    n as isize,
                    false,
                    xs.as_ptr(),
                    1,
                    k as isize,
                    panel.as_ptr(),
                    k as isize,
                    1,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        });
    });
    // SAFETY: the loop above wrote all m·n elements (see the allocation).
    unsafe { out.set_len(m * n) };
    out
}

/// Dequantizes one row of storage (`bytes` holds `out.len() / block_elems` whole blocks of
/// `dtype`, or `out.len()` plain F32/F16/BF16/F8E4M3 elements) into f32. Used by
/// `embedding` to gather rows of quantized tables.
pub fn dequantize_row_into(dtype: DType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    const OP: &str = "dequantize_row_into";
    if dtype == DType::U32 {
        return Err(Error::dtype(OP, "row", "a float, f8e4m3 or block format", dtype));
    }
    let be = dtype.block_elems();
    if !out.len().is_multiple_of(be) {
        return Err(Error::shape(
            OP,
            format!("row length for {dtype} blocks"),
            format!("a multiple of {be}"),
            out.len(),
        ));
    }
    let need = dtype.storage_bytes(out.len());
    if bytes.len() != need {
        return Err(Error::shape(
            OP,
            "row bytes",
            format!("{need} bytes for {} {dtype} values", out.len()),
            format!("{} bytes", bytes.len()),
        ));
    }
    match dtype {
        DType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        DType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        _ => decode_into(dtype, bytes, out),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_layout_puts_element_j_plus_16_in_the_high_nibble() {
        let cpu = CpuBackend::with_threads(1).unwrap();
        // max magnitude −8 → d = 1, so q = x + 8 exactly.
        let x: Vec<f32> = (0..32).map(|j| (j % 16) as f32 - 8.0).collect();
        let q = quantize(&cpu, &Tensor::from_vec(x.clone(), [32]).unwrap(), DType::Q4_0).unwrap();
        let b = q.host_bytes().unwrap();
        assert_eq!(f16::from_le_bytes([b[0], b[1]]).to_f32(), 1.0);
        for j in 0..16 {
            assert_eq!(b[2 + j], (j as u8) | ((j as u8) << 4));
        }
        let back = dequantize(&cpu, &q).unwrap();
        assert_eq!(back.to_vec_f32().unwrap(), x);
    }

    #[test]
    fn empty_inner_dimension_gives_zeros_of_the_right_shape() {
        let cpu = CpuBackend::with_threads(1).unwrap();
        let x = Tensor::zeros([3, 0], DType::F32).unwrap();
        let w = Tensor::zeros([5, 0], DType::Q8_0).unwrap();
        let y = quantized_matmul(&cpu, &x, &w).unwrap();
        assert_eq!(y.dims(), &[3, 5]);
        assert!(y.to_vec_f32().unwrap().iter().all(|&v| v == 0.0));
    }

    /// Deterministic values in about ±2 with a few outliers.
    #[cfg(target_arch = "x86_64")]
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|i| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let v = (state >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0;
                if i % 101 == 7 {
                    v * 20.0
                } else {
                    v
                }
            })
            .collect()
    }

    /// Every ISA's Q5_0 (and, on AVX-512, Q4_K) kernel, and the portable loop compiled
    /// for that ISA, give the scalar portable loop's bits.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_q5_0_and_q4_k_decode_kernels_give_the_portable_paths_bits() {
        use crate::cpu::simd::{Isa, IsaGuard};
        if !std::arch::is_x86_feature_detected!("f16c") {
            return; // no x86 kernel on this CPU
        }
        let cpu = CpuBackend::with_threads(1).unwrap();
        let (n, k) = (19, 1024);
        let x = values(k, 1);
        let xsum32: Vec<f32> = x.chunks(QK).map(simd::sum).collect();
        type Portable = fn(&[u8], &[f32], &[f32], &mut [f32]);
        let cases: [(DType, Portable, &[Isa]); 2] =
            [(DType::Q5_0, fused_dot::q5_0, &[Isa::Avx512, Isa::Avx2]), (DType::Q4K, fused_dot::q4_k, &[Isa::Avx512])];
        for (dtype, portable_fn, kernel_isas) in cases {
            let w = quantize(&cpu, &Tensor::from_vec(values(n * k, 2), [n, k]).unwrap(), dtype).unwrap();
            let wb = w.host_bytes().unwrap();
            let mut portable = vec![0.0f32; n];
            {
                let _scalar = IsaGuard::enter(Isa::Scalar);
                portable_fn(wb, &x, &xsum32, &mut portable);
            }
            for isa in Isa::available() {
                let _isa = IsaGuard::enter(isa);
                let mut out = vec![0.0f32; n];
                if kernel_isas.contains(&isa) {
                    assert!(x86::fused_rows(dtype, wb, &x, &xsum32, &mut out), "{dtype}: no {} kernel", isa.name());
                    for r in 0..n {
                        assert_eq!(out[r].to_bits(), portable[r].to_bits(), "{dtype} row {r}: {} kernel", isa.name());
                    }
                }
                // The portable loop compiled for this ISA.
                portable_fn(wb, &x, &xsum32, &mut out);
                for r in 0..n {
                    assert_eq!(out[r].to_bits(), portable[r].to_bits(), "{dtype} row {r}: {} portable", isa.name());
                }
            }
        }
    }

    /// A server batches 1..=16 sequences into one `quantized_matmul`: each row's result
    /// must not depend on how many rows come with it, on either decode path, on every ISA
    /// this CPU has, for every block format (and for FP8), with the work split over
    /// threads. Rows of 17 blocks of 32 (an odd count: the kernels' last block has no
    /// partner) for the 32-element formats, 3 blocks of 256 for the K formats. Called
    /// through the trait, so the caller's share of the work runs on the backend's ISA too.
    #[test]
    fn each_rows_result_is_bit_identical_for_every_row_count_up_to_16() {
        use crate::backend::ComputeBackend;
        let n = 37;
        for isa in simd::Isa::available() {
            for exact in [true, false] {
                let cpu = CpuBackend::builder().threads(2).isa(isa).exact_decode(exact).build().unwrap();
                for dtype in DType::ALL.into_iter().filter(|d| d.is_quantized() || *d == DType::F8E4M3) {
                    let k = if dtype.block_elems() == 256 { 768 } else { 544 };
                    let x_all: Vec<f32> = (0..SMALL_M * k)
                        .map(|i| ((i * 37 % 101) as f32 / 25.0 - 2.0) * if i % 97 == 3 { 9.0 } else { 1.0 })
                        .collect();
                    let w_f32: Vec<f32> = (0..n * k).map(|i| (i * 53 % 89) as f32 / 22.0 - 2.0).collect();
                    let dense = Tensor::from_vec(w_f32, [n, k]).unwrap();
                    let w = match cpu.quantize(&dense, dtype) {
                        Ok(w) => w,
                        Err(e) => panic!("{dtype}: {e}"),
                    };
                    let one: Vec<Vec<u32>> = (0..SMALL_M)
                        .map(|i| {
                            let x = Tensor::from_vec(x_all[i * k..(i + 1) * k].to_vec(), [1, k]).unwrap();
                            cpu.quantized_matmul(&x, &w)
                                .unwrap()
                                .to_vec_f32()
                                .unwrap()
                                .iter()
                                .map(|v| v.to_bits())
                                .collect()
                        })
                        .collect();
                    assert!(one.iter().flatten().all(|&b| f32::from_bits(b).is_finite()), "{dtype}: non-finite output");
                    for m in 2..=SMALL_M {
                        let x = Tensor::from_vec(x_all[..m * k].to_vec(), [m, k]).unwrap();
                        let y = cpu.quantized_matmul(&x, &w).unwrap().to_vec_f32().unwrap();
                        for (i, row) in y.chunks_exact(n).enumerate() {
                            let bits: Vec<u32> = row.iter().map(|v| v.to_bits()).collect();
                            assert_eq!(
                                bits,
                                one[i],
                                "{dtype}, {}, exact_decode {exact}: row {i} of {m} differs from the row alone",
                                isa.name()
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        for (v, want) in [(0.5, 0), (1.5, 2), (2.5, 2), (-0.5, 0), (-1.5, -2), (-2.49, -2), (7.51, 8), (1e9, 4_194_303)]
        {
            assert_eq!(nearest_int(v), want, "{v}");
        }
    }
}
