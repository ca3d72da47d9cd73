//! The integer decode path of `quantized_matmul`: the x row is quantized once per call
//! to 8 bits per element, and each W row is dotted with it in integers, block by block
//! (as llama.cpp's `ggml_vec_dot_q4_1_q8_1` etc.). Two activation layouts:
//!
//! * **Q8 per 32** (for Q8_0, Q4_0, Q4_1, Q5_0, IQ4_NL, MXFP4): `x[j] ≈ x̃[j] = d_b·q[j]` with one f32
//!   scale `d_b = max|x| / 127` per block b of 32 and `q = round(x·(1/d_b))` (half away
//!   from zero) ∈ [−127, 127], as llama.cpp's `quantize_row_q8_0` (whose scale is then
//!   stored in f16; here it stays f32); Q4_1's offset `m·Σx̃` takes `Σx̃ = d_b·Σq`.
//! * **Q8 per 256** (for Q4_K, Q5_K, Q6_K): the same with one scale per super-block of
//!   256 (llama.cpp's Q8_K), and the integer sum of q over each run of 32 (for the
//!   `dmin·m` offsets of Q4_K/Q5_K).
//!
//! Either way the result is `Σ_j W[r, j]·x̃[j]` (up to f32 rounding): x is replaced by
//! its 8-bit rounding x̃ ([`crate::spec::quant::int_activation_block`] names the block).
//!
//! Per block the products `w_int·q` are summed exactly in i32 in **8 lanes**: lane l
//! of a run of 32 elements holds elements 4l..4l+4 (the lanes AVX2's `maddubs` +
//! `madd` and AVX-512's `vpdpbusd` produce), multiplied by the sub-block scale of the
//! weights where the format has one (Q4_K, Q5_K: per 32; Q6_K: per 16, which never
//! splits a lane). Then, in f32, with `d = d_w·d_x` per block:
//!
//! * 32-blocks: 16 accumulator lanes, block b in lanes `8·(b mod 2) + l` (so AVX-512
//!   takes two blocks per instruction): `acc[8h + l] = fma(d, lane[l], acc[8h + l])`,
//!   and Q4_1's offsets `off[h] = fma(m, Σx̃, off[h])`; the row's result is
//!   `tree16(acc) + (off[0] + off[1])`.
//! * K super-blocks: 8 lanes, `acc[l] = fma(d, lane[l], acc[l])`, and the `dmin·m`
//!   offsets of Q4_K/Q5_K in 8 more, one per sub-block s: `off[s] = fma(c, m_s·qsum_s,
//!   off[s])` with `c = dmin·d_x` (the product exact in i32, then in f32: below 2^24);
//!   the row's result is `tree8(acc − off)`, lane by lane.
//!
//! `tree16` adds lanes l and l + 8, then `tree8` adds l and l + 4, l and l + 2, 0 and 1.
//! The integer sums are exact and the f32 operations happen in one fixed order, so the
//! portable twin here, the AVX2 kernels (`int_avx2.rs`) and the AVX-512 VNNI
//! kernels (`int_vnni.rs`, `int_vnni_k.rs`) give bit-identical results, and a row's result does
//! not depend on how many x rows one call takes.
//!
//! The results differ from the f32-activation path by the activation rounding (about
//! 0.4% of a block's largest |x| per element, relative); `CpuBackendBuilder::exact_decode(false)`
//! selects this path (the f32 one is the default).

use half::f16;

use super::fields::{Iq4Nl, LevelTable, Mxfp4};
#[cfg(target_arch = "x86_64")]
use super::{int_avx2, int_vnni};
use super::{QK, QK_K};
use crate::dtype::DType;

