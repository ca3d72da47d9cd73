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

/// The fifth bit of element j of a Q5_0 / Q5_1 block: bit j of the little-endian u32 `qh`.
fn q5_high_bit(qh: &[u8], j: usize) -> u8 {
    (qh[j / 8] >> (j % 8)) & 1
}

/// Q5_0 block `{ f16 d; u8 qh[4]; u8 qs[16] }`: element j's low 4 bits are nibbles as
/// Q4_0, its fifth bit is bit j of qh; value `d · (q − 16)`.
pub fn q5_0_element(block: &[u8], j: usize) -> f64 {
    let d = f16_le(block, 0);
    let byte = block[6 + j % 16];
    let low = if j < 16 { byte & 0xF } else { byte >> 4 };
    let q = low as i32 + 16 * q5_high_bit(&block[2..6], j) as i32;
    d * (q - 16) as f64
}

/// Q5_1 block `{ f16 d; f16 m; u8 qh[4]; u8 qs[16] }`: bits as Q5_0; value `d · q + m`.
pub fn q5_1_element(block: &[u8], j: usize) -> f64 {
    let d = f16_le(block, 0);
    let m = f16_le(block, 2);
    let byte = block[8 + j % 16];
    let low = if j < 16 { byte & 0xF } else { byte >> 4 };
    let q = low as i32 + 16 * q5_high_bit(&block[4..8], j) as i32;
    d * q as f64 + m
}

