//! AVX-512 VNNI forms of the 32-block integer dots (Q8_0, Q4_0, Q4_1, Q5_0, IQ4_NL,
//! MXFP4; see `int.rs` for the scheme). One 512-bit `vpdpbusd` multiplies two blocks'
//! weights (unsigned bytes) with their 8-bit activations (signed bytes) and sums each
//! group of four products into an i32 lane: lanes 0..8 are the even block's twin lanes,
//! 8..16 the odd block's, which is the twin's accumulator layout. `vpdpbusd` wants
//! unsigned weights, so signed ones are offset, `w + 2^s` (Q8_0, IQ4_NL, MXFP4: s = 7,
//! Q4_0: 3, Q5_0: 4; the table formats look `level + 128` up by `vpshufb`), and
//! `2^s·Σq` of each lane (the activation's `bias`, the accumulator's starting value) is
//! taken off exactly. A pair of weight blocks is decoded once for up to 8 x rows, each
//! with its own accumulators, so a server's batch of sequences reads and decodes the
//! weights once; per x row and pair the work is one `vpdpbusd`, one conversion, one
//! multiply (`d_w·d_x`, with `d_x` pre-spread as `d16`) and one FMA.
//!
//! x itself is quantized here too ([`quantize_row`], for the K formats' super-blocks as
//! well), 32 elements at a time, with the twin's arithmetic: the same division for the scale and reciprocal, and rounding half
//! away from zero (`trunc`, then ±1 where the dropped fraction is at least one half).

use std::arch::x86_64::*;

use super::fields::e8m0_half;
use super::int::{activation_block, fits_all, weight_offset_shift, Q8Row};
use super::int_avx2::{each_row_group, hsum8, offset_levels, BLOCK_BYTES};
use super::{QK, QK_K};
use crate::cpu::simd::Isa;
use crate::dtype::DType;

/// Whether the VNNI integer kernels run here: AVX-512 is the active ISA (never one the
/// CPU lacks) and the CPU has VNNI and F16C (the f16 block scales).
pub(super) fn vnni_kernels_run() -> bool {
    Isa::active() == Isa::Avx512
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// `out[r·m + i]` = row r of `w` · `xs[i]` (`int.rs`'s `int_rows_multi`), the K formats
/// by `int_vnni_k.rs`; false, doing nothing, for a format without an integer kernel,
/// where the active ISA is not AVX-512 or the CPU lacks VNNI, or for sizes that do not fit.
pub(super) fn int_rows_multi(dtype: DType, w: &[u8], xs: &[Q8Row], out: &mut [f32]) -> bool {
    let f = match dtype {
        DType::Q8_0 => 0,
        DType::Q4_0 => 1,
        DType::Q4_1 => 2,
        DType::Q5_0 => 3,
        DType::IQ4NL => 4,
        DType::MXFP4 => 5,
        _ => return super::int_vnni_k::int_rows_multi(dtype, w, xs, out),
    };
    if !vnni_kernels_run() || !fits_all(dtype, w, xs, out.len()) {
        return false;
    }
    // SAFETY: AVX-512 F/BW/VL and FMA (the active ISA, never one the CPU lacks), VNNI and
    // F16C are present; `fits` checked that `w` holds `out.len() / m` rows of blocks
    // covering every `xs[i].q`, and that each row's per-block vectors match.
    unsafe {
        match f {
            0 => rows::<0>(w, xs, out),
            1 => rows::<1>(w, xs, out),
            2 => rows::<2>(w, xs, out),
            3 => rows::<3>(w, xs, out),
            4 => rows::<4>(w, xs, out),
            _ => rows::<5>(w, xs, out),
        }
    }
    true
}

/// Every W row against every x row, in groups of up to 8 x rows per pass over the row.
///
/// # Safety
/// AVX-512 F/BW/VL, VNNI, FMA and F16C; the sizes as `int_rows_multi` checks them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn rows<const F: u8>(w: &[u8], xs: &[Q8Row], out: &mut [f32]) {
    let nb = xs[0].q.len() / QK;
    let row_bytes = nb * BLOCK_BYTES[usize::from(F)];
    each_row_group(w, xs, out, row_bytes, |row, x, o| {
        // SAFETY: the row lies inside `w`, and each x row covers its nb blocks.
        unsafe {
            match x.len() {
                8.. => row_group::<F, 8>(row, nb, x, o),
                4..=7 => row_group::<F, 4>(row, nb, x, o),
                2 | 3 => row_group::<F, 2>(row, nb, x, o),
                _ => row_group::<F, 1>(row, nb, x, o),
            }
        }
    });
}

