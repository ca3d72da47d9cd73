//! The two passes of a softmax row written in place (a cached F32 output), as AVX-512
//! loops with intrinsics: the exps into the output row with their sum, then the scale
//! with the next row's max folded alongside.
//!
//! The portable kernels (`simd::exp_sub_sum_into`, `softmax::scale_in_place_fold_max`)
//! compute the same values; these exist because the exp pass is bound by arithmetic
//! (an exp is 15 vector operations) and every instruction of loop overhead shows. The
//! portable loops carry the generic prefetch helpers' bounds checks and the fold's
//! bookkeeping; here a pass is one plain loop. Measured on a Xeon VM (480 MiB L3, 2
//! threads, `fusebox bench ops`, 16 MiB tensors in cache), % of copy bandwidth, see
//! `scaled_softmax_row` for the figures.
//!
//! Every value is the portable path's, bit for bit: the same operations in the same order
//! per lane (`exp_lane` with fused multiply-adds), the sum over the same 16 lanes folded
//! in the same order, the one-hot subtracted after the product, and a max, which does not
//! depend on the order it is folded in (inputs without NaN, as `simd::fold_max` assumes).

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use crate::cpu::simd::{exp_lane, fold_max, Isa, OWN_AHEAD};

/// Whether the kernels here run with the ISA in use.
pub fn has_kernel() -> bool {
    Isa::selected() == Isa::Avx512
}

/// `e[i] = e^(z[i] − m)` for every slot of `e` (as long as `z`), returning `Σ e[i]` as
/// `simd::exp_sub_sum_into` sums it; the lines of `e` [`OWN_AHEAD`] elements on are
/// prefetched for writing.
///
/// # Panics
/// When AVX-512 is not the ISA in use, or the lengths differ (kernel bugs).
pub fn exp_sub_sum(z: &[f32], e: &mut [MaybeUninit<f32>], m: f32) -> f32 {
    assert!(has_kernel(), "softmax_x86::exp_sub_sum without AVX-512");
    assert_eq!(z.len(), e.len(), "softmax_x86::exp_sub_sum: the row and its output differ in length");
    // SAFETY: AVX-512F is present (selected only when detected); the lengths match.
    unsafe { exp_sub_sum_avx512(z, e, m) }
}

/// `row ← s·row`, less `minus.1` at index `minus.0` (past the end: nothing), returning the
/// max of `next` (the next row, or empty: −∞), folded meanwhile; `next` is prefetched into
/// L1 [`OWN_AHEAD`] elements ahead of the loads.
///
/// # Panics
/// When AVX-512 is not the ISA in use, or a non-empty `next` differs from `row` in length.
pub fn scale_fold_max(row: &mut [f32], s: f32, minus: (usize, f32), next: &[f32]) -> f32 {
    assert!(has_kernel(), "softmax_x86::scale_fold_max without AVX-512");
    assert!(next.is_empty() || next.len() == row.len(), "softmax_x86::scale_fold_max: the next row's length");
    // SAFETY: AVX-512F is present; the lengths match.
    let m = unsafe { scale_fold_max_avx512(row, s, next) };
    let (at, sub) = minus;
    if let Some(v) = row.get_mut(at) {
        *v -= sub;
    }
    m
}

/// e^x per lane exactly as `simd::exp_lane::<true>`.
///
/// # Safety
/// AVX-512F must be present.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn exp16(x: __m512) -> __m512 {
    const C: [f32; 6] = [1.0, 0.999_999_7, 0.499_991_5, 0.166_676_36, 0.041_897_93, 0.008_290_313];
    let magic = _mm512_set1_ps(12_582_912.0);
    // `x < −88 ? −88 : x`: maxps returns its second operand when either is NaN.
    let x = _mm512_max_ps(_mm512_set1_ps(-88.0), x);
    let big = _mm512_fmadd_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E), magic);
    let n = _mm512_sub_ps(big, magic);
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693_145_75), x);
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-1.428_606_8e-6), r);
    let mut p = _mm512_set1_ps(C[5]);
    for &c in C[..5].iter().rev() {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let pow2 =
        _mm512_slli_epi32::<23>(_mm512_sub_epi32(_mm512_castps_si512(big), _mm512_set1_epi32(0x4B40_0000 - 127)));
    _mm512_mul_ps(p, _mm512_castsi512_ps(pow2))
}

