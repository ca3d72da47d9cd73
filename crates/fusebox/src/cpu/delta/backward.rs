//! `gated_delta_rule_backward`: the chunked backward.
//!
//! Per (sequence, head) pair: a forward scan recomputes the state at the start of each
//! chunk (`S_c`, the only states kept: ⌈T/64⌉ of them); then the chunks are walked
//! backwards, each recomputed from its start state (`chunk::Chunk`) and differentiated,
//! carrying `dS`, the gradient of the loss with respect to the state after the chunk
//! (`d_state` at the end, zero when `None`; what is left at the start is
//! `d_initial_state`).
//!
//! Within a chunk (names of `chunk`; `·ᵀ` transposes; `⊙` is elementwise), given `dS'`
//! (gradient into the chunk's end state) and `dO`, reverse mode through
//! `S' = γ_{L−1}S + K̂ᵀΔ` (K̂ = ηK), `O = Q_γ S + PΔ` (Q_γ = γQ̃), `Δ = U + Wn·S`,
//! `U = T(βV)`, `Wn = −T(βγK)`, `T = (I + A)⁻¹`, `A = β ⊙ M ⊙ KKᵀ` (strictly lower),
//! `P = M ⊙ Q̃Kᵀ` (lower with the diagonal):
//!
//! ```text
//! dΔ   = K̂·dS' + Pᵀ·dO          dK̂ = Δ·dS'ᵀ        dγ_{L−1}(state) = ⟨S, dS'⟩
//! dQ_γ = dO·Sᵀ                  dP = dO·Δᵀ         dWn = dΔ·Sᵀ
//! dS   = γ_{L−1}dS' + Q_γᵀ·dO + Wnᵀ·dΔ                         (into the previous chunk)
//! Yᵁ   = Tᵀ·dΔ,  Yᵂ = Tᵀ·dWn                                   (back substitution)
//! dv_j = β_j Yᵁ_j    dβ_j = v_j·Yᵁ_j − γ_j k_j·Yᵂ_j    dk_j −= β_jγ_j Yᵂ_j    dγ_j −= β_j k_j·Yᵂ_j
//! dA   = −(Yᵁ·Uᵀ + Yᵂ·Wnᵀ), strictly lower:   dβ_j += Σ_m dA_jm M_jm (KKᵀ)_jm,
//!        dKKᵀ = β ⊙ M ⊙ dA → dK += (dKKᵀ + dKKᵀᵀ)·K,   dM += β ⊙ dA ⊙ KKᵀ
//! E    = M ⊙ dP (lower with the diagonal): dQ̃ = E·K + γ ⊙ dQ_γ,   dK += Eᵀ·Q̃,   dM += dP ⊙ Q̃Kᵀ
//! dK  += η ⊙ dK̂,   dη_j = k_j·dK̂_j,   dγ_i += q̃_i·dQ_γ,i
//! dG_i = γ_i dγ_i + Σ_j dM_ij M_ij − Σ_r dM_ri M_ri − η_i dη_i
//!        + [i = L−1](γ_{L−1} dγ_{L−1}(state) + Σ_j η_j dη_j)
//! dg_i = Σ_{r≥i} dG_r,   dq = scale·dQ̃
//! ```
//!
//! The gradients of q and k are summed over the value heads that share a key head after
//! all pairs are done (each pair writes its own rows first, so no two threads add to one
//! place).

use super::chunk::Chunk;
use super::{lanes, nn, nt, tn, HeadAt, Inputs, CHUNK};
use crate::cpu::pool::SharedMut;
use crate::cpu::CpuBackend;
use crate::error::Result;
use crate::spec;
use crate::spec::delta::DeltaRuleSpec;
use crate::tensor::Tensor;
use crate::types::DeltaRuleGradients;

