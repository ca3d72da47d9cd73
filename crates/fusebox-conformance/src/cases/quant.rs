//! Cases of the quant family: `dequantize` against the twin's reading of the same bytes,
//! `quantize` by its round-trip error, hand-worked blocks and FP8 rounding, and
//! `quantized_matmul` against `x · dequant(W)ᵀ` in f64, and `quantized_matmul_backward`
//! against `dy · dequant(W)`, for every format.

use fusebox::{ComputeBackend, DType, Op, Shape, Tensor};

use crate::array::Array;
use crate::case::catch;
use crate::case::{Case, CaseKind};
use crate::cases::memory::{foreign_tensor, forward_case, host_bytes, host_values, ok, upload_all};
use crate::reference::memory::f8e4m3_value;
use crate::reference::quant as twin;
use crate::rng::Rng;
use crate::tolerance::Tolerance;

/// The GGUF block formats.
const BLOCK_FORMATS: [DType; 13] = [
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::IQ4NL,
    DType::MXFP4,
    DType::Q2K,
    DType::Q3K,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::IQ4XS,
];

/// The formats whose `quantize` round trip is checked against a per-group error bound
/// ([`error_bound`]); every format's blocks are also compared byte for byte with
/// llama.cpp's on the recorded fixtures ([`fixture_cases`]).
const ROUND_TRIP_FORMATS: [DType; 9] =
    [DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::MXFP4, DType::Q4K, DType::Q5K, DType::Q6K];

/// Dequantization is exact up to one or two f32 roundings.
const DECODE_TOLERANCE: Tolerance = Tolerance { abs: 1e-6, rel: 1e-6 };

/// Every case of the family.
pub fn cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut v = Vec::new();
    v.extend(dequantize_cases());
    v.extend(quantize_cases());
    v.extend(matmul_cases());
    v.extend(matmul_backward_cases());
    v.extend(fixture_cases());
    v
}

/// The little-endian bytes of `v` as f16.
fn f16_bytes(v: f64) -> [u8; 2] {
    half::f16::from_f64(v).to_le_bytes()
}

/// A tensor of `dtype` with random bytes everywhere except the scale fields, which get
/// finite values chosen so that elements stay within about ±2 (every quant bit pattern,
/// every packed 6-bit scale and every sign of the i8 scales occurs).
fn random_blocks(rng: &mut Rng, dtype: DType, dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    let mut bytes: Vec<u8> = (0..dtype.storage_bytes(n)).map(|_| rng.below(256) as u8).collect();
    for block in bytes.chunks_exact_mut(dtype.block_bytes()) {
        let mut set = |at: usize, lo: f64, hi: f64| block[at..at + 2].copy_from_slice(&f16_bytes(rng.range(lo, hi)));
        match dtype {
            DType::Q8_0 => set(0, 0.002, 0.015),
            DType::Q4_0 => set(0, -0.25, 0.25),
            DType::Q4_1 => {
                set(0, 0.0, 0.12);
                set(2, -1.0, 0.2);
            }
            DType::Q4K => {
                set(0, 0.0, 0.002);
                set(2, 0.0, 0.01);
            }
            DType::Q6K => set(208, -0.0005, 0.0005),
            DType::Q5_0 => set(0, -0.12, 0.12),
            DType::Q5_1 => {
                set(0, 0.0, 0.06);
                set(2, -1.0, 0.2);
            }
            DType::IQ4NL => set(0, -0.02, 0.02),
            DType::Q2K => {
                set(80, 0.0, 0.05);
                set(82, 0.0, 0.05);
            }
            DType::Q3K => set(108, -0.002, 0.002),
            DType::Q5K => {
                set(0, 0.0, 0.001);
                set(2, 0.0, 0.01);
            }
            DType::IQ4XS => set(0, -0.0005, 0.0005),
            // MXFP4: an E8M0 exponent byte, scales 2^−9 … 2^−3 (levels up to ±12).
            DType::MXFP4 => block[0] = 119 + rng.below(7) as u8,
            // FP8: magnitudes up to 2 (exponent field ≤ 8), never NaN.
            _ => block[0] = (rng.below(0x41) as u8) | (rng.below(2) as u8) << 7,
        }
    }
    Tensor::from_bytes(&bytes, dims.to_vec(), dtype).expect("whole blocks")
}

/// Inner sizes for `dtype`: not multiples of 256 for the 32-blocks, of 256 for the K-quants.
fn inner_sizes(dtype: DType) -> [usize; 2] {
    match dtype {
        d if d.block_elems() == 256 => [256, 512],
        _ => [96, 544],
    }
}

// ───────────────────────────── dequantize ─────────────────────────────

