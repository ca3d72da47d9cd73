//! The single-query forward (Tq = 1, no explicit mask): the query sees all `Tk` keys
//! (or, with a sliding window of W, the last W, the others never read), so each kv head (or each range of its keys, when kv heads are few) is one task
//! that streams its K rows once, scoring the
//! `G = Hq/Hkv` query heads of its group against each row while it is in L1, and then
//! its V rows once, accumulating the G outputs. The softmax is the same online one as
//! the blocked forward (see `forward.rs`), one block of [`BLOCK_K`] keys at a time:
//!
//! ```text
//!   m' = max(m, max_j s_gj),  α = e^(m − m'),  p_gj = e^(s_gj − m'),
//!   l' = α·l + Σ_j p_gj,      o'_g = α·o_g + Σ_j p_gj·v_j
//! ```
//!
//! An attention sink starts a head's softmax at `m = s_h, l = 1` (see `forward.rs`); when
//! a head's keys are split into ranges, the first range carries it.
//!
//! Query heads are taken [`HEADS`] at a time (a group is padded with zero queries whose
//! scores are dropped), K and V are read in place with their true head dim.
//!
//! The cache rows may be F32, F16 or BF16 ([`KvElem`]): 16-bit rows are widened to f32
//! inside the dot-product and accumulation loops (AVX2 + F16C, see `decode_half_x86`)
//! or, on the portable path, one block at a time into an f32 scratch that stays in
//! cache; every product and sum is f32.

use super::{Dims, Problem};
use std::mem::MaybeUninit;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

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
pub(super) fn applies<T>(p: &Problem<T>) -> bool {
    p.dims.tq == 1 && p.dims.d > 0 && p.mask.is_none()
}

/// Writes the output `[B, Hq, 1, D]` and logsumexp `[B, Hq, 1]` of a single-query problem.
///
/// One task per kv head, or, when there are too few kv heads to keep every thread busy
/// to the end (see [`key_splits`]), one per contiguous range of each head's keys: such a
/// task leaves its unnormalized `(o, m, l)` per query head, and the ranges of a head are
/// then merged in order (`M = max m_i`, `l = Σ e^(m_i − M)·l_i`, `o = Σ e^(m_i − M)·o_i`),
/// deterministic for a given thread count.
pub(super) fn forward<T: KvElem>(
    cpu: &CpuBackend,
    p: &Problem<T>,
    out: &mut [MaybeUninit<f32>],
    lse: &mut [MaybeUninit<f32>],
) {
    let Dims { batch, hkv, d, .. } = p.dims;
    let (out, lse) = (SharedMut(out.as_mut_ptr()), SharedMut(lse.as_mut_ptr()));
    let group = p.dims.group();
    let heads = batch * hkv;
    // The one query sees keys `first .. tk` (a sliding window: the last W); the rows
    // before are never read.
    let (first, tk) = p.keys(0);
    let work = 2 * group * (tk - first) * d;
    let splits = key_splits(cpu.threads(), heads, tk - first);
    let finish = |row: usize, o: &[f32], m: f32, l: f32| {
        // SAFETY: query row `row` (< B·Hq) belongs to one kv head's task (or merge) alone
        // (groups partition the query heads, Tq = 1); row·D + D ≤ out's length, row < lse's.
        let (out, lse) = unsafe { (out.slice(row * d, d), lse.slice(row, 1)) };
        super::forward::finish_row(o, m, l, out, &mut lse[0]);
    };
    let first_row = |kv_head: usize| (kv_head / hkv) * p.dims.hq + (kv_head % hkv) * group;
    if splits == 1 {
        cpu.for_each_index(heads, work, |kv_head| {
            let row = first_row(kv_head);
            group_forward(p, kv_head, first..tk, true, |g, o, m, l| finish(row + g, o, m, l));
        });
        return;
    }
    // partials[kv_head][split][g] = (o[0..d], m, l).
    let stride = d + 2;
    let mut partials = vec![0.0f32; heads * splits * group * stride];
    cpu.for_each_chunk(&mut partials, group * stride, work / splits, |task, part| {
        let (kv_head, split) = (task / splits, task % splits);
        let len = tk - first;
        let keys = first + len * split / splits..first + len * (split + 1) / splits;
        // The sink's term is counted once, in the first range (the merge rescales it).
        group_forward(p, kv_head, keys, split == 0, |g, o, m, l| {
            let slot = &mut part[g * stride..(g + 1) * stride];
            slot[..d].copy_from_slice(o);
            (slot[d], slot[d + 1]) = (m, l);
        });
    });
    cpu.for_each_index(heads, group * splits * d, |kv_head| {
        let mut o = vec![0.0f32; d];
        for g in 0..group {
            let part = |i: usize| &partials[((kv_head * splits + i) * group + g) * stride..][..stride];
            let m_all = (0..splits).map(|i| part(i)[d]).fold(f32::NEG_INFINITY, f32::max);
            // All ranges saw only −∞ scores: l = 0 gives zeros (and no −∞ − −∞).
            let shift = if m_all == f32::NEG_INFINITY { 0.0 } else { m_all };
            o.fill(0.0);
            let mut l = 0.0f32;
            for i in 0..splits {
                let pi = part(i);
                let w = simd::exp_lane::<false>(pi[d] - shift);
                l += w * pi[d + 1];
                for (y, &x) in o.iter_mut().zip(&pi[..d]) {
                    *y += w * x;
                }
            }
            finish(first_row(kv_head) + g, &o, m_all, l);
        }
    });
}

