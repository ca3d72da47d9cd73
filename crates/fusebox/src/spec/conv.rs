//! Convolutions: `conv1d`, `conv2d`, `conv_transpose1d` and the causal depthwise forms
//! (`depthwise_conv1d_silu`, `depthwise_conv1d_bias`, their `_ctx` forms over a carried
//! context, and the SiLU form's backward).

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec::check;
use crate::tensor::Tensor;
use crate::types::{Conv1dConfig, Conv2dConfig};

/// A validated (grouped, strided, padded, dilated) 2-d cross-correlation. A 1-d
/// convolution is the case `h = kh = 1`, stride/padding/dilation 1/0/1 along h.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conv2dSpec {
    /// Batch size B.
    pub batch: usize,
    /// Input channels Cin.
    pub cin: usize,
    /// Input height H (1 for `conv1d`).
    pub h: usize,
    /// Input width W (the length L for `conv1d`).
    pub w: usize,
    /// Output channels Cout.
    pub cout: usize,
    /// Channel groups (dividing Cin and Cout).
    pub groups: usize,
    /// Kernel height Kh ≥ 1 (1 for `conv1d`).
    pub kh: usize,
    /// Kernel width Kw ≥ 1.
    pub kw: usize,
    /// Step between output positions (height, width).
    pub stride: (usize, usize),
    /// Zeros added at each end (height, width).
    pub padding: (usize, usize),
    /// Spacing between kernel taps (height, width).
    pub dilation: (usize, usize),
    /// Output height Ho (1 for `conv1d`).
    pub ho: usize,
    /// Output width Wo.
    pub wo: usize,
    /// The output's dims: `[B, Cout, Ho, Wo]` (`[B, Cout, Wo]` for `conv1d`).
    pub out_dims: Vec<usize>,
    /// The dtype of x, w and the bias (F32, F16 or BF16).
    pub dtype: DType,
}

impl Conv2dSpec {
    /// Input channels per group.
    pub fn cin_per_group(&self) -> usize {
        self.cin / self.groups
    }
    /// Output channels per group.
    pub fn cout_per_group(&self) -> usize {
        self.cout / self.groups
    }
    /// Rows of a group's column matrix (im2col): `(c, kh, kw)` for c in the group.
    pub fn col_rows(&self) -> usize {
        self.cin_per_group() * self.kh * self.kw
    }
    /// Columns of the column matrix: one per output position, `Ho·Wo`.
    pub fn col_len(&self) -> usize {
        self.ho * self.wo
    }
}

/// Output length of one axis, `(len + 2·pad − dil·(k−1) − 1)/stride + 1`, or an error
/// when the dilated kernel does not fit in the padded input. Parameters are validated
/// (stride, dilation ≥ 1, k ≥ 1) by the caller.
fn conv_out_len(
    op: &'static str,
    axis: &str,
    len: usize,
    k: usize,
    stride: usize,
    pad: usize,
    dil: usize,
) -> Result<usize> {
    let padded = len as u128 + 2 * pad as u128;
    let span = dil as u128 * (k as u128 - 1) + 1;
    if span > padded {
        return Err(Error::shape(
            op,
            format!("kernel along {axis} (dilated span {span}) against the padded input"),
            format!("a span ≤ {padded}"),
            span,
        ));
    }
    usize::try_from((padded - span) / stride as u128 + 1)
        .map_err(|_| Error::value(op, format!("output length along {axis}"), "to fit in usize", "overflow"))
}

/// Stride, dilation and groups must be positive.
fn positive(op: &'static str, what: &str, v: usize) -> Result<()> {
    if v == 0 {
        Err(Error::value(op, what, "≥ 1", 0))
    } else {
        Ok(())
    }
}

