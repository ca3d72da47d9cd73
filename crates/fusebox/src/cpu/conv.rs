//! Convolutions. `conv1d` and `conv2d` unfold each (batch, group) input into columns
//! (im2col) and multiply them by the group's weights with the shared GEMM
//! ([`sgemm`]); `conv1d` is the `H = 1` case of the 2-d path. `conv_transpose1d`
//! multiplies the weights (transposed by strides) with the input into columns and
//! scatters them into the output (col2im). The causal depthwise forms are direct loops
//! over the length, vectorized as shifted `axpy`s (K is small).

use crate::cpu::matmul::{sgemm, sgemm_serial, PARALLEL_GEMM_WORK};
use crate::cpu::simd::{self};
use crate::cpu::{convert, CpuBackend};
use crate::error::Result;
use crate::spec::conv::{self as spec, Conv2dSpec, ConvTranspose1dSpec, DepthwiseSpec};
use crate::tensor::Tensor;
use crate::types::{Conv1dConfig, Conv2dConfig};

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
fn im2col_rows(g: &Conv2dSpec, xg: &[f32], first_row: usize, cols: &mut [f32]) {
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
fn conv2d_item(cpu: &CpuBackend, g: &Conv2dSpec, xg: &[f32], wg: &[f32], y_item: &mut [f32], parallel: bool) {
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
fn conv2d_f32(cpu: &CpuBackend, g: &Conv2dSpec, x: &[f32], w: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
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
    g: &Conv2dSpec,
) -> Result<Tensor> {
    let xd = convert::f32_data(op, "x", x)?;
    let wd = convert::f32_data(op, "w", w)?;
    let bd = bias.map(|b| convert::f32_data(op, "bias", b)).transpose()?;
    convert::from_f32(conv2d_f32(cpu, g, &xd, &wd, bd.as_deref()), g.out_dims.clone(), x.dtype())
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
    let g = spec::conv1d(x, w, bias, config)?;
    run_conv2d(OP, cpu, x, w, bias, &g)
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
    let g = spec::conv2d(x, w, bias, config)?;
    run_conv2d(OP, cpu, x, w, bias, &g)
}

/// col2im of one output channel: `y_row[t·stride + k·dilation − padding] += cols[k, t]`
/// over this channel's `K` column rows (`[K, L]`).
fn col2im_row(g: &ConvTranspose1dSpec, cols: &[f32], y_row: &mut [f32]) {
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
    g: &ConvTranspose1dSpec,
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
    let g = spec::conv_transpose1d(x, w, bias, config)?;
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

/// The shared body of the three depthwise forms, for operands validated as `s`.
#[allow(clippy::too_many_arguments)]
fn depthwise(
    op: &'static str,
    cpu: &CpuBackend,
    s: DepthwiseSpec,
    ctx: Option<&Tensor>,
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    silu: bool,
) -> Result<Tensor> {
    let DepthwiseSpec { channels, len, k, .. } = s;
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
    let s = spec::depthwise_conv1d_silu(x, w, bias)?;
    depthwise("depthwise_conv1d_silu", cpu, s, None, x, w, bias, true)
}

/// Causal depthwise conv plus bias: `y[b,c,t] = bias[c] + Σ_k w[c,k]·x[b, c, t + k − (K−1)]`.
///
/// # Shapes
/// `x`: `[B, C, L]`; `w`: `[C, K]`; `bias`: `[C]` → `[B, C, L]`.
pub fn depthwise_conv1d_bias(cpu: &CpuBackend, x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let s = spec::depthwise_conv1d_bias(x, w, bias)?;
    depthwise("depthwise_conv1d_bias", cpu, s, None, x, w, bias, false)
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
    let s = spec::depthwise_conv1d_bias_ctx(ctx, x, w, bias)?;
    depthwise("depthwise_conv1d_bias_ctx", cpu, s, Some(ctx), x, w, bias, false)
}
