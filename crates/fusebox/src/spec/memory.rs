//! Memory and dtype conversions: `zeros`, `copy_into`, `fill`, `cast` and the FP8 E4M3
//! decoders `f8e4m3_to_*` (`preprocess_linear_weight` is in [`super::quant`]). (`copy` takes any
//! tensor, so it has no rule to write here.)
//!
//! `cast`'s rules on values (ids exactly representable in f32, f32 values that are ids)
//! are [`ids_as_f32`] and [`f32_as_ids`], called where the values are read.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::spec::check;
use crate::tensor::Tensor;

/// `zeros(shape, dtype)`: any dtype; a block format needs a last dim of whole blocks,
/// and the tensor must be addressable (fewer than `isize::MAX` bytes). Returns its bytes.
pub fn zeros(shape: &Shape, dtype: DType) -> Result<usize> {
    const OP: &str = "zeros";
    let be = dtype.block_elems();
    if be > 1 && !shape.last_dim().is_multiple_of(be) {
        return Err(Error::shape(
            OP,
            format!("last dimension for {dtype} blocks"),
            format!("a multiple of {be}"),
            shape,
        ));
    }
    shape
        .checked_elem_count()
        .and_then(|n| (n / be).checked_mul(dtype.block_bytes()))
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| Error::value(OP, "size", "fewer than isize::MAX bytes", shape))
}

/// `copy_into(dst, src)`: src of dst's dtype and shape (any dtype). (That dst is writable
/// is a property of its storage, checked where it is written.)
pub fn copy_into(dst: &Tensor, src: &Tensor) -> Result<()> {
    const OP: &str = "copy_into";
    check::same_dtype(OP, "src", dst, src)?;
    check::same_shape(OP, "src", dst, src)
}

/// `fill(dst, value)`: dst float (any value, NaN included, is rounded once to its
/// dtype). Returns dst's dtype.
pub fn fill(dst: &Tensor) -> Result<DType> {
    check::float("fill", "dst", dst)?;
    Ok(dst.dtype())
}

/// What a valid `cast` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CastKind {
    /// To the same plain dtype: a copy.
    Copy,
    /// Between two different dtypes of F32, F16 and BF16 (round to nearest even).
    Float,
    /// U32 ids to F32 (each id must be exact in f32: [`ids_as_f32`]).
    IdsToF32,
    /// F32 to U32 ids (each value must be an id: [`f32_as_ids`]).
    F32ToIds,
}

/// A validated `cast`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CastSpec {
    /// x's dtype.
    pub from: DType,
    /// The target dtype.
    pub to: DType,
    /// The conversion.
    pub kind: CastKind,
}

/// `cast(x, dtype)`: among F32, F16 and BF16, between U32 and F32, or to x's own dtype
/// when that is one of those four. Block formats and FP8 go through
/// `quantize`/`dequantize`/`f8e4m3_to_*`.
pub fn cast(x: &Tensor, dtype: DType) -> Result<CastSpec> {
    let from = x.dtype();
    let plain = |d: DType| d.is_float() || d == DType::U32;
    let kind = match (from, dtype) {
        (f, t) if f == t && plain(f) => CastKind::Copy,
        (f, t) if f.is_float() && t.is_float() => CastKind::Float,
        (DType::U32, DType::F32) => CastKind::IdsToF32,
        (DType::F32, DType::U32) => CastKind::F32ToIds,
        _ => {
            return Err(Error::dtype(
                "cast",
                "conversion",
                "among f32, f16 and bf16, or between u32 and f32",
                format!("{from} → {dtype}"),
            ))
        }
    };
    Ok(CastSpec { from, to: dtype, kind })
}

/// The value rule of a U32 → F32 `cast`: every id exactly representable in f32 (any id
/// below 2²⁴ is).
pub fn ids_as_f32(ids: &[u32]) -> Result<()> {
    match ids.iter().find(|&&v| f64::from(v as f32) != f64::from(v)) {
        None => Ok(()),
        Some(&v) => Err(Error::value("cast", "u32 → f32 value", "an integer exactly representable in f32", v)),
    }
}