/// `conv1d(x, w, bias, config)`: x `[B, Cin, L]` float, w `[Cout, Cin/groups, K]` (K ≥ 1)
/// and bias `[Cout]` of x's dtype; groups, stride and dilation ≥ 1, groups dividing Cin
/// and Cout, no output_padding, and the dilated kernel within the padded input.
pub fn conv1d(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, config: &Conv1dConfig) -> Result<Conv2dSpec> {
    const OP: &str = "conv1d";
    check::float(OP, "x", x)?;
    check::same_dtype(OP, "w", x, w)?;
    check::rank(OP, "x", x, 3)?;
    check::rank(OP, "w", w, 3)?;
    if config.output_padding != 0 {
        return Err(Error::value(OP, "output_padding (only conv_transpose1d uses it)", 0, config.output_padding));
    }
    let (xd, wd) = (x.dims(), w.dims());
    let config2 = Conv2dConfig {
        stride: (1, config.stride),
        padding: (0, config.padding),
        dilation: (1, config.dilation),
        groups: config.groups,
    };
    let mut g = conv2d_geometry(OP, [xd[0], xd[1], 1, xd[2]], [wd[0], wd[1], 1, wd[2]], w, &config2)?;
    g.out_dims = vec![g.batch, g.cout, g.wo];
    if let Some(bias) = bias {
        self::bias(OP, x, bias, g.cout)?;
    }
    Ok(g)
}

/// `conv2d(x, w, bias, config)`: x `[B, Cin, H, W]` float, w `[Cout, Cin/groups, Kh, Kw]`
/// (Kh, Kw ≥ 1) and bias `[Cout]` of x's dtype; groups, strides and dilations ≥ 1, groups
/// dividing Cin and Cout, and the dilated kernel within the padded input on both axes.
pub fn conv2d(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, config: &Conv2dConfig) -> Result<Conv2dSpec> {
    const OP: &str = "conv2d";
    check::float(OP, "x", x)?;
    check::same_dtype(OP, "w", x, w)?;
    check::rank(OP, "x", x, 4)?;
    check::rank(OP, "w", w, 4)?;
    let (xd, wd) = (x.dims(), w.dims());
    let g = conv2d_geometry(OP, [xd[0], xd[1], xd[2], xd[3]], [wd[0], wd[1], wd[2], wd[3]], w, config)?;
    if let Some(bias) = bias {
        self::bias(OP, x, bias, g.cout)?;
    }
    Ok(g)
}

/// Validates x `[B, Cin, H, W]` and w `[Cout, Cin/groups, Kh, Kw]` (both given as dims
/// of rank-4 views) and the parameters; returns the geometry.
fn conv2d_geometry(
    op: &'static str,
    x_dims: [usize; 4],
    w_dims: [usize; 4],
    w_t: &Tensor,
    config: &Conv2dConfig,
) -> Result<Conv2dSpec> {
    let [batch, cin, h, w] = x_dims;
    let [cout, cg, kh, kw] = w_dims;
    positive(op, "groups", config.groups)?;
    positive(op, "stride", config.stride.0)?;
    positive(op, "stride", config.stride.1)?;
    positive(op, "dilation", config.dilation.0)?;
    positive(op, "dilation", config.dilation.1)?;
    let groups = config.groups;
    if cin % groups != 0 {
        return Err(Error::value(
            op,
            "input channels (must be divisible by groups)",
            format!("a multiple of {groups}"),
            cin,
        ));
    }
    if cout % groups != 0 {
        return Err(Error::value(
            op,
            "w output channels (must be divisible by groups)",
            format!("a multiple of {groups}"),
            cout,
        ));
    }
    if cg != cin / groups {
        return Err(Error::shape(
            op,
            format!("w (dim 1 = input channels / groups = {})", cin / groups),
            cin / groups,
            w_t.shape(),
        ));
    }
    if kh == 0 || kw == 0 {
        return Err(Error::shape(op, "w kernel size", "≥ 1", w_t.shape()));
    }
    let ho = conv_out_len(op, "h", h, kh, config.stride.0, config.padding.0, config.dilation.0)?;
    let wo = conv_out_len(op, "w", w, kw, config.stride.1, config.padding.1, config.dilation.1)?;
    batch
        .checked_mul(cout)
        .and_then(|v| v.checked_mul(ho))
        .and_then(|v| v.checked_mul(wo))
        .ok_or_else(|| Error::value(op, "output size", "to fit in memory", "overflow"))?;
    Ok(Conv2dSpec {
        batch,
        cin,
        h,
        w,
        cout,
        groups,
        kh,
        kw,
        stride: config.stride,
        padding: config.padding,
        dilation: config.dilation,
        ho,
        wo,
        out_dims: vec![batch, cout, ho, wo],
        dtype: w_t.dtype(),
    })
}

/// `bias` must be `[channels]` of `x`'s dtype.
fn bias(op: &'static str, x: &Tensor, bias: &Tensor, channels: usize) -> Result<()> {
    check::same_dtype(op, "bias", x, bias)?;
    check::shape(op, "bias", bias, &[channels])
}

