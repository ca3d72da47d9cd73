//! Copies and dtype conversions on the host: `copy`, `copy_into`, `cast`,
//! `preprocess_linear_weight`, and FP8 E4M3 decoding (plus the encoder `quantize` uses).
//!
//! Large copies and conversions are split into fixed chunks and run in the backend's
//! pool; every element is converted on its own, so results never depend on threading.

use std::sync::OnceLock;

use half::{bf16, f16};

use crate::cpu::CpuBackend;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::spec::memory::{self as spec, CastKind, CastSpec};
use crate::tensor::Tensor;

/// Bytes (or elements) per parallel chunk of a copy or conversion.
const CHUNK: usize = 1 << 16;

/// `t` must live in host memory (the CPU kernels read nothing else).
pub(crate) fn host(op: &'static str, t: &Tensor) -> Result<()> {
    if t.is_host() {
        Ok(())
    } else {
        Err(Error::Device { op, expected: "host memory".into(), got: t.device().name })
    }
}

/// `dst ← src` byte for byte, in parallel chunks when large.
fn parallel_copy(cpu: &CpuBackend, dst: &mut [u8], src: &[u8]) {
    cpu.for_each_chunk(dst, CHUNK, 1, |i, chunk| {
        let start = i * CHUNK;
        chunk.copy_from_slice(&src[start..start + chunk.len()]);
    });
}

/// `dst[i] = f(src[i])` over equally long slices, in parallel chunks when large.
fn parallel_map<S: Copy + Sync, D: Send>(cpu: &CpuBackend, src: &[S], dst: &mut [D], f: impl Fn(S) -> D + Sync + Send) {
    cpu.for_each_chunk(dst, CHUNK, 2, |i, chunk| {
        let start = i * CHUNK;
        let len = chunk.len();
        for (d, &s) in chunk.iter_mut().zip(&src[start..start + len]) {
            *d = f(s);
        }
    });
}

/// A new host tensor of `x`'s shape and `dtype` whose elements are `f(x[i])`.
fn map_tensor<S: Element, D: Element>(
    cpu: &CpuBackend,
    x: &Tensor,
    dtype: DType,
    f: impl Fn(S) -> D + Sync + Send,
) -> Result<Tensor> {
    let mut out = Tensor::zeros(x.shape().clone(), dtype)?;
    parallel_map(cpu, x.as_slice::<S>()?, out.as_mut_slice::<D>()?, f);
    Ok(out)
}

/// A fresh, uniquely owned host copy of `x` (any dtype, block formats included).
///
/// # Shapes
/// any → same shape and dtype.
pub fn copy(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    host("copy", x)?;
    let mut out = Tensor::zeros(x.shape().clone(), x.dtype())?;
    parallel_copy(cpu, out.host_bytes_mut()?, x.host_bytes()?);
    Ok(out)
}

/// `dst ← src` in place. `dst` must be writable (no live clone or overlapping view:
/// [`Error::SharedStorage`] otherwise) and match `src` in shape and dtype. A part of a
/// [`Tensor::partition`] is a valid destination.
///
/// # Shapes
/// `dst`, `src`: equal shapes and dtypes.
pub fn copy_into(cpu: &CpuBackend, dst: &mut Tensor, src: &Tensor) -> Result<()> {
    // Called directly by backends (not through `on_cpu!`): hold this backend's ISA.
    let _isa = cpu.enter();
    const OP: &str = "copy_into";
    spec::copy_into(dst, src)?;
    host(OP, dst)?;
    host(OP, src)?;
    dst.ensure_writable(OP)?;
    // `src` cannot overlap `dst` here: an overlapping handle would have made `dst` unwritable.
    let from = src.host_bytes()?;
    parallel_copy(cpu, dst.host_bytes_mut()?, from);
    Ok(())
}

