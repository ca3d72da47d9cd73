//! f64 twins of the norm family: plain loops over rows, written to be read.
//! A "row" is the last dim of the input; statistics have the input's shape minus it.

use crate::array::Array;

/// The shape of per-row statistics.
fn stat_shape(x: &Array) -> Vec<usize> {
    x.shape[..x.shape.len() - 1].to_vec()
}

/// `y = x·w / sqrt(mean(x²) + eps)`; returns (y, rstd).
pub fn rms_norm(x: &Array, w: &Array, eps: f64) -> (Array, Array) {
    let d = x.last_dim();
    let mut y = Array::zeros(x.shape.clone());
    let mut rstd = Array::zeros(stat_shape(x));
    for r in 0..x.rows() {
        let mut sum_sq = 0.0;
        for i in 0..d {
            sum_sq += x.data[r * d + i] * x.data[r * d + i];
        }
        let inv = 1.0 / (sum_sq / d as f64 + eps).sqrt();
        rstd.data[r] = inv;
        for i in 0..d {
            y.data[r * d + i] = x.data[r * d + i] * inv * w.data[i];
        }
    }
    (y, rstd)
}

/// With `x̂ = x·r`, `g = dy·w`: `dx = r·(g − x̂·mean(g·x̂))`, `dw = Σ_rows dy·x̂`.
/// Returns (dx, dw).
pub fn rms_norm_backward(x: &Array, w: &Array, rstd: &Array, dy: &Array) -> (Array, Array) {
    let d = x.last_dim();
    let mut dx = Array::zeros(x.shape.clone());
    let mut dw = Array::zeros(w.shape.clone());
    for r in 0..x.rows() {
        let inv = rstd.data[r];
        let mut mean_g_xhat = 0.0;
        for i in 0..d {
            let g = dy.data[r * d + i] * w.data[i];
            let xhat = x.data[r * d + i] * inv;
            mean_g_xhat += g * xhat;
        }
        mean_g_xhat /= d as f64;
        for i in 0..d {
            let g = dy.data[r * d + i] * w.data[i];
            let xhat = x.data[r * d + i] * inv;
            dx.data[r * d + i] = inv * (g - xhat * mean_g_xhat);
            dw.data[i] += dy.data[r * d + i] * xhat;
        }
    }
    (dx, dw)
}

/// `y = (x − mean)/sqrt(var + eps)·w + b` (biased variance); returns (y, mean, rstd).
pub fn layer_norm(x: &Array, w: &Array, b: &Array, eps: f64) -> (Array, Array, Array) {
    let d = x.last_dim();
    let mut y = Array::zeros(x.shape.clone());
    let mut mean = Array::zeros(stat_shape(x));
    let mut rstd = Array::zeros(stat_shape(x));
    for r in 0..x.rows() {
        let mut m = 0.0;
        for i in 0..d {
            m += x.data[r * d + i];
        }
        m /= d as f64;
        let mut var = 0.0;
        for i in 0..d {
            var += (x.data[r * d + i] - m) * (x.data[r * d + i] - m);
        }
        var /= d as f64;
        let inv = 1.0 / (var + eps).sqrt();
        mean.data[r] = m;
        rstd.data[r] = inv;
        for i in 0..d {
            y.data[r * d + i] = (x.data[r * d + i] - m) * inv * w.data[i] + b.data[i];
        }
    }
    (y, mean, rstd)
}

/// With `x̂ = (x − μ)·r`, `g = dy·w`: `dx = r·(g − mean(g) − x̂·mean(g·x̂))`,
/// `dw = Σ_rows dy·x̂`, `db = Σ_rows dy`. Returns (dx, dw, db).
pub fn layer_norm_backward(x: &Array, w: &Array, mean: &Array, rstd: &Array, dy: &Array) -> (Array, Array, Array) {
    let d = x.last_dim();
    let mut dx = Array::zeros(x.shape.clone());
    let mut dw = Array::zeros(w.shape.clone());
    let mut db = Array::zeros(w.shape.clone());
    for r in 0..x.rows() {
        let (m, inv) = (mean.data[r], rstd.data[r]);
        let mut mean_g = 0.0;
        let mut mean_g_xhat = 0.0;
        for i in 0..d {
            let g = dy.data[r * d + i] * w.data[i];
            let xhat = (x.data[r * d + i] - m) * inv;
            mean_g += g;
            mean_g_xhat += g * xhat;
        }
        mean_g /= d as f64;
        mean_g_xhat /= d as f64;
        for i in 0..d {
            let g = dy.data[r * d + i] * w.data[i];
            let xhat = (x.data[r * d + i] - m) * inv;
            dx.data[r * d + i] = inv * (g - mean_g - xhat * mean_g_xhat);
            dw.data[i] += dy.data[r * d + i] * xhat;
            db.data[i] += dy.data[r * d + i];
        }
    }
    (dx, dw, db)
}

/// `s = a + b`, then `rms_norm(s, w)`; returns (s, y, rstd).
pub fn add_rms_norm(a: &Array, b: &Array, w: &Array, eps: f64) -> (Array, Array, Array) {
    let s = a.zip(b, |p, q| p + q);
    let (y, rstd) = rms_norm(&s, w, eps);
    (s, y, rstd)
}

/// `rms_norm(x, w)·silu(z)` with `silu(z) = z/(1 + e^−z)`.
pub fn rms_norm_gated(x: &Array, z: &Array, w: &Array, eps: f64) -> Array {
    let (y, _) = rms_norm(x, w, eps);
    y.zip(z, |v, g| v * g / (1.0 + (-g).exp()))
}

