//! The AVX2 tile kernel of the integer prefill path (`prefill.rs` has the packed forms
//! and the arithmetic), for CPUs without AVX-512 VNNI or backends capped at AVX2. The
//! packed panel is the VNNI kernel's: a 64-byte weight vector (4 bytes of each of 16 W
//! rows) is two 256-bit halves of 8 rows, and i32 lane l of a half holds row l's sum,
//! so there are no horizontal sums and each output is one lane from start to end.
//!
//! A tile is `X` x rows times one group of 16 W rows. What `vpdpbusd` does in one
//! instruction takes `vpmaddubsw` (unsigned × signed bytes, adjacent pairs summed to
//! i16, saturating) and `vpmaddwd` (i16 pairs times i16, summed to i32), so the integer
//! sums are the twin's only if no i16 ever saturates or wraps:
//!
//! * **Narrow weights**, |w| ≤ B ≤ 32 (all formats but Q8_0 and IQ4_NL; B is
//!   `prefill::max_abs_weight`: Q4_0 8, Q4_1 and Q4_K 15, Q5_0 16, MXFP4 12, Q5_K 31,
//!   Q6_K 32): x is read as `q + 128` ∈ [1, 255] (q ∈ [−127, 127], `int.rs` clamps
//!   it), so one `vpmaddubsw` lane is at most 2·255·B ≤ 16,320 in magnitude and the
//!   i16 sum of two steps' lanes (`STEPS` = 2, [`steps`]) at most 32,640 < 32,767.
//!   Then `vpmaddwd` by the unit's integer scale (1 where the format has none;
//!   |sc| ≤ 128) widens to i32. As in the VNNI kernel the sums start from the
//!   correction `−128·Σ_u sc_u·Σ w`, which takes the `+128` off: the i32 total is
//!   `T1 = Σ_u sc_u·Σ_{j∈u} w_j·q_j` exactly.
//! * **Wide weights** (Q8_0 −128..127, IQ4_NL −127..113; `STEPS` = 0): the sign trick,
//!   `vpmaddubsw(|w|, sign(q, w))` = `Σ w·q` per pair with |w| ≤ 128 unsigned and
//!   |sign(q, w)| = |q| ≤ 127 (no q is −128, so the negation cannot wrap): a lane is at
//!   most 2·128·127 = 32,512 < 32,767. Each step widens at once (`vpmaddwd` by 1), the
//!   sums start from 0 and are `T1` directly (these formats have one unit, `sc = 1`).
//!
//! Either way the i32 total is the same integer as the twin's and the VNNI kernel's
//! (integer sums are exact in any order; `prefill.rs` bounds them below 2^29), and the
//! f32 steps per super-block are the twin's, in its order, so the bits agree.

use std::arch::x86_64::*;

use super::prefill::{Panel, XRows, GROUP};
use crate::cpu::simd::Isa;

/// Whether the kernel runs here: the active ISA has AVX2 and FMA (AVX2 or AVX-512).
pub(super) fn runs() -> bool {
    matches!(Isa::active(), Isa::Avx2 | Isa::Avx512)
}

/// Steps of 4 elements whose `vpmaddubsw` lanes are summed in i16, for weights with
/// |w| ≤ `max_abs_w`: 2 where that cannot saturate (|w| ≤ 32, see the module docs),
/// else 0 (the sign trick). More steps would fit the 4-bit formats, but their weights
/// and sums no longer stay in AVX2's 16 registers for a tile of 4 x rows.
pub(super) fn steps(max_abs_w: i32) -> usize {
    if max_abs_w <= 32 {
        2
    } else {
        0
    }
}