/// See [`exp_sub_sum`].
///
/// # Safety
/// AVX-512F must be present; `z` and `e` of equal length.
#[target_feature(enable = "avx512f")]
unsafe fn exp_sub_sum_avx512(z: &[f32], e: &mut [MaybeUninit<f32>], m: f32) -> f32 {
    let n = z.len();
    let body = n / 16 * 16;
    let mut lanes = [0.0f32; 16];
    // SAFETY: i + 16 <= body <= n for every vector, in both slices; prefetches never fault.
    unsafe {
        let (zp, ep) = (z.as_ptr(), e.as_mut_ptr().cast::<f32>());
        let mm = _mm512_set1_ps(m);
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i < body {
            _mm_prefetch::<_MM_HINT_ET0>(ep.wrapping_add(i + OWN_AHEAD).cast());
            let w = exp16(_mm512_sub_ps(_mm512_loadu_ps(zp.add(i)), mm));
            acc = _mm512_add_ps(acc, w);
            _mm512_storeu_ps(ep.add(i), w);
            i += 16;
        }
        _mm512_storeu_ps(lanes.as_mut_ptr(), acc);
    }
    let mut tail = 0.0;
    for (v, o) in z[body..].iter().zip(&mut e[body..]) {
        tail += *o.write(exp_lane::<true>(*v - m));
    }
    lanes.iter().sum::<f32>() + tail
}

/// The scale and the fold of [`scale_fold_max`], without the one-hot.
///
/// # Safety
/// AVX-512F must be present; `next` empty or as long as `row`.
#[target_feature(enable = "avx512f")]
unsafe fn scale_fold_max_avx512(row: &mut [f32], s: f32, next: &[f32]) -> f32 {
    let n = row.len();
    let body = n / 16 * 16;
    let fold = !next.is_empty();
    let mut lanes = [f32::NEG_INFINITY; 16];
    // SAFETY: i + 16 <= body <= n for every vector, in `row` and (when read) `next`;
    // prefetches never fault.
    unsafe {
        let (rp, np) = (row.as_mut_ptr(), next.as_ptr());
        let factor = _mm512_set1_ps(s);
        let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i < body {
            _mm512_storeu_ps(rp.add(i), _mm512_mul_ps(_mm512_loadu_ps(rp.add(i)), factor));
            if fold {
                _mm_prefetch::<_MM_HINT_T0>(np.wrapping_add(i + OWN_AHEAD).cast());
                // `max(x, acc)` keeps `acc` unless x > acc, as `fold_max`.
                mx = _mm512_max_ps(_mm512_loadu_ps(np.add(i)), mx);
            }
            i += 16;
        }
        _mm512_storeu_ps(lanes.as_mut_ptr(), mx);
    }
    for v in &mut row[body..] {
        *v *= s;
    }
    if !fold {
        return f32::NEG_INFINITY;
    }
    let m = lanes.iter().fold(f32::NEG_INFINITY, |acc, &x| fold_max(acc, [x]));
    next[body..].iter().fold(m, |acc, &x| fold_max(acc, [x]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::simd;

    /// Bit for bit against the portable kernels, for lengths with and without a partial
    /// vector, arguments down to −∞, and the one-hot anywhere (or nowhere).
    #[test]
    fn match_the_portable_kernels() {
        if !has_kernel() {
            return;
        }
        for n in [0usize, 1, 15, 16, 17, 100, 1000, 4099] {
            let z: Vec<f32> =
                (0..n).map(|i| if i % 97 == 5 { f32::NEG_INFINITY } else { (i as f32 * 0.37).sin() * 60.0 }).collect();
            let m = z.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x)).max(0.0);
            let mut got = vec![MaybeUninit::new(f32::NAN); n];
            let mut want = vec![MaybeUninit::new(f32::NAN); n];
            let s_got = exp_sub_sum(&z, &mut got, m);
            let s_want = simd::exp_sub_sum_into(&z, &mut want, m, std::ptr::null(), &[]);
            assert_eq!(s_got.to_bits(), s_want.to_bits(), "sum, n {n}");
            // SAFETY: both kernels write every slot.
            let (got, want): (Vec<f32>, Vec<f32>) = unsafe {
                (got.iter().map(|v| v.assume_init()).collect(), want.iter().map(|v| v.assume_init()).collect())
            };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "exps, n {n}");
            let next: Vec<f32> = (0..n).map(|i| (i as f32 * 1.3).cos() * 5.0).collect();
            let want_max = next.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
            for at in [0, n / 2, n.saturating_sub(1), n + 3] {
                let mut row = got.clone();
                let mx = scale_fold_max(&mut row, 0.25, (at, 0.5), &next);
                let want_row: Vec<f32> =
                    got.iter().enumerate().map(|(j, &e)| if j == at { e * 0.25 - 0.5 } else { e * 0.25 }).collect();
                assert_eq!(bits(&row), bits(&want_row), "scaled, n {n} at {at}");
                assert_eq!(mx, want_max, "max, n {n}");
                assert_eq!(scale_fold_max(&mut row, 1.0, (usize::MAX, 0.0), &[]), f32::NEG_INFINITY);
            }
        }
    }
}