/// The value rule of an F32 → U32 `cast`: every value a non-negative integer ≤ u32::MAX
/// (NaN and infinities are not).
pub fn f32_as_ids(values: &[f32]) -> Result<()> {
    let valid = |v: f32| v >= 0.0 && v.fract() == 0.0 && f64::from(v) <= f64::from(u32::MAX);
    match values.iter().find(|&&v| !valid(v)) {
        None => Ok(()),
        Some(&v) => Err(Error::value("cast", "f32 → u32 value", "a non-negative integer ≤ 4294967295", v)),
    }
}

/// `f8e4m3_to_f32/f16/bf16(x)` as `f8e4m3_to(x, target)`: x F8E4M3 (any shape), the
/// target F32, F16 or BF16. Returns the op's name (`"f8e4m3_to_f32"`, …).
pub fn f8e4m3_to(x: &Tensor, target: DType) -> Result<&'static str> {
    let op = match target {
        DType::F32 => "f8e4m3_to_f32",
        DType::F16 => "f8e4m3_to_f16",
        DType::BF16 => "f8e4m3_to_bf16",
        other => return Err(Error::dtype("f8e4m3_to", "target", "f32, f16 or bf16", other)),
    };
    check::dtype(op, "x", x, DType::F8E4M3)?;
    Ok(op)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_are_classified_and_others_refused() {
        let x = Tensor::zeros([3], DType::F16).unwrap();
        assert_eq!(cast(&x, DType::BF16).unwrap().kind, CastKind::Float);
        assert_eq!(cast(&x, DType::F16).unwrap().kind, CastKind::Copy);
        let ids = Tensor::zeros([3], DType::U32).unwrap();
        assert_eq!(cast(&ids, DType::F32).unwrap().kind, CastKind::IdsToF32);
        let e = cast(&ids, DType::F16).unwrap_err().to_string();
        assert!(e.contains("cast") && e.contains("u32 → f16"), "{e}");
        assert!(ids_as_f32(&[0, 1 << 24]).is_ok());
        assert!(ids_as_f32(&[(1 << 24) + 1]).is_err());
        assert!(f32_as_ids(&[0.0, 7.0]).is_ok());
        for bad in [-1.0, 0.5, f32::NAN, f32::INFINITY] {
            assert!(f32_as_ids(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn memory_ops_check_their_arguments() {
        assert_eq!(zeros(&Shape::new(vec![2, 64]), DType::Q8_0).unwrap(), 2 * 2 * 34);
        let e = zeros(&Shape::new(vec![2, 33]), DType::Q8_0).unwrap_err().to_string();
        assert!(e.contains("zeros") && e.contains("multiple of 32"), "{e}");
        assert!(zeros(&Shape::new(vec![usize::MAX, 2]), DType::F32).is_err());
        let a = Tensor::zeros([2, 3], DType::F32).unwrap();
        let e = copy_into(&a, &Tensor::zeros([3, 2], DType::F32).unwrap()).unwrap_err().to_string();
        assert!(e.contains("copy_into") && e.contains("src"), "{e}");
        assert!(copy_into(&a, &Tensor::zeros([2, 3], DType::BF16).unwrap()).is_err());
        assert!(fill(&Tensor::zeros([2], DType::U32).unwrap()).is_err());
        let f8 = Tensor::zeros([4], DType::F8E4M3).unwrap();
        assert_eq!(f8e4m3_to(&f8, DType::BF16).unwrap(), "f8e4m3_to_bf16");
        let e = f8e4m3_to(&a, DType::F32).unwrap_err().to_string();
        assert!(e.contains("f8e4m3_to_f32") && e.contains('x'), "{e}");
        assert!(crate::spec::quant::preprocess_linear_weight(&Tensor::zeros([4], DType::F32).unwrap()).is_err());
        assert!(crate::spec::quant::preprocess_linear_weight(&Tensor::zeros([4, 2], DType::U32).unwrap()).is_err());
    }
}