/// Every x row (`m`) times the packed panel (`rows` valid W rows) into `dst`, whose
/// element `i·dst_row + r` takes x row i times W row r.
///
/// # Safety
/// [`runs`]; `dst` valid for those writes; `x` and `panel` packed for one format and `k`.
pub(super) unsafe fn panel_product(panel: &Panel, x: &XRows, m: usize, rows: usize, dst: *mut f32, dst_row: usize) {
    let lay = x.lay;
    // SAFETY: the caller's contract.
    unsafe {
        match (lay.s, lay.u, lay.p, steps(panel.max_abs_w)) {
            (32, 32, 0, 0) => by_tiles::<32, 32, 0, 0>(panel, x, m, rows, dst, dst_row),
            (32, 32, 0, 2) => by_tiles::<32, 32, 0, 2>(panel, x, m, rows, dst, dst_row),
            (32, 32, 1, 2) => by_tiles::<32, 32, 1, 2>(panel, x, m, rows, dst, dst_row),
            (256, 32, 4, 2) => by_tiles::<256, 32, 4, 2>(panel, x, m, rows, dst, dst_row),
            (256, 16, 0, 2) => by_tiles::<256, 16, 0, 2>(panel, x, m, rows, dst, dst_row),
            (s, u, p, st) => unreachable!("no AVX2 tile for s {s}, u {u}, p {p}, {st} steps (prefill::layout)"),
        }
    }
}

/// Rows of the x tile: 4 rows × 2 halves of i32 accumulators leave registers for two
/// steps' weights, the scales and the broadcast x.
const TILE_X: usize = 4;

/// The panel in tiles: each group against every x row in runs of [`TILE_X`] (then the
/// remainder), the group's weights staying in L1 while x streams past.
///
/// # Safety
/// As [`panel_product`].
#[target_feature(enable = "avx2,fma")]
unsafe fn by_tiles<const S: usize, const U: usize, const P: usize, const STEPS: usize>(
    panel: &Panel,
    x: &XRows,
    m: usize,
    rows: usize,
    dst: *mut f32,
    dst_row: usize,
) {
    for g in 0..panel.groups {
        let valid = (rows - g * GROUP).min(GROUP);
        let mut i0 = 0;
        while i0 < m {
            // SAFETY: the caller's contract; the tile lies inside the panel and x.
            unsafe {
                i0 += match m - i0 {
                    TILE_X.. => tile::<S, U, P, STEPS, TILE_X>(panel, g, x, i0, valid, dst, dst_row),
                    3 => tile::<S, U, P, STEPS, 3>(panel, g, x, i0, valid, dst, dst_row),
                    2 => tile::<S, U, P, STEPS, 2>(panel, g, x, i0, valid, dst, dst_row),
                    _ => tile::<S, U, P, STEPS, 1>(panel, g, x, i0, valid, dst, dst_row),
                };
            }
        }
    }
}

/// The i16 pair `(v, v)` in each i32 lane of `v` (|v| < 2^15): the multiplier
/// `vpmaddwd` needs to scale both halves of a lane by v.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn both_halves(v: __m256i) -> __m256i {
    _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32::<16>(v))
}