/// One W row (`nb` blocks at `row`) dotted with `xs[..R]` into `out[..R]`; returns R.
///
/// # Safety
/// As `rows`; `row` points to `nb` blocks, `xs` and `out` hold at least R entries.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn row_group<const F: u8, const R: usize>(row: *const u8, nb: usize, xs: &[Q8Row], out: &mut [f32]) -> usize {
    let bb = BLOCK_BYTES[usize::from(F)];
    let mut acc = [_mm512_setzero_ps(); R];
    let mut off = [_mm_setzero_ps(); R];
    // SAFETY: the pairs lie inside the row and the x rows (the caller's contract).
    unsafe {
        for b0 in (0..nb - nb % 2).step_by(2) {
            pair::<F, R, true>(row.add(b0 * bb), b0, xs, &mut acc, &mut off);
        }
        if nb % 2 == 1 {
            pair::<F, R, false>(row.add((nb - 1) * bb), nb - 1, xs, &mut acc, &mut off);
        }
    }
    for i in 0..R {
        let a = acc[i];
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
        let sum = hsum8(_mm256_add_ps(_mm512_castps512_ps256(a), hi));
        let o = off[i];
        out[i] = sum + (_mm_cvtss_f32(o) + _mm_cvtss_f32(_mm_movehdup_ps(o)));
    }
    R
}

/// Blocks b0 and b0 + 1 (`TWO`) or b0 alone (the odd last block) of one W row at `blk0`
/// into the accumulators of `xs[..R]`.
///
/// # Safety
/// As `row_group`; block b0 (and b0 + 1 when `TWO`) lie inside the row, and each x row
/// holds their activations, Σx̃, and a whole pair of biases and spread scales (`fits`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pair<const F: u8, const R: usize, const TWO: bool>(
    blk0: *const u8,
    b0: usize,
    xs: &[Q8Row],
    acc: &mut [__m512; R],
    off: &mut [__m128; R],
) {
    // SAFETY: as the function's contract.
    unsafe {
        // An odd last block: the second half's weights and scales read as 0 (and its
        // activations, masked), which leaves its accumulator lanes unchanged, as in the twin.
        let next = if TWO { Some(blk0.add(BLOCK_BYTES[usize::from(F)])) } else { None };
        let (wv, dw, mw) = weights::<F>(blk0, next);
        for (i, x) in xs[..R].iter().enumerate() {
            let start = if F == 2 {
                _mm512_setzero_si512()
            } else {
                _mm512_loadu_si512(x.bias.as_ptr().add(8 * b0) as *const _)
            };
            let qp = x.q.as_ptr().add(QK * b0);
            let q = if TWO { _mm512_loadu_si512(qp as *const _) } else { _mm512_maskz_loadu_epi8(u32::MAX.into(), qp) };
            let lanes = _mm512_dpbusd_epi32(start, wv, q);
            let d = _mm512_mul_ps(dw, _mm512_loadu_ps(x.d16.as_ptr().add(8 * b0)));
            acc[i] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lanes), acc[i]);
            if F == 2 {
                let xp = x.xsum.as_ptr().add(b0);
                let xsum = if TWO { _mm_castsi128_ps(_mm_loadl_epi64(xp as *const __m128i)) } else { _mm_load_ss(xp) };
                off[i] = _mm_fmadd_ps(mw, xsum, off[i]);
            }
        }
    }
}