/// [`forward`] of several single-query problems (a server's sequences, each over its own
/// cache and length), `out` and `lse` holding their outputs one after another. Problems
/// whose keys [`forward`] would not split run their kv heads together in one parallel
/// region, each head exactly as [`forward`] runs it; the others run through [`forward`].
/// Each problem's results are therefore the bits it gets alone.
pub(super) fn forward_many<T: KvElem>(
    cpu: &CpuBackend,
    problems: &[Problem<T>],
    out: &mut [MaybeUninit<f32>],
    lse: &mut [MaybeUninit<f32>],
) {
    // (problem, its first output element, its first logsumexp) of the unsplit problems,
    // and the index of the first of each one's kv heads among the joint tasks.
    let (mut joint, mut starts, mut work) = (Vec::new(), Vec::new(), 0usize);
    let (mut tasks, mut at_out, mut at_lse) = (0, 0, 0);
    for (i, p) in problems.iter().enumerate() {
        let Dims { batch, hq, hkv, d, .. } = p.dims;
        let (rows, heads) = (batch * hq, batch * hkv);
        let (first, tk) = p.keys(0);
        if key_splits(cpu.threads(), heads, tk - first) == 1 {
            joint.push((i, at_out, at_lse));
            starts.push(tasks);
            tasks += heads;
            work += heads * 2 * p.dims.group() * (tk - first) * d;
        } else {
            forward(cpu, p, &mut out[at_out..at_out + rows * d], &mut lse[at_lse..at_lse + rows]);
        }
        (at_out, at_lse) = (at_out + rows * d, at_lse + rows);
    }
    let (out, lse) = (SharedMut(out.as_mut_ptr()), SharedMut(lse.as_mut_ptr()));
    cpu.for_each_index(tasks, work, |task| {
        let j = starts.partition_point(|&s| s <= task) - 1;
        let (i, out_at, lse_at) = joint[j];
        let p = &problems[i];
        let kv_head = task - starts[j];
        let Dims { hq, hkv, d, .. } = p.dims;
        let row = (kv_head / hkv) * hq + (kv_head % hkv) * p.dims.group();
        let (first, tk) = p.keys(0);
        group_forward(p, kv_head, first..tk, true, |g, o, m, l| {
            // SAFETY: query row `row + g` of problem i belongs to this task alone (groups
            // partition the query heads, Tq = 1), and problem i's rows lie inside `out`
            // and `lse` from `out_at` and `lse_at` on (the caller sized them for all).
            let (out, lse) = unsafe { (out.slice(out_at + (row + g) * d, d), lse.slice(lse_at + row + g, 1)) };
            super::forward::finish_row(o, m, l, out, &mut lse[0]);
        });
    });
}

