//! Packing f32 operands into the BF16 pair layouts of the microkernels: values rounded
//! to BF16 (round to nearest even) and paired along k, so that one 32-bit word holds
//! `(v[2p], v[2p+1])` — the low half the even k, the high half the odd k — the operand
//! shape of `vdpbf16ps`, which adds `a[2p]·b[2p] + a[2p+1]·b[2p+1]` into an f32 lane.
//!
//! - A (`m×k`) is packed in strips of [`MR`] rows: for each pair p, the MR rows' words.
//! - B (`k×n`) is packed in strips of [`NR`] columns: for each pair p, the NR columns'
//!   words.
//!
//! Rows and columns past the matrix's edge, and the odd k of an odd-length block, are
//! packed as zeros, so the kernels always run whole tiles.

use super::{View, MC, MR, NR};

/// `x` rounded to BF16 (round to nearest even; NaN stays NaN), as its 16 bits.
#[inline(always)]
pub fn bf16_bits(x: f32) -> u32 {
    let bits = x.to_bits();
    if x.is_nan() {
        // Quiet NaN with the sign kept (rounding could carry a NaN into infinity).
        return (bits >> 16) | 0x40;
    }
    (bits + 0x7fff + ((bits >> 16) & 1)) >> 16
}

/// `x` rounded to BF16 and back (the value the kernels multiply).
pub fn round_bf16(x: f32) -> f32 {
    f32::from_bits(bf16_bits(x) << 16)
}

/// The pair word of `(lo, hi)`: `lo` in the low half (even k), `hi` in the high half.
#[inline(always)]
fn pair(lo: f32, hi: f32) -> u32 {
    bf16_bits(lo) | (bf16_bits(hi) << 16)
}

/// Packs rows `i0..i0+mc` and k `k0..k0+kc` of A into strips of [`MR`] rows:
/// `out[(s·kp + p)·MR + i] = pair(a(i0+s·MR+i, k0+2p), a(.., k0+2p+1))`, kp = ⌈kc/2⌉.
pub fn pack_a(a: View<'_>, i0: usize, mc: usize, k0: usize, kc: usize, out: &mut [u32]) {
    let kp = kc.div_ceil(2);
    if a.rs == 1 && a.cs != 1 {
        // Columns of A contiguous (a transposed row-major matrix): for each pair, two
        // runs of up to MC rows interleaved at once, then each strip's MR words put in
        // place.
        let strips = mc.div_ceil(MR);
        let group = MC / MR;
        let mut words = [0u32; MC];
        for s0 in (0..strips).step_by(group) {
            let s1 = (s0 + group).min(strips);
            let (r0, rows) = (s0 * MR, (s1 * MR).min(mc) - s0 * MR);
            for p in 0..kp {
                let kk = k0 + 2 * p;
                let lo = &a.data[kk * a.cs + i0 + r0..][..rows];
                if kk + 1 < k0 + kc {
                    pack_row_pairs(lo, &a.data[(kk + 1) * a.cs + i0 + r0..][..rows], &mut words[..rows]);
                } else {
                    words[..rows].iter_mut().zip(lo).for_each(|(w, &l)| *w = bf16_bits(l));
                }
                words[rows..(s1 - s0) * MR].fill(0);
                for s in s0..s1 {
                    out[(s * kp + p) * MR..][..MR].copy_from_slice(&words[(s - s0) * MR..][..MR]);
                }
            }
        }
        return;
    }
    for s in 0..mc.div_ceil(MR) {
        let strip = &mut out[s * kp * MR..][..kp * MR];
        for i in 0..MR {
            let row = i0 + s * MR + i;
            if s * MR + i >= mc {
                (0..kp).for_each(|p| strip[p * MR + i] = 0);
                continue;
            }
            if a.cs == 1 {
                // The row's k values are contiguous: pairs of neighbours.
                pack_run_pairs(&a.data[row * a.rs + k0..][..kc], &mut strip[i..], MR);
                continue;
            }
            let at = |kk: usize| if kk < k0 + kc { a.data[row * a.rs + kk * a.cs] } else { 0.0 };
            for p in 0..kp {
                let kk = k0 + 2 * p;
                strip[p * MR + i] = pair(at(kk), at(kk + 1));
            }
        }
    }
}