fn dequantize_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(11);
    let mut v = Vec::new();
    for dtype in BLOCK_FORMATS.into_iter().chain([DType::F8E4M3]) {
        let k = inner_sizes(dtype)[1];
        for dims in [vec![7, k], vec![96, 1024]] {
            let w = random_blocks(&mut rng, dtype, &dims);
            v.push(forward_case(
                Op::Dequantize,
                format!("dequantize {dtype} random blocks {dims:?} vs the twin's reading of the bytes"),
                vec![w],
                DType::F32,
                DECODE_TOLERANCE,
                |b: &B, t| b.dequantize(&t[0]),
                move |t| twin::dequantize(dtype, t[0].host_bytes().expect("host bytes"), &dims),
            ));
        }
    }
    let codes: Vec<u8> = (0..=255u8).collect();
    v.push(forward_case(
        Op::Dequantize,
        "dequantize f8e4m3: all 256 codes",
        vec![Tensor::from_bytes(&codes, [2, 128], DType::F8E4M3).expect("codes")],
        DType::F32,
        Tolerance::EXACT,
        |b: &B, t| b.dequantize(&t[0]),
        |t| twin::dequantize(DType::F8E4M3, t[0].host_bytes().expect("host bytes"), &[2, 128]),
    ));
    for dtype in BLOCK_FORMATS {
        let x = rng.tensor([33, 512], -2.0, 2.0);
        v.push(Case::custom(
            Op::Dequantize,
            CaseKind::Forward,
            format!("dequantize {dtype} blocks the backend quantized from x[33, 512] vs the twin's reading"),
            move |b: &B| {
                let q = ok("quantize", b.quantize(&ok("upload", b.upload(&x))?, dtype))?;
                let got = ok("dequantize", b.dequantize(&q))?;
                if got.dtype() != DType::F32 {
                    return Err(format!("dequantize gave {}, expected f32", got.dtype()));
                }
                let want = twin::dequantize(dtype, &host_bytes(b, &q)?, &[33, 512]);
                DECODE_TOLERANCE.check("dequantized", &Array::from_tensor(&ok("to_host", b.to_host(&got))?), &want)
            },
        ));
    }
    for (what, dtype) in [("f32", DType::F32), ("f16", DType::F16), ("u32", DType::U32)] {
        v.push(Case::expect_error(Op::Dequantize, format!("dequantize of a {what} tensor"), move |b: &B| {
            b.dequantize(&b.zeros(&Shape::new([2, 32]), dtype)?).map(drop)
        }));
    }
    // A block tensor cannot be made with a torn last block or bytes of another length.
    v.push(Case::expect_error(Op::Dequantize, "dequantize of mxfp4 [2, 48] (48 not a multiple of 32)", |b: &B| {
        b.dequantize(&Tensor::zeros([2, 48], DType::MXFP4)?).map(drop)
    }));
    v.push(Case::expect_error(Op::Dequantize, "dequantize of mxfp4 [2, 32] from 36 bytes (34 needed)", |b: &B| {
        b.dequantize(&Tensor::from_bytes(&[0u8; 36], [2, 32], DType::MXFP4)?).map(drop)
    }));
    v.push(Case::expect_error(Op::Dequantize, "dequantize of a q8_0 tensor on a foreign device", |b: &B| {
        b.dequantize(&foreign_tensor(&[2, 32], DType::Q8_0)).map(drop)
    }));
    v
}

// ───────────────────────────── quantize ─────────────────────────────

/// Rows of test data with different characters: uniform, bell-shaped, positive offset,
/// all zero, constant, a lone outlier, all negative.
fn varied_rows(rng: &mut Rng, rows: usize, k: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(rows * k);
    for r in 0..rows {
        for i in 0..k {
            let v = match r % 7 {
                0 => rng.range(-1.0, 1.0),
                1 => (rng.uniform() + rng.uniform() + rng.uniform() - 1.5) * 2.0,
                2 => rng.range(5.0, 6.0),
                3 => 0.0,
                4 => 0.7,
                5 if i % 97 == 13 => 50.0,
                5 => rng.range(-0.1, 0.1),
                _ => rng.range(-2.0, -1.0),
            };
            x.push(v as f32);
        }
    }
    x
}

/// The error a round trip through `dtype` may make on the group `x` (a block of 32 for
/// the 32-blocks; a sub-block of 32 (Q4_K) or 16 (Q6_K) for the K-quants, with `outer`
/// the super-block it belongs to): half a quantization step, plus what the f16 (or 6-bit,
/// or i8) rounding of the scales adds; a whole step where the reference quantizer may clamp
/// the extreme level or picks a slightly smaller scale on purpose.
fn error_bound(dtype: DType, x: &[f64], outer: &[f64]) -> f64 {
    let amax = x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let (lo, hi) = x.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let f16_rel = 2f64.powi(-11);
    match dtype {
        // d = amax/127; q = round(x/d).
        DType::Q8_0 => amax * (0.5 / 127.0 + 2.0 * f16_rel) + 1e-12,
        // |d| = amax/8; the value opposite the extreme one may clamp from 16 to 15.
        DType::Q4_0 => amax / 8.0 * (1.0 + 16.0 * f16_rel) + 1e-12,
        // d = (max − min)/15; m = min rounded to f16.
        DType::Q4_1 => (hi - lo) / 15.0 * (0.5 + 16.0 * f16_rel) + lo.abs() * f16_rel * 2.0 + 1e-12,
        // |d| = amax/16; as Q4_0 with 32 levels.
        DType::Q5_0 => amax / 16.0 * (1.0 + 32.0 * f16_rel) + 1e-12,
        // d = (max − min)/31; as Q4_1.
        DType::Q5_1 => (hi - lo) / 31.0 * (0.5 + 32.0 * f16_rel) + lo.abs() * f16_rel * 2.0 + 1e-12,
        // Grid from min(min, 0) to max(max, 0) in 15 steps (mins are subtracted, so ≥ 0);
        // the scale search may shrink the step and clamp; 6-bit scales and mins quantize
        // against the super-block's largest, adding up to half their step each.
        DType::Q4K => {
            let step = (hi.max(0.0) - lo.min(0.0)) / 15.0;
            let (olo, ohi) = outer.iter().fold((0.0f64, 0.0f64), |(l, h), &v| (l.min(v), h.max(v)));
            step * 1.25 + (ohi - olo) / 63.0 * 0.5 + 1e-9
        }
        // As Q4_K with 31 steps.
        DType::Q5K => {
            let step = (hi.max(0.0) - lo.min(0.0)) / 31.0;
            let (olo, ohi) = outer.iter().fold((0.0f64, 0.0f64), |(l, h), &v| (l.min(v), h.max(v)));
            step * 1.25 + (ohi - olo) / 63.0 * 0.5 + 1e-9
        }
        // Signed grid of 64 levels with the extreme value on −32; i8 scales against the
        // super-block's largest.
        DType::Q6K => {
            let oamax = outer.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            amax / 32.0 * 1.25 + oamax / 128.0 / 32.0 * 32.0 * 0.5 + 1e-9
        }
        // With p = 2^floor(log2 amax) the levels are p·(0, 1/8, 1/4, 3/8, 1/2, 3/4, 1, 3/2)
        // and their negatives: half the widest gap (p/4), or, above the top level 3p/2, the
        // clipping of values up to 2p (ggml's exponent rule clips by design).
        DType::MXFP4 if amax > 0.0 => 2f64.powi(amax.log2().floor() as i32) * 0.5 + 1e-30,
        DType::MXFP4 => 0.0,
        _ => f64::INFINITY,
    }
}

