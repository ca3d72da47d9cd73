//! Hand-written x86-64 kernels for the fused row dots of `quantized_matmul` with one
//! x row (token-by-token decoding): `out[r] = Σ_j x[j]·W[r, j]` with W in Q8_0, Q4_0,
//! Q4_1, Q5_0, IQ4_NL or MXFP4 blocks (AVX-512 and AVX2; Q4_K on AVX-512), and x in f32
//! — the activations are not quantized, so the results stay as close to f32 as the
//! portable path. The Q8_0/Q4_0/Q4_1 kernels sum in their own order (within f32
//! rounding of the portable path); the Q5_0, Q4_K and table (IQ4_NL, MXFP4) kernels keep
//! the portable path's 16-lane accumulators (in 16-lane or pairs of 8-lane vectors) and
//! perform the same fused operations in the same order, so their results are
//! bit-identical to it. Q6_K has no kernel here: the portable loop, compiled per ISA by
//! `multiversion!`, vectorizes it well (hand-written AVX2 forms of the same arithmetic
//! were slower).
//!
//! The portable loops in `fused_dot.rs` leave the compiler to vectorize nibble unpacking and
//! per-block f16 scales, which it does poorly (a scalar f16 conversion and several
//! shuffles per block). Here each block costs a handful of vector instructions:
//!
//! * the nibbles (Q4) or bytes (Q8) widen to 32-bit lanes (`vpmovzxbd` / `vpmovsxbd`);
//!   on AVX-512 a 4-bit value becomes a float through `vpermps` on a 16-entry table
//!   (the permute reads only the low 4 bits of each index), so the low nibble needs no
//!   mask and no conversion — for IQ4_NL and MXFP4 the table holds their levels; on
//!   AVX2 their levels come from a 16-byte `vpshufb` table and widen from i8;
//! * `t = x·q` over the block in one or two vectors, then `acc += d·t` with `d`
//!   broadcast from one `vcvtph2ps` of the block header, which also yields Q4_1's `m`:
//!   `Σ_blocks m·Σx` is accumulated in lane 1 of a 4-lane vector (lane 0 gathers
//!   `d·Σx`, which is ignored).
//!
//! Per row the 16 (AVX-512) or 8 (AVX2) lanes are reduced once at the end. Rows are
//! independent and summed in a fixed order, so results do not depend on threads.
//!
//! With several x rows (sequences batched by a server) the `*_rows_multi` kernels
//! convert each Q8_0/Q4_0/Q4_1 block once for up to 4 x rows and then run, per x row,
//! the one-row kernel's operations in its order: a row's result has the same bits alone
//! or in a batch.

use std::arch::x86_64::*;

use super::fields::{e8m0_half, Iq4Nl, LevelTable, Mxfp4, TableScale};
use super::{QK, QK_K};
use crate::cpu::simd::Isa;
use crate::dtype::DType;

/// `out[r] = Σ_j x[j]·W[r, j]` for the `out.len()` rows of `w` (whole rows of `dtype`
/// blocks, `x.len()` elements each); `xsum32[b]` is the sum of `x[32b..32b + 32]`.
/// Returns false (doing nothing) when no kernel here fits the format and the ISA in use.
pub(super) fn fused_rows(dtype: DType, w: &[u8], x: &[f32], xsum32: &[f32], out: &mut [f32]) -> bool {
    let nb = x.len() / QK;
    let (block_bytes, block_elems) = match dtype {
        DType::Q8_0 => (34, QK),
        DType::Q4_0 => (18, QK),
        DType::Q4_1 => (20, QK),
        DType::Q5_0 => (22, QK),
        DType::Q4K => (144, QK_K),
        DType::IQ4NL => (Iq4Nl::BYTES, QK),
        DType::MXFP4 => (Mxfp4::BYTES, QK),
        _ => return false,
    };
    // The kernels read exactly these bounds; anything else goes to the portable path.
    if !x.len().is_multiple_of(block_elems)
        || xsum32.len() < nb
        || w.len() != out.len() * (x.len() / block_elems) * block_bytes
    {
        return false;
    }
    let isa = Isa::active();
    // SAFETY: each kernel runs only where its ISA is available (`Isa::active` is never a
    // level the CPU lacks, see `simd`; f16c is checked where the AVX2 kernels need it), and the
    // bounds were checked above: `w` holds `out.len()` rows of `nb` blocks, `x` and
    // `xsum32` `nb` blocks' worth.
    unsafe {
        match (isa, dtype) {
            (Isa::Avx512, DType::Q4_1) => avx512::q4_rows::<true>(w, x, xsum32, out),
            (Isa::Avx512, DType::Q4_0) => avx512::q4_rows::<false>(w, x, xsum32, out),
            (Isa::Avx512, DType::Q8_0) => avx512::q8_0_rows(w, x, out),
            (Isa::Avx2, DType::Q4_1) if has_f16c() => avx2::q4_rows::<true>(w, x, xsum32, out),
            (Isa::Avx2, DType::Q4_0) if has_f16c() => avx2::q4_rows::<false>(w, x, xsum32, out),
            (Isa::Avx2, DType::Q8_0) if has_f16c() => avx2::q8_0_rows(w, x, out),
            (Isa::Avx512, DType::Q5_0) => avx512::q5_0_rows(w, x, out),
            (Isa::Avx512, DType::Q4K) => avx512::q4_k_rows(w, x, xsum32, out),
            (Isa::Avx2, DType::Q5_0) if has_f16c() => avx2::q5_0_rows(w, x, out),
            (Isa::Avx512, DType::IQ4NL) => avx512::table_rows::<Iq4Nl>(w, x, out),
            (Isa::Avx512, DType::MXFP4) => avx512::table_rows::<Mxfp4>(w, x, out),
            (Isa::Avx2, DType::IQ4NL) if has_f16c() => avx2::table_rows::<Iq4Nl>(w, x, out),
            (Isa::Avx2, DType::MXFP4) if has_f16c() => avx2::table_rows::<Mxfp4>(w, x, out),
            _ => return false,
        }
    }
    true
}

