//! AVX2 forms of the integer row dots (see `int.rs` for the scheme): 32 bytes
//! of weights and 32 of activations per step, `vpmaddubsw` (unsigned × signed bytes,
//! adjacent pairs summed to i16) then `vpmaddwd` by 1 or by the sub-block scale (pairs
//! summed to i32), so i32 lane l holds elements 4l..4l+4 of the run, exactly the
//! portable twin's lanes. Signed weights use the sign trick (`|w|` × `sign(w)·x`).
//! IQ4_NL's and MXFP4's levels are looked up from their nibbles by `vpshufb`. The
//! products stay within i16: |w| ≤ 32 (Q4_0, Q5_0, Q6_K, MXFP4) or ≤ 31 unsigned (Q4_1,
//! Q4_K, Q5_K) or ≤ 128 (Q8_0, IQ4_NL) times |x| ≤ 127, two per i16. Where AVX-512 VNNI
//! is present the 32-block formats take `int_vnni.rs` instead.

use std::arch::x86_64::*;

use super::fields::{e8m0_half, IQ4NL_VALUES, MXFP4_VALUES};
use super::fused_dot_x86::{prefetch_range, PREFETCH_ROWS};
use super::int::{fits_all, Q8Row};
use super::{QK, QK_K};
use crate::cpu::simd::Isa;
use crate::dtype::DType;

/// `out[r·m + i]` = row r of `w` · `xs[i]` (`int.rs`'s `int_rows_multi`): the 32-block
/// formats for any number of x rows, each weight block decoded once for up to 4 of them;
/// the K formats for one x row. False (doing nothing) otherwise, where the ISA in use has
/// no AVX2 or the CPU no F16C, or for sizes that do not fit.
pub(super) fn int_rows_multi(dtype: DType, w: &[u8], xs: &[Q8Row], out: &mut [f32]) -> bool {
    if !matches!(Isa::active(), Isa::Avx2 | Isa::Avx512)
        || !std::arch::is_x86_feature_detected!("f16c")
        || !fits_all(dtype, w, xs, out.len())
    {
        return false;
    }
    // SAFETY: AVX2, FMA (both implied by the active ISA, never one the CPU lacks) and F16C
    // are available, and `fits_all` checked the bounds every kernel reads: `w` holds
    // `out.len() / m` rows of blocks covering each `xs[i].q`, whose per-block vectors match.
    unsafe {
        match (dtype, xs) {
            (DType::Q8_0, _) => rows32::<0>(w, xs, out),
            (DType::Q4_0, _) => rows32::<1>(w, xs, out),
            (DType::Q4_1, _) => rows32::<2>(w, xs, out),
            (DType::Q5_0, _) => rows32::<3>(w, xs, out),
            (DType::IQ4NL, _) => rows32::<4>(w, xs, out),
            (DType::MXFP4, _) => rows32::<5>(w, xs, out),
            (DType::Q4K, [xq]) => rows_k4::<false>(w, xq, out),
            (DType::Q5K, [xq]) => rows_k4::<true>(w, xq, out),
            (DType::Q6K, [xq]) => rows_q6k(w, xq, out),
            _ => return false,
        }
    }
    true
}

/// The f16 at `p` as f32.
///
/// # Safety
/// `p` must point to 2 readable bytes; the CPU must support F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees 2 readable bytes at `p`.
    let bits = unsafe { u16::from_le_bytes([*p, *p.add(1)]) };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// The twin's `tree8`: lanes l + 4, then l + 2, then 0 + 1 (after `tree16`'s l + 8,
/// for the 32-block formats).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn hsum8(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// i32 lanes `scale·Σ_{4 bytes} u·x` for unsigned `u`, signed `x`, i16 `scale` lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn lanes_unsigned(u: __m256i, x: __m256i, scale: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), scale)
}

