//! Weight storage formats: the GGUF block quantizations and FP8 E4M3. `quantize` turns
//! floats into blocks the way ggml's reference quantizers (`quantize_row_*_ref`) do,
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

use half::f16;

use crate::cpu::memory::{f32_to_f8e4m3, f8e4m3_table, host};
use crate::cpu::pool::SharedMut;
use crate::cpu::simd::{self, multiversion};
use crate::cpu::{check, convert, CpuBackend};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// Hand-written AVX-512 / AVX2 forms of the Q8_0, Q4_0 and Q4_1 fused row dots.
#[cfg(target_arch = "x86_64")]
#[path = "quant_x86.rs"]
mod x86;

/// Elements of a Q8_0 / Q4_0 / Q4_1 block.
const QK: usize = 32;
/// Elements of a Q4_K / Q6_K super-block.
const QK_K: usize = 256;
/// ggml's threshold below which a group counts as all zeros (`GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;
/// Blocks per parallel task of `quantize` / `dequantize`.
const BLOCKS_PER_TASK: usize = 64;
/// Up to this many rows of x, `quantized_matmul` decodes one W row at a time and dots it
/// with every x row; above it, it decodes panels of W rows and runs gemm on them.
const SMALL_M: usize = 12;

/// Whether W / a quantize target may be `dtype`: a block format or FP8 E4M3.
fn is_storage_format(dtype: DType) -> bool {
    dtype.is_quantized() || dtype == DType::F8E4M3
}

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
        let mut acc = [0.0f32; 16];
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
                    for l in 0..16 {
                        let lo = xl[l] * f32::from(q[l] & 0x0F);
                        acc[l] = d2.mul_add(xh[l] * f32::from(q[l] >> 4), d1.mul_add(lo, acc[l]));
                    }
                }
            }
        }
        acc.iter().sum::<f32>() - offsets
    }
    /// Q6_K: per sub-block of 16, `d·scale·Σ x·(q − 32)`.
    #[inline(always)]
    fn q6_k_row(bytes: &[u8], x: &[f32], _xsum32: &[f32]) -> f32 {
        let mut acc = [0.0f32; 16];
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
        acc.iter().sum::<f32>()
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
    rows_of!(q8_0 => q8_0_row, q4_0 => q4_0_row, q4_1 => q4_1_row, q4_k => q4_k_row, q6_k => q6_k_row);
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
        _ => return false,
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

/// `quantize_row_q4_1_ref`: d = (max − min)/15, m = min, q = min(15, trunc((x − min)/d + 0.5)).
#[inline(always)]
fn quantize_q4_1_block(x: &[f32], out: &mut [u8]) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
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
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        levels[i] = level(iscale, x[i], min);
        let diff = scale * f32::from(levels[i]) + min - x[i];
        best_error += weights[i] * diff * diff;
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
                let diff = this_scale * f32::from(trial[i]) + this_min - x[i];
                error += weights[i] * diff * diff;
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

/// `quantize_row_q4_K_ref`: per sub-block of 32, a weighted (weights `√mean(x²) + |x|`)
/// scale/min fit with 15 levels; the 8 scales and 8 mins are then quantized to 6 bits
/// against the block's largest (`d = max_scale/63`, `dmin = max_min/63`), and the levels
/// are recomputed with the scales as stored.
#[inline(always)]
fn quantize_q4_k_block(x: &[f32], out: &mut [u8]) {
    let mut levels = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let av_x = (xs.iter().map(|v| v * v).sum::<f32>() / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|l| av_x + xs[l].abs());
        let (scale, min) = make_qkx2_quants(15, xs, &weights, &mut levels[32 * j..32 * j + 32], -1.0, 0.1, 20);
        scales[j] = scale;
        mins[j] = min;
        max_scale = max_scale.max(scale);
        max_min = max_min.max(min);
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let packed = &mut out[4..16];
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
    let d = put_f16(out, 0, max_scale / 63.0);
    let dmin = put_f16(out, 2, max_min / 63.0);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &out[4..16]);
        let dj = d * f32::from(sc);
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * f32::from(m);
        for ii in 0..32 {
            levels[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / dj).clamp(0, 15) as u8;
        }
    }
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
}

/// Quantizes `x` (a whole number of blocks) into `out` (the matching bytes).
fn quantize_into(dtype: DType, x: &[f32], out: &mut [u8]) {
    match dtype {
        DType::Q8_0 => encode::q8_0(x, out),
        DType::Q4_0 => encode::q4_0(x, out),
        DType::Q4_1 => encode::q4_1(x, out),
        DType::Q4K => encode::q4_k(x, out),
        DType::Q6K => encode::q6_k(x, out),
        _ => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = f32_to_f8e4m3(v);
            }
        }
    }
}

