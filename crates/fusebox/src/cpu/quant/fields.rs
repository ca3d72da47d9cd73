//! Readers of the packed fields of blocks, shared by the decoders, the fused dots and
//! the integer kernels: little-endian f16 and u32, the 6-bit scales of the K formats,
//! Q5's fifth bits, the level tables of IQ4 and MXFP4 with MXFP4's E8M0 scale, and
//! [`LevelTable`], which describes the two 32-element table formats once (the layouts
//! are in the parent's table).

use half::f16;

use super::QK;

/// The little-endian f16 at `bytes[at..at + 2]`, as f32.
#[inline(always)]
pub(super) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K block from its 12 packed
/// bytes (ggml's `get_scale_min_k4`): sub-blocks 0–3 keep theirs in the low 6 bits of
/// bytes j and j + 4; sub-blocks 4–7 keep 4 low bits in byte j + 4 (scale low nibble,
/// min high nibble) and their top 2 bits in the top bits of bytes j − 4 (scale) and j (min).
#[inline(always)]
pub fn scale_min_k4(j: usize, scales: &[u8]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        ((scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4), (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4))
    }
}

/// IQ4_NL's (and IQ4_XS's) 16 non-linear levels (ggml's `kvalues_iq4nl`).
pub const IQ4NL_VALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// MXFP4's 16 levels: the FP4 E2M1 values (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
/// negatives) doubled, so that they are integers (ggml's `kvalues_mxfp4`); the block's
/// E8M0 scale `2^(e − 127)` is halved to match: `x = 2^(e − 128)·MXFP4_VALUES[q]`.
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^(e − 128)` for an E8M0 byte `e`: half the scale `2^(e − 127)` it encodes, the factor
/// of MXFP4's doubled levels (ggml's `GGML_E8M0_TO_FP32_HALF`): `e − 1` in the f32
/// exponent field for e ≥ 2, the subnormals 2⁻¹²⁸ and 2⁻¹²⁷ for e = 0 and 1. ggml reads
/// e = 255 (E8M0's NaN) as 2¹²⁷ and so does this.
#[inline(always)]
pub(super) fn e8m0_half(e: u8) -> f32 {
    E8M0_HALF[usize::from(e)]
}

/// [`e8m0_half`] of every byte: one load where the kernels need a block's scale, in
/// place of the branch and shifts (1 KiB, which stays in L1 while weights stream).
static E8M0_HALF: [f32; 256] = {
    let mut table = [0.0f32; 256];
    let mut e = 0;
    while e < 256 {
        let bits = if e < 2 { 0x0020_0000u32 << e } else { (e as u32 - 1) << 23 };
        table[e] = f32::from_bits(bits);
        e += 1;
    }
    table
};

/// How a [`LevelTable`] format stores its block scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TableScale {
    /// A little-endian f16 at byte 0 (IQ4_NL).
    F16,
    /// An E8M0 byte at byte 0, read as [`e8m0_half`] (MXFP4).
    E8m0Half,
}

/// A 32-element block format of one scale and 16 bytes of 4-bit indices into a table of
/// 16 signed integer levels, element j < 16 in the low nibble of byte j, element j + 16 in
/// its high nibble: `x = scale·VALUES[q]`. IQ4_NL and MXFP4 differ only in the table and
/// in how the scale is stored, so their decoders, dots and integer kernels are written
/// once, generic over this.
pub(super) trait LevelTable {
    /// Bytes per block.
    const BYTES: usize;
    /// Where the 16 bytes of indices start.
    const QS_AT: usize;
    /// The levels.
    const VALUES: [i8; 16];
    /// The scale's storage.
    const SCALE: TableScale;

    /// The scale of the block `b`.
    #[inline(always)]
    fn scale(b: &[u8]) -> f32 {
        match Self::SCALE {
            TableScale::F16 => f16_at(b, 0),
            TableScale::E8m0Half => e8m0_half(b[0]),
        }
    }
}

/// IQ4_NL: `{ f16 d; u8 qs[16] }`, [`IQ4NL_VALUES`].
pub(super) struct Iq4Nl;
impl LevelTable for Iq4Nl {
    const BYTES: usize = 18;
    const QS_AT: usize = 2;
    const VALUES: [i8; 16] = IQ4NL_VALUES;
    const SCALE: TableScale = TableScale::F16;
}

/// MXFP4: `{ u8 e; u8 qs[16] }`, [`MXFP4_VALUES`].
pub(super) struct Mxfp4;
impl LevelTable for Mxfp4 {
    const BYTES: usize = 17;
    const QS_AT: usize = 1;
    const VALUES: [i8; 16] = MXFP4_VALUES;
    const SCALE: TableScale = TableScale::E8m0Half;
}

/// The little-endian u32 at `bytes[at..at + 4]`.
#[inline(always)]
pub(super) fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// The 5-bit values of a Q5_0 / Q5_1 block: element j < 16 is the low nibble of `qs[j]`
/// with bit j of `qh` on top, element j + 16 the high nibble with bit j + 16.
#[inline(always)]
pub(super) fn q5_levels(qh: u32, qs: &[u8]) -> [u8; QK] {
    let mut q = [0u8; QK];
    for j in 0..QK / 2 {
        q[j] = (qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

/// The 16 signed 6-bit scales (`−32..32`) of a Q3_K block from its 12 packed bytes:
/// scale s keeps its low 4 bits in byte s (s < 8, low nibble) or s − 8 (high nibble), and
/// its top 2 bits at bits 2(s/4).. of byte 8 + s % 4.
#[inline(always)]
pub fn q3_k_scales(packed: &[u8]) -> [i8; 16] {
    std::array::from_fn(|s| {
        let low = if s < 8 { packed[s] & 0x0F } else { packed[s - 8] >> 4 };
        let high = (packed[8 + s % 4] >> (2 * (s / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    })
}

/// The signed 6-bit scale (`−32..32`) of sub-block `ib` (0..8) of an IQ4_XS block: 4 low
/// bits in a nibble of `scales_l[ib / 2]`, 2 high bits at 2·ib of `scales_h`.
#[inline(always)]
pub(super) fn iq4_xs_scale(b: &[u8], ib: usize) -> i32 {
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
    let high = ((scales_h >> (2 * ib)) & 3) as u8;
    i32::from(low | (high << 4)) - 32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_is_two_to_the_e_minus_128_subnormals_included() {
        for e in 0..=255u8 {
            assert_eq!(f64::from(e8m0_half(e)), 2f64.powi(i32::from(e) - 128), "e = {e}");
        }
        assert_eq!(Mxfp4::scale(&[128, 0]), 1.0);
        assert_eq!(Iq4Nl::scale(&half::f16::from_f32(-0.25).to_le_bytes()), -0.25);
    }
}
