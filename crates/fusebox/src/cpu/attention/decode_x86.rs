//! AVX-512 forms of the single-query kernels in `decode.rs`, for head dims of 64 and
//! 128 (the common ones); other dims, and other ISAs, keep the portable loops.
//!
//! * Scores: for a tile of 16 keys, each key's `q·k` is accumulated in one 16-lane
//!   vector per head, and the 16 vectors are then reduced together by a transposing
//!   tree (unpack, shuffle, 128-bit lane shuffles: about 3 instructions per score),
//!   instead of one full horizontal sum per key and head. The queries of 2 heads (d =
//!   128) or 4 (d = 64) stay in registers, so each K row is loaded once per pass for
//!   all of them. Only the real heads of a group are scored (no zero-padded ones).
//! * Accumulation: `o_g = α_g·o_g + Σ_j p_gj·v_j` with 64 output columns of every head
//!   in registers for the whole block of keys, each V row loaded once.
//! * Both prefetch the next block (see `decode.rs`).

use std::arch::x86_64::*;

use super::decode::{BLOCK_K, HEADS};
use crate::cpu::simd::{self, Isa};

/// Keys per score tile (one per lane of the reduced vector).
const TILE: usize = 16;

/// Whether the kernels here run for head dim `d` with the ISA in use.
pub(super) fn applies(d: usize) -> bool {
    (d == 64 || d == 128) && Isa::active() == Isa::Avx512
}

/// `s[g·BLOCK_K + j] = q[g]·k_j` for the first `heads` heads of `q` (`[HEADS, d]`) and
/// every row `k_j` of `k` (`[keys, d]`, keys ≤ BLOCK_K), prefetching `ahead` (the next
/// block's V rows) meanwhile. All heads are scored in one pass, each K row loaded once
/// for all of them; at d = 128 four heads' queries fill every register, so the compiler
/// keeps some in L1, which costs no more than a second pass over the K rows and keeps
/// the code simpler. Only where [`applies`]`(d)`.
pub(super) fn scores(k: &[f32], d: usize, q: &[f32], heads: usize, s: &mut [f32], ahead: &[f32]) {
    let keys = k.len() / d;
    assert!(applies(d) && heads <= HEADS && keys <= BLOCK_K && q.len() >= heads * d && s.len() >= HEADS * BLOCK_K);
    // SAFETY: AVX-512 is available (`applies`: the active ISA); the slices hold the heads' queries and
    // score rows (asserted above).
    unsafe {
        match (d, heads) {
            (64, 1) => heads_scores::<4, 1>(k, q, s, keys, ahead),
            (64, 2) => heads_scores::<4, 2>(k, q, s, keys, ahead),
            (64, 3) => heads_scores::<4, 3>(k, q, s, keys, ahead),
            (64, _) => heads_scores::<4, 4>(k, q, s, keys, ahead),
            (_, 1) => heads_scores::<8, 1>(k, q, s, keys, ahead),
            (_, 2) => heads_scores::<8, 2>(k, q, s, keys, ahead),
            (_, 3) => heads_scores::<8, 3>(k, q, s, keys, ahead),
            _ => heads_scores::<8, 4>(k, q, s, keys, ahead),
        }
    }
}

/// Part `i` of `n` (equal, whole lines) of `ahead`: the passes of a kernel over one block
/// (the column halves of the accumulation at d = 128) share the prefetch of the next
/// block, so that every pass overlaps some of it rather than the first all of it.
fn share(ahead: &[f32], i: usize, n: usize) -> &[f32] {
    let part = ahead.len().div_ceil(n.max(1)).next_multiple_of(16);
    let start = (i * part).min(ahead.len());
    &ahead[start..(start + part).min(ahead.len())]
}

/// Floats of `ahead` to prefetch per key row so that the whole of it is requested over
/// `keys` rows (whole lines).
fn prefetch_per_row(ahead: &[f32], keys: usize) -> usize {
    ahead.len().div_ceil(keys.max(1)).next_multiple_of(16)
}

