//! Quantizers of one super-block of 256 (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS), each
//! ggml's reference quantizer step for step in the same f32 operation order (see
//! [`quantize`](super::quantize)).

use super::encode::{nearest_int, put_f16, GROUP_MAX_EPS};
use super::encode_32::{best_index_int8, iq4_fit, put_nibbles32};
use super::fields::{f16_at, q3_k_scales, scale_min_k4, IQ4NL_VALUES};
use super::{QK, QK_K};

/// ggml's `make_qkx2_quants` with its Q4_K arguments: fits `x ≈ scale·L − min` (L in
/// 0..=nmax, min ≥ 0) minimising the `weights`-weighted squared error, starting from the
/// plain min/max grid and trying `nstep + 1` nearby grids (`rmin + rdelta·is` extra levels),
/// each refined by weighted least squares. Returns `(scale, min)`; `levels` gets L.
#[inline(always)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        min = min.min(x[i]);
        max = max.max(x[i]);
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    let level = |iscale: f32, v: f32, min: f32| nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;
    // ggml weighs |diff| (`use_mad`) or diff², then multiplies by the weight.
    let error_of = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        levels[i] = level(iscale, x[i], min);
        best_error += weights[i] * error_of(scale * f32::from(levels[i]) + min - x[i]);
    }
    let mut trial = [0u8; QK];
    let trial = &mut trial[..n];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            trial[i] = level(iscale, x[i], min);
            let (w, l) = (weights[i], f32::from(trial[i]));
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut error = 0.0f32;
            for i in 0..n {
                error += weights[i] * error_of(this_scale * f32::from(trial[i]) + this_min - x[i]);
            }
            if error < best_error {
                levels.copy_from_slice(trial);
                best_error = error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Quantizes the 8 sub-block scales and mins of a Q4_K / Q5_K block to 6 bits against
/// the largest of each (`63/max`) and packs them into the 12 bytes `packed` (the layout
/// [`scale_min_k4`] reads).
#[inline(always)]
fn pack_k4_scales(scales: &[f32; 8], mins: &[f32; 8], max_scale: f32, max_min: f32, packed: &mut [u8]) {
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    packed.fill(0);
    for j in 0..8 {
        let ls = nearest_int(inv_scale * scales[j]).clamp(0, 63) as u8;
        let lm = nearest_int(inv_min * mins[j]).clamp(0, 63) as u8;
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
}

/// The shared part of the Q4_K and Q5_K quantizers (`quantize_row_q{4,5}_K_ref`): per
/// sub-block of 32 a weighted (weights `√mean(x²) + |x|`) scale/min fit with `nmax + 1`
/// levels (`make_qkx2_quants(nmax, …, rmin, 0.1, nstep)`); the 8 scales and mins are
/// quantized to 6 bits against the largest (`d = max_scale/63`, `dmin = max_min/63`) into
/// `head` (d, dmin, 12 scale bytes), and the levels recomputed with the scales as stored.
#[inline(always)]
fn k4_header_and_levels(x: &[f32], head: &mut [u8], nmax: i32, rmin: f32, nstep: i32) -> [u8; QK_K] {
    let mut levels = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let av_x = (xs.iter().map(|v| v * v).sum::<f32>() / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|l| av_x + xs[l].abs());
        let (scale, min) =
            make_qkx2_quants(nmax, xs, &weights, &mut levels[32 * j..32 * j + 32], rmin, 0.1, nstep, false);
        scales[j] = scale;
        mins[j] = min;
        max_scale = max_scale.max(scale);
        max_min = max_min.max(min);
    }
    pack_k4_scales(&scales, &mins, max_scale, max_min, &mut head[4..16]);
    let d = put_f16(head, 0, max_scale / 63.0);
    let dmin = put_f16(head, 2, max_min / 63.0);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &head[4..16]);
        let dj = d * f32::from(sc);
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * f32::from(m);
        for ii in 0..32 {
            levels[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    levels
}

/// `quantize_row_q4_K_ref`: [`k4_header_and_levels`] with 16 levels (`rmin = −1`, `nstep = 20`),
/// two 4-bit levels a byte.
#[inline(always)]
pub(super) fn quantize_q4_k_block(x: &[f32], out: &mut [u8]) {
    let levels = k4_header_and_levels(x, &mut out[..16], 15, -1.0, 20);
    let qs = &mut out[16..144];
    for pair in 0..4 {
        for l in 0..32 {
            qs[32 * pair + l] = levels[64 * pair + l] | (levels[64 * pair + l + 32] << 4);
        }
    }
}

/// ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights: a signed scale
/// for `x ≈ scale·(L − nmax)` (L in 0..2·nmax) maximising `(Σ w·x·l)²/Σ w·l²` with
/// `w = x²`, over 19 grids around `−nmax/max`. Returns the scale; `levels` gets L.
#[inline(always)]
fn make_qx_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let l = level(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let assign = |iscale: f32, levels: &mut [i8]| {
        for (slot, &v) in levels.iter_mut().zip(x) {
            *slot = (nmax + level(iscale, v)) as i8;
        }
    };
    let iscale = -(nmax as f32) / max;
    assign(iscale, levels);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            assign(iscale, levels);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `quantize_row_q6_K_ref`: a signed scale per sub-block of 16 (`make_qx_quants`, 32
/// levels each side), the 16 scales quantized to i8 against the largest in magnitude
/// (`d = −max_scale/128`), then the 6-bit levels recomputed with the stored scales.
#[inline(always)]
pub(super) fn quantize_q6_k_block(x: &[f32], out: &mut [u8]) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for ib in 0..16 {
        let scale = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut levels[16 * ib..16 * ib + 16]);
        scales[ib] = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    out.fill(0);
    if max_abs_scale < GROUP_MAX_EPS {
        return; // all zeros: d = 0 and every field 0
    }
    let iscale = -128.0 / max_scale;
    let d = put_f16(out, 208, 1.0 / iscale);
    let mut stored = [0i8; 16];
    for ib in 0..16 {
        stored[ib] = nearest_int(iscale * scales[ib]).clamp(-128, 127) as i8;
        out[192 + ib] = stored[ib] as u8;
    }
    for j in 0..16 {
        let dj = d * f32::from(stored[j]);
        if dj == 0.0 {
            continue;
        }
        for ii in 0..16 {
            levels[16 * j + ii] = (nearest_int(x[16 * j + ii] / dj).clamp(-32, 31) + 32) as i8;
        }
    }
    for half in 0..2 {
        let l6 = |i: usize| levels[128 * half + i] as u8;
        for l in 0..32 {
            out[64 * half + l] = (l6(l) & 0x0F) | ((l6(l + 64) & 0x0F) << 4);
            out[64 * half + l + 32] = (l6(l + 32) & 0x0F) | ((l6(l + 96) & 0x0F) << 4);
            out[128 + 32 * half + l] =
                (l6(l) >> 4) | ((l6(l + 32) >> 4) << 2) | ((l6(l + 64) >> 4) << 4) | ((l6(l + 96) >> 4) << 6);
        }
    }
}

/// ggml's `quantize_iq4_xs` without importance weights: a scale per sub-block of 32 from
/// [`iq4_fit`], the 8 scales quantized to signed 6 bits against the largest in magnitude
/// (`d = −max_scale/32`), the indices recomputed against each `d·l` (unrounded `d`).
#[inline(always)]
pub(super) fn quantize_iq4_xs_block(x: &[f32], out: &mut [u8]) {
    let mut levels = [0u8; QK];
    let mut scales = [0.0f32; 8];
    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    for ib in 0..8 {
        scales[ib] = iq4_fit(&x[32 * ib..32 * ib + 32], &mut levels);
        if scales[ib].abs() > amax_scale {
            amax_scale = scales[ib].abs();
            max_scale = scales[ib];
        }
    }
    out.fill(0);
    let d = -max_scale / 32.0;
    put_f16(out, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut scales_h = 0u16;
    for ib in 0..8 {
        let l = nearest_int(id * scales[ib]).clamp(-32, 31);
        let dl = d * l as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        let xb = &x[32 * ib..32 * ib + 32];
        for (slot, &v) in levels.iter_mut().zip(xb) {
            *slot = best_index_int8(&IQ4NL_VALUES, idl * v);
        }
        put_nibbles32(&levels, &mut out[8 + 16 * ib..8 + 16 * ib + 16]);
        let l = (l + 32) as u8;
        out[4 + ib / 2] |= (l & 0x0F) << (4 * (ib % 2));
        scales_h |= u16::from(l >> 4) << (2 * ib);
    }
    out[2..4].copy_from_slice(&scales_h.to_le_bytes());
}

/// Packs 256 2-bit values (the low 2 bits of `levels`) as Q2_K / Q3_K do: element
/// 128h + 32j + l goes to bits 2j.. of byte 32h + l.
#[inline(always)]
fn put_2bit_levels(levels: &[u8], qs: &mut [u8]) {
    for h in 0..2 {
        for l in 0..32 {
            let at = 128 * h + l;
            qs[32 * h + l] = levels[at] | (levels[at + 32] << 2) | (levels[at + 64] << 4) | (levels[at + 96] << 6);
        }
    }
}

/// `quantize_row_q2_K_ref`: per sub-block of 16 a `|x|`-weighted scale/min fit with 4
/// levels (`make_qkx2_quants`, absolute error); scales and mins quantized to 4 bits
/// against the block's largest (`d = max_scale/15`, `dmin = max_min/15`), then the
/// levels recomputed with the stored values.
#[inline(always)]
pub(super) fn quantize_q2_k_block(x: &[f32], out: &mut [u8]) {
    let mut levels = [0u8; QK_K];
    let mut scales = [0.0f32; 16];
    let mut mins = [0.0f32; 16];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        let weights: [f32; 16] = std::array::from_fn(|l| xs[l].abs());
        let (scale, min) = make_qkx2_quants(3, xs, &weights, &mut levels[16 * j..16 * j + 16], -0.5, 0.1, 15, true);
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    out.fill(0);
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for j in 0..16 {
            out[j] = nearest_int(iscale * scales[j]) as u8;
        }
        put_f16(out, 80, max_scale / 15.0);
    } else {
        put_f16(out, 80, 0.0);
    }
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for j in 0..16 {
            out[j] |= (nearest_int(iscale * mins[j]) as u8) << 4;
        }
        put_f16(out, 82, max_min / 15.0);
    } else {
        put_f16(out, 82, 0.0);
    }
    let (d, dmin) = (f16_at(out, 80), f16_at(out, 82));
    for j in 0..16 {
        let dj = d * f32::from(out[j] & 0x0F);
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * f32::from(out[j] >> 4);
        for ii in 0..16 {
            levels[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / dj).clamp(0, 3) as u8;
        }
    }
    put_2bit_levels(&levels, &mut out[16..80]);
}

/// ggml's `make_q3_quants` with `do_rmse`: a signed scale for `x ≈ scale·l`
/// (l in −nmax..nmax) starting from `−nmax/max`, then up to 5 passes that move single
/// levels where that raises `(Σ w·x·l)²/Σ w·l²` (w = x²). Returns the scale; `levels`
/// gets l + nmax (0 for an all-zero group).
#[inline(always)]
fn make_q3_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (slot, &v) in levels.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *slot = l as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (slot, &v) in levels.iter_mut().zip(x) {
            let w = v * v;
            let old = f32::from(*slot);
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != i32::from(*slot) {
                    let nl = new_l as f32;
                    slx += w * v * nl;
                    sl2 += w * nl * nl;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *slot = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for slot in levels.iter_mut() {
        *slot += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// `quantize_row_q3_K_ref`: a signed scale per sub-block of 16 (`make_q3_quants`, 8
/// levels), the 16 scales quantized to signed 6 bits against the largest in magnitude
/// (`d = −max_scale/32`), then the levels recomputed with the stored scales; the third
/// bit of each level goes to `hmask`, the low two to `qs`.
#[inline(always)]
pub(super) fn quantize_q3_k_block(x: &[f32], out: &mut [u8]) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut levels[16 * j..16 * j + 16]);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    out.fill(0);
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        let packed = &mut out[96..108];
        for j in 0..16 {
            let l = (nearest_int(iscale * scales[j]).clamp(-32, 31) + 32) as u8;
            if j < 8 {
                packed[j] = l & 0x0F;
            } else {
                packed[j - 8] |= (l & 0x0F) << 4;
            }
            packed[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
        }
        put_f16(out, 108, 1.0 / iscale);
    } else {
        put_f16(out, 108, 0.0);
    }
    let stored = q3_k_scales(&out[96..108]);
    let d = f16_at(out, 108);
    for j in 0..16 {
        let dj = d * f32::from(stored[j]);
        if dj == 0.0 {
            continue;
        }
        for ii in 0..16 {
            levels[16 * j + ii] = (nearest_int(x[16 * j + ii] / dj).clamp(-4, 3) + 4) as i8;
        }
    }
    let mut low = [0u8; QK_K];
    for (i, (&l, slot)) in levels.iter().zip(low.iter_mut()).enumerate() {
        let mut l = l as u8;
        if l > 3 {
            // Element i's high bit: bit i / 32 of hmask[i % 32].
            out[i % 32] |= 1 << (i / 32);
            l -= 4;
        }
        *slot = l;
    }
    put_2bit_levels(&low, &mut out[32..96]);
}

/// `quantize_row_q5_K_ref`: [`k4_header_and_levels`] with 32 levels (`rmin = −0.5`, `nstep = 15`),
/// the fifth bit of each level in `qh`.
#[inline(always)]
pub(super) fn quantize_q5_k_block(x: &[f32], out: &mut [u8]) {
    out.fill(0);
    let levels = k4_header_and_levels(x, &mut out[..16], 31, -0.5, 15);
    let (qh, qs) = out[16..176].split_at_mut(32);
    for pair in 0..4 {
        for l in 0..32 {
            let (l1, l2) = (levels[64 * pair + l], levels[64 * pair + l + 32]);
            qh[l] |= ((l1 >> 4) << (2 * pair)) | ((l2 >> 4) << (2 * pair + 1));
            qs[32 * pair + l] = (l1 & 0x0F) | ((l2 & 0x0F) << 4);
        }
    }
}
