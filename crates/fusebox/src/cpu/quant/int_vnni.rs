//! AVX-512 VNNI forms of the 32-block integer dots (Q8_0, Q4_0, Q4_1, Q5_0, IQ4_NL,
//! MXFP4; see `int.rs` for the scheme). One 512-bit `vpdpbusd` multiplies two blocks'
//! weights (unsigned bytes) with their 8-bit activations (signed bytes) and sums each
//! group of four products into an i32 lane. The two blocks' groups are interleaved
//! (`Q8Row::q_pairs`): lane `2l + h` holds group l of block `b + h`, the twin's lane
//! `8h + l`, so that a pair's scale `d_w·d_x` is two floats repeated, one broadcast load.
//! `vpdpbusd` wants unsigned weights, so signed ones are offset, `w + 2^s` (Q8_0, IQ4_NL,
//! MXFP4: s = 7, Q4_0: 3, Q5_0: 4; the table formats look `level + 128` up by `vpshufb`),
//! and `2^s·Σq` of each lane (the activation's `bias`, the accumulator's starting value)
//! is taken off exactly.
//!
//! The kernel works in register tiles of up to 4 W rows × 4 x rows (a server's batch, a
//! speculative verify pass): a pair of weight blocks is decoded once per tile, each x
//! row's pair loaded once per tile, the tile's 16 `d_w·d_x` pairs come from 4 multiplies,
//! and per (W row, x row) and pair the work is one `vpdpbusd`, one conversion and one FMA
//! on an accumulator that stays in a register; the reductions wait for the end of the
//! row. Each (W row, x row) pair sees the twin's f32 operations in the twin's order,
//! whatever tile it falls in.
//!
//! x itself is quantized here too ([`quantize_row`], for the K formats' super-blocks as
//! well), 32 elements at a time, with the twin's arithmetic: the same division for the scale and reciprocal, and rounding half
//! away from zero (`trunc`, then ±1 where the dropped fraction is at least one half).

use std::arch::x86_64::*;

use super::fields::e8m0_half;
use super::fused_dot_x86::{prefetch_range, PREFETCH_ROWS};
use super::int::{activation_block, fits_all, weight_offset_shift, Q8Row};
use super::int_avx2::{offset_levels, BLOCK_BYTES};
use super::{QK, QK_K};
use crate::cpu::simd::Isa;
use crate::dtype::DType;

