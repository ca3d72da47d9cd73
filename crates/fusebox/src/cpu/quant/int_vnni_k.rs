//! AVX-512 VNNI forms of the K-format integer dots (Q4_K, Q5_K, Q6_K; see `int.rs` for
//! the scheme). A super-block of 256 weights is decoded once, as four runs of 64 in
//! element order (two sub-blocks of 32 each), for up to 8 x rows. Per x row and run the
//! work is one `vpmaddubsw` (unsigned weight × signed activation, adjacent pairs summed
//! to i16) and one `vpdpwssd` by the sub-block scales (pairs summed to i32 and added), so
//! i32 lane j of the 16 holds `sc·Σ w·q` over elements 4j..4j+4 of every run: lane l and
//! lane l + 8 together are the twin's lane l, exactly. The f32 steps then follow the twin.
//!
//! * Q4_K / Q5_K: the weights are unsigned (0..15, 0..31) as stored; the run's 32 packed
//!   bytes are broadcast to both halves, the upper half shifted by a nibble. Q5_K's fifth
//!   bits are picked from the broadcast `qh` by a byte test against the sub-block's bit.
//! * Q6_K: `q − 32` is signed; its magnitude (≤ 32) is the unsigned operand and its sign
//!   is moved onto the activation (a masked negation, AVX-512 having no 512-bit `vpsignb`).
//!
//! No i16 saturates: a pair is at most 2·32·127 = 8,128. The weights are streamed with
//! software prefetches a fixed distance ahead in bytes ([`PREFETCH_BYTES`]), which suits
//! DRAM whatever the row length.

use std::arch::x86_64::*;

use super::int::{fits_all, Q8Row};
use super::int_avx2::hsum8;
use super::QK_K;
use crate::dtype::DType;

/// How far ahead of the super-block being read the weight prefetches run, in bytes: the
/// weights of a decode step come from DRAM, so the distance covers its latency at full
/// bandwidth rather than the L2's (chosen among 0–16 KiB with `decode_gemv` on an AMD EPYC).
pub(super) const PREFETCH_BYTES: usize = 8192;

/// The 16-element sub-block (of a run of 64) of each i16 word of a `vpmaddubsw` result.
const WORD_SUB_BLOCK: [i16; 32] =
    [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];

/// Bytes of a super-block, by the kernels' `F`: Q4_K, Q5_K, Q6_K.
const BLOCK_BYTES: [usize; 3] = [144, 176, 210];

/// `out[r·m + i]` = row r of `w` · `xs[i]` (`int.rs`'s `int_rows_multi`) for Q4_K, Q5_K
/// and Q6_K; false, doing nothing, for another format, where the active ISA is not
/// AVX-512 or the CPU lacks VNNI or F16C, or for sizes that do not fit.
pub(super) fn int_rows_multi(dtype: DType, w: &[u8], xs: &[Q8Row], out: &mut [f32]) -> bool {
    let f = match dtype {
        DType::Q4K => 0,
        DType::Q5K => 1,
        DType::Q6K => 2,
        _ => return false,
    };
    if !super::int_vnni::vnni_kernels_run() || !fits_all(dtype, w, xs, out.len()) {
        return false;
    }
    // SAFETY: AVX-512 F/BW/VL and FMA (the active ISA, never one the CPU lacks), VNNI and
    // F16C are present; `fits_all` checked that `w` holds `out.len() / m` rows of
    // super-blocks covering every `xs[i].q`, with one scale per super-block and one sum
    // per 32 elements.
    unsafe {
        match f {
            0 => rows::<0>(w, xs, out),
            1 => rows::<1>(w, xs, out),
            _ => rows::<2>(w, xs, out),
        }
    }
    true
}

/// Software prefetches of a byte range, issued once per cache line as a cursor moves
/// through it (never past its end).
struct Prefetcher {
    next: usize,
    end: usize,
}

impl Prefetcher {
    fn new(w: &[u8]) -> Self {
        let start = w.as_ptr() as usize;
        Prefetcher { next: start & !63, end: start + w.len() }
    }

    /// Prefetches every line not yet prefetched below `upto` (clamped to the range).
    #[inline(always)]
    fn upto(&mut self, upto: usize) {
        let upto = upto.min(self.end);
        while self.next < upto {
            // SAFETY: a prefetch is only a hint (it never faults); the line overlaps `w`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(self.next as *const i8) };
            self.next += 64;
        }
    }
}

