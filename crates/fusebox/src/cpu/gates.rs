//! The Gated DeltaNet gates (transformers' `Qwen3_5GatedDeltaNet`, Qwen3-Next): per
//! row and head h, `β = σ(b)` and `g = −e^{a_log[h]}·softplus(a + dt_bias[h])`, and
//! their backward, fused into one sweep each, computed in f32 whatever the input
//! dtype. The softplus is `stable_softplus`'s; torch's (linear above 20) agrees with it
//! within f32 rounding (`ln(1 + e^−20)` is 2e-9).
//!
//! Rows run in fixed blocks; the backward's sums over rows (`da_log`, `ddt_bias`) take
//! one partial per block, added in block order, so results do not depend on threads.

use crate::cpu::activation::{sigmoid1, softplus1};
use crate::cpu::convert::{self, F32Output};
use crate::cpu::norm::{backward_block_rows, for_each_block, forward_block_rows, sum_partials};
use crate::cpu::simd::multiversion;
use crate::cpu::CpuBackend;
use crate::error::Result;
use crate::spec::gates::{self as spec, GatesSpec};
use crate::tensor::Tensor;
use crate::types::{GateGradients, GateOutput};

multiversion! {
    /// Rows of the gates: `g = −A[h]·softplus(a + dt_bias[h])`, `β = σ(b)`, with
    /// `A = e^{a_log}` precomputed (rows of `A.len()` heads).
    pub fn gates_rows(g: &mut [f32], beta: &mut [f32], a: &[f32], b: &[f32], decay: &[f32], dt_bias: &[f32]) {
        let heads = decay.len();
        for (((g, beta), a), b) in
            g.chunks_exact_mut(heads).zip(beta.chunks_exact_mut(heads)).zip(a.chunks_exact(heads)).zip(b.chunks_exact(heads))
        {
            for h in 0..heads {
                g[h] = -decay[h] * softplus1::<FMA>(a[h] + dt_bias[h]);
                beta[h] = sigmoid1::<FMA>(b[h]);
            }
        }
    }
}

multiversion! {
    /// Backward of `gates_rows`: with `x = a + dt_bias[h]`, `da = −dg·A[h]·σ(x)`,
    /// `db = dβ·β·(1 − β)`; `sums = [Σ dg·g (da_log), Σ da (ddt_bias)]` per head, added to.
    pub fn gates_grad_rows(
        da: &mut [f32],
        db: &mut [f32],
        sums: &mut [f32],
        rows: [&[f32]; 4],
        decay: &[f32],
        dt_bias: &[f32]
    ) {
        let [a, b, dg, dbeta] = rows;
        let heads = decay.len();
        let (s_log, s_bias) = sums.split_at_mut(heads);
        for (r, (da, db)) in da.chunks_exact_mut(heads).zip(db.chunks_exact_mut(heads)).enumerate() {
            let at = r * heads;
            let (a, b, dg, dbeta) = (&a[at..at + heads], &b[at..at + heads], &dg[at..at + heads], &dbeta[at..at + heads]);
            for h in 0..heads {
                let x = a[h] + dt_bias[h];
                // dg/da_log = g itself; dg/dx = −A·σ(x) (the softplus' derivative).
                s_log[h] += dg[h] * (-decay[h] * softplus1::<FMA>(x));
                let d = -dg[h] * decay[h] * sigmoid1::<FMA>(x);
                da[h] = d;
                s_bias[h] += d;
                let beta = sigmoid1::<FMA>(b[h]);
                db[h] = dbeta[h] * beta * (1.0 - beta);
            }
        }
    }
}

/// `e^{a_log}` per head, in f32 as transformers computes it (`A_log.float().exp()`).
fn decay(op: &'static str, a_log: &Tensor) -> Result<Vec<f32>> {
    Ok(convert::f32_data(op, "a_log", a_log)?.iter().map(|v| v.exp()).collect())
}