/// 32 bytes at `p`.
///
/// # Safety
/// `p` must point to 32 readable bytes; the CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load32(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes at `p`.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// The 32 nibbles of 16 bytes at `p` in element order: low nibbles (elements 0..16) in
/// the low half, high nibbles (16..32) in the high half.
///
/// # Safety
/// `p` must point to 16 readable bytes; the CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 16 readable bytes at `p`.
    let q = unsafe { _mm_loadu_si128(p as *const __m128i) };
    _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(q), q), _mm256_set1_epi8(0x0F))
}

/// Byte j is 0xFF where bit j of `bits` is set, else 0 (as ggml's `bytes_from_bits_32`).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn bytes_from_bits(bits: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_setr_epi64x(0, 0x0101_0101_0101_0101, 0x0202_0202_0202_0202, 0x0303_0303_0303_0303),
    );
    let all_but_own_bit = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(spread, all_but_own_bit), _mm256_set1_epi64x(-1))
}

/// Every W row of `w` (rows of `row_bytes` bytes, prefetched [`PREFETCH_ROWS`] ahead)
/// against the `m = xs.len()` x rows, `out[r·m + i]` for row r and x row i: `group(row,
/// x, o)` dots the W row at `row` with the first few of the x rows not yet done (`x`)
/// into as many entries of `o` and returns how many it took. The row loop of the
/// 32-block kernels, here and in `int_vnni.rs`.
#[inline(always)]
pub(super) fn each_row_group(
    w: &[u8],
    xs: &[Q8Row],
    out: &mut [f32],
    row_bytes: usize,
    mut group: impl FnMut(*const u8, &[Q8Row], &mut [f32]) -> usize,
) {
    let m = xs.len();
    for (r, outs) in out.chunks_exact_mut(m).enumerate() {
        prefetch_range(w, (r + PREFETCH_ROWS) * row_bytes, row_bytes);
        let row = w.as_ptr().wrapping_add(r * row_bytes);
        let mut i = 0;
        while i < m {
            i += group(row, &xs[i..], &mut outs[i..]);
        }
    }
}

/// Bytes per block of the 32-element formats, by the kernels' `F`: Q8_0, Q4_0, Q4_1, Q5_0,
/// IQ4_NL, MXFP4.
pub(super) const BLOCK_BYTES: [usize; 6] = [34, 18, 20, 22, 18, 17];

/// The level table of the table formats (`F` = 4 IQ4_NL, 5 MXFP4).
pub(super) const fn levels(f: u8) -> [i8; 16] {
    if f == 4 {
        IQ4NL_VALUES
    } else {
        MXFP4_VALUES
    }
}

/// [`levels`] + 128 as unsigned bytes (what `vpdpbusd` multiplies).
pub(super) const fn offset_levels(f: u8) -> [u8; 16] {
    let (levels, mut out, mut i) = (levels(f), [0u8; 16], 0);
    while i < 16 {
        out[i] = (levels[i] as u8) ^ 0x80;
        i += 1;
    }
    out
}

/// 32-element formats, `F` = 0 Q8_0, 1 Q4_0, 2 Q4_1, 3 Q5_0, 4 IQ4_NL, 5 MXFP4:
/// `out[r·m + i]` = row r · x row i, for the `m = xs.len()` x rows in groups of up to 4
/// per pass over a W row.
///
/// # Safety
/// AVX2, FMA and F16C; `w` holds `out.len() / m` rows of blocks covering every x row
/// (see `fits`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows32<const F: u8>(w: &[u8], xs: &[Q8Row], out: &mut [f32]) {
    let nb = xs[0].q.len() / QK;
    let row_bytes = nb * BLOCK_BYTES[usize::from(F)];
    each_row_group(w, xs, out, row_bytes, |row, x, o| {
        // SAFETY: the row lies inside `w`, and each x row covers its nb blocks.
        unsafe {
            match x.len() {
                4.. => group32::<F, 4>(row, nb, x, o),
                2 | 3 => group32::<F, 2>(row, nb, x, o),
                _ => group32::<F, 1>(row, nb, x, o),
            }
        }
    });
}

