//! Convolutions. `conv1d` and `conv2d` unfold each (batch, group) input into columns
//! (im2col) and multiply them by the group's weights with the shared GEMM
//! ([`sgemm`]); `conv1d` is the `H = 1` case of the 2-d path. `conv_transpose1d`
//! multiplies the weights (transposed by strides) with the input into columns and
//! scatters them into the output (col2im). The causal depthwise forms are direct loops
//! over the length, vectorized as shifted `axpy`s (K is small).

use crate::cpu::matmul::{sgemm, sgemm_serial, PARALLEL_GEMM_WORK};
use crate::cpu::simd::{self};
use crate::cpu::{check, convert, CpuBackend};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::types::{Conv1dConfig, Conv2dConfig};

/// Validated geometry of a (grouped, strided, padded, dilated) 2-d cross-correlation.
/// A 1-d convolution is the case `h = kh = 1`, stride/padding/dilation 1/0/1 along h.
#[derive(Debug, Clone, Copy)]
struct Conv2dGeometry {
    batch: usize,
    cin: usize,
    h: usize,
    w: usize,
    cout: usize,
    groups: usize,
    kh: usize,
    kw: usize,
    stride: (usize, usize),
    padding: (usize, usize),
    dilation: (usize, usize),
    ho: usize,
    wo: usize,
}

impl Conv2dGeometry {
    fn cin_per_group(&self) -> usize {
        self.cin / self.groups
    }
    fn cout_per_group(&self) -> usize {
        self.cout / self.groups
    }
    /// Rows of a group's column matrix: `(c, kh, kw)` for c in the group.
    fn col_rows(&self) -> usize {
        self.cin_per_group() * self.kh * self.kw
    }
    /// Columns of the column matrix: one per output position.
    fn col_len(&self) -> usize {
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

/// Validates x `[B, Cin, H, W]`, w `[Cout, Cin/groups, Kh, Kw]` (both given as dims of
/// rank-4 views), the bias and the parameters; returns the geometry.
fn conv2d_geometry(
    op: &'static str,
    x_dims: [usize; 4],
    w_dims: [usize; 4],
    w_shape: &crate::shape::Shape,
    config: &Conv2dConfig,
) -> Result<Conv2dGeometry> {
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
            w_shape,
        ));
    }
    if kh == 0 || kw == 0 {
        return Err(Error::shape(op, "w kernel size", "≥ 1", w_shape));
    }
    let ho = conv_out_len(op, "h", h, kh, config.stride.0, config.padding.0, config.dilation.0)?;
    let wo = conv_out_len(op, "w", w, kw, config.stride.1, config.padding.1, config.dilation.1)?;
    batch
        .checked_mul(cout)
        .and_then(|v| v.checked_mul(ho))
        .and_then(|v| v.checked_mul(wo))
        .ok_or_else(|| Error::value(op, "output size", "to fit in memory", "overflow"))?;
    Ok(Conv2dGeometry {
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
    })
}

/// `bias` must be `[channels]` of `x`'s dtype.
fn check_bias(op: &'static str, x: &Tensor, bias: &Tensor, channels: usize) -> Result<()> {
    check::same_dtype(op, "bias", x, bias)?;
    check::shape(op, "bias", bias, &[channels])
}

/// `[lo, hi)`: the output positions `o < out_len` whose input index
/// `o·stride + offset` (offset = tap·dilation − padding) lies in `[0, len)`.
fn valid_range(out_len: usize, len: usize, stride: usize, offset: isize) -> (usize, usize) {
    // o·stride + offset ≥ 0  ⇔  o ≥ ceil(−offset / stride)
    let lo = if offset >= 0 { 0 } else { ((-offset) as usize).div_ceil(stride) };
    // o·stride + offset < len  ⇔  o < ceil((len − offset) / stride)
    let room = len as isize - offset;
    let hi = if room <= 0 { 0 } else { (room as usize).div_ceil(stride) };
    (lo.min(out_len), hi.min(out_len).max(lo.min(out_len)))
}

