//! Block → f32 decoding: one decoder per format (inlined), a loop over whole blocks per
//! format compiled per ISA, and [`decode_into`], which picks the loop by dtype.

use super::fields::{
    f16_at, iq4_xs_scale, q3_k_scales, q5_levels, scale_min_k4, u32_at, Iq4Nl, LevelTable, Mxfp4, IQ4NL_VALUES,
};
use super::{QK, QK_K};
use crate::cpu::memory::f8e4m3_table;
use crate::cpu::simd::multiversion;
use crate::dtype::DType;

// ─────────────────────────── one block per format ───────────────────────────

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

/// IQ4_NL and MXFP4: `scale·table[q]`.
#[inline(always)]
fn decode_table_block<T: LevelTable>(b: &[u8], out: &mut [f32]) {
    let d = T::scale(b);
    let qs = &b[T::QS_AT..T::QS_AT + QK / 2];
    let (lo, hi) = out[..QK].split_at_mut(QK / 2);
    for j in 0..QK / 2 {
        lo[j] = d * f32::from(T::VALUES[usize::from(qs[j] & 0x0F)]);
        hi[j] = d * f32::from(T::VALUES[usize::from(qs[j] >> 4)]);
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

// ────────────── per-format loops over whole blocks, compiled per ISA ──────────────
// (the block decoders inline into them)

macro_rules! block_loops {
    ($($name:ident => $block:expr, $bytes:literal, $elems:expr;)*) => {$(
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
    q8_0 => decode_q8_0_block, 34, QK;
    q4_0 => decode_q4_0_block, 18, QK;
    q4_1 => decode_q4_1_block, 20, QK;
    q4_k => decode_q4_k_block, 144, QK_K;
    q6_k => decode_q6_k_block, 210, QK_K;
    q5_0 => decode_q5_0_block, 22, QK;
    q5_1 => decode_q5_1_block, 24, QK;
    iq4_nl => decode_table_block::<Iq4Nl>, 18, QK;
    q2_k => decode_q2_k_block, 84, QK_K;
    q3_k => decode_q3_k_block, 110, QK_K;
    q5_k => decode_q5_k_block, 176, QK_K;
    iq4_xs => decode_iq4_xs_block, 136, QK_K;
    mxfp4 => decode_table_block::<Mxfp4>, 17, QK;
}

/// Decodes `bytes` (whole blocks of a storage format, or F8E4M3 codes) into `out`; the
/// caller has checked that `bytes.len() == dtype.storage_bytes(out.len())`.
pub(super) fn decode_into(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        DType::Q8_0 => q8_0(bytes, out),
        DType::Q4_0 => q4_0(bytes, out),
        DType::Q4_1 => q4_1(bytes, out),
        DType::Q4K => q4_k(bytes, out),
        DType::Q6K => q6_k(bytes, out),
        DType::Q5_0 => q5_0(bytes, out),
        DType::Q5_1 => q5_1(bytes, out),
        DType::IQ4NL => iq4_nl(bytes, out),
        DType::Q2K => q2_k(bytes, out),
        DType::Q3K => q3_k(bytes, out),
        DType::Q5K => q5_k(bytes, out),
        DType::IQ4XS => iq4_xs(bytes, out),
        DType::MXFP4 => mxfp4(bytes, out),
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