/// `H` heads' scores against the first `keys` rows of `k` (rows of `16·D16`), their
/// queries (`q`: `[H, 16·D16]`) held in registers (some in L1 at H·D16 = 32), written to
/// `s[g·BLOCK_K + j]`; `ahead` (empty: none) is prefetched evenly over the rows.
///
/// # Safety
/// The CPU must support AVX-512 (F, BW, VL), AVX2 and FMA. The slices' lengths are
/// checked (a short one panics).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn heads_scores<const D16: usize, const H: usize>(
    k: &[f32],
    q: &[f32],
    s: &mut [f32],
    keys: usize,
    ahead: &[f32],
) {
    let d = 16 * D16;
    let (k, q, s) = (&k[..keys * d], &q[..H * d], &mut s[..(H - 1) * BLOCK_K + keys]);
    let per_row = prefetch_per_row(ahead, keys);
    let mut qv = [[_mm512_setzero_ps(); D16]; H];
    for (g, qg) in qv.iter_mut().enumerate() {
        for (c, v) in qg.iter_mut().enumerate() {
            // SAFETY: g·d + 16c + 16 ≤ H·d = q.len().
            *v = unsafe { _mm512_loadu_ps(q.as_ptr().add(g * d + 16 * c)) };
        }
    }
    let mut j0 = 0;
    while j0 < keys {
        let n = (keys - j0).min(TILE);
        // acc[g][j]: the 16 lane partials of head g's score with key j0 + j.
        let mut acc = [[_mm512_setzero_ps(); TILE]; H];
        for j in 0..n {
            simd::prefetch(ahead, (j0 + j) * per_row, per_row);
            let row = &k[(j0 + j) * d..(j0 + j + 1) * d];
            // Two chains per head, so consecutive FMAs do not wait on each other.
            let (mut a, mut b) = ([_mm512_setzero_ps(); H], [_mm512_setzero_ps(); H]);
            for c in (0..D16).step_by(2) {
                // SAFETY: 16·(c + 2) ≤ row.len() (D16 is even: 4 or 8).
                let (x0, x1) = unsafe {
                    (_mm512_loadu_ps(row.as_ptr().add(16 * c)), _mm512_loadu_ps(row.as_ptr().add(16 * c + 16)))
                };
                for g in 0..H {
                    a[g] = _mm512_fmadd_ps(x0, qv[g][c], a[g]);
                    b[g] = _mm512_fmadd_ps(x1, qv[g][c + 1], b[g]);
                }
            }
            for g in 0..H {
                acc[g][j] = _mm512_add_ps(a[g], b[g]);
            }
        }
        let mask: __mmask16 = if n == TILE { 0xFFFF } else { (1u16 << n) - 1 };
        for (g, acc) in acc.iter().enumerate() {
            let r = reduce16(acc);
            // SAFETY: lanes < n are stored, and s[g·BLOCK_K + j0 .. + n] is in bounds.
            unsafe { _mm512_mask_storeu_ps(s.as_mut_ptr().add(g * BLOCK_K + j0), mask, r) };
        }
        j0 += TILE;
    }
}

/// Lane j of the result is the sum of the 16 lanes of `v[j]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
fn reduce16(v: &[__m512; 16]) -> __m512 {
    // Pairs: per 128-bit lane, [a0+a2, b0+b2, a1+a3, b1+b3].
    let mut t = [_mm512_setzero_ps(); 8];
    for (i, t) in t.iter_mut().enumerate() {
        let (a, b) = (v[2 * i], v[2 * i + 1]);
        *t = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    }
    // Quads: per 128-bit lane L, the four vectors' partial sums over L.
    let mut u = [_mm512_setzero_ps(); 4];
    for (i, u) in u.iter_mut().enumerate() {
        let (a, b) = (t[2 * i], t[2 * i + 1]);
        *u = _mm512_add_ps(_mm512_shuffle_ps::<0x44>(a, b), _mm512_shuffle_ps::<0xEE>(a, b));
    }
    // Across the four 128-bit lanes: [u0 L0+L1, u0 L2+L3, u1 L0+L1, u1 L2+L3], likewise
    // u2, u3; then the halves are added so 128-bit lane k holds vectors 4k..4k+4.
    let w01 = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(u[0], u[1]),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(u[0], u[1]),
    );
    let w23 = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(u[2], u[3]),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(u[2], u[3]),
    );
    _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(w01, w23), _mm512_shuffle_f32x4::<0b11_01_11_01>(w01, w23))
}