/// Ranges each kv head's keys are cut into: at least two tasks per thread (with fewer kv
/// heads than that, some threads would sit idle), each range at least [`MIN_SPLIT_KEYS`]
/// long; 1 on one thread. More splits than needed measured no faster: each range's
/// first block starts without its prefetch.
fn key_splits(threads: usize, heads: usize, tk: usize) -> usize {
    if threads <= 1 || heads == 0 {
        return 1;
    }
    (2 * threads).div_ceil(heads).min(tk / MIN_SPLIT_KEYS).max(1)
}

/// Shortest key range of a split task (its K and V rows: 512 KiB at D = 128).
const MIN_SPLIT_KEYS: usize = 512;

/// Keys `keys` of kv head `kv_head` (a `b·Hkv + h` index) for the G query heads that read
/// it: `emit(g, o, m, l)` receives each head's unnormalized output `o` (`d` long), its
/// running max and sum, which include the heads' sinks when `with_sinks`.
fn group_forward<T: KvElem>(
    p: &Problem<T>,
    kv_head: usize,
    keys: std::ops::Range<usize>,
    with_sinks: bool,
    mut emit: impl FnMut(usize, &[f32], f32, f32),
) {
    let Dims { hq, hkv, d, .. } = p.dims;
    let group = p.dims.group();
    let first = (kv_head / hkv) * hq + (kv_head % hkv) * group;
    let base = kv_head * p.kv_stride;
    let k = &p.k[base + keys.start * d..base + keys.end * d];
    let v = &p.v[base + keys.start * d..base + keys.end * d];
    let tk = keys.len();
    let mut q = vec![0.0f32; HEADS * d];
    let mut o = vec![0.0f32; HEADS * d];
    let mut s = vec![0.0f32; HEADS * BLOCK_K];
    let mut scratch = Vec::new();
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
        if with_sinks && p.sinks.is_some() {
            for g in 0..heads {
                (m[g], l[g]) = p.softmax_start(first + h0 + g);
            }
        }
        for k0 in (0..tk).step_by(BLOCK_K) {
            let keys = BLOCK_K.min(tk - k0);
            let rows = k0 * d..(k0 + keys) * d;
            // The next block is prefetched while this one is computed (its V rows during the
            // scores, its K rows during the accumulation), so the reads overlap the
            // arithmetic: without it decode reached about 55% of the read bandwidth, with it
            // 70–80%.
            let next = (k0 + keys) * d..(k0 + keys + BLOCK_K).min(tk) * d;
            let (next_k, next_v) = (&k[next.clone()], &v[next]);
            T::scores(&k[rows.clone()], d, &q, heads, &mut s, next_v, &mut scratch);
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
            T::accumulate(&mut o, d, &s, &v[rows], &alpha, heads, next_k, &mut scratch);
        }
        for g in 0..heads {
            emit(h0 + g, &o[g * d..(g + 1) * d], m[g], l[g]);
        }
    }
}

/// An element type a KV cache stores: F32 read in place, F16/BF16 widened to f32 as
/// they are read. Both kernels see one block of at most [`BLOCK_K`] rows.
pub(super) trait KvElem: Copy + Send + Sync {
    /// `s[g·BLOCK_K + j] = q[g]·k_j` for the first `heads` of the [`HEADS`] queries `q`
    /// (`[HEADS, d]`, padded heads zero) and every row `k_j` of `k` (`[keys, d]`),
    /// prefetching `ahead` (the next block's V rows); `scratch` is the caller's buffer.
    #[allow(clippy::too_many_arguments)]
    fn scores(k: &[Self], d: usize, q: &[f32], heads: usize, s: &mut [f32], ahead: &[Self], scratch: &mut Vec<f32>);