/// IQ4_NL's table of 16 levels (ggml-common.h `kvalues_iq4nl`).
pub const IQ4NL_TABLE: [i32; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// IQ4_NL block `{ f16 d; u8 qs[16] }`: nibbles as Q4_0; value `d · table[q]`.
pub fn iq4_nl_element(block: &[u8], j: usize) -> f64 {
    let d = f16_le(block, 0);
    let byte = block[2 + j % 16];
    let q = if j < 16 { byte & 0xF } else { byte >> 4 };
    d * IQ4NL_TABLE[q as usize] as f64
}

/// MXFP4's levels: FP4 E2M1's values (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives)
/// doubled (ggml-common.h `kvalues_mxfp4`).
pub const MXFP4_TABLE: [i32; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// MXFP4 block `{ u8 e; u8 qs[16] }`: nibbles as Q4_0; the E8M0 byte e is the scale
/// 2^(e − 127), halved for the doubled table: value `2^(e − 128) · table[q]`.
pub fn mxfp4_element(block: &[u8], j: usize) -> f64 {
    let scale = 2f64.powi(block[0] as i32 - 128);
    let byte = block[1 + j % 16];
    let q = if j < 16 { byte & 0xF } else { byte >> 4 };
    scale * MXFP4_TABLE[q as usize] as f64
}

/// Q2_K block `{ u8 scales[16]; u8 qs[64]; f16 d; f16 dmin }` (256 elements): element j
/// is in half h = j / 128, shift group g = (j % 128) / 32, lane l = j % 32; q is bits
/// 2g, 2g + 1 of qs[32h + l]; scales[j / 16] holds the scale (low nibble) and min (high
/// nibble) of its sub-block of 16; value `d·scale·q − dmin·min`.
pub fn q2_k_element(block: &[u8], j: usize) -> f64 {
    let (h, g, l) = (j / 128, (j % 128) / 32, j % 32);
    let q = (block[16 + 32 * h + l] >> (2 * g)) & 3;
    let sc = block[j / 16];
    let d = f16_le(block, 80);
    let dmin = f16_le(block, 82);
    d * (sc & 0xF) as f64 * q as f64 - dmin * (sc >> 4) as f64
}

/// Q3_K block `{ u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }` (256 elements): element
/// j (h, g, l as Q2_K) has 2 low bits at 2g of qs[32h + l] and a high bit j / 32 of
/// hmask[j % 32]; q = low − 4 when the high bit is clear, else low. Sub-block s = j / 16
/// has a 6-bit scale: low 4 bits in the low (s < 8) or high (s ≥ 8) nibble of scales[s % 8],
/// top 2 bits at 2·(s / 4) of scales[8 + s % 4]; value `d · (scale − 32) · q`.
pub fn q3_k_element(block: &[u8], j: usize) -> f64 {
    let (h, g, l) = (j / 128, (j % 128) / 32, j % 32);
    let low = ((block[32 + 32 * h + l] >> (2 * g)) & 3) as i32;
    let high = (block[j % 32] >> (j / 32)) & 1;
    let q = if high == 1 { low } else { low - 4 };
    let scales = &block[96..108];
    let s = j / 16;
    let sc_low = if s < 8 { scales[s] & 0xF } else { scales[s - 8] >> 4 } as i32;
    let sc_high = ((scales[8 + s % 4] >> (2 * (s / 4))) & 3) as i32;
    let d = f16_le(block, 108);
    d * (sc_low + 16 * sc_high - 32) as f64 * q as f64
}

/// Q5_K block `{ f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }` (256
/// elements): sub-block s = j / 32 with scale and min as Q4_K's; the low 4 bits as Q4_K's
/// nibbles, the fifth bit is bit s of qh[j % 32]; value `d·scale·q − dmin·min`.
pub fn q5_k_element(block: &[u8], j: usize) -> f64 {
    let d = f16_le(block, 0);
    let dmin = f16_le(block, 2);
    let (s, l) = (j / 32, j % 32);
    let byte = block[48 + 32 * (s / 2) + l];
    let low = if s.is_multiple_of(2) { byte & 0xF } else { byte >> 4 };
    let q = low as u32 + 16 * ((block[16 + l] >> s) & 1) as u32;
    let (scale, min) = q4_k_scale_min(&block[4..16], s);
    d * scale as f64 * q as f64 - dmin * min as f64
}

/// IQ4_XS block `{ f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] }` (256 elements):
/// sub-block s = j / 32 has a 6-bit scale, low 4 bits in nibble s % 2 of scales_l[s / 2],
/// top 2 bits at 2s of scales_h; within it element i = j % 32 is the low (i < 16) or high
/// nibble of qs[16s + i % 16]; value `d · (scale − 32) · table[q]`.
pub fn iq4_xs_element(block: &[u8], j: usize) -> f64 {
    let d = f16_le(block, 0);
    let scales_h = u16::from_le_bytes([block[2], block[3]]) as i32;
    let (s, i) = (j / 32, j % 32);
    let sc = ((block[4 + s / 2] >> (4 * (s % 2))) & 0xF) as i32 + 16 * ((scales_h >> (2 * s)) & 3);
    let byte = block[8 + 16 * s + i % 16];
    let q = if i < 16 { byte & 0xF } else { byte >> 4 };
    d * (sc - 32) as f64 * IQ4NL_TABLE[q as usize] as f64
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
            DType::Q5_0 => q5_0_element(block, j),
            DType::Q5_1 => q5_1_element(block, j),
            DType::IQ4NL => iq4_nl_element(block, j),
            DType::Q2K => q2_k_element(block, j),
            DType::Q3K => q3_k_element(block, j),
            DType::Q5K => q5_k_element(block, j),
            DType::IQ4XS => iq4_xs_element(block, j),
            DType::MXFP4 => mxfp4_element(block, j),
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

/// `quantized_matmul_backward`: `dx[..., i] = Σ_o dy[..., o] · W[o, i]` with W already
/// dequantized (`[out, in]`), summed in f64 — the gradient of `Σ dy · quantized_matmul(x, W)`
/// with respect to x.
pub fn quantized_matmul_backward(dy: &Array, w: &Array) -> Array {
    let (n, k) = (w.shape[0], w.shape[1]);
    let m = dy.rows();
    let mut shape = dy.shape.clone();
    *shape.last_mut().unwrap() = k;
    let mut dx = Array::zeros(shape);
    for r in 0..m {
        for i in 0..k {
            let mut acc = 0.0;
            for o in 0..n {
                acc += dy.data[r * n + o] * w.data[o * k + i];
            }
            dx.data[r * k + i] = acc;
        }
    }
    dx
}

/// x rounded to 8 bits per run of `block` elements along its last dim, as a decoding
/// `quantized_matmul` may use it (`fusebox::spec::quant::int_activation_block`):
/// `d = max|x| / 127`, `x̃ = d·round(x·(1/d))` (half away from zero), the scale and the
/// rounding computed in f32 as the definition states.
pub fn round_activations(x: &Array, block: usize) -> Array {
    let mut out = x.clone();
    for run in out.data.chunks_mut(block) {
        let amax = run.iter().fold(0.0f32, |m, &v| m.max((v as f32).abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for v in run.iter_mut() {
            let q = ((*v as f32) * id).round().clamp(-127.0, 127.0);
            *v = f64::from(q) * f64::from(d);
        }
    }
    out
}