/// Quantizes float values into a GGUF block format (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) or FP8
/// E4M3. The block formats follow ggml's `quantize_row_*_ref` step for step (Q4_K with
/// `make_qkx2_quants`, Q6_K with `make_qx_quants`), so the bytes match what ggml writes up
/// to f32 summation order; FP8 rounds to nearest even and saturates at ±448.
///
/// # Shapes
/// `[..., n]` F32/F16/BF16, n a multiple of the block size → same shape, dtype `dtype`.
pub fn quantize(cpu: &CpuBackend, x: &Tensor, dtype: DType) -> Result<Tensor> {
    const OP: &str = "quantize";
    host(OP, x)?;
    check::float(OP, "x", x)?;
    if !is_storage_format(dtype) {
        return Err(Error::dtype(OP, "target", "q8_0, q4_0, q4_1, q4_k, q6_k or f8e4m3", dtype));
    }
    check::min_rank(OP, "x", x, 1)?;
    let be = dtype.block_elems();
    if !x.shape().last_dim().is_multiple_of(be) {
        return Err(Error::shape(
            OP,
            format!("x (last dim for {dtype} blocks)"),
            format!("[..., multiple of {be}]"),
            x.shape(),
        ));
    }
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
    let dtype = x.dtype();
    if !is_storage_format(dtype) {
        return Err(Error::dtype(OP, "x", "q8_0, q4_0, q4_1, q4_k, q6_k or f8e4m3", dtype));
    }
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
/// decoding) each task decodes one W row at a time into a row buffer and dots it with
/// every x row; for more rows (prompt prefill) each task decodes a panel of W rows and
/// multiplies x by it with gemm. Tasks own disjoint output columns, and each output is
/// computed by one task in a fixed order, so results do not depend on scheduling.
///
/// # Shapes
/// `x`: `[..., in]` F32/F16/BF16; `w`: `[out, in]` → `[..., out]`.
pub fn quantized_matmul(cpu: &CpuBackend, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    const OP: &str = "quantized_matmul";
    host(OP, x)?;
    host(OP, w)?;
    check::float(OP, "x", x)?;
    check::min_rank(OP, "x", x, 1)?;
    if !is_storage_format(w.dtype()) {
        return Err(Error::dtype(OP, "w", "q8_0, q4_0, q4_1, q4_k, q6_k or f8e4m3", w.dtype()));
    }
    check::rank(OP, "w", w, 2)?;
    let (n, k) = (w.dims()[0], w.dims()[1]);
    if x.shape().last_dim() != k {
        return Err(Error::shape(OP, "x (last dim = w's in)", format!("[..., {k}]"), x.shape()));
    }
    let (lead, _) = x.dims().split_at(x.rank() - 1); // rank ≥ 1 checked above
    let m: usize = lead.iter().product();
    let out_dims: Vec<usize> = lead.iter().copied().chain([n]).collect();
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

/// Few x rows: each task takes W rows one by one and dots each with all `m` x rows —
/// straight from the blocks for one x row (block formats), else decoding the W row once
/// into a buffer and reusing it.
fn matmul_by_rows(cpu: &CpuBackend, xs: &[f32], m: usize, dtype: DType, wb: &[u8], n: usize, k: usize) -> Vec<f32> {
    let row_bytes = dtype.storage_bytes(k);
    let rows_per_task = n.div_ceil(cpu.threads() * 4).max(1);
    if m == 1 && dtype.is_quantized() {
        // One x row (decoding a token): dot each W row straight from its blocks.
        let xsum32: Vec<f32> = xs.chunks(QK).map(simd::sum).collect();
        let mut out = vec![0.0f32; n];
        cpu.for_each_chunk(&mut out, rows_per_task, k, |task, chunk| {
            let first = task * rows_per_task;
            let w = &wb[first * row_bytes..(first + chunk.len()) * row_bytes];
            if !fused_rows(dtype, w, xs, &xsum32, chunk) {
                chunk.fill(f32::NAN);
            }
        });
        return out;
    }
    // Computed transposed, `[n, m]`, so each task owns a contiguous chunk.
    let mut out_t = vec![0.0f32; n * m];
    cpu.for_each_chunk(&mut out_t, rows_per_task * m, k, |task, chunk| {
        let mut row = vec![0.0f32; k];
        for (r, outs) in chunk.chunks_exact_mut(m).enumerate() {
            let j = task * rows_per_task + r;
            let wrow = &wb[j * row_bytes..(j + 1) * row_bytes];
            decode_into(dtype, wrow, &mut row);
            for (i, o) in outs.iter_mut().enumerate() {
                *o = simd::dot(&xs[i * k..(i + 1) * k], &row);
            }
        }
    });
    if m == 1 {
        return out_t;
    }
    let mut out = vec![0.0f32; m * n];
    for (j, outs) in out_t.chunks_exact(m).enumerate() {
        for (i, &v) in outs.iter().enumerate() {
            out[i * n + j] = v;
        }
    }
    out
}

/// Many x rows: each task decodes a panel of W rows into f32 and computes that panel's
/// output columns for every x row with a single-threaded gemm.
fn matmul_by_panels(cpu: &CpuBackend, xs: &[f32], m: usize, dtype: DType, wb: &[u8], n: usize, k: usize) -> Vec<f32> {
    let row_bytes = dtype.storage_bytes(k);
    // Enough panels to feed every thread; at most 128 rows (512 KiB of f32 at in = 1024).
    let panel_rows = n.div_ceil(cpu.threads() * 2).clamp(16, 128);
    let panels = n.div_ceil(panel_rows);
    let mut out = vec![0.0f32; m * n];
    let dst = SharedMut(out.as_mut_ptr());
    cpu.for_each_index(panels, panel_rows * m * k, |p| {
        let dst = &dst; // borrow the whole `SharedMut` (Sync), not its raw-pointer field
        let first = p * panel_rows;
        let rows = panel_rows.min(n - first);
        let mut panel = vec![0.0f32; rows * k];
        decode_into(dtype, &wb[first * row_bytes..(first + rows) * row_bytes], &mut panel);
        // SAFETY: `xs` holds m rows of k values and `panel` rows·k values; the destination
        // is columns first..first+rows of the m × n output, which only this task writes,
        // and `out` outlives the loop.
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

    #[test]
    fn nearest_int_rounds_half_to_even() {
        for (v, want) in [(0.5, 0), (1.5, 2), (2.5, 2), (-0.5, 0), (-1.5, -2), (-2.49, -2), (7.51, 8), (1e9, 4_194_303)]
        {
            assert_eq!(nearest_int(v), want, "{v}");
        }
    }
}