/// Every W row against every x row, in groups of up to 8 x rows per pass over the row.
///
/// # Safety
/// AVX-512 F/BW/VL, VNNI, FMA and F16C; the sizes as `int_rows_multi` checks them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn rows<const F: u8>(w: &[u8], xs: &[Q8Row], out: &mut [f32]) {
    let nb = xs[0].q.len() / QK_K;
    let row_bytes = nb * BLOCK_BYTES[usize::from(F)];
    let m = xs.len();
    let mut prefetch = Prefetcher::new(w);
    for (r, outs) in out.chunks_exact_mut(m).enumerate() {
        let row = w.as_ptr().wrapping_add(r * row_bytes);
        let mut i = 0;
        while i < m {
            let (x, o) = (&xs[i..], &mut outs[i..]);
            // SAFETY: the row lies inside `w`, and each x row covers its nb super-blocks.
            i += unsafe {
                match x.len() {
                    8.. => row_group::<F, 8>(row, nb, x, o, &mut prefetch),
                    4..=7 => row_group::<F, 4>(row, nb, x, o, &mut prefetch),
                    2 | 3 => row_group::<F, 2>(row, nb, x, o, &mut prefetch),
                    _ => row_group::<F, 1>(row, nb, x, o, &mut prefetch),
                }
            };
        }
    }
}

/// A super-block decoded for the integer dots: four runs of 64 weights in element order
/// (unsigned; Q6_K's magnitudes), their i16 scales word by word, Q6_K's negative
/// weights, and the f32 scales (`d`, and `dmin` with the 8 mins as i32 lanes for
/// Q4_K / Q5_K).
struct SuperBlock {
    w: [__m512i; 4],
    scales: [__m512i; 4],
    negative: [__mmask64; 4],
    d: f32,
    dmin: f32,
    mins: __m256i,
}

/// One W row (`nb` super-blocks at `row`) dotted with `xs[..R]` into `out[..R]`; returns R.
///
/// # Safety
/// As `rows`; `row` points to `nb` super-blocks, `xs` and `out` hold at least R entries.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn row_group<const F: u8, const R: usize>(
    row: *const u8,
    nb: usize,
    xs: &[Q8Row],
    out: &mut [f32],
    prefetch: &mut Prefetcher,
) -> usize {
    let bb = BLOCK_BYTES[usize::from(F)];
    let mut acc = [_mm256_setzero_ps(); R];
    let mut off = [_mm256_setzero_ps(); R];
    for sb in 0..nb {
        // SAFETY: super-block sb lies inside the row; each x row holds its 256 values,
        // its scale and its 8 sums (the caller's contract).
        unsafe {
            let blk = row.add(sb * bb);
            prefetch.upto(blk as usize + PREFETCH_BYTES + bb);
            let s = decode::<F>(blk);
            for i in 0..R {
                let x = &xs[i];
                let q = x.q.as_ptr().add(QK_K * sb);
                let mut lanes = _mm512_setzero_si512();
                for run in 0..4 {
                    let mut xv = _mm512_loadu_si512(q.add(64 * run) as *const _);
                    if F == 2 {
                        xv = _mm512_mask_sub_epi8(xv, s.negative[run], _mm512_setzero_si512(), xv);
                    }
                    lanes = _mm512_dpwssd_epi32(lanes, _mm512_maddubs_epi16(s.w[run], xv), s.scales[run]);
                }
                // Lanes l and l + 8 cover the same elements of different sub-blocks.
                let lanes = _mm256_add_epi32(_mm512_castsi512_si256(lanes), _mm512_extracti64x4_epi64::<1>(lanes));
                let dx = *x.d.as_ptr().add(sb);
                acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(s.d * dx), _mm256_cvtepi32_ps(lanes), acc[i]);
                if F != 2 {
                    // m_s·qsum_s per sub-block: `vpmaddwd` of the i32 lanes is exact here,
                    // the mins' high words being 0 and |qsum| ≤ 32·127 fitting its low word.
                    let qsum = _mm256_loadu_si256(x.qsum.as_ptr().add(8 * sb) as *const __m256i);
                    let mins = _mm256_cvtepi32_ps(_mm256_madd_epi16(s.mins, qsum));
                    off[i] = _mm256_fmadd_ps(_mm256_set1_ps(s.dmin * dx), mins, off[i]);
                }
            }
        }
    }
    for i in 0..R {
        out[i] = hsum8(if F == 2 { acc[i] } else { _mm256_sub_ps(acc[i], off[i]) });
    }
    R
}

/// The little-endian u32 at `p`.
///
/// # Safety
/// `p` must point to 4 readable bytes.
#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    // SAFETY: the caller guarantees 4 readable bytes.
    unsafe { (p as *const u32).read_unaligned() }
}

/// 32 bytes at `p` in both halves of a 512-bit vector.
///
/// # Safety
/// `p` must point to 32 readable bytes; AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
unsafe fn broadcast32(p: *const u8) -> __m512i {
    // SAFETY: the caller guarantees 32 readable bytes.
    unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(p as *const __m256i)) }
}