/// `out[r·m + i] = Σ_j x_i[j]·W[r, j]` for the `out.len() / m` rows of `w` and the `m`
/// rows `x_i` of `xs` (`k` elements each, `xsum32` their sums over each run of 32,
/// `k / 32` per row): each block of W is decoded once for all the x rows, and each x
/// row's arithmetic is, operation for operation, that of the one-row kernel
/// [`fused_rows`] runs for this format and ISA, so `out[r·m + i]` has the bits
/// `fused_rows` gives for x_i alone. Returns false (doing nothing) where no such kernel
/// fits the format and ISA in use.
pub(super) fn fused_rows_multi(
    dtype: DType,
    w: &[u8],
    xs: &[f32],
    k: usize,
    xsum32: &[f32],
    m: usize,
    out: &mut [f32],
) -> bool {
    let block_bytes = match dtype {
        DType::Q8_0 => 34,
        DType::Q4_0 => 18,
        DType::Q4_1 => 20,
        _ => return false,
    };
    if m == 0 || k == 0 || !k.is_multiple_of(QK) || !out.len().is_multiple_of(m) {
        return false;
    }
    let (rows, nb) = (out.len() / m, k / QK);
    if xs.len() != m * k || xsum32.len() != m * nb || w.len() != rows * nb * block_bytes {
        return false;
    }
    let isa = Isa::active();
    if !matches!(isa, Isa::Avx512 | Isa::Avx2) || !has_f16c() {
        return false;
    }
    // Groups of up to 4 x rows share each decoded block.
    let mut i = 0;
    while i < m {
        let g = (m - i).min(4);
        let (x, s) = (&xs[i * k..(i + g) * k], &xsum32[i * nb..(i + g) * nb]);
        // SAFETY: the ISA is available (`Isa::active` never names a level the CPU lacks;
        // F16C checked above); `w` holds `rows` rows of `nb` blocks, `x` g rows of
        // k = 32·nb elements and `s` g rows of nb sums, and the kernels write
        // out[r·m + i + 0..g] for r < rows, inside `out` (rows·m long).
        unsafe {
            match g {
                4 => group::<4>(isa, dtype, w, x, s, nb, out, m, i),
                3 => group::<3>(isa, dtype, w, x, s, nb, out, m, i),
                2 => group::<2>(isa, dtype, w, x, s, nb, out, m, i),
                _ => group::<1>(isa, dtype, w, x, s, nb, out, m, i),
            }
        }
        i += g;
    }
    true
}

/// The kernel of [`fused_rows_multi`] for a group of `R` x rows, `isa` AVX-512 or AVX2,
/// `dtype` Q4_1, Q4_0 or Q8_0.
///
/// # Safety
/// As the kernels: `isa` (with FMA and F16C) available, and the bounds of
/// `fused_rows_multi` for the group's x rows `x` and sums `s`.
#[allow(clippy::too_many_arguments)]
unsafe fn group<const R: usize>(
    isa: Isa,
    dtype: DType,
    w: &[u8],
    x: &[f32],
    s: &[f32],
    nb: usize,
    out: &mut [f32],
    m: usize,
    col: usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        match (isa, dtype) {
            (Isa::Avx512, DType::Q4_1) => avx512::q4_rows_multi::<true, R>(w, x, s, nb, out, m, col),
            (Isa::Avx512, DType::Q4_0) => avx512::q4_rows_multi::<false, R>(w, x, s, nb, out, m, col),
            (Isa::Avx512, _) => avx512::q8_0_rows_multi::<R>(w, x, nb, out, m, col),
            (_, DType::Q4_1) => avx2::q4_rows_multi::<true, R>(w, x, s, nb, out, m, col),
            (_, DType::Q4_0) => avx2::q4_rows_multi::<false, R>(w, x, s, nb, out, m, col),
            (_, _) => avx2::q8_0_rows_multi::<R>(w, x, nb, out, m, col),
        }
    }
}

fn has_f16c() -> bool {
    std::arch::is_x86_feature_detected!("f16c")
}

/// Hints the cache lines of `w[start..start + len]` (clamped to `w`) towards L1.
#[inline(always)]
pub(super) fn prefetch_range(w: &[u8], start: usize, len: usize) {
    let end = (start + len).min(w.len());
    let mut at = start;
    while at < end {
        // SAFETY: a prefetch is only a hint; the address lies inside `w`.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().add(at) as *const i8) };
        at += 64;
    }
}

/// The scale of the IQ4_NL / MXFP4 block at `blk` (`T::scale` with the f16 read by F16C).
///
/// # Safety
/// `blk` must point to 2 readable bytes; the CPU must support F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn table_scale<T: LevelTable>(blk: *const u8) -> f32 {
    // SAFETY: the caller guarantees 2 readable bytes at `blk`.
    unsafe {
        match T::SCALE {
            TableScale::F16 => {
                let bits = u16::from_le_bytes([*blk, *blk.add(1)]);
                _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
            }
            TableScale::E8m0Half => e8m0_half(*blk),
        }
    }
}

/// How many rows ahead of the one being computed the prefetches run: far enough that a
/// short row's lines (SmolLM2's 360-byte Q4_1 rows) arrive from DRAM in time.
pub(super) const PREFETCH_ROWS: usize = 6;

/// `xsum32` of `R` ≤ 4 x rows (`nb` sums each) regrouped by block: `[b·4 + i]` is x row
/// i's sum over block b, lanes of rows past R zero.
fn sums_by_block<const R: usize>(xsum32: &[f32], nb: usize) -> Vec<f32> {
    let mut sums = vec![0.0f32; 4 * nb];
    for (i, row) in xsum32.chunks_exact(nb).take(R.min(4)).enumerate() {
        for (b, &s) in row.iter().enumerate() {
            sums[4 * b + i] = s;
        }
    }
    sums
}

mod avx512 {
    use super::*;

