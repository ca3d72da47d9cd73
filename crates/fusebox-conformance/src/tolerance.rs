//! `Tolerance`: how close a backend's result must be to the f64 twin.

use fusebox::DType;

use crate::array::Array;

/// Passes when `|got − want| ≤ abs + rel·|want|` for every element (NaN only matches NaN,
/// infinities must match exactly).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Absolute tolerance.
    pub abs: f64,
    /// Relative tolerance, a fraction of the reference value's magnitude.
    pub rel: f64,
}

impl Tolerance {
    /// f32 kernels with short reductions.
    pub const F32: Tolerance = Tolerance { abs: 1e-5, rel: 1e-4 };
    /// f32 kernels with long reductions or a fast exp (attention, big matmuls).
    pub const F32_LOOSE: Tolerance = Tolerance { abs: 1e-4, rel: 1e-3 };
    /// Inputs and outputs rounded to f16.
    pub const F16: Tolerance = Tolerance { abs: 2e-3, rel: 4e-3 };
    /// Inputs and outputs rounded to bf16 (8 bits of mantissa).
    pub const BF16: Tolerance = Tolerance { abs: 1.6e-2, rel: 1.6e-2 };
    /// Exact results (layout ops, ids, integer values).
    pub const EXACT: Tolerance = Tolerance { abs: 0.0, rel: 0.0 };
    /// Twin gradients against central finite differences in f64.
    pub const FINITE_DIFF: Tolerance = Tolerance { abs: 1e-6, rel: 1e-5 };

    /// The default for results in `dtype`.
    pub fn for_dtype(dtype: DType) -> Tolerance {
        match dtype {
            DType::F16 => Tolerance::F16,
            DType::BF16 => Tolerance::BF16,
            DType::U32 => Tolerance::EXACT,
            _ => Tolerance::F32,
        }
    }

    /// The looser of `self` and `other` per component.
    pub fn max(self, other: Tolerance) -> Tolerance {
        Tolerance { abs: self.abs.max(other.abs), rel: self.rel.max(other.rel) }
    }

    /// `Ok` when `got` matches `want`, else a message naming the worst element.
    pub fn check(&self, what: &str, got: &Array, want: &Array) -> Result<(), String> {
        if got.shape != want.shape {
            return Err(format!("{what}: shape {:?}, twin has {:?}", got.shape, want.shape));
        }
        let mut worst: Option<(usize, f64)> = None;
        for (i, (&g, &w)) in got.data.iter().zip(&want.data).enumerate() {
            let excess = if w.is_nan() || g.is_nan() {
                if w.is_nan() && g.is_nan() {
                    continue;
                }
                f64::INFINITY
            } else if w.is_infinite() || g.is_infinite() {
                if g == w {
                    continue;
                }
                f64::INFINITY
            } else {
                (g - w).abs() - (self.abs + self.rel * w.abs())
            };
            if excess > 0.0 && worst.is_none_or(|(_, e)| excess > e) {
                worst = Some((i, excess));
            }
        }
        match worst {
            None => Ok(()),
            Some((i, _)) => {
                let bad = got.data.iter().zip(&want.data).filter(|&(&g, &w)| {
                    !((g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= self.abs + self.rel * w.abs())
                });
                Err(format!(
                    "{what}: {} of {} elements off; worst at flat index {i}: got {}, twin {} (tolerance abs {:e} rel {:e})",
                    bad.count(),
                    got.len(),
                    got.data[i],
                    want.data[i],
                    self.abs,
                    self.rel
                ))
            }
        }
    }
}
