//! Convolutions. `conv1d` and `conv2d` unfold each (batch, group) input into columns
//! (im2col) and multiply them by the group's weights with the shared GEMM
//! ([`sgemm`]); `conv1d` is the `H = 1` case of the 2-d path. `conv_transpose1d`
//! multiplies the weights (transposed by strides) with the input into columns and
//! scatters them into the output (col2im). The causal depthwise forms are direct loops
//! over the length, vectorized as shifted `axpy`s (K is small).

use crate::cpu::convert::F32Output;
use crate::cpu::matmul::{sgemm, sgemm_serial, PARALLEL_GEMM_WORK};
use crate::cpu::pool::SharedMut;
use crate::cpu::simd::{self};
use crate::cpu::{convert, CpuBackend};
use crate::error::Result;
use crate::spec::conv::{self as spec, Conv2dSpec, ConvTranspose1dSpec, DepthwiseSpec};
use crate::tensor::Tensor;
use crate::types::{Conv1dConfig, Conv2dConfig, ConvGradients};

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
    if len == 1 {
        // One step (decode): rows of one output each, taken in blocks of channels.
        cpu.for_each_chunk(&mut y, STEP_ROWS, k + if silu { 8 } else { 0 }, |block, ys| {
            depthwise_step(block * STEP_ROWS, x, ctx, w, bias, (channels, k), ys);
            if silu {
                silu_in_place(ys);
            }
        });
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

/// Rows per task of a one-step (L = 1) depthwise conv.
const STEP_ROWS: usize = 1024;

/// One step (L = 1) of rows `first..first + y.len()` (row = batch·C + channel), cut
/// where a batch ends so each piece is a run of consecutive channels (see `step_channels`).
fn depthwise_step(
    first: usize,
    x: &[f32],
    ctx: Option<&[f32]>,
    w: &[f32],
    bias: &[f32],
    (channels, k): (usize, usize),
    y: &mut [f32],
) {
    let mut done = 0;
    while done < y.len() {
        let r = first + done;
        let c = r % channels;
        let n = (channels - c).min(y.len() - done);
        let ctx = ctx.map_or(&[][..], |ctx| &ctx[r * (k - 1)..][..n * (k - 1)]);
        step_channels(&mut y[done..done + n], &x[r..r + n], ctx, &w[c * k..][..n * k], &bias[c..c + n]);
        done += n;
    }
}

simd::multiversion! {
    /// One step of consecutive channels: `y[c] = bias[c] + Σ_{k<K−1} w[c,k]·ctx[c,k] +
    /// w[c,K−1]·x[c]`, K = `w.len() / y.len()`; `ctx` holds each channel's K−1 previous
    /// inputs (empty: zeros). A few taps per channel read straight from the rows.
    pub fn step_channels(y: &mut [f32], x: &[f32], ctx: &[f32], w: &[f32], bias: &[f32]) {
        let n = y.len();
        let k = w.len() / n.max(1);
        let (x, bias) = (&x[..n], &bias[..n]);
        if ctx.is_empty() || k == 1 {
            for (i, taps) in w.chunks_exact(k).enumerate() {
                y[i] = bias[i] + taps[k - 1] * x[i];
            }
        } else if k == 4 {
            // The Gated DeltaNet's kernel: constant-length chunks unroll.
            for (i, (taps, prev)) in w.chunks_exact(4).zip(ctx.chunks_exact(3)).enumerate() {
                y[i] = bias[i] + taps[0] * prev[0] + taps[1] * prev[1] + taps[2] * prev[2] + taps[3] * x[i];
            }
        } else {
            for (i, (taps, prev)) in w.chunks_exact(k).zip(ctx.chunks_exact(k - 1)).enumerate() {
                let mut acc = bias[i] + taps[k - 1] * x[i];
                for (wk, v) in taps.iter().zip(prev) {
                    acc += wk * v;
                }
                y[i] = acc;
            }
        }
    }
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

/// `depthwise_conv1d_silu` over `[ctx, x]` (ctx the K−1 inputs before x, a streaming
/// state), read from both tensors without concatenating them. With L = 1 (a decode step)
/// each output is K multiply-adds and a SiLU, in blocks of channels.
///
/// # Shapes
/// `ctx`: `[B, C, K−1]`; `x`: `[B, C, L]`; `w`: `[C, K]`; `bias`: `[C]` → `[B, C, L]`.
pub fn depthwise_conv1d_silu_ctx(
    cpu: &CpuBackend,
    ctx: &Tensor,
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
) -> Result<Tensor> {
    let s = spec::depthwise_conv1d_silu_ctx(ctx, x, w, bias)?;
    depthwise("depthwise_conv1d_silu_ctx", cpu, s, Some(ctx), x, w, bias, true)
}

simd::multiversion! {
    /// `g ← dy·silu'(p)` over a row of pre-activations `p` (in `g` on entry), with
    /// `silu'(p) = σ(p)·(1 + p·(1 − σ(p)))`; `e^−p` overflowing gives σ = 0 and 0.
    pub fn silu_grad_in_place(g: &mut [f32], dy: &[f32]) {
        let n = g.len();
        let dy = &dy[..n];
        for i in 0..n {
            let p = g[i];
            let s = 1.0 / (1.0 + simd::fast_exp::<FMA>(-p));
            g[i] = dy[i] * s * (1.0 + p * (1.0 - s));
        }
    }
}

/// The rows of one (batch, channel) of a depthwise backward.
struct DepthwiseRow<'a> {
    x: &'a [f32],
    ctx: Option<&'a [f32]>,
    dy: &'a [f32],
}

/// Backward of one (batch, channel) row of `silu(bias + Σ_k w[k]·z[t + k])`, z = [ctx, x]:
/// with `g = dy·silu'(pre)` (pre recomputed into `g`), taps shifted by `s = K−1−k`:
/// `dbias += Σ_t g[t]`, `dw[k] += Σ_t g[t]·z[t + k]`, `dx[t − s] = Σ_k w[k]·g[t]`,
/// `d_ctx[t + k] += w[k]·g[t]` for `t < s`. `dx` and `d_ctx` start zeroed; `params` is
/// `[dw[0..K], dbias]` of the channel.
fn depthwise_backward_row(
    row: DepthwiseRow<'_>,
    w: &[f32],
    bias: f32,
    g: &mut [f32],
    dx: &mut [f32],
    mut d_ctx: Option<&mut [f32]>,
    params: &mut [f32],
) {
    let (len, k) = (row.x.len(), w.len());
    causal_depthwise_row(row.x, row.ctx, w, bias, g);
    silu_grad_in_place(g, row.dy);
    params[k] += simd::sum(g);
    for (tap, &wk) in w.iter().enumerate() {
        let shift = k - 1 - tap;
        if shift < len {
            params[tap] += simd::dot(&g[shift..], &row.x[..len - shift]);
            simd::axpy(&mut dx[..len - shift], wk, &g[shift..]);
        }
        if let (Some(ctx), Some(d_ctx)) = (row.ctx, d_ctx.as_deref_mut()) {
            for t in 0..shift.min(len) {
                params[tap] += g[t] * ctx[t + tap];
                d_ctx[t + tap] += wk * g[t];
            }
        }
    }
}

/// Backward of `depthwise_conv1d_silu` (ctx `None`: x is 0 before t = 0) or
/// `depthwise_conv1d_silu_ctx` (ctx given, and its gradient returned), recomputing the
/// pre-activations. Tasks take blocks of channels, each over every batch, so the tap and
/// bias gradients are summed by one task in a fixed order (no partials to combine, and
/// the result does not depend on the thread count).
///
/// # Shapes
/// `ctx`: `[B, C, K−1]`; `x`, `d_out`: `[B, C, L]`; `w`: `[C, K]`; `bias`: `[C]` →
/// dx `[B, C, L]`, dw `[C, K]`, dbias `[C]`, d_ctx `[B, C, K−1]` (when ctx is given).
pub fn depthwise_conv1d_silu_backward(
    cpu: &CpuBackend,
    ctx: Option<&Tensor>,
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    d_out: &Tensor,
) -> Result<ConvGradients> {
    const OP: &str = "depthwise_conv1d_silu_backward";
    let DepthwiseSpec { batch, channels, len, k, .. } = spec::depthwise_conv1d_silu_backward(ctx, x, w, bias, d_out)?;
    let xd = convert::f32_data(OP, "x", x)?;
    let wd = convert::f32_data(OP, "w", w)?;
    let bd = convert::f32_data(OP, "bias", bias)?;
    let dy = convert::f32_data(OP, "d_out", d_out)?;
    let cd = ctx.map(|c| convert::f32_data(OP, "ctx", c)).transpose()?;
    let mut dx = F32Output::new(x.shape(), x.dtype())?;
    let mut d_ctx = ctx.map(|c| F32Output::new(c.shape(), c.dtype())).transpose()?;
    // Per channel: K tap gradients then the bias gradient.
    let mut params = vec![0.0f32; channels * (k + 1)];
    let dx_at = SharedMut(dx.values()?.as_mut_ptr());
    let d_ctx_at = match d_ctx.as_mut() {
        Some(o) => Some(SharedMut(o.values()?.as_mut_ptr())),
        None => None,
    };
    // Blocks of channels with at least ~4k elements of rows each.
    let per_block = (4096 / (batch * len).max(1)).clamp(1, channels.max(1));
    let work = batch * len * (3 * k + 8) / (k + 1) + 1;
    cpu.for_each_chunk(&mut params, per_block * (k + 1), work, |block, params| {
        let mut g = vec![0.0f32; len];
        for (i, params) in params.chunks_exact_mut(k + 1).enumerate() {
            let c = block * per_block + i;
            for b in 0..batch {
                let r = b * channels + c;
                // SAFETY: row r = (b, c) of dx ([B·C, L]) and of d_ctx ([B·C, K−1]) is
                // written by the task holding channel c only (channels are split into
                // disjoint blocks); the ranges are in bounds, and the buffers outlive the
                // loop and are not otherwise touched while it runs.
                let dx_row = unsafe { dx_at.slice(r * len, len) };
                // SAFETY: as above.
                let d_ctx_row = d_ctx_at.as_ref().map(|p| unsafe { p.slice(r * (k - 1), k - 1) });
                let row = DepthwiseRow {
                    x: &xd[r * len..][..len],
                    ctx: cd.as_deref().map(|cd| &cd[r * (k - 1)..][..k - 1]),
                    dy: &dy[r * len..][..len],
                };
                depthwise_backward_row(row, &wd[c * k..][..k], bd[c], &mut g, dx_row, d_ctx_row, params);
            }
        }
    });
    let (dw, dbias): (Vec<f32>, Vec<f32>) = {
        let mut dw = Vec::with_capacity(channels * k);
        let mut dbias = Vec::with_capacity(channels);
        for p in params.chunks_exact(k + 1) {
            dw.extend_from_slice(&p[..k]);
            dbias.push(p[k]);
        }
        (dw, dbias)
    };
    Ok(ConvGradients {
        dx: dx.finish(cpu)?,
        dw: convert::from_f32(dw, w.shape().clone(), w.dtype())?,
        dbias: convert::from_f32(dbias, bias.shape().clone(), bias.dtype())?,
        d_ctx: d_ctx.map(|o| o.finish(cpu)).transpose()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(shape: &[usize], seed: u64) -> Tensor {
        let n = shape.iter().product();
        Tensor::from_vec(crate::rng::Rng::new(seed).uniform_vec(n, -1.0, 1.0), shape.to_vec()).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.to_vec_f32().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// The causal conv's backward (blocks of channels) and the one-step forward (blocks
    /// of rows) give the same bits with 1 thread and with 3.
    #[test]
    fn depthwise_silu_does_not_depend_on_the_thread_count() {
        let (ctx, x, w, bias, dy) = (
            tensor(&[2, 512, 3], 1),
            tensor(&[2, 512, 200], 2),
            tensor(&[512, 4], 3),
            tensor(&[512], 4),
            tensor(&[2, 512, 200], 5),
        );
        let (step_ctx, step_x) = (tensor(&[2, 6000, 3], 6), tensor(&[2, 6000, 1], 7));
        let (step_w, step_bias) = (tensor(&[6000, 4], 8), tensor(&[6000], 9));
        let run = |cpu: &CpuBackend| -> Vec<Vec<u32>> {
            let g = depthwise_conv1d_silu_backward(cpu, Some(&ctx), &x, &w, &bias, &dy).unwrap();
            let plain = depthwise_conv1d_silu_backward(cpu, None, &x, &w, &bias, &dy).unwrap();
            let step = depthwise_conv1d_silu_ctx(cpu, &step_ctx, &step_x, &step_w, &step_bias).unwrap();
            let d_ctx = g.d_ctx.unwrap();
            [&g.dx, &g.dw, &g.dbias, &d_ctx, &plain.dx, &plain.dw, &step].iter().map(|t| bits(t)).collect()
        };
        assert_eq!(run(&CpuBackend::with_threads(1).unwrap()), run(&CpuBackend::with_threads(3).unwrap()));
    }
}
