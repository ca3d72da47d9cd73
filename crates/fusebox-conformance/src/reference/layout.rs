//! f64 twins of the layout family: plain loops over multi-indices.

use crate::array::{indices, Array};

/// `out[i_0, .., i_{r-1}] = x[j]` with `j[perm[a]] = i_a`.
pub fn permute(x: &Array, perm: &[usize]) -> Array {
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let mut out = Array::zeros(shape.clone());
    for idx in indices(&shape) {
        let mut src = vec![0; x.shape.len()];
        for (a, &p) in perm.iter().enumerate() {
            src[p] = idx[a];
        }
        *out.at_mut(&idx) = x.at(&src);
    }
    out
}

/// Swaps axes `dim0` and `dim1`.
pub fn transpose(x: &Array, dim0: usize, dim1: usize) -> Array {
    let mut perm: Vec<usize> = (0..x.shape.len()).collect();
    perm.swap(dim0, dim1);
    permute(x, &perm)
}

/// Elements `start .. start + len` along `axis`.
pub fn slice(x: &Array, axis: usize, start: usize, len: usize) -> Array {
    let mut shape = x.shape.clone();
    shape[axis] = len;
    let mut out = Array::zeros(shape.clone());
    for idx in indices(&shape) {
        let mut src = idx.clone();
        src[axis] += start;
        *out.at_mut(&idx) = x.at(&src);
    }
    out
}

/// Gradient of `slice`: `d_out` placed at `start ..` along `axis` in zeros of `input_shape`.
pub fn slice_backward(d_out: &Array, input_shape: &[usize], axis: usize, start: usize) -> Array {
    let mut out = Array::zeros(input_shape.to_vec());
    for idx in indices(&d_out.shape) {
        let mut dst = idx.clone();
        dst[axis] += start;
        *out.at_mut(&dst) = d_out.at(&idx);
    }
    out
}

/// Index `index` along `axis`, which is removed.
pub fn select(x: &Array, axis: usize, index: usize) -> Array {
    let mut shape = x.shape.clone();
    shape.remove(axis);
    let mut out = Array::zeros(shape.clone());
    for idx in indices(&shape) {
        let mut src = idx.clone();
        src.insert(axis, index);
        *out.at_mut(&idx) = x.at(&src);
    }
    out
}

/// Joins `xs` along `axis`.
pub fn concat(xs: &[Array], axis: usize) -> Array {
    let mut shape = xs[0].shape.clone();
    shape[axis] = xs.iter().map(|x| x.shape[axis]).sum();
    let mut out = Array::zeros(shape);
    let mut offset = 0;
    for x in xs {
        for idx in indices(&x.shape) {
            let mut dst = idx.clone();
            dst[axis] += offset;
            *out.at_mut(&dst) = x.at(&idx);
        }
        offset += x.shape[axis];
    }
    out
}

/// Broadcasts `x` to `shape` (numpy rules).
pub fn expand(x: &Array, shape: &[usize]) -> Array {
    let lead = shape.len() - x.shape.len();
    let mut out = Array::zeros(shape.to_vec());
    for idx in indices(shape) {
        let src: Vec<usize> = (0..x.shape.len()).map(|a| if x.shape[a] == 1 { 0 } else { idx[lead + a] }).collect();
        *out.at_mut(&idx) = x.at(&src);
    }
    out
}

/// The same values under another shape.
pub fn reshape(x: &Array, shape: &[usize]) -> Array {
    x.reshaped(shape.to_vec())
}