/// Whether the VNNI integer kernels run here: AVX-512 is the active ISA (never one the
/// CPU lacks) and the CPU has VNNI and F16C (the f16 block scales).
pub(super) fn vnni_kernels_run() -> bool {
    Isa::active() == Isa::Avx512
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// `out[r·m + i]` = row r of `w` · `xs[i]` (`int.rs`'s `int_rows_multi`), the K formats
/// by `int_vnni_k.rs`; false, doing nothing, for a format without an integer kernel,
/// where the active ISA is not AVX-512 or the CPU lacks VNNI, or for sizes that do not fit.
pub(super) fn int_rows_multi(dtype: DType, w: &[u8], xs: &[Q8Row], out: &mut [f32]) -> bool {
    let f = match dtype {
        DType::Q8_0 => 0,
        DType::Q4_0 => 1,
        DType::Q4_1 => 2,
        DType::Q5_0 => 3,
        DType::IQ4NL => 4,
        DType::MXFP4 => 5,
        _ => return super::int_vnni_k::int_rows_multi(dtype, w, xs, out),
    };
    if !vnni_kernels_run() || !fits_all(dtype, w, xs, out.len()) {
        return false;
    }
    // SAFETY: AVX-512 F/BW/VL and FMA (the active ISA, never one the CPU lacks), VNNI,
    // F16C and BMI2 are present; `fits` checked that `w` holds `out.len() / m` rows of blocks
    // covering every `xs[i].q`, and that each row's per-block vectors match.
    unsafe {
        match f {
            0 => rows::<0>(w, xs, out),
            1 => rows::<1>(w, xs, out),
            2 => rows::<2>(w, xs, out),
            3 => rows::<3>(w, xs, out),
            4 => rows::<4>(w, xs, out),
            _ => rows::<5>(w, xs, out),
        }
    }
    true
}

/// The most x rows (C) and W rows (R) of one register tile.
const TILE_X: usize = 4;
const TILE_W: usize = 4;

/// Every W row against every x row, in register tiles of up to 4 W rows × 4 x rows (x rows
/// split into groups as even as possible; the last W rows of a run not a multiple of 4
/// one at a time).
///
/// # Safety
/// AVX-512 F/BW/VL, VNNI, FMA, F16C and BMI2; the sizes as `int_rows_multi` checks them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn rows<const F: u8>(w: &[u8], xs: &[Q8Row], out: &mut [f32]) {
    let m = xs.len();
    let nb = xs[0].q.len() / QK;
    let np = nb.div_ceil(2);
    let row_bytes = nb * BLOCK_BYTES[usize::from(F)];
    let n = out.len() / m;
    // x rows in groups of at most TILE_X, sizes differing by at most one.
    let groups = m.div_ceil(TILE_X);
    let bounds: Vec<usize> = (0..=groups).map(|g| g * m / groups).collect();
    // Per group and pair of blocks, each x row's two block scales (and Σx̃ for Q4_1) side
    // by side, `[x0: b, b + 1, x1: b, b + 1, …]`, zero for a missing odd block and
    // beyond the group's rows: what `tile` multiplies by the weights' scales, 8 lanes at once.
    let (mut scales, mut sums) =
        (vec![0.0f32; groups * np * 8], vec![0.0f32; if F == 2 { groups * np * 8 } else { 0 }]);
    for g in 0..groups {
        for (i, x) in xs[bounds[g]..bounds[g + 1]].iter().enumerate() {
            for b in 0..nb {
                let at = (g * np + b / 2) * 8 + 2 * i + b % 2;
                scales[at] = x.d[b];
                if F == 2 {
                    sums[at] = x.xsum[b];
                }
            }
        }
    }
    let mut r = 0;
    while r < n {
        let tile_rows = if n - r >= TILE_W { TILE_W } else { 1 };
        prefetch_range(w, (r + PREFETCH_ROWS) * row_bytes, tile_rows * row_bytes);
        let row = w.as_ptr().wrapping_add(r * row_bytes);
        for g in 0..groups {
            let (x, c) = (&xs[bounds[g]..bounds[g + 1]], bounds[g + 1] - bounds[g]);
            let sc = scales.as_ptr().wrapping_add(g * np * 8);
            let su = sums.as_ptr().wrapping_add(g * np * 8);
            let o = out.as_mut_ptr().wrapping_add(r * m + bounds[g]);
            // SAFETY: the tile's rows lie inside `w`, each x row covers its nb blocks,
            // `scales`/`sums` hold the group's np pairs, and out[(r + j)·m + bounds[g] + i]
            // exists for j < tile_rows, i < c.
            unsafe {
                match (tile_rows, c) {
                    (TILE_W, 4) => tile::<F, TILE_W, 4>(row, row_bytes, nb, x, sc, su, o, m),
                    (TILE_W, 3) => tile::<F, TILE_W, 3>(row, row_bytes, nb, x, sc, su, o, m),
                    (TILE_W, 2) => tile::<F, TILE_W, 2>(row, row_bytes, nb, x, sc, su, o, m),
                    (TILE_W, _) => tile::<F, TILE_W, 1>(row, row_bytes, nb, x, sc, su, o, m),
                    (_, 4) => tile::<F, 1, 4>(row, row_bytes, nb, x, sc, su, o, m),
                    (_, 3) => tile::<F, 1, 3>(row, row_bytes, nb, x, sc, su, o, m),
                    (_, 2) => tile::<F, 1, 2>(row, row_bytes, nb, x, sc, su, o, m),
                    _ => tile::<F, 1, 1>(row, row_bytes, nb, x, sc, su, o, m),
                }
            }
        }
        r += tile_rows;
    }
}

