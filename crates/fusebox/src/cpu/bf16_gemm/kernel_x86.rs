//! x86-64 microkernels of the BF16 GEMM: `vdpbf16ps` (AVX-512 BF16) and, for AVX-512
//! CPUs without it, the same products from BF16 widened to f32.

use std::arch::x86_64::*;

use super::{MR, NR};

/// Vectors of 16 f32 lanes across a tile's NR columns.
const NV: usize = NR / 16;

/// `tile = A_strip · B_strip` over `kp` pairs (see [`pack`](super::pack)), where `tile`
/// is MR rows of NR f32 with row stride `ldc`: stored when `!add`, added when `add`.
///
/// `vdpbf16ps` adds, in each f32 lane, `a_hi·b_hi` then `a_lo·b_lo` (products of two
/// BF16 values are exact in f32; each addition rounds to nearest even).
///
/// # Safety
/// The CPU must have AVX-512 F and BF16; `a` holds `kp·MR` words, `b` `kp·NR`, and
/// `tile` is valid for MR rows of NR values at stride `ldc`.
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn tile_dpbf16(kp: usize, a: *const u32, b: *const u32, tile: *mut f32, ldc: usize, add: bool) {
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        for p in 0..kp {
            let bp = b.add(p * NR);
            let bv: [__m512bh; NV] =
                std::array::from_fn(|v| std::mem::transmute(_mm512_loadu_si512(bp.add(16 * v).cast())));
            let ap = a.add(p * MR);
            for (i, row) in acc.iter_mut().enumerate() {
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*ap.add(i) as i32));
                for (v, lane) in row.iter_mut().enumerate() {
                    *lane = _mm512_dpbf16_ps(*lane, av, bv[v]);
                }
            }
        }
        store_tile(&acc, tile, ldc, add);
    }
}

/// As [`tile_dpbf16`] without the BF16 instructions: each pair word widened to two f32
/// (a BF16 value is the high 16 bits of its f32) and multiplied with FMA in
/// `vdpbf16ps`'s order, odd k then even k (the products are exact, so each FMA rounds
/// the same addition).
///
/// # Safety
/// As [`tile_dpbf16`], with AVX-512 F in place of BF16.
#[target_feature(enable = "avx512f")]
pub unsafe fn tile_widened(kp: usize, a: *const u32, b: *const u32, tile: *mut f32, ldc: usize, add: bool) {
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        let high = _mm512_set1_epi32(0xffff_0000u32 as i32);
        for p in 0..kp {
            let bp = b.add(p * NR);
            let words: [__m512i; NV] = std::array::from_fn(|v| _mm512_loadu_si512(bp.add(16 * v).cast()));
            let b_hi: [__m512; NV] = std::array::from_fn(|v| _mm512_castsi512_ps(_mm512_and_si512(words[v], high)));
            let b_lo: [__m512; NV] = std::array::from_fn(|v| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(words[v])));
            let ap = a.add(p * MR);
            for (i, row) in acc.iter_mut().enumerate() {
                let w = *ap.add(i);
                let a_hi = _mm512_set1_ps(f32::from_bits(w & 0xffff_0000));
                let a_lo = _mm512_set1_ps(f32::from_bits(w << 16));
                for (v, lane) in row.iter_mut().enumerate() {
                    *lane = _mm512_fmadd_ps(a_hi, b_hi[v], *lane);
                    *lane = _mm512_fmadd_ps(a_lo, b_lo[v], *lane);
                }
            }
        }
        store_tile(&acc, tile, ldc, add);
    }
}

#[inline(always)]
unsafe fn store_tile(acc: &[[__m512; NV]; MR], tile: *mut f32, ldc: usize, add: bool) {
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        for (i, row) in acc.iter().enumerate() {
            let out = tile.add(i * ldc);
            for (v, &lane) in row.iter().enumerate() {
                let dst = out.add(16 * v);
                let value = if add { _mm512_add_ps(_mm512_loadu_ps(dst), lane) } else { lane };
                _mm512_storeu_ps(dst, value);
            }
        }
    }
}

/// `words[j] = (bf16(lo[j]), bf16(hi[j]))` with `vcvtne2ps2bf16` (round to nearest
/// even, as [`bf16_bits`](super::pack::bf16_bits)) and a word interleave.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and BF16; the three slices have one length.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub unsafe fn pack_row_pairs(lo: &[f32], hi: &[f32], words: &mut [u32]) {
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        let n = words.len();
        let mut j = 0;
        while j + 16 <= n {
            let pairs = pair_words(lo.as_ptr().add(j), hi.as_ptr().add(j));
            _mm512_storeu_si512(words.as_mut_ptr().add(j).cast(), pairs);
            j += 16;
        }
        for t in j..n {
            words[t] = super::pack::bf16_bits(lo[t]) | (super::pack::bf16_bits(hi[t]) << 16);
        }
    }
}