/// The backward of the chunked gated delta rule (see the module docs for the maths).
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule_backward(
    cpu: &CpuBackend,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    initial_state: Option<&Tensor>,
    d_out: &Tensor,
    d_state: Option<&Tensor>,
    scale: f32,
) -> Result<DeltaRuleGradients> {
    let s = spec::delta::gated_delta_rule_backward(q, k, v, g, beta, initial_state, d_out, d_state, scale)?;
    let x = Inputs::new(q, k, v, g, beta)?;
    let d_out = d_out.as_slice::<f32>()?;
    let init = initial_state.map(|t| t.as_slice::<f32>()).transpose()?;
    let (t_len, dk, dv, pairs) = (s.tokens, s.dk, s.dv, s.batch * s.v_heads);
    let gates = s.batch * t_len * s.v_heads;
    // Per pair: dq and dk rows `[pairs, T, Dk]` (summed over key groups below).
    let mut dq_pair = vec![0.0f32; pairs * t_len * dk];
    let mut dk_pair = vec![0.0f32; pairs * t_len * dk];
    let mut dv_out = vec![0.0f32; gates * dv];
    let (mut dg_out, mut dbeta_out) = (vec![0.0f32; gates], vec![0.0f32; gates]);
    let mut d_init = match d_state {
        Some(d) => d.as_slice::<f32>()?.to_vec(),
        None => vec![0.0f32; pairs * s.state_len()],
    };
    let sinks = Sinks {
        dq: SharedMut(dq_pair.as_mut_ptr()),
        dk: SharedMut(dk_pair.as_mut_ptr()),
        dv: SharedMut(dv_out.as_mut_ptr()),
        dg: SharedMut(dg_out.as_mut_ptr()),
        dbeta: SharedMut(dbeta_out.as_mut_ptr()),
    };
    let work = t_len.max(1) * 3 * (dk + dv + CHUNK);
    cpu.for_each_chunk(&mut d_init, s.state_len(), work, |pair, ds| {
        let start = init.map(|i| &i[pair * s.state_len()..(pair + 1) * s.state_len()]);
        pair_backward(s, &x, d_out, start, ds, scale, pair, sinks);
    });
    let (dq, dk_sum) = (sum_groups(cpu, s, &dq_pair), sum_groups(cpu, s, &dk_pair));
    let qk_dims = [s.batch, t_len, s.k_heads, dk];
    let gate_dims = [s.batch, t_len, s.v_heads];
    Ok(DeltaRuleGradients {
        dq: Tensor::from_vec(dq, qk_dims)?,
        dk: Tensor::from_vec(dk_sum, qk_dims)?,
        dv: Tensor::from_vec(dv_out, [s.batch, t_len, s.v_heads, dv])?,
        dg: Tensor::from_vec(dg_out, gate_dims)?,
        dbeta: Tensor::from_vec(dbeta_out, gate_dims)?,
        d_initial_state: match initial_state {
            Some(_) => Some(Tensor::from_vec(d_init, s.state_dims())?),
            None => None,
        },
    })
}

/// Where the pairs write their gradients: disjoint rows per pair.
#[derive(Clone, Copy)]
struct Sinks {
    /// `[pairs, T, Dk]`
    dq: SharedMut<f32>,
    /// `[pairs, T, Dk]`
    dk: SharedMut<f32>,
    /// `[B, T, Hv, Dv]`
    dv: SharedMut<f32>,
    /// `[B, T, Hv]`
    dg: SharedMut<f32>,
    /// `[B, T, Hv]`
    dbeta: SharedMut<f32>,
}

/// `[pairs, T, Dk]` rows → `[B, T, Hk, Dk]`, summing each key head's value heads in
/// order.
fn sum_groups(cpu: &CpuBackend, s: DeltaRuleSpec, per_pair: &[f32]) -> Vec<f32> {
    let (t_len, dk, group) = (s.tokens, s.dk, s.group());
    let mut out = vec![0.0f32; s.batch * t_len * s.k_heads * dk];
    cpu.for_each_chunk(&mut out, s.k_heads * dk, group, |bt, row| {
        let (b, t) = (bt / t_len.max(1), bt % t_len.max(1));
        for (hk, dst) in row.chunks_mut(dk).enumerate() {
            for j in 0..group {
                let pair = b * s.v_heads + hk * group + j;
                let src = &per_pair[(pair * t_len + t) * dk..(pair * t_len + t + 1) * dk];
                dst.iter_mut().zip(src).for_each(|(d, &x)| *d += x);
            }
        }
    });
    out
}

