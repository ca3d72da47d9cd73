//! f64 twins of the reduce family: plain loops over multi-indices.

use crate::array::{indices, Array};

/// The shape of `x` without `axis`, or `[]` for `None`.
fn reduced_shape(x: &Array, axis: Option<usize>) -> Vec<usize> {
    match axis {
        Some(a) => x.shape.iter().enumerate().filter(|&(i, _)| i != a).map(|(_, &d)| d).collect(),
        None => vec![],
    }
}

/// The output index an input multi-index contributes to.
fn reduced_index(idx: &[usize], axis: Option<usize>) -> Vec<usize> {
    match axis {
        Some(a) => idx.iter().enumerate().filter(|&(i, _)| i != a).map(|(_, &v)| v).collect(),
        None => vec![],
    }
}

/// Number of elements each output reduces.
fn count(x: &Array, axis: Option<usize>) -> f64 {
    match axis {
        Some(a) => x.shape[a] as f64,
        None => x.len() as f64,
    }
}

/// `Σ f(x)` along `axis` (or over everything).
fn sum_of(x: &Array, axis: Option<usize>, f: impl Fn(f64, &[usize]) -> f64) -> Array {
    let mut out = Array::zeros(reduced_shape(x, axis));
    for idx in indices(&x.shape) {
        let o = reduced_index(&idx, axis);
        *out.at_mut(&o) += f(x.at(&idx), &o);
    }
    out
}

/// `Σ x`.
pub fn sum(x: &Array, axis: Option<usize>) -> Array {
    sum_of(x, axis, |v, _| v)
}

/// `Σ x / n`.
pub fn mean(x: &Array, axis: Option<usize>) -> Array {
    let n = count(x, axis);
    sum(x, axis).map(|s| s / n)
}

/// `max x`.
pub fn max(x: &Array, axis: Option<usize>) -> Array {
    let mut out = Array::zeros(reduced_shape(x, axis)).map(|_| f64::NEG_INFINITY);
    for idx in indices(&x.shape) {
        let o = reduced_index(&idx, axis);
        let v = x.at(&idx);
        if v > out.at(&o) {
            *out.at_mut(&o) = v;
        }
    }
    out
}

/// Population variance `Σ (x − mean)² / n`.
pub fn var(x: &Array, axis: Option<usize>) -> Array {
    let n = count(x, axis);
    let m = mean(x, axis);
    sum_of(x, axis, |v, o| (v - m.at(o)) * (v - m.at(o))).map(|s| s / n)
}

/// `Σ |x|`.
pub fn sum_abs(x: &Array, axis: Option<usize>) -> Array {
    sum_of(x, axis, |v, _| v.abs())
}

/// Index of the first maximum along `axis`.
pub fn argmax(x: &Array, axis: usize) -> Array {
    let shape = reduced_shape(x, Some(axis));
    let mut out = Array::zeros(shape.clone());
    for o in indices(&shape) {
        let mut best = f64::NEG_INFINITY;
        let mut best_j = 0;
        for j in 0..x.shape[axis] {
            let mut idx = o.clone();
            idx.insert(axis, j);
            if x.at(&idx) > best {
                best = x.at(&idx);
                best_j = j;
            }
        }
        *out.at_mut(&o) = best_j as f64;
    }
    out
}

/// The `k` largest values along the last dim (descending; ties: lower index first) and their indices.
pub fn topk(x: &Array, k: usize) -> (Array, Array) {
    let n = x.last_dim();
    let mut shape = x.shape.clone();
    *shape.last_mut().unwrap() = k;
    let mut values = Array::zeros(shape.clone());
    let mut idxs = Array::zeros(shape);
    for r in 0..x.rows() {
        let row = x.row(r);
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap().then(a.cmp(&b)));
        for (i, &j) in order.iter().take(k).enumerate() {
            values.data[r * k + i] = row[j];
            idxs.data[r * k + i] = j as f64;
        }
    }
    (values, idxs)
}

/// Gradient of `max` along `axis`: `d_out` at the first arg-max, zero elsewhere.
pub fn max_backward(x: &Array, d_out: &Array, axis: usize) -> Array {
    let arg = argmax(x, axis);
    let mut dx = Array::zeros(x.shape.clone());
    for o in indices(&arg.shape) {
        let mut idx = o.clone();
        idx.insert(axis, arg.at(&o) as usize);
        *dx.at_mut(&idx) = d_out.at(&o);
    }
    dx
}

/// Sums `x` down to `shape` (the inverse of broadcasting `shape` to x's shape).
pub fn sum_to_shape(x: &Array, shape: &[usize]) -> Array {
    let lead = x.shape.len() - shape.len();
    let mut out = Array::zeros(shape.to_vec());
    for idx in indices(&x.shape) {
        let o: Vec<usize> = (0..shape.len()).map(|a| if shape[a] == 1 { 0 } else { idx[lead + a] }).collect();
        *out.at_mut(&o) += x.at(&idx);
    }
    out
}