/// The super-block of format `F` at `blk`, decoded (see [`SuperBlock`]).
///
/// # Safety
/// `blk` points to a whole super-block of format `F`; the features of `rows`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn decode<const F: u8>(blk: *const u8) -> SuperBlock {
    // SAFETY (whole fn): every read lies inside the super-block.
    unsafe {
        let low4 = _mm512_set1_epi8(0x0F);
        if F == 2 {
            // ql[128] qh[64] scales[16] d: run 2h + c is element 128h + 64c.. of half h,
            // the low (c = 0) or high (c = 1) nibbles of ql[64h..64h + 64] with bits
            // 2(2c)..  (lower 32 bytes) and 2(2c + 1).. (upper) of qh[32h..32h + 32].
            let sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(192) as *const __m128i)));
            let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(u16::from_le_bytes([
                *blk.add(208),
                *blk.add(209),
            ])))));
            let mut s = SuperBlock {
                w: [_mm512_setzero_si512(); 4],
                scales: [_mm512_setzero_si512(); 4],
                negative: [0; 4],
                d,
                dmin: 0.0,
                mins: _mm256_setzero_si256(),
            };
            for h in 0..2 {
                let ql = _mm512_loadu_si512(blk.add(64 * h) as *const _);
                let qh = broadcast32(blk.add(128 + 32 * h));
                // Two high bits into bits 4..6: (qh << 4, qh << 2) then (qh, qh >> 2), by halves.
                let high = [
                    _mm512_sllv_epi16(qh, _mm512_mask_set1_epi16(_mm512_set1_epi16(4), 0xFFFF_0000, 2)),
                    _mm512_srlv_epi16(qh, _mm512_mask_set1_epi16(_mm512_setzero_si512(), 0xFFFF_0000, 2)),
                ];
                let nib = [_mm512_and_si512(ql, low4), _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low4)];
                for c in 0..2 {
                    let run = 2 * h + c;
                    let w6 = _mm512_or_si512(nib[c], _mm512_and_si512(high[c], _mm512_set1_epi8(0x30)));
                    let q = _mm512_sub_epi8(w6, _mm512_set1_epi8(32));
                    s.w[run] = _mm512_abs_epi8(q);
                    s.negative[run] = _mm512_movepi8_mask(q);
                    // Words 8t..8t + 8 take the scale of 16-element sub-block 4·run + t.
                    let pick = _mm512_add_epi16(
                        _mm512_set1_epi16(4 * run as i16),
                        _mm512_loadu_si512(WORD_SUB_BLOCK.as_ptr() as *const _),
                    );
                    s.scales[run] = _mm512_permutexvar_epi16(pick, sc16);
                }
            }
            return s;
        }
        // f16 d, dmin; scales[12]; (Q5_K: qh[32]); qs[128]. The 6-bit scales and mins of
        // `scale_min_k4`, four bytes at a time.
        let (a, b, c) = (u32_at(blk.add(4)), u32_at(blk.add(8)), u32_at(blk.add(12)));
        let sc_hi = (c & 0x0F0F_0F0F) | (((a >> 6) & 0x0303_0303) << 4);
        let m_hi = ((c >> 4) & 0x0F0F_0F0F) | (((b >> 6) & 0x0303_0303) << 4);
        let scales = u64::from(a & 0x3F3F_3F3F) | u64::from(sc_hi) << 32;
        let mins = u64::from(b & 0x3F3F_3F3F) | u64::from(m_hi) << 32;
        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(u32_at(blk) as i32));
        let sc8 = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(scales as i64)));
        let qs_at = if F == 1 { 48 } else { 16 };
        let qh = if F == 1 { broadcast32(blk.add(16)) } else { _mm512_setzero_si512() };
        let mut s = SuperBlock {
            w: [_mm512_setzero_si512(); 4],
            scales: [_mm512_setzero_si512(); 4],
            negative: [0; 4],
            d: _mm_cvtss_f32(dm),
            dmin: _mm_cvtss_f32(_mm_movehdup_ps(dm)),
            mins: _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mins as i64)),
        };
        for run in 0..4 {
            // Run p: sub-blocks 2p (low nibbles of qs[32p..32p + 32]) and 2p + 1 (high).
            let packed = broadcast32(blk.add(qs_at + 32 * run));
            let mut w = _mm512_and_si512(_mm512_mask_srli_epi16::<4>(packed, 0xFFFF_0000, packed), low4);
            if F == 1 {
                let (even, odd) = ((1u8 << (2 * run)) as i8, (2u8 << (2 * run)) as i8);
                let bits = _mm512_mask_set1_epi8(_mm512_set1_epi8(even), 0xFFFF_FFFF_0000_0000, odd);
                let fifth = _mm512_test_epi8_mask(qh, bits);
                w = _mm512_or_si512(w, _mm512_maskz_mov_epi8(fifth, _mm512_set1_epi8(0x10)));
            }
            s.w[run] = w;
            // Words 0..16 take scale 2p (bytes 4p, 4p + 1 of each 128-bit lane), 16..32 2p + 1.
            let (lo, hi) = ((4 * run) as i16, (4 * run + 2) as i16);
            let pick = _mm512_mask_set1_epi16(_mm512_set1_epi16(lo | (lo + 1) << 8), 0xFFFF_0000, hi | (hi + 1) << 8);
            s.scales[run] = _mm512_shuffle_epi8(sc8, pick);
        }
        s
    }
}
