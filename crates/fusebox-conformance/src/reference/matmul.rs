//! f64 twins of the matmul family: triple loops over explicit indices.

use crate::array::Array;

/// Element (i, j) of `op(x)` for the matrix at flat offset `base` of a row-major
/// `[rows, cols]` matrix: `x[i, j]`, or `x[j, i]` when `transposed`.
fn op_at(x: &Array, base: usize, cols: usize, transposed: bool, i: usize, j: usize) -> f64 {
    if transposed {
        x.data[base + j * cols + i]
    } else {
        x.data[base + i * cols + j]
    }
}

/// `(batch dims, batches, m, k, n, b shared)` of `op(a)·op(b)`.
fn matmul_dims(a: &Array, b: &Array, ta: bool, tb: bool) -> (Vec<usize>, usize, usize, usize, usize, bool) {
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let batch_dims = a.shape[..ra - 2].to_vec();
    let batches = batch_dims.iter().product();
    let (m, k) = if ta { (a.shape[ra - 1], a.shape[ra - 2]) } else { (a.shape[ra - 2], a.shape[ra - 1]) };
    let n = if tb { b.shape[rb - 2] } else { b.shape[rb - 1] };
    (batch_dims, batches, m, k, n, rb == 2)
}

/// `out[t] = op(a[t])·op(b[t])` over the batch (`b` shared when 2-d).
pub fn matmul(a: &Array, b: &Array, transpose_a: bool, transpose_b: bool) -> Array {
    let (batch_dims, batches, m, k, n, shared) = matmul_dims(a, b, transpose_a, transpose_b);
    let (a_cols, b_cols) = (a.last_dim(), b.last_dim());
    let mut out_shape = batch_dims;
    out_shape.extend([m, n]);
    let mut out = Array::zeros(out_shape);
    for t in 0..batches {
        let a_base = t * m * k;
        let b_base = if shared { 0 } else { t * k * n };
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for p in 0..k {
                    s += op_at(a, a_base, a_cols, transpose_a, i, p) * op_at(b, b_base, b_cols, transpose_b, p, j);
                }
                out.data[t * m * n + i * n + j] = s;
            }
        }
    }
    out
}

/// Backward of `matmul`: `(da, db)`, with `dA[i,p] = Σ_j dC[i,j]·B[p,j]`,
/// `dB[p,j] = Σ_i A[i,p]·dC[i,j]`, each written at the operand's own (maybe transposed)
/// position, and `db` summed over the batch when `b` is shared.
pub fn matmul_backward(a: &Array, b: &Array, d_out: &Array, transpose_a: bool, transpose_b: bool) -> (Array, Array) {
    let (_, batches, m, k, n, shared) = matmul_dims(a, b, transpose_a, transpose_b);
    let (a_cols, b_cols) = (a.last_dim(), b.last_dim());
    let mut da = Array::zeros(a.shape.clone());
    let mut db = Array::zeros(b.shape.clone());
    for t in 0..batches {
        let a_base = t * m * k;
        let b_base = if shared { 0 } else { t * k * n };
        for i in 0..m {
            for p in 0..k {
                for j in 0..n {
                    let g = d_out.data[t * m * n + i * n + j];
                    let a_idx = if transpose_a { a_base + p * a_cols + i } else { a_base + i * a_cols + p };
                    let b_idx = if transpose_b { b_base + j * b_cols + p } else { b_base + p * b_cols + j };
                    da.data[a_idx] += g * op_at(b, b_base, b_cols, transpose_b, p, j);
                    db.data[b_idx] += g * op_at(a, a_base, a_cols, transpose_a, i, p);
                }
            }
        }
    }
    (da, db)
}

/// `out[t] = op(a[t])·op(b[t])` for rank-3 operands (the rank-3 case of [`matmul`]).
pub fn batched_matmul(a: &Array, b: &Array, transpose_a: bool, transpose_b: bool) -> Array {
    matmul(a, b, transpose_a, transpose_b)
}

/// `y[r, o] = bias[o] + Σ_i x[r, i]·w[o, i]` over every row r of `x`.
pub fn linear_forward(x: &Array, w: &Array, bias: Option<&Array>) -> Array {
    let (fout, fin) = (w.shape[0], w.shape[1]);
    let rows = x.rows();
    let mut shape = x.shape.clone();
    *shape.last_mut().unwrap() = fout;
    let mut y = Array::zeros(shape);
    for r in 0..rows {
        for o in 0..fout {
            let mut s = bias.map_or(0.0, |b| b.data[o]);
            for i in 0..fin {
                s += x.data[r * fin + i] * w.data[o * fin + i];
            }
            y.data[r * fout + o] = s;
        }
    }
    y
}

