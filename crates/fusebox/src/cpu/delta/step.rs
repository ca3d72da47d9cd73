//! `gated_delta_rule_step` and `batched_gated_delta_rule_step`: one token of the
//! recurrence per sequence, the state updated in place in one pass.
//!
//! Per value head, with S the state before the step: `S ← e^g·S; u = Sᵀk;
//! δ = β(v − u); S ← S + k·δᵀ; o = Sᵀ(scale·q)`. Both products read the *old* S:
//! `u = e^g·(Sᵀk)` and `o = scale·(e^g·(Sᵀq) + (k·q)·δ)`, so one sweep over a block of
//! columns of S gathers `Sᵀk` and `Sᵀq`, and a second sweep over the same block, still in
//! L1, writes `e^g·S + k·δᵀ`: the state crosses the memory bus once each way.

use super::lanes;
use crate::cpu::pool::SharedMut;
use crate::cpu::simd::{madd, multiversion};
use crate::cpu::CpuBackend;
use crate::error::Result;
use crate::spec;
use crate::spec::delta::DeltaRuleSpec;
use crate::tensor::Tensor;

/// The one-token inputs as slices: q, k `[N, Hk, Dk]`, v `[N, Hv, Dv]`, g, β `[N, Hv]`.
#[derive(Clone, Copy)]
struct Rows<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
    scale: f32,
}

impl Rows<'_> {
    /// Advances head `h` of row `n`'s state `s` (`[Dk, Dv]`) and writes its output `o` (`[Dv]`).
    fn step(&self, sp: DeltaRuleSpec, n: usize, h: usize, s: &mut [f32], o: &mut [f32]) {
        let (dk, dv) = (sp.dk, sp.dv);
        let qk_at = (n * sp.k_heads + h / sp.group()) * dk;
        let (q, k) = (&self.q[qk_at..qk_at + dk], &self.k[qk_at..qk_at + dk]);
        let v = &self.v[(n * sp.v_heads + h) * dv..][..dv];
        let gate = n * sp.v_heads + h;
        let kq = lanes::dot(k, q);
        step_head(s, dk, dv, q, k, v, self.g[gate].exp(), self.beta[gate], self.scale, kq, o);
    }
}

/// Columns of S per block: two sweeps over `Dk × 32` floats (16 KiB at Dk = 128) stay in L1.
const COLS: usize = 32;

multiversion! {
    /// One head's step (module docs): `s` `[dk, dv]` row-major updated in place, `o` `[dv]`
    /// written; `decay = e^g`, `kq = k·q`.
    #[allow(clippy::too_many_arguments)]
    pub fn step_head(s: &mut [f32], dk: usize, dv: usize, q: &[f32], k: &[f32], v: &[f32], decay: f32, beta: f32, scale: f32, kq: f32, o: &mut [f32]) {
        let mut c0 = 0;
        while c0 < dv {
            let w = COLS.min(dv - c0);
            // Two rows at a time into separate sums (more independent chains), added at the end.
            let (mut u0, mut u1, mut o0, mut o1) = ([0.0f32; COLS], [0.0f32; COLS], [0.0f32; COLS], [0.0f32; COLS]);
            let mut r = 0;
            while r + 2 <= dk {
                let (ra, rb) = (&s[r * dv + c0..r * dv + c0 + w], &s[(r + 1) * dv + c0..(r + 1) * dv + c0 + w]);
                let (ka, kb, qa, qb) = (k[r], k[r + 1], q[r], q[r + 1]);
                for l in 0..w {
                    u0[l] = madd::<FMA>(ra[l], ka, u0[l]);
                    o0[l] = madd::<FMA>(ra[l], qa, o0[l]);
                    u1[l] = madd::<FMA>(rb[l], kb, u1[l]);
                    o1[l] = madd::<FMA>(rb[l], qb, o1[l]);
                }
                r += 2;
            }
            if r < dk {
                let ra = &s[r * dv + c0..r * dv + c0 + w];
                for l in 0..w {
                    u0[l] = madd::<FMA>(ra[l], k[r], u0[l]);
                    o0[l] = madd::<FMA>(ra[l], q[r], o0[l]);
                }
            }
            let mut delta = [0.0f32; COLS];
            for l in 0..w {
                delta[l] = beta * (v[c0 + l] - decay * (u0[l] + u1[l]));
                o[c0 + l] = scale * madd::<FMA>(kq, delta[l], decay * (o0[l] + o1[l]));
            }
            for r in 0..dk {
                let row = &mut s[r * dv + c0..r * dv + c0 + w];
                let kr = k[r];
                for l in 0..w {
                    row[l] = madd::<FMA>(kr, delta[l], decay * row[l]);
                }
            }
            c0 += COLS;
        }
    }
}

