//! Fused causal attention, forward and backward, on a grouped-query shape (8 query heads
//! reading 2 key/value heads), checked against a plain f64 computation:
//!
//! - the forward output and the saved logsumexp against a naive `softmax(Q·Kᵀ·scale)·V`
//!   with the causal mask;
//! - the backward (dQ, dK, dV) against a central finite difference of the naive forward
//!   along a random direction: for `L = Σ out·dO`, `⟨dQ, δQ⟩ + ⟨dK, δK⟩ + ⟨dV, δV⟩` must
//!   equal `(L(x + εδ) − L(x − εδ)) / 2ε`.
//!
//! ```text
//! cargo run --release -p fusebox --example causal_attention
//! ```
//!
//! Exits non-zero when a check fails.

use fusebox::{ComputeBackend, CpuBackend, Result, Tensor};

/// Batch, query heads, kv heads, sequence length, head dim. Layout `(B, H, T, D)`.
const B: usize = 2;
const HQ: usize = 8;
const HKV: usize = 2;
const T: usize = 48;
const D: usize = 32;

fn main() -> Result<()> {
    let cpu = CpuBackend::new()?;
    let mut rng = Lcg(0x5eed);
    let q_data = rng.vec(B * HQ * T * D);
    let k_data = rng.vec(B * HKV * T * D);
    let v_data = rng.vec(B * HKV * T * D);
    let d_out_data = rng.vec(B * HQ * T * D);
    let scale = 1.0 / (D as f32).sqrt();

    let q = Tensor::from_slice(&q_data, [B, HQ, T, D])?;
    let k = Tensor::from_slice(&k_data, [B, HKV, T, D])?;
    let v = Tensor::from_slice(&v_data, [B, HKV, T, D])?;
    let d_out = Tensor::from_slice(&d_out_data, [B, HQ, T, D])?;

    // Forward: the output and the per-row logsumexp the backward needs (no T×T matrix).
    let result = cpu.causal_attention(&q, &k, &v, None, None, scale)?;
    println!(
        "causal_attention on {} ({} threads): q {:?}, k/v {:?} -> output {:?}, logsumexp {:?} ({})",
        cpu.name(),
        cpu.threads(),
        q.dims(),
        k.dims(),
        result.output.dims(),
        result.logsumexp.dims(),
        result.logsumexp.dtype().name(),
    );

    // Backward: dK and dV are summed over the 4 query heads that share each kv head.
    let grads = cpu.causal_attention_backward(&q, &k, &v, &result, &d_out, None, None, scale)?;
    println!(
        "causal_attention_backward -> dq {:?}, dk {:?}, dv {:?}",
        grads.dq.dims(),
        grads.dk.dims(),
        grads.dv.dims()
    );

    let mut failed = false;

    // 1. Forward against the naive f64 computation.
    let (naive_out, naive_lse) = naive_attention(&to_f64(&q_data), &to_f64(&k_data), &to_f64(&v_data), scale as f64);
    let out_err = max_abs_diff(&result.output.to_vec_f32()?, &naive_out);
    let lse_err = max_abs_diff(&result.logsumexp.to_vec_f32()?, &naive_lse);
    failed |= report("forward output, max |fused − naive|", out_err, 1e-4);
    failed |= report("logsumexp, max |fused − naive|", lse_err, 1e-4);

    // 2. Backward against a finite difference of the naive forward along a direction δ.
    let (dq_dir, dk_dir, dv_dir) = (rng.vec(q_data.len()), rng.vec(k_data.len()), rng.vec(v_data.len()));
    let analytic = dot(&grads.dq.to_vec_f32()?, &dq_dir)
        + dot(&grads.dk.to_vec_f32()?, &dk_dir)
        + dot(&grads.dv.to_vec_f32()?, &dv_dir);
    let eps = 1e-4;
    let loss_at = |sign: f64| {
        let shift = |x: &[f32], d: &[f32]| -> Vec<f64> {
            x.iter().zip(d).map(|(&x, &d)| x as f64 + sign * eps * d as f64).collect()
        };
        let (out, _) =
            naive_attention(&shift(&q_data, &dq_dir), &shift(&k_data, &dk_dir), &shift(&v_data, &dv_dir), scale as f64);
        out.iter().zip(&d_out_data).map(|(&o, &g)| o * g as f64).sum::<f64>()
    };
    let numeric = (loss_at(1.0) - loss_at(-1.0)) / (2.0 * eps);
    let rel = (analytic - numeric).abs() / numeric.abs().max(1.0);
    println!("directional derivative: backward {analytic:.6}, finite difference {numeric:.6}");
    failed |= report("backward, relative error of the directional derivative", rel, 1e-4);

    if failed {
        eprintln!("a check failed");
        std::process::exit(1);
    }
    println!("all checks passed");
    Ok(())
}

/// Naive causal attention in f64 with GQA by index (query head h reads kv head
/// h / (HQ / HKV)); returns the output `(B, HQ, T, D)` and the logsumexp `(B, HQ, T)`.
fn naive_attention(q: &[f64], k: &[f64], v: &[f64], scale: f64) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; B * HQ * T * D];
    let mut lse = vec![0.0; B * HQ * T];
    let group = HQ / HKV;
    for b in 0..B {
        for h in 0..HQ {
            let qh = &q[(b * HQ + h) * T * D..][..T * D];
            let kv_at = (b * HKV + h / group) * T * D;
            let (kh, vh) = (&k[kv_at..][..T * D], &v[kv_at..][..T * D]);
            for i in 0..T {
                // Query i sees keys j ≤ i.
                let scores: Vec<f64> =
                    (0..=i).map(|j| (0..D).map(|d| qh[i * D + d] * kh[j * D + d]).sum::<f64>() * scale).collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                lse[(b * HQ + h) * T + i] = max + sum.ln();
                let row = &mut out[((b * HQ + h) * T + i) * D..][..D];
                for (j, s) in scores.iter().enumerate() {
                    let p = (s - max).exp() / sum;
                    for d in 0..D {
                        row[d] += p * vh[j * D + d];
                    }
                }
            }
        }
    }
    (out, lse)
}

/// Prints a check and returns whether it failed.
fn report(what: &str, err: f64, tolerance: f64) -> bool {
    let ok = err <= tolerance;
    println!("{what}: {err:.2e} (tolerance {tolerance:.0e}) {}", if ok { "ok" } else { "FAILED" });
    !ok
}

fn to_f64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

fn max_abs_diff(a: &[f32], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(&a, &b)| (a as f64 - b).abs()).fold(0.0, f64::max)
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&a, &b)| a as f64 * b as f64).sum()
}

/// A small deterministic generator (64-bit LCG), uniform in [-1, 1).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}
