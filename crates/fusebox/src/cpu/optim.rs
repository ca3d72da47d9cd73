//! The optimizer step and gradient clipping: AdamW in place, the global gradient norm
//! (f64 accumulation over fixed chunks, so it is the same for any thread count) and
//! the clipping factor.

use crate::cpu::pool::SharedMut;
use crate::cpu::simd::{multiversion, prefetch, prefetch_write, OWN_AHEAD};
use crate::cpu::{convert, CpuBackend};
use crate::dtype::DType;
use crate::error::Result;
use crate::spec::optim as spec;
use crate::tensor::Tensor;
use crate::types::AdamWConfig;

/// Work units per element of the AdamW step (two fmas, a sqrt and a division).
const ADAM_WORK: usize = 4;
/// Elements per task of the AdamW step.
const ADAM_CHUNK: usize = 1 << 14;
/// Elements per partial sum of the global norm (fixed, so the sum order never changes).
const NORM_CHUNK: usize = 1 << 14;

/// The kernels: `pub` only because `multiversion!` defines `pub fn`s; the module is private.
mod lanes {
    use super::*;

    /// Lanes of the inner loops (one AVX-512 register, two AVX2 ones).
    const LANES: usize = 16;

    /// The per-step constants of AdamW, in f32 (the bias corrections come from f64).
    #[derive(Debug, Clone, Copy)]
    pub struct AdamCoef {
        pub beta1: f32,
        pub beta2: f32,
        pub lr: f32,
        pub eps: f32,
        pub weight_decay: f32,
        /// Multiplies the gradient (clipping).
        pub grad_scale: f32,
        /// `1/(1 − β₁ᵗ)`
        pub inv_bc1: f32,
        /// `1/√(1 − β₂ᵗ)`, so that `√v̂ = √v·rsqrt_bc2`.
        pub rsqrt_bc2: f32,
    }

    multiversion! {
        /// With `g = grad_scale·grad`: `m ← β₁m + (1−β₁)g`, `v ← β₂v + (1−β₂)g²`,
        /// `p ← p − lr·(m̂/(√v̂ + ε) + λ·p)` with `m̂ = m/(1−β₁ᵗ)`, `√v̂ = √v/√(1−β₂ᵗ)`.
        ///
        /// A square root and a divide per element leave too few iterations in flight for
        /// the out-of-order window to reach the memory ahead, so every 16 elements the
        /// lines [`OWN_AHEAD`] elements ahead are requested (`g`) and prefetched for
        /// writing (`p`, `m`, `v`).
        pub fn adamw(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], c: AdamCoef) {
            let n = p.len().min(g.len()).min(m.len()).min(v.len());
            let (p, g, m, v) = (&mut p[..n], &g[..n], &mut m[..n], &mut v[..n]);
            let step = |p: &mut f32, g: f32, m: &mut f32, v: &mut f32| {
                let gi = c.grad_scale * g;
                let mi = c.beta1 * *m + (1.0 - c.beta1) * gi;
                let vi = c.beta2 * *v + (1.0 - c.beta2) * gi * gi;
                *m = mi;
                *v = vi;
                let update = (mi * c.inv_bc1) / (vi.sqrt() * c.rsqrt_bc2 + c.eps) + c.weight_decay * *p;
                *p -= c.lr * update;
            };
            let (pp, mp, vp) = (p.as_ptr(), m.as_ptr(), v.as_ptr());
            let mut i = 0;
            while i + LANES <= n {
                let ahead = i + OWN_AHEAD;
                prefetch(g, ahead, 1);
                for ptr in [pp, mp, vp] {
                    prefetch_write(ptr.wrapping_add(ahead));
                }
                let c = i..i + LANES;
                let (pc, gc, mc, vc) = (&mut p[c.clone()], &g[c.clone()], &mut m[c.clone()], &mut v[c]);
                for l in 0..LANES {
                    step(&mut pc[l], gc[l], &mut mc[l], &mut vc[l]);
                }
                i += LANES;
            }
            for j in i..n {
                step(&mut p[j], g[j], &mut m[j], &mut v[j]);
            }
        }
    }

    multiversion! {
        /// `Σ x[i]²`: 16 f32 lanes over blocks of 1024 elements (64 terms per lane, so
        /// f32 rounding stays near 1e-6 relative), each block's lanes added into f64
        /// partial sums, combined in a fixed order. A block whose f32 squares overflow is
        /// summed in f64, so huge values give their true norm rather than ∞.
        pub fn sum_squares_f64(x: &[f32]) -> f64 {
            const BLOCK: usize = 1024;
            let mut acc = [0.0f64; 16];
            let mut blocks = x.chunks_exact(BLOCK);
            for block in &mut blocks {
                let mut lane = [0.0f32; 16];
                for v in block.chunks_exact(16) {
                    for l in 0..16 {
                        lane[l] += v[l] * v[l];
                    }
                }
                if lane.iter().all(|s| s.is_finite()) {
                    for l in 0..16 {
                        acc[l] += lane[l] as f64;
                    }
                } else {
                    // Squares beyond f32 (|x| > 1.8e19) or NaN: this block again in f64.
                    for v in block.chunks_exact(16) {
                        for l in 0..16 {
                            acc[l] += (v[l] as f64) * (v[l] as f64);
                        }
                    }
                }
            }
            let tail: f64 = blocks.remainder().iter().map(|&e| (e as f64) * (e as f64)).sum();
            acc.iter().sum::<f64>() + tail
        }
    }
}