    /// The block header `d` (and, for Q4_1, `m` in lane 1) as f32 lanes, from the 8
    /// bytes at `p` (lanes 2 and 3 hold whatever follows the header and are ignored).
    ///
    /// # Safety
    /// `p` must point to 8 readable bytes, and the CPU must support AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn header(p: *const u8) -> __m128 {
        // SAFETY: the caller guarantees 8 readable bytes at `p` (every block has ≥ 18).
        unsafe { _mm_cvtph_ps(_mm_loadl_epi64(p as *const __m128i)) }
    }

    /// Q4_1 (`OFFSET`) or Q4_0 rows: per block `d·Σ x·q + m·Σx`, where Q4_0 is Q4_1
    /// with `m = −8d`.
    ///
    /// # Safety
    /// The CPU must support AVX-512 (F, BW, VL), AVX2, FMA and F16C; `x.len()` must be a
    /// multiple of 32, `xsum32` must hold at least `x.len() / 32` sums, and `w` exactly
    /// `out.len()` rows of `x.len() / 32` blocks (20 bytes each for Q4_1, 18 for Q4_0).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn q4_rows<const OFFSET: bool>(w: &[u8], x: &[f32], xsum32: &[f32], out: &mut [f32]) {
        let nb = x.len() / QK;
        let (bb, qs_at) = if OFFSET { (20, 4) } else { (18, 2) };
        let row_bytes = nb * bb;
        let table = _mm512_setr_ps(0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12., 13., 14., 15.);
        let xp = x.as_ptr();
        for (r, o) in out.iter_mut().enumerate() {
            prefetch_range(w, (r + PREFETCH_ROWS) * row_bytes, row_bytes);
            let row = w.as_ptr().wrapping_add(r * row_bytes);
            let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            let (mut off0, mut off1) = (_mm_setzero_ps(), _mm_setzero_ps());
            // One block: `acc += d·(x·q)`; lane 1 of `off` += m·Σx (Q4_1), lane 0 += d·Σx
            // (Q4_0's offset is −8 of it).
            let block = |b: usize, acc: &mut __m512, off: &mut __m128| {
                // SAFETY: block b < nb of row r lies inside `w` (row_bytes·out.len() =
                // w.len()), and x and xsum32 hold block b.
                unsafe {
                    let blk = row.add(b * bb);
                    let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.add(qs_at) as *const __m128i));
                    let lo = _mm512_permutexvar_ps(q, table);
                    let hi = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(q), table);
                    let t = _mm512_fmadd_ps(
                        _mm512_loadu_ps(xp.add(QK * b + 16)),
                        hi,
                        _mm512_mul_ps(_mm512_loadu_ps(xp.add(QK * b)), lo),
                    );
                    let dm = header(blk);
                    *acc = _mm512_fmadd_ps(_mm512_broadcastss_ps(dm), t, *acc);
                    *off = _mm_fmadd_ps(dm, _mm_set1_ps(*xsum32.get_unchecked(b)), *off);
                }
            };
            let mut b = 0;
            while b + 2 <= nb {
                block(b, &mut acc0, &mut off0);
                block(b + 1, &mut acc1, &mut off1);
                b += 2;
            }
            if b < nb {
                block(b, &mut acc0, &mut off0);
            }
            let off = _mm_add_ps(off0, off1);
            let offset =
                if OFFSET { f32::from_bits(_mm_extract_ps::<1>(off) as u32) } else { -8.0 * _mm_cvtss_f32(off) };
            *o = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + offset;
        }
    }

    /// Q8_0 rows: per block `d·Σ x·q`.
    ///
    /// # Safety
    /// The CPU must support AVX-512 (F, BW, VL), AVX2, FMA and F16C; `x.len()` must be a
    /// multiple of 32 and `w` hold exactly `out.len()` rows of `x.len() / 32` blocks of 34
    /// bytes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn q8_0_rows(w: &[u8], x: &[f32], out: &mut [f32]) {
        let nb = x.len() / QK;
        let row_bytes = nb * 34;
        let xp = x.as_ptr();
        for (r, o) in out.iter_mut().enumerate() {
            prefetch_range(w, (r + PREFETCH_ROWS) * row_bytes, row_bytes);
            let row = w.as_ptr().wrapping_add(r * row_bytes);
            let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            // One block: `acc += d·(x·q)`.
            let block = |b: usize, acc: &mut __m512| {
                // SAFETY: as in `q4_rows`: block b of row r and x's block b are in bounds.
                unsafe {
                    let blk = row.add(b * 34);
                    let q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(2) as *const __m128i));
                    let q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(18) as *const __m128i));
                    let t = _mm512_fmadd_ps(
                        _mm512_loadu_ps(xp.add(QK * b + 16)),
                        _mm512_cvtepi32_ps(q1),
                        _mm512_mul_ps(_mm512_loadu_ps(xp.add(QK * b)), _mm512_cvtepi32_ps(q0)),
                    );
                    *acc = _mm512_fmadd_ps(_mm512_broadcastss_ps(header(blk)), t, *acc);
                }
            };
            let mut b = 0;
            while b + 2 <= nb {
                block(b, &mut acc0);
                block(b + 1, &mut acc1);
                b += 2;
            }
            if b < nb {
                block(b, &mut acc0);
            }
            *o = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
        }
    }

    /// `q4_rows` for `R` ≤ 4 x rows at once (rows `0..R` of `x`, sums in
    /// `xsum32[i·nb..]`): each block's nibbles become floats and its header is converted
    /// once, then every x row does exactly `q4_rows`' operations on them, in the same order
    /// (even blocks into its first accumulators, odd ones into its second), so row r's
    /// result for x row i, written to `out[r·m + col + i]`, has the bits `q4_rows` gives
    /// for that x row alone. The offset term `m·Σx` (Q4_0: `d·Σx`), which `q4_rows` keeps
    /// in one lane of a 4-lane vector, is kept for all R rows in one vector (lane i: x row
    /// i), one fused multiply-add per block instead of R.
    ///
    /// # Safety
    /// The CPU must support AVX-512 (F, BW, VL), AVX2, FMA and F16C; `x` must hold `R`
    /// rows of `32·nb` elements, `xsum32` `R·nb` sums, `w` whole rows of `nb` blocks (20
    /// bytes each for Q4_1, 18 for Q4_0), and `out` at least `(w rows − 1)·m + col + R`
    /// elements.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn q4_rows_multi<const OFFSET: bool, const R: usize>(
        w: &[u8],
        x: &[f32],
        xsum32: &[f32],
        nb: usize,
        out: &mut [f32],
        m: usize,
        col: usize,
    ) {
        let (bb, qs_at) = if OFFSET { (20, 4) } else { (18, 2) };
        let row_bytes = nb * bb;
        let rows = w.len() / row_bytes;
        let table = _mm512_setr_ps(0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12., 13., 14., 15.);
        let xp = x.as_ptr();
        let sums = sums_by_block::<R>(xsum32, nb);
        for r in 0..rows {
            prefetch_range(w, (r + PREFETCH_ROWS) * row_bytes, row_bytes);
            let row = w.as_ptr().wrapping_add(r * row_bytes);
            // `q4_rows`' acc0/acc1 per x row; its off0/off1 lane for every x row.
            let (mut acc0, mut acc1) = ([_mm512_setzero_ps(); R], [_mm512_setzero_ps(); R]);
            let (mut off0, mut off1) = (_mm_setzero_ps(), _mm_setzero_ps());
            let block = |b: usize, acc: &mut [__m512; R], off: &mut __m128| {
                // SAFETY: block b of row r lies inside `w`; x row i's block b lies inside
                // `x` (the caller's contract) and `sums` holds 4 sums per block.
                unsafe {
                    let blk = row.add(b * bb);
                    let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.add(qs_at) as *const __m128i));
                    let lo = _mm512_permutexvar_ps(q, table);
                    let hi = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(q), table);
                    let dm = header(blk);
                    let d = _mm512_broadcastss_ps(dm);
                    for (i, a) in acc.iter_mut().enumerate() {
                        let xb = xp.add(i * nb * QK + QK * b);
                        let t =
                            _mm512_fmadd_ps(_mm512_loadu_ps(xb.add(16)), hi, _mm512_mul_ps(_mm512_loadu_ps(xb), lo));
                        *a = _mm512_fmadd_ps(d, t, *a);
                    }
                    // Lane i: `q4_rows`' lane 1 (m·Σx, Q4_1) or lane 0 (d·Σx, Q4_0) for x row i.
                    let scale = if OFFSET { _mm_permute_ps::<0b01_01_01_01>(dm) } else { _mm_broadcastss_ps(dm) };
                    *off = _mm_fmadd_ps(scale, _mm_loadu_ps(sums.as_ptr().add(4 * b)), *off);
                }
            };
            let mut b = 0;
            while b + 2 <= nb {
                block(b, &mut acc0, &mut off0);
                block(b + 1, &mut acc1, &mut off1);
                b += 2;
            }
            if b < nb {
                block(b, &mut acc0, &mut off0);
            }
            let mut offsets = [0f32; 4];
            // SAFETY: `offsets` holds the 4 lanes stored.
            unsafe { _mm_storeu_ps(offsets.as_mut_ptr(), _mm_add_ps(off0, off1)) };
            for i in 0..R {
                let offset = if OFFSET { offsets[i] } else { -8.0 * offsets[i] };
                let v = _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i])) + offset;
                // SAFETY: r·m + col + i < out.len() (the caller's contract).
                unsafe { *out.get_unchecked_mut(r * m + col + i) = v };
            }
        }
    }

    /// `q8_0_rows` for `R` x rows at once, as `q4_rows_multi`: each block's bytes and
    /// header are converted once, every x row does `q8_0_rows`' operations on them in
    /// its order.
    ///
    /// # Safety
    /// The CPU must support AVX-512 (F, BW, VL), AVX2, FMA and F16C; `x` must hold `R`
    /// rows of `32·nb` elements, `w` whole rows of `nb` blocks of 34 bytes, and `out` at
    /// least `(w rows − 1)·m + col + R` elements.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn q8_0_rows_multi<const R: usize>(
        w: &[u8],
        x: &[f32],
        nb: usize,
        out: &mut [f32],
        m: usize,
        col: usize,
    ) {
        let row_bytes = nb * 34;
        let rows = w.len() / row_bytes;
        let xp = x.as_ptr();
        for r in 0..rows {
            prefetch_range(w, (r + PREFETCH_ROWS) * row_bytes, row_bytes);
            let row = w.as_ptr().wrapping_add(r * row_bytes);
            let (mut acc0, mut acc1) = ([_mm512_setzero_ps(); R], [_mm512_setzero_ps(); R]);
            let block = |b: usize, acc: &mut [__m512; R]| {
                // SAFETY: as in `q4_rows_multi`.
                unsafe {
                    let blk = row.add(b * 34);
                    let q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(2) as *const __m128i)));
                    let q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(18) as *const __m128i)));
                    let d = _mm512_broadcastss_ps(header(blk));
                    for (i, a) in acc.iter_mut().enumerate() {
                        let xb = xp.add(i * nb * QK + QK * b);
                        let t =
                            _mm512_fmadd_ps(_mm512_loadu_ps(xb.add(16)), q1, _mm512_mul_ps(_mm512_loadu_ps(xb), q0));
                        *a = _mm512_fmadd_ps(d, t, *a);
                    }
                }
            };
            let mut b = 0;
            while b + 2 <= nb {
                block(b, &mut acc0);
                block(b + 1, &mut acc1);
                b += 2;
            }
            if b < nb {
                block(b, &mut acc0);
            }
            for i in 0..R {
                let v = _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i]));
                // SAFETY: r·m + col + i < out.len() (the caller's contract).
                unsafe { *out.get_unchecked_mut(r * m + col + i) = v };
            }
        }
    }

    /// Q5_0 rows, lane for lane the portable `fused_dot::q5_0_row`: its 16 lanes in one
    /// vector, lane l of a block takes elements l and l + 16,
    /// `acc = d·(x_l·q_l + x_{l+16}·q_{l+16}) + acc` with both products fused as there,
    /// and the same tree reduction (halves added down to one lane), so the results have
    /// its bits.
    ///
    /// # Safety
    /// The CPU must support AVX-512 (F, BW, VL), AVX2, FMA and F16C; `x.len()` must be a
    /// multiple of 32 and `w` hold exactly `out.len()` rows of `x.len() / 32` blocks of 22
    /// bytes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn q5_0_rows(w: &[u8], x: &[f32], out: &mut [f32]) {
        let nb = x.len() / QK;
        let row_bytes = nb * 22;
        // The 32 levels q − 16 as f32, for `vpermt2ps` (index bits 0..5: the low nibble
        // and the fifth bit), in two 16-entry halves.
        let levels_lo =
            _mm512_setr_ps(-16., -15., -14., -13., -12., -11., -10., -9., -8., -7., -6., -5., -4., -3., -2., -1.);
        let levels_hi = _mm512_setr_ps(0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12., 13., 14., 15.);
        let (low4, sixteen) = (_mm512_set1_epi32(0x0F), _mm512_set1_epi32(16));
        let xp = x.as_ptr();
        for (r, o) in out.iter_mut().enumerate() {
            prefetch_range(w, (r + PREFETCH_ROWS) * row_bytes, row_bytes);
            let row = w.as_ptr().wrapping_add(r * row_bytes);
            let mut acc = _mm512_setzero_ps();
            for b in 0..nb {
                // SAFETY: block b of row r lies inside `w` (22 bytes, of which `header`
                // reads 8 and the nibbles are bytes 6..22), and x holds block b.
                unsafe {
                    let blk = row.add(b * 22);
                    let d = _mm512_broadcastss_ps(header(blk));
                    // Bit j of qh is the fifth bit of element j: 0..16 low nibbles, 16..32 high.
                    let qh = u32::from_le_bytes([*blk.add(2), *blk.add(3), *blk.add(4), *blk.add(5)]);
                    let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.add(6) as *const __m128i));
                    let idx_lo =
                        _mm512_mask_add_epi32(_mm512_and_si512(q, low4), qh as u16, _mm512_and_si512(q, low4), sixteen);
                    let q_hi = _mm512_srli_epi32::<4>(q);
                    let idx_hi = _mm512_mask_add_epi32(q_hi, (qh >> 16) as u16, q_hi, sixteen);
                    let lo = _mm512_permutex2var_ps(levels_lo, idx_lo, levels_hi);
                    let hi = _mm512_permutex2var_ps(levels_lo, idx_hi, levels_hi);
                    let xl = _mm512_loadu_ps(xp.add(QK * b));
                    let xh = _mm512_loadu_ps(xp.add(QK * b + 16));
                    let t = _mm512_fmadd_ps(xl, lo, _mm512_mul_ps(xh, hi));
                    acc = _mm512_fmadd_ps(d, t, acc);
                }
            }
            *o = hsum16(acc);
        }
    }

    /// Q4_K rows, operation for operation the portable `fused_dot::q4_k_row`: its four
    /// 16-lane accumulators (pair parity × half) in four vectors, the same scalar scales
    /// and offsets, `acc = d2·(xh·q_hi) + (d1·(xl·q_lo) + acc)` fused as there, and the same
    /// reduction (the four added pairwise, then halves down to one lane), so the results
    /// have its bits. A run of 16 quant bytes becomes its two sets of 16 levels through
    /// a 16-entry table (`vpermps` reads an index's low 4 bits) rather than by masking,
    /// widening and converting each.
    ///
    /// # Safety
    /// The CPU must support AVX-512 (F, BW, VL), AVX2, FMA and F16C; `x.len()` must be a
    /// multiple of 256, `xsum32` hold at least `x.len() / 32` sums, and `w` exactly
    /// `out.len()` rows of `x.len() / 256` blocks of 144 bytes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn q4_k_rows(w: &[u8], x: &[f32], xsum32: &[f32], out: &mut [f32]) {
        let nsb = x.len() / QK_K;
        let row_bytes = nsb * 144;
        let table = _mm512_setr_ps(0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12., 13., 14., 15.);
        for (r, o) in out.iter_mut().enumerate() {
            prefetch_range(w, (r + PREFETCH_ROWS) * row_bytes, row_bytes);
            let row = &w[r * row_bytes..(r + 1) * row_bytes];
            let mut acc = [_mm512_setzero_ps(); 4];
            let mut offsets = 0.0f32;
            for (sb, b) in row.chunks_exact(144).enumerate() {
                let (d, dmin) = (super::super::fields::f16_at(b, 0), super::super::fields::f16_at(b, 2));
                let (scales, sums) = (&b[4..16], &xsum32[8 * sb..8 * sb + 8]);
                for pair in 0..4 {
                    let (sc1, m1) = super::super::scale_min_k4(2 * pair, scales);
                    let (sc2, m2) = super::super::scale_min_k4(2 * pair + 1, scales);
                    let (d1, d2) = (d * f32::from(sc1), d * f32::from(sc2));
                    offsets += dmin * (f32::from(m1) * sums[2 * pair] + f32::from(m2) * sums[2 * pair + 1]);
                    let (d1, d2) = (_mm512_set1_ps(d1), _mm512_set1_ps(d2));
                    for half in 0..2 {
                        // SAFETY: bytes 16 + 32·pair + 16·half .. +16 lie inside the block,
                        // and x holds super-block sb's 256 elements.
                        unsafe {
                            let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                                b.as_ptr().add(16 + 32 * pair + 16 * half) as *const __m128i
                            ));
                            let lo = _mm512_permutexvar_ps(q, table);
                            let hi = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(q), table);
                            let xs = x.as_ptr().add(QK_K * sb + 64 * pair + 16 * half);
                            let (xl, xh) = (_mm512_loadu_ps(xs), _mm512_loadu_ps(xs.add(32)));
                            let a = &mut acc[2 * (pair % 2) + half];
                            let t = _mm512_fmadd_ps(d1, _mm512_mul_ps(xl, lo), *a);
                            *a = _mm512_fmadd_ps(d2, _mm512_mul_ps(xh, hi), t);
                        }
                    }
                }
            }
            let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
            *o = hsum16(sum) - offsets;
        }
    }

    /// IQ4_NL / MXFP4 rows, operation for operation the portable `fused_dot::table_row`:
    /// its two 16-lane accumulators (even and odd blocks) in two vectors, lane l of a
    /// block taking elements l and l + 16, `acc = scale·(x_l·v_l + x_{l+16}·v_{l+16}) +
    /// acc` fused as there, and the same reduction, so the results have its bits. The 16
    /// nibbles of each half become their levels by `vpermps` on the table in f32.
    ///
    /// # Safety
    /// The CPU must support AVX-512 (F, BW, VL), AVX2, FMA and F16C; `x.len()` must be a
    /// multiple of 32 and `w` hold exactly `out.len()` rows of `x.len() / 32` blocks of
    /// `T::BYTES` bytes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn table_rows<T: LevelTable>(w: &[u8], x: &[f32], out: &mut [f32]) {
        let nb = x.len() / QK;
        let row_bytes = nb * T::BYTES;
        let levels = T::VALUES.map(f32::from);
        // SAFETY: `levels` holds 16 f32.
        let table = unsafe { _mm512_loadu_ps(levels.as_ptr()) };
        let xp = x.as_ptr();
        for (r, o) in out.iter_mut().enumerate() {
            prefetch_range(w, (r + PREFETCH_ROWS) * row_bytes, row_bytes);
            let row = w.as_ptr().wrapping_add(r * row_bytes);
            let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            let block = |b: usize, acc: &mut __m512| {
                // SAFETY: block b of row r lies inside `w` (its 16 index bytes start at
                // `QS_AT`, its scale at 0), and x holds block b.
                unsafe {
                    let blk = row.add(b * T::BYTES);
                    let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.add(T::QS_AT) as *const __m128i));
                    let lo = _mm512_permutexvar_ps(q, table);
                    let hi = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(q), table);
                    let xl = _mm512_loadu_ps(xp.add(QK * b));
                    let xh = _mm512_loadu_ps(xp.add(QK * b + 16));
                    let t = _mm512_fmadd_ps(xl, lo, _mm512_mul_ps(xh, hi));
                    *acc = _mm512_fmadd_ps(_mm512_set1_ps(table_scale::<T>(blk)), t, *acc);
                }
            };
            let mut b = 0;
            while b + 2 <= nb {
                block(b, &mut acc0);
                block(b + 1, &mut acc1);
                b += 2;
            }
            if b < nb {
                block(b, &mut acc0);
            }
            *o = hsum16(_mm512_add_ps(acc0, acc1));
        }
    }

    /// The 16 lanes summed as the portable `fused_dot::hsum16`: lanes l + 8 onto l, then
    /// 4, 2, 1.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    fn hsum16(v: __m512) -> f32 {
        let halves = _mm256_add_ps(
            _mm512_castps512_ps256(v),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
        );
        let s = _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps::<1>(halves));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