/// x rows `i0..i0 + X` times group `g` (`valid` of its rows); returns X.
///
/// # Safety
/// As [`panel_product`]; the rows and the group exist.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const S: usize, const U: usize, const P: usize, const STEPS: usize, const X: usize>(
    panel: &Panel,
    g: usize,
    x: &XRows,
    i0: usize,
    valid: usize,
    dst: *mut f32,
    dst_row: usize,
) -> usize {
    let (nsb, k) = (x.nsb, x.k);
    let units = S / U;
    let ones = _mm256_set1_epi16(1);
    let flip = _mm256_set1_epi8(-128);
    let mut facc = [[_mm256_setzero_ps(); 2]; X];
    // SAFETY (whole loop): every index is inside the panel's and x's buffers, sized by
    // `Panel::pack` and `XRows::new` for this group, these rows and super-blocks.
    unsafe {
        for sb in 0..nsb {
            let cell = g * nsb + sb;
            let mut tot = [[_mm256_setzero_si256(); 2]; X];
            if STEPS > 0 {
                let corr = panel.corr.as_ptr().add(cell * GROUP);
                let c = [_mm256_loadu_si256(corr as *const _), _mm256_loadu_si256(corr.add(8) as *const _)];
                tot = [c; X];
            }
            for u in 0..units {
                let scale = if U == S {
                    [ones; 2]
                } else {
                    let sc = panel.sc.as_ptr().add((cell * units + u) * GROUP);
                    [
                        both_halves(_mm256_loadu_si256(sc as *const _)),
                        both_halves(_mm256_loadu_si256(sc.add(8) as *const _)),
                    ]
                };
                let wbase = panel.w.as_ptr().add((cell * S + u * U) * GROUP);
                let xbase: [*const u8; X] = std::array::from_fn(|i| x.q.as_ptr().add((i0 + i) * k + sb * S + u * U));
                let xat = |i: usize, t: usize| _mm256_set1_epi32((xbase[i].add(4 * t) as *const i32).read_unaligned());
                let wat = |t: usize, h: usize| _mm256_loadu_si256(wbase.add(64 * t + 32 * h) as *const _);
                if STEPS > 0 {
                    // STEPS steps per i16 sum (bound in the module docs), their
                    // weights held in registers for all X rows.
                    for t in (0..U / 4).step_by(STEPS) {
                        let w: [[__m256i; 2]; STEPS] = std::array::from_fn(|j| [wat(t + j, 0), wat(t + j, 1)]);
                        for (i, tot) in tot.iter_mut().enumerate() {
                            let xs: [__m256i; STEPS] = std::array::from_fn(|j| xat(i, t + j));
                            for h in 0..2 {
                                let mut s = _mm256_setzero_si256();
                                for (xj, wj) in xs.iter().zip(&w) {
                                    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(*xj, wj[h]));
                                }
                                tot[h] = _mm256_add_epi32(tot[h], _mm256_madd_epi16(s, scale[h]));
                            }
                        }
                    }
                } else {
                    for t in 0..U / 4 {
                        let w = [wat(t, 0), wat(t, 1)];
                        let aw = [_mm256_abs_epi8(w[0]), _mm256_abs_epi8(w[1])];
                        for (i, tot) in tot.iter_mut().enumerate() {
                            // q itself, signed: the stored byte is q + 128.
                            let q = _mm256_xor_si256(xat(i, t), flip);
                            for h in 0..2 {
                                let s = _mm256_maddubs_epi16(aw[h], _mm256_sign_epi8(q, w[h]));
                                tot[h] = _mm256_add_epi32(tot[h], _mm256_madd_epi16(s, scale[h]));
                            }
                        }
                    }
                }
            }
            for h in 0..2 {
                let lanes = cell * GROUP + 8 * h;
                let d = _mm256_loadu_ps(panel.d.as_ptr().add(lanes));
                let e = if P > 0 { _mm256_loadu_ps(panel.e.as_ptr().add(lanes)) } else { _mm256_setzero_ps() };
                for i in 0..X {
                    let mut f = _mm256_mul_ps(d, _mm256_cvtepi32_ps(tot[i][h]));
                    if P > 0 {
                        let mut t2 = _mm256_setzero_si256();
                        for p in 0..P {
                            let qs = _mm256_set1_epi32(*x.qs.as_ptr().add(((i0 + i) * nsb + sb) * P + p));
                            let mn =
                                _mm256_loadu_si256(panel.mn.as_ptr().add((cell * P + p) * GROUP + 8 * h) as *const _);
                            t2 = _mm256_add_epi32(t2, _mm256_madd_epi16(qs, mn));
                        }
                        f = _mm256_fmadd_ps(e, _mm256_cvtepi32_ps(t2), f);
                    }
                    let dx = _mm256_set1_ps(*x.d.as_ptr().add((i0 + i) * nsb + sb));
                    facc[i][h] = _mm256_fmadd_ps(f, dx, facc[i][h]);
                }
            }
        }
        for h in 0..2 {
            let lanes = valid.saturating_sub(8 * h).min(8) as i32;
            let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            for (i, f) in facc.iter().enumerate() {
                let at = dst.add((i0 + i) * dst_row + g * GROUP + 8 * h);
                if lanes == 8 {
                    _mm256_storeu_ps(at, f[h]);
                } else if lanes > 0 {
                    _mm256_maskstore_ps(at, mask, f[h]);
                }
            }
        }
    }
    X
}
