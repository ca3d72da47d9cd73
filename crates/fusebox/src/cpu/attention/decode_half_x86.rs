//! AVX2 + F16C forms of the single-query kernels in `decode.rs` for F16 and BF16 caches:
//! each 16-bit K or V element is widened to f32 in registers as it is loaded (F16 by
//! `vcvtph2ps`, BF16 by a zero-extension and a 16-bit left shift: a bfloat16 is the high
//! half of an f32), so the cache is read at half the bytes of an F32 one and never
//! copied. Products and sums are f32. Head dims that are multiples of 16; other dims
//! (and CPUs without F16C) keep the portable path.
//!
//! * Scores: per key row, one 8-lane FMA chain per query head (the heads of a group
//!   share each loaded row), then a horizontal sum per head.
//! * Accumulation: 16 output columns of every head held in registers over the whole
//!   block of keys, each V row's 16 columns loaded once for all heads.
//!
//! AVX-512 machines run these too (they have AVX2 and F16C); AVX-512 FP16/BF16 forms
//! would need a machine to test them on.

use std::arch::x86_64::*;

use super::decode::{HalfElem, BLOCK_K, HEADS};
use crate::cpu::simd::Isa;

/// Whether the kernels here run for head dim `d` on this CPU with the ISA in use.
pub(super) fn applies(d: usize) -> bool {
    d > 0 && d.is_multiple_of(16) && Isa::active() != Isa::Scalar && std::arch::is_x86_feature_detected!("f16c")
}

/// 8 elements at `p` widened to f32.
///
/// # Safety
/// `p` must point to 8 readable 16-bit elements; the CPU must support AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8<T: HalfElem>(p: *const T) -> __m256 {
    // SAFETY: 16 readable bytes at p (the caller's contract).
    let h = unsafe { _mm_loadu_si128(p.cast()) };
    if T::BF {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
    } else {
        _mm256_cvtph_ps(h)
    }
}

/// Requests the cache lines of `ahead` (empty: none) that fall to row `j` of `rows` rows.
#[inline]
fn prefetch_part<T>(ahead: &[T], j: usize, rows: usize) {
    let bytes = std::mem::size_of_val(ahead);
    let per_row = bytes.div_ceil(rows.max(1)).next_multiple_of(64);
    let ptr = ahead.as_ptr().cast::<u8>();
    let mut at = j * per_row;
    let end = (at + per_row).min(bytes);
    while at < end {
        // SAFETY: at < the byte length of `ahead`; a prefetch never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(ptr.add(at).cast()) };
        at += 64;
    }
}

/// `s[g·BLOCK_K + j] = q[g]·k_j` for the first `heads` heads of `q` (`[HEADS, d]` f32)
/// and every row `k_j` of `k` (`[keys, d]`, keys ≤ BLOCK_K), prefetching `ahead`. Only
/// where [`applies`]`(d)`.
pub(super) fn scores<T: HalfElem>(k: &[T], d: usize, q: &[f32], heads: usize, s: &mut [f32], ahead: &[T]) {
    let keys = k.len() / d;
    assert!(applies(d) && heads <= HEADS && keys <= BLOCK_K && q.len() >= heads * d && s.len() >= HEADS * BLOCK_K);
    // SAFETY: AVX2 and F16C are available (`applies`); the slices' lengths are asserted.
    unsafe {
        match heads {
            1 => heads_scores::<T, 1>(k, d, q, s, ahead),
            2 => heads_scores::<T, 2>(k, d, q, s, ahead),
            3 => heads_scores::<T, 3>(k, d, q, s, ahead),
            _ => heads_scores::<T, 4>(k, d, q, s, ahead),
        }
    }
}