/// R W rows (at `row`, `row_bytes` apart, `nb` blocks each) dotted with the C x rows `xs`
/// into `out[j·m + i]`: all R·C accumulators stay in registers, each pair of weight
/// blocks is decoded once for the C x rows and each x row's pair loaded once for the R W
/// rows. The accumulator of (W row j, x row i) holds the twin's lane `8h + l` in lane
/// `2l + h` (block b's 4-element group l, h = b mod 2, interleaved as `Q8Row::q_pairs`),
/// so that the `d_w·d_x` of a pair is a broadcast pair of floats: the R × C products come
/// from R 8-lane multiplies per pair (`scales`: `[d_x(i, b), d_x(i, b + 1)]` per x row) and
/// reach the FMAs as broadcast loads. Per pair and (j, i): one `vpdpbusd`, one conversion,
/// one FMA, in the twin's order per lane.
///
/// # Safety
/// As `rows`; the R rows lie inside the weights, `xs` holds C rows covering `nb` blocks,
/// `scales` (and `sums` for Q4_1) `8·⌈nb/2⌉` floats, `out` the R × C entries named.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn tile<const F: u8, const R: usize, const C: usize>(
    row: *const u8,
    row_bytes: usize,
    nb: usize,
    xs: &[Q8Row],
    scales: *const f32,
    sums: *const f32,
    out: *mut f32,
    m: usize,
) {
    let bb = BLOCK_BYTES[usize::from(F)];
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    // Q4_1's offsets of W row j: lanes 2i + h the twin's off[h] of x row i.
    let mut off = [_mm256_setzero_ps(); R];
    let q: [*const i8; C] = std::array::from_fn(|i| xs[i].q_pairs.as_ptr());
    let bias: [*const i32; C] = std::array::from_fn(|i| xs[i].bias.as_ptr());
    // SAFETY (the loop): block pairs inside each row, x pairs inside `q_pairs`/`bias`, and
    // the pair's 8 scales/sums inside theirs (the contract).
    unsafe {
        for p in 0..nb / 2 {
            step::<F, R, C, true>(row.add(2 * p * bb), row_bytes, p, &q, &bias, scales, sums, &mut acc, &mut off);
        }
        if nb % 2 == 1 {
            let p = nb / 2;
            step::<F, R, C, false>(row.add(2 * p * bb), row_bytes, p, &q, &bias, scales, sums, &mut acc, &mut off);
        }
    }
    for j in 0..R {
        let mut o = [0.0f32; 8];
        // SAFETY: 8 floats.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), off[j]) };
        for i in 0..C {
            let a = acc[j][i];
            // The twin's tree16: lanes l + (l + 8) (here 2l and 2l + 1), then tree8 on
            // lanes 2l: l + (l + 4), l + (l + 2), 0 + 1.
            let v = _mm512_add_ps(a, _mm512_permute_ps::<0b10_11_00_01>(a));
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            let v = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
            let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let sum = _mm_cvtss_f32(v) + _mm_cvtss_f32(_mm_movehl_ps(v, v));
            // SAFETY: out[j·m + i] is one of the tile's entries (the contract).
            unsafe { *out.add(j * m + i) = sum + (o[2 * i] + o[2 * i + 1]) };
        }
    }
}

/// Pair p of blocks (`TWO`: blocks 2p and 2p + 1; else block 2p alone, the odd last one)
/// of R W rows against C x rows, into `acc` and Q4_1's `off`.
///
/// # Safety
/// As `tile`; `blk0` is block 2p of the first W row.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn step<const F: u8, const R: usize, const C: usize, const TWO: bool>(
    blk0: *const u8,
    row_bytes: usize,
    p: usize,
    q: &[*const i8; C],
    bias: &[*const i32; C],
    scales: *const f32,
    sums: *const f32,
    acc: &mut [[__m512; C]; R],
    off: &mut [__m256; R],
) {
    // SAFETY (whole fn): the contract.
    unsafe {
        let bb = BLOCK_BYTES[usize::from(F)];
        let dx = _mm256_loadu_ps(scales.add(8 * p));
        let mut wv = [_mm512_setzero_si512(); R];
        // d_w·d_x of W row j and x row i as a pair of floats at d[j][2i..2i + 2].
        let mut d = [[0.0f32; 8]; R];
        for j in 0..R {
            let blk = blk0.add(j * row_bytes);
            // An odd last block: the second half's weights and scales read as 0 (its
            // activations are 0 too), which leaves its accumulator lanes unchanged.
            let (v, dw, mw) = weights::<F>(blk, if TWO { Some(blk.add(bb)) } else { None });
            wv[j] = v;
            _mm256_storeu_ps(d[j].as_mut_ptr(), _mm256_mul_ps(dw, dx));
            if F == 2 {
                off[j] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(sums.add(8 * p)), off[j]);
            }
        }
        for i in 0..C {
            let qv = _mm512_loadu_si512(q[i].add(64 * p) as *const _);
            let start =
                if F == 2 { _mm512_setzero_si512() } else { _mm512_loadu_si512(bias[i].add(16 * p) as *const _) };
            for j in 0..R {
                let lanes = _mm512_dpbusd_epi32(start, wv[j], qv);
                let dij = broadcast_pair(d[j].as_ptr().add(2 * i));
                acc[j][i] = _mm512_fmadd_ps(dij, _mm512_cvtepi32_ps(lanes), acc[j][i]);
            }
        }
    }
}

