//! Element types: compute dtypes (F32, F16, BF16), ids (U32) and weight-storage
//! formats (FP8 E4M3 and the GGUF block quantizations).

use std::fmt;

/// The dtype of a tensor's elements.
///
/// Block formats store `block_elems()` logical elements in `block_bytes()` bytes;
/// a tensor of such a dtype must have a last dimension that is a multiple of the
/// block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    BF16,
    /// 32-bit unsigned integer (token ids, indices).
    U32,
    /// FP8 E4M3 (OCP "fn" variant: no infinities, 0x7F/0xFF are NaN), weights only.
    F8E4M3,
    /// GGUF Q8_0: blocks of 32, one f16 scale `d`, 32 × i8; x = d·q.
    Q8_0,
    /// GGUF Q4_0: blocks of 32, one f16 scale, 16 bytes of nibbles; x = d·(q − 8).
    Q4_0,
    /// GGUF Q4_1: blocks of 32, f16 scale and f16 min, 16 bytes of nibbles; x = d·q + m.
    Q4_1,
    /// GGUF Q4_K: super-blocks of 256 with 8 sub-blocks of 32, 6-bit scales and mins.
    Q4K,
    /// GGUF Q6_K: super-blocks of 256 with 16 sub-blocks of 16, 6-bit quants, i8 scales.
    Q6K,
    /// GGUF Q5_0: blocks of 32, one f16 scale, 4 bytes of fifth bits, 16 bytes of nibbles;
    /// x = d·(q − 16).
    Q5_0,
    /// GGUF Q5_1: blocks of 32, f16 scale and f16 min, fifth bits and nibbles as Q5_0;
    /// x = d·q + m.
    Q5_1,
    /// GGUF Q2_K: super-blocks of 256 with 16 sub-blocks of 16, 4-bit scales and mins,
    /// 2-bit quants; x = d·sc·q − dmin·m.
    Q2K,
    /// GGUF Q3_K: super-blocks of 256 with 16 sub-blocks of 16, 6-bit signed scales, 3-bit
    /// quants (2 low bits and a high-bit mask); x = d·(sc − 32)·(q − 4).
    Q3K,
    /// GGUF Q5_K: super-blocks of 256 with 8 sub-blocks of 32, 6-bit scales and mins (as
    /// Q4_K), 5-bit quants; x = d·sc·q − dmin·m.
    Q5K,
    /// GGUF IQ4_NL: blocks of 32, one f16 scale, 4-bit indices into a fixed non-linear
    /// table of 16 levels (−127 … 113); x = d·table\[q\].
    IQ4NL,
    /// GGUF IQ4_XS: super-blocks of 256 with 8 sub-blocks of 32, 6-bit signed sub-block
    /// scales, indices into IQ4_NL's table; x = d·(ls − 32)·table\[q\].
    IQ4XS,
    /// GGUF MXFP4 (OCP microscaling FP4, gpt-oss's expert weights): blocks of 32, one E8M0
    /// scale byte `e`, 16 bytes of 4-bit indices into FP4 E2M1's levels doubled (0, 1, 2,
    /// 3, 4, 6, 8, 12 and their negatives); x = 2^(e − 128)·table\[q\].
    MXFP4,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 18] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::U32,
        DType::F8E4M3,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q4K,
        DType::Q6K,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q2K,
        DType::Q3K,
        DType::Q5K,
        DType::IQ4NL,
        DType::IQ4XS,
        DType::MXFP4,
    ];

    /// Logical elements per storage block (1 for plain dtypes).
    pub fn block_elems(self) -> usize {
        match self {
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::IQ4NL | DType::MXFP4 => 32,
            DType::Q4K | DType::Q6K | DType::Q2K | DType::Q3K | DType::Q5K | DType::IQ4XS => 256,
            _ => 1,
        }
    }

    /// Bytes per storage block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F8E4M3 => 1,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q4K => 144,
            DType::Q6K => 210,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q2K => 84,
            DType::Q3K => 110,
            DType::Q5K => 176,
            DType::IQ4NL => 18,
            DType::IQ4XS => 136,
            DType::MXFP4 => 17,
        }
    }

    /// Bytes taken by `elems` logical elements (which must be a multiple of the block size).
    pub fn storage_bytes(self, elems: usize) -> usize {
        elems / self.block_elems() * self.block_bytes()
    }

    /// F32, F16 or BF16: the dtypes arithmetic ops accept.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// The GGUF block formats.
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Short lower-case name (`f32`, `q4_k`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::U32 => "u32",
            DType::F8E4M3 => "f8e4m3",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q4K => "q4_k",
            DType::Q6K => "q6_k",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q2K => "q2_k",
            DType::Q3K => "q3_k",
            DType::Q5K => "q5_k",
            DType::IQ4NL => "iq4_nl",
            DType::IQ4XS => "iq4_xs",
            DType::MXFP4 => "mxfp4",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A host element type that a tensor can be built from and read back as.
pub trait Element: Copy + Send + Sync + 'static {
    /// The dtype matching this Rust type.
    const DTYPE: DType;
}
impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
}
impl Element for u32 {
    const DTYPE: DType = DType::U32;
}