/// Checks `got` (the twin's decoding of the backend's blocks) against the input `x`,
/// group by group, and the scale fields for finiteness (and non-negativity where ggml's
/// quantizer guarantees it).
fn check_round_trip(dtype: DType, x: &Array, got: &Array, bytes: &[u8]) -> Result<(), String> {
    let be = dtype.block_elems();
    let group = match dtype {
        DType::Q6K => 16,
        _ => 32,
    };
    for (bi, block) in bytes.chunks_exact(dtype.block_bytes()).enumerate() {
        let f16_at = |at: usize| half::f16::from_le_bytes([block[at], block[at + 1]]).to_f64();
        let scales: Vec<f64> = match dtype {
            DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => vec![f16_at(0), f16_at(2)],
            DType::Q6K => vec![f16_at(208)],
            DType::MXFP4 => vec![2f64.powi(i32::from(block[0]) - 128)],
            _ => vec![f16_at(0)],
        };
        let non_negative = matches!(dtype, DType::Q4K | DType::Q5K);
        if scales.iter().any(|s| !s.is_finite()) || (non_negative && scales.iter().any(|&s| s < 0.0)) {
            return Err(format!("{dtype} block {bi}: invalid scale fields {scales:?}"));
        }
        let outer = &x.data[bi * be..(bi + 1) * be];
        for g in (0..be).step_by(group) {
            let start = bi * be + g;
            let xs = &x.data[start..start + group];
            let bound = error_bound(dtype, xs, outer);
            for (i, (&want, &have)) in xs.iter().zip(&got.data[start..start + group]).enumerate() {
                if (have - want).abs() > bound || have.is_nan() {
                    return Err(format!(
                        "{dtype}: element {} decodes to {have}, input {want} (error {:e} > bound {bound:e})",
                        start + i,
                        (have - want).abs()
                    ));
                }
            }
        }
    }
    Ok(())
}

fn quantize_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(12);
    let mut v = Vec::new();
    for dtype in ROUND_TRIP_FORMATS {
        for (dims, in_dtype) in [
            ([7usize, 512usize], DType::F32),
            ([7, 512], DType::F16),
            ([7, 512], DType::BF16),
            ([40, 1024], DType::F32),
        ] {
            let values = varied_rows(&mut rng, dims[0], dims[1]);
            let x = Tensor::from_f32_as(&values, dims, in_dtype).expect("float data");
            v.push(Case::custom(
                Op::Quantize,
                CaseKind::Property,
                format!(
                    "quantize {in_dtype} x{dims:?} (uniform, bell, offset, zero, constant, outlier, negative rows) to \
                     {dtype}: valid blocks, round-trip error within the format's step, deterministic"
                ),
                move |b: &B| {
                    let xu = ok("upload", b.upload(&x))?;
                    let q = ok("quantize", b.quantize(&xu, dtype))?;
                    if q.dtype() != dtype || q.dims() != dims {
                        return Err(format!("quantize gave {} {:?}", q.dtype(), q.dims()));
                    }
                    let bytes = host_bytes(b, &q)?;
                    if host_bytes(b, &ok("quantize again", b.quantize(&xu, dtype))?)? != bytes {
                        return Err("quantizing the same input twice gave different bytes".into());
                    }
                    let decoded = twin::dequantize(dtype, &bytes, &dims);
                    check_round_trip(dtype, &Array::from_tensor(&x), &decoded, &bytes)
                },
            ));
        }
    }
    v.extend(known_block_cases());
    v.push(f8_rounding_case());
    let x = rng.tensor([4, 64], -1.0, 1.0);
    let bad: Vec<(String, Tensor, DType)> = vec![
        ("u32 input".into(), rng.ids([4, 64], 9), DType::Q8_0),
        ("q8_0 input (already quantized)".into(), Tensor::zeros([4, 64], DType::Q8_0).expect("zeros"), DType::Q4_0),
        ("target f32 (not a storage format)".into(), x.clone(), DType::F32),
        ("target u32".into(), x, DType::U32),
        ("x[4, 48] to q8_0 (48 not a multiple of 32)".into(), rng.tensor([4, 48], -1.0, 1.0), DType::Q8_0),
        ("x[4, 128] to q4_k (128 not a multiple of 256)".into(), rng.tensor([4, 128], -1.0, 1.0), DType::Q4K),
        ("x[3, 300] to q6_k".into(), rng.tensor([3, 300], -1.0, 1.0), DType::Q6K),
        ("x[4, 48] to q5_0".into(), rng.tensor([4, 48], -1.0, 1.0), DType::Q5_0),
        ("x[2, 288] to iq4_xs (288 not a multiple of 256)".into(), rng.tensor([2, 288], -1.0, 1.0), DType::IQ4XS),
        ("x[2, 128] to q2_k".into(), rng.tensor([2, 128], -1.0, 1.0), DType::Q2K),
        ("q5_k input (already quantized)".into(), Tensor::zeros([2, 256], DType::Q5K).expect("zeros"), DType::Q3K),
        ("x[4, 48] to mxfp4 (48 not a multiple of 32)".into(), rng.tensor([4, 48], -1.0, 1.0), DType::MXFP4),
        ("mxfp4 input (already quantized)".into(), Tensor::zeros([2, 64], DType::MXFP4).expect("zeros"), DType::Q8_0),
        ("a scalar to q4_0".into(), Tensor::scalar(1.0), DType::Q4_0),
    ];
    for (what, t, dtype) in bad {
        v.push(Case::expect_error(Op::Quantize, format!("quantize: {what}"), move |b: &B| {
            b.quantize(&b.upload(&t)?, dtype).map(drop)
        }));
    }
    v.push(Case::expect_error(Op::Quantize, "quantize of a tensor on a foreign device", |b: &B| {
        b.quantize(&foreign_tensor(&[2, 32], DType::F32), DType::Q8_0).map(drop)
    }));
    v
}