/// [`scores`] for `H` heads.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `d` a multiple of 8, `q.len() ≥ H·d`,
/// `s.len() ≥ (H − 1)·BLOCK_K + k.len()/d`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn heads_scores<T: HalfElem, const H: usize>(k: &[T], d: usize, q: &[f32], s: &mut [f32], ahead: &[T]) {
    let keys = k.len() / d;
    for j in 0..keys {
        prefetch_part(ahead, j, keys);
        let row = k[j * d..(j + 1) * d].as_ptr();
        let mut acc = [_mm256_setzero_ps(); H];
        for c in (0..d).step_by(8) {
            // SAFETY: c + 8 ≤ d: the row's elements and each head's query are in bounds.
            let x = unsafe { load8(row.add(c)) };
            for (g, a) in acc.iter_mut().enumerate() {
                // SAFETY: g·d + c + 8 ≤ H·d ≤ q.len().
                *a = _mm256_fmadd_ps(x, unsafe { _mm256_loadu_ps(q.as_ptr().add(g * d + c)) }, *a);
            }
        }
        for (g, a) in acc.iter().enumerate() {
            s[g * BLOCK_K + j] = hsum(*a);
        }
    }
}

/// The sum of the 8 lanes of `v`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    let x = _mm_add_ss(x, _mm_movehdup_ps(x));
    _mm_cvtss_f32(x)
}

/// `o[g] = α_g·o[g] + Σ_j p[g·BLOCK_K + j]·v_j` for the first `heads` heads (`o`
/// `[HEADS, d]`, `v` `[keys, d]`), prefetching `ahead`. Only where [`applies`]`(d)`.
pub(super) fn accumulate<T: HalfElem>(
    o: &mut [f32],
    d: usize,
    p: &[f32],
    v: &[T],
    alpha: &[f32; HEADS],
    heads: usize,
    ahead: &[T],
) {
    let keys = v.len() / d;
    assert!(applies(d) && heads <= HEADS && keys <= BLOCK_K && o.len() >= heads * d && p.len() >= HEADS * BLOCK_K);
    // SAFETY: AVX2 and F16C are available (`applies`); the slices' lengths are asserted.
    unsafe {
        match heads {
            1 => heads_accumulate::<T, 1>(o, d, p, v, alpha, ahead),
            2 => heads_accumulate::<T, 2>(o, d, p, v, alpha, ahead),
            3 => heads_accumulate::<T, 3>(o, d, p, v, alpha, ahead),
            _ => heads_accumulate::<T, 4>(o, d, p, v, alpha, ahead),
        }
    }
}

/// [`accumulate`] for `H` heads, 16 columns at a time: the `H × 2` output vectors stay in
/// registers over the block's keys.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `d` a multiple of 16, `o.len() ≥ H·d`,
/// `p.len() ≥ (H − 1)·BLOCK_K + v.len()/d`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn heads_accumulate<T: HalfElem, const H: usize>(
    o: &mut [f32],
    d: usize,
    p: &[f32],
    v: &[T],
    alpha: &[f32; HEADS],
    ahead: &[T],
) {
    let keys = v.len() / d;
    let (o, v) = (&mut o[..H * d], &v[..keys * d]);
    let columns = d / 16;
    for col0 in (0..d).step_by(16) {
        let mut acc = [[_mm256_setzero_ps(); 2]; H];
        for (g, a) in acc.iter_mut().enumerate() {
            let s = _mm256_set1_ps(alpha[g]);
            for (c, a) in a.iter_mut().enumerate() {
                // SAFETY: g·d + col0 + 8c + 8 ≤ H·d = o.len().
                *a = _mm256_mul_ps(s, unsafe { _mm256_loadu_ps(o.as_ptr().add(g * d + col0 + 8 * c)) });
            }
        }
        for j in 0..keys {
            // Each column pass takes its share of the next block's lines.
            prefetch_part(ahead, (col0 / 16) * keys + j, columns * keys);
            // SAFETY: j·d + col0 + 16 ≤ keys·d = v.len().
            let (x0, x1) = unsafe { (load8(v.as_ptr().add(j * d + col0)), load8(v.as_ptr().add(j * d + col0 + 8))) };
            for (g, a) in acc.iter_mut().enumerate() {
                let w = _mm256_set1_ps(p[g * BLOCK_K + j]);
                a[0] = _mm256_fmadd_ps(w, x0, a[0]);
                a[1] = _mm256_fmadd_ps(w, x1, a[1]);
            }
        }
        for (g, a) in acc.iter().enumerate() {
            for (c, a) in a.iter().enumerate() {
                // SAFETY: as for the loads above.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(g * d + col0 + 8 * c), *a) };
            }
        }
    }
}
