//! The AVX-512 VNNI tile kernel of the integer prefill path (`prefill.rs` has the packed
//! forms and the arithmetic). A tile is `X` x rows times `G` groups of 16 W rows; per
//! 4 elements it loads one 64-byte weight vector per group (4 bytes of each of 16 rows)
//! and broadcasts 4 bytes of each x row, and one `vpdpbusd` (x's `q + 128` unsigned,
//! the weights signed) adds the 4 products of each of the 16 rows into its i32 lane: no
//! horizontal sums anywhere, each lane is one output. Per unit the sums are scaled by
//! the unit's integer scales (`vpmullo`), starting from the correction that takes the
//! `+128` off; per super-block the f32 steps of the twin follow.

use std::arch::x86_64::*;

use super::prefill::{Panel, XRows, GROUP};

/// Whether the kernel runs here: the active ISA is AVX-512 and the CPU has VNNI and F16C.
pub(super) fn runs() -> bool {
    super::int_vnni::vnni_kernels_run()
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
        match (lay.s, lay.u, lay.p) {
            (32, 32, 0) => by_tiles::<32, 32, 0>(panel, x, m, rows, dst, dst_row),
            (32, 32, 1) => by_tiles::<32, 32, 1>(panel, x, m, rows, dst, dst_row),
            (256, 32, 4) => by_tiles::<256, 32, 4>(panel, x, m, rows, dst, dst_row),
            (256, 16, 0) => by_tiles::<256, 16, 0>(panel, x, m, rows, dst, dst_row),
            _ => unreachable!("prefill::layout gives only these"),
        }
    }
}

/// Rows of the x tile.
const TILE_X: usize = 4;

/// The panel in tiles: pairs of groups (then a last single one), each against every
/// x row in runs of [`TILE_X`] (then the remainder), the groups' weights staying in
/// cache while x streams past.
///
/// # Safety
/// As [`panel_product`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn by_tiles<const S: usize, const U: usize, const P: usize>(
    panel: &Panel,
    x: &XRows,
    m: usize,
    rows: usize,
    dst: *mut f32,
    dst_row: usize,
) {
    let mut g0 = 0;
    while g0 < panel.groups {
        let gn = (panel.groups - g0).min(2);
        let valid = (rows - g0 * GROUP).min(gn * GROUP);
        let mut i0 = 0;
        while i0 < m {
            let left = m - i0;
            // SAFETY: the caller's contract; the tile lies inside the panel and x.
            unsafe {
                i0 += match (left, gn) {
                    (TILE_X.., 2) => tile::<S, U, P, TILE_X, 2>(panel, g0, x, i0, valid, dst, dst_row),
                    (TILE_X.., _) => tile::<S, U, P, TILE_X, 1>(panel, g0, x, i0, valid, dst, dst_row),
                    (3, 2) => tile::<S, U, P, 3, 2>(panel, g0, x, i0, valid, dst, dst_row),
                    (3, _) => tile::<S, U, P, 3, 1>(panel, g0, x, i0, valid, dst, dst_row),
                    (2, 2) => tile::<S, U, P, 2, 2>(panel, g0, x, i0, valid, dst, dst_row),
                    (2, _) => tile::<S, U, P, 2, 1>(panel, g0, x, i0, valid, dst, dst_row),
                    (_, 2) => tile::<S, U, P, 1, 2>(panel, g0, x, i0, valid, dst, dst_row),
                    _ => tile::<S, U, P, 1, 1>(panel, g0, x, i0, valid, dst, dst_row),
                };
            }
        }
        g0 += gn;
    }
}