    /// `o[g] = α_g·o[g] + Σ_j p[g·BLOCK_K + j]·v_j` for the first `heads` heads (`o`
    /// `[HEADS, d]`, `v` `[keys, d]`), prefetching `ahead` (the next block's K rows).
    #[allow(clippy::too_many_arguments)]
    fn accumulate(
        o: &mut [f32],
        d: usize,
        p: &[f32],
        v: &[Self],
        alpha: &[f32; HEADS],
        heads: usize,
        ahead: &[Self],
        scratch: &mut Vec<f32>,
    );
}

impl KvElem for f32 {
    fn scores(k: &[f32], d: usize, q: &[f32], heads: usize, s: &mut [f32], ahead: &[f32], _: &mut Vec<f32>) {
        // The AVX-512 kernels of `decode_x86` (head dims 64 and 128), else the portable ones.
        #[cfg(target_arch = "x86_64")]
        if super::decode_x86::applies(d) {
            return super::decode_x86::scores(k, d, q, heads, s, ahead);
        }
        let _ = (heads, ahead);
        group_scores(k, d, q, s);
    }

    fn accumulate(
        o: &mut [f32],
        d: usize,
        p: &[f32],
        v: &[f32],
        alpha: &[f32; HEADS],
        heads: usize,
        ahead: &[f32],
        _: &mut Vec<f32>,
    ) {
        #[cfg(target_arch = "x86_64")]
        if super::decode_x86::applies(d) {
            return super::decode_x86::accumulate(o, d, p, v, alpha, heads, ahead);
        }
        let _ = ahead;
        group_accumulate(o, d, p, v, alpha, heads);
    }
}

/// The 16-bit cache elements: `to_f32` widens a block of rows into the portable path's
/// scratch; `BF` selects the AVX2 kernels' widening (a 16-bit shift for BF16, F16C's
/// `vcvtph2ps` for F16).
pub(super) trait HalfElem: Copy + Send + Sync {
    /// BF16 (else F16).
    const BF: bool;
    /// `dst[i] = src[i]` as f32 (exact: every 16-bit value is an f32).
    fn widen(src: &[Self], dst: &mut [f32]);
}

impl HalfElem for f16 {
    const BF: bool = false;
    fn widen(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
}

impl HalfElem for bf16 {
    const BF: bool = true;
    fn widen(src: &[bf16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
}

/// `rows` widened into `scratch` (resized to fit).
fn widened<'s, T: HalfElem>(rows: &[T], scratch: &'s mut Vec<f32>) -> &'s [f32] {
    scratch.resize(rows.len(), 0.0);
    T::widen(rows, scratch);
    scratch
}

impl<T: HalfElem> KvElem for T {
    fn scores(k: &[T], d: usize, q: &[f32], heads: usize, s: &mut [f32], ahead: &[T], scratch: &mut Vec<f32>) {
        #[cfg(target_arch = "x86_64")]
        if super::decode_half_x86::applies(d) {
            return super::decode_half_x86::scores(k, d, q, heads, s, ahead);
        }
        let _ = (heads, ahead);
        group_scores(widened(k, scratch), d, q, s);
    }

    fn accumulate(
        o: &mut [f32],
        d: usize,
        p: &[f32],
        v: &[T],
        alpha: &[f32; HEADS],
        heads: usize,
        ahead: &[T],
        scratch: &mut Vec<f32>,
    ) {
        #[cfg(target_arch = "x86_64")]
        if super::decode_half_x86::applies(d) {
            return super::decode_half_x86::accumulate(o, d, p, v, alpha, heads, ahead);
        }
        let _ = ahead;
        group_accumulate(o, d, p, widened(v, scratch), alpha, heads);
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
