//! `batched_decode_attention`: one decode step of several sequences, each over its own
//! KV-cache slot and length (ragged), in one call.
//!
//! Sequence `i` is exactly `decode_attention(q[i], k_caches[i], v_caches[i],
//! kv_lens[i])`, computed by the same kernel in the same order: its output does not
//! depend on which other sequences share the call, so a server's batched step gives
//! each request the bits it would get alone. With one query per sequence over 16-bit
//! caches (a decode step), the kv heads of every sequence whose keys are not split run
//! in one parallel region (`decode::forward_many`); otherwise each sequence's call runs
//! its heads on the whole thread team.

use half::{bf16, f16};

use super::{cache_rows, decode, Dims, Problem};
use crate::cpu::convert::f32_data;
use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::Result;
use crate::spec::attention as spec;
use crate::tensor::Tensor;

/// Attention of each sequence's new queries over the first `kv_lens[i]` rows of its
/// own caches (read in place), causal among the new queries, GQA by index, with an
/// optional sliding `window` and attention `sinks` (shared by every sequence) as in
/// [`super::decode_attention`].
///
/// # Shapes
/// `q`: `[N, Hq, Tq, D]`; `k_caches[i]`, `v_caches[i]`: `[1, Hkv, capacity_i, D]`,
/// `Tq ≤ kv_lens[i] ≤ capacity_i`; `sinks`: `[Hq]` f32 → `[N, Hq, Tq, D]` (q's dtype).
pub fn batched_decode_attention(
    cpu: &CpuBackend,
    q: &Tensor,
    k_caches: &[&Tensor],
    v_caches: &[&Tensor],
    kv_lens: &[usize],
    window: Option<usize>,
    sinks: Option<&Tensor>,
    scale: f32,
) -> Result<Tensor> {
    let spec = spec::batched_decode_attention(q, k_caches, v_caches, kv_lens, window, sinks)?;
    let qd = q.dims();
    if qd[2] == 1 && qd[3] > 0 && spec.n > 1 {
        let cache = |dtype| spec.rows.iter().all(|r| r.cache_dtype == dtype);
        if cache(DType::F16) {
            return together::<f16>(cpu, q, &spec, k_caches, v_caches, window, sinks, scale);
        }
        if cache(DType::BF16) {
            return together::<bf16>(cpu, q, &spec, k_caches, v_caches, window, sinks, scale);
        }
    }
    let row = qd[1] * qd[2] * qd[3];
    let mut out = Tensor::zeros(q.shape().clone(), q.dtype())?;
    let row_bytes = q.dtype().storage_bytes(row);
    let bytes = out.host_bytes_mut()?;
    for i in 0..spec.n {
        let qi = q.view(i * row, [1, qd[1], qd[2], qd[3]])?;
        let oi = super::decode_attention(cpu, &qi, k_caches[i], v_caches[i], kv_lens[i], window, sinks, scale)?;
        bytes[i * row_bytes..(i + 1) * row_bytes].copy_from_slice(oi.host_bytes()?);
    }
    Ok(out)
}

