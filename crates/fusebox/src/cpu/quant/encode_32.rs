//! Quantizers of one block of the 32-element formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
//! IQ4_NL, MXFP4), each ggml's reference quantizer step for step in the same f32
//! operation order (see [`quantize`](super::quantize)). IQ4_XS reuses the IQ4 fit.

use super::encode::{put_f16, GROUP_MAX_EPS};
use super::fields::{e8m0_half, IQ4NL_VALUES, MXFP4_VALUES};
use super::QK;

/// `quantize_row_q8_0_ref`: d = max|x|/127, q = round(x/d) (half away from zero).
#[inline(always)]
pub(super) fn quantize_q8_0_block(x: &[f32], out: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(out, 0, d);
    for (q, &v) in out[2..2 + QK].iter_mut().zip(x) {
        *q = (v * id).round() as i8 as u8;
    }
}

/// The value of largest magnitude in `x` (the first one on ties), as ggml's Q4_0 picks it.
#[inline(always)]
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// `quantize_row_q4_0_ref`: d = max/−8 for the value `max` of largest magnitude, so that
/// value lands exactly on q = 0; q = min(15, trunc(x/d + 8.5)).
#[inline(always)]
pub(super) fn quantize_q4_0_block(x: &[f32], out: &mut [u8]) {
    let d = signed_absmax(x) / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(out, 0, d);
    let nibble = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
    for j in 0..QK / 2 {
        out[2 + j] = nibble(x[j]) | (nibble(x[j + QK / 2]) << 4);
    }
}

/// The block's minimum and maximum as ggml's `_1` quantizers find them (starting from
/// ±FLT_MAX, strict comparisons: a NaN never replaces either).
#[inline(always)]
fn block_min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `quantize_row_q4_1_ref`: d = (max − min)/15, m = min, q = min(15, trunc((x − min)/d + 0.5)).
#[inline(always)]
pub(super) fn quantize_q4_1_block(x: &[f32], out: &mut [u8]) {
    let (min, max) = block_min_max(x);
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(out, 0, d);
    put_f16(out, 2, min);
    let nibble = |v: f32| (((v - min) * id + 0.5) as i32).clamp(0, 15) as u8;
    for j in 0..QK / 2 {
        out[4 + j] = nibble(x[j]) | (nibble(x[j + QK / 2]) << 4);
    }
}

/// Packs the 5-bit levels `q` of a Q5_0 / Q5_1 block: nibbles into `qs` as Q4_0, the
/// fifth bits into the little-endian u32 `qh` (bit j for element j).
#[inline(always)]
fn put_q5_levels(q: &[u8; QK], qh_out: &mut [u8], qs: &mut [u8]) {
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        qs[j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
        qh |= u32::from((q[j] & 0x10) >> 4) << j;
        qh |= u32::from((q[j + 16] & 0x10) >> 4) << (j + 16);
    }
    qh_out.copy_from_slice(&qh.to_le_bytes());
}

/// `quantize_row_q5_0_ref`: d = max/−16 for the value `max` of largest magnitude;
/// q = min(31, trunc(x/d + 16.5)).
#[inline(always)]
pub(super) fn quantize_q5_0_block(x: &[f32], out: &mut [u8]) {
    let d = signed_absmax(x) / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(out, 0, d);
    let q: [u8; QK] = std::array::from_fn(|j| ((x[j] * id + 16.5) as i32).clamp(0, 31) as u8);
    let (qh, qs) = out[2..22].split_at_mut(4);
    put_q5_levels(&q, qh, qs);
}

/// `quantize_row_q5_1_ref`: d = (max − min)/31, m = min, q = trunc((x − min)/d + 0.5).
#[inline(always)]
pub(super) fn quantize_q5_1_block(x: &[f32], out: &mut [u8]) {
    let (min, max) = block_min_max(x);
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(out, 0, d);
    put_f16(out, 2, min);
    // ggml stores the level unclamped through a u8 and keeps 5 bits of it.
    let q: [u8; QK] = std::array::from_fn(|j| (((x[j] - min) * id + 0.5) as i32) as u8);
    let (qh, qs) = out[4..24].split_at_mut(4);
    put_q5_levels(&q, qh, qs);
}