/// The two floats at `p` repeated over 16 lanes, as one broadcast load.
///
/// # Safety
/// 8 readable bytes at `p`; AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn broadcast_pair(p: *const f32) -> __m512 {
    let v: __m512;
    // SAFETY: the caller's 8 bytes; a load with no other effect.
    unsafe {
        std::arch::asm!(
            "vbroadcastsd {v}, qword ptr [{p}]",
            p = in(reg) p,
            v = out(zmm_reg) v,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    v
}

/// The offset weights of block `blk0` and, if present, the next block `blk1` as 64
/// unsigned bytes with their 4-element groups interleaved (group l of `blk0` at bytes
/// 8l..8l + 4, of `blk1` at 8l + 4..8l + 8; zeros for an absent block), their scales as
/// `[d0, d1]` over 8 lanes and, for Q4_1, their mins likewise (0 where absent).
///
/// # Safety
/// `blk0` (and `blk1`) point to whole blocks of format `F`; the features of `rows`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c,bmi2")]
unsafe fn weights<const F: u8>(blk0: *const u8, blk1: Option<*const u8>) -> (__m512i, __m256, __m256) {
    // SAFETY (whole fn): every read lies inside a block the caller vouches for.
    unsafe {
        // The 4-byte header (d, m for Q4_1; d and 2 bytes of quants otherwise) of each
        // block: [d0, m0, d1, m1] as f16, widened.
        let head = |p: *const u8| _mm_cvtsi32_si128(i32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)]));
        let heads = _mm_unpacklo_epi32(head(blk0), blk1.map_or(_mm_setzero_si128(), head));
        let scales = _mm256_castps128_ps256(_mm_cvtph_ps(heads));
        let dw = if F == 5 {
            // MXFP4's E8M0 byte (0 for an absent block).
            let (d0, d1) = (e8m0_half(*blk0), blk1.map_or(0.0, |p| e8m0_half(*p)));
            _mm256_setr_ps(d0, d1, d0, d1, d0, d1, d0, d1)
        } else {
            _mm256_permutevar8x32_ps(scales, _mm256_setr_epi32(0, 2, 0, 2, 0, 2, 0, 2))
        };
        let mw = if F == 2 {
            _mm256_permutevar8x32_ps(scales, _mm256_setr_epi32(1, 3, 1, 3, 1, 3, 1, 3))
        } else {
            _mm256_setzero_ps()
        };
        let wv = if F == 0 {
            let a = _mm256_loadu_si256(blk0.add(2) as *const __m256i);
            let b = blk1.map_or(_mm256_set1_epi8(-128), |p| _mm256_loadu_si256(p.add(2) as *const __m256i));
            // Dwords [a0, b0, a1, b1, …, a7, b7], then w + 128 as an unsigned byte (the
            // absent half becomes 0).
            let ab = _mm512_permutex2var_epi32(
                _mm512_castsi256_si512(a),
                _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
                _mm512_castsi256_si512(b),
            );
            _mm512_xor_si512(ab, _mm512_set1_epi8(-128))
        } else {
            let qs_at = [0, 2, 4, 6, 2, 1][usize::from(F)];
            let a = _mm_loadu_si128(blk0.add(qs_at) as *const __m128i);
            let b = blk1.map_or(_mm_setzero_si128(), |p| _mm_loadu_si128(p.add(qs_at) as *const __m128i));
            // Dwords [a0, b0, …, a3, b3] twice, the upper half shifted right by 4: group l
            // < 4 of each block is the low nibbles of its bytes 4l..4l + 4, group l ≥ 4
            // the high nibbles of bytes 4(l − 4)...
            let ab = _mm512_permutex2var_epi32(
                _mm512_castsi128_si512(a),
                _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 0, 16, 1, 17, 2, 18, 3, 19),
                _mm512_castsi128_si512(b),
            );
            let shifted = _mm512_mask_srli_epi16::<4>(ab, 0xFFFF_0000, ab);
            let nibbles = _mm512_and_si512(shifted, _mm512_set1_epi8(0x0F));
            if F == 3 {
                // Q5_0's fifth bits: bit e of each block's qh is its element e, which sits
                // at byte 8(e / 4) + 4h + e mod 4 (nibble 2(e / 4) + h of the mask).
                let qh = |p: *const u8| u64::from(u32::from_le_bytes([*p.add(2), *p.add(3), *p.add(4), *p.add(5)]));
                let bits =
                    _pdep_u64(qh(blk0), 0x0F0F_0F0F_0F0F_0F0F) | _pdep_u64(blk1.map_or(0, qh), 0xF0F0_F0F0_F0F0_F0F0);
                _mm512_or_si512(nibbles, _mm512_maskz_mov_epi8(bits, _mm512_set1_epi8(0x10)))
            } else if F >= 4 {
                // level + 128 as an unsigned byte (an absent block's are multiplied by
                // its zero activations).
                let offset = const { offset_levels(F) };
                let table = _mm512_broadcast_i32x4(_mm_loadu_si128(offset.as_ptr() as *const __m128i));
                _mm512_shuffle_epi8(table, nibbles)
            } else {
                nibbles
            }
        };
        (wv, dw, mw)
    }
}

