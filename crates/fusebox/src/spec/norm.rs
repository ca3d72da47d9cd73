//! Normalization: RMS and layer norm with their backwards, the fused residual-add RMS
//! norm, the gated norm and its backward, L2 norm and its backward, channel / group
//! norms, AdaLN modulation and plain normalization.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec::check;
use crate::tensor::Tensor;

/// A row-wise norm call: `rows` rows of `d ≥ 1` elements, in `dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowsSpec {
    /// Rows: the product of every dim but the last.
    pub rows: usize,
    /// The last dim D (≥ 1).
    pub d: usize,
    /// The input dtype (F32, F16 or BF16); outputs take it, statistics are F32.
    pub dtype: DType,
}

/// `eps` must be finite and non-negative.
pub fn eps(op: &'static str, eps: f32) -> Result<()> {
    if eps.is_finite() && eps >= 0.0 {
        Ok(())
    } else {
        Err(Error::value(op, "eps", "finite and ≥ 0", eps))
    }
}

/// A row-wise input `[..., D]`: float, rank ≥ 1, D ≥ 1.
pub fn rows(op: &'static str, what: &str, x: &Tensor) -> Result<RowsSpec> {
    check::float(op, what, x)?;
    check::min_rank(op, what, x, 1)?;
    let d = x.shape().last_dim();
    if d == 0 {
        return Err(Error::shape(op, format!("{what} last dim"), "at least 1", x.shape()));
    }
    Ok(RowsSpec { rows: x.elem_count() / d, d, dtype: x.dtype() })
}

/// An affine parameter: x's dtype (mixed dtypes are an error) and shape `[n]`.
pub fn vector(op: &'static str, what: &str, x: &Tensor, p: &Tensor, n: usize) -> Result<()> {
    check::same_dtype(op, what, x, p)?;
    check::shape(op, what, p, &[n])
}

/// A second operand of x's dtype and shape.
pub fn like(op: &'static str, what: &str, x: &Tensor, other: &Tensor) -> Result<()> {
    check::same_dtype(op, what, x, other)?;
    check::same_shape(op, what, x, other)
}

/// The shape of per-row statistics: x's shape without its last dim.
pub fn stat_dims(x: &Tensor) -> &[usize] {
    &x.dims()[..x.rank().saturating_sub(1)]
}

/// A saved statistic: F32 with shape `stat_dims(x)`.
pub fn stat(op: &'static str, what: &str, x: &Tensor, s: &Tensor) -> Result<()> {
    check::dtype(op, what, s, DType::F32)?;
    check::shape(op, what, s, stat_dims(x))
}

/// `rms_norm(x, weight, eps)`: x `[..., D]` float, weight `[D]` of its dtype, eps
/// finite and ≥ 0.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<RowsSpec> {
    const OP: &str = "rms_norm";
    let s = rows(OP, "x", x)?;
    vector(OP, "weight", x, weight, s.d)?;
    self::eps(OP, eps)?;
    Ok(s)
}

/// `rms_norm_backward(x, weight, rstd, d_out)`: as [`rms_norm`]; rstd F32 `[...]`,
/// d_out like x.
pub fn rms_norm_backward(x: &Tensor, weight: &Tensor, rstd: &Tensor, d_out: &Tensor) -> Result<RowsSpec> {
    const OP: &str = "rms_norm_backward";
    let s = rows(OP, "x", x)?;
    vector(OP, "weight", x, weight, s.d)?;
    stat(OP, "rstd", x, rstd)?;
    like(OP, "d_out", x, d_out)?;
    Ok(s)
}

/// `layer_norm(x, weight, bias, eps)`: x `[..., D]` float, weight and bias `[D]` of its
/// dtype, eps finite and ≥ 0.
pub fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<RowsSpec> {
    const OP: &str = "layer_norm";
    let s = rows(OP, "x", x)?;
    vector(OP, "weight", x, weight, s.d)?;
    vector(OP, "bias", x, bias, s.d)?;
    self::eps(OP, eps)?;
    Ok(s)
}

/// `layer_norm_backward(x, weight, mean, rstd, d_out)`: as [`layer_norm`]; mean and
/// rstd F32 `[...]`, d_out like x.
pub fn layer_norm_backward(
    x: &Tensor,
    weight: &Tensor,
    mean: &Tensor,
    rstd: &Tensor,
    d_out: &Tensor,
) -> Result<RowsSpec> {
    const OP: &str = "layer_norm_backward";
    let s = rows(OP, "x", x)?;
    vector(OP, "weight", x, weight, s.d)?;
    stat(OP, "mean", x, mean)?;
    stat(OP, "rstd", x, rstd)?;
    like(OP, "d_out", x, d_out)?;
    Ok(s)
}

/// `add_rms_norm(a, b, weight, eps)`: a `[..., D]` float, b like a, weight `[D]`.
pub fn add_rms_norm(a: &Tensor, b: &Tensor, weight: &Tensor, eps: f32) -> Result<RowsSpec> {
    const OP: &str = "add_rms_norm";
    let s = rows(OP, "a", a)?;
    like(OP, "b", a, b)?;
    vector(OP, "weight", a, weight, s.d)?;
    self::eps(OP, eps)?;
    Ok(s)
}

/// `rms_norm_gated(x, z, weight, eps)`: x `[..., D]` float, z like x, weight `[D]`.
pub fn rms_norm_gated(x: &Tensor, z: &Tensor, weight: &Tensor, eps: f32) -> Result<RowsSpec> {
    const OP: &str = "rms_norm_gated";
    let s = rows(OP, "x", x)?;
    like(OP, "z", x, z)?;
    vector(OP, "weight", x, weight, s.d)?;
    self::eps(OP, eps)?;
    Ok(s)
}

