//! W rows dotted with f32 x rows straight from their blocks: `quantized_matmul` with few
//! x rows on the f32-activation path (`fused_dot_x86.rs` has hand-written forms for some
//! formats). `Σ_j x[j]·w[j]` with w one row of blocks is decoded on the fly (never
//! written out): per block the scale multiplies a 16-lane partial sum of `x·q`, and a
//! block's offset (`m` of Q4_1, `dmin·m` of Q4_K) multiplies the precomputed sum of x over
//! its 32 elements (`xsum32`), since `Σ x·(d·q + m) = d·Σ x·q + m·Σ x`. Used for
//! token-by-token decoding, where W is read once per output and decoding to a row buffer
//! would double the work. `mul_add` makes the FMA explicit (fused on the AVX paths; the
//! portable path without FMA hardware calls libm's exact `fmaf`).

use half::f16;

use super::fields::{
    f16_at, iq4_xs_scale, q3_k_scales, q5_levels, scale_min_k4, u32_at, Iq4Nl, LevelTable, Mxfp4, IQ4NL_VALUES,
};
#[cfg(target_arch = "x86_64")]
use super::fused_dot_x86;
use super::{QK, QK_K};
use crate::cpu::simd::multiversion;
use crate::dtype::DType;

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
/// One IQ4_NL / MXFP4 block into `acc`: `acc += scale·(x·table[q])` lane-wise.
#[inline(always)]
fn table_block<T: LevelTable>(b: &[u8], xs: &[f32], acc: &mut [f32; 16]) {
    let d = T::scale(b);
    let (qs, (xl, xh)) = (&b[T::QS_AT..T::QS_AT + QK / 2], xs.split_at(16));
    for l in 0..16 {
        let lo = f32::from(T::VALUES[usize::from(qs[l] & 0x0F)]);
        let hi = f32::from(T::VALUES[usize::from(qs[l] >> 4)]);
        acc[l] = d.mul_add(xl[l].mul_add(lo, xh[l] * hi), acc[l]);
    }
}

/// IQ4_NL, MXFP4: `Σ_blocks scale·Σ x·table[q]` (two blocks a step into two accumulators).
#[inline(always)]
fn table_row<T: LevelTable>(bytes: &[u8], x: &[f32], _xsum32: &[f32]) -> f32 {
    let (mut acc0, mut acc1) = ([0.0f32; 16], [0.0f32; 16]);
    for (b, xs) in bytes.chunks_exact(2 * T::BYTES).zip(x.chunks_exact(2 * QK)) {
        table_block::<T>(&b[..T::BYTES], &xs[..QK], &mut acc0);
        table_block::<T>(&b[T::BYTES..], &xs[QK..], &mut acc1);
    }
    let n = bytes.len() / T::BYTES;
    if n % 2 == 1 {
        table_block::<T>(&bytes[(n - 1) * T::BYTES..], &x[(n - 1) * QK..], &mut acc0);
    }
    hsum16(&add16(&acc0, &acc1))
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
    ($($name:ident => $row:expr),*) => {$(
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
    q5_0 => q5_0_row, q5_1 => q5_1_row, iq4_nl => table_row::<Iq4Nl>, q2_k => q2_k_row, q3_k => q3_k_row,
    q5_k => q5_k_row, iq4_xs => iq4_xs_row, mxfp4 => table_row::<Mxfp4>
);

/// `out[r] = Σ_j x[j]·W[r, j]` for the `out.len()` rows of `w` (whole rows of a block
/// format; see the module docs); `xsum32` holds the sums of x over each run of 32.
/// Returns false for FP8, which has no fused form.
pub(super) fn fused_rows(dtype: DType, w: &[u8], x: &[f32], xsum32: &[f32], out: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if fused_dot_x86::fused_rows(dtype, w, x, xsum32, out) {
        return true;
    }
    match dtype {
        DType::Q8_0 => q8_0(w, x, xsum32, out),
        DType::Q4_0 => q4_0(w, x, xsum32, out),
        DType::Q4_1 => q4_1(w, x, xsum32, out),
        DType::Q4K => q4_k(w, x, xsum32, out),
        DType::Q6K => q6_k(w, x, xsum32, out),
        DType::Q5_0 => q5_0(w, x, xsum32, out),
        DType::Q5_1 => q5_1(w, x, xsum32, out),
        DType::IQ4NL => iq4_nl(w, x, xsum32, out),
        DType::Q2K => q2_k(w, x, xsum32, out),
        DType::Q3K => q3_k(w, x, xsum32, out),
        DType::Q5K => q5_k(w, x, xsum32, out),
        DType::IQ4XS => iq4_xs(w, x, xsum32, out),
        DType::MXFP4 => mxfp4(w, x, xsum32, out),
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
pub(super) fn fused_rows_multi(
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
    if fused_dot_x86::fused_rows_multi(dtype, w, xs, k, xsum32, m, out) {
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

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "x86_64")]
    use crate::cpu::quant::quantize;
    #[cfg(target_arch = "x86_64")]
    use crate::cpu::{simd, CpuBackend};
    #[cfg(target_arch = "x86_64")]
    use crate::tensor::Tensor;

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

    /// Every ISA's Q5_0, IQ4_NL and MXFP4 (and, on AVX-512, Q4_K) kernel, and the portable
    /// loop compiled for that ISA, give the scalar portable loop's bits.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_q5_0_q4_k_and_table_decode_kernels_give_the_portable_paths_bits() {
        use crate::cpu::simd::{Isa, IsaGuard};
        if !std::arch::is_x86_feature_detected!("f16c") {
            return; // no x86 kernel on this CPU
        }
        let cpu = CpuBackend::with_threads(1).unwrap();
        type Portable = fn(&[u8], &[f32], &[f32], &mut [f32]);
        let both: &[Isa] = &[Isa::Avx512, Isa::Avx2];
        let cases: [(DType, Portable, &[Isa]); 4] = [
            (DType::Q5_0, q5_0, both),
            (DType::Q4K, q4_k, &[Isa::Avx512]),
            (DType::IQ4NL, iq4_nl, both),
            (DType::MXFP4, mxfp4, both),
        ];
        for (dtype, portable_fn, kernel_isas) in cases {
            // 33 blocks for the 32-element formats: an odd count leaves the last one unpaired.
            let (n, k) = (19, if dtype.block_elems() == QK_K { 1024 } else { 33 * QK });
            let x = values(k, 1);
            let xsum32: Vec<f32> = x.chunks(QK).map(simd::sum).collect();
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
                    assert!(
                        fused_dot_x86::fused_rows(dtype, wb, &x, &xsum32, &mut out),
                        "{dtype}: no {} kernel",
                        isa.name()
                    );
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
}