/// A validated transposed 1-d convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvTranspose1dSpec {
    /// Batch size B.
    pub batch: usize,
    /// Input channels Cin.
    pub cin: usize,
    /// Input length L ≥ 1.
    pub len: usize,
    /// Output channels Cout (`groups ·` w's dim 1).
    pub cout: usize,
    /// Channel groups (dividing Cin).
    pub groups: usize,
    /// Kernel size K ≥ 1.
    pub k: usize,
    /// Step between input positions in the output.
    pub stride: usize,
    /// Positions removed at each end of the output.
    pub padding: usize,
    /// Spacing between kernel taps.
    pub dilation: usize,
    /// Output length `(L−1)·stride − 2·padding + dilation·(K−1) + output_padding + 1` (≥ 1).
    pub out_len: usize,
    /// The dtype of x, w and the bias (F32, F16 or BF16).
    pub dtype: DType,
}

/// `conv_transpose1d(x, w, bias, config)`: x `[B, Cin, L]` float with L ≥ 1, w
/// `[Cin, Cout/groups, K]` (K ≥ 1) and bias `[Cout]` of x's dtype; groups, stride and
/// dilation ≥ 1, groups dividing Cin, `output_padding < max(stride, dilation)`, and a
/// positive output length.
pub fn conv_transpose1d(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    config: &Conv1dConfig,
) -> Result<ConvTranspose1dSpec> {
    const OP: &str = "conv_transpose1d";
    let g = conv_transpose1d_geometry(OP, x, w, config)?;
    if let Some(bias) = bias {
        self::bias(OP, x, bias, g.cout)?;
    }
    Ok(g)
}

fn conv_transpose1d_geometry(
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    config: &Conv1dConfig,
) -> Result<ConvTranspose1dSpec> {
    check::float(op, "x", x)?;
    check::same_dtype(op, "w", x, w)?;
    check::rank(op, "x", x, 3)?;
    check::rank(op, "w", w, 3)?;
    positive(op, "groups", config.groups)?;
    positive(op, "stride", config.stride)?;
    positive(op, "dilation", config.dilation)?;
    let (&[batch, cin, len], &[wc, og, k]) = (x.dims(), w.dims()) else {
        return Err(Error::shape(op, "x and w", "rank 3", x.shape()));
    };
    let groups = config.groups;
    if cin % groups != 0 {
        return Err(Error::value(
            op,
            "input channels (must be divisible by groups)",
            format!("a multiple of {groups}"),
            cin,
        ));
    }
    if wc != cin {
        return Err(Error::shape(
            op,
            format!("w ([Cin = {cin}, Cout/groups, K])"),
            format!("[{cin}, _, _]"),
            w.shape(),
        ));
    }
    if k == 0 {
        return Err(Error::shape(op, "w kernel size", "≥ 1", w.shape()));
    }
    if config.output_padding >= config.stride.max(config.dilation) {
        return Err(Error::value(
            op,
            "output_padding",
            format!("< max(stride, dilation) = {}", config.stride.max(config.dilation)),
            config.output_padding,
        ));
    }
    if len == 0 {
        return Err(Error::shape(op, "x (length)", "≥ 1", x.shape()));
    }
    // (L−1)·stride − 2·padding + dilation·(K−1) + output_padding + 1, in wide signed arithmetic.
    let out_len = (len as i128 - 1) * config.stride as i128 - 2 * config.padding as i128
        + config.dilation as i128 * (k as i128 - 1)
        + config.output_padding as i128
        + 1;
    if out_len <= 0 {
        return Err(Error::value(op, "output length (padding too large)", "≥ 1", out_len));
    }
    let cout =
        og.checked_mul(groups).ok_or_else(|| Error::value(op, "output channels", "to fit in usize", "overflow"))?;
    let out_len =
        usize::try_from(out_len).map_err(|_| Error::value(op, "output length", "to fit in usize", out_len))?;
    batch
        .checked_mul(cout)
        .and_then(|v| v.checked_mul(out_len))
        .ok_or_else(|| Error::value(op, "output size", "to fit in memory", "overflow"))?;
    Ok(ConvTranspose1dSpec {
        batch,
        cin,
        len,
        cout,
        groups,
        k,
        stride: config.stride,
        padding: config.padding,
        dilation: config.dilation,
        out_len,
        dtype: x.dtype(),
    })
}

