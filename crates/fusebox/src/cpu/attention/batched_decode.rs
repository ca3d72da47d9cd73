//! `batched_decode_attention`: one decode step of several sequences, each over its own
//! KV-cache slot and length (ragged), in one call.
//!
//! Sequence `i` is exactly `decode_attention(q[i], k_caches[i], v_caches[i],
//! kv_lens[i])`, computed by the same kernel in the same order: its output does not
//! depend on which other sequences share the call, so a server's batched step gives
//! each request the bits it would get alone. Every sequence's call runs its heads on
//! the whole thread team.

use crate::cpu::CpuBackend;
use crate::error::Result;
use crate::spec::attention as spec;
use crate::tensor::Tensor;

/// Attention of each sequence's new queries over the first `kv_lens[i]` rows of its
/// own caches (read in place), causal among the new queries, GQA by index, with an
/// optional sliding `window` as in [`super::decode_attention`].
///
/// # Shapes
/// `q`: `[N, Hq, Tq, D]`; `k_caches[i]`, `v_caches[i]`: `[1, Hkv, capacity_i, D]`,
/// `Tq ≤ kv_lens[i] ≤ capacity_i` → `[N, Hq, Tq, D]` (q's dtype).
pub fn batched_decode_attention(
    cpu: &CpuBackend,
    q: &Tensor,
    k_caches: &[&Tensor],
    v_caches: &[&Tensor],
    kv_lens: &[usize],
    window: Option<usize>,
    scale: f32,
) -> Result<Tensor> {
    let spec = spec::batched_decode_attention(q, k_caches, v_caches, kv_lens, window)?;
    let qd = q.dims();
    let row = qd[1] * qd[2] * qd[3];
    let mut out = Tensor::zeros(q.shape().clone(), q.dtype())?;
    let row_bytes = q.dtype().storage_bytes(row);
    let bytes = out.host_bytes_mut()?;
    for i in 0..spec.n {
        let qi = q.view(i * row, [1, qd[1], qd[2], qd[3]])?;
        let oi = super::decode_attention(cpu, &qi, k_caches[i], v_caches[i], kv_lens[i], window, scale)?;
        bytes[i * row_bytes..(i + 1) * row_bytes].copy_from_slice(oi.host_bytes()?);
    }
    Ok(out)
}