/// Blocks worked out by hand from the ggml layouts and reference rounding rules.
fn known_block_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let one = f16_bytes(1.0);
    // Q8_0: amax 127 → d = 1, q = round(x) half away from zero (2.5 → 3, −2.5 → −3).
    let mut q8_x: Vec<f32> = (0..32).map(|j| j as f32 - 16.0).collect();
    q8_x[0] = -127.0;
    q8_x[1] = 2.5;
    q8_x[2] = -2.5;
    let mut q8_want = one.to_vec();
    q8_want.extend(q8_x.iter().map(|&v| (v.abs().round().copysign(v) as i8) as u8));
    // Q4_0: largest magnitude −8 → d = −8/−8 = 1, q = x + 8; element j in the low nibble of
    // byte j, element j + 16 in its high nibble.
    let q4_x: Vec<f32> = (0..16).map(|j| j as f32 - 8.0).chain((0..16).map(|j| 7.0 - j as f32)).collect();
    let mut q4_want = one.to_vec();
    q4_want.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    // Q4_1: x = −3 + q/2 with q = 7j mod 16 (covering 0..15) → d = 0.5, m = −3.
    let q41_levels: Vec<u8> = (0..32u32).map(|j| ((7 * j) % 16) as u8).collect();
    let q41_x: Vec<f32> = q41_levels.iter().map(|&q| -3.0 + 0.5 * q as f32).collect();
    let mut q41_want = f16_bytes(0.5).to_vec();
    q41_want.extend(f16_bytes(-3.0));
    q41_want.extend((0..16).map(|j| q41_levels[j] | (q41_levels[j + 16] << 4)));
    // MXFP4: largest magnitude 6 → e = floor(log2 6) − 2 + 127 = 127, levels 0.5·table;
    // element j < 16 is level j, element 16 + j level 15 − j (−0 at 8 becomes 0, index 0),
    // except two ties halfway between levels, which take the first of the two: 2.5
    // (between 2 and 3: index 4) and −2.5 (between −2 and −3: index 12).
    let level = |i: usize| 0.5 * twin::MXFP4_TABLE[i] as f32;
    let mut mx_x: Vec<f32> = (0..16).map(level).chain((0..16).map(|j| level(15 - j))).collect();
    (mx_x[0], mx_x[31]) = (2.5, -2.5);
    let index = |i: u8| if i == 8 { 0 } else { i };
    let mut mx_want = vec![127u8];
    mx_want.extend((0..16u8).map(|j| index(j) | (index(15 - j) << 4)));
    (mx_want[1], mx_want[16]) = (4 | (15 << 4), 15 | (12 << 4));
    let blocks = [
        (DType::Q8_0, q8_x, q8_want),
        (DType::Q4_0, q4_x, q4_want),
        (DType::Q4_1, q41_x, q41_want),
        (DType::MXFP4, mx_x, mx_want),
    ];
    blocks
        .into_iter()
        .map(|(dtype, x, want)| {
            Case::custom(
                Op::Quantize,
                CaseKind::Property,
                format!("quantize a hand-worked {dtype} block"),
                move |b: &B| {
                    let t = ok("tensor", Tensor::from_vec(x.clone(), [1, 32]))?;
                    let got = host_bytes(b, &ok("quantize", b.quantize(&ok("upload", b.upload(&t))?, dtype))?)?;
                    if got != want {
                        return Err(format!("bytes {got:02x?}, expected {want:02x?}"));
                    }
                    Ok(())
                },
            )
        })
        .collect()
}

/// FP8 E4M3 encoding: every finite code's value maps back to the code; values halfway
/// between neighbours go to the even code, values just off halfway to the nearer one;
/// overflow saturates to ±448; NaN stays NaN.
fn f8_rounding_case<B: ComputeBackend + ?Sized + 'static>() -> Case<B> {
    let mut x = Vec::new();
    let mut want = Vec::new();
    for code in 0u8..=255 {
        if code & 0x7F != 0x7F {
            x.push(f8e4m3_value(code) as f32);
            want.push(code);
        }
    }
    for code in 0u8..0x7E {
        let (lo, hi) = (f8e4m3_value(code), f8e4m3_value(code + 1));
        let mid = ((lo + hi) / 2.0) as f32; // exact: 5 significant bits
        let even = if code % 2 == 0 { code } else { code + 1 };
        // The neighbouring f32 values of a positive `mid`, one ulp below and above.
        let (below, above) = (f32::from_bits(mid.to_bits() - 1), f32::from_bits(mid.to_bits() + 1));
        for (v, c) in [(mid, even), (below, code), (above, code + 1)] {
            x.push(v);
            want.push(c);
            x.push(-v);
            want.push(c | 0x80);
        }
    }
    for (v, c) in [(449.0f32, 0x7E), (1e9, 0x7E), (f32::INFINITY, 0x7E), (-500.0, 0xFE), (f32::NAN, 0x7F)] {
        x.push(v);
        want.push(c);
    }
    let n = x.len();
    Case::custom(
        Op::Quantize,
        CaseKind::Property,
        format!("quantize to f8e4m3 [{n}]: every code round-trips, halfway ties to even, saturation at ±448, NaN kept"),
        move |b: &B| {
            let t = ok("tensor", Tensor::from_vec(x.clone(), [n]))?;
            let got = host_bytes(b, &ok("quantize", b.quantize(&ok("upload", b.upload(&t))?, DType::F8E4M3))?)?;
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                if g != w {
                    return Err(format!("{} encoded as {g:#04x}, expected {w:#04x}", x[i]));
                }
            }
            Ok(())
        },
    )
}