/// A validated causal depthwise convolution of `[B, C, L]` with `[C, K]` taps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DepthwiseSpec {
    /// Batch size B.
    pub batch: usize,
    /// Channels C.
    pub channels: usize,
    /// Length L.
    pub len: usize,
    /// Taps K ≥ 1.
    pub k: usize,
    /// The dtype of every operand (F32, F16 or BF16).
    pub dtype: DType,
}

/// `depthwise_conv1d_silu(x, w, bias)`: x `[B, C, L]` float, w `[C, K]` (K ≥ 1) and bias
/// `[C]` of x's dtype.
pub fn depthwise_conv1d_silu(x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<DepthwiseSpec> {
    depthwise("depthwise_conv1d_silu", x, w, bias)
}

/// `depthwise_conv1d_bias(x, w, bias)`: as [`depthwise_conv1d_silu`].
pub fn depthwise_conv1d_bias(x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<DepthwiseSpec> {
    depthwise("depthwise_conv1d_bias", x, w, bias)
}

/// `depthwise_conv1d_bias_ctx(ctx, x, w, bias)`: as [`depthwise_conv1d_bias`]; ctx
/// `[B, C, K−1]` of x's dtype (the inputs before x).
pub fn depthwise_conv1d_bias_ctx(ctx: &Tensor, x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<DepthwiseSpec> {
    with_context("depthwise_conv1d_bias_ctx", ctx, x, w, bias)
}

/// `depthwise_conv1d_silu_ctx(ctx, x, w, bias)`: as [`depthwise_conv1d_silu`]; ctx
/// `[B, C, K−1]` of x's dtype (the inputs before x).
pub fn depthwise_conv1d_silu_ctx(ctx: &Tensor, x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<DepthwiseSpec> {
    with_context("depthwise_conv1d_silu_ctx", ctx, x, w, bias)
}

/// `depthwise_conv1d_silu_backward(ctx, x, w, bias, d_out)`: as the forward it inverts
/// ([`depthwise_conv1d_silu`], or [`depthwise_conv1d_silu_ctx`] when ctx is given);
/// d_out `[B, C, L]` of x's dtype.
pub fn depthwise_conv1d_silu_backward(
    ctx: Option<&Tensor>,
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    d_out: &Tensor,
) -> Result<DepthwiseSpec> {
    const OP: &str = "depthwise_conv1d_silu_backward";
    let s = match ctx {
        Some(ctx) => with_context(OP, ctx, x, w, bias)?,
        None => depthwise(OP, x, w, bias)?,
    };
    check::same_dtype(OP, "d_out", x, d_out)?;
    check::shape(OP, "d_out (like x, [B, C, L])", d_out, x.dims())?;
    Ok(s)
}

/// A causal depthwise conv with its context: as [`depthwise`], and ctx `[B, C, K−1]` of x's dtype.
fn with_context(op: &'static str, ctx: &Tensor, x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<DepthwiseSpec> {
    let s = depthwise(op, x, w, bias)?;
    check::same_dtype(op, "ctx", x, ctx)?;
    check::shape(op, "ctx ([B, C, K−1])", ctx, &[s.batch, s.channels, s.k - 1])?;
    Ok(s)
}

/// Validates a causal depthwise conv: x `[B, C, L]`, w `[C, K]` (K ≥ 1), bias `[C]`, one dtype.
fn depthwise(op: &'static str, x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<DepthwiseSpec> {
    check::float(op, "x", x)?;
    check::same_dtype(op, "w", x, w)?;
    check::rank(op, "x", x, 3)?;
    check::rank(op, "w", w, 2)?;
    let &[batch, channels, len] = x.dims() else {
        return Err(Error::shape(op, "x", "rank 3", x.shape()));
    };
    let k = w.dims()[1];
    if w.dims()[0] != channels || k == 0 {
        return Err(Error::shape(op, "w ([C, K], K ≥ 1)", format!("[{channels}, K ≥ 1]"), w.shape()));
    }
    self::bias(op, x, bias, channels)?;
    Ok(DepthwiseSpec { batch, channels, len, k, dtype: x.dtype() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dims: &[usize]) -> Tensor {
        Tensor::zeros(dims.to_vec(), DType::F32).unwrap()
    }

    #[test]
    fn convolutions_describe_their_geometry() {
        let c = Conv2dConfig { stride: (2, 1), padding: (1, 0), dilation: (1, 2), groups: 2 };
        let g = conv2d(&t(&[3, 4, 7, 9]), &t(&[6, 2, 3, 2]), Some(&t(&[6])), &c).unwrap();
        // Ho = (7 + 2 − 2 − 1)/2 + 1 = 4; Wo = (9 − 2 − 1)/1 + 1 = 7.
        assert_eq!((g.ho, g.wo, g.col_rows(), g.col_len()), (4, 7, 12, 28));
        assert_eq!(g.out_dims, [3, 6, 4, 7]);
        let c1 = Conv1dConfig { stride: 2, padding: 1, ..Conv1dConfig::default() };
        assert_eq!(conv1d(&t(&[1, 2, 8]), &t(&[4, 2, 3]), None, &c1).unwrap().out_dims, [1, 4, 4]);
        let ct = conv_transpose1d(&t(&[1, 2, 5]), &t(&[2, 3, 4]), None, &c1).unwrap();
        // (5 − 1)·2 − 2 + (4 − 1) + 1 = 10
        assert_eq!((ct.cout, ct.out_len), (3, 10));
        let d = depthwise_conv1d_bias_ctx(&t(&[2, 3, 3]), &t(&[2, 3, 5]), &t(&[3, 4]), &t(&[3])).unwrap();
        assert_eq!((d.batch, d.channels, d.len, d.k), (2, 3, 5, 4));
    }

    #[test]
    fn bad_convolutions_name_the_argument() {
        let c = Conv2dConfig::default();
        let e = conv2d(&t(&[1, 4, 5, 5]), &t(&[2, 3, 1, 1]), None, &c).unwrap_err().to_string();
        assert!(e.contains("conv2d") && e.contains("input channels / groups"), "{e}");
        let e = conv2d(&t(&[1, 1, 2, 2]), &t(&[1, 1, 3, 3]), None, &c).unwrap_err().to_string();
        assert!(e.contains("kernel along h"), "{e}");
        let e = conv2d(&t(&[1, 1, 4, 4]), &t(&[2, 1, 1, 1]), Some(&t(&[3])), &c).unwrap_err().to_string();
        assert!(e.contains("bias"), "{e}");
        let zero = Conv1dConfig { stride: 0, ..Conv1dConfig::default() };
        let e = conv1d(&t(&[1, 1, 4]), &t(&[1, 1, 1]), None, &zero).unwrap_err().to_string();
        assert!(e.contains("conv1d") && e.contains("stride"), "{e}");
        let op = Conv1dConfig { output_padding: 1, ..Conv1dConfig::default() };
        assert!(conv1d(&t(&[1, 1, 4]), &t(&[1, 1, 1]), None, &op).is_err());
        let e = conv_transpose1d(&t(&[1, 2, 0]), &t(&[2, 1, 1]), None, &Conv1dConfig::default()).unwrap_err();
        assert!(e.to_string().contains("length"), "{e}");
        let e = depthwise_conv1d_silu(&t(&[1, 3, 5]), &t(&[2, 4]), &t(&[3])).unwrap_err().to_string();
        assert!(e.contains("depthwise_conv1d_silu") && e.contains("[C, K]"), "{e}");
        let e = depthwise_conv1d_bias_ctx(&t(&[1, 3, 2]), &t(&[1, 3, 5]), &t(&[3, 4]), &t(&[3])).unwrap_err();
        assert!(e.to_string().contains("ctx"), "{e}");
        let e = depthwise_conv1d_silu_ctx(&t(&[1, 3, 2]), &t(&[1, 3, 5]), &t(&[3, 4]), &t(&[3])).unwrap_err();
        assert!(e.to_string().contains("depthwise_conv1d_silu_ctx") && e.to_string().contains("[1, 3, 3]"), "{e}");
        let bad_dy = t(&[1, 3, 4]);
        let e = depthwise_conv1d_silu_backward(None, &t(&[1, 3, 5]), &t(&[3, 4]), &t(&[3]), &bad_dy).unwrap_err();
        assert!(e.to_string().contains("depthwise_conv1d_silu_backward") && e.to_string().contains("d_out"), "{e}");
        let ctx = t(&[1, 3, 2]);
        let e = depthwise_conv1d_silu_backward(Some(&ctx), &t(&[1, 3, 5]), &t(&[3, 4]), &t(&[3]), &t(&[1, 3, 5]));
        assert!(e.unwrap_err().to_string().contains("ctx"));
    }
}