/// One decode step in place (see `ComputeBackend::gated_delta_rule_step`), parallel over
/// (sequence, head) pairs.
pub fn gated_delta_rule_step(
    cpu: &CpuBackend,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &mut Tensor,
    scale: f32,
) -> Result<Tensor> {
    const OP: &str = "gated_delta_rule_step";
    let sp = spec::delta::gated_delta_rule_step(q, k, v, g, beta, state, scale)?;
    state.ensure_writable(OP)?;
    let rows =
        Rows { q: q.as_slice()?, k: k.as_slice()?, v: v.as_slice()?, g: g.as_slice()?, beta: beta.as_slice()?, scale };
    let mut out = vec![0.0f32; sp.batch * sp.v_heads * sp.dv];
    let out_at = SharedMut(out.as_mut_ptr());
    cpu.for_each_chunk(state.as_mut_slice::<f32>()?, sp.state_len(), 2, |pair, s| {
        // SAFETY: output row `pair` (Dv floats) belongs to this pair alone.
        let o = unsafe { out_at.slice(pair * sp.dv, sp.dv) };
        rows.step(sp, pair / sp.v_heads, pair % sp.v_heads, s, o);
    });
    Tensor::from_vec(out, [sp.batch, sp.v_heads, sp.dv])
}

/// The ragged decode step (see `ComputeBackend::batched_gated_delta_rule_step`): row n
/// advances `states[n]`, through the same per-head kernel as [`gated_delta_rule_step`]
/// (so each row's result is bit for bit its solo result); parallel over (row, head).
pub fn batched_gated_delta_rule_step(
    cpu: &CpuBackend,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    states: &mut [&mut Tensor],
    scale: f32,
) -> Result<Tensor> {
    const OP: &str = "batched_gated_delta_rule_step";
    let views: Vec<&Tensor> = states.iter().map(|s| &**s).collect();
    let sp = spec::delta::batched_gated_delta_rule_step(q, k, v, g, beta, &views, scale)?;
    let rows =
        Rows { q: q.as_slice()?, k: k.as_slice()?, v: v.as_slice()?, g: g.as_slice()?, beta: beta.as_slice()?, scale };
    // Writable tensors own their bytes alone, so the states are disjoint.
    let mut slots = Vec::with_capacity(states.len());
    for st in states.iter_mut() {
        st.ensure_writable(OP)?;
        slots.push(SharedMut(st.as_mut_slice::<f32>()?.as_mut_ptr()));
    }
    let mut out = vec![0.0f32; sp.batch * sp.v_heads * sp.dv];
    let out_at = SharedMut(out.as_mut_ptr());
    let n = sp.state_len();
    cpu.for_each_index(sp.batch * sp.v_heads, 2 * n, |pair| {
        let (row, h) = (pair / sp.v_heads, pair % sp.v_heads);
        // SAFETY: head h of states[row] (Dk·Dv floats at h·Dk·Dv, inside its [1, Hv, Dk, Dv])
        // and output row `pair` belong to this index alone; each index runs once.
        let (s, o) = unsafe { (slots[row].slice(h * n, n), out_at.slice(pair * sp.dv, sp.dv)) };
        rows.step(sp, row, h, s, o);
    });
    Tensor::from_vec(out, [sp.batch, sp.v_heads, sp.dv])
}