/// One W row (`nb` blocks at `row`) dotted with `xs[..R]` into `out[..R]`; returns R. Each
/// block's weights are decoded once: signed ones as `|w|` and the signs that `vpsignb`
/// moves onto each x row (Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4), Q4_1's unsigned as they are.
///
/// # Safety
/// As `rows32`; `row` points to `nb` blocks, `xs` and `out` hold at least R entries.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group32<const F: u8, const R: usize>(row: *const u8, nb: usize, xs: &[Q8Row], out: &mut [f32]) -> usize {
    let bb = BLOCK_BYTES[usize::from(F)];
    let ones = _mm256_set1_epi16(1);
    let table = levels(F);
    // SAFETY: `table` holds 16 bytes.
    let table = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(table.as_ptr() as *const __m128i) });
    // Per x row: even blocks in acc[i][0] (the twin's lanes 0..8), odd ones in acc[i][1].
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let mut off = [[0.0f32; 2]; R];
    for b in 0..nb {
        // SAFETY: block b lies inside the row; each x row holds block b (see `fits`).
        unsafe {
            let blk = row.add(b * bb);
            let wq = match F {
                0 => load32(blk.add(2)),
                1 => _mm256_sub_epi8(nibbles(blk.add(2)), _mm256_set1_epi8(8)),
                2 => nibbles(blk.add(4)),
                4 => _mm256_shuffle_epi8(table, nibbles(blk.add(2))),
                5 => _mm256_shuffle_epi8(table, nibbles(blk.add(1))),
                _ => {
                    let qh = u32::from_le_bytes([*blk.add(2), *blk.add(3), *blk.add(4), *blk.add(5)]);
                    let high = _mm256_and_si256(bytes_from_bits(qh), _mm256_set1_epi8(0x10));
                    _mm256_sub_epi8(_mm256_or_si256(nibbles(blk.add(6)), high), _mm256_set1_epi8(16))
                }
            };
            let wabs = if F == 2 { wq } else { _mm256_sign_epi8(wq, wq) };
            let dw = if F == 5 { e8m0_half(*blk) } else { f16_at(blk) };
            let (mw, h) = (if F == 2 { f16_at(blk.add(2)) } else { 0.0 }, b % 2);
            for i in 0..R {
                let x = &xs[i];
                let xv = load32((x.q.as_ptr() as *const u8).add(QK * b));
                let xv = if F == 2 { xv } else { _mm256_sign_epi8(xv, wq) };
                let lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, xv), ones);
                let d = dw * *x.d.as_ptr().add(b);
                acc[i][h] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc[i][h]);
                if F == 2 {
                    off[i][h] = mw.mul_add(*x.xsum.as_ptr().add(b), off[i][h]);
                }
            }
        }
    }
    for i in 0..R {
        out[i] = hsum8(_mm256_add_ps(acc[i][0], acc[i][1])) + (off[i][0] + off[i][1]);
    }
    R
}

/// The 8 six-bit scales and mins of a Q4_K / Q5_K block (ggml's `get_scale_min_k4`).
#[inline(always)]
fn scales_mins(s: &[u8]) -> ([i16; 8], [i32; 8]) {
    let (mut sc, mut m) = ([0i16; 8], [0i32; 8]);
    for j in 0..8 {
        let (a, b) = super::scale_min_k4(j, s);
        sc[j] = i16::from(a);
        m[j] = i32::from(b);
    }
    (sc, m)
}