/// Writes rows `first_row..` of a group's column matrix into `cols` (whole rows of
/// length `Ho·Wo`): `cols[(c,i,j), (oh,ow)] = x[c, oh·sh + i·dh − ph, ow·sw + j·dw − pw]`
/// (0 in the padding). `xg` is the group's `[Cin/groups, H, W]` input.
fn im2col_rows(g: &Conv2dGeometry, xg: &[f32], first_row: usize, cols: &mut [f32]) {
    let (ho, wo) = (g.ho, g.wo);
    let (sh, sw) = g.stride;
    for (r, row) in cols.chunks_exact_mut(ho * wo).enumerate() {
        let r = first_row + r;
        let (c, i, j) = (r / (g.kh * g.kw), (r / g.kw) % g.kh, r % g.kw);
        let off_h = (i * g.dilation.0) as isize - g.padding.0 as isize;
        let off_w = (j * g.dilation.1) as isize - g.padding.1 as isize;
        let (oh_lo, oh_hi) = valid_range(ho, g.h, sh, off_h);
        let (ow_lo, ow_hi) = valid_range(wo, g.w, sw, off_w);
        let xc = &xg[c * g.h * g.w..][..g.h * g.w];
        row[..oh_lo * wo].fill(0.0);
        row[oh_hi * wo..].fill(0.0);
        for oh in oh_lo..oh_hi {
            let ih = (oh * sh) as isize + off_h;
            let xrow = &xc[ih as usize * g.w..][..g.w];
            let out = &mut row[oh * wo..][..wo];
            out[..ow_lo].fill(0.0);
            out[ow_hi..].fill(0.0);
            let iw0 = (ow_lo * sw) as isize + off_w;
            if ow_hi > ow_lo {
                let iw0 = iw0 as usize;
                if sw == 1 {
                    out[ow_lo..ow_hi].copy_from_slice(&xrow[iw0..iw0 + (ow_hi - ow_lo)]);
                } else {
                    for (o, v) in out[ow_lo..ow_hi].iter_mut().enumerate() {
                        *v = xrow[iw0 + o * sw];
                    }
                }
            }
        }
    }
}

/// One (batch, group) item of a convolution: `y_item[Cout/groups, Ho·Wo]` (pre-filled
/// with the bias) `+= w_g[Cout/groups, rows] · cols[rows, Ho·Wo]`. The input is used as
/// the column matrix directly when the unfold is the identity (1×1 kernel, stride 1, no
/// padding). `parallel`: use the pool inside the item (for large items run one at a time).
fn conv2d_item(cpu: &CpuBackend, g: &Conv2dGeometry, xg: &[f32], wg: &[f32], y_item: &mut [f32], parallel: bool) {
    let (og, rows, n) = (g.cout_per_group(), g.col_rows(), g.col_len());
    let identity = g.kh == 1 && g.kw == 1 && g.stride == (1, 1) && g.padding == (0, 0);
    let owned;
    let cols: &[f32] = if identity {
        &xg[..rows * n]
    } else {
        let mut buf = vec![0.0f32; rows * n];
        if parallel && n > 0 {
            cpu.for_each_chunk(&mut buf, n, 1, |r, row| im2col_rows(g, xg, r, row));
        } else if n > 0 {
            im2col_rows(g, xg, 0, &mut buf);
        }
        owned = buf;
        &owned
    };
    if parallel {
        sgemm(cpu, og, n, rows, wg, rows, 1, cols, n, 1, y_item, true);
    } else {
        sgemm_serial(og, n, rows, wg, rows, 1, cols, n, 1, y_item, true);
    }
}

