//! The `quantize` and `dequantize` ops (whole tensors, split into tasks of whole
//! blocks), and [`dequantize_row_into`] for the row gathers of `embedding`.

use half::f16;

use super::decode::decode_into;
use super::encode::quantize_into;
use super::{QK, QK_K};
use crate::cpu::memory::host;
use crate::cpu::{convert, CpuBackend};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec;
use crate::tensor::Tensor;

/// Blocks per parallel task of `quantize` / `dequantize`.
const BLOCKS_PER_TASK: usize = 64;

/// Quantizes float values into a GGUF block format or FP8 E4M3. The block formats follow
/// what ggml's `ggml_quantize_chunk` does without an importance matrix, step for step and
/// in the same f32 operation order: `quantize_row_*_ref` for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
/// MXFP4 and the K-quants (Q2_K, Q4_K and Q5_K with `make_qkx2_quants`, Q3_K with
/// `make_q3_quants`, Q6_K with `make_qx_quants`), and `quantize_iq4_nl` / `quantize_iq4_xs`
/// (7 scale tries each side) for the IQ4 formats. FP8 rounds to nearest even and saturates
/// at ±448.
///
/// # Shapes
/// `[..., n]` F32/F16/BF16, n a multiple of the block size → same shape, dtype `dtype`.
pub fn quantize(cpu: &CpuBackend, x: &Tensor, dtype: DType) -> Result<Tensor> {
    const OP: &str = "quantize";
    host(OP, x)?;
    spec::quant::quantize(x, dtype)?;
    let be = dtype.block_elems();
    let values = convert::f32_data(OP, "x", x)?;
    let mut out = Tensor::zeros(x.shape().clone(), dtype)?;
    // FP8 "blocks" are single bytes: give its tasks as many elements as 64 Q4_K blocks.
    let blocks_per_task = if be == 1 { BLOCKS_PER_TASK * QK_K } else { BLOCKS_PER_TASK };
    let (bb, elems_per_task) = (dtype.block_bytes(), blocks_per_task * be);
    let work = if be == QK_K { 256 } else { 8 };
    cpu.for_each_chunk(out.host_bytes_mut()?, blocks_per_task * bb, work, |i, bytes| {
        let start = i * elems_per_task;
        quantize_into(dtype, &values[start..start + bytes.len() / bb * be], bytes);
    });
    Ok(out)
}

/// Block format or FP8 E4M3 → f32 values.
///
/// # Shapes
/// any (block format or F8E4M3) → same shape, F32.
pub fn dequantize(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    const OP: &str = "dequantize";
    host(OP, x)?;
    let dtype = spec::quant::dequantize(x)?.dtype;
    let bytes = x.host_bytes()?;
    let mut out = Tensor::zeros(x.shape().clone(), DType::F32)?;
    let (be, bb) = (dtype.block_elems(), dtype.block_bytes());
    let elems_per_task = BLOCKS_PER_TASK * be.max(QK);
    cpu.for_each_chunk(out.as_mut_slice::<f32>()?, elems_per_task, 2, |i, chunk| {
        let start = i * elems_per_task / be * bb;
        decode_into(dtype, &bytes[start..start + chunk.len() / be * bb], chunk);
    });
    Ok(out)
}

/// Dequantizes one row of storage (`bytes` holds `out.len() / block_elems` whole blocks of
/// `dtype`, or `out.len()` plain F32/F16/BF16/F8E4M3 elements) into f32. Used by
/// `embedding` to gather rows of quantized tables.
pub fn dequantize_row_into(dtype: DType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    const OP: &str = "dequantize_row_into";
    if dtype == DType::U32 {
        return Err(Error::dtype(OP, "row", "a float, f8e4m3 or block format", dtype));
    }
    let be = dtype.block_elems();
    if !out.len().is_multiple_of(be) {
        return Err(Error::shape(
            OP,
            format!("row length for {dtype} blocks"),
            format!("a multiple of {be}"),
            out.len(),
        ));
    }
    let need = dtype.storage_bytes(out.len());
    if bytes.len() != need {
        return Err(Error::shape(
            OP,
            "row bytes",
            format!("{need} bytes for {} {dtype} values", out.len()),
            format!("{} bytes", bytes.len()),
        ));
    }
    match dtype {
        DType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        DType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        _ => decode_into(dtype, bytes, out),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_layout_puts_element_j_plus_16_in_the_high_nibble() {
        let cpu = CpuBackend::with_threads(1).unwrap();
        // max magnitude −8 → d = 1, so q = x + 8 exactly.
        let x: Vec<f32> = (0..32).map(|j| (j % 16) as f32 - 8.0).collect();
        let q = quantize(&cpu, &Tensor::from_vec(x.clone(), [32]).unwrap(), DType::Q4_0).unwrap();
        let b = q.host_bytes().unwrap();
        assert_eq!(f16::from_le_bytes([b[0], b[1]]).to_f32(), 1.0);
        for j in 0..16 {
            assert_eq!(b[2 + j], (j as u8) | ((j as u8) << 4));
        }
        let back = dequantize(&cpu, &q).unwrap();
        assert_eq!(back.to_vec_f32().unwrap(), x);
    }
}
