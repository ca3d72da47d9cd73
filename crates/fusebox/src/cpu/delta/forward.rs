//! `gated_delta_rule`: the chunked forward, parallel over (sequence, head) pairs.

use super::chunk::Chunk;
use super::{HeadAt, Inputs, CHUNK};
use crate::cpu::pool::SharedMut;
use crate::cpu::CpuBackend;
use crate::error::Result;
use crate::spec;
use crate::tensor::Tensor;
use crate::types::DeltaRuleOutput;

/// The chunked gated delta rule (see `ComputeBackend::gated_delta_rule` and `chunk`).
/// Each (sequence, head) pair scans its chunks in order on one thread; the last chunk
/// is simply shorter when T is not a multiple of 64 (no padding).
pub fn gated_delta_rule(
    cpu: &CpuBackend,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    initial_state: Option<&Tensor>,
    scale: f32,
) -> Result<DeltaRuleOutput> {
    let s = spec::delta::gated_delta_rule(q, k, v, g, beta, initial_state, scale)?;
    let x = Inputs::new(q, k, v, g, beta)?;
    let (t_len, dk, dv) = (s.tokens, s.dk, s.dv);
    let mut out = vec![0.0f32; s.batch * t_len * s.v_heads * dv];
    let mut state = match initial_state {
        Some(init) => init.as_slice::<f32>()?.to_vec(),
        None => vec![0.0f32; s.batch * s.v_heads * s.state_len()],
    };
    let out_at = SharedMut(out.as_mut_ptr());
    let work = t_len.max(1) * (dk + dv + CHUNK);
    cpu.for_each_chunk(&mut state, s.state_len(), work, |pair, st| {
        let at = HeadAt::new(s, pair);
        let mut ch = Chunk::new(dk, dv, t_len.min(CHUNK));
        let mut o = vec![0.0f32; t_len.min(CHUNK) * dv];
        for t0 in (0..t_len).step_by(CHUNK) {
            let len = CHUNK.min(t_len - t0);
            ch.load(&x, at, t0, len, scale, true);
            ch.delta(st);
            ch.output(st, &mut o);
            ch.advance(st);
            for i in 0..len {
                // SAFETY: row `at.v(t0 + i)` (Dv floats) of `out` belongs to this pair
                // alone; pairs run once each.
                unsafe { out_at.slice(at.v(t0 + i), dv) }.copy_from_slice(&o[i * dv..(i + 1) * dv]);
            }
        }
    });
    Ok(DeltaRuleOutput {
        out: Tensor::from_vec(out, [s.batch, t_len, s.v_heads, dv])?,
        state: Tensor::from_vec(state, s.state_dims())?,
    })
}