/// Sets every element of a writable float tensor to `value` (rounded once to its dtype),
/// in parallel chunks when large.
///
/// # Shapes
/// `dst`: any, F32/F16/BF16 → unchanged.
pub fn fill(cpu: &CpuBackend, dst: &mut Tensor, value: f32) -> Result<()> {
    const OP: &str = "fill";
    let dtype = spec::fill(dst)?;
    host(OP, dst)?;
    dst.ensure_writable(OP)?;
    match dtype {
        DType::F32 => parallel_fill(cpu, dst.as_mut_slice::<f32>()?, value),
        DType::F16 => parallel_fill(cpu, dst.as_mut_slice::<f16>()?, f16::from_f32(value)),
        _ => parallel_fill(cpu, dst.as_mut_slice::<bf16>()?, bf16::from_f32(value)),
    }
    Ok(())
}

/// `dst[i] = value` in parallel chunks when large.
fn parallel_fill<T: Copy + Send + Sync>(cpu: &CpuBackend, dst: &mut [T], value: T) {
    cpu.for_each_chunk(dst, CHUNK, 1, |_, chunk| chunk.fill(value));
}

/// Converts among F32, F16 and BF16 (round to nearest even), or between U32 and F32.
/// U32 → F32 requires every id to be exactly representable (any id < 2²⁴ is); F32 → U32
/// requires finite, non-negative, integral values ≤ u32::MAX. A cast to the same dtype
/// is a copy. Block formats and FP8 go through `quantize`/`dequantize`/`f8e4m3_to_*`.
///
/// # Shapes
/// any → same shape, dtype `dtype`.
pub fn cast(cpu: &CpuBackend, x: &Tensor, dtype: DType) -> Result<Tensor> {
    let CastSpec { from, to, kind } = spec::cast(x, dtype)?;
    host("cast", x)?;
    match kind {
        CastKind::Copy => copy(cpu, x),
        CastKind::IdsToF32 => {
            spec::ids_as_f32(x.as_slice::<u32>()?)?;
            map_tensor(cpu, x, to, |v: u32| v as f32)
        }
        CastKind::F32ToIds => {
            spec::f32_as_ids(x.as_slice::<f32>()?)?;
            map_tensor(cpu, x, to, |v: f32| v as u32)
        }
        CastKind::Float => match (from, to) {
            (DType::F32, DType::F16) => map_tensor(cpu, x, to, f16::from_f32),
            (DType::F32, DType::BF16) => map_tensor(cpu, x, to, bf16::from_f32),
            (DType::F16, DType::F32) => map_tensor(cpu, x, to, |v: f16| v.to_f32()),
            (DType::BF16, DType::F32) => map_tensor(cpu, x, to, |v: bf16| v.to_f32()),
            // Via f32, which holds every f16 and bf16 value exactly: one rounding only.
            (DType::F16, DType::BF16) => map_tensor(cpu, x, to, |v: f16| bf16::from_f32(v.to_f32())),
            (DType::BF16, DType::F16) => map_tensor(cpu, x, to, |v: bf16| f16::from_f32(v.to_f32())),
            _ => Err(Error::dtype("cast", "conversion", "between two of f32, f16 and bf16", format!("{from} → {to}"))),
        },
    }
}

/// Validates a linear weight `[out, in]` (F32/F16/BF16, FP8 E4M3 or a block format) and
/// returns it as is, without copying: row-major `[out, in]` is already the layout the CPU
/// kernels read best — `linear_forward` hands it to gemm as a transposed operand by strides,
/// and `quantized_matmul` walks whole blocks along `in`, one W row per output column.
///
/// # Shapes
/// `w`: `[out, in]` → the same tensor.
pub fn preprocess_linear_weight(_cpu: &CpuBackend, w: &Tensor) -> Result<Tensor> {
    const OP: &str = "preprocess_linear_weight";
    host(OP, w)?;
    crate::spec::quant::preprocess_linear_weight(w)?;
    Ok(w.clone())
}