/// The gradient buffers of one chunk (row-major, at most `cap` rows).
struct Grad {
    /// `[L, Dv]` dO of the chunk.
    dout: Vec<f32>,
    /// `[L, Dv]` dΔ, then Yᵁ.
    ddelta: Vec<f32>,
    /// `[L, Dk]` dWn, then Yᵂ.
    dwn: Vec<f32>,
    /// `[L, Dk]` dK̂.
    dkhat: Vec<f32>,
    /// `[L, Dk]` dQ_γ.
    dqg: Vec<f32>,
    /// `[L, L]` dP.
    dp: Vec<f32>,
    /// `[L, L]` Yᵁ·Uᵀ + Yᵂ·Wnᵀ (= −dA).
    da: Vec<f32>,
    /// `[L, L]` dM.
    dm: Vec<f32>,
    /// `[L, L]` E = M ⊙ dP.
    e: Vec<f32>,
    /// `[L, L]` dKKᵀ.
    dkk: Vec<f32>,
    /// `[L, Dk]` dK.
    dkc: Vec<f32>,
    /// `[L, Dk]` dQ̃.
    dqc: Vec<f32>,
    /// `[Dk, Dv]` the gradient into the chunk's start state.
    ds_prev: Vec<f32>,
    /// `[L]` dγ, dη, dβ, dG.
    dgamma: Vec<f32>,
    deta: Vec<f32>,
    dbeta: Vec<f32>,
    dgc: Vec<f32>,
}

impl Grad {
    fn new(dk: usize, dv: usize, cap: usize) -> Grad {
        let z = |n: usize| vec![0.0f32; n];
        Grad {
            dout: z(cap * dv),
            ddelta: z(cap * dv),
            dwn: z(cap * dk),
            dkhat: z(cap * dk),
            dqg: z(cap * dk),
            dp: z(cap * cap),
            da: z(cap * cap),
            dm: z(cap * cap),
            e: z(cap * cap),
            dkk: z(cap * cap),
            dkc: z(cap * dk),
            dqc: z(cap * dk),
            ds_prev: z(dk * dv),
            dgamma: z(cap),
            deta: z(cap),
            dbeta: z(cap),
            dgc: z(cap),
        }
    }
}

/// The backward of one (sequence, head) pair: `ds` holds `dS` of the final state and is
/// left holding `dS` of the initial state.
#[allow(clippy::too_many_arguments)]
fn pair_backward(
    s: DeltaRuleSpec,
    x: &Inputs<'_>,
    d_out: &[f32],
    init: Option<&[f32]>,
    ds: &mut [f32],
    scale: f32,
    pair: usize,
    sinks: Sinks,
) {
    let (t_len, dk, dv, n) = (s.tokens, s.dk, s.dv, s.state_len());
    if t_len == 0 {
        return;
    }
    let at = HeadAt::new(s, pair);
    let cap = t_len.min(CHUNK);
    let chunks = t_len.div_ceil(CHUNK);
    let mut ch = Chunk::new(dk, dv, cap);
    // States at the start of each chunk, from a forward scan.
    let mut states = vec![0.0f32; chunks * n];
    if let Some(init) = init {
        states[..n].copy_from_slice(init);
    }
    for c in 0..chunks - 1 {
        let t0 = c * CHUNK;
        ch.load(x, at, t0, CHUNK, scale, false);
        let (before, after) = states.split_at_mut((c + 1) * n);
        let (cur, next) = (&before[c * n..], &mut after[..n]);
        ch.delta(cur);
        next.copy_from_slice(cur);
        ch.advance(next);
    }
    let mut gr = Grad::new(dk, dv, cap);
    for c in (0..chunks).rev() {
        let t0 = c * CHUNK;
        let len = CHUNK.min(t_len - t0);
        let st = &states[c * n..(c + 1) * n];
        ch.load(x, at, t0, len, scale, true);
        ch.delta(st);
        chunk_backward(&ch, &mut gr, st, ds, d_out, at);
        ds.copy_from_slice(&gr.ds_prev);
        // Write this chunk's gradients (rows of this pair only).
        for i in 0..len {
            let t = t0 + i;
            let row = (pair * t_len + t) * dk;
            // SAFETY: rows `(pair, t)` of the per-pair buffers, row `at.v(t)` of dv and
            // entry `at.gate(t)` of dg/dβ belong to this pair alone; each pair runs once.
            unsafe {
                let dq = sinks.dq.slice(row, dk);
                dq.iter_mut().zip(&gr.dqc[i * dk..(i + 1) * dk]).for_each(|(d, &g)| *d = scale * g);
                sinks.dk.slice(row, dk).copy_from_slice(&gr.dkc[i * dk..(i + 1) * dk]);
                let dvr = sinks.dv.slice(at.v(t), dv);
                let b = ch.beta[i];
                dvr.iter_mut().zip(&gr.ddelta[i * dv..(i + 1) * dv]).for_each(|(d, &y)| *d = b * y);
                sinks.dg.slice(at.gate(t), 1)[0] = gr.dgc[i];
                sinks.dbeta.slice(at.gate(t), 1)[0] = gr.dbeta[i];
            }
        }
    }
}

