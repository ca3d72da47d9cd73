//! f64 twins of the quant family: the value of every element of every GGUF block format,
//! read from the layout one element at a time (ggml-common.h), and `x · dequant(W)ᵀ`.

use fusebox::DType;

use crate::array::Array;
use crate::reference::memory::f8e4m3_value;

/// The little-endian f16 at `b[at..at + 2]`.
fn f16_le(b: &[u8], at: usize) -> f64 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f64()
}

/// Q8_0 block `{ f16 d; i8 qs[32] }`: element j is `d · qs[j]`.
pub fn q8_0_element(block: &[u8], j: usize) -> f64 {
    let d = f16_le(block, 0);
    let q = block[2 + j] as i8;
    d * q as f64
}

/// Q4_0 block `{ f16 d; u8 qs[16] }`: element j < 16 is the low nibble of `qs[j]`,
/// element j ≥ 16 the high nibble of `qs[j − 16]`; value `d · (q − 8)`.
pub fn q4_0_element(block: &[u8], j: usize) -> f64 {
    let d = f16_le(block, 0);
    let byte = block[2 + j % 16];
    let q = if j < 16 { byte & 0xF } else { byte >> 4 };
    d * (q as f64 - 8.0)
}

/// Q4_1 block `{ f16 d; f16 m; u8 qs[16] }`: nibbles as Q4_0; value `d · q + m`.
pub fn q4_1_element(block: &[u8], j: usize) -> f64 {
    let d = f16_le(block, 0);
    let m = f16_le(block, 2);
    let byte = block[4 + j % 16];
    let q = if j < 16 { byte & 0xF } else { byte >> 4 };
    d * q as f64 + m
}

/// The 6-bit scale and min of sub-block `s` (0..8) of a Q4_K block, from its 12 scale bytes:
/// sub-blocks 0..4 store scale and min in the low 6 bits of bytes s and s + 4; sub-blocks
/// 4..8 store their low 4 bits in byte s + 4 (scale in the low nibble, min in the high one)
/// and their top 2 bits in bits 6–7 of byte s − 4 (scale) and byte s (min).
pub fn q4_k_scale_min(scales: &[u8], s: usize) -> (u32, u32) {
    if s < 4 {
        ((scales[s] & 63) as u32, (scales[s + 4] & 63) as u32)
    } else {
        let scale = (scales[s + 4] & 0xF) as u32 + ((scales[s - 4] >> 6) as u32) * 16;
        let min = (scales[s + 4] >> 4) as u32 + ((scales[s] >> 6) as u32) * 16;
        (scale, min)
    }
}

/// Q4_K block `{ f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }` (256 elements): element j
/// is in sub-block s = j / 32; sub-blocks 2i and 2i + 1 share qs[32i..32i + 32], the even
/// one in the low nibbles, the odd one in the high nibbles; value `d·scale·q − dmin·min`.
pub fn q4_k_element(block: &[u8], j: usize) -> f64 {
    let d = f16_le(block, 0);
    let dmin = f16_le(block, 2);
    let scales = &block[4..16];
    let qs = &block[16..144];
    let s = j / 32;
    let l = j % 32;
    let byte = qs[32 * (s / 2) + l];
    let q = if s.is_multiple_of(2) { byte & 0xF } else { byte >> 4 };
    let (scale, min) = q4_k_scale_min(scales, s);
    d * scale as f64 * q as f64 - dmin * min as f64
}

/// Q6_K block `{ u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }` (256 elements): element
/// j is in half h = j / 128, quarter g = (j % 128) / 32, lane l = j % 32. Its low 4 bits
/// are in ql[64h + l + 32·(g % 2)] (low nibble for g < 2, high nibble otherwise), its top
/// 2 bits are bits 2g, 2g + 1 of qh[32h + l]; q = bits − 32; value `d · scales[j / 16] · q`.
pub fn q6_k_element(block: &[u8], j: usize) -> f64 {
    let ql = &block[0..128];
    let qh = &block[128..192];
    let scales = &block[192..208];
    let d = f16_le(block, 208);
    let h = j / 128;
    let g = (j % 128) / 32;
    let l = j % 32;
    let low_byte = ql[64 * h + l + 32 * (g % 2)];
    let low = if g < 2 { low_byte & 0xF } else { low_byte >> 4 };
    let high = (qh[32 * h + l] >> (2 * g)) & 3;
    let q = (low as i32 + 16 * high as i32) - 32;
    let scale = scales[j / 16] as i8;
    d * scale as f64 * q as f64
}

/// `dequantize`: every element of a tensor of `dtype` (a block format or F8E4M3) stored
/// in `bytes`, with `shape`.
pub fn dequantize(dtype: DType, bytes: &[u8], shape: &[usize]) -> Array {
    let n: usize = shape.iter().product();
    let be = dtype.block_elems();
    let bb = dtype.block_bytes();
    let mut out = Array::zeros(shape.to_vec());
    for i in 0..n {
        let block = &bytes[(i / be) * bb..(i / be + 1) * bb];
        let j = i % be;
        out.data[i] = match dtype {
            DType::Q8_0 => q8_0_element(block, j),
            DType::Q4_0 => q4_0_element(block, j),
            DType::Q4_1 => q4_1_element(block, j),
            DType::Q4K => q4_k_element(block, j),
            DType::Q6K => q6_k_element(block, j),
            DType::F8E4M3 => f8e4m3_value(block[0]),
            other => panic!("dequantize twin: {other} is not a storage format"),
        };
    }
    out
}

/// `quantized_matmul`: `y[..., o] = Σ_i x[..., i] · W[o, i]` with W already dequantized
/// (`[out, in]`), summed in f64.
pub fn quantized_matmul(x: &Array, w: &Array) -> Array {
    let k = x.last_dim();
    let n = w.shape[0];
    let m = x.rows();
    let mut shape = x.shape.clone();
    *shape.last_mut().unwrap() = n;
    let mut y = Array::zeros(shape);
    for r in 0..m {
        for o in 0..n {
            let mut acc = 0.0;
            for i in 0..k {
                acc += x.data[r * k + i] * w.data[o * k + i];
            }
            y.data[r * n + o] = acc;
        }
    }
    y
}