/// The offset weights of block `blk0` and, if present, the next block `blk1` as 64
/// unsigned bytes in element order (block 0's 32, then block 1's; zeros for an absent
/// block), their scales spread over 16 lanes (`[d0; 8]` then `[d1; 8]`) and, for Q4_1,
/// their mins in lanes 0 and 1 (0 where absent).
///
/// # Safety
/// `blk0` (and `blk1`) point to whole blocks of format `F`; the features of `rows`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn weights<const F: u8>(blk0: *const u8, blk1: Option<*const u8>) -> (__m512i, __m512, __m128) {
    // SAFETY (whole fn): every read lies inside a block the caller vouches for.
    unsafe {
        // The 4-byte header (d, m for Q4_1; d and 2 bytes of quants otherwise) of each
        // block: [d0, m0, d1, m1] as f16, widened.
        let head = |p: *const u8| _mm_cvtsi32_si128(i32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)]));
        let heads = _mm_unpacklo_epi32(head(blk0), blk1.map_or(_mm_setzero_si128(), head));
        let scales = _mm_cvtph_ps(heads);
        let dw = if F == 5 {
            // MXFP4's E8M0 byte (0 for an absent block).
            let d1 = blk1.map_or(0.0, |p| e8m0_half(*p));
            _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(e8m0_half(*blk0)), _mm512_set1_ps(d1))
        } else {
            _mm512_permutexvar_ps(
                _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2),
                _mm512_castps128_ps512(scales),
            )
        };
        let mw = _mm_shuffle_ps::<0b11_01_11_01>(scales, scales);
        let wv = if F == 0 {
            let lo = _mm256_loadu_si256(blk0.add(2) as *const __m256i);
            let hi = blk1.map_or(_mm256_set1_epi8(-128), |p| _mm256_loadu_si256(p.add(2) as *const __m256i));
            // w + 128 as an unsigned byte (the absent half becomes 0).
            _mm512_xor_si512(_mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi), _mm512_set1_epi8(-128))
        } else {
            let qs_at = [0, 2, 4, 6, 2, 1][usize::from(F)];
            let a = _mm_loadu_si128(blk0.add(qs_at) as *const __m128i);
            let b = blk1.map_or(_mm_setzero_si128(), |p| _mm_loadu_si128(p.add(qs_at) as *const __m128i));
            // [a, a, b, b], the odd 128-bit lanes shifted right by 4: each block's low
            // nibbles (elements 0..16) then its high ones (16..32).
            let ab = _mm512_castsi256_si512(_mm256_set_m128i(b, a));
            let aabb = _mm512_shuffle_i64x2::<0b01_01_00_00>(ab, ab);
            let shifted = _mm512_mask_srli_epi16::<4>(aabb, 0xFF00_FF00, aabb);
            let nibbles = _mm512_and_si512(shifted, _mm512_set1_epi8(0x0F));
            if F == 3 {
                let qh = |p: *const u8| u32::from_le_bytes([*p.add(2), *p.add(3), *p.add(4), *p.add(5)]);
                let bits = u64::from(qh(blk0)) | u64::from(blk1.map_or(0, qh)) << 32;
                _mm512_or_si512(nibbles, _mm512_maskz_mov_epi8(bits, _mm512_set1_epi8(0x10)))
            } else if F >= 4 {
                // level + 128 as an unsigned byte (an absent block's are multiplied by
                // its masked, zero activations).
                let offset = const { offset_levels(F) };
                let table = _mm512_broadcast_i32x4(_mm_loadu_si128(offset.as_ptr() as *const __m128i));
                _mm512_shuffle_epi8(table, nibbles)
            } else {
                nibbles
            }
        };
        (wv, dw, mw)
    }
}

/// x quantized as `int.rs`'s `quantize_row` does it, bit for bit, 32 elements per step
/// (one scale per 32 or per 256); `None` (nothing done) where VNNI is missing or the ISA
/// in use is not AVX-512, or for a format without an integer kernel or a length that is
/// not whole blocks.
pub(super) fn quantize_row(x: &[f32], dtype: DType) -> Option<Q8Row> {
    let block = activation_block(dtype)?;
    if Isa::active() != Isa::Avx512
        || !std::arch::is_x86_feature_detected!("avx512vnni")
        || !x.len().is_multiple_of(block)
    {
        return None;
    }
    let nb = x.len() / QK;
    // The 32-block formats' lane biases and spread scales (none for the K formats).
    let per_pair = if block == QK { 16 * nb.div_ceil(2) } else { 0 };
    let mut row = Q8Row {
        dtype,
        q: vec![0; x.len()],
        d: vec![0.0; x.len() / block],
        xsum: vec![0.0; nb],
        qsum: vec![0; nb],
        bias: vec![0; per_pair],
        d16: vec![0.0; per_pair],
    };
    // SAFETY: AVX-512 F/BW/VL (the active ISA) and VNNI are present; every vector is
    // sized for x's blocks above.
    unsafe {
        match weight_offset_shift(dtype) {
            Some(s) => quantize_blocks(x, s, &mut row),
            None => quantize_super_blocks(x, &mut row),
        }
    }
    Some(row)
}

/// `|v|` lane by lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn abs_ps(v: __m512) -> __m512 {
    _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFF_FFFF)))
}

