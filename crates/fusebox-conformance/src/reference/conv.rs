//! f64 twins of the conv family: the definitions, summed term by term.

use fusebox::{Conv1dConfig, Conv2dConfig};

use crate::array::Array;

/// `y[b,o,t] = bias[o] + Σ_{c in o's group, k} w[o,c,k]·x[b, g·Cg + c, t·s + k·d − p]`
/// (x is 0 outside `[0, L)`).
pub fn conv1d(x: &Array, w: &Array, bias: Option<&Array>, config: &Conv1dConfig) -> Array {
    let (batch, cin, len) = (x.shape[0], x.shape[1], x.shape[2]);
    let (cout, cg, k) = (w.shape[0], w.shape[1], w.shape[2]);
    let (s, p, d, groups) = (config.stride, config.padding, config.dilation, config.groups);
    let og = cout / groups;
    let out_len = (len + 2 * p - d * (k - 1) - 1) / s + 1;
    assert_eq!(cin, cg * groups);
    let mut y = Array::zeros(vec![batch, cout, out_len]);
    for b in 0..batch {
        for o in 0..cout {
            let g = o / og;
            for t in 0..out_len {
                let mut sum = bias.map_or(0.0, |bias| bias.data[o]);
                for c in 0..cg {
                    for kk in 0..k {
                        let pos = (t * s + kk * d) as isize - p as isize;
                        if pos >= 0 && (pos as usize) < len {
                            sum += w.data[(o * cg + c) * k + kk] * x.data[(b * cin + g * cg + c) * len + pos as usize];
                        }
                    }
                }
                *y.at_mut(&[b, o, t]) = sum;
            }
        }
    }
    y
}

/// `y[b, g·Og + o, t·s + k·d − p] += w[g·Cg + c, o, k]·x[b, g·Cg + c, t]`, plus bias,
/// over an output of length `(L−1)·s − 2p + d·(K−1) + output_padding + 1`.
pub fn conv_transpose1d(x: &Array, w: &Array, bias: Option<&Array>, config: &Conv1dConfig) -> Array {
    let (batch, cin, len) = (x.shape[0], x.shape[1], x.shape[2]);
    let (og, k) = (w.shape[1], w.shape[2]);
    let (s, p, d, groups) = (config.stride, config.padding, config.dilation, config.groups);
    let (cg, cout) = (cin / groups, og * groups);
    let out_len = (len - 1) * s + d * (k - 1) + config.output_padding + 1 - 2 * p;
    let mut y = Array::zeros(vec![batch, cout, out_len]);
    for b in 0..batch {
        for o in 0..cout {
            for t in 0..out_len {
                *y.at_mut(&[b, o, t]) = bias.map_or(0.0, |bias| bias.data[o]);
            }
        }
        for ci in 0..cin {
            let g = ci / cg;
            for o in 0..og {
                for kk in 0..k {
                    for t in 0..len {
                        let pos = (t * s + kk * d) as isize - p as isize;
                        if pos >= 0 && (pos as usize) < out_len {
                            y.data[(b * cout + g * og + o) * out_len + pos as usize] +=
                                w.data[(ci * og + o) * k + kk] * x.data[(b * cin + ci) * len + t];
                        }
                    }
                }
            }
        }
    }
    y
}