/// One x row quantized for the integer dots (see the module docs).
#[derive(Debug, Clone)]
pub struct Q8Row {
    /// The weight format it was quantized for (its block size and `bias` depend on it).
    pub dtype: DType,
    /// The 8-bit values, one per element of x.
    pub q: Vec<i8>,
    /// The scale of each block (32 or 256 elements).
    pub d: Vec<f32>,
    /// Per run of 32, `Σx̃ = d·Σq` (Q4_1's offsets).
    pub xsum: Vec<f32>,
    /// Per run of 32, the integer sum of q (the K formats' offsets).
    pub qsum: Vec<i32>,
    /// 32-blocks: per group of 4 elements (one i32 lane), `−2^s·Σq` for the offset `2^s`
    /// that makes the weights unsigned for `vpdpbusd` ([`weight_offset_shift`]), padded
    /// with 0 to whole pairs of blocks; empty for the K formats.
    pub bias: Vec<i32>,
    /// 32-blocks: per pair of blocks, their two scales each repeated 8 times (the lanes
    /// of a 512-bit accumulator; 0 for a missing odd block); empty for the K formats.
    pub d16: Vec<f32>,
}

/// Whether `dtype` has an integer kernel here, and which activation block it needs
/// (32 or 256 elements).
pub fn activation_block(dtype: DType) -> Option<usize> {
    crate::spec::quant::int_activation_block(dtype)
}

/// The 32-block formats' offset `2^s` that makes a weight unsigned: Q8_0 (−128..127) s = 7,
/// Q4_0 (−8..7) 3, Q5_0 (−16..15) 4, IQ4_NL (−127..113) and MXFP4 (−12..12) 7, Q4_1
/// (0..15) none; `None` for the K formats.
pub fn weight_offset_shift(dtype: DType) -> Option<u32> {
    match dtype {
        DType::Q8_0 | DType::IQ4NL | DType::MXFP4 => Some(7),
        DType::Q4_0 => Some(3),
        DType::Q5_0 => Some(4),
        DType::Q4_1 => Some(0),
        _ => None,
    }
}

/// Quantizes `x` (whole activation blocks of `dtype`, a format with an integer kernel)
/// for the integer dots with `dtype` weights.
pub fn quantize_row(x: &[f32], dtype: DType) -> Q8Row {
    #[cfg(target_arch = "x86_64")]
    if let Some(row) = int_vnni::quantize_row(x, dtype) {
        return row;
    }
    quantize_row_portable(x, dtype)
}

/// [`quantize_row`] in plain loops (the twin of the SIMD form).
fn quantize_row_portable(x: &[f32], dtype: DType) -> Q8Row {
    let block = activation_block(dtype).unwrap_or(QK);
    let mut row = Q8Row {
        dtype,
        q: vec![0; x.len()],
        d: Vec::with_capacity(x.len() / block),
        xsum: Vec::with_capacity(x.len() / QK),
        qsum: Vec::with_capacity(x.len() / QK),
        bias: Vec::new(),
        d16: Vec::new(),
    };
    for (xs, qs) in x.chunks_exact(block).zip(row.q.chunks_exact_mut(block)) {
        let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (q, &v) in qs.iter_mut().zip(xs) {
            // |v·id| ≤ 127 up to rounding; the clamp keeps a NaN or a rounding overshoot in range.
            *q = (v * id).round().clamp(-127.0, 127.0) as i8;
        }
        row.d.push(d);
    }
    for (r, qs) in row.q.chunks_exact(QK).enumerate() {
        let qsum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        row.xsum.push(row.d[r * QK / block] * qsum as f32);
        row.qsum.push(qsum);
    }
    if let (Some(s), QK) = (weight_offset_shift(dtype), block) {
        row.bias.extend(row.q.chunks_exact(4).map(|g| -(g.iter().map(|&q| i32::from(q)).sum::<i32>() << s)));
        row.bias.resize(16 * row.d.len().div_ceil(2), 0);
        for pair in row.d.chunks(2) {
            let second = pair.get(1).copied().unwrap_or(0.0);
            row.d16.extend([pair[0]; 8].into_iter().chain([second; 8]));
        }
    }
    row
}

/// Bytes of one block of `dtype` (those with an integer kernel).
fn block_bytes(dtype: DType) -> usize {
    match dtype {
        DType::Q8_0 => 34,
        DType::Q4_0 => 18,
        DType::Q4_1 => 20,
        DType::Q5_0 => 22,
        DType::IQ4NL => Iq4Nl::BYTES,
        DType::MXFP4 => Mxfp4::BYTES,
        DType::Q4K => 144,
        DType::Q5K => 176,
        DType::Q6K => 210,
        _ => 0,
    }
}