/// Backward of `linear_forward`: `dx[r,i] = Σ_o dy[r,o]·w[o,i]`, `dw[o,i] = Σ_r dy[r,o]·x[r,i]`,
/// `dbias[o] = Σ_r dy[r,o]` (when `with_bias`).
pub fn linear_backward(x: &Array, w: &Array, dy: &Array, with_bias: bool) -> (Array, Array, Option<Array>) {
    let (fout, fin) = (w.shape[0], w.shape[1]);
    let rows = x.rows();
    let mut dx = Array::zeros(x.shape.clone());
    let mut dw = Array::zeros(w.shape.clone());
    let mut db = Array::zeros(vec![fout]);
    for r in 0..rows {
        for o in 0..fout {
            let g = dy.data[r * fout + o];
            db.data[o] += g;
            for i in 0..fin {
                dx.data[r * fin + i] += g * w.data[o * fin + i];
                dw.data[o * fin + i] += g * x.data[r * fin + i];
            }
        }
    }
    (dx, dw, with_bias.then_some(db))
}

/// `linear_backward_accumulate`: `dx` as in `linear_backward`, `dw0 + dw`, `db0 + db`.
pub fn linear_backward_accumulate(
    x: &Array,
    w: &Array,
    dy: &Array,
    dw0: &Array,
    db0: Option<&Array>,
) -> (Array, Array, Option<Array>) {
    let (dx, mut dw, db) = linear_backward(x, w, dy, true);
    for (acc, start) in dw.data.iter_mut().zip(&dw0.data) {
        *acc += start;
    }
    let db = db0.map(|db0| {
        let mut sum = db.expect("with_bias was set");
        for (acc, start) in sum.data.iter_mut().zip(&db0.data) {
            *acc += start;
        }
        sum
    });
    (dx, dw, db)
}

/// `s[b,h,i,j] = Σ_d q[b,h,i,d]·k_cache[b, h/(Hq/Hkv), j, d]` for `j < len`.
pub fn head_prefix_matmul(q: &Array, k_cache: &Array, len: usize) -> Array {
    let (batch, hq, tq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let (hkv, cap) = (k_cache.shape[1], k_cache.shape[2]);
    let group = hq / hkv;
    let mut out = Array::zeros(vec![batch, hq, tq, len]);
    for b in 0..batch {
        for h in 0..hq {
            for i in 0..tq {
                for j in 0..len {
                    let mut s = 0.0;
                    for e in 0..d {
                        let q_bhie = q.data[((b * hq + h) * tq + i) * d + e];
                        let k_bgje = k_cache.data[((b * hkv + h / group) * cap + j) * d + e];
                        s += q_bhie * k_bgje;
                    }
                    *out.at_mut(&[b, h, i, j]) = s;
                }
            }
        }
    }
    out
}

/// `a` with every value rounded to BF16 (round to nearest even): the operands the
/// `_bf16` ops multiply.
pub fn round_bf16(a: &Array) -> Array {
    a.map(|v| half::bf16::from_f32(v as f32).to_f64())
}

/// `linear_forward_bf16`: [`linear_forward`] of the BF16-rounded x and W (bias exact).
pub fn linear_forward_bf16(x: &Array, w: &Array, bias: Option<&Array>) -> Array {
    linear_forward(&round_bf16(x), &round_bf16(w), bias)
}

/// `linear_backward_accumulate_bf16`: `dx` and `dw0 + dw` from the BF16-rounded x, W and
/// dy; `db0 + Σ_rows dy` from dy itself.
pub fn linear_backward_accumulate_bf16(
    x: &Array,
    w: &Array,
    dy: &Array,
    dw0: &Array,
    db0: Option<&Array>,
) -> (Array, Array, Option<Array>) {
    let (dx, dw, _) = linear_backward_accumulate(&round_bf16(x), &round_bf16(w), &round_bf16(dy), dw0, None);
    let (_, _, db) = linear_backward_accumulate(x, w, dy, dw0, db0);
    (dx, dw, db)
}
