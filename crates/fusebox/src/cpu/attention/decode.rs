//! The single-query forward (Tq = 1, no explicit mask): every query row sees all `Tk`
//! keys, so each kv head is one task that streams its K rows once, scoring the
//! `G = Hq/Hkv` query heads of its group against each row while it is in L1, and then
//! its V rows once, accumulating the G outputs. The softmax is the same online one as
//! the blocked forward (see `forward.rs`), one block of [`BLOCK_K`] keys at a time:
//!
//! ```text
//!   m' = max(m, max_j s_gj),  α = e^(m − m'),  p_gj = e^(s_gj − m'),
//!   l' = α·l + Σ_j p_gj,      o'_g = α·o_g + Σ_j p_gj·v_j
//! ```
//!
//! Query heads are taken [`HEADS`] at a time (a group is padded with zero queries whose
//! scores are dropped), K and V are read in place with their true head dim.

use super::{Dims, Problem};
use std::mem::MaybeUninit;

use crate::cpu::pool::SharedMut;
use crate::cpu::simd::{self, multiversion};
use crate::cpu::CpuBackend;

/// Keys per softmax block (the scores of one block stay in L1).
pub(super) const BLOCK_K: usize = 256;
/// Query heads scored together against one K row.
pub(super) const HEADS: usize = 4;
/// Lanes of the dot-product accumulators.
const LANES: usize = 16;

/// Whether `p` takes the single-query path.
pub(super) fn applies(p: &Problem) -> bool {
    p.dims.tq == 1 && p.dims.d > 0 && p.mask.is_none()
}

/// Writes the output `[B, Hq, 1, D]` and logsumexp `[B, Hq, 1]` of a single-query problem.
pub(super) fn forward(cpu: &CpuBackend, p: &Problem, out: &mut [MaybeUninit<f32>], lse: &mut [MaybeUninit<f32>]) {
    let Dims { batch, hkv, tk, d, .. } = p.dims;
    let out = SharedMut(out.as_mut_ptr());
    let lse = SharedMut(lse.as_mut_ptr());
    let work = 2 * p.dims.group() * tk * d;
    cpu.for_each_index(batch * hkv, work, |kv_head| group_forward(p, kv_head, &out, &lse));
}

/// The G query heads that read kv head `kv_head` (a `b·Hkv + h` index).
fn group_forward(p: &Problem, kv_head: usize, out: &SharedMut<MaybeUninit<f32>>, lse: &SharedMut<MaybeUninit<f32>>) {
    let Dims { hq, hkv, tk, d, .. } = p.dims;
    let group = p.dims.group();
    let first = (kv_head / hkv) * hq + (kv_head % hkv) * group;
    let k = &p.k[kv_head * p.kv_stride..kv_head * p.kv_stride + tk * d];
    let v = &p.v[kv_head * p.kv_stride..kv_head * p.kv_stride + tk * d];
    let mut q = vec![0.0f32; HEADS * d];
    let mut o = vec![0.0f32; HEADS * d];
    let mut s = vec![0.0f32; HEADS * BLOCK_K];
    // The AVX-512 kernels of `decode_x86` (head dims 64 and 128), else the portable ones.
    #[cfg(target_arch = "x86_64")]
    let fast = super::decode_x86::applies(d);
    #[cfg(not(target_arch = "x86_64"))]
    let fast = false;
    for h0 in (0..group).step_by(HEADS) {
        let heads = HEADS.min(group - h0);
        // q[g] = scale·q of head first + h0 + g; padded heads stay 0.
        q.fill(0.0);
        for g in 0..heads {
            let src = &p.q[(first + h0 + g) * d..(first + h0 + g + 1) * d];
            for (y, &x) in q[g * d..(g + 1) * d].iter_mut().zip(src) {
                *y = x * p.scale;
            }
        }
        o.fill(0.0);
        let (mut m, mut l) = ([f32::NEG_INFINITY; HEADS], [0.0f32; HEADS]);
        for k0 in (0..tk).step_by(BLOCK_K) {
            let keys = BLOCK_K.min(tk - k0);
            let rows = k0 * d..(k0 + keys) * d;
            // The next block is prefetched while this one is computed (its V rows during the
            // scores, its K rows during the accumulation), so the reads overlap the
            // arithmetic: without it decode reached about 55% of the read bandwidth, with it
            // 70–80%.
            let next = (k0 + keys) * d..(k0 + keys + BLOCK_K).min(tk) * d;
            let (next_k, next_v) = (&k[next.clone()], &v[next]);
            if fast {
                #[cfg(target_arch = "x86_64")]
                super::decode_x86::scores(&k[rows.clone()], d, &q, heads, &mut s, next_v);
            } else {
                group_scores(&k[rows.clone()], d, &q, &mut s);
            }
            let mut alpha = [1.0f32; HEADS];
            for g in 0..heads {
                let sg = &mut s[g * BLOCK_K..g * BLOCK_K + keys];
                let m_new = m[g].max(simd::max(sg));
                // A head whose scores are all −∞ so far shifts by 0 (never −∞ − −∞).
                let shift = if m_new == f32::NEG_INFINITY { 0.0 } else { m_new };
                let block_sum = simd::exp_sub_sum(sg, shift);
                alpha[g] = simd::exp_lane::<false>(m[g] - shift);
                l[g] = alpha[g] * l[g] + block_sum;
                m[g] = m_new;
            }
            if fast {
                #[cfg(target_arch = "x86_64")]
                super::decode_x86::accumulate(&mut o, d, &s, &v[rows], &alpha, heads, next_k);
            } else {
                group_accumulate(&mut o, d, &s, &v[rows], &alpha, heads);
            }
        }
        for g in 0..heads {
            let row = first + h0 + g;
            // SAFETY: query row `row` belongs to kv head `kv_head`'s task alone (groups
            // partition the query heads, Tq = 1); row·D + D ≤ out's length, row < lse's.
            let (out, lse) = unsafe { (out.slice(row * d, d), lse.slice(row, 1)) };
            super::forward::finish_row(&o[g * d..(g + 1) * d], m[g], l[g], out, &mut lse[0]);
        }
    }
}