/// Q4_K (`FIFTH` false) or Q5_K rows.
///
/// # Safety
/// As `rows32`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_k4<const FIFTH: bool>(w: &[u8], xq: &Q8Row, out: &mut [f32]) {
    let nb = xq.q.len() / QK_K;
    let (bb, qs_at) = if FIFTH { (176, 48) } else { (144, 16) };
    let row_bytes = nb * bb;
    let xp = xq.q.as_ptr() as *const u8;
    let (low4, one) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(1));
    for (r, o) in out.iter_mut().enumerate() {
        let row = &w[r * row_bytes..(r + 1) * row_bytes];
        let mut acc = _mm256_setzero_ps();
        let mut off = _mm256_setzero_ps();
        for (sb, blk) in row.chunks_exact(bb).enumerate() {
            let (sc, m) = scales_mins(&blk[4..16]);
            let qsum = &xq.qsum[8 * sb..8 * sb + 8];
            let mins: [i32; 8] = std::array::from_fn(|s| m[s] * qsum[s]);
            let mut lanes = _mm256_setzero_si256();
            // SAFETY: the block's 32-byte runs lie inside `blk`, and xq holds super-block sb.
            unsafe {
                let qh = if FIFTH { load32(blk.as_ptr().add(16)) } else { _mm256_setzero_si256() };
                for p in 0..4 {
                    let qv = load32(blk.as_ptr().add(qs_at + 32 * p));
                    let mut lo = _mm256_and_si256(qv, low4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qv), low4);
                    if FIFTH {
                        let bit = |s: i32| {
                            let b = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(s)), one);
                            _mm256_slli_epi16::<4>(b)
                        };
                        lo = _mm256_or_si256(lo, bit(2 * p as i32));
                        hi = _mm256_or_si256(hi, bit(2 * p as i32 + 1));
                    }
                    let x = xp.add(QK_K * sb + 64 * p);
                    lanes = _mm256_add_epi32(lanes, lanes_unsigned(lo, load32(x), _mm256_set1_epi16(sc[2 * p])));
                    lanes = _mm256_add_epi32(
                        lanes,
                        lanes_unsigned(hi, load32(x.add(32)), _mm256_set1_epi16(sc[2 * p + 1])),
                    );
                }
                let dx = xq.d[sb];
                let d = f16_at(blk.as_ptr()) * dx;
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
                // The offsets per sub-block (the twin's `off` lanes); each product is exact.
                let c = _mm256_set1_ps(f16_at(blk.as_ptr().add(2)) * dx);
                let mins = _mm256_loadu_si256(mins.as_ptr() as *const __m256i);
                off = _mm256_fmadd_ps(c, _mm256_cvtepi32_ps(mins), off);
            }
        }
        *o = hsum8(_mm256_sub_ps(acc, off));
    }
}

/// Q6_K rows.
///
/// # Safety
/// As `rows32`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_q6k(w: &[u8], xq: &Q8Row, out: &mut [f32]) {
    let nb = xq.q.len() / QK_K;
    let row_bytes = nb * 210;
    let xp = xq.q.as_ptr() as *const u8;
    let (low4, three, m32) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3), _mm256_set1_epi8(32));
    for (r, o) in out.iter_mut().enumerate() {
        let row = &w[r * row_bytes..(r + 1) * row_bytes];
        let mut acc = _mm256_setzero_ps();
        for (sb, blk) in row.chunks_exact(210).enumerate() {
            let mut lanes = _mm256_setzero_si256();
            // SAFETY: the 32-byte runs read lie inside `blk` (ql 0..128, qh 128..192), and
            // xq holds super-block sb.
            unsafe {
                let b = blk.as_ptr();
                for half in 0..2 {
                    let ql = [load32(b.add(64 * half)), load32(b.add(64 * half + 32))];
                    let qh = load32(b.add(128 + 32 * half));
                    let sc = &blk[192 + 8 * half..200 + 8 * half];
                    for g in 0..4 {
                        let base = ql[g % 2];
                        let nib = if g < 2 {
                            _mm256_and_si256(base, low4)
                        } else {
                            _mm256_and_si256(_mm256_srli_epi16::<4>(base), low4)
                        };
                        let hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g as i32)), three);
                        let q = _mm256_sub_epi8(_mm256_or_si256(nib, _mm256_slli_epi16::<4>(hb)), m32);
                        let x = load32(xp.add(QK_K * sb + 128 * half + 32 * g));
                        let p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
                        let scale = _mm256_set_m128i(
                            _mm_set1_epi16(i16::from(sc[2 * g + 1] as i8)),
                            _mm_set1_epi16(i16::from(sc[2 * g] as i8)),
                        );
                        lanes = _mm256_add_epi32(lanes, _mm256_madd_epi16(p, scale));
                    }
                }
                let d = f16_at(b.add(208)) * xq.d[sb];
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
            }
        }
        *o = hsum8(acc);
    }
}