/// `rms_norm_gated_backward(x, z, weight, d_out, eps)`: as [`rms_norm_gated`]; d_out like x.
pub fn rms_norm_gated_backward(x: &Tensor, z: &Tensor, weight: &Tensor, d_out: &Tensor, eps: f32) -> Result<RowsSpec> {
    const OP: &str = "rms_norm_gated_backward";
    let s = rows(OP, "x", x)?;
    like(OP, "z", x, z)?;
    vector(OP, "weight", x, weight, s.d)?;
    like(OP, "d_out", x, d_out)?;
    self::eps(OP, eps)?;
    Ok(s)
}

/// `l2_norm(x, eps)`: x `[..., D]` float, eps finite and ≥ 0.
pub fn l2_norm(x: &Tensor, eps: f32) -> Result<RowsSpec> {
    const OP: &str = "l2_norm";
    let s = rows(OP, "x", x)?;
    self::eps(OP, eps)?;
    Ok(s)
}

/// `l2_norm_backward(x, rnorm, d_out)`: x `[..., D]` float, rnorm F32 `[...]`, d_out like x.
pub fn l2_norm_backward(x: &Tensor, rnorm: &Tensor, d_out: &Tensor) -> Result<RowsSpec> {
    const OP: &str = "l2_norm_backward";
    let s = rows(OP, "x", x)?;
    stat(OP, "rnorm", x, rnorm)?;
    like(OP, "d_out", x, d_out)?;
    Ok(s)
}

/// The sizes of a channel-wise norm of `[B, C, ...]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelSpec {
    /// Batch size B.
    pub batch: usize,
    /// Channels C (≥ 1 for `rms_norm_channel`).
    pub channels: usize,
    /// Elements per (batch, channel): the product of the dims after C.
    pub spatial: usize,
    /// The input dtype.
    pub dtype: DType,
}

/// `rms_norm_channel(x, weight, eps)`: x `[B, C, T]` float with C ≥ 1, weight `[C]`.
pub fn rms_norm_channel(x: &Tensor, weight: &Tensor, eps: f32) -> Result<ChannelSpec> {
    const OP: &str = "rms_norm_channel";
    check::float(OP, "x", x)?;
    check::rank(OP, "x", x, 3)?;
    let (batch, channels, spatial) = (x.dims()[0], x.dims()[1], x.dims()[2]);
    if channels == 0 {
        return Err(Error::shape(OP, "x channels", "at least 1", x.shape()));
    }
    vector(OP, "weight", x, weight, channels)?;
    self::eps(OP, eps)?;
    Ok(ChannelSpec { batch, channels, spatial, dtype: x.dtype() })
}

/// `group_norm(x, groups, weight, bias, eps)`: x `[B, C, ...]` float, `groups` a
/// divisor of C, weight and bias `[C]`.
pub fn group_norm(x: &Tensor, groups: usize, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<ChannelSpec> {
    const OP: &str = "group_norm";
    check::float(OP, "x", x)?;
    check::min_rank(OP, "x", x, 2)?;
    let (batch, channels) = (x.dims()[0], x.dims()[1]);
    if groups == 0 || channels % groups != 0 {
        return Err(Error::value(OP, "groups", format!("a divisor of the {channels} channels"), groups));
    }
    vector(OP, "weight", x, weight, channels)?;
    vector(OP, "bias", x, bias, channels)?;
    self::eps(OP, eps)?;
    Ok(ChannelSpec { batch, channels, spatial: x.dims()[2..].iter().product(), dtype: x.dtype() })
}

/// The sizes of an AdaLN modulation of `[B, T, D]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdalnSpec {
    /// Batch size B.
    pub batch: usize,
    /// Rows per batch T.
    pub seq: usize,
    /// Row length D (≥ 1).
    pub d: usize,
    /// The input dtype.
    pub dtype: DType,
}

/// `adaln_modulate(x, weight, scale, shift, eps)`: x `[B, T, D]` float with D ≥ 1,
/// weight `[D]`, scale and shift `[B, D]`, all of x's dtype.
pub fn adaln_modulate(x: &Tensor, weight: &Tensor, scale: &Tensor, shift: &Tensor, eps: f32) -> Result<AdalnSpec> {
    const OP: &str = "adaln_modulate";
    check::float(OP, "x", x)?;
    check::rank(OP, "x", x, 3)?;
    let (batch, seq, d) = (x.dims()[0], x.dims()[1], x.dims()[2]);
    if d == 0 {
        return Err(Error::shape(OP, "x last dim", "at least 1", x.shape()));
    }
    vector(OP, "weight", x, weight, d)?;
    for (what, p) in [("scale", scale), ("shift", shift)] {
        check::same_dtype(OP, what, x, p)?;
        check::shape(OP, what, p, &[batch, d])?;
    }
    self::eps(OP, eps)?;
    Ok(AdalnSpec { batch, seq, d, dtype: x.dtype() })
}

/// `normalize(x, eps)`: x `[..., D]` float, eps finite and ≥ 0.
pub fn normalize(x: &Tensor, eps: f32) -> Result<RowsSpec> {
    const OP: &str = "normalize";
    let s = rows(OP, "x", x)?;
    self::eps(OP, eps)?;
    Ok(s)
}