// ───────────────────────────── quantized_matmul ─────────────────────────────

fn matmul_tolerance(k: usize, dtype: DType) -> Tolerance {
    let f32_tol = Tolerance { abs: 2e-5 * (k as f64 / 32.0).max(1.0), rel: 1e-4 };
    if dtype == DType::F32 {
        f32_tol
    } else {
        f32_tol.max(Tolerance::for_dtype(dtype))
    }
}

/// A `quantized_matmul` case: x `x_dims` (random, rounded to `x_dtype`), W `[n, k]` random
/// blocks of `w_dtype`, against `x · dequant(W)ᵀ` in f64 — or, for a format that has an
/// 8-bit activation block, against either that or `x̃ · dequant(W)ᵀ` with x̃ the 8-bit
/// rounding of x (a backend may take either path; each must match its twin closely).
fn matmul_case<B: ComputeBackend + ?Sized + 'static>(
    rng: &mut Rng,
    w_dtype: DType,
    x_dims: Vec<usize>,
    n: usize,
    x_dtype: DType,
) -> Case<B> {
    let k = *x_dims.last().expect("rank ≥ 1");
    let x = rng.tensor(x_dims.clone(), -1.0, 1.0);
    let x = Tensor::from_f32_as(&x.to_vec_f32().expect("f32"), x_dims.clone(), x_dtype).expect("float");
    let w = random_blocks(rng, w_dtype, &[n, k]);
    let name = format!("quantized_matmul x{x_dims:?} {x_dtype} · W[{n}, {k}] {w_dtype}ᵀ");
    if let Some(block) = fusebox::spec::quant::int_activation_block(w_dtype) {
        let (inputs, tol) = (vec![x, w], matmul_tolerance(k, x_dtype));
        return Case::custom(Op::QuantizedMatmul, CaseKind::Forward, name, move |b: &B| {
            let up = upload_all(b, &inputs)?;
            let out = catch(|| b.quantized_matmul(&up[0], &up[1]))?.map_err(|e| format!("returned an error: {e}"))?;
            if out.dtype() != x_dtype {
                return Err(format!("output dtype {}, expected {x_dtype}", out.dtype()));
            }
            let got = host_values(b, &out)?;
            let wd = twin::dequantize(w_dtype, inputs[1].host_bytes().expect("host bytes"), &[n, k]);
            let xa = Array::from_tensor(&inputs[0]);
            let exact = tol.check("output (f32 x)", &got, &twin::quantized_matmul(&xa, &wd));
            let rounded = tol.check(
                "output (x rounded to 8 bits)",
                &got,
                &twin::quantized_matmul(&twin::round_activations(&xa, block), &wd),
            );
            match (exact, rounded) {
                (Err(e), Err(r)) => Err(format!("matches neither twin: {e}; {r}")),
                _ => Ok(()),
            }
        });
    }
    forward_case(
        Op::QuantizedMatmul,
        name,
        vec![x, w],
        x_dtype,
        matmul_tolerance(k, x_dtype),
        |b: &B, t| b.quantized_matmul(&t[0], &t[1]),
        move |t| {
            let w = twin::dequantize(w_dtype, t[1].host_bytes().expect("host bytes"), &[n, k]);
            twin::quantized_matmul(&Array::from_tensor(&t[0]), &w)
        },
    )
}

fn matmul_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(13);
    let mut v = Vec::new();
    for w_dtype in BLOCK_FORMATS.into_iter().chain([DType::F8E4M3]) {
        let [k_small, k] = inner_sizes(w_dtype);
        for m in [1, 7, 33] {
            v.push(matmul_case(&mut rng, w_dtype, vec![m, k], 37, DType::F32));
        }
        for x_dtype in [DType::F16, DType::BF16] {
            v.push(matmul_case(&mut rng, w_dtype, vec![7, k_small], 37, x_dtype));
            v.push(matmul_case(&mut rng, w_dtype, vec![33, k_small], 19, x_dtype));
        }
        v.push(matmul_case(&mut rng, w_dtype, vec![2, 5, k_small], 23, DType::F32));
        // Large enough for the multithreaded paths: one x row over many W rows, and many x rows.
        v.push(matmul_case(&mut rng, w_dtype, vec![1, 1024], 300, DType::F32));
        v.push(matmul_case(&mut rng, w_dtype, vec![40, 512], 300, DType::F32));
    }
    // Prompt prefill (many x rows): tile remainders, partial groups of 16 W rows, and x
    // blocks with an outlier (a coarse 8-bit step), for the formats with integer kernels.
    let mut rng3 = Rng::new(15);
    for w_dtype in BLOCK_FORMATS.into_iter().filter(|d| fusebox::spec::quant::int_activation_block(*d).is_some()) {
        let k = 2 * w_dtype.block_elems().max(256);
        for (m, n) in [(67, 45), (130, 16)] {
            v.push(prefill_rounding_case(&mut rng3, w_dtype, m, n, k));
        }
    }
    let mut rng2 = Rng::new(14);
    let w96 = random_blocks(&mut rng2, DType::Q8_0, &[16, 96]);
    let bad: Vec<(&str, Tensor, Tensor)> = vec![
        ("x[3, 64] with w[16, 96] (in mismatch)", rng2.tensor([3, 64], -1.0, 1.0), w96.clone()),
        ("x[3, 97] with w[16, 96] (in mismatch)", rng2.tensor([3, 97], -1.0, 1.0), w96.clone()),
        ("w f32 (not quantized)", rng2.tensor([3, 96], -1.0, 1.0), rng2.tensor([16, 96], -1.0, 1.0)),
        ("w u32", rng2.tensor([3, 96], -1.0, 1.0), rng2.ids([16, 96], 5)),
        ("w of rank 3", rng2.tensor([3, 64], -1.0, 1.0), Tensor::zeros([2, 4, 64], DType::Q4_0).expect("zeros")),
        ("w of rank 1", rng2.tensor([3, 64], -1.0, 1.0), Tensor::zeros([64], DType::Q4_0).expect("zeros")),
        ("x u32", rng2.ids([3, 96], 5), w96.clone()),
        ("x q8_0 (quantized x)", random_blocks(&mut rng2, DType::Q8_0, &[3, 96]), w96.clone()),
        ("x a scalar", Tensor::scalar(1.0), w96),
        (
            "x[3, 512] with w[4, 256] q3_k (in mismatch)",
            rng2.tensor([3, 512], -1.0, 1.0),
            random_blocks(&mut rng2, DType::Q3K, &[4, 256]),
        ),
        (
            "x[3, 48] with w[4, 64] mxfp4 (in mismatch)",
            rng2.tensor([3, 48], -1.0, 1.0),
            random_blocks(&mut rng2, DType::MXFP4, &[4, 64]),
        ),
        (
            "x mxfp4 (quantized x)",
            random_blocks(&mut rng2, DType::MXFP4, &[3, 64]),
            random_blocks(&mut rng2, DType::MXFP4, &[4, 64]),
        ),
        (
            "x iq4_nl (quantized x)",
            random_blocks(&mut rng2, DType::IQ4NL, &[3, 64]),
            random_blocks(&mut rng2, DType::IQ4NL, &[4, 64]),
        ),
    ];
    for (what, x, w) in bad {
        v.push(Case::expect_error(Op::QuantizedMatmul, format!("quantized_matmul: {what}"), move |b: &B| {
            b.quantized_matmul(&b.upload(&x)?, &b.upload(&w)?).map(drop)
        }));
    }
    v.push(Case::expect_error(Op::QuantizedMatmul, "quantized_matmul with w on a foreign device", |b: &B| {
        b.quantized_matmul(&b.upload(&Tensor::zeros([2, 32], DType::F32)?)?, &foreign_tensor(&[4, 32], DType::Q8_0))
            .map(drop)
    }));
    v
}