/// `y[b,o,i,j] = bias[o] + Σ_{c, u, v} w[o,c,u,v]·x[b, g·Cg + c, i·sh + u·dh − ph, j·sw + v·dw − pw]`.
pub fn conv2d(x: &Array, w: &Array, bias: Option<&Array>, config: &Conv2dConfig) -> Array {
    let (batch, cin, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (cout, cg, kh, kw) = (w.shape[0], w.shape[1], w.shape[2], w.shape[3]);
    let ((sh, sw), (ph, pw), (dh, dw)) = (config.stride, config.padding, config.dilation);
    let og = cout / config.groups;
    let ho = (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1;
    let wo = (wd + 2 * pw - dw * (kw - 1) - 1) / sw + 1;
    let mut y = Array::zeros(vec![batch, cout, ho, wo]);
    for b in 0..batch {
        for o in 0..cout {
            let g = o / og;
            for i in 0..ho {
                for j in 0..wo {
                    let mut sum = bias.map_or(0.0, |bias| bias.data[o]);
                    for c in 0..cg {
                        for u in 0..kh {
                            for v in 0..kw {
                                let r = (i * sh + u * dh) as isize - ph as isize;
                                let q = (j * sw + v * dw) as isize - pw as isize;
                                if r >= 0 && (r as usize) < h && q >= 0 && (q as usize) < wd {
                                    let w_ocuv = w.data[((o * cg + c) * kh + u) * kw + v];
                                    let x_bcrq = x.data[((b * cin + g * cg + c) * h + r as usize) * wd + q as usize];
                                    sum += w_ocuv * x_bcrq;
                                }
                            }
                        }
                    }
                    *y.at_mut(&[b, o, i, j]) = sum;
                }
            }
        }
    }
    y
}

/// Causal depthwise conv over `[ctx, x]`: `y[b,c,t] = bias[c] + Σ_k w[c,k]·z[b,c,t+k]` where
/// `z = [ctx, x]` along the length and ctx has `K−1` values (`None`: zeros).
fn causal_depthwise(ctx: Option<&Array>, x: &Array, w: &Array, bias: &Array) -> Array {
    let (batch, channels, len) = (x.shape[0], x.shape[1], x.shape[2]);
    let k = w.shape[1];
    let mut y = Array::zeros(x.shape.clone());
    for b in 0..batch {
        for c in 0..channels {
            for t in 0..len {
                let mut sum = bias.data[c];
                for kk in 0..k {
                    // z index t + kk; x index t + kk − (K−1); below 0 it is the context.
                    let xi = (t + kk) as isize - (k - 1) as isize;
                    let v = if xi >= 0 {
                        x.data[(b * channels + c) * len + xi as usize]
                    } else {
                        ctx.map_or(0.0, |ctx| ctx.data[(b * channels + c) * (k - 1) + t + kk])
                    };
                    sum += w.data[c * k + kk] * v;
                }
                *y.at_mut(&[b, c, t]) = sum;
            }
        }
    }
    y
}

/// `y = silu(bias + causal depthwise conv of x)`, silu(v) = v / (1 + e^−v).
pub fn depthwise_conv1d_silu(x: &Array, w: &Array, bias: &Array) -> Array {
    causal_depthwise(None, x, w, bias).map(|v| v / (1.0 + (-v).exp()))
}

/// `y = bias + causal depthwise conv of x` (x is 0 before t = 0).
pub fn depthwise_conv1d_bias(x: &Array, w: &Array, bias: &Array) -> Array {
    causal_depthwise(None, x, w, bias)
}

/// `depthwise_conv1d_bias` over `[ctx, x]`.
pub fn depthwise_conv1d_bias_ctx(ctx: &Array, x: &Array, w: &Array, bias: &Array) -> Array {
    causal_depthwise(Some(ctx), x, w, bias)
}

/// `depthwise_conv1d_silu` over `[ctx, x]`.
pub fn depthwise_conv1d_silu_ctx(ctx: &Array, x: &Array, w: &Array, bias: &Array) -> Array {
    causal_depthwise(Some(ctx), x, w, bias).map(|v| v / (1.0 + (-v).exp()))
}

/// Gradients of `depthwise_conv1d_silu` (ctx `None`) or `depthwise_conv1d_silu_ctx`:
/// with `pre` the conv plus bias and `g = dy·silu'(pre)`, `silu'(p) = σ(p)(1 + p(1 − σ(p)))`,
/// every term `w[c,k]·z[b,c,t+k]` of `pre[b,c,t]` sends `g·z` to `dw[c,k]` and `g·w[c,k]`
/// to the z it read (x, or ctx before x); `dbias[c] = Σ g`. Returns (dx, dw, dbias, d_ctx).
pub fn depthwise_conv1d_silu_backward(
    ctx: Option<&Array>,
    x: &Array,
    w: &Array,
    bias: &Array,
    dy: &Array,
) -> (Array, Array, Array, Option<Array>) {
    let (batch, channels, len) = (x.shape[0], x.shape[1], x.shape[2]);
    let k = w.shape[1];
    let pre = causal_depthwise(ctx, x, w, bias);
    let (mut dx, mut dw, mut dbias) =
        (Array::zeros(x.shape.clone()), Array::zeros(w.shape.clone()), Array::zeros(vec![channels]));
    let mut d_ctx = ctx.map(|c| Array::zeros(c.shape.clone()));
    for b in 0..batch {
        for c in 0..channels {
            for t in 0..len {
                let p = pre.at(&[b, c, t]);
                let s = 1.0 / (1.0 + (-p).exp());
                let g = dy.at(&[b, c, t]) * s * (1.0 + p * (1.0 - s));
                dbias.data[c] += g;
                for kk in 0..k {
                    let xi = (t + kk) as isize - (k - 1) as isize;
                    if xi >= 0 {
                        dw.data[c * k + kk] += g * x.at(&[b, c, xi as usize]);
                        *dx.at_mut(&[b, c, xi as usize]) += g * w.data[c * k + kk];
                    } else if let (Some(ctx), Some(d_ctx)) = (ctx, d_ctx.as_mut()) {
                        dw.data[c * k + kk] += g * ctx.at(&[b, c, t + kk]);
                        *d_ctx.at_mut(&[b, c, t + kk]) += g * w.data[c * k + kk];
                    }
                }
            }
        }
    }
    (dx, dw, dbias, d_ctx)
}
