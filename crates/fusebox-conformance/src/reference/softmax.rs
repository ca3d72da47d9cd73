//! f64 twins of softmax, its backward and log-softmax, along any dim: the tensor is
//! viewed as `[outer, len, inner]` and each `(outer, inner)` pair is one line along `dim`.

use crate::array::Array;

/// `(outer, len, inner)` around `dim`.
fn split(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    (shape[..dim].iter().product(), shape[dim], shape[dim + 1..].iter().product())
}

/// Flat indices of every line along `dim`.
fn lines(shape: &[usize], dim: usize) -> Vec<Vec<usize>> {
    let (outer, len, inner) = split(shape, dim);
    let mut out = Vec::new();
    for o in 0..outer {
        for i in 0..inner {
            out.push((0..len).map(|j| (o * len + j) * inner + i).collect());
        }
    }
    out
}

/// `y = e^(x − max)/Σ e^(x − max)` along `dim`; a line of all −∞ gives zeros.
pub fn softmax(x: &Array, dim: usize) -> Array {
    let mut y = Array::zeros(x.shape.clone());
    for line in lines(&x.shape, dim) {
        let max = line.iter().map(|&k| x.data[k]).fold(f64::NEG_INFINITY, f64::max);
        if max == f64::NEG_INFINITY {
            continue; // stays zero
        }
        let sum: f64 = line.iter().map(|&k| (x.data[k] - max).exp()).sum();
        for &k in &line {
            y.data[k] = (x.data[k] - max).exp() / sum;
        }
    }
    y
}

/// `dx = y·(dy − Σ dy·y)` along `dim`.
pub fn softmax_backward(y: &Array, dy: &Array, dim: usize) -> Array {
    let mut dx = Array::zeros(y.shape.clone());
    for line in lines(&y.shape, dim) {
        let dot: f64 = line.iter().map(|&k| y.data[k] * dy.data[k]).sum();
        for &k in &line {
            dx.data[k] = y.data[k] * (dy.data[k] - dot);
        }
    }
    dx
}

/// `x − max − ln Σ e^(x − max)` along `dim`; a line of all −∞ gives −∞.
pub fn log_softmax(x: &Array, dim: usize) -> Array {
    let mut y = Array::zeros(x.shape.clone());
    for line in lines(&x.shape, dim) {
        let max = line.iter().map(|&k| x.data[k]).fold(f64::NEG_INFINITY, f64::max);
        if max == f64::NEG_INFINITY {
            for &k in &line {
                y.data[k] = f64::NEG_INFINITY;
            }
            continue;
        }
        let sum: f64 = line.iter().map(|&k| (x.data[k] - max).exp()).sum();
        for &k in &line {
            y.data[k] = x.data[k] - max - sum.ln();
        }
    }
    y
}