/// Gated DeltaNet gates: `β = σ(b)`, `g = −e^{a_log[h]}·softplus(a + dt_bias[h])`.
///
/// # Shapes
/// `a`, `b`: `[..., H]`; `a_log`, `dt_bias`: `[H]` → g, beta `[..., H]` F32.
pub fn gdn_gates(cpu: &CpuBackend, a: &Tensor, b: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<GateOutput> {
    const OP: &str = "gdn_gates";
    let GatesSpec { rows, heads, .. } = spec::gdn_gates(a, b, a_log, dt_bias)?;
    let (av, bv) = (convert::f32_data(OP, "a", a)?, convert::f32_data(OP, "b", b)?);
    let (decay, bias) = (decay(OP, a_log)?, convert::f32_data(OP, "dt_bias", dt_bias)?);
    let (mut g, mut beta) = (vec![0.0f32; rows * heads], vec![0.0f32; rows * heads]);
    let per = forward_block_rows(heads);
    let bufs = [(&mut g[..], per * heads), (&mut beta[..], per * heads)];
    for_each_block(cpu, rows, per, 8 * heads, bufs, |range, [g, beta]| {
        let at = range.start * heads..range.end * heads;
        gates_rows(g, beta, &av[at.clone()], &bv[at], &decay, &bias);
    });
    Ok(GateOutput { g: Tensor::from_vec(g, a.shape().clone())?, beta: Tensor::from_vec(beta, a.shape().clone())? })
}

/// Backward of `gdn_gates`: with `x = a + dt_bias[h]`, `da = −dg·e^{a_log[h]}·σ(x)`,
/// `db = dβ·β(1 − β)`, `da_log[h] = Σ_rows dg·g`, `ddt_bias[h] = Σ_rows da`.
///
/// # Shapes
/// `a`, `b`: `[..., H]`; `a_log`, `dt_bias`: `[H]`; `dg`, `dbeta`: `[..., H]` F32 →
/// da, db `[..., H]`, da_log, ddt_bias `[H]`.
pub fn gdn_gates_backward(
    cpu: &CpuBackend,
    a: &Tensor,
    b: &Tensor,
    a_log: &Tensor,
    dt_bias: &Tensor,
    dg: &Tensor,
    dbeta: &Tensor,
) -> Result<GateGradients> {
    const OP: &str = "gdn_gates_backward";
    let GatesSpec { rows, heads, param_dtype, .. } = spec::gdn_gates_backward(a, b, a_log, dt_bias, dg, dbeta)?;
    let (av, bv) = (convert::f32_data(OP, "a", a)?, convert::f32_data(OP, "b", b)?);
    let (decay, bias) = (decay(OP, a_log)?, convert::f32_data(OP, "dt_bias", dt_bias)?);
    let (dgv, dbv) = (dg.as_slice::<f32>()?, dbeta.as_slice::<f32>()?);
    let (mut da, mut db) = (F32Output::new(a.shape(), a.dtype())?, F32Output::new(b.shape(), b.dtype())?);
    let per = backward_block_rows(rows, heads);
    // Per block: Σ dg·g then Σ da, one [2H] partial each.
    let mut partials = vec![0.0f32; rows.div_ceil(per) * 2 * heads];
    let bufs = [(da.values()?, per * heads), (db.values()?, per * heads), (&mut partials[..], 2 * heads)];
    for_each_block(cpu, rows, per, 12 * heads, bufs, |range, [da, db, sums]| {
        let at = range.start * heads..range.end * heads;
        let inputs = [&av[at.clone()], &bv[at.clone()], &dgv[at.clone()], &dbv[at]];
        gates_grad_rows(da, db, sums, inputs, &decay, &bias);
    });
    let sums = sum_partials(&partials, 2 * heads);
    let (s_log, s_bias) = sums.split_at(heads);
    Ok(GateGradients {
        da: da.finish(cpu)?,
        db: db.finish(cpu)?,
        da_log: convert::from_f32(s_log.to_vec(), [heads], param_dtype)?,
        ddt_bias: convert::from_f32(s_bias.to_vec(), [heads], param_dtype)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(shape: &[usize], seed: u64, scale: f32) -> Tensor {
        let n = shape.iter().product();
        Tensor::from_vec(crate::rng::Rng::new(seed).uniform_vec(n, -scale, scale), shape.to_vec()).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.to_vec_f32().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// Many blocks of rows (partials of da_log and ddt_bias) give the same bits with 1
    /// thread and with 3.
    #[test]
    fn gates_do_not_depend_on_the_thread_count() {
        let (a, b, dg, dbeta) = (
            tensor(&[40000, 16], 1, 30.0),
            tensor(&[40000, 16], 2, 8.0),
            tensor(&[40000, 16], 3, 1.0),
            tensor(&[40000, 16], 4, 1.0),
        );
        let (a_log, dt_bias) = (tensor(&[16], 5, 2.0), tensor(&[16], 6, 1.0));
        let run = |cpu: &CpuBackend| -> Vec<Vec<u32>> {
            let o = gdn_gates(cpu, &a, &b, &a_log, &dt_bias).unwrap();
            let g = gdn_gates_backward(cpu, &a, &b, &a_log, &dt_bias, &dg, &dbeta).unwrap();
            [&o.g, &o.beta, &g.da, &g.db, &g.da_log, &g.ddt_bias].iter().map(|t| bits(t)).collect()
        };
        assert_eq!(run(&CpuBackend::with_threads(1).unwrap()), run(&CpuBackend::with_threads(3).unwrap()));
    }
}