/// The convolution of validated f32 data: `y[B, Cout, Ho, Wo]`.
fn conv2d_f32(cpu: &CpuBackend, g: &Conv2dGeometry, x: &[f32], w: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
    let n = g.col_len();
    let mut y = vec![0.0f32; g.batch * g.cout * n];
    if let Some(bias) = bias {
        for (row, &b) in y.chunks_exact_mut(n.max(1)).zip(bias.iter().cycle()) {
            row.fill(b);
        }
    }
    let (og, rows) = (g.cout_per_group(), g.col_rows());
    let x_group = g.cin_per_group() * g.h * g.w;
    let item_len = og * n;
    if item_len == 0 {
        return y;
    }
    let item = |t: usize, y_item: &mut [f32], parallel: bool| {
        let gi = t % g.groups;
        conv2d_item(cpu, g, &x[t * x_group..][..x_group], &w[gi * og * rows..][..og * rows], y_item, parallel);
    };
    if item_len.saturating_mul(rows) >= PARALLEL_GEMM_WORK {
        // Large items: one at a time, each using every thread.
        for (t, y_item) in y.chunks_exact_mut(item_len).enumerate() {
            item(t, y_item, true);
        }
    } else {
        // Small items: (batch, group) pairs spread over the threads.
        cpu.for_each_chunk(&mut y, item_len, rows.max(1), |t, y_item| item(t, y_item, false));
    }
    y
}

/// Reads x, w and the optional bias as f32 and writes the result in x's dtype.
fn run_conv2d(
    op: &'static str,
    cpu: &CpuBackend,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    g: &Conv2dGeometry,
    out_dims: Vec<usize>,
) -> Result<Tensor> {
    let xd = convert::f32_data(op, "x", x)?;
    let wd = convert::f32_data(op, "w", w)?;
    let bd = bias.map(|b| convert::f32_data(op, "bias", b)).transpose()?;
    convert::from_f32(conv2d_f32(cpu, g, &xd, &wd, bd.as_deref()), out_dims, x.dtype())
}

/// 1-d convolution (cross-correlation):
/// `y[b,o,t] = bias[o] + Σ_{c∈group(o), k} w[o, c, k]·x[b, c, t·stride + k·dilation − padding]`.
///
/// # Shapes
/// `x`: `[B, Cin, L]`; `w`: `[Cout, Cin/groups, K]`; `bias`: `[Cout]` →
/// `[B, Cout, (L + 2·padding − dilation·(K−1) − 1)/stride + 1]`.
pub fn conv1d(
    cpu: &CpuBackend,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    config: &Conv1dConfig,
) -> Result<Tensor> {
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
    let g = conv2d_geometry(OP, [xd[0], xd[1], 1, xd[2]], [wd[0], wd[1], 1, wd[2]], w.shape(), &config2)?;
    if let Some(bias) = bias {
        check_bias(OP, x, bias, g.cout)?;
    }
    run_conv2d(OP, cpu, x, w, bias, &g, vec![g.batch, g.cout, g.wo])
}

/// 2-d convolution (cross-correlation) with per-axis stride, padding, dilation, and groups.
///
/// # Shapes
/// `x`: `[B, Cin, H, W]`; `w`: `[Cout, Cin/groups, Kh, Kw]`; `bias`: `[Cout]` →
/// `[B, Cout, Ho, Wo]` with `Ho = (H + 2·ph − dh·(Kh−1) − 1)/sh + 1` (likewise Wo).
pub fn conv2d(
    cpu: &CpuBackend,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    config: &Conv2dConfig,
) -> Result<Tensor> {
    const OP: &str = "conv2d";
    check::float(OP, "x", x)?;
    check::same_dtype(OP, "w", x, w)?;
    check::rank(OP, "x", x, 4)?;
    check::rank(OP, "w", w, 4)?;
    let (xd, wd) = (x.dims(), w.dims());
    let g = conv2d_geometry(OP, [xd[0], xd[1], xd[2], xd[3]], [wd[0], wd[1], wd[2], wd[3]], w.shape(), config)?;
    if let Some(bias) = bias {
        check_bias(OP, x, bias, g.cout)?;
    }
    run_conv2d(OP, cpu, x, w, bias, &g, vec![g.batch, g.cout, g.ho, g.wo])
}