multiversion! {
    /// `s[g·BLOCK_K + j] = q[g]·k_j` for the [`HEADS`] queries `q` (`[HEADS, d]`) and every
    /// row `k_j` of `k` (`[keys, d]`): each K row is loaded once for all heads.
    pub fn group_scores(k: &[f32], d: usize, q: &[f32], s: &mut [f32]) {
        let q = &q[..HEADS * d];
        let body = d - d % LANES;
        for (j, row) in k.chunks_exact(d).enumerate() {
            let mut acc = [[0.0f32; LANES]; HEADS];
            for c in (0..body).step_by(LANES) {
                let x = &row[c..c + LANES];
                for (g, a) in acc.iter_mut().enumerate() {
                    let qg = &q[g * d + c..g * d + c + LANES];
                    for l in 0..LANES {
                        a[l] += x[l] * qg[l];
                    }
                }
            }
            for (g, a) in acc.iter_mut().enumerate() {
                // Pairwise lane sum (a fixed tree), then the scalar tail of the row.
                let mut w = LANES / 2;
                while w > 0 {
                    for l in 0..w {
                        a[l] += a[l + w];
                    }
                    w /= 2;
                }
                let mut dot = a[0];
                for c in body..d {
                    dot += row[c] * q[g * d + c];
                }
                s[g * BLOCK_K + j] = dot;
            }
        }
    }
}

multiversion! {
    /// `o[g] = α_g·o[g] + Σ_j p[g·BLOCK_K + j]·v_j` for the first `heads` heads, `v` `[keys, d]`
    /// read once (each row for all heads).
    pub fn group_accumulate(o: &mut [f32], d: usize, p: &[f32], v: &[f32], alpha: &[f32; HEADS], heads: usize) {
        for (g, &a) in alpha.iter().enumerate().take(heads) {
            for y in o[g * d..(g + 1) * d].iter_mut() {
                *y *= a;
            }
        }
        if heads == HEADS {
            let (o0, rest) = o[..HEADS * d].split_at_mut(d);
            let (o1, rest) = rest.split_at_mut(d);
            let (o2, o3) = rest.split_at_mut(d);
            for (j, row) in v.chunks_exact(d).enumerate() {
                let (p0, p1, p2, p3) = (p[j], p[BLOCK_K + j], p[2 * BLOCK_K + j], p[3 * BLOCK_K + j]);
                let outs = o0.iter_mut().zip(o1.iter_mut()).zip(o2.iter_mut().zip(o3.iter_mut()));
                for (((y0, y1), (y2, y3)), &x) in outs.zip(row) {
                    *y0 += p0 * x;
                    *y1 += p1 * x;
                    *y2 += p2 * x;
                    *y3 += p3 * x;
                }
            }
        } else {
            for (j, row) in v.chunks_exact(d).enumerate() {
                for g in 0..heads {
                    let pg = p[g * BLOCK_K + j];
                    for (y, &x) in o[g * d..(g + 1) * d].iter_mut().zip(row) {
                        *y += pg * x;
                    }
                }
            }
        }
    }
}
