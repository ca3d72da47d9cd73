//! f64 twins of the mixture-of-experts family: the router (`moe_route`) and its
//! backward, and the expert matmul (`expert_matmul`) and its backward. Every row of
//! router logits is one token's logits over the experts; plain loops over rows,
//! chosen experts and elements.

use fusebox::Routing;

use crate::array::Array;

/// The `k` experts of one row of logits with the largest logits, largest first
/// (ties: lower index first).
fn choose(row: &[f64], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).expect("no NaN logits").then(a.cmp(&b)));
    order.truncate(k);
    order
}

/// The weights of the chosen experts `chosen` of one row of logits: `softmax(row)` at
/// them (`SoftmaxTopK`), or `e^{l_e}/Σ_{chosen} e^{l}` (the normalised routings).
fn weights_of(row: &[f64], chosen: &[usize], routing: Routing) -> Vec<f64> {
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let numerators: Vec<f64> = chosen.iter().map(|&e| (row[e] - max).exp()).collect();
    let total: f64 = match routing {
        Routing::SoftmaxTopK => row.iter().map(|&l| (l - max).exp()).sum(),
        Routing::SoftmaxTopKNormalized | Routing::TopKSoftmax => numerators.iter().sum(),
    };
    numerators.iter().map(|&n| n / total).collect()
}

/// `moe_route(logits [..., E], k, routing)`: per row the k largest logits (descending,
/// ties to the lower index) and their weights; returns `(weights [..., k], experts [..., k])`.
pub fn moe_route(logits: &Array, k: usize, routing: Routing) -> (Array, Array) {
    let mut shape = logits.shape.clone();
    *shape.last_mut().expect("rank ≥ 1") = k;
    let mut weights = Array::zeros(shape.clone());
    let mut experts = Array::zeros(shape);
    for r in 0..logits.rows() {
        let row = logits.row(r);
        let chosen = choose(row, k);
        let w = weights_of(row, &chosen, routing);
        for j in 0..k {
            weights.data[r * k + j] = w[j];
            experts.data[r * k + j] = chosen[j] as f64;
        }
    }
    (weights, experts)
}

/// The weights of the given choice `experts [..., k]` as a function of the logits (what
/// `moe_route_backward` differentiates: the choice is held fixed).
pub fn route_weights(logits: &Array, experts: &Array, routing: Routing) -> Array {
    let k = experts.last_dim();
    let mut weights = Array::zeros(experts.shape.clone());
    for r in 0..logits.rows() {
        let chosen: Vec<usize> = experts.row(r).iter().map(|&e| e as usize).collect();
        let w = weights_of(logits.row(r), &chosen, routing);
        weights.data[r * k..(r + 1) * k].copy_from_slice(&w);
    }
    weights
}

/// `moe_route_backward`: with `g` the gradient of each chosen expert's weight,
/// `s = Σ_j w_j·g_j` per row,
/// * `SoftmaxTopK` (`w_j = p_{e_j}`, `p = softmax(l)`): `dl_i = p_i·([i chosen as j]·g_j − s)`;
/// * normalised: `dl_{e_j} = w_j·(g_j − s)`, and 0 for the experts not chosen.
pub fn moe_route_backward(logits: &Array, experts: &Array, d_weights: &Array, routing: Routing) -> Array {
    let n = logits.last_dim();
    let k = experts.last_dim();
    let mut d_logits = Array::zeros(logits.shape.clone());
    for r in 0..logits.rows() {
        let row = logits.row(r);
        let chosen: Vec<usize> = experts.row(r).iter().map(|&e| e as usize).collect();
        let g = d_weights.row(r);
        let w = weights_of(row, &chosen, routing);
        let s: f64 = (0..k).map(|j| w[j] * g[j]).sum();
        let out = &mut d_logits.data[r * n..(r + 1) * n];
        match routing {
            Routing::SoftmaxTopK => {
                let all: Vec<usize> = (0..n).collect();
                let p = weights_of(row, &all, Routing::SoftmaxTopK);
                for i in 0..n {
                    out[i] = -p[i] * s;
                }
                for j in 0..k {
                    out[chosen[j]] += p[chosen[j]] * g[j];
                }
            }
            Routing::SoftmaxTopKNormalized | Routing::TopKSoftmax => {
                for j in 0..k {
                    out[chosen[j]] += w[j] * (g[j] - s);
                }
            }
        }
    }
    d_logits
}

/// `expert_matmul(x [T, R, K], w [E, N, K], experts [T, k])`:
/// `y[t, j, o] = Σ_i x[t, r(j), i] · w[experts[t, j], o, i]`, `r(j) = 0` if R = 1 else j.
pub fn expert_matmul(x: &Array, w: &Array, experts: &Array) -> Array {
    let (tokens, rows, kin) = (x.shape[0], x.shape[1], x.shape[2]);
    let n = w.shape[1];
    let k = experts.shape[1];
    let mut y = Array::zeros(vec![tokens, k, n]);
    for t in 0..tokens {
        for j in 0..k {
            let e = experts.at(&[t, j]) as usize;
            let r = if rows == 1 { 0 } else { j };
            for o in 0..n {
                let mut s = 0.0;
                for i in 0..kin {
                    s += x.at(&[t, r, i]) * w.at(&[e, o, i]);
                }
                *y.at_mut(&[t, j, o]) = s;
            }
        }
    }
    y
}

/// Backward of `expert_matmul`: `(dx, dw)` with
/// `dx[t, r(j), i] += Σ_o dy[t, j, o] · w[e, o, i]` and `dw[e, o, i] += dy[t, j, o] · x[t, r(j), i]`
/// over every slot (t, j), `e = experts[t, j]` (dw zero for experts nobody chose).
pub fn expert_matmul_backward(x: &Array, w: &Array, experts: &Array, dy: &Array) -> (Array, Array) {
    let (tokens, rows, kin) = (x.shape[0], x.shape[1], x.shape[2]);
    let n = w.shape[1];
    let k = experts.shape[1];
    let mut dx = Array::zeros(x.shape.clone());
    let mut dw = Array::zeros(w.shape.clone());
    for t in 0..tokens {
        for j in 0..k {
            let e = experts.at(&[t, j]) as usize;
            let r = if rows == 1 { 0 } else { j };
            for o in 0..n {
                let g = dy.at(&[t, j, o]);
                for i in 0..kin {
                    *dx.at_mut(&[t, r, i]) += g * w.at(&[e, o, i]);
                    *dw.at_mut(&[e, o, i]) += g * x.at(&[t, r, i]);
                }
            }
        }
    }
    (dx, dw)
}

/// `expert_matmul_backward` with a weight gradient given: `dx` as above and `dw0 + dw`.
pub fn expert_matmul_backward_accumulate(
    x: &Array,
    w: &Array,
    experts: &Array,
    dy: &Array,
    dw0: &Array,
) -> (Array, Array) {
    let (dx, mut dw) = expert_matmul_backward(x, w, experts, dy);
    for (acc, start) in dw.data.iter_mut().zip(&dw0.data) {
        *acc += start;
    }
    (dx, dw)
}