/// x quantized as `int.rs`'s `quantize_row` does it, bit for bit, 32 elements per step
/// (one scale per 32 or per 256); `None` (nothing done) where VNNI is missing or the ISA
/// in use is not AVX-512, or for a format without an integer kernel or a length that is
/// not whole blocks.
pub(super) fn quantize_row(x: &[f32], dtype: DType) -> Option<Q8Row> {
    let block = activation_block(dtype)?;
    if Isa::active() != Isa::Avx512
        || !std::arch::is_x86_feature_detected!("avx512vnni")
        || !x.len().is_multiple_of(block)
    {
        return None;
    }
    let nb = x.len() / QK;
    // The 32-block formats' interleaved pairs and lane biases (none for the K formats).
    let pairs = if block == QK { nb.div_ceil(2) } else { 0 };
    let mut row = Q8Row {
        dtype,
        q: vec![0; x.len()],
        d: vec![0.0; x.len() / block],
        xsum: vec![0.0; nb],
        qsum: vec![0; nb],
        q_pairs: vec![0; 64 * pairs],
        bias: vec![0; 16 * pairs],
    };
    // SAFETY: AVX-512 F/BW/VL (the active ISA) and VNNI are present; every vector is
    // sized for x's blocks above.
    unsafe {
        match weight_offset_shift(dtype) {
            Some(s) => quantize_blocks(x, s, &mut row),
            None => quantize_super_blocks(x, &mut row),
        }
    }
    Some(row)
}

/// `|v|` lane by lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn abs_ps(v: __m512) -> __m512 {
    _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFF_FFFF)))
}

/// The 32 values at `x` times `id`, rounded half away from zero (`trunc`, then ±1 where
/// the dropped fraction is at least one half), NaN → 0, clamped to ±127, stored at `q`;
/// returns their sum.
///
/// # Safety
/// AVX-512 F/BW/VL; `x` holds 32 readable f32, `q` 32 writable bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn round_run(x: *const f32, id: __m512, q: *mut i8) -> i32 {
    let mut qsum = _mm512_setzero_si512();
    for h in 0..2 {
        // SAFETY: the caller's 32 inputs and outputs.
        unsafe {
            let r = _mm512_mul_ps(_mm512_loadu_ps(x.add(16 * h)), id);
            let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(r);
            let frac = _mm512_sub_ps(r, t); // exact: |r| < 2^23
            let t = _mm512_mask_add_ps(
                t,
                _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, _mm512_set1_ps(0.5)),
                t,
                _mm512_set1_ps(1.0),
            );
            let t = _mm512_mask_sub_ps(
                t,
                _mm512_cmp_ps_mask::<_CMP_LE_OQ>(frac, _mm512_set1_ps(-0.5)),
                t,
                _mm512_set1_ps(1.0),
            );
            // NaN → 0 (the twin's `as i8`), then the clamp to ±127.
            let t = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(t, t), t);
            let t = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(-127.0)), _mm512_set1_ps(127.0));
            let qi = _mm512_cvtps_epi32(t);
            qsum = _mm512_add_epi32(qsum, qi);
            _mm_storeu_si128(q.add(16 * h) as *mut __m128i, _mm512_cvtepi32_epi8(qi));
        }
    }
    _mm512_reduce_add_epi32(qsum)
}