/// `o[g] = α_g·o[g] + Σ_j p[g·BLOCK_K + j]·v_j` for the first `heads` heads (`o`
/// `[HEADS, d]`, `v` `[keys, d]`), prefetching `ahead` (the next block's K rows), shared
/// between the column passes over V (two at d = 128). Only where [`applies`]`(d)`.
pub(super) fn accumulate(
    o: &mut [f32],
    d: usize,
    p: &[f32],
    v: &[f32],
    alpha: &[f32; HEADS],
    heads: usize,
    ahead: &[f32],
) {
    let keys = v.len() / d;
    assert!(applies(d) && heads <= HEADS && keys <= BLOCK_K && o.len() >= heads * d && p.len() >= HEADS * BLOCK_K);
    // 16 accumulator registers: every head's output over 64 columns, so each V row is
    // loaded once for all heads (at d = 128 in two column passes).
    for col0 in (0..d).step_by(64) {
        let ahead = share(ahead, col0 / 64, d / 64);
        // SAFETY: AVX-512 is available (`applies`: the active ISA); the slices hold `heads` heads' rows and
        // scores (asserted above), and col0 + 64 ≤ d.
        unsafe {
            match heads {
                1 => heads_accumulate::<1>(o, p, v, alpha, d, col0, ahead),
                2 => heads_accumulate::<2>(o, p, v, alpha, d, col0, ahead),
                3 => heads_accumulate::<3>(o, p, v, alpha, d, col0, ahead),
                _ => heads_accumulate::<4>(o, p, v, alpha, d, col0, ahead),
            }
        }
    }
}

/// Columns `col0 .. col0 + 64` of [`accumulate`] for `H` heads, the `H × 4` output vectors
/// held in registers; `ahead` (empty: none) is prefetched evenly over V's rows.
///
/// # Safety
/// The CPU must support AVX-512 (F, BW, VL), AVX2 and FMA. The slices' lengths and
/// `col0 + 64 ≤ d` are checked (a violation panics).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn heads_accumulate<const H: usize>(
    o: &mut [f32],
    p: &[f32],
    v: &[f32],
    alpha: &[f32],
    d: usize,
    col0: usize,
    ahead: &[f32],
) {
    const C16: usize = 4;
    let keys = v.len() / d;
    let (o, p, v, alpha) = (&mut o[..H * d], &p[..(H - 1) * BLOCK_K + keys], &v[..keys * d], &alpha[..H]);
    assert!(col0 + 16 * C16 <= d);
    let per_row = prefetch_per_row(ahead, keys);
    let mut acc = [[_mm512_setzero_ps(); C16]; H];
    for (g, a) in acc.iter_mut().enumerate() {
        let s = _mm512_set1_ps(alpha[g]);
        for (c, a) in a.iter_mut().enumerate() {
            // SAFETY: g·d + col0 + 16c + 16 ≤ H·d = o.len().
            *a = _mm512_mul_ps(s, unsafe { _mm512_loadu_ps(o.as_ptr().add(g * d + col0 + 16 * c)) });
        }
    }
    for j in 0..keys {
        simd::prefetch(ahead, j * per_row, per_row);
        let mut w = [_mm512_setzero_ps(); H];
        for (g, w) in w.iter_mut().enumerate() {
            *w = _mm512_set1_ps(p[g * BLOCK_K + j]);
        }
        for c in 0..C16 {
            // SAFETY: j·d + col0 + 16c + 16 ≤ keys·d = v.len().
            let x = unsafe { _mm512_loadu_ps(v.as_ptr().add(j * d + col0 + 16 * c)) };
            for (a, w) in acc.iter_mut().zip(&w) {
                a[c] = _mm512_fmadd_ps(*w, x, a[c]);
            }
        }
    }
    for (g, a) in acc.iter().enumerate() {
        for (c, a) in a.iter().enumerate() {
            // SAFETY: as for the loads above.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(g * d + col0 + 16 * c), *a) };
        }
    }
}
