//! The two passes of a softmax row written in place (a cached F32 output), as AVX-512
//! loops with intrinsics: the exps into the output row with their sum, then the scale
//! with the next row's max folded alongside.
//!
//! The portable kernels (`simd::exp_sub_sum_into`, `softmax::scale_in_place_fold_max`)
//! compute the same values; these exist because the exp pass is bound by arithmetic
//! (an exp is 15 vector operations) and every instruction of loop overhead shows. The
//! portable loops carry the generic prefetch helpers' bounds checks and the fold's
//! bookkeeping; here a pass is one plain loop (docs/performance.md, "Softmax and
//! cross-entropy", has the measurements).
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
    Isa::active() == Isa::Avx512
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
    // SAFETY: AVX-512F is present (the active ISA is always available, see `simd`); the lengths match.
    unsafe { pipelined_row_avx512(z, e, m, None, &[]).0 }
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

/// Scaled softmax rows of `len` elements written in place, pipelined: the loop that
/// computes row `k`'s exps (into `out`, with their sum) also scales row `k − 1` (less its
/// one-hot) and folds row `k + 1`'s max, so the scale's and the fold's memory traffic
/// overlaps the exps' arithmetic instead of forming a pass of its own. `first_max` is
/// row 0's max; `minus(k)` gives row `k`'s one-hot (see `softmax::scaled_softmax_row`);
/// `done(k, sum, max)` is called for each row once its sum is known. Every slot of `out`
/// is written, with the values (bit for bit) of [`exp_sub_sum`] then [`scale_fold_max`].
///
/// For rows beyond L1 (cross-entropy's vocabulary rows), where the separate scale pass
/// read the row back from L2. The next row is prefetched into L1 [`OWN_AHEAD`] elements
/// ahead of the fold's loads: without it they stalled the loop (a third of its samples
/// on the fold's `vmaxps`) and the pipelining gained nothing. Rows of 4096 gain nothing
/// from the pipelining, so softmax keeps its two passes.
///
/// # Panics
/// When AVX-512 is not the ISA in use, or `z`, `out` and `len` disagree.
pub fn scaled_rows_pipelined(
    z: &[f32],
    out: &mut [MaybeUninit<f32>],
    len: usize,
    first_max: f32,
    scale: f32,
    minus: impl Fn(usize) -> (usize, f32),
    mut done: impl FnMut(usize, f32, f32),
) {
    assert!(has_kernel(), "softmax_x86::scaled_rows_pipelined without AVX-512");
    assert!(
        len > 0 && z.len() == out.len() && z.len().is_multiple_of(len),
        "softmax_x86::scaled_rows_pipelined: lengths"
    );
    let rows = z.len() / len;
    let mut m = first_max;
    // The row whose exps are written and which awaits its scale, with its factor.
    let mut pending: Option<(usize, f32)> = None;
    for k in 0..rows {
        let next = if k + 1 < rows { &z[(k + 1) * len..(k + 2) * len] } else { &[][..] };
        let (before, rest) = out.split_at_mut(k * len);
        let prev = pending.map(|(j, factor)| {
            // SAFETY: row j's slots were all written (its exps) in the previous step.
            let row = unsafe { &mut *(&mut before[j * len..(j + 1) * len] as *mut [MaybeUninit<f32>] as *mut [f32]) };
            (row, factor, minus(j))
        });
        // SAFETY: AVX-512F is present; every row is `len` long.
        let (s, next_max) =
            unsafe { pipelined_row_avx512(&z[k * len..(k + 1) * len], &mut rest[..len], m, prev, next) };
        done(k, s, m);
        pending = Some((k, scale / s));
        m = next_max;
    }
    if let Some((j, factor)) = pending {
        // SAFETY: as above, row j's exps were written.
        let row = unsafe { &mut *(&mut out[j * len..(j + 1) * len] as *mut [MaybeUninit<f32>] as *mut [f32]) };
        scale_fold_max(row, factor, minus(j), &[]);
    }
}

