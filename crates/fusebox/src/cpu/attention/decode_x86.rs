//! AVX-512 forms of the single-query kernels in `decode.rs`, for head dims of 64 and
//! 128 (the common ones); other dims, and other ISAs, keep the portable loops.
//!
//! * Scores: for a tile of 16 keys, each key's `q·k` is accumulated in one 16-lane
//!   vector per head, and the 16 vectors are then reduced together by a transposing
//!   tree (unpack, shuffle, 128-bit lane shuffles: about 3 instructions per score),
//!   instead of one full horizontal sum per key and head. Only the real heads of a
//!   group are scored (no zero-padded ones).
//! * Accumulation: `o_g = α_g·o_g + Σ_j p_gj·v_j` with every output row of the heads
//!   in registers for the whole block of keys, each V row loaded once.

use std::arch::x86_64::*;

use super::decode::{BLOCK_K, HEADS};
use crate::cpu::simd::Isa;

/// Keys per score tile (one per lane of the reduced vector).
const TILE: usize = 16;

/// Whether the kernels here run for head dim `d` with the ISA in use.
pub(super) fn applies(d: usize) -> bool {
    (d == 64 || d == 128) && Isa::selected() == Isa::Avx512
}

/// `s[g·BLOCK_K + j] = q[g]·k_j` for the first `heads` heads of `q` (`[HEADS, d]`) and
/// every row `k_j` of `k` (`[keys, d]`, keys ≤ BLOCK_K). Only where [`applies`]`(d)`.
pub(super) fn scores(k: &[f32], d: usize, q: &[f32], heads: usize, s: &mut [f32]) {
    let keys = k.len() / d;
    assert!(applies(d) && heads <= HEADS && keys <= BLOCK_K && q.len() >= heads * d && s.len() >= HEADS * BLOCK_K);
    // SAFETY: AVX-512 was detected (`applies`); the bounds were asserted above.
    unsafe {
        for g in 0..heads {
            let (qg, sg) = (&q[g * d..(g + 1) * d], &mut s[g * BLOCK_K..g * BLOCK_K + keys]);
            if d == 64 {
                head_scores::<4>(k, qg, sg);
            } else {
                head_scores::<8>(k, qg, sg);
            }
        }
    }
}

/// One head's scores against all rows of `k` (`[s.len(), 16·D16]`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn head_scores<const D16: usize>(k: &[f32], q: &[f32], s: &mut [f32]) {
    let d = 16 * D16;
    let keys = s.len();
    let mut qv = [_mm512_setzero_ps(); D16];
    for (c, v) in qv.iter_mut().enumerate() {
        // SAFETY: q holds 16·D16 values (it is one head's query).
        *v = unsafe { _mm512_loadu_ps(q[16 * c..16 * c + 16].as_ptr()) };
    }
    let mut j0 = 0;
    while j0 < keys {
        let n = (keys - j0).min(TILE);
        let mut acc = [_mm512_setzero_ps(); TILE];
        if n == TILE {
            for (j, a) in acc.iter_mut().enumerate() {
                *a = row_dot::<D16>(&k[(j0 + j) * d..(j0 + j + 1) * d], &qv);
            }
        } else {
            for (j, a) in acc.iter_mut().enumerate().take(n) {
                *a = row_dot::<D16>(&k[(j0 + j) * d..(j0 + j + 1) * d], &qv);
            }
        }
        let r = reduce16(&acc);
        let mask: __mmask16 = if n == TILE { 0xFFFF } else { (1u16 << n) - 1 };
        // SAFETY: lanes < n are stored, and s[j0..j0 + n] is in bounds.
        unsafe { _mm512_mask_storeu_ps(s.as_mut_ptr().add(j0), mask, r) };
        j0 += TILE;
    }
}