/// `words[p] = (bf16(run[2p]), bf16(run[2p+1]))` for 16 pairs: `vcvtne2ps2bf16` keeps the
/// 32 values in order, which is already the pair layout.
///
/// # Safety
/// The CPU must have AVX-512 F and BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn pack_neighbour_pairs(run: &[f32; 32], words: &mut [u32; 16]) {
    // SAFETY: the arrays hold 32 values and 16 words; the caller vouches for the CPU.
    unsafe {
        let lo = _mm512_loadu_ps(run.as_ptr());
        let hi = _mm512_loadu_ps(run.as_ptr().add(16));
        let both: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
        _mm512_storeu_si512(words.as_mut_ptr().cast(), both);
    }
}

/// `out[p·ld + j] = (bf16(runs[j][2p]), bf16(runs[j][2p+1]))` for 16 runs of 32 values
/// (16 pairs each): each run converted with `vcvtne2ps2bf16` (its pair words in order),
/// then the 16 × 16 words transposed, so that each pair's 16 words are one store.
///
/// # Safety
/// The CPU must have AVX-512 F and BF16; `out` is valid for writes of 16 words at each
/// of `out`, `out + ld`, …, `out + 15·ld`.
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn pack_runs_transposed(runs: [&[f32; 32]; 16], out: *mut u32, ld: usize) {
    // SAFETY: the runs hold 32 values each; the caller vouches for the CPU and `out`.
    unsafe {
        let r: [__m512i; 16] = std::array::from_fn(|j| {
            let lo = _mm512_loadu_ps(runs[j].as_ptr());
            let hi = _mm512_loadu_ps(runs[j].as_ptr().add(16));
            std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo))
        });
        transpose_words(r, out, ld);
    }
}

/// `out[w·ld + j] = word w of r[j]`: a 16 × 16 matrix of 32-bit words transposed into
/// 16 stores.
///
/// # Safety
/// The CPU must have AVX-512 F; `out` is valid for writes of 16 words at each of `out`,
/// `out + ld`, …, `out + 15·ld`.
#[target_feature(enable = "avx512f")]
pub unsafe fn transpose_words(r: [__m512i; 16], out: *mut u32, ld: usize) {
    // SAFETY: the caller vouches for the CPU and `out`.
    unsafe {
        // Row j holds run j's words w_j0 … w_j15. Within 128-bit lanes: pairs of rows
        // interleaved by words, then by word pairs (4 rows × 4 words per lane) …
        let t: [__m512i; 16] = std::array::from_fn(|i| {
            let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
            if i % 2 == 0 {
                _mm512_unpacklo_epi32(a, b)
            } else {
                _mm512_unpackhi_epi32(a, b)
            }
        });
        let u: [__m512i; 16] = std::array::from_fn(|i| {
            let (g, q) = (i / 4 * 4, i % 4);
            let (a, b) = (t[g + q / 2], t[g + 2 + q / 2]);
            if q % 2 == 0 {
                _mm512_unpacklo_epi64(a, b)
            } else {
                _mm512_unpackhi_epi64(a, b)
            }
        });
        // … so u[4g + q] holds, in lane L, word 4L + q of rows 4g … 4g+3. Then lanes:
        // v[q] (q < 4) = words q, 8+q of rows 0–7; v[4+q] = words 4+q, 12+q; likewise
        // v[8..16] for rows 8–15.
        let v: [__m512i; 16] = std::array::from_fn(|i| {
            let (half, rest) = (i / 8, i % 8);
            let (a, b) = (u[half * 8 + rest % 4], u[half * 8 + 4 + rest % 4]);
            if rest < 4 {
                _mm512_shuffle_i32x4::<0x88>(a, b)
            } else {
                _mm512_shuffle_i32x4::<0xdd>(a, b)
            }
        });
        // Word w of all 16 rows: w < 8 from v[w] and v[8 + w] (even lanes), else from
        // v[w − 8] and v[w] (odd lanes).
        for w in 0..16 {
            let col = if w < 8 {
                _mm512_shuffle_i32x4::<0x88>(v[w], v[8 + w])
            } else {
                _mm512_shuffle_i32x4::<0xdd>(v[w - 8], v[w])
            };
            _mm512_storeu_si512(out.add(w * ld).cast(), col);
        }
    }
}

/// The pair words of 16 rows at one pair of k: `pair(lo[t], hi[t])` for t < 16, where
/// `lo` and `hi` hold the 16 rows' values at the pair's even and odd k.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and BF16; `lo` and `hi` are valid for 16 reads each.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub unsafe fn pair_words(lo: *const f32, hi: *const f32) -> __m512i {
    // SAFETY: the caller vouches for the CPU and the pointers.
    unsafe {
        // cvtne2ps(hi, lo) holds lo's 16 values in words 0..16 and hi's in 16..32; the
        // permutation interleaves them: word 2j ← lo[j], word 2j+1 ← hi[j].
        let order = _mm512_set_epi16(
            31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17,
            1, 16, 0,
        );
        let both: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(hi), _mm512_loadu_ps(lo)));
        _mm512_permutexvar_epi16(order, both)
    }
}