/// One step of [`scaled_rows_pipelined`]: the exps of `z` into `e` (their sum returned),
/// `prev ← factor·prev` less its one-hot, and the max of `next` (−∞ when empty). With
/// neither a `prev` nor a `next`, the exp pass of [`exp_sub_sum`].
///
/// # Safety
/// AVX-512F must be present; `e`, `prev`'s row and a non-empty `next` as long as `z`.
#[target_feature(enable = "avx512f")]
unsafe fn pipelined_row_avx512(
    z: &[f32],
    e: &mut [MaybeUninit<f32>],
    m: f32,
    prev: Option<(&mut [f32], f32, (usize, f32))>,
    next: &[f32],
) -> (f32, f32) {
    let n = z.len();
    let body = n / 16 * 16;
    let fold = !next.is_empty();
    let (mut sums, mut maxes) = ([0.0f32; 16], [f32::NEG_INFINITY; 16]);
    let (prev_ptr, factor) = match &prev {
        Some((row, factor, _)) => (row.as_ptr().cast_mut(), *factor),
        None => (std::ptr::null_mut(), 0.0),
    };
    // SAFETY: i + 16 <= body <= n for every vector, in `z`, `e`, the previous row and
    // (when read) `next`; prefetches never fault.
    unsafe {
        let (zp, ep, np) = (z.as_ptr(), e.as_mut_ptr().cast::<f32>(), next.as_ptr());
        let (mm, f) = (_mm512_set1_ps(m), _mm512_set1_ps(factor));
        let (mut acc, mut mx) = (_mm512_setzero_ps(), _mm512_set1_ps(f32::NEG_INFINITY));
        let mut i = 0;
        while i < body {
            _mm_prefetch::<_MM_HINT_ET0>(ep.wrapping_add(i + OWN_AHEAD).cast());
            let w = exp16(_mm512_sub_ps(_mm512_loadu_ps(zp.add(i)), mm));
            acc = _mm512_add_ps(acc, w);
            _mm512_storeu_ps(ep.add(i), w);
            if !prev_ptr.is_null() {
                _mm512_storeu_ps(prev_ptr.add(i), _mm512_mul_ps(_mm512_loadu_ps(prev_ptr.add(i)), f));
            }
            if fold {
                _mm_prefetch::<_MM_HINT_T0>(np.wrapping_add(i + OWN_AHEAD).cast());
                // `max(x, acc)` keeps `acc` unless x > acc, as `fold_max`.
                mx = _mm512_max_ps(_mm512_loadu_ps(np.add(i)), mx);
            }
            i += 16;
        }
        _mm512_storeu_ps(sums.as_mut_ptr(), acc);
        _mm512_storeu_ps(maxes.as_mut_ptr(), mx);
    }
    let mut tail = 0.0;
    for (v, o) in z[body..].iter().zip(&mut e[body..]) {
        tail += *o.write(exp_lane::<true>(*v - m));
    }
    if let Some((row, factor, (at, sub))) = prev {
        for v in &mut row[body..] {
            *v *= factor;
        }
        if let Some(v) = row.get_mut(at) {
            *v -= sub;
        }
    }
    let sum = sums.iter().sum::<f32>() + tail;
    (sum, if fold { max_of(&maxes, &next[body..]) } else { f32::NEG_INFINITY })
}

/// The max of a fold's 16 lanes and the elements past its last whole vector.
fn max_of(lanes: &[f32; 16], tail: &[f32]) -> f32 {
    lanes.iter().chain(tail).fold(f32::NEG_INFINITY, |acc, &x| fold_max(acc, [x]))
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
    if fold {
        max_of(&lanes, &next[body..])
    } else {
        f32::NEG_INFINITY
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::simd;

    /// The pipelined rows give the bits of the two passes row by row, sums and maxes
    /// included, for one row and several, with and without a partial vector.
    #[test]
    fn pipelined_rows_match_the_passes() {
        if !has_kernel() {
            return;
        }
        for (rows, len) in [(1usize, 100usize), (3, 16), (5, 1000), (4, 4099)] {
            let z: Vec<f32> = (0..rows * len).map(|i| (i as f32 * 0.731).sin() * 40.0).collect();
            let row_max = |k: usize| z[k * len..(k + 1) * len].iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
            let minus = |k: usize| ((k * 37) % (len + 2), 0.125);
            let mut got = vec![MaybeUninit::new(f32::NAN); rows * len];
            let mut seen = Vec::new();
            scaled_rows_pipelined(&z, &mut got, len, row_max(0), 0.5, minus, |k, s, m| seen.push((k, s, m)));
            for k in 0..rows {
                let mut want = vec![MaybeUninit::new(f32::NAN); len];
                let s = exp_sub_sum(&z[k * len..(k + 1) * len], &mut want, row_max(k));
                // SAFETY: `exp_sub_sum` writes every slot.
                let mut want: Vec<f32> = want.iter().map(|v| unsafe { v.assume_init() }).collect();
                scale_fold_max(&mut want, 0.5 / s, minus(k), &[]);
                assert_eq!(seen[k], (k, s, row_max(k)), "rows {rows} len {len} row {k}");
                for j in 0..len {
                    // SAFETY: every slot was written (NaN would fail the comparison).
                    let g = unsafe { got[k * len + j].assume_init() };
                    assert_eq!(g.to_bits(), want[j].to_bits(), "rows {rows} len {len} row {k} col {j}");
                }
            }
        }
    }

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
