//! The attention forward with an online softmax (FlashAttention-style), memory O(T).
//!
//! For one query row i, scores `s_ij = scale·q_i·k_j (+ mask)` arrive one key block at
//! a time. Starting from `m = −∞, l = 0, o = 0`, each block updates
//!
//! ```text
//!   m' = max(m, max_j s_ij)          running max
//!   α  = e^(m − m')                  rescales what was accumulated under the old max
//!   p_ij = e^(s_ij − m')
//!   l' = α·l + Σ_j p_ij              running sum
//!   o' = α·o + Σ_j p_ij·v_j          running (unnormalized) output
//! ```
//!
//! and at the end `out_i = o/l`, `lse_i = m + ln l`. A row that has seen no key keeps
//! `m = −∞`: its block steps are skipped (no `−∞ − −∞`), it outputs zeros and `lse = −∞`.
//!
//! Two paths share that recurrence:
//! - blocked ([`BLOCK_Q`] queries × [`BLOCK_K`] keys), for runs of queries: K and V are
//!   packed once per call (K transposed per block, rows padded to 16 floats), and each
//!   (batch, head, query block) task computes `S = Q·Kᵀ` and `O += P·V` as register-tiled
//!   block products, skipping key blocks the causal mask hides entirely and key tiles
//!   past the diagonal;
//! - row at a time, for a few queries (decode): one task per (batch, kv head) runs all
//!   queries of the group over K/V read in place with `dot`/`axpy`, so a cache is read
//!   once per group and never past the filled length.

use super::tiles::{self, TILE_ROWS};
use super::{Dims, Problem};
use crate::cpu::pool::SharedMut;
use crate::cpu::simd;
use crate::cpu::CpuBackend;

/// Query rows per block of the blocked path.
pub(super) const BLOCK_Q: usize = 64;
/// Keys per block (both paths, and the backward).
pub(super) const BLOCK_K: usize = 128;
/// From this many queries per head on, the blocked path is used.
const BLOCKED_MIN_TQ: usize = 16;

/// Writes the output `[B, Hq, Tq, D]` and logsumexp `[B, Hq, Tq]` of problem `p`
/// (every element of both).
pub(super) fn forward(cpu: &CpuBackend, p: &Problem, out: &mut [f32], lse: &mut [f32]) {
    if lse.is_empty() {
        return;
    }
    if p.dims.tq >= BLOCKED_MIN_TQ {
        blocked_forward(cpu, p, out, lse);
    } else {
        rows_forward(cpu, p, out, lse);
    }
}

/// `out = o/l`, `lse = m + ln l`; zeros and −∞ for a row that saw no key.
fn finish_row(o: &[f32], m: f32, l: f32, out: &mut [f32], lse: &mut f32) {
    if l > 0.0 {
        let inv = 1.0 / l;
        for (y, &x) in out.iter_mut().zip(o) {
            *y = x * inv;
        }
        *lse = m + l.ln();
    } else {
        out.fill(0.0);
        *lse = f32::NEG_INFINITY;
    }
}

/// K and V of every (batch, kv head) in block layout: per block of [`BLOCK_K`] keys,
/// `kt[d][c]` (K transposed) and `v[c][d]`, rows padded to `dp` (a multiple of 16) and
/// keys past Tk zero-filled. O(Tk·D) extra memory, built once per call. When D is a
/// multiple of 16, V is read in place (`v` stays empty).
struct PackedKv<'a> {
    kt: Vec<f32>,
    v: Vec<f32>,
    v_in_place: &'a [f32],
    kv_stride: usize,
    blocks: usize,
    dp: usize,
}

