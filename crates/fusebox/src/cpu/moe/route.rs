//! The router: per row of logits `l` (one per expert), the k chosen experts and their
//! weights (see [`Routing`]), and the gradient of the weights with respect to `l`.
//!
//! Maths per row, with `p = softmax(l)` over all experts and `C` the chosen set:
//! * unnormalised (`SoftmaxTopK`): `w_j = p_{e_j}`, so `∂L/∂l_i = p_i·(g_i − Σ_j w_j·g_j)`
//!   where `g_i = ∂L/∂w_j` for `i = e_j` and 0 for experts not chosen;
//! * normalised (`SoftmaxTopKNormalized`, `TopKSoftmax`): `w_j = e^{l_{e_j}}/Σ_C e^{l}`, a
//!   softmax over the chosen logits alone, so `∂L/∂l_{e_j} = w_j·(g_j − Σ_j' w_j'·g_j')`
//!   and 0 for the others.
//!
//! The k chosen are the k largest logits (softmax is increasing, so the same as the k
//! largest `p`), in descending order, ties to the lower index (as `topk`).

use super::expert_ids;
use crate::cpu::convert::{f32_data, from_f32};
use crate::cpu::memory::host;
use crate::cpu::reduce::topk_row;
use crate::cpu::CpuBackend;
use crate::error::Result;
use crate::spec;
use crate::tensor::Tensor;
use crate::types::{Routed, Routing};

/// Each row's k chosen experts and their weights.
///
/// # Shapes
/// `logits`: `[..., E]` F32/F16/BF16, `1 ≤ k ≤ E` → weights `[..., k]` (logits' dtype),
/// experts `[..., k]` U32.
pub fn moe_route(cpu: &CpuBackend, logits: &Tensor, k: usize, routing: Routing) -> Result<Routed> {
    const OP: &str = "moe_route";
    host(OP, logits)?;
    let spec::moe::RouteSpec { rows, experts: n, k, out_dims, dtype } = spec::moe::moe_route(logits, k)?;
    let l = f32_data(OP, "logits", logits)?;
    let mut chosen = vec![0u32; rows * k];
    let mut weights = vec![0.0f32; rows * k];
    let rows_per_task = (4096 / n).max(1);
    cpu.for_each_chunk(&mut chosen, rows_per_task * k, n, |c, ids| {
        let mut scratch = Vec::new();
        for (r, out) in ids.chunks_exact_mut(k).enumerate() {
            let row = c * rows_per_task + r;
            topk_row(&l[row * n..(row + 1) * n], out, &mut scratch);
        }
    });
    for ((row, ids), w) in l.chunks_exact(n).zip(chosen.chunks_exact(k)).zip(weights.chunks_exact_mut(k)) {
        row_weights(row, ids, routing, w);
    }
    Ok(Routed { weights: from_f32(weights, out_dims.clone(), dtype)?, experts: Tensor::from_vec(chosen, out_dims)? })
}

/// The weights of the chosen experts `ids` of one row of logits (see the module docs);
/// returns the shift and the denominator used: `w_j = e^{l_{e_j} − top} / total`.
fn row_weights(row: &[f32], ids: &[u32], routing: Routing, w: &mut [f32]) -> (f32, f32) {
    // The largest chosen logit (the forward's first, and the row's maximum for the
    // forward's choice), so every exponent below is ≤ 0; any shift gives the same w.
    let top = ids.iter().map(|&e| row[e as usize]).fold(f32::NEG_INFINITY, f32::max);
    for (w, &e) in w.iter_mut().zip(ids) {
        *w = (row[e as usize] - top).exp();
    }
    let total: f32 = if routing.normalized() { w.iter().sum() } else { row.iter().map(|&v| (v - top).exp()).sum() };
    for w in w.iter_mut() {
        *w /= total;
    }
    (top, total)
}

/// Gradient of the routing weights with respect to the logits.
///
/// # Shapes
/// `logits`: `[..., E]`; `experts`: `[..., k]` U32 (the forward's choice);
/// `d_weights`: `[..., k]`, the logits' dtype → `[..., E]`, the logits' dtype.
pub fn moe_route_backward(
    cpu: &CpuBackend,
    logits: &Tensor,
    experts: &Tensor,
    d_weights: &Tensor,
    routing: Routing,
) -> Result<Tensor> {
    const OP: &str = "moe_route_backward";
    for t in [logits, experts, d_weights] {
        host(OP, t)?;
    }
    let spec::moe::RouteSpec { experts: n, k, out_dims, dtype, .. } =
        spec::moe::moe_route_backward(logits, experts, d_weights)?;
    let l = f32_data(OP, "logits", logits)?;
    let ids = expert_ids(OP, experts, n)?;
    let g = f32_data(OP, "d_weights", d_weights)?;
    let mut dl = vec![0.0f32; l.len()];
    let rows_per_task = (4096 / n).max(1);
    cpu.for_each_chunk(&mut dl, rows_per_task * n, n, |c, chunk| {
        let mut w = vec![0.0f32; k];
        for (r, out) in chunk.chunks_exact_mut(n).enumerate() {
            let row = c * rows_per_task + r;
            let (l, ids, g) = (&l[row * n..(row + 1) * n], &ids[row * k..(row + 1) * k], &g[row * k..(row + 1) * k]);
            // The forward's weights, recomputed.
            let (top, total) = row_weights(l, ids, routing, &mut w);
            let weighted: f32 = w.iter().zip(g).map(|(w, g)| w * g).sum();
            if routing.normalized() {
                for ((&e, w), g) in ids.iter().zip(&w).zip(g) {
                    out[e as usize] += w * (g - weighted);
                }
            } else {
                // `total` is the softmax's denominator over all experts here.
                for (o, &v) in out.iter_mut().zip(l) {
                    *o = -(v - top).exp() / total * weighted;
                }
                for ((&e, w), g) in ids.iter().zip(&w).zip(g) {
                    out[e as usize] += w * g;
                }
            }
        }
    });
    from_f32(dl, out_dims, dtype)
}