/// `out[r·m + i] = Σ_j xs[i][j]·W[r, j]` for the rows r of `w` (whole rows of `dtype`
/// blocks) and the `m = xs.len()` x rows given quantized (from [`quantize_row`] for
/// `dtype`). Each result has the bits it gets with that x row alone: the AVX-512 VNNI
/// kernels decode a weight block once for up to 8 x rows, the AVX2 ones for up to 4 (the
/// 32-block formats; the K formats take each x row in turn there). Returns false, doing nothing, for a format without an
/// integer kernel, an x row quantized for another format, or sizes that do not fit.
pub fn int_rows_multi(dtype: DType, w: &[u8], xs: &[Q8Row], out: &mut [f32]) -> bool {
    if !fits_all(dtype, w, xs, out.len()) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if int_vnni::int_rows_multi(dtype, w, xs, out) || int_avx2::int_rows_multi(dtype, w, xs, out) {
        return true;
    }
    let m = xs.len();
    if m == 1 {
        let row_bytes = w.len() / out.len().max(1);
        for (o, row) in out.iter_mut().zip(w.chunks_exact(row_bytes.max(1))) {
            *o = twin::row(dtype, row, &xs[0]);
        }
        return true;
    }
    // Each x row against all of `w` (which stays in cache between them), then scattered.
    let mut col = vec![0.0f32; out.len() / m];
    for (i, xq) in xs.iter().enumerate() {
        int_rows_multi(dtype, w, std::slice::from_ref(xq), &mut col);
        for (outs, &v) in out.chunks_exact_mut(m).zip(&col) {
            outs[i] = v;
        }
    }
    true
}

/// Whether `w` holds exactly `rows` rows of `dtype` blocks as long as `xq`, and `xq`
/// is quantized in the layout `dtype` needs (the bounds the kernels read).
fn fits(dtype: DType, w: &[u8], xq: &Q8Row, rows: usize) -> bool {
    let Some(block) = activation_block(dtype) else { return false };
    let k = xq.q.len();
    xq.dtype == dtype
        && k.is_multiple_of(block)
        && xq.d.len() == k / block
        && xq.xsum.len() == k / QK
        && xq.qsum.len() == k / QK
        && xq.bias.len() == if block == QK { 16 * (k / QK).div_ceil(2) } else { 0 }
        && xq.d16.len() == if block == QK { 16 * (k / QK).div_ceil(2) } else { 0 }
        && w.len() == rows * (k / block) * block_bytes(dtype)
}

/// Whether `out_len` outputs are whole rows of `w` times `xs.len()` (at least one) x rows,
/// each of which `fits`.
pub(super) fn fits_all(dtype: DType, w: &[u8], xs: &[Q8Row], out_len: usize) -> bool {
    let m = xs.len();
    m > 0 && out_len.is_multiple_of(m) && xs.iter().all(|xq| fits(dtype, w, xq, out_len / m))
}

/// The little-endian f16 at `b[at..at + 2]` as f32.
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Lanes 0..16 added as the SIMD reductions do: l + 8, then [`tree8`].
#[inline(always)]
pub(crate) fn tree16(acc: &[f32; 16]) -> f32 {
    let mut v = [0.0f32; 8];
    for l in 0..8 {
        v[l] = acc[l] + acc[l + 8];
    }
    tree8(&v)
}

/// Lanes 0..8 added as the AVX2 reduction does: l + 4, then l + 2, then 0 + 1.
#[inline(always)]
pub(crate) fn tree8(acc: &[f32; 8]) -> f32 {
    let mut v = *acc;
    for width in [4, 2, 1] {
        for l in 0..width {
            v[l] += v[l + width];
        }
    }
    v[0]
}

/// The portable twin: integer lanes in plain loops, f32 steps in the kernels' order.
pub(crate) mod twin {
    use super::super::scale_min_k4;
    use super::*;

    /// `lanes[l] += scale·Σ w[e]·q[e]` over the elements e of a run of 32 with
    /// `e / 4 == l`; `scale(e)` is the weight's integer scale of element e.
    #[inline(always)]
    fn add_lanes(lanes: &mut [i32; 8], w: &[i32; 32], q: &[i8], scale: impl Fn(usize) -> i32) {
        for e in 0..32 {
            lanes[e / 4] += scale(e) * w[e] * i32::from(q[e]);
        }
    }