/// ggml's `best_index_int8`: the index of the entry of the ascending `values` nearest to
/// `x` (the upper one on ties), by bisection.
#[inline(always)]
pub(super) fn best_index_int8(values: &[i8; 16], x: f32) -> u8 {
    if x <= f32::from(values[0]) {
        return 0;
    }
    if x >= f32::from(values[15]) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < f32::from(values[mav]) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - f32::from(values[mu - 1]) < f32::from(values[mu]) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// The sub-block fit of ggml's `quantize_row_iq4_nl_impl` without importance weights
/// (weights x², 7 tries each side): the scale d of `x ≈ d·table[L]` maximising
/// `(Σ w·x·q)²/Σ w·q²` over grids `(−127 + t)/max`, t = −7..7, where `max` is the value of
/// largest magnitude. Returns 0 for an all-zero group (and leaves `levels` alone).
#[inline(always)]
pub(super) fn iq4_fit(x: &[f32], levels: &mut [u8]) -> f32 {
    let values = &IQ4NL_VALUES;
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let sums = |id: f32, levels: Option<&mut [u8]>| {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        let mut levels = levels;
        for (j, &v) in x.iter().enumerate() {
            let l = best_index_int8(values, id * v);
            if let Some(levels) = levels.as_deref_mut() {
                levels[j] = l;
            }
            let q = f32::from(values[usize::from(l)]);
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let d = -max / f32::from(values[0]);
    let (sumqx, sumq2) = sums(1.0 / d, Some(levels));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -7..=7 {
        let id = (itry + i32::from(values[0])) as f32 / max;
        let (sumqx, sumq2) = sums(id, None);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs 32 IQ4 indices: element j < 16 in the low nibble of byte j, element j + 16 in
/// its high nibble.
#[inline(always)]
pub(super) fn put_nibbles32(levels: &[u8], qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = levels[j] | (levels[j + 16] << 4);
    }
}

/// ggml's `quantize_iq4_nl` without importance weights (what `ggml_quantize_chunk`
/// writes): the scale from [`iq4_fit`] stored as f16, the indices recomputed against the
/// unrounded scale.
#[inline(always)]
pub(super) fn quantize_iq4_nl_block(x: &[f32], out: &mut [u8]) {
    let mut levels = [0u8; QK];
    let d = iq4_fit(x, &mut levels);
    put_f16(out, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (l, &v) in levels.iter_mut().zip(x) {
        *l = best_index_int8(&IQ4NL_VALUES, id * v);
    }
    put_nibbles32(&levels, &mut out[2..18]);
}

/// ggml's `best_index_mxfp4`: the index of the level `MXFP4_VALUES[i]·d` nearest to `x`,
/// by a scan that keeps the first of equal errors (so 0 becomes index 0, never the
/// negative zero at 8; a NaN, index 0).
#[inline(always)]
fn best_index_mxfp4(x: f32, d: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (f32::from(MXFP4_VALUES[0]) * d - x).abs();
    for (i, &level) in MXFP4_VALUES.iter().enumerate().skip(1) {
        let err = (f32::from(level) * d - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// C's `(uint8_t)` of a float as x86-64 compilers emit it: truncated to a 32-bit integer
/// (`cvttss2si`, which gives `i32::MIN` for NaN and out-of-range values), of which the low
/// byte is kept. ggml relies on it for MXFP4's exponent, which is negative (and wraps)
/// only for blocks whose largest magnitude is below 2⁻¹²⁵.
#[inline(always)]
fn c_float_to_u8(v: f32) -> u8 {
    let i = if v > -2_147_483_648.0 && v < 2_147_483_648.0 { v as i32 } else { i32::MIN };
    i as u8
}

/// `quantize_row_mxfp4_ref`: the shared exponent `e = floor(log2(max|x|)) − 2 + 127`
/// (0 for an all-zero block), so that the block's largest magnitude lands in the top
/// binade of the levels (4·2^(e−127) ≤ max|x| < 8·2^(e−127), the largest level being 6);
/// each element the nearest level of `2^(e − 128)·MXFP4_VALUES` ([`best_index_mxfp4`]).
#[inline(always)]
pub(super) fn quantize_mxfp4_block(x: &[f32], out: &mut [u8]) {
    let mut amax = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
        }
    }
    let e = if amax > 0.0 { c_float_to_u8(amax.log2().floor() - 2.0 + 127.0) } else { 0 };
    let d = e8m0_half(e);
    out[0] = e;
    for j in 0..QK / 2 {
        out[1 + j] = best_index_mxfp4(x[j], d) | (best_index_mxfp4(x[j + QK / 2], d) << 4);
    }
}