/// `y[b,c,t] = x[b,c,t]·w[c] / sqrt(mean_c(x[b,·,t]²) + eps)` for `x` `[B, C, T]`.
pub fn rms_norm_channel(x: &Array, w: &Array, eps: f64) -> Array {
    let (nb, nc, nt) = (x.shape[0], x.shape[1], x.shape[2]);
    let mut y = Array::zeros(x.shape.clone());
    for b in 0..nb {
        for t in 0..nt {
            let mut sum_sq = 0.0;
            for c in 0..nc {
                sum_sq += x.at(&[b, c, t]) * x.at(&[b, c, t]);
            }
            let inv = 1.0 / (sum_sq / nc as f64 + eps).sqrt();
            for c in 0..nc {
                *y.at_mut(&[b, c, t]) = x.at(&[b, c, t]) * w.data[c] * inv;
            }
        }
    }
    y
}

/// Group norm of `x` `[B, C, ...]`: each (batch, group of C/groups channels) is normalized
/// over its channels and all spatial positions (biased variance), then `·w[c] + b[c]`.
pub fn group_norm(x: &Array, groups: usize, w: &Array, b: &Array, eps: f64) -> Array {
    let (nb, nc) = (x.shape[0], x.shape[1]);
    let spatial: usize = x.shape[2..].iter().product();
    let per_group = nc / groups;
    let mut y = Array::zeros(x.shape.clone());
    // Flat index of (batch, channel, spatial position s).
    let at = |bi: usize, c: usize, s: usize| (bi * nc + c) * spatial + s;
    for bi in 0..nb {
        for g in 0..groups {
            let channels = g * per_group..(g + 1) * per_group;
            let count = (per_group * spatial) as f64;
            let mut mean = 0.0;
            for c in channels.clone() {
                for s in 0..spatial {
                    mean += x.data[at(bi, c, s)];
                }
            }
            mean /= count;
            let mut var = 0.0;
            for c in channels.clone() {
                for s in 0..spatial {
                    var += (x.data[at(bi, c, s)] - mean) * (x.data[at(bi, c, s)] - mean);
                }
            }
            var /= count;
            let inv = 1.0 / (var + eps).sqrt();
            for c in channels {
                for s in 0..spatial {
                    y.data[at(bi, c, s)] = (x.data[at(bi, c, s)] - mean) * inv * w.data[c] + b.data[c];
                }
            }
        }
    }
    y
}

/// `rms_norm(x, w)·(1 + scale[b]) + shift[b]` for `x` `[B, T, D]`, scale and shift `[B, D]`.
pub fn adaln_modulate(x: &Array, w: &Array, scale: &Array, shift: &Array, eps: f64) -> Array {
    let (nb, nt, d) = (x.shape[0], x.shape[1], x.shape[2]);
    let (normed, _) = rms_norm(x, w, eps);
    let mut y = Array::zeros(x.shape.clone());
    for b in 0..nb {
        for t in 0..nt {
            for i in 0..d {
                *y.at_mut(&[b, t, i]) = normed.at(&[b, t, i]) * (1.0 + scale.at(&[b, i])) + shift.at(&[b, i]);
            }
        }
    }
    y
}

/// `(x − mean)/sqrt(var + eps)` per row (biased variance), no affine.
pub fn normalize(x: &Array, eps: f64) -> Array {
    let d = x.last_dim();
    let ones = Array::new(vec![d], vec![1.0; d]);
    let zeros = Array::zeros(vec![d]);
    layer_norm(x, &ones, &zeros, eps).0
}

/// `y = x / sqrt(Σx² + eps)` per row (a sum, eps inside the root); returns (y, rnorm).
pub fn l2_norm(x: &Array, eps: f64) -> (Array, Array) {
    let d = x.last_dim();
    let mut y = Array::zeros(x.shape.clone());
    let mut rnorm = Array::zeros(stat_shape(x));
    for r in 0..x.rows() {
        let sum_sq: f64 = x.row(r).iter().map(|v| v * v).sum();
        let inv = 1.0 / (sum_sq + eps).sqrt();
        rnorm.data[r] = inv;
        for i in 0..d {
            y.data[r * d + i] = x.data[r * d + i] * inv;
        }
    }
    (y, rnorm)
}

/// With `x̂ = x·r`: `dx = r·(dy − x̂·Σ(dy·x̂))`.
pub fn l2_norm_backward(x: &Array, rnorm: &Array, dy: &Array) -> Array {
    let d = x.last_dim();
    let mut dx = Array::zeros(x.shape.clone());
    for r in 0..x.rows() {
        let inv = rnorm.data[r];
        let mut dot = 0.0;
        for i in 0..d {
            dot += dy.data[r * d + i] * x.data[r * d + i] * inv;
        }
        for i in 0..d {
            let xhat = x.data[r * d + i] * inv;
            dx.data[r * d + i] = inv * (dy.data[r * d + i] - xhat * dot);
        }
    }
    dx
}

/// Gradients of `rms_norm_gated`: the RMS norm's backward for `u = dy·silu(z)`, and
/// `dz = dy·rms_norm(x, w)·silu'(z)` with `silu'(z) = σ(z)(1 + z(1 − σ(z)))`.
/// Returns (dx, dz, dw).
pub fn rms_norm_gated_backward(x: &Array, z: &Array, w: &Array, dy: &Array, eps: f64) -> (Array, Array, Array) {
    let (y, rstd) = rms_norm(x, w, eps);
    let sigmoid = |v: f64| 1.0 / (1.0 + (-v).exp());
    let u = dy.zip(z, |d, g| d * g * sigmoid(g));
    let (dx, dw) = rms_norm_backward(x, w, &rstd, &u);
    let dsilu = z.map(|g| sigmoid(g) * (1.0 + g * (1.0 - sigmoid(g))));
    let dz = dy.zip(&y, |d, v| d * v).zip(&dsilu, |a, s| a * s);
    (dx, dz, dw)
}
