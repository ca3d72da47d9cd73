//! f64 twins of the optimizer step and gradient clipping.

use fusebox::AdamWConfig;

use crate::array::Array;

/// One AdamW step (`step` from 1), returning the new `(param, m, v)`:
/// `m ← β₁m + (1−β₁)g`, `v ← β₂v + (1−β₂)g²`, `m̂ = m/(1−β₁ᵗ)`, `v̂ = v/(1−β₂ᵗ)`,
/// `p ← p − lr·(m̂/(√v̂ + ε) + λ·p)`.
pub fn adamw(p: &Array, g: &Array, m: &Array, v: &Array, c: &AdamWConfig, step: u64) -> (Array, Array, Array) {
    let (b1, b2) = (c.beta1 as f64, c.beta2 as f64);
    let (lr, eps, wd) = (c.lr as f64, c.eps as f64, c.weight_decay as f64);
    let (mut p2, mut m2, mut v2) = (p.clone(), m.clone(), v.clone());
    for i in 0..p.len() {
        let g = c.grad_scale as f64 * g.data[i];
        m2.data[i] = b1 * m.data[i] + (1.0 - b1) * g;
        v2.data[i] = b2 * v.data[i] + (1.0 - b2) * g * g;
        let m_hat = m2.data[i] / (1.0 - b1.powi(step as i32));
        let v_hat = v2.data[i] / (1.0 - b2.powi(step as i32));
        p2.data[i] = p.data[i] - lr * (m_hat / (v_hat.sqrt() + eps) + wd * p.data[i]);
    }
    (p2, m2, v2)
}

/// `sqrt(Σ_t Σ_i t_i²)`.
pub fn global_norm(tensors: &[Array]) -> f64 {
    tensors.iter().flat_map(|t| t.data.iter()).map(|x| x * x).sum::<f64>().sqrt()
}

/// `min(1, max_norm/(norm + 1e-6))`.
pub fn clip_scale(norm: f64, max_norm: f64) -> f64 {
    (max_norm / (norm + 1e-6)).min(1.0)
}
