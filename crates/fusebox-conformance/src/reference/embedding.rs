//! f64 twins of the embedding family: row loops.

use crate::array::Array;

/// Row `r` of `x` viewed as `[x.shape[0], rest]`.
fn row_of(x: &Array, r: usize) -> &[f64] {
    let width = x.len() / x.shape[0].max(1);
    &x.data[r * width..(r + 1) * width]
}

/// `out[..., :] = table[ids[...], :]`.
pub fn embedding(ids: &Array, table: &Array) -> Array {
    let d = table.shape[1];
    let mut shape = ids.shape.clone();
    shape.push(d);
    let mut out = Array::zeros(shape);
    for (n, &id) in ids.data.iter().enumerate() {
        for j in 0..d {
            out.data[n * d + j] = table.data[id as usize * d + j];
        }
    }
    out
}

/// `dtable[ids[n], :] += d_out[n, :]` into zeros of `[vocab, D]`.
pub fn embedding_backward(ids: &Array, d_out: &Array, vocab: usize) -> Array {
    let d = d_out.last_dim();
    let mut out = Array::zeros(vec![vocab, d]);
    for (n, &id) in ids.data.iter().enumerate() {
        for j in 0..d {
            out.data[id as usize * d + j] += d_out.data[n * d + j];
        }
    }
    out
}

/// `out[i] = x[ids[i]]` (rows along the first axis).
pub fn index_select(x: &Array, ids: &Array) -> Array {
    let mut shape = x.shape.clone();
    shape[0] = ids.len();
    let mut data = Vec::new();
    for &id in &ids.data {
        data.extend_from_slice(row_of(x, id as usize));
    }
    Array::new(shape, data)
}

/// `x` with `x[ids[i]] += src[i]` (a new array).
pub fn index_add(x: &Array, ids: &Array, src: &Array) -> Array {
    let width = x.len() / x.shape[0].max(1);
    let mut out = x.clone();
    for (i, &id) in ids.data.iter().enumerate() {
        for j in 0..width {
            out.data[id as usize * width + j] += src.data[i * width + j];
        }
    }
    out
}

/// What `scatter_add_rows(dst, ids, src)` leaves in `dst`.
pub fn scatter_add_rows(dst: &Array, ids: &Array, src: &Array) -> Array {
    index_add(dst, ids, src)
}

/// Rows `start .. start + len` along the first axis.
pub fn slice_rows(x: &Array, start: usize, len: usize) -> Array {
    let mut shape = x.shape.clone();
    shape[0] = len;
    let mut data = Vec::new();
    for r in start..start + len {
        data.extend_from_slice(row_of(x, r));
    }
    Array::new(shape, data)
}