/// The 32 values at `x` times `id`, rounded half away from zero (`trunc`, then ±1 where
/// the dropped fraction is at least one half), NaN → 0, clamped to ±127, stored at `q`;
/// returns their sum.
///
/// # Safety
/// AVX-512 F/BW/VL; `x` holds 32 readable f32, `q` 32 writable bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn round_run(x: *const f32, id: __m512, q: *mut i8) -> i32 {
    let mut qsum = _mm512_setzero_si512();
    for h in 0..2 {
        // SAFETY: the caller's 32 inputs and outputs.
        unsafe {
            let r = _mm512_mul_ps(_mm512_loadu_ps(x.add(16 * h)), id);
            let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(r);
            let frac = _mm512_sub_ps(r, t); // exact: |r| < 2^23
            let t = _mm512_mask_add_ps(
                t,
                _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, _mm512_set1_ps(0.5)),
                t,
                _mm512_set1_ps(1.0),
            );
            let t = _mm512_mask_sub_ps(
                t,
                _mm512_cmp_ps_mask::<_CMP_LE_OQ>(frac, _mm512_set1_ps(-0.5)),
                t,
                _mm512_set1_ps(1.0),
            );
            // NaN → 0 (the twin's `as i8`), then the clamp to ±127.
            let t = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(t, t), t);
            let t = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(-127.0)), _mm512_set1_ps(127.0));
            let qi = _mm512_cvtps_epi32(t);
            qsum = _mm512_add_epi32(qsum, qi);
            _mm_storeu_si128(q.add(16 * h) as *mut __m128i, _mm512_cvtepi32_epi8(qi));
        }
    }
    _mm512_reduce_add_epi32(qsum)
}

/// The scale `max|x|/127` of `v`'s lanes skipping NaN, as the twin's fold (`max_ps(a,
/// b)` returns b if a is NaN), and its reciprocal (0 for a zero scale) spread.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
fn scale_of(v: &[__m512]) -> (f32, __m512) {
    let m = v.iter().fold(_mm512_setzero_ps(), |m, &x| _mm512_max_ps(abs_ps(x), m));
    let d = _mm512_reduce_max_ps(m) / 127.0;
    (d, _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 }))
}

/// # Safety
/// AVX-512 F/BW/VL and VNNI; `row`'s vectors sized for `x.len() / 32` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn quantize_blocks(x: &[f32], shift: u32, row: &mut Q8Row) {
    let ones = _mm512_set1_epi8(1);
    for (b, xs) in x.chunks_exact(QK).enumerate() {
        // SAFETY: block b's 32 inputs, 32 outputs and 8 biases are in bounds.
        unsafe {
            let v = [_mm512_loadu_ps(xs.as_ptr()), _mm512_loadu_ps(xs.as_ptr().add(16))];
            let (d, id) = scale_of(&v);
            let qs = round_run(xs.as_ptr(), id, row.q.as_mut_ptr().add(QK * b));
            *row.d.get_unchecked_mut(b) = d;
            *row.qsum.get_unchecked_mut(b) = qs;
            *row.xsum.get_unchecked_mut(b) = d * qs as f32;
            // −2^s·Σ over each group of 4 (a 256-bit `vpdpbusd` by ones).
            let qb = _mm256_loadu_si256(row.q.as_ptr().add(QK * b) as *const __m256i);
            let gsum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm512_castsi512_si256(ones), qb);
            let bias =
                _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_sll_epi32(gsum, _mm_cvtsi32_si128(shift as i32)));
            _mm256_storeu_si256(row.bias.as_mut_ptr().add(8 * b) as *mut __m256i, bias);
            let at = 16 * (b / 2) + 8 * (b % 2);
            _mm256_storeu_ps(row.d16.as_mut_ptr().add(at), _mm256_set1_ps(d));
        }
    }
}

/// The K formats' activations: one scale per 256, the integer sum per 32.
///
/// # Safety
/// AVX-512 F/BW/VL and VNNI; `row`'s vectors sized for `x.len() / 256` super-blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn quantize_super_blocks(x: &[f32], row: &mut Q8Row) {
    for (sb, xs) in x.chunks_exact(QK_K).enumerate() {
        // SAFETY: super-block sb's 256 inputs and outputs and 8 sums are in bounds.
        unsafe {
            let v: [__m512; 16] = std::array::from_fn(|j| _mm512_loadu_ps(xs.as_ptr().add(16 * j)));
            let (d, id) = scale_of(&v);
            *row.d.get_unchecked_mut(sb) = d;
            for run in 0..QK_K / QK {
                let at = QK_K * sb + QK * run;
                let qs = round_run(xs.as_ptr().add(QK * run), id, row.q.as_mut_ptr().add(at));
                *row.qsum.get_unchecked_mut(at / QK) = qs;
                *row.xsum.get_unchecked_mut(at / QK) = d * qs as f32;
            }
        }
    }
}