mod avx2 {
    use super::*;

    /// As `avx512::header`.
    ///
    /// # Safety
    /// `p` must point to 8 readable bytes, and the CPU must support AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn header(p: *const u8) -> __m128 {
        // SAFETY: the caller guarantees 8 readable bytes at `p`.
        unsafe { _mm_cvtph_ps(_mm_loadl_epi64(p as *const __m128i)) }
    }

    /// Sum of the 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// 8 bytes at `p` as i8 → f32 lanes.
    ///
    /// # Safety
    /// `p` must point to 8 readable bytes, and the CPU must support AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn i8x8(p: *const u8) -> __m256 {
        // SAFETY: the caller guarantees 8 readable bytes at `p`.
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i))) }
    }

    /// As `avx512::q4_rows`, 8 lanes: element j < 16 is the low nibble of byte j, element
    /// j + 16 its high nibble.
    ///
    /// # Safety
    /// As `avx512::q4_rows`, with a CPU that supports AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_rows<const OFFSET: bool>(w: &[u8], x: &[f32], xsum32: &[f32], out: &mut [f32]) {
        let nb = x.len() / QK;
        let (bb, qs_at) = if OFFSET { (20, 4) } else { (18, 2) };
        let row_bytes = nb * bb;
        let mask = _mm256_set1_epi32(0x0F);
        let xp = x.as_ptr();
        for (r, o) in out.iter_mut().enumerate() {
            prefetch_range(w, (r + PREFETCH_ROWS) * row_bytes, row_bytes);
            let row = w.as_ptr().wrapping_add(r * row_bytes);
            let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut off = _mm_setzero_ps();
            for b in 0..nb {
                // SAFETY: as in `avx512::q4_rows`.
                unsafe {
                    let blk = row.add(b * bb);
                    let a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(blk.add(qs_at) as *const __m128i));
                    let c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(blk.add(qs_at + 8) as *const __m128i));
                    let x0 = _mm256_loadu_ps(xp.add(QK * b));
                    let x1 = _mm256_loadu_ps(xp.add(QK * b + 8));
                    let x2 = _mm256_loadu_ps(xp.add(QK * b + 16));
                    let x3 = _mm256_loadu_ps(xp.add(QK * b + 24));
                    let t0 = _mm256_mul_ps(x0, _mm256_cvtepi32_ps(_mm256_and_si256(a, mask)));
                    let t1 = _mm256_mul_ps(x1, _mm256_cvtepi32_ps(_mm256_and_si256(c, mask)));
                    let t0 = _mm256_fmadd_ps(x2, _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(a)), t0);
                    let t1 = _mm256_fmadd_ps(x3, _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(c)), t1);
                    let dm = header(blk);
                    let d = _mm256_broadcastss_ps(dm);
                    acc0 = _mm256_fmadd_ps(d, t0, acc0);
                    acc1 = _mm256_fmadd_ps(d, t1, acc1);
                    off = _mm_fmadd_ps(dm, _mm_set1_ps(*xsum32.get_unchecked(b)), off);
                }
            }
            let offset =
                if OFFSET { f32::from_bits(_mm_extract_ps::<1>(off) as u32) } else { -8.0 * _mm_cvtss_f32(off) };
            *o = hsum(_mm256_add_ps(acc0, acc1)) + offset;
        }
    }

    /// `q4_rows` for `R` ≤ 4 x rows at once (rows `0..R` of `x`, sums in
    /// `xsum32[i·nb..]`): each block's nibbles are widened and converted once, then every
    /// x row does exactly `q4_rows`' operations on them, in the same order, into its own
    /// accumulators; row r's result for x row i goes to `out[r·m + col + i]`. The offset
    /// term is kept for all R rows in one vector, as in `avx512::q4_rows_multi`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `x` must hold `R` rows of `32·nb`
    /// elements, `xsum32` `R·nb` sums, `w` whole rows of `nb` blocks (20 bytes each for
    /// Q4_1, 18 for Q4_0), and `out` at least `(w rows − 1)·m + col + R` elements.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_rows_multi<const OFFSET: bool, const R: usize>(
        w: &[u8],
        x: &[f32],
        xsum32: &[f32],
        nb: usize,
        out: &mut [f32],
        m: usize,
        col: usize,
    ) {
        let (bb, qs_at) = if OFFSET { (20, 4) } else { (18, 2) };
        let row_bytes = nb * bb;
        let rows = w.len() / row_bytes;
        let mask = _mm256_set1_epi32(0x0F);
        let xp = x.as_ptr();
        let sums = sums_by_block::<R>(xsum32, nb);
        for r in 0..rows {
            prefetch_range(w, (r + PREFETCH_ROWS) * row_bytes, row_bytes);
            let row = w.as_ptr().wrapping_add(r * row_bytes);
            let mut acc0 = [_mm256_setzero_ps(); R];
            let mut acc1 = [_mm256_setzero_ps(); R];
            let mut off = _mm_setzero_ps();
            for b in 0..nb {
                // SAFETY: block b of row r lies inside `w`; x row i's block b lies inside
                // `x` (the caller's contract) and `sums` holds 4 sums per block.
                unsafe {
                    let blk = row.add(b * bb);
                    let a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(blk.add(qs_at) as *const __m128i));
                    let c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(blk.add(qs_at + 8) as *const __m128i));
                    let lo_a = _mm256_cvtepi32_ps(_mm256_and_si256(a, mask));
                    let lo_c = _mm256_cvtepi32_ps(_mm256_and_si256(c, mask));
                    let hi_a = _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(a));
                    let hi_c = _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(c));
                    let dm = header(blk);
                    let d = _mm256_broadcastss_ps(dm);
                    for i in 0..R {
                        let xb = xp.add(i * nb * QK + QK * b);
                        let t0 = _mm256_mul_ps(_mm256_loadu_ps(xb), lo_a);
                        let t1 = _mm256_mul_ps(_mm256_loadu_ps(xb.add(8)), lo_c);
                        let t0 = _mm256_fmadd_ps(_mm256_loadu_ps(xb.add(16)), hi_a, t0);
                        let t1 = _mm256_fmadd_ps(_mm256_loadu_ps(xb.add(24)), hi_c, t1);
                        acc0[i] = _mm256_fmadd_ps(d, t0, acc0[i]);
                        acc1[i] = _mm256_fmadd_ps(d, t1, acc1[i]);
                    }
                    // Lane i: `q4_rows`' lane 1 (m·Σx, Q4_1) or lane 0 (d·Σx, Q4_0) for x row i.
                    let scale = if OFFSET { _mm_permute_ps::<0b01_01_01_01>(dm) } else { _mm_broadcastss_ps(dm) };
                    off = _mm_fmadd_ps(scale, _mm_loadu_ps(sums.as_ptr().add(4 * b)), off);
                }
            }
            let mut offsets = [0f32; 4];
            // SAFETY: `offsets` holds the 4 lanes stored.
            unsafe { _mm_storeu_ps(offsets.as_mut_ptr(), off) };
            for i in 0..R {
                let offset = if OFFSET { offsets[i] } else { -8.0 * offsets[i] };
                // SAFETY: r·m + col + i < out.len() (the caller's contract).
                unsafe { *out.get_unchecked_mut(r * m + col + i) = hsum(_mm256_add_ps(acc0[i], acc1[i])) + offset };
            }
        }
    }

    /// `q8_0_rows` for `R` x rows at once, as `q4_rows_multi`: each block's bytes are
    /// converted once, every x row does `q8_0_rows`' operations on them in its order.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `x` must hold `R` rows of `32·nb`
    /// elements, `w` whole rows of `nb` blocks of 34 bytes, and `out` at least
    /// `(w rows − 1)·m + col + R` elements.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_0_rows_multi<const R: usize>(
        w: &[u8],
        x: &[f32],
        nb: usize,
        out: &mut [f32],
        m: usize,
        col: usize,
    ) {
        let row_bytes = nb * 34;
        let rows = w.len() / row_bytes;
        let xp = x.as_ptr();
        for r in 0..rows {
            prefetch_range(w, (r + PREFETCH_ROWS) * row_bytes, row_bytes);
            let row = w.as_ptr().wrapping_add(r * row_bytes);
            let mut acc0 = [_mm256_setzero_ps(); R];
            let mut acc1 = [_mm256_setzero_ps(); R];
            for b in 0..nb {
                // SAFETY: as in `q4_rows_multi`.
                unsafe {
                    let blk = row.add(b * 34);
                    let (q0, q1) = (i8x8(blk.add(2)), i8x8(blk.add(10)));
                    let (q2, q3) = (i8x8(blk.add(18)), i8x8(blk.add(26)));
                    let d = _mm256_broadcastss_ps(header(blk));
                    for i in 0..R {
                        let xs = xp.add(i * nb * QK + QK * b);
                        let t0 = _mm256_mul_ps(_mm256_loadu_ps(xs), q0);
                        let t1 = _mm256_mul_ps(_mm256_loadu_ps(xs.add(8)), q1);
                        let t0 = _mm256_fmadd_ps(_mm256_loadu_ps(xs.add(16)), q2, t0);
                        let t1 = _mm256_fmadd_ps(_mm256_loadu_ps(xs.add(24)), q3, t1);
                        acc0[i] = _mm256_fmadd_ps(d, t0, acc0[i]);
                        acc1[i] = _mm256_fmadd_ps(d, t1, acc1[i]);
                    }
                }
            }
            for i in 0..R {
                // SAFETY: r·m + col + i < out.len() (the caller's contract).
                unsafe { *out.get_unchecked_mut(r * m + col + i) = hsum(_mm256_add_ps(acc0[i], acc1[i])) };
            }
        }
    }

    /// As `avx512::q8_0_rows`, 8 lanes.
    ///
    /// # Safety
    /// As `avx512::q8_0_rows`, with a CPU that supports AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_0_rows(w: &[u8], x: &[f32], out: &mut [f32]) {
        let nb = x.len() / QK;
        let row_bytes = nb * 34;
        let xp = x.as_ptr();
        for (r, o) in out.iter_mut().enumerate() {
            prefetch_range(w, (r + PREFETCH_ROWS) * row_bytes, row_bytes);
            let row = w.as_ptr().wrapping_add(r * row_bytes);
            let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for b in 0..nb {
                // SAFETY: as in `avx512::q4_rows`.
                unsafe {
                    let blk = row.add(b * 34);
                    let xs = xp.add(QK * b);
                    let t0 = _mm256_mul_ps(_mm256_loadu_ps(xs), i8x8(blk.add(2)));
                    let t1 = _mm256_mul_ps(_mm256_loadu_ps(xs.add(8)), i8x8(blk.add(10)));
                    let t0 = _mm256_fmadd_ps(_mm256_loadu_ps(xs.add(16)), i8x8(blk.add(18)), t0);
                    let t1 = _mm256_fmadd_ps(_mm256_loadu_ps(xs.add(24)), i8x8(blk.add(26)), t1);
                    let d = _mm256_broadcastss_ps(header(blk));
                    acc0 = _mm256_fmadd_ps(d, t0, acc0);
                    acc1 = _mm256_fmadd_ps(d, t1, acc1);
                }
            }
            *o = hsum(_mm256_add_ps(acc0, acc1));
        }
    }

    /// `acc` (lanes 0..8 in `a`, 8..16 in `b`) reduced as `fused_dot::hsum16`: lane-wise
    /// a + b, then halves added pairwise down to one lane.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn tree16(a: __m256, b: __m256) -> f32 {
        hsum(_mm256_add_ps(a, b))
    }

    /// 8 bytes at `p` widened to 32-bit lanes.
    ///
    /// # Safety
    /// `p` must point to 8 readable bytes, and the CPU must support AVX2.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn u8x8(p: *const u8) -> __m256i {
        // SAFETY: the caller guarantees 8 readable bytes at `p`.
        unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i)) }
    }

    /// The f16 at `p` as f32.
    ///
    /// # Safety
    /// `p` must point to 2 readable bytes, and the CPU must support F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16_at(p: *const u8) -> f32 {
        // SAFETY: the caller guarantees 2 readable bytes at `p`.
        let bits = unsafe { u16::from_le_bytes([*p, *p.add(1)]) };
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
    }

    /// Q5_0 rows, lane for lane the portable `fused_dot::q5_0_row`: 16 lanes (two vectors),
    /// lane l of a block takes elements l and l + 16, `acc = d·(x_l·q_l + x_{l+16}·q_{l+16})
    /// + acc` with both products fused as there, and the same tree reduction.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `x.len()` must be a multiple of 32 and `w`
    /// hold exactly `out.len()` rows of `x.len() / 32` blocks of 22 bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q5_0_rows(w: &[u8], x: &[f32], out: &mut [f32]) {
        let nb = x.len() / QK;
        let row_bytes = nb * 22;
        let (mask, sixteen) = (_mm256_set1_epi32(0x0F), _mm256_set1_epi32(16));
        let one = _mm256_set1_epi32(1);
        let shifts_lo = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let xp = x.as_ptr();
        for (r, o) in out.iter_mut().enumerate() {
            prefetch_range(w, (r + PREFETCH_ROWS) * row_bytes, row_bytes);
            let row = w.as_ptr().wrapping_add(r * row_bytes);
            let mut acc = [_mm256_setzero_ps(); 2];
            for b in 0..nb {
                // SAFETY: block b of row r lies inside `w`, and x holds block b.
                unsafe {
                    let blk = row.add(b * 22);
                    let d = _mm256_set1_ps(f16_at(blk));
                    let qh = _mm256_set1_epi32(
                        u32::from_le_bytes([*blk.add(2), *blk.add(3), *blk.add(4), *blk.add(5)]) as i32,
                    );
                    for (g, acc) in acc.iter_mut().enumerate() {
                        let q = u8x8(blk.add(6 + 8 * g));
                        let shifts = _mm256_add_epi32(shifts_lo, _mm256_set1_epi32(8 * g as i32));
                        let bit_lo = _mm256_and_si256(_mm256_srlv_epi32(qh, shifts), one);
                        let bit_hi = _mm256_and_si256(_mm256_srlv_epi32(qh, _mm256_add_epi32(shifts, sixteen)), one);
                        let lo = _mm256_or_si256(_mm256_and_si256(q, mask), _mm256_slli_epi32::<4>(bit_lo));
                        let hi = _mm256_or_si256(_mm256_srli_epi32::<4>(q), _mm256_slli_epi32::<4>(bit_hi));
                        let lo = _mm256_cvtepi32_ps(_mm256_sub_epi32(lo, sixteen));
                        let hi = _mm256_cvtepi32_ps(_mm256_sub_epi32(hi, sixteen));
                        let xl = _mm256_loadu_ps(xp.add(QK * b + 8 * g));
                        let xh = _mm256_loadu_ps(xp.add(QK * b + 16 + 8 * g));
                        let t = _mm256_fmadd_ps(xl, lo, _mm256_mul_ps(xh, hi));
                        *acc = _mm256_fmadd_ps(d, t, *acc);
                    }
                }
            }
            *o = tree16(acc[0], acc[1]);
        }
    }

    /// IQ4_NL / MXFP4 rows, as `avx512::table_rows` (and so with the portable
    /// `fused_dot::table_row`'s bits): each 16-lane accumulator in two 8-lane vectors
    /// (lanes 0..8, 8..16), the levels looked up as bytes by `vpshufb` and widened, and
    /// the reduction `fused_dot::hsum16`'s (the two accumulators added, then lanes l + 8,
    /// l + 4, l + 2, l + 1).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `x.len()` must be a multiple of 32 and `w`
    /// hold exactly `out.len()` rows of `x.len() / 32` blocks of `T::BYTES` bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn table_rows<T: LevelTable>(w: &[u8], x: &[f32], out: &mut [f32]) {
        let nb = x.len() / QK;
        let row_bytes = nb * T::BYTES;
        // SAFETY: `T::VALUES` holds 16 bytes.
        let table = unsafe { _mm_loadu_si128(T::VALUES.as_ptr() as *const __m128i) };
        let low4 = _mm_set1_epi8(0x0F);
        let xp = x.as_ptr();
        // The 16 levels of `v` (i8) as f32: lanes 0..8 and 8..16.
        let widen = |v: __m128i| {
            (
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v))),
            )
        };
        for (r, o) in out.iter_mut().enumerate() {
            prefetch_range(w, (r + PREFETCH_ROWS) * row_bytes, row_bytes);
            let row = w.as_ptr().wrapping_add(r * row_bytes);
            // [even blocks' lanes 0..8, 8..16], [odd blocks' lanes 0..8, 8..16].
            let mut acc = [[_mm256_setzero_ps(); 2]; 2];
            let block = |b: usize, acc: &mut [__m256; 2]| {
                // SAFETY: block b of row r lies inside `w` (its 16 index bytes start at
                // `QS_AT`, its scale at 0), and x holds block b.
                unsafe {
                    let blk = row.add(b * T::BYTES);
                    let q = _mm_loadu_si128(blk.add(T::QS_AT) as *const __m128i);
                    let lo = widen(_mm_shuffle_epi8(table, _mm_and_si128(q, low4)));
                    let hi = widen(_mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(q), low4)));
                    let d = _mm256_set1_ps(table_scale::<T>(blk));
                    let xb = xp.add(QK * b);
                    for (h, (lo, hi)) in [(lo.0, hi.0), (lo.1, hi.1)].into_iter().enumerate() {
                        let xl = _mm256_loadu_ps(xb.add(8 * h));
                        let xh = _mm256_loadu_ps(xb.add(16 + 8 * h));
                        let t = _mm256_fmadd_ps(xl, lo, _mm256_mul_ps(xh, hi));
                        acc[h] = _mm256_fmadd_ps(d, t, acc[h]);
                    }
                }
            };
            let mut b = 0;
            while b + 2 <= nb {
                block(b, &mut acc[0]);
                block(b + 1, &mut acc[1]);
                b += 2;
            }
            if b < nb {
                block(b, &mut acc[0]);
            }
            let low = _mm256_add_ps(acc[0][0], acc[1][0]);
            let high = _mm256_add_ps(acc[0][1], acc[1][1]);
            *o = tree16(low, high);
        }
    }
}