/// A prefill-sized `quantized_matmul` (`m` x rows, W `[n, k]` random blocks of `w_dtype`,
/// a format with an 8-bit activation block b) against `x · dequant(W)ᵀ` in f64, within
/// what rounding x to 8 bits allows: each x value moves by at most half its block's step
/// `s = max|x_block| / 127`, so output (i, r) is within `Σ_j |W[r, j]|·s_j / 2` (plus
/// the f32 tolerance) of the exact product, whichever path the backend takes. Every
/// fifth block of x holds one value 8 times the others, so the step is coarse there.
fn prefill_rounding_case<B: ComputeBackend + ?Sized + 'static>(
    rng: &mut Rng,
    w_dtype: DType,
    m: usize,
    n: usize,
    k: usize,
) -> Case<B> {
    let block = fusebox::spec::quant::int_activation_block(w_dtype).expect("an integer format");
    let mut xv = rng.tensor([m, k], -1.0, 1.0).to_vec_f32().expect("f32");
    for (b, run) in xv.chunks_mut(block).enumerate() {
        if b % 5 == 0 {
            run[b % block] *= 8.0;
        }
    }
    let x = Tensor::from_vec(xv, [m, k]).expect("f32");
    let w = random_blocks(rng, w_dtype, &[n, k]);
    let name = format!("quantized_matmul prefill x[{m}, {k}] · W[{n}, {k}] {w_dtype}ᵀ within the 8-bit rounding of x");
    let tol = matmul_tolerance(k, DType::F32);
    Case::custom(Op::QuantizedMatmul, CaseKind::Forward, name, move |b: &B| {
        let up = upload_all(b, &[x.clone(), w.clone()])?;
        let out = catch(|| b.quantized_matmul(&up[0], &up[1]))?.map_err(|e| format!("returned an error: {e}"))?;
        let got = host_values(b, &out)?;
        let wd = twin::dequantize(w_dtype, w.host_bytes().expect("host bytes"), &[n, k]);
        let xa = Array::from_tensor(&x);
        let want = twin::quantized_matmul(&xa, &wd);
        let steps: Vec<f64> = xa
            .data
            .chunks(block)
            .flat_map(|run| {
                let s = run.iter().fold(0.0f64, |a, v| a.max(v.abs())) / 127.0;
                std::iter::repeat_n(s, run.len())
            })
            .collect();
        for i in 0..m {
            for r in 0..n {
                let bound: f64 =
                    (0..k).map(|j| wd.data[r * k + j].abs() * steps[i * k + j] / 2.0).sum::<f64>() * (1.0 + 1e-6);
                let (g, e) = (got.data[i * n + r], want.data[i * n + r]);
                let allowed = bound + tol.abs + tol.rel * e.abs();
                if (g - e).is_nan() || (g - e).abs() > allowed {
                    return Err(format!("output [{i}, {r}] = {g}, exact {e}: off by {} > {allowed}", (g - e).abs()));
                }
            }
        }
        Ok(())
    })
}

// ───────────────────────── quantized_matmul_backward ─────────────────────────

