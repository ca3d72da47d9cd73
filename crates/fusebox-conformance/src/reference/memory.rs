//! f64 twins of the memory family: copies, dtype rounding and FP8 E4M3 decoding,
//! written from the definitions of the formats.

use crate::array::Array;

/// `copy`: the same values.
pub fn copy(x: &Array) -> Array {
    x.clone()
}

/// `fill`: every element `value`.
pub fn fill(x: &Array, value: f64) -> Array {
    Array { shape: x.shape.clone(), data: vec![value; x.data.len()] }
}

/// `zeros`: zeros of `shape`.
pub fn zeros(shape: &[usize]) -> Array {
    Array::zeros(shape.to_vec())
}

/// Rounds `v` to the nearest value with `mantissa_bits` fraction bits, exponent at least
/// `min_exp` (below it the spacing stays 2^(min_exp − mantissa_bits): subnormals), ties to
/// the even multiple; results past `max_finite` become ±∞.
pub fn round_to_precision(v: f64, mantissa_bits: i32, min_exp: i32, max_finite: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    // The exponent of |v| read from the f64 bits (every input here is a normal f64).
    let exp = (((v.abs().to_bits() >> 52) & 0x7FF) as i32 - 1023).max(min_exp);
    let step = 2f64.powi(exp - mantissa_bits);
    let scaled = v / step; // exact: a power-of-two division
    let floor = scaled.floor();
    let frac = scaled - floor;
    let rounded = if frac > 0.5 || (frac == 0.5 && floor % 2.0 != 0.0) { floor + 1.0 } else { floor };
    let r = rounded * step;
    // Rounding past the largest finite value means the format overflows.
    if r.abs() > max_finite {
        return f64::INFINITY.copysign(v);
    }
    r
}

/// `cast` to F16: nearest even with 10 fraction bits, subnormals below 2^−14, max 65504.
pub fn cast_to_f16(x: &Array) -> Array {
    x.map(|v| round_to_precision(v, 10, -14, 65504.0))
}

/// `cast` to BF16: nearest even with 7 fraction bits and f32's exponent range.
pub fn cast_to_bf16(x: &Array) -> Array {
    x.map(|v| round_to_precision(v, 7, -126, f32::MAX as f64))
}

/// The value of an FP8 E4M3 ("fn") code: sign bit 7, exponent bits 6–3 (bias 7), mantissa
/// bits 2–0; exponent 0 is subnormal (`2^−6 · m/8`); exponent 15 with mantissa 7 is NaN;
/// there are no infinities.
pub fn f8e4m3_value(code: u8) -> f64 {
    let sign = if code >> 7 == 1 { -1.0 } else { 1.0 };
    let e = ((code >> 3) & 0b1111) as i32;
    let m = (code & 0b111) as f64;
    if e == 15 && m == 7.0 {
        f64::NAN
    } else if e == 0 {
        sign * 2f64.powi(-6) * (m / 8.0)
    } else {
        sign * 2f64.powi(e - 7) * (1.0 + m / 8.0)
    }
}

/// `f8e4m3_to_*`: the value of every code, with `shape`.
pub fn f8e4m3_decode(codes: &[u8], shape: &[usize]) -> Array {
    Array::new(shape.to_vec(), codes.iter().map(|&c| f8e4m3_value(c)).collect())
}
