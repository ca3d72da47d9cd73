//! ggml tensor types: the `u32` tag a GGUF tensor info stores, its block layout,
//! and the [`DType`] fusebox uses for it.

use std::fmt;

use fusebox::DType;

/// A ggml tensor type tag as stored in the file, known or not.
///
/// Unknown tags are kept as they are: a file with a tensor of a type this crate
/// does not know still opens, and only asking for that tensor fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

/// `(tag, name, elements per block, bytes per block)` for the ggml types whose
/// layout is known here (ggml's `type_traits`). Tags 4, 5, 31–33 and 36–38 were
/// removed from ggml and are absent.
const TABLE: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
];

impl GgmlType {
    /// 32-bit float.
    pub const F32: GgmlType = GgmlType(0);
    /// 16-bit IEEE float.
    pub const F16: GgmlType = GgmlType(1);
    /// Blocks of 32: an f16 scale and 4-bit values (x = d·(q − 8)).
    pub const Q4_0: GgmlType = GgmlType(2);
    /// Blocks of 32: f16 scale and minimum, 4-bit values (x = d·q + m).
    pub const Q4_1: GgmlType = GgmlType(3);
    /// Blocks of 32: an f16 scale and 5-bit values (x = d·(q − 16)).
    pub const Q5_0: GgmlType = GgmlType(6);
    /// Blocks of 32: f16 scale and minimum, 5-bit values (x = d·q + m).
    pub const Q5_1: GgmlType = GgmlType(7);
    /// Blocks of 32: an f16 scale and 8-bit values (x = d·q).
    pub const Q8_0: GgmlType = GgmlType(8);
    /// Super-blocks of 256 with 4-bit sub-block scales and minima, 2-bit values.
    pub const Q2_K: GgmlType = GgmlType(10);
    /// Super-blocks of 256 with 6-bit signed sub-block scales, 3-bit values.
    pub const Q3_K: GgmlType = GgmlType(11);
    /// Super-blocks of 256 with 6-bit sub-block scales and minima, 4-bit values.
    pub const Q4_K: GgmlType = GgmlType(12);
    /// Super-blocks of 256 with 6-bit sub-block scales and minima, 5-bit values.
    pub const Q5_K: GgmlType = GgmlType(13);
    /// Super-blocks of 256 with 8-bit sub-block scales, 6-bit values.
    pub const Q6_K: GgmlType = GgmlType(14);
    /// Blocks of 32: an f16 scale and 4-bit indices into a non-linear table.
    pub const IQ4_NL: GgmlType = GgmlType(20);
    /// Super-blocks of 256 with 6-bit sub-block scales, 4-bit indices into IQ4_NL's table.
    pub const IQ4_XS: GgmlType = GgmlType(23);
    /// bfloat16.
    pub const BF16: GgmlType = GgmlType(30);
    /// Blocks of 32: an E8M0 exponent byte and 4-bit indices into FP4 E2M1's levels
    /// (OCP MXFP4; gpt-oss's expert weights).
    pub const MXFP4: GgmlType = GgmlType(39);

    fn entry(self) -> Option<&'static (u32, &'static str, u64, u64)> {
        TABLE.iter().find(|e| e.0 == self.0)
    }

    /// ggml's name for the type (`Q4_K`), or `None` for a tag not known here.
    pub fn name(self) -> Option<&'static str> {
        self.entry().map(|e| e.1)
    }

    /// `(elements per block, bytes per block)`, when the layout is known.
    pub fn block_layout(self) -> Option<(u64, u64)> {
        self.entry().map(|e| (e.2, e.3))
    }

    /// The fusebox dtype holding this type's bytes unchanged, if there is one.
    pub fn dtype(self) -> Option<DType> {
        Some(match self {
            GgmlType::F32 => DType::F32,
            GgmlType::F16 => DType::F16,
            GgmlType::Q4_0 => DType::Q4_0,
            GgmlType::Q4_1 => DType::Q4_1,
            GgmlType::Q8_0 => DType::Q8_0,
            GgmlType::Q4_K => DType::Q4K,
            GgmlType::Q6_K => DType::Q6K,
            GgmlType::BF16 => DType::BF16,
            GgmlType::Q5_0 => DType::Q5_0,
            GgmlType::Q5_1 => DType::Q5_1,
            GgmlType::Q2_K => DType::Q2K,
            GgmlType::Q3_K => DType::Q3K,
            GgmlType::Q5_K => DType::Q5K,
            GgmlType::IQ4_NL => DType::IQ4NL,
            GgmlType::IQ4_XS => DType::IQ4XS,
            GgmlType::MXFP4 => DType::MXFP4,
            _ => return None,
        })
    }

    /// The ggml type storing a fusebox dtype, if GGUF has one.
    pub fn from_dtype(dtype: DType) -> Option<GgmlType> {
        Some(match dtype {
            DType::F32 => GgmlType::F32,
            DType::F16 => GgmlType::F16,
            DType::Q4_0 => GgmlType::Q4_0,
            DType::Q4_1 => GgmlType::Q4_1,
            DType::Q8_0 => GgmlType::Q8_0,
            DType::Q4K => GgmlType::Q4_K,
            DType::Q6K => GgmlType::Q6_K,
            DType::BF16 => GgmlType::BF16,
            DType::Q5_0 => GgmlType::Q5_0,
            DType::Q5_1 => GgmlType::Q5_1,
            DType::Q2K => GgmlType::Q2_K,
            DType::Q3K => GgmlType::Q3_K,
            DType::Q5K => GgmlType::Q5_K,
            DType::IQ4NL => GgmlType::IQ4_NL,
            DType::IQ4XS => GgmlType::IQ4_XS,
            DType::MXFP4 => GgmlType::MXFP4,
            _ => return None,
        })
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "unknown ggml type {}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every dtype with a ggml type maps back to itself with ggml's block layout
    /// (MXFP4: type 39, blocks of 32 in 17 bytes).
    #[test]
    fn dtypes_and_ggml_types_map_both_ways_with_the_same_block_layout() {
        for dtype in DType::ALL {
            let Some(t) = GgmlType::from_dtype(dtype) else { continue };
            assert_eq!(t.dtype(), Some(dtype), "{dtype}");
            let (elems, bytes) = t.block_layout().expect("known layout");
            assert_eq!((elems as usize, bytes as usize), (dtype.block_elems(), dtype.block_bytes()), "{dtype}");
        }
        assert_eq!(GgmlType::from_dtype(DType::MXFP4), Some(GgmlType(39)));
        assert_eq!(GgmlType(39).name(), Some("MXFP4"));
    }
}