/// x rows `i0..i0 + X` times groups `g0..g0 + G` (`valid` rows from group g0's first);
/// returns X.
///
/// # Safety
/// As [`panel_product`]; the rows and groups exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn tile<const S: usize, const U: usize, const P: usize, const X: usize, const G: usize>(
    panel: &Panel,
    g0: usize,
    x: &XRows,
    i0: usize,
    valid: usize,
    dst: *mut f32,
    dst_row: usize,
) -> usize {
    let (nsb, k) = (x.nsb, x.k);
    let units = S / U;
    let mut facc = [[_mm512_setzero_ps(); G]; X];
    // SAFETY (whole loop): every index is inside the panel's and x's buffers, sized by
    // `Panel::pack` and `XRows::new` for these groups, rows and super-blocks.
    unsafe {
        for sb in 0..nsb {
            let cell = |g: usize| (g0 + g) * nsb + sb;
            let mut tot = [[_mm512_setzero_si512(); G]; X];
            for g in 0..G {
                let c = _mm512_loadu_si512(panel.corr.as_ptr().add(cell(g) * GROUP) as *const _);
                for t in tot.iter_mut() {
                    t[g] = c;
                }
            }
            for u in 0..units {
                let mut acc = if U == S { tot } else { [[_mm512_setzero_si512(); G]; X] };
                let wbase: [*const u8; G] =
                    std::array::from_fn(|g| panel.w.as_ptr().add((cell(g) * S + u * U) * GROUP));
                let xbase: [*const u8; X] = std::array::from_fn(|i| x.q.as_ptr().add((i0 + i) * k + sb * S + u * U));
                for t in 0..U / 4 {
                    let wv: [__m512i; G] =
                        std::array::from_fn(|g| _mm512_loadu_si512(wbase[g].add(64 * t) as *const _));
                    for i in 0..X {
                        let xb = _mm512_set1_epi32((xbase[i].add(4 * t) as *const i32).read_unaligned());
                        for g in 0..G {
                            acc[i][g] = _mm512_dpbusd_epi32(acc[i][g], xb, wv[g]);
                        }
                    }
                }
                if U == S {
                    tot = acc;
                } else {
                    for g in 0..G {
                        let sc = _mm512_loadu_si512(panel.sc.as_ptr().add((cell(g) * units + u) * GROUP) as *const _);
                        for i in 0..X {
                            tot[i][g] = _mm512_add_epi32(tot[i][g], _mm512_mullo_epi32(acc[i][g], sc));
                        }
                    }
                }
            }
            for g in 0..G {
                let d = _mm512_loadu_ps(panel.d.as_ptr().add(cell(g) * GROUP));
                let e =
                    if P > 0 { _mm512_loadu_ps(panel.e.as_ptr().add(cell(g) * GROUP)) } else { _mm512_setzero_ps() };
                for i in 0..X {
                    let mut f = _mm512_mul_ps(d, _mm512_cvtepi32_ps(tot[i][g]));
                    if P > 0 {
                        let mut t2 = _mm512_setzero_si512();
                        for p in 0..P {
                            let qs = _mm512_set1_epi32(*x.qs.as_ptr().add(((i0 + i) * nsb + sb) * P + p));
                            let mn = _mm512_loadu_si512(panel.mn.as_ptr().add((cell(g) * P + p) * GROUP) as *const _);
                            t2 = _mm512_dpwssd_epi32(t2, qs, mn);
                        }
                        f = _mm512_fmadd_ps(e, _mm512_cvtepi32_ps(t2), f);
                    }
                    let dx = _mm512_set1_ps(*x.d.as_ptr().add((i0 + i) * nsb + sb));
                    facc[i][g] = _mm512_fmadd_ps(f, dx, facc[i][g]);
                }
            }
        }
        for g in 0..G {
            let lanes = valid.saturating_sub(g * GROUP).min(GROUP);
            let mask: __mmask16 = if lanes == GROUP { 0xFFFF } else { (1u16 << lanes) - 1 };
            for (i, f) in facc.iter().enumerate() {
                _mm512_mask_storeu_ps(dst.add((i0 + i) * dst_row + (g0 + g) * GROUP), mask, f[g]);
            }
        }
    }
    X
}