/// A `quantized_matmul_backward` case: dy `dy_dims` (random, rounded to `dy_dtype`), W
/// `[n, k]` random blocks of `w_dtype` (n = dy's last dim), against `dy · dequant(W)` in f64.
fn matmul_backward_case<B: ComputeBackend + ?Sized + 'static>(
    rng: &mut Rng,
    w_dtype: DType,
    dy_dims: Vec<usize>,
    k: usize,
    dy_dtype: DType,
) -> Case<B> {
    let n = *dy_dims.last().expect("rank ≥ 1");
    let dy = rng.tensor(dy_dims.clone(), -1.0, 1.0);
    let dy = Tensor::from_f32_as(&dy.to_vec_f32().expect("f32"), dy_dims.clone(), dy_dtype).expect("float");
    let w = random_blocks(rng, w_dtype, &[n, k]);
    let name = format!("quantized_matmul_backward dy{dy_dims:?} {dy_dtype} · W[{n}, {k}] {w_dtype}");
    let (inputs, tol) = (vec![dy, w], matmul_tolerance(n, dy_dtype));
    Case::custom(Op::QuantizedMatmulBackward, CaseKind::Backward, name, move |b: &B| {
        let up = upload_all(b, &inputs)?;
        let out =
            catch(|| b.quantized_matmul_backward(&up[0], &up[1]))?.map_err(|e| format!("returned an error: {e}"))?;
        if out.dtype() != dy_dtype {
            return Err(format!("output dtype {}, expected {dy_dtype}", out.dtype()));
        }
        let want_dims: Vec<usize> = dy_dims[..dy_dims.len() - 1].iter().copied().chain([k]).collect();
        if out.dims() != want_dims.as_slice() {
            return Err(format!("output shape {:?}, expected {want_dims:?}", out.dims()));
        }
        let got = host_values(b, &out)?;
        let wd = twin::dequantize(w_dtype, inputs[1].host_bytes().expect("host bytes"), &[n, k]);
        tol.check("dx", &got, &twin::quantized_matmul_backward(&Array::from_tensor(&inputs[0]), &wd))
    })
}

fn matmul_backward_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut rng = Rng::new(15);
    let mut v = Vec::new();
    for w_dtype in BLOCK_FORMATS.into_iter().chain([DType::F8E4M3]) {
        let [k_small, k] = inner_sizes(w_dtype);
        for m in [1, 7, 33] {
            v.push(matmul_backward_case(&mut rng, w_dtype, vec![m, 37], k, DType::F32));
        }
        for dy_dtype in [DType::F16, DType::BF16] {
            v.push(matmul_backward_case(&mut rng, w_dtype, vec![7, 19], k_small, dy_dtype));
        }
        v.push(matmul_backward_case(&mut rng, w_dtype, vec![2, 5, 23], k_small, DType::F32));
        // Large enough for the multithreaded path: many column groups and row chunks.
        v.push(matmul_backward_case(&mut rng, w_dtype, vec![3, 35, 150], 1024, DType::F32));
    }
    // The twin is the gradient of the forward twin: central differences of Σ dy · (x · Wᵀ).
    v.push(Case::custom(
        Op::QuantizedMatmulBackward,
        CaseKind::TwinGradient,
        "quantized_matmul_backward dy[2, 3, 5] · W[5, 64] q4_1 | twin vs finite differences",
        |_b: &B| {
            let mut rng = Rng::new(16);
            let w = random_blocks(&mut rng, DType::Q4_1, &[5, 64]);
            let wd = twin::dequantize(DType::Q4_1, w.host_bytes().expect("host bytes"), &[5, 64]);
            let x = Array::from_tensor(&rng.tensor([2, 3, 64], -1.0, 1.0));
            let dy = Array::from_tensor(&rng.tensor([2, 3, 5], -1.0, 1.0));
            let grad = twin::quantized_matmul_backward(&dy, &wd);
            let h = 1e-3;
            let mut numeric = Array::zeros(x.shape.clone());
            for e in 0..x.len() {
                let (mut plus, mut minus) = (x.clone(), x.clone());
                plus.data[e] += h;
                minus.data[e] -= h;
                numeric.data[e] = (twin::quantized_matmul(&plus, &wd).dot(&dy)
                    - twin::quantized_matmul(&minus, &wd).dot(&dy))
                    / (2.0 * h);
            }
            Tolerance { abs: 1e-7, rel: 1e-7 }.check("dx", &grad, &numeric)
        },
    ));
    let mut rng2 = Rng::new(17);
    let w96 = random_blocks(&mut rng2, DType::Q8_0, &[16, 96]);
    let bad: Vec<(&str, Tensor, Tensor)> = vec![
        ("dy[3, 96] with w[16, 96] (dy's last dim is not w's rows)", rng2.tensor([3, 96], -1.0, 1.0), w96.clone()),
        ("dy[3, 17] with w[16, 96] (out mismatch)", rng2.tensor([3, 17], -1.0, 1.0), w96.clone()),
        ("w f32 (not quantized)", rng2.tensor([3, 16], -1.0, 1.0), rng2.tensor([16, 96], -1.0, 1.0)),
        ("w u32", rng2.tensor([3, 16], -1.0, 1.0), rng2.ids([16, 96], 5)),
        ("w of rank 3", rng2.tensor([3, 4], -1.0, 1.0), Tensor::zeros([2, 4, 64], DType::Q4_0).expect("zeros")),
        ("w of rank 1", rng2.tensor([3, 64], -1.0, 1.0), Tensor::zeros([64], DType::Q4_0).expect("zeros")),
        ("dy u32", rng2.ids([3, 16], 5), w96.clone()),
        (
            "dy q8_0 (quantized dy)",
            random_blocks(&mut rng2, DType::Q8_0, &[3, 32]),
            random_blocks(&mut rng2, DType::Q8_0, &[32, 64]),
        ),
        ("dy a scalar", Tensor::scalar(1.0), w96),
    ];
    for (what, dy, w) in bad {
        v.push(Case::expect_error(
            Op::QuantizedMatmulBackward,
            format!("quantized_matmul_backward: {what}"),
            move |b: &B| b.quantized_matmul_backward(&b.upload(&dy)?, &b.upload(&w)?).map(drop),
        ));
    }
    v.push(Case::expect_error(
        Op::QuantizedMatmulBackward,
        "quantized_matmul_backward with w on a foreign device",
        |b: &B| {
            b.quantized_matmul_backward(
                &b.upload(&Tensor::zeros([2, 4], DType::F32)?)?,
                &foreign_tensor(&[4, 32], DType::Q8_0),
            )
            .map(drop)
        },
    ));
    v
}