/// The scale `max|x|/127` of `v`'s lanes skipping NaN, as the twin's fold (`max_ps(a,
/// b)` returns b if a is NaN), and its reciprocal (0 for a zero scale) spread.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
fn scale_of(v: &[__m512]) -> (f32, __m512) {
    let m = v.iter().fold(_mm512_setzero_ps(), |m, &x| _mm512_max_ps(abs_ps(x), m));
    let d = _mm512_reduce_max_ps(m) / 127.0;
    (d, _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 }))
}

/// # Safety
/// AVX-512 F/BW/VL and VNNI; `row`'s vectors sized for `x.len() / 32` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn quantize_blocks(x: &[f32], shift: u32, row: &mut Q8Row) {
    for (b, xs) in x.chunks_exact(QK).enumerate() {
        // SAFETY: block b's 32 inputs and outputs are in bounds.
        unsafe {
            let v = [_mm512_loadu_ps(xs.as_ptr()), _mm512_loadu_ps(xs.as_ptr().add(16))];
            let (d, id) = scale_of(&v);
            let qs = round_run(xs.as_ptr(), id, row.q.as_mut_ptr().add(QK * b));
            *row.d.get_unchecked_mut(b) = d;
            *row.qsum.get_unchecked_mut(b) = qs;
            *row.xsum.get_unchecked_mut(b) = d * qs as f32;
        }
    }
    let nb = x.len() / QK;
    for p in 0..nb.div_ceil(2) {
        // SAFETY: pair p's 64 (or, odd last, 32) activations, 64 interleaved bytes and 16
        // biases are in bounds.
        unsafe {
            let a = _mm256_loadu_si256(row.q.as_ptr().add(64 * p) as *const __m256i);
            let b = if 2 * p + 1 < nb {
                _mm256_loadu_si256(row.q.as_ptr().add(64 * p + 32) as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            // Dwords [a0, b0, a1, b1, …]: the weights' order in `int_vnni::weights`.
            let ab = _mm512_permutex2var_epi32(
                _mm512_castsi256_si512(a),
                _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
                _mm512_castsi256_si512(b),
            );
            _mm512_storeu_si512(row.q_pairs.as_mut_ptr().add(64 * p) as *mut _, ab);
            // −2^s·Σ over each group of 4 (a `vpdpbusd` by ones).
            let gsum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), ab);
            let bias =
                _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_sll_epi32(gsum, _mm_cvtsi32_si128(shift as i32)));
            _mm512_storeu_si512(row.bias.as_mut_ptr().add(16 * p) as *mut _, bias);
        }
    }
}

/// The K formats' activations: one scale per 256, the integer sum per 32.
///
/// # Safety
/// AVX-512 F/BW/VL and VNNI; `row`'s vectors sized for `x.len() / 256` super-blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn quantize_super_blocks(x: &[f32], row: &mut Q8Row) {
    for (sb, xs) in x.chunks_exact(QK_K).enumerate() {
        // SAFETY: super-block sb's 256 inputs and outputs and 8 sums are in bounds.
        unsafe {
            let v: [__m512; 16] = std::array::from_fn(|j| _mm512_loadu_ps(xs.as_ptr().add(16 * j)));
            let (d, id) = scale_of(&v);
            *row.d.get_unchecked_mut(sb) = d;
            for run in 0..QK_K / QK {
                let at = QK_K * sb + QK * run;
                let qs = round_run(xs.as_ptr().add(QK * run), id, row.q.as_mut_ptr().add(at));
                *row.qsum.get_unchecked_mut(at / QK) = qs;
                *row.xsum.get_unchecked_mut(at / QK) = d * qs as f32;
            }
        }
    }
}