/// Validated geometry of a transposed 1-d convolution.
#[derive(Debug, Clone, Copy)]
struct ConvTranspose1dGeometry {
    batch: usize,
    cin: usize,
    len: usize,
    cout: usize,
    groups: usize,
    k: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
    out_len: usize,
}

fn conv_transpose1d_geometry(
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    config: &Conv1dConfig,
) -> Result<ConvTranspose1dGeometry> {
    check::float(op, "x", x)?;
    check::same_dtype(op, "w", x, w)?;
    check::rank(op, "x", x, 3)?;
    check::rank(op, "w", w, 3)?;
    positive(op, "groups", config.groups)?;
    positive(op, "stride", config.stride)?;
    positive(op, "dilation", config.dilation)?;
    let (&[batch, cin, len], &[wc, og, k]) = (x.dims(), w.dims()) else { unreachable!("ranks were checked") };
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
    Ok(ConvTranspose1dGeometry {
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
    })
}

/// col2im of one output channel: `y_row[t·stride + k·dilation − padding] += cols[k, t]`
/// over this channel's `K` column rows (`[K, L]`).
fn col2im_row(g: &ConvTranspose1dGeometry, cols: &[f32], y_row: &mut [f32]) {
    for (tap, col) in cols.chunks_exact(g.len).enumerate() {
        let offset = (tap * g.dilation) as isize - g.padding as isize;
        // Inputs t whose target t·stride + offset lies in [0, out_len).
        let (lo, hi) = valid_range(g.len, g.out_len, g.stride, offset);
        if hi <= lo {
            continue;
        }
        let first = ((lo * g.stride) as isize + offset) as usize;
        if g.stride == 1 {
            simd::axpy(&mut y_row[first..first + (hi - lo)], 1.0, &col[lo..hi]);
        } else {
            for (i, &v) in col[lo..hi].iter().enumerate() {
                y_row[first + i * g.stride] += v;
            }
        }
    }
}

/// One (batch, group) item of a transposed convolution: `cols[(o,k), t] = Σ_c w[c, o, k]·x[c, t]`
/// (the group's weights `[Cin/groups, (Cout/groups)·K]` read transposed by strides), then
/// each output channel's rows scattered into `y_item[Cout/groups, out_len]` (pre-filled
/// with the bias). Channels own their output rows, so the scatter splits over threads.
fn conv_transpose1d_item(
    cpu: &CpuBackend,
    g: &ConvTranspose1dGeometry,
    xg: &[f32],
    wg: &[f32],
    y_item: &mut [f32],
    parallel: bool,
) {
    let (cg, og) = (g.cin / g.groups, g.cout / g.groups);
    let rows = og * g.k;
    let mut cols = vec![0.0f32; rows * g.len];
    if parallel {
        sgemm(cpu, rows, g.len, cg, wg, 1, rows, xg, g.len, 1, &mut cols, false);
        cpu.for_each_chunk(y_item, g.out_len, g.k * g.len / g.out_len.max(1) + 1, |o, y_row| {
            col2im_row(g, &cols[o * g.k * g.len..][..g.k * g.len], y_row)
        });
    } else {
        sgemm_serial(rows, g.len, cg, wg, 1, rows, xg, g.len, 1, &mut cols, false);
        for (o, y_row) in y_item.chunks_exact_mut(g.out_len).enumerate() {
            col2im_row(g, &cols[o * g.k * g.len..][..g.k * g.len], y_row);
        }
    }
}