// ───────────────────────────── llama.cpp fixtures ─────────────────────────────

/// One format's fixture, recorded from llama.cpp by `scripts/record_quant_fixtures.py`.
struct Fixture {
    /// Awkward f32 inputs.
    x: Vec<f32>,
    /// `ggml_quantize_chunk`'s blocks for `x`.
    q: Vec<u8>,
    /// ggml's dequantization of `q`.
    y: Vec<f32>,
    /// Random blocks.
    rq: Vec<u8>,
    /// ggml's dequantization of `rq`.
    ry: Vec<f32>,
}

/// The recorded fixture text of `dtype`.
fn fixture_text(dtype: DType) -> &'static str {
    match dtype {
        DType::Q8_0 => include_str!("../../fixtures/quant/q8_0.txt"),
        DType::Q4_0 => include_str!("../../fixtures/quant/q4_0.txt"),
        DType::Q4_1 => include_str!("../../fixtures/quant/q4_1.txt"),
        DType::Q5_0 => include_str!("../../fixtures/quant/q5_0.txt"),
        DType::Q5_1 => include_str!("../../fixtures/quant/q5_1.txt"),
        DType::IQ4NL => include_str!("../../fixtures/quant/iq4_nl.txt"),
        DType::Q2K => include_str!("../../fixtures/quant/q2_k.txt"),
        DType::Q3K => include_str!("../../fixtures/quant/q3_k.txt"),
        DType::Q4K => include_str!("../../fixtures/quant/q4_k.txt"),
        DType::Q5K => include_str!("../../fixtures/quant/q5_k.txt"),
        DType::Q6K => include_str!("../../fixtures/quant/q6_k.txt"),
        DType::IQ4XS => include_str!("../../fixtures/quant/iq4_xs.txt"),
        DType::MXFP4 => include_str!("../../fixtures/quant/mxfp4.txt"),
        other => panic!("no llama.cpp fixture for {other}"),
    }
}

/// Parses a fixture: lines `TAG HEX` (little-endian bytes), `#` comments.
fn fixture(dtype: DType) -> Fixture {
    let mut sections: std::collections::HashMap<&str, Vec<u8>> = std::collections::HashMap::new();
    for line in fixture_text(dtype).lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (tag, hex) = line.split_once(' ').expect("fixture line: TAG HEX");
        let bytes = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("fixture hex"));
        sections.entry(tag).or_default().extend(bytes);
    }
    let mut take = |tag: &str| sections.remove(tag).unwrap_or_else(|| panic!("{dtype} fixture lacks {tag}"));
    let floats = |b: Vec<u8>| b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Fixture { x: floats(take("x")), q: take("q"), y: floats(take("y")), rq: take("rq"), ry: floats(take("ry")) }
}

/// The first difference between `got` and `want` compared as bit patterns, if any.
fn first_bit_difference(got: &[f32], want: &[f32]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{} values, expected {}", got.len(), want.len()));
    }
    let bad: Vec<usize> = (0..got.len()).filter(|&i| got[i].to_bits() != want[i].to_bits()).collect();
    bad.first().map(|&i| {
        format!("{} of {} values differ; first: [{i}] = {:e}, ggml {:e}", bad.len(), got.len(), got[i], want[i])
    })
}

/// Per format: the backend's dequantization of llama.cpp's blocks (for awkward inputs and
/// random bytes) equals ggml's bit for bit, and its quantization of the awkward inputs
/// equals ggml's blocks byte for byte.
fn fixture_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    let mut v = Vec::new();
    for dtype in BLOCK_FORMATS {
        let f = std::sync::Arc::new(fixture(dtype));
        let be = dtype.block_elems();
        for (what, random) in [("llama.cpp's blocks of awkward inputs", false), ("random blocks", true)] {
            let f = f.clone();
            v.push(Case::custom(
                Op::Dequantize,
                CaseKind::Forward,
                format!("dequantize {dtype}: {what}, bit-exact against ggml's to_float"),
                move |b: &B| {
                    let (bytes, want) = if random { (&f.rq, &f.ry) } else { (&f.q, &f.y) };
                    let dims = [want.len() / be, be];
                    let q = ok("tensor", Tensor::from_bytes(bytes, dims, dtype))?;
                    let got = ok("dequantize", b.dequantize(&ok("upload", b.upload(&q))?))?;
                    let got = ok("to_host", b.to_host(&got))?.to_vec_f32().map_err(|e| e.to_string())?;
                    first_bit_difference(&got, want).map_or(Ok(()), Err)
                },
            ));
        }
        v.push(Case::custom(
            Op::Quantize,
            CaseKind::Property,
            format!("quantize {dtype}: awkward inputs give ggml_quantize_chunk's blocks byte for byte"),
            move |b: &B| {
                let dims = [f.x.len() / be, be];
                let x = ok("tensor", Tensor::from_vec(f.x.clone(), dims))?;
                let got = host_bytes(b, &ok("quantize", b.quantize(&ok("upload", b.upload(&x))?, dtype))?)?;
                let bb = dtype.block_bytes();
                match (0..got.len() / bb).find(|&i| got[i * bb..(i + 1) * bb] != f.q[i * bb..(i + 1) * bb]) {
                    None if got.len() == f.q.len() => Ok(()),
                    None => Err(format!("{} bytes, expected {}", got.len(), f.q.len())),
                    Some(i) => Err(format!(
                        "block {i} differs:\n  got  {:02x?}\n  ggml {:02x?}",
                        &got[i * bb..(i + 1) * bb],
                        &f.q[i * bb..(i + 1) * bb]
                    )),
                }
            },
        ));
    }
    v
}