/// The step on f32 slices, in parallel chunks (each chunk's p, g, m, v are one index range).
fn adamw_slices(cpu: &CpuBackend, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], c: lanes::AdamCoef) {
    let (m_ptr, v_ptr) = (SharedMut(m.as_mut_ptr()), SharedMut(v.as_mut_ptr()));
    cpu.for_each_chunk(p, ADAM_CHUNK, ADAM_WORK, |i, pc| {
        let start = i * ADAM_CHUNK;
        // SAFETY: m and v have p's length (shapes checked); chunk i covers
        // [start, start + pc.len()) and chunks are disjoint.
        let (mc, vc) = unsafe { (m_ptr.slice(start, pc.len()), v_ptr.slice(start, pc.len())) };
        lanes::adamw(pc, &g[start..start + pc.len()], mc, vc, c);
    });
}

/// One AdamW step in place (`step` counts from 1), with `g = grad_scale·grad`:
/// `m ← β₁m + (1−β₁)g`, `v ← β₂v + (1−β₂)g²`, `m̂ = m/(1−β₁ᵗ)`, `v̂ = v/(1−β₂ᵗ)`,
/// `p ← p − lr·(m̂/(√v̂ + ε) + λ·p)`. Bias corrections are computed in f64, then used in
/// f32. param, m and v must be writable (not shared with another handle).
///
/// # Shapes
/// `param`, `grad`, `m`, `v`: equal shapes; m and v F32; param and grad float, same dtype.
pub fn adamw_update(
    cpu: &CpuBackend,
    param: &mut Tensor,
    grad: &Tensor,
    m: &mut Tensor,
    v: &mut Tensor,
    config: &AdamWConfig,
    step: u64,
) -> Result<()> {
    // Called directly by backends (not through `on_cpu!`): hold this backend's ISA.
    let _isa = cpu.enter();
    const OP: &str = "adamw_update";
    spec::adamw_update(param, grad, m, v, config, step)?;
    param.ensure_writable(OP)?;
    m.ensure_writable(OP)?;
    v.ensure_writable(OP)?;

    let bc1 = 1.0 - (config.beta1 as f64).powf(step as f64);
    let bc2 = 1.0 - (config.beta2 as f64).powf(step as f64);
    let coef = lanes::AdamCoef {
        beta1: config.beta1,
        beta2: config.beta2,
        lr: config.lr,
        eps: config.eps,
        weight_decay: config.weight_decay,
        grad_scale: config.grad_scale,
        inv_bc1: (1.0 / bc1) as f32,
        rsqrt_bc2: (1.0 / bc2.sqrt()) as f32,
    };
    let g = convert::f32_data(OP, "grad", grad)?;
    let (ms, vs) = (m.as_mut_slice::<f32>()?, v.as_mut_slice::<f32>()?);
    if param.dtype() == DType::F32 {
        adamw_slices(cpu, param.as_mut_slice::<f32>()?, &g, ms, vs, coef);
        return Ok(());
    }
    // F16/BF16 parameters: step in f32, round once on the way back.
    let mut p = convert::f32_data(OP, "param", param)?.into_owned();
    adamw_slices(cpu, &mut p, &g, ms, vs, coef);
    convert::store_f32(param, &p)
}

/// `sqrt(Σ_t Σ_i t_i²)` over all tensors, accumulated in f64 over fixed chunks and summed
/// in order (the same for any thread count). No tensors → 0.
///
/// # Shapes
/// any number of float tensors of any shapes → a number.
pub fn global_norm(cpu: &CpuBackend, tensors: &[Tensor]) -> Result<f32> {
    // Called directly by backends (not through `on_cpu!`): hold this backend's ISA.
    let _isa = cpu.enter();
    const OP: &str = "global_norm";
    spec::global_norm(tensors)?;
    let mut total = 0.0f64;
    for (i, t) in tensors.iter().enumerate() {
        let data = convert::f32_data(OP, &format!("tensor {i}"), t)?;
        let chunks = data.len().div_ceil(NORM_CHUNK);
        let parts = cpu.map_indices(chunks, NORM_CHUNK, |c| {
            let start = c * NORM_CHUNK;
            lanes::sum_squares_f64(&data[start..(start + NORM_CHUNK).min(data.len())])
        });
        total += parts.iter().sum::<f64>();
    }
    Ok(total.sqrt() as f32)
}

/// The factor that clips gradients to `max_norm`: `min(1, max_norm/(norm + 1e-6))`.
/// Errors for a NaN or negative `max_norm` (+∞ disables clipping: factor 1) and for a
/// NaN, infinite or negative `global_norm` (overflowed gradients cannot be rescaled).
///
/// # Shapes
/// numbers → a number.
pub fn clip_scale(global_norm: f32, max_norm: f32) -> Result<f32> {
    spec::clip_scale(global_norm, max_norm)?;
    Ok((max_norm as f64 / (global_norm as f64 + 1e-6)).min(1.0) as f32)
}