/// One query per sequence over `T` caches: each sequence's problem exactly as
/// `decode_attention` builds it (the keys before the window's first row skipped), all
/// run by `decode::forward_many`.
fn together<T: decode::KvElem + crate::dtype::Element>(
    cpu: &CpuBackend,
    q: &Tensor,
    spec: &spec::BatchedDecodeSpec,
    k_caches: &[&Tensor],
    v_caches: &[&Tensor],
    window: Option<usize>,
    sinks: Option<&Tensor>,
    scale: f32,
) -> Result<Tensor> {
    let qf = f32_data("batched_decode_attention", "q", q)?;
    let sinks = sinks.map(|s| s.as_slice::<f32>()).transpose()?;
    let qd = q.dims();
    let (n, hq, d) = (qd[0], qd[1], qd[3]);
    let mut problems = Vec::with_capacity(n);
    for (i, row) in spec.rows.iter().enumerate() {
        let first = row.dims.window_start(window, 0);
        let dims = Dims { tk: row.dims.tk - first, ..row.dims };
        let (k, v) = (cache_rows::<T>(k_caches[i], first)?, cache_rows::<T>(v_caches[i], first)?);
        let q = &qf[i * hq * d..(i + 1) * hq * d];
        let kv_stride = row.capacity * d;
        problems.push(Problem { dims, q, k, v, kv_stride, scale, causal: true, window, mask: None, sinks });
    }
    let (mut out, mut lse) = (Vec::<f32>::with_capacity(n * hq * d), Vec::<f32>::with_capacity(n * hq));
    decode::forward_many(
        cpu,
        &problems,
        &mut out.spare_capacity_mut()[..n * hq * d],
        &mut lse.spare_capacity_mut()[..n * hq],
    );
    // SAFETY: `forward_many` writes every element of both (each problem's query rows), and
    // a panic in it propagates before this line, dropping them empty.
    unsafe { (out.set_len(n * hq * d), lse.set_len(n * hq)) };
    super::in_dtype(Tensor::from_vec(out, [n, hq, 1, d])?, q.dtype())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::attention::decode_attention;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        crate::rng::Rng::new(seed).uniform_vec(n, -1.0, 1.0)
    }

    /// Each sequence of a batched decode step has the bits of its own `decode_attention`:
    /// ragged lengths (one long enough for its keys to be split over the threads), with
    /// and without a sliding window and attention sinks, f16 and bf16 caches, 1 and 2
    /// threads.
    #[test]
    fn each_sequence_has_the_bits_of_its_decode_attention() {
        let (hq, hkv, d, capacity) = (6, 2, 64, 1200);
        let lens = [1, 7, 300, 1100, 33];
        let n = lens.len();
        let q = Tensor::from_vec(values(n * hq * d, 1), [n, hq, 1, d]).unwrap();
        let sinks = Tensor::from_vec(values(hq, 2).iter().map(|s| 3.0 * s).collect(), [hq]).unwrap();
        for threads in [1, 2] {
            let cpu = CpuBackend::with_threads(threads).unwrap();
            for dtype in [DType::F16, DType::BF16] {
                let caches: Vec<(Tensor, Tensor)> = (0..n)
                    .map(|i| {
                        let make = |seed| {
                            crate::cpu::convert::from_f32(
                                values(hkv * capacity * d, seed),
                                [1, hkv, capacity, d],
                                dtype,
                            )
                            .unwrap()
                        };
                        (make(10 + i as u64), make(20 + i as u64))
                    })
                    .collect();
                let ks: Vec<&Tensor> = caches.iter().map(|c| &c.0).collect();
                let vs: Vec<&Tensor> = caches.iter().map(|c| &c.1).collect();
                for (window, sinks) in [(None, None), (Some(5), None), (None, Some(&sinks)), (Some(5), Some(&sinks))] {
                    let all = batched_decode_attention(&cpu, &q, &ks, &vs, &lens, window, sinks, 0.125).unwrap();
                    let all = all.to_vec_f32().unwrap();
                    for (i, &len) in lens.iter().enumerate() {
                        let qi = q.view(i * hq * d, [1, hq, 1, d]).unwrap();
                        let alone = decode_attention(&cpu, &qi, ks[i], vs[i], len, window, sinks, 0.125).unwrap();
                        let alone: Vec<u32> = alone.to_vec_f32().unwrap().iter().map(|v| v.to_bits()).collect();
                        let batched: Vec<u32> = all[i * hq * d..(i + 1) * hq * d].iter().map(|v| v.to_bits()).collect();
                        assert_eq!(
                            batched,
                            alone,
                            "{dtype}, window {window:?}, sinks {}, {threads} threads: sequence {i} (length {len})",
                            sinks.is_some()
                        );
                    }
                }
            }
        }
    }
}