/// Decodes FP8 E4M3 (OCP "fn": bias 7, no infinities, 0x7F/0xFF NaN) to `dtype`
/// (F32, F16 or BF16; all three hold every E4M3 value exactly) through 256-entry tables.
///
/// # Shapes
/// any (F8E4M3) → same shape, `dtype`.
pub fn f8e4m3_to(cpu: &CpuBackend, x: &Tensor, dtype: DType) -> Result<Tensor> {
    let op = spec::f8e4m3_to(x, dtype)?;
    host(op, x)?;
    let codes = x.host_bytes()?;
    let mut out = Tensor::zeros(x.shape().clone(), dtype)?;
    match dtype {
        DType::F32 => {
            let table = f8e4m3_table();
            parallel_map(cpu, codes, out.as_mut_slice::<f32>()?, |c| table[c as usize]);
        }
        DType::F16 => {
            let table = f8e4m3_table_f16();
            parallel_map(cpu, codes, out.as_mut_slice::<f16>()?, |c| table[c as usize]);
        }
        _ => {
            let table = f8e4m3_table_bf16();
            parallel_map(cpu, codes, out.as_mut_slice::<bf16>()?, |c| table[c as usize]);
        }
    }
    Ok(out)
}

/// The value of one E4M3 code: `(−1)^s · 2^(e−7) · (1 + m/8)`, subnormals (e = 0)
/// `(−1)^s · 2^−6 · m/8`, and NaN for e = 15, m = 7. Every step is exact in f32.
fn decode_f8e4m3(code: u8) -> f32 {
    let negative = code & 0x80 != 0;
    let exponent = i32::from((code >> 3) & 0x0F);
    let mantissa = f32::from(code & 0x07);
    let magnitude = match exponent {
        15 if mantissa == 7.0 => f32::NAN,
        0 => mantissa / 8.0 * 2f32.powi(-6),
        e => (1.0 + mantissa / 8.0) * 2f32.powi(e - 7),
    };
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

/// The f32 value of every E4M3 code, built once per process.
pub fn f8e4m3_table() -> &'static [f32; 256] {
    static TABLE: OnceLock<[f32; 256]> = OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|c| decode_f8e4m3(c as u8)))
}

fn f8e4m3_table_f16() -> &'static [f16; 256] {
    static TABLE: OnceLock<[f16; 256]> = OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|c| f16::from_f32(f8e4m3_table()[c])))
}

fn f8e4m3_table_bf16() -> &'static [bf16; 256] {
    static TABLE: OnceLock<[bf16; 256]> = OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|c| bf16::from_f32(f8e4m3_table()[c])))
}

/// The E4M3 code nearest to `v`, ties to even; NaN stays NaN (0x7F with `v`'s sign) and
/// magnitudes beyond the largest finite value, ±∞ included, saturate to ±448 (0x7E/0xFE).
pub fn f32_to_f8e4m3(v: f32) -> u8 {
    let sign = ((v.to_bits() >> 24) & 0x80) as u8;
    let a = v.abs();
    if a.is_nan() {
        return sign | 0x7F;
    }
    if a >= 448.0 {
        return sign | 0x7E;
    }
    if a < 0.015625 {
        // Below 2^−6 the codes are the multiples m·2^−9 (m = 0..7); a·2^9 is exact, and a
        // round-up to 8 lands on code 0x08, which is 2^−6, the smallest normal.
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    // Normal: keep the top 3 of f32's 23 mantissa bits, rounding the other 20 half to even.
    // A carry out of the mantissa increments the exponent field, which is the right answer.
    let bits = a.to_bits();
    let exponent = (bits >> 23) as i32 - 127; // −6..=8 here
    let mantissa = bits & 0x7F_FFFF;
    let code = (((exponent + 7) as u32) << 3) | (mantissa >> 20);
    let rest = mantissa & 0xF_FFFF;
    let half = 0x8_0000;
    let round_up = rest > half || (rest == half && code & 1 == 1);
    sign | (code + u32::from(round_up)).min(0x7E) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f8_encoder_inverts_the_decoder_on_every_finite_code() {
        for code in 0u8..=255 {
            let v = f8e4m3_table()[code as usize];
            if v.is_nan() {
                assert_eq!(f32_to_f8e4m3(v) & 0x7F, 0x7F);
            } else {
                assert_eq!(f32_to_f8e4m3(v), code, "code {code:#04x} value {v}");
            }
        }
        assert_eq!(f32_to_f8e4m3(1e9), 0x7E);
        assert_eq!(f32_to_f8e4m3(f32::NEG_INFINITY), 0xFE);
    }
}