impl<'a> PackedKv<'a> {
    fn new(cpu: &CpuBackend, p: &Problem<'a>) -> PackedKv<'a> {
        let Dims { batch, hkv, tk, d, .. } = p.dims;
        let dp = d.next_multiple_of(16);
        let blocks = tk.div_ceil(BLOCK_K);
        let block_len = dp * BLOCK_K;
        let mut kt = vec![0.0f32; batch * hkv * blocks * block_len];
        let mut v = if d == dp { Vec::new() } else { vec![0.0f32; kt.len()] };
        let keys_in = |idx: usize| {
            let (head, kb) = (idx / blocks, idx % blocks);
            let k0 = kb * BLOCK_K;
            (head * p.kv_stride + k0 * d, BLOCK_K.min(tk - k0))
        };
        cpu.for_each_chunk(&mut kt, block_len, 1, |idx, blk| {
            let (start, nk) = keys_in(idx);
            for c in 0..nk {
                for (dd, &x) in p.k[start + c * d..start + (c + 1) * d].iter().enumerate() {
                    blk[dd * BLOCK_K + c] = x;
                }
            }
        });
        cpu.for_each_chunk(&mut v, block_len, 1, |idx, blk| {
            let (start, nk) = keys_in(idx);
            for c in 0..nk {
                blk[c * dp..c * dp + d].copy_from_slice(&p.v[start + c * d..start + (c + 1) * d]);
            }
        });
        PackedKv { kt, v, v_in_place: p.v, kv_stride: p.kv_stride, blocks, dp }
    }

    fn kt_block(&self, kv_head: usize, kb: usize) -> &[f32] {
        let len = self.dp * BLOCK_K;
        &self.kt[(kv_head * self.blocks + kb) * len..][..len]
    }

    /// Rows `kb·BLOCK_K ..` of V (as many as the block has keys; in place: up to the end).
    fn v_block(&self, kv_head: usize, kb: usize) -> &[f32] {
        if self.v.is_empty() {
            return &self.v_in_place[kv_head * self.kv_stride + kb * BLOCK_K * self.dp..];
        }
        let len = self.dp * BLOCK_K;
        &self.v[(kv_head * self.blocks + kb) * len..][..len]
    }
}

/// The blocked path: one task per (batch·head, query block).
fn blocked_forward(cpu: &CpuBackend, p: &Problem, out: &mut [f32], lse: &mut [f32]) {
    let Dims { batch, hq, tq, tk, d, .. } = p.dims;
    let kv = PackedKv::new(cpu, p);
    let q_blocks = tq.div_ceil(BLOCK_Q);
    let out_ptr = SharedMut(out.as_mut_ptr());
    let lse_ptr = SharedMut(lse.as_mut_ptr());
    cpu.for_each_index(batch * hq * q_blocks, BLOCK_Q * tk * d, |task| {
        let (bh, qb) = (task / q_blocks, task % q_blocks);
        let q0 = qb * BLOCK_Q;
        let rows = BLOCK_Q.min(tq - q0);
        // SAFETY: rows q0..q0+rows of head bh belong to this task alone, and lie inside
        // the [B·Hq·Tq, D] output and the [B·Hq·Tq] logsumexp.
        let (o, l) = unsafe { (out_ptr.slice((bh * tq + q0) * d, rows * d), lse_ptr.slice(bh * tq + q0, rows)) };
        forward_block(p, &kv, bh, q0, rows, o, l);
    });
}

/// Rows `q0..q0+rows` of query head `bh` over every key block they can see.
fn forward_block(p: &Problem, kv: &PackedKv<'_>, bh: usize, q0: usize, rows: usize, out: &mut [f32], lse: &mut [f32]) {
    let Dims { tq, d, .. } = p.dims;
    let dp = kv.dp;
    let rows_p = rows.next_multiple_of(TILE_ROWS);
    let tiles = rows_p / TILE_ROWS;
    // Scaled queries, zero-padded to [rows_p, dp].
    let mut qs = vec![0.0f32; rows_p * dp];
    for r in 0..rows {
        let src = &p.q[(bh * tq + q0 + r) * d..][..d];
        for (x, &y) in qs[r * dp..r * dp + d].iter_mut().zip(src) {
            *x = y * p.scale;
        }
    }
    let mut o = vec![0.0f32; rows_p * dp];
    let mut s = vec![0.0f32; rows_p * BLOCK_K];
    let mut m = vec![f32::NEG_INFINITY; rows_p];
    let mut l = vec![0.0f32; rows_p];
    let mut alpha = vec![1.0f32; rows_p];
    let mut visible = vec![0usize; rows_p];
    let mut cols = vec![0usize; tiles];
    let mut ranges = vec![(0usize, 0usize); tiles];
    let kv_head = p.kv_head(bh);
    // Rows see nested key prefixes: the last row sees the most; blocks past it are skipped.
    let key_blocks = p.dims.visible(p.causal, q0 + rows - 1).div_ceil(BLOCK_K);
    for kb in 0..key_blocks {
        let k0 = kb * BLOCK_K;
        for (r, n) in visible.iter_mut().enumerate() {
            *n = if r < rows { p.dims.visible(p.causal, q0 + r).saturating_sub(k0).min(BLOCK_K) } else { 0 };
        }
        for t in 0..tiles {
            // Visible counts grow with the row (padding rows aside): take the tile's max.
            cols[t] = visible[t * TILE_ROWS..(t + 1) * TILE_ROWS].iter().fold(0, |a, &b| a.max(b));
            ranges[t] = (0, cols[t]);
        }
        // S = (scale·Q)·Kᵀ, only the key tiles each row tile can see.
        tiles::scores(&mut s, BLOCK_K, &qs, dp, kv.kt_block(kv_head, kb), BLOCK_K, &cols);
        if let Some(mask) = p.mask {
            for (r, &n) in visible[..rows].iter().enumerate() {
                mask.apply(&p.dims, bh, q0 + r, k0, &mut s[r * BLOCK_K..r * BLOCK_K + n]);
            }
        }
        // P = e^(S − m') with the running max and sum updated; O = α∘O + P·V.
        tiles::softmax_rows(&mut s, BLOCK_K, &visible, &cols, &mut m, &mut l, &mut alpha);
        tiles::accumulate_rows(&mut o, dp, &s, BLOCK_K, kv.v_block(kv_head, kb), &ranges, Some(&alpha));
    }
    for r in 0..rows {
        finish_row(&o[r * dp..r * dp + d], m[r], l[r], &mut out[r * d..(r + 1) * d], &mut lse[r]);
    }
}

/// The row-at-a-time path: one task per (batch, kv head) holding every query row of
/// its group; K and V are read in place, key block by key block.
fn rows_forward(cpu: &CpuBackend, p: &Problem, out: &mut [f32], lse: &mut [f32]) {
    let Dims { batch, hq, hkv, tq, tk, d } = p.dims;
    let group = p.dims.group();
    let out_ptr = SharedMut(out.as_mut_ptr());
    let lse_ptr = SharedMut(lse.as_mut_ptr());
    cpu.for_each_index(batch * hkv, group * tq * tk * d, |kv_head| {
        let b = kv_head / hkv;
        // The group's query heads are consecutive: heads bh0 .. bh0 + group.
        let bh0 = b * hq + (kv_head % hkv) * group;
        let n_rows = group * tq;
        // SAFETY: the query heads of this group are written by this task alone; the
        // ranges lie inside the output and the logsumexp.
        let (o_out, l_out) = unsafe { (out_ptr.slice(bh0 * tq * d, n_rows * d), lse_ptr.slice(bh0 * tq, n_rows)) };
        let k = &p.k[kv_head * p.kv_stride..];
        let v = &p.v[kv_head * p.kv_stride..];
        let qs: Vec<f32> = p.q[bh0 * tq * d..(bh0 * tq + n_rows) * d].iter().map(|&x| x * p.scale).collect();
        let mut o = vec![0.0f32; n_rows * d];
        let mut m = vec![f32::NEG_INFINITY; n_rows];
        let mut l = vec![0.0f32; n_rows];
        let mut s = vec![0.0f32; BLOCK_K];
        let key_blocks = p.dims.visible(p.causal, tq - 1).div_ceil(BLOCK_K);
        for kb in 0..key_blocks {
            let k0 = kb * BLOCK_K;
            for row in 0..n_rows {
                let (h, i) = (row / tq, row % tq);
                let n = p.dims.visible(p.causal, i).saturating_sub(k0).min(BLOCK_K);
                if n == 0 {
                    continue;
                }
                let q_row = &qs[row * d..(row + 1) * d];
                for (j, x) in s[..n].iter_mut().enumerate() {
                    *x = simd::dot(q_row, &k[(k0 + j) * d..(k0 + j + 1) * d]);
                }
                if let Some(mask) = p.mask {
                    mask.apply(&p.dims, bh0 + h, i, k0, &mut s[..n]);
                }
                let mut alpha = [1.0f32];
                tiles::softmax_rows(&mut s, BLOCK_K, &[n], &[n], &mut m[row..=row], &mut l[row..=row], &mut alpha);
                let o_row = &mut o[row * d..(row + 1) * d];
                if alpha[0] != 1.0 {
                    simd::scale(o_row, alpha[0]);
                }
                for (j, &pj) in s[..n].iter().enumerate() {
                    if pj != 0.0 {
                        simd::axpy(o_row, pj, &v[(k0 + j) * d..(k0 + j + 1) * d]);
                    }
                }
            }
        }
        for row in 0..n_rows {
            finish_row(&o[row * d..(row + 1) * d], m[row], l[row], &mut o_out[row * d..(row + 1) * d], &mut l_out[row]);
        }
    });
}