/// One chunk's backward (module docs): from the recomputed chunk `ch` (Δ computed from
/// start state `st`), `ds` (gradient into its end state) and the output gradient, fills
/// `gr` — dQ̃ (`dqc`), dK (`dkc`), Yᵁ (`ddelta`; dv = β ⊙ Yᵁ), dβ, dg (`dgc`) and the
/// gradient into the start state (`ds_prev`).
fn chunk_backward(ch: &Chunk, gr: &mut Grad, st: &[f32], ds: &[f32], d_out: &[f32], at: HeadAt) {
    let (l, dk, dv) = (ch.len, ch.dk, ch.dv);
    let ll = l * l;
    for i in 0..l {
        let src = at.v(ch.t0 + i);
        gr.dout[i * dv..(i + 1) * dv].copy_from_slice(&d_out[src..src + dv]);
    }
    // Through S' = γ_{L−1}·S + K̂ᵀ·Δ.
    let mut khat = vec![0.0f32; l * dk];
    for i in 0..l {
        for (d, &k) in khat[i * dk..(i + 1) * dk].iter_mut().zip(&ch.k[i * dk..(i + 1) * dk]) {
            *d = ch.eta[i] * k;
        }
    }
    let keep = ch.gamma[l - 1];
    nn(&mut gr.ddelta, &khat, ds, l, dv, dk, false);
    nt(&mut gr.dkhat, &ch.delta, ds, l, dk, dv, false);
    let d_keep = lanes::dot(st, ds);
    gr.ds_prev.iter_mut().zip(ds).for_each(|(d, &x)| *d = keep * x);
    // Through O = Q_γ·S + P·Δ.
    let mut qg = khat;
    for i in 0..l {
        for (d, &q) in qg[i * dk..(i + 1) * dk].iter_mut().zip(&ch.q[i * dk..(i + 1) * dk]) {
            *d = ch.gamma[i] * q;
        }
    }
    nt(&mut gr.dqg, &gr.dout, st, l, dk, dv, false);
    nt(&mut gr.dp, &gr.dout, &ch.delta, l, l, dv, false);
    tn(&mut gr.ddelta, &ch.p, &gr.dout, l, dv, l, true);
    tn(&mut gr.ds_prev, &qg, &gr.dout, dk, dv, l, true);
    // Through Δ = U + Wn·S.
    nt(&mut gr.dwn, &gr.ddelta, st, l, dk, dv, false);
    tn(&mut gr.ds_prev, &ch.wn, &gr.ddelta, dk, dv, l, true);
    // Through U = T·(βV) and Wn = −T·(βγK): Y = Tᵀ·[dU, dWn].
    lanes::solve_unit_lower_transposed(&ch.a[..ll], l, &mut gr.ddelta[..l * dv], dv);
    lanes::solve_unit_lower_transposed(&ch.a[..ll], l, &mut gr.dwn[..l * dk], dk);
    for j in 0..l {
        let (yu, yw) = (&gr.ddelta[j * dv..(j + 1) * dv], &gr.dwn[j * dk..(j + 1) * dk]);
        let kj = &ch.k[j * dk..(j + 1) * dk];
        let k_yw = lanes::dot(kj, yw);
        let (b, gam) = (ch.beta[j], ch.gamma[j]);
        gr.dbeta[j] = lanes::dot(&ch.v[j * dv..(j + 1) * dv], yu) - gam * k_yw;
        gr.dgamma[j] = -b * k_yw;
        for (d, &y) in gr.dkc[j * dk..(j + 1) * dk].iter_mut().zip(yw) {
            *d = -b * gam * y;
        }
    }
    nt(&mut gr.da, &gr.ddelta, &ch.u, l, l, dv, false);
    nt(&mut gr.da, &gr.dwn, &ch.wn, l, l, dk, true);
    // Through A = β ⊙ M ⊙ KKᵀ (strictly lower) and P = M ⊙ Q̃Kᵀ (with the diagonal).
    for i in 0..l {
        let b = ch.beta[i];
        let mut db = 0.0f32;
        for j in 0..l {
            let at_ij = i * l + j;
            let m = ch.decay[at_ij];
            let (mut dm, mut dkk, mut e) = (0.0f32, 0.0f32, 0.0f32);
            if j < i {
                let d_a = -gr.da[at_ij];
                db += d_a * m * ch.kk[at_ij];
                dkk = b * m * d_a;
                dm = b * d_a * ch.kk[at_ij];
            }
            if j <= i {
                let d_p = gr.dp[at_ij];
                e = d_p * m;
                dm += d_p * ch.qk[at_ij];
            }
            gr.dm[at_ij] = dm;
            gr.dkk[at_ij] = dkk;
            gr.e[at_ij] = e;
        }
        gr.dbeta[i] += db;
    }
    nn(&mut gr.dqc, &gr.e, &ch.k, l, dk, l, false);
    tn(&mut gr.dkc, &gr.e, &ch.q, l, dk, l, true);
    nn(&mut gr.dkc, &gr.dkk, &ch.k, l, dk, l, true);
    tn(&mut gr.dkc, &gr.dkk, &ch.k, l, dk, l, true);
    // Through Q_γ = γ ⊙ Q̃ and K̂ = η ⊙ K.
    for i in 0..l {
        let (dqg, q) = (&gr.dqg[i * dk..(i + 1) * dk], &ch.q[i * dk..(i + 1) * dk]);
        gr.dgamma[i] += lanes::dot(q, dqg);
        let gam = ch.gamma[i];
        gr.dqc[i * dk..(i + 1) * dk].iter_mut().zip(dqg).for_each(|(d, &x)| *d += gam * x);
        let (dkh, k) = (&gr.dkhat[i * dk..(i + 1) * dk], &ch.k[i * dk..(i + 1) * dk]);
        gr.deta[i] = lanes::dot(k, dkh);
        let eta = ch.eta[i];
        gr.dkc[i * dk..(i + 1) * dk].iter_mut().zip(dkh).for_each(|(d, &x)| *d += eta * x);
    }
    // The log-decays: dG, then dg = the reverse cumulative sum of dG.
    let mut last = keep * d_keep;
    for i in 0..l {
        gr.dgc[i] = ch.gamma[i] * gr.dgamma[i] - ch.eta[i] * gr.deta[i];
        last += ch.eta[i] * gr.deta[i];
    }
    gr.dgc[l - 1] += last;
    for i in 0..l {
        for j in 0..=i {
            let w = gr.dm[i * l + j] * ch.decay[i * l + j];
            gr.dgc[i] += w;
            gr.dgc[j] -= w;
        }
    }
    for i in (0..l - 1).rev() {
        gr.dgc[i] += gr.dgc[i + 1];
    }
}