/// Packs k `k0..k0+kc` and columns `j0..j0+nc` of B into strips of [`NR`] columns:
/// `out[(s·kp + p)·NR + j] = pair(b(k0+2p, j0+s·NR+j), b(k0+2p+1, ..))`.
pub fn pack_b(b: View<'_>, k0: usize, kc: usize, j0: usize, nc: usize, out: &mut [u32]) {
    let kp = kc.div_ceil(2);
    let strips = nc.div_ceil(NR);
    if b.cs == 1 {
        // Rows of B contiguous: two rows at a time, NR columns each.
        for s in 0..strips {
            let cols = NR.min(nc - s * NR);
            let strip = &mut out[s * kp * NR..][..kp * NR];
            for p in 0..kp {
                let kk = k0 + 2 * p;
                let lo = &b.data[kk * b.rs + j0 + s * NR..][..cols];
                let words = &mut strip[p * NR..][..NR];
                if kk + 1 < k0 + kc {
                    let hi = &b.data[(kk + 1) * b.rs + j0 + s * NR..][..cols];
                    pack_row_pairs(lo, hi, &mut words[..cols]);
                } else {
                    words[..cols].iter_mut().zip(lo).for_each(|(w, &l)| *w = bf16_bits(l));
                }
                words[cols..].fill(0);
            }
        }
        return;
    }
    for s in 0..strips {
        let strip = &mut out[s * kp * NR..][..kp * NR];
        let mut first = 0;
        if b.rs == 1 {
            first = pack_columns_transposed(b, k0, kc, j0 + s * NR, NR.min(nc - s * NR), strip);
        }
        for j in first..NR {
            let col = j0 + s * NR + j;
            if col >= j0 + nc {
                (0..kp).for_each(|p| strip[p * NR + j] = 0);
                continue;
            }
            if b.rs == 1 {
                // The column's k values are contiguous (B is a transposed row-major
                // matrix): pairs of neighbours.
                pack_run_pairs(&b.data[col * b.cs + k0..][..kc], &mut strip[j..], NR);
                continue;
            }
            let at = |kk: usize| if kk < k0 + kc { b.data[kk * b.rs + col * b.cs] } else { 0.0 };
            for p in 0..kp {
                let kk = k0 + 2 * p;
                strip[p * NR + j] = pair(at(kk), at(kk + 1));
            }
        }
    }
}

/// For B's columns contiguous along k (B a transposed row-major matrix): packs whole
/// groups of 16 of the strip's `cols` columns from `c0` with the vector conversion and a
/// transpose, so each pair's 16 words are one store; returns the columns packed (none
/// without AVX-512 BF16).
fn pack_columns_transposed(b: View<'_>, k0: usize, kc: usize, c0: usize, cols: usize, strip: &mut [u32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx512_bf16() {
        let kp = kc.div_ceil(2);
        // Pairs in whole runs of 32 values; the rest go one column at a time.
        let whole = kc / 32 * 16;
        let groups = cols / 16;
        for g in 0..groups {
            let j = 16 * g;
            let run = |t: usize, p: usize| &b.data[(c0 + j + t) * b.cs + k0 + 2 * p..];
            for p0 in (0..whole).step_by(16) {
                let runs = std::array::from_fn(|t| run(t, p0)[..32].try_into().expect("32 values"));
                assert!(strip.len() >= (p0 + 15) * NR + j + 16, "bgemm: a packed strip is short");
                // SAFETY: the CPU has AVX-512 BF16 (checked above); the 16 rows of 16
                // words at stride NR from p0·NR + j lie in `strip` (asserted).
                unsafe { super::kernel_x86::pack_runs_transposed(runs, strip[p0 * NR + j..].as_mut_ptr(), NR) };
            }
            if whole < kp {
                for t in 0..16 {
                    pack_run_pairs(&run(t, whole)[..kc - 2 * whole], &mut strip[whole * NR + j + t..], NR);
                }
            }
        }
        return 16 * groups;
    }
    0
}

/// `dst[p·stride] = pair(run[2p], run[2p+1])` for the ⌈len/2⌉ pairs of a contiguous
/// run of k values (an odd last value pairs with zero).
pub(super) fn pack_run_pairs(run: &[f32], dst: &mut [u32], stride: usize) {
    let mut p = 0;
    #[cfg(target_arch = "x86_64")]
    if super::has_avx512_bf16() {
        let mut words = [0u32; 16];
        while 2 * p + 32 <= run.len() {
            // SAFETY: the CPU has AVX-512 BF16 (checked above); 32 values are read.
            unsafe {
                super::kernel_x86::pack_neighbour_pairs(run[2 * p..][..32].try_into().expect("32 values"), &mut words)
            };
            for (t, &w) in words.iter().enumerate() {
                dst[(p + t) * stride] = w;
            }
            p += 16;
        }
    }
    while 2 * p + 1 < run.len() {
        dst[p * stride] = pair(run[2 * p], run[2 * p + 1]);
        p += 1;
    }
    if 2 * p < run.len() {
        dst[p * stride] = bf16_bits(run[2 * p]);
    }
}