    /// The 32 levels and the scale of an IQ4_NL / MXFP4 block.
    #[inline(always)]
    fn table_block<T: LevelTable>(blk: &[u8], w: &mut [i32; 32]) -> f32 {
        for j in 0..16 {
            w[j] = i32::from(T::VALUES[usize::from(blk[T::QS_AT + j] & 0x0F)]);
            w[j + 16] = i32::from(T::VALUES[usize::from(blk[T::QS_AT + j] >> 4)]);
        }
        T::scale(blk)
    }

    /// One row of `dtype` blocks dotted with `xq`.
    pub fn row(dtype: DType, row: &[u8], xq: &Q8Row) -> f32 {
        match dtype {
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::IQ4NL | DType::MXFP4 => {
                let bb = block_bytes(dtype);
                let (mut acc, mut off) = ([0.0f32; 16], [0.0f32; 2]);
                for (b, blk) in row.chunks_exact(bb).enumerate() {
                    let mut w = [0i32; 32];
                    let dw = match dtype {
                        DType::IQ4NL => table_block::<Iq4Nl>(blk, &mut w),
                        DType::MXFP4 => table_block::<Mxfp4>(blk, &mut w),
                        _ => f16_at(blk, 0),
                    };
                    match dtype {
                        DType::IQ4NL | DType::MXFP4 => {}
                        DType::Q8_0 => {
                            for (j, v) in w.iter_mut().enumerate() {
                                *v = i32::from(blk[2 + j] as i8);
                            }
                        }
                        DType::Q4_0 | DType::Q4_1 => {
                            let (qs, sub) = if dtype == DType::Q4_1 { (&blk[4..20], 0) } else { (&blk[2..18], 8) };
                            for j in 0..16 {
                                w[j] = i32::from(qs[j] & 0x0F) - sub;
                                w[j + 16] = i32::from(qs[j] >> 4) - sub;
                            }
                        }
                        _ => {
                            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                            for j in 0..16 {
                                w[j] = i32::from(blk[6 + j] & 0x0F) + 16 * ((qh >> j) & 1) as i32 - 16;
                                w[j + 16] = i32::from(blk[6 + j] >> 4) + 16 * ((qh >> (j + 16)) & 1) as i32 - 16;
                            }
                        }
                    }
                    let mut lanes = [0i32; 8];
                    add_lanes(&mut lanes, &w, &xq.q[QK * b..QK * b + QK], |_| 1);
                    let (d, h) = (dw * xq.d[b], b % 2);
                    for l in 0..8 {
                        acc[8 * h + l] = d.mul_add(lanes[l] as f32, acc[8 * h + l]);
                    }
                    if dtype == DType::Q4_1 {
                        off[h] = f16_at(blk, 2).mul_add(xq.xsum[b], off[h]);
                    }
                }
                tree16(&acc) + (off[0] + off[1])
            }
            DType::Q4K | DType::Q5K => {
                let bb = block_bytes(dtype);
                let (mut acc, mut off) = ([0.0f32; 8], [0.0f32; 8]);
                for (sb, blk) in row.chunks_exact(bb).enumerate() {
                    let (scales, qs_at) = (&blk[4..16], if dtype == DType::Q5K { 48 } else { 16 });
                    let mut lanes = [0i32; 8];
                    let mins: [i32; 8] =
                        std::array::from_fn(|s| i32::from(scale_min_k4(s, scales).1) * xq.qsum[8 * sb + s]);
                    for s in 0..8 {
                        let (sc, _) = scale_min_k4(s, scales);
                        let (pair, high) = (s / 2, s % 2 == 1);
                        let mut w = [0i32; 32];
                        for (l, v) in w.iter_mut().enumerate() {
                            let byte = blk[qs_at + 32 * pair + l];
                            let nib = if high { byte >> 4 } else { byte & 0x0F };
                            let bit = if dtype == DType::Q5K { (blk[16 + l] >> s) & 1 } else { 0 };
                            *v = i32::from(nib | (bit << 4));
                        }
                        let at = QK_K * sb + 32 * s;
                        add_lanes(&mut lanes, &w, &xq.q[at..at + 32], |_| i32::from(sc));
                    }
                    let dx = xq.d[sb];
                    let d = f16_at(blk, 0) * dx;
                    for l in 0..8 {
                        acc[l] = d.mul_add(lanes[l] as f32, acc[l]);
                    }
                    let c = f16_at(blk, 2) * dx;
                    for (o, &m) in off.iter_mut().zip(&mins) {
                        *o = c.mul_add(m as f32, *o);
                    }
                }
                tree8(&std::array::from_fn(|l| acc[l] - off[l]))
            }
            DType::Q6K => {
                let mut acc = [0.0f32; 8];
                for (sb, blk) in row.chunks_exact(210).enumerate() {
                    let mut lanes = [0i32; 8];
                    for half in 0..2 {
                        let (ql, qh, sc) = (&blk[64 * half..], &blk[128 + 32 * half..], &blk[192 + 8 * half..]);
                        for g in 0..4 {
                            let mut w = [0i32; 32];
                            for (l, v) in w.iter_mut().enumerate() {
                                let byte = ql[l + 32 * (g % 2)];
                                let nib = if g < 2 { byte & 0x0F } else { byte >> 4 };
                                *v = i32::from(nib | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
                            }
                            let at = QK_K * sb + 128 * half + 32 * g;
                            add_lanes(&mut lanes, &w, &xq.q[at..at + 32], |e| i32::from(sc[2 * g + e / 16] as i8));
                        }
                    }
                    let d = f16_at(blk, 208) * xq.d[sb];
                    for l in 0..8 {
                        acc[l] = d.mul_add(lanes[l] as f32, acc[l]);
                    }
                }
                tree8(&acc)
            }
            _ => f32::NAN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::dequantize_row_into;
    use super::super::encode::quantize_into;
    use super::*;

    use super::super::test_data::{values, FORMATS};

    /// The integer dot is the f32 dot of the dequantized row with the dequantized x up to
    /// f32 rounding: checked against an f64 sum of the same integer-valued products.
    #[test]
    fn the_twin_computes_the_dot_of_the_dequantized_operands() {
        let (k, rows) = (512, 5);
        for dtype in FORMATS {
            let block = activation_block(dtype).unwrap();
            let x = values(k, 7);
            let xq = quantize_row(&x, dtype);
            let wf = values(rows * k, 11);
            let mut wb = vec![0u8; dtype.storage_bytes(rows * k)];
            quantize_into(dtype, &wf, &mut wb);
            let row_bytes = dtype.storage_bytes(k);
            for r in 0..rows {
                let row = &wb[r * row_bytes..(r + 1) * row_bytes];
                let mut wd = vec![0.0f32; k];
                dequantize_row_into(dtype, row, &mut wd).unwrap();
                let xd: Vec<f64> = (0..k).map(|j| f64::from(xq.q[j]) * f64::from(xq.d[j / block])).collect();
                let want: f64 = wd.iter().zip(&xd).map(|(&w, &x)| f64::from(w) * x).sum();
                let got = f64::from(twin::row(dtype, row, &xq));
                let scale: f64 = wd.iter().zip(&xd).map(|(&w, &x)| (f64::from(w) * x).abs()).sum();
                assert!((got - want).abs() <= 1e-5 * scale + 1e-6, "{dtype} row {r}: {got} vs {want}");
                // And close to the exact f32 dot (activation rounding only).
                let exact: f64 = wd.iter().zip(&x).map(|(&w, &x)| f64::from(w) * f64::from(x)).sum();
                assert!((got - exact).abs() <= 0.02 * scale, "{dtype} row {r}: {got} vs exact {exact}");
            }
        }
    }

    /// The SIMD kernels give the twin's bits, over several row lengths, rows and seeds.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_simd_kernels_give_the_twins_bits() {
        for dtype in FORMATS {
            let block = activation_block(dtype).unwrap();
            for (k, rows, seed) in [(block, 3, 1), (4 * block, 7, 2), (9 * block, 2, 3)] {
                let x = values(k, seed);
                let xq = quantize_row(&x, dtype);
                let wf = values(rows * k, seed + 100);
                let mut wb = vec![0u8; dtype.storage_bytes(rows * k)];
                quantize_into(dtype, &wf, &mut wb);
                let mut simd_out = vec![0.0f32; rows];
                if !int_avx2::int_rows_multi(dtype, &wb, std::slice::from_ref(&xq), &mut simd_out) {
                    println!("skipping {dtype}: no SIMD integer kernel on this CPU");
                    continue;
                }
                let row_bytes = dtype.storage_bytes(k);
                for r in 0..rows {
                    let want = twin::row(dtype, &wb[r * row_bytes..(r + 1) * row_bytes], &xq);
                    assert_eq!(simd_out[r].to_bits(), want.to_bits(), "{dtype} k={k} row {r}");
                }
            }
        }
    }

    /// The multi-row kernels (AVX-512 VNNI, AVX2, and the dispatch over them) give the
    /// twin's bits for every number of x rows up to 16 (their groups of 8, 4, 2 and 1),
    /// odd W row counts, and odd block counts (a half-empty last pair of 32-blocks; one,
    /// three and five K super-blocks).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_multi_row_kernels_give_the_twins_bits_for_any_number_of_x_rows() {
        type Kernel = fn(DType, &[u8], &[Q8Row], &mut [f32]) -> bool;
        let kernels: [(&str, Kernel); 3] = [
            ("AVX-512 VNNI", int_vnni::int_rows_multi),
            ("AVX2", int_avx2::int_rows_multi),
            ("dispatch", int_rows_multi),
        ];
        for (name, kernel) in kernels {
            for dtype in FORMATS {
                let block = activation_block(dtype).unwrap();
                let nb_rows_m = [(1, 3, 1), (4, 5, 3), (9, 4, 8), (18, 2, 13), (3, 3, 16), (5, 7, 5), (1, 1, 2)];
                for (nb, rows, m) in nb_rows_m {
                    // As many elements for the K formats as for the 32-block ones, in whole super-blocks.
                    let k = if block == QK { nb * QK } else { nb.div_ceil(2) * QK_K };
                    let xs: Vec<Q8Row> = (0..m).map(|i| quantize_row(&values(k, 40 + i as u32), dtype)).collect();
                    let wf = values(rows * k, 7 + m as u32);
                    let mut wb = vec![0u8; dtype.storage_bytes(rows * k)];
                    quantize_into(dtype, &wf, &mut wb);
                    let mut got = vec![0.0f32; rows * m];
                    if !kernel(dtype, &wb, &xs, &mut got) {
                        println!("skipping {dtype}, m={m}: {name} has no kernel for it (on this CPU)");
                        continue;
                    }
                    let row_bytes = dtype.storage_bytes(k);
                    for r in 0..rows {
                        for (i, xq) in xs.iter().enumerate() {
                            let want = twin::row(dtype, &wb[r * row_bytes..(r + 1) * row_bytes], xq);
                            assert_eq!(
                                got[r * m + i].to_bits(),
                                want.to_bits(),
                                "{name} {dtype} k={k} m={m} row {r} x {i}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The K kernels on weights at the edges of their ranges: every Q4_K/Q5_K nibble and
    /// fifth bit set (15, 31) and Q6_K's −32 and 31 with scales of ±127 and −128, against
    /// activations of ±127, where an i16 pair sum is largest. Random bytes fill the blocks
    /// (any byte pattern is a valid block, scales and mins included) with their f16
    /// scales set to finite values.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_vnni_k_kernels_give_the_twins_bits_at_the_extremes_of_the_weights() {
        for dtype in [DType::Q4K, DType::Q5K, DType::Q6K] {
            let (k, rows) = (3 * QK_K, 6);
            let bb = block_bytes(dtype);
            let mut wb: Vec<u8> = values(rows * k / QK_K * bb, 9).iter().map(|v| (v.to_bits() >> 7) as u8).collect();
            for (i, blk) in wb.chunks_exact_mut(bb).enumerate() {
                let scale_at = if dtype == DType::Q6K { 208 } else { 0 };
                blk[scale_at..scale_at + 2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
                if dtype != DType::Q6K {
                    blk[2..4].copy_from_slice(&f16::from_f32(0.003).to_le_bytes());
                }
                // Every other super-block at the extremes.
                if i % 2 == 0 {
                    match dtype {
                        DType::Q6K => {
                            let fill = if i % 4 == 0 { 0x00 } else { 0xFF }; // q − 32 = −32 or 31
                            blk[..192].fill(fill);
                            for (s, sc) in blk[192..208].iter_mut().enumerate() {
                                *sc = [127u8, 0x80, 0x81, 1][s % 4];
                            }
                        }
                        _ => blk[4..bb].fill(0xFF),
                    }
                }
            }
            let mut x = values(k, 21);
            for (j, v) in x.iter_mut().enumerate() {
                if j % 3 != 0 {
                    *v = if j % 2 == 0 { 2.0 } else { -2.0 };
                }
            }
            let xs = [quantize_row(&x, dtype), quantize_row(&x.iter().map(|v| -v).collect::<Vec<_>>(), dtype)];
            let mut got = vec![0.0f32; rows * 2];
            if !int_vnni::int_rows_multi(dtype, &wb, &xs, &mut got) {
                println!("skipping {dtype}: no AVX-512 VNNI on this CPU");
                continue;
            }
            let row_bytes = dtype.storage_bytes(k);
            for r in 0..rows {
                for (i, xq) in xs.iter().enumerate() {
                    let want = twin::row(dtype, &wb[r * row_bytes..(r + 1) * row_bytes], xq);
                    assert!(want.is_finite(), "{dtype} row {r}");
                    assert_eq!(got[2 * r + i].to_bits(), want.to_bits(), "{dtype} row {r} x {i}");
                }
            }
        }
    }

    /// The AVX-512 quantizer gives the portable one's every field, bit for bit, ties
    /// (x·(1/d) = k + ½), NaN and infinities included, in blocks of 32 and of 256.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_simd_quantizer_gives_the_portable_ones_bits() {
        let mut x = values(QK_K * 4, 3);
        // Block 0: d = 1 exactly, with ties both ways; block 1: a NaN; block 2: an
        // infinity (so super-block 0 has them all); super-block 2: a NaN alone; super-block
        // 3: zeros.
        x[0] = 127.0;
        x[1..7].copy_from_slice(&[2.5, -2.5, 0.5, -0.5, 126.5, -3.5]);
        x[40] = f32::NAN;
        x[70] = f32::NEG_INFINITY;
        x[2 * QK_K + 5] = f32::NAN;
        x[3 * QK_K..].fill(0.0);
        // Super-block 1: d = 1 exactly, ties.
        x[QK_K] = -127.0;
        x[QK_K + 1..QK_K + 5].copy_from_slice(&[1.5, -1.5, 100.5, -0.5]);
        for dtype in FORMATS {
            let Some(simd) = int_vnni::quantize_row(&x, dtype) else {
                println!("skipping: no AVX-512 VNNI on this CPU");
                return;
            };
            let want = quantize_row_portable(&x, dtype);
            assert_eq!(simd.q, want.q, "{dtype}");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&simd.d), bits(&want.d), "{dtype}");
            assert_eq!(bits(&simd.xsum), bits(&want.xsum), "{dtype}");
            assert_eq!(bits(&simd.d16), bits(&want.d16), "{dtype}");
            assert_eq!((&simd.qsum, &simd.bias), (&want.qsum, &want.bias), "{dtype}");
        }
        assert_eq!(&quantize_row_portable(&x, DType::Q8_0).q[..7], &[127, 3, -3, 1, -1, 127, -4]);
        assert_eq!(&quantize_row_portable(&x, DType::Q4K).q[QK_K..QK_K + 5], &[-127, 2, -2, 101, -1]);
    }

    #[test]
    fn the_activation_rounds_to_at_most_127_levels_per_block() {
        let x = values(256, 5);
        let xq = quantize_row(&x, DType::Q4_0);
        for (b, xs) in x.chunks(32).enumerate() {
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert_eq!(xq.d[b], amax / 127.0);
            for (j, &v) in xs.iter().enumerate() {
                let q = xq.q[32 * b + j];
                assert!((f32::from(q) * xq.d[b] - v).abs() <= 0.5 * xq.d[b] * 1.0001);
            }
        }
    }
}