/// Transposed 1-d convolution (the gradient of conv1d w.r.t. its input, plus bias):
/// `y[b, o, t·stride + k·dilation − padding] += w[c, o, k]·x[b, c, t]` for c in o's group.
///
/// # Shapes
/// `x`: `[B, Cin, L]`; `w`: `[Cin, Cout/groups, K]`; `bias`: `[Cout]` →
/// `[B, Cout, (L−1)·stride − 2·padding + dilation·(K−1) + output_padding + 1]`.
pub fn conv_transpose1d(
    cpu: &CpuBackend,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    config: &Conv1dConfig,
) -> Result<Tensor> {
    const OP: &str = "conv_transpose1d";
    let g = conv_transpose1d_geometry(OP, x, w, config)?;
    if let Some(bias) = bias {
        check_bias(OP, x, bias, g.cout)?;
    }
    let xd = convert::f32_data(OP, "x", x)?;
    let wd = convert::f32_data(OP, "w", w)?;
    let bd = bias.map(|b| convert::f32_data(OP, "bias", b)).transpose()?;
    let mut y = vec![0.0f32; g.batch * g.cout * g.out_len];
    if let Some(bd) = &bd {
        for (row, &b) in y.chunks_exact_mut(g.out_len).zip(bd.iter().cycle()) {
            row.fill(b);
        }
    }
    let (cg, og) = (g.cin / g.groups, g.cout / g.groups);
    let (x_group, w_group, item_len) = (cg * g.len, cg * og * g.k, og * g.out_len);
    if item_len > 0 {
        let item = |t: usize, y_item: &mut [f32], parallel: bool| {
            let gi = t % g.groups;
            conv_transpose1d_item(
                cpu,
                &g,
                &xd[t * x_group..][..x_group],
                &wd[gi * w_group..][..w_group],
                y_item,
                parallel,
            );
        };
        // Multiply-adds of one item's product [Cout/groups·K, Cin/groups]·[Cin/groups, L].
        let gemm_work = (og * g.k).saturating_mul(cg).saturating_mul(g.len);
        if gemm_work >= PARALLEL_GEMM_WORK {
            for (t, y_item) in y.chunks_exact_mut(item_len).enumerate() {
                item(t, y_item, true);
            }
        } else {
            let work = (cg * g.k * g.len / g.out_len).max(1);
            cpu.for_each_chunk(&mut y, item_len, work, |t, y_item| item(t, y_item, false));
        }
    }
    convert::from_f32(y, [g.batch, g.cout, g.out_len], x.dtype())
}

/// Validates a causal depthwise conv: x `[B, C, L]`, w `[C, K]` (K ≥ 1), bias `[C]`, one dtype.
fn depthwise_dims(op: &'static str, x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<(usize, usize, usize, usize)> {
    check::float(op, "x", x)?;
    check::same_dtype(op, "w", x, w)?;
    check::rank(op, "x", x, 3)?;
    check::rank(op, "w", w, 2)?;
    let &[batch, channels, len] = x.dims() else { unreachable!("rank 3 was checked") };
    let k = w.dims()[1];
    if w.dims()[0] != channels || k == 0 {
        return Err(Error::shape(op, "w ([C, K], K ≥ 1)", format!("[{channels}, K ≥ 1]"), w.shape()));
    }
    check_bias(op, x, bias, channels)?;
    Ok((batch, channels, len, k))
}

/// `y[t] = bias + Σ_k w[k]·z[t + k]` for one channel over `z = [ctx, x]`, where `ctx`
/// holds the `K−1` inputs before `x` (zeros for the causal form). Tap k reads x shifted
/// right by `s = K−1−k`: `y[s..] += w[k]·x[..L−s]`, and for `t < s` the context value
/// `ctx[t + k]`.
fn causal_depthwise_row(x: &[f32], ctx: Option<&[f32]>, w: &[f32], bias: f32, y: &mut [f32]) {
    let (len, k) = (x.len(), w.len());
    y.fill(bias);
    for (tap, &wk) in w.iter().enumerate() {
        let shift = k - 1 - tap;
        if shift < len {
            simd::axpy(&mut y[shift..], wk, &x[..len - shift]);
        }
        if let Some(ctx) = ctx {
            for t in 0..shift.min(len) {
                y[t] += wk * ctx[t + tap];
            }
        }
    }
}