/// The 16 lanes of `Σ_c row[16c..16c + 16]·q[c]` (`row` has 16·D16 values).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
fn row_dot<const D16: usize>(row: &[f32], q: &[__m512; D16]) -> __m512 {
    let row = &row[..16 * D16];
    // Two chains, so consecutive FMAs do not wait on each other.
    let (mut a, mut b) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for c in (0..D16).step_by(2) {
        // SAFETY: 16·(c + 2) ≤ row.len() (D16 is even: 4 or 8).
        unsafe {
            a = _mm512_fmadd_ps(_mm512_loadu_ps(row.as_ptr().add(16 * c)), q[c], a);
            b = _mm512_fmadd_ps(_mm512_loadu_ps(row.as_ptr().add(16 * c + 16)), q[c + 1], b);
        }
    }
    _mm512_add_ps(a, b)
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
/// `[HEADS, d]`, `v` `[keys, d]`). Only where [`applies`]`(d)`.
pub(super) fn accumulate(o: &mut [f32], d: usize, p: &[f32], v: &[f32], alpha: &[f32; HEADS], heads: usize) {
    let keys = v.len() / d;
    assert!(applies(d) && heads <= HEADS && keys <= BLOCK_K && o.len() >= heads * d && p.len() >= HEADS * BLOCK_K);
    // Up to 16 accumulator registers: all heads at d = 64, two at a time at d = 128.
    let step = if d == 64 { HEADS } else { 2 };
    let mut g0 = 0;
    while g0 < heads {
        let h = step.min(heads - g0);
        let (o, p, alpha) = (&mut o[g0 * d..(g0 + h) * d], &p[g0 * BLOCK_K..], &alpha[g0..g0 + h]);
        // SAFETY: AVX-512 was detected (`applies`); the slices hold h heads' rows and
        // scores (asserted above).
        unsafe {
            match (d, h) {
                (64, 1) => heads_accumulate::<4, 1>(o, p, v, alpha),
                (64, 2) => heads_accumulate::<4, 2>(o, p, v, alpha),
                (64, 3) => heads_accumulate::<4, 3>(o, p, v, alpha),
                (64, _) => heads_accumulate::<4, 4>(o, p, v, alpha),
                (_, 1) => heads_accumulate::<8, 1>(o, p, v, alpha),
                _ => heads_accumulate::<8, 2>(o, p, v, alpha),
            }
        }
        g0 += h;
    }
}

/// `H` heads of [`accumulate`], the `H × D16` output vectors held in registers.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn heads_accumulate<const D16: usize, const H: usize>(o: &mut [f32], p: &[f32], v: &[f32], alpha: &[f32]) {
    let d = 16 * D16;
    let keys = v.len() / d;
    let (o, p, v, alpha) = (&mut o[..H * d], &p[..(H - 1) * BLOCK_K + keys], &v[..keys * d], &alpha[..H]);
    let mut acc = [[_mm512_setzero_ps(); D16]; H];
    for (g, a) in acc.iter_mut().enumerate() {
        let s = _mm512_set1_ps(alpha[g]);
        for (c, a) in a.iter_mut().enumerate() {
            // SAFETY: g·d + 16c + 16 ≤ H·d = o.len().
            *a = _mm512_mul_ps(s, unsafe { _mm512_loadu_ps(o.as_ptr().add(g * d + 16 * c)) });
        }
    }
    for j in 0..keys {
        let mut w = [_mm512_setzero_ps(); H];
        for (g, w) in w.iter_mut().enumerate() {
            *w = _mm512_set1_ps(p[g * BLOCK_K + j]);
        }
        for c in 0..D16 {
            // SAFETY: j·d + 16c + 16 ≤ keys·d = v.len().
            let x = unsafe { _mm512_loadu_ps(v.as_ptr().add(j * d + 16 * c)) };
            for (a, w) in acc.iter_mut().zip(&w) {
                a[c] = _mm512_fmadd_ps(*w, x, a[c]);
            }
        }
    }
    for (g, a) in acc.iter().enumerate() {
        for (c, a) in a.iter().enumerate() {
            // SAFETY: as for the loads above.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(g * d + 16 * c), *a) };
        }
    }
}