/// `words[j] = pair(lo[j], hi[j])` (two rows of an operand interleaved into pair words).
fn pack_row_pairs(lo: &[f32], hi: &[f32], words: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx512_bf16() {
        // SAFETY: the CPU has AVX-512 BF16 (checked above).
        return unsafe { super::kernel_x86::pack_row_pairs(lo, hi, words) };
    }
    for ((w, &l), &h) in words.iter_mut().zip(lo).zip(hi) {
        *w = pair(l, h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_nearest_even() {
        // 1 + 2⁻⁸ is halfway between two BF16 values: it rounds to the even one, 1.
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8)), 1.0);
        // 1 + 3·2⁻⁸ is halfway too: it rounds up to the even 1 + 2⁻⁶.
        assert_eq!(round_bf16(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        assert_eq!(round_bf16(-2.5), -2.5);
        assert!(round_bf16(f32::NAN).is_nan());
        assert_eq!(round_bf16(f32::INFINITY), f32::INFINITY);
        assert_eq!(round_bf16(f32::MAX), f32::INFINITY);
        for x in [0.1f32, -3.7, 1e-3, 12345.678] {
            assert_eq!(round_bf16(x), half::bf16::from_f32(x).to_f32());
        }
    }

    /// Every layout's fast path writes the words of the definition: `pair(a(i, 2p),
    /// a(i, 2p+1))` per strip, zeros past the block's rows and k.
    #[test]
    fn pack_a_matches_its_definition_in_every_layout() {
        let (m, k) = (203, 75);
        let data: Vec<f32> = (0..m * k).map(|t| ((t * 7919 % 1000) as f32 - 500.0) * 1.2345e-3).collect();
        // Row-major, transposed (columns contiguous), and strided both ways.
        let views = [View::new(&data, k, 1), View::new(&data, 1, m), View::new(&data, k, 2)];
        for (v, (rows, cols)) in views.iter().zip([(m, k), (m, k), (m, k / 2)]) {
            for (i0, mc, k0, kc) in [(0, rows.min(96), 0, cols), (5, rows.min(96) - 5, 3, cols - 3), (0, 1, 0, 1)] {
                let kp = kc.div_ceil(2);
                let mut out = vec![u32::MAX; mc.next_multiple_of(MR) * kp];
                pack_a(*v, i0, mc, k0, kc, &mut out);
                let at = |i: usize, kk: usize| {
                    if i < mc && kk < kc {
                        bf16_bits(v.data[(i0 + i) * v.rs + (k0 + kk) * v.cs])
                    } else {
                        0
                    }
                };
                for s in 0..mc.div_ceil(MR) {
                    for p in 0..kp {
                        for i in 0..MR {
                            let want = at(s * MR + i, 2 * p) | (at(s * MR + i, 2 * p + 1) << 16);
                            assert_eq!(
                                out[(s * kp + p) * MR + i],
                                want,
                                "rs {} cs {} strip {s} pair {p} row {i}",
                                v.rs,
                                v.cs
                            );
                        }
                    }
                }
            }
        }
    }

    /// As for A: `pack_b` writes `pair(b(2p, j), b(2p+1, j))` per strip in every layout
    /// (the transposed one through whole groups of 16 columns and 32 k, and the rest).
    #[test]
    fn pack_b_matches_its_definition_in_every_layout() {
        let (k, n) = (101, 150);
        let data: Vec<f32> = (0..k * n).map(|t| ((t * 7919 % 1000) as f32 - 500.0) * 1.2345e-3).collect();
        let views = [View::new(&data, n, 1), View::new(&data, 1, k), View::new(&data, n, 2)];
        for (v, (rows, cols)) in views.iter().zip([(k, n), (k, n), (k, n / 2)]) {
            for (k0, kc, j0, nc) in [(0, rows, 0, cols), (3, rows - 3, 5, cols - 5), (0, 64, 0, 64), (0, 1, 0, 1)] {
                let kp = kc.div_ceil(2);
                let mut out = vec![u32::MAX; nc.next_multiple_of(NR) * kp];
                pack_b(*v, k0, kc, j0, nc, &mut out);
                let at = |kk: usize, j: usize| {
                    if kk < kc && j < nc {
                        bf16_bits(v.data[(k0 + kk) * v.rs + (j0 + j) * v.cs])
                    } else {
                        0
                    }
                };
                for s in 0..nc.div_ceil(NR) {
                    for p in 0..kp {
                        for j in 0..NR {
                            let want = at(2 * p, s * NR + j) | (at(2 * p + 1, s * NR + j) << 16);
                            assert_eq!(
                                out[(s * kp + p) * NR + j],
                                want,
                                "rs {} cs {} strip {s} pair {p} col {j}",
                                v.rs,
                                v.cs
                            );
                        }
                    }
                }
            }
        }
    }
}