/// Runs the causal depthwise conv over every (batch, channel) row, threads splitting rows.
fn depthwise_rows(
    cpu: &CpuBackend,
    x: &[f32],
    ctx: Option<&[f32]>,
    w: &[f32],
    bias: &[f32],
    (channels, len, k): (usize, usize, usize),
    silu: bool,
) -> Vec<f32> {
    let mut y = vec![0.0f32; x.len()];
    if len == 0 {
        return y;
    }
    cpu.for_each_chunk(&mut y, len, k + if silu { 8 } else { 0 }, |row, y_row| {
        let c = row % channels;
        let ctx_row = ctx.map(|ctx| &ctx[row * (k - 1)..][..k - 1]);
        causal_depthwise_row(&x[row * len..][..len], ctx_row, &w[c * k..][..k], bias[c], y_row);
        if silu {
            silu_in_place(y_row);
        }
    });
    y
}

simd::multiversion! {
    /// `v ← v·sigmoid(v) = v / (1 + e^(−v))` (SiLU), with the branch-free exp.
    pub fn silu_in_place(v: &mut [f32]) {
        for x in v.iter_mut() {
            *x /= 1.0 + simd::fast_exp::<false>(-*x);
        }
    }
}

/// The shared body of the three depthwise forms.
fn depthwise(
    op: &'static str,
    cpu: &CpuBackend,
    ctx: Option<&Tensor>,
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    silu: bool,
) -> Result<Tensor> {
    let (batch, channels, len, k) = depthwise_dims(op, x, w, bias)?;
    if let Some(ctx) = ctx {
        check::same_dtype(op, "ctx", x, ctx)?;
        check::shape(op, "ctx ([B, C, K−1])", ctx, &[batch, channels, k - 1])?;
    }
    let xd = convert::f32_data(op, "x", x)?;
    let wd = convert::f32_data(op, "w", w)?;
    let bd = convert::f32_data(op, "bias", bias)?;
    let cd = ctx.map(|c| convert::f32_data(op, "ctx", c)).transpose()?;
    let y = depthwise_rows(cpu, &xd, cd.as_deref(), &wd, &bd, (channels, len, k), silu);
    convert::from_f32(y, x.shape().clone(), x.dtype())
}

/// Causal depthwise conv then SiLU:
/// `y[b,c,t] = silu(bias[c] + Σ_k w[c,k]·x[b, c, t + k − (K−1)])` (x is 0 before t = 0).
///
/// # Shapes
/// `x`: `[B, C, L]`; `w`: `[C, K]`; `bias`: `[C]` → `[B, C, L]`.
pub fn depthwise_conv1d_silu(cpu: &CpuBackend, x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<Tensor> {
    depthwise("depthwise_conv1d_silu", cpu, None, x, w, bias, true)
}

/// Causal depthwise conv plus bias: `y[b,c,t] = bias[c] + Σ_k w[c,k]·x[b, c, t + k − (K−1)]`.
///
/// # Shapes
/// `x`: `[B, C, L]`; `w`: `[C, K]`; `bias`: `[C]` → `[B, C, L]`.
pub fn depthwise_conv1d_bias(cpu: &CpuBackend, x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<Tensor> {
    depthwise("depthwise_conv1d_bias", cpu, None, x, w, bias, false)
}

/// `depthwise_conv1d_bias` over `[ctx, x]` (ctx the K−1 inputs before x, e.g. a streaming
/// state), read from both tensors without concatenating them.
///
/// # Shapes
/// `ctx`: `[B, C, K−1]`; `x`: `[B, C, L]`; `w`: `[C, K]`; `bias`: `[C]` → `[B, C, L]`.
pub fn depthwise_conv1d_bias_ctx(
    cpu: &CpuBackend,
    ctx: &Tensor,
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
) -> Result<Tensor> {
    depthwise("depthwise_conv1d_bias_ctx", cpu, Some(ctx), x, w, bias, false)
}
