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
//! - blocked ([`BLOCK_Q`] queries × [`BLOCK_K`] keys), for runs of queries: each
//!   (batch, head, query block) task computes the transposed score block `Sᵀ = K·Qᵀ`
//!   and `O += P·V` as register-tiled block products over K and V read in place
//!   (V padded once per call when D is not a multiple of 16), skipping key blocks the
//!   causal mask hides entirely and query registers past the diagonal; the softmax runs
//!   down the columns of `Sᵀ`, one vector lane per query;
//! - row at a time, for a few queries (decode): one task per (batch, kv head) runs all
//!   queries of the group over K/V read in place with `dot`/`axpy`, so a cache is read
//!   once per group and never past the filled length.

use super::tiles::{self, TILE_ROWS};
use super::{Dims, Problem};
use crate::cpu::pool::SharedMut;
use crate::cpu::simd;
use crate::cpu::CpuBackend;

/// Query rows per block of the blocked path (the columns of its transposed score block).
pub(super) const BLOCK_Q: usize = tiles::QUERY_COLS;
/// Keys per block of both paths.
const BLOCK_K: usize = 128;
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

/// V with rows padded to `dp` floats (zeros past D), `[B·Hkv][Tk][dp]`, for a head dim
/// that is not a multiple of 16 (the P·V tiles read whole registers).
fn padded_v(cpu: &CpuBackend, p: &Problem, dp: usize) -> Vec<f32> {
    let Dims { batch, hkv, tk, d, .. } = p.dims;
    let mut v = vec![0.0f32; batch * hkv * tk * dp];
    cpu.for_each_chunk(&mut v, dp, 1, |row, dst| {
        let (head, j) = (row / tk, row % tk);
        let start = head * p.kv_stride + j * d;
        dst[..d].copy_from_slice(&p.v[start..start + d]);
    });
    v
}

/// The blocked path: one task per (batch·head, query block).
fn blocked_forward(cpu: &CpuBackend, p: &Problem, out: &mut [f32], lse: &mut [f32]) {
    let Dims { batch, hq, tq, tk, d, .. } = p.dims;
    let dp = d.next_multiple_of(16);
    let padded = if d == dp { Vec::new() } else { padded_v(cpu, p, dp) };
    let v = if d == dp {
        Rows { data: p.v, head_stride: p.kv_stride }
    } else {
        Rows { data: &padded, head_stride: tk * dp }
    };
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
        forward_block(p, v, dp, bh, q0, rows, o, l);
    });
}

/// The value rows of every (batch, kv head): head h's rows start at `h·head_stride`,
/// each `dp` floats.
#[derive(Clone, Copy)]
struct Rows<'a> {
    data: &'a [f32],
    head_stride: usize,
}

/// Rows `q0..q0+rows` of query head `bh` over every key block they can see, in the
/// transposed layout: the score block is `Sᵀ[key][query]` (64 queries = 4 registers
/// per key), computed as `K·(scale·Q)ᵀ` with K read in place and the block's queries
/// transposed once; the softmax then runs down the columns (vector max, exp and sums;
/// no horizontal reductions), and `O += P·V` reads `Pᵀ` through its strides.
fn forward_block(p: &Problem, v: Rows, dp: usize, bh: usize, q0: usize, rows: usize, out: &mut [f32], lse: &mut [f32]) {
    const BQ: usize = BLOCK_Q;
    let Dims { tq, tk, d, .. } = p.dims;
    let kv_head = p.kv_head(bh);
    let k = &p.k[kv_head * p.kv_stride..];
    let v = &v.data[kv_head * v.head_stride..];
    // qt[d][r] = scale·q[q0 + r][d]; columns past `rows` stay 0.
    let mut qt = vec![0.0f32; d * BQ];
    for r in 0..rows {
        let src = &p.q[(bh * tq + q0 + r) * d..(bh * tq + q0 + r + 1) * d];
        for (dd, &x) in src.iter().enumerate() {
            qt[dd * BQ + r] = x * p.scale;
        }
    }
    let mut o = vec![0.0f32; BQ * dp];
    let mut st = vec![0.0f32; BLOCK_K * BQ];
    let mut tail = vec![0.0f32; TILE_ROWS * d];
    let (mut m, mut l, mut alpha) = ([f32::NEG_INFINITY; BQ], [0.0f32; BQ], [1.0f32; BQ]);
    let mut first_query = [0usize; BLOCK_K];
    let mut key_cols = [(0usize, 0usize); BLOCK_K / TILE_ROWS];
    let mut ranges = [(0usize, 0usize); BQ / TILE_ROWS];
    let q_tiles = rows.div_ceil(TILE_ROWS);
    let visible = |r: usize| p.dims.visible(p.causal, q0 + r);
    // The last query sees the most keys; blocks past them are skipped.
    let seen = visible(rows - 1);
    for kb in 0..seen.div_ceil(BLOCK_K) {
        let k0 = kb * BLOCK_K;
        let keys = seen.min(k0 + BLOCK_K) - k0;
        // Key k0 + c is seen from query row r = k0 + c − (Tk − Tq) − q0 on.
        for (c, f) in first_query[..keys].iter_mut().enumerate() {
            *f = if p.causal { (k0 + c + tq).saturating_sub(tk + q0).min(BQ) } else { 0 };
        }
        let key_tiles = keys.div_ceil(TILE_ROWS);
        for (t, cols) in key_cols[..key_tiles].iter_mut().enumerate() {
            *cols = (first_query[t * TILE_ROWS], BQ);
        }
        // Sᵀ = K·(scale·Q)ᵀ, skipping query registers a key tile cannot be seen from.
        // Whole key tiles read K in place; a partial last one goes through a zero-padded
        // copy, so no row past the block's keys is read (a cache's unfilled tail).
        let whole = keys / TILE_ROWS;
        tiles::scores(&mut st, BQ, &k[k0 * d..], d, d, &qt, BQ, &key_cols[..whole]);
        if whole < key_tiles {
            let n = keys - whole * TILE_ROWS;
            tail.fill(0.0);
            tail[..n * d].copy_from_slice(&k[(k0 + whole * TILE_ROWS) * d..(k0 + keys) * d]);
            tiles::scores(&mut st[whole * TILE_ROWS * BQ..], BQ, &tail, d, d, &qt, BQ, &key_cols[whole..key_tiles]);
        }
        if let Some(mask) = p.mask {
            for r in 0..rows {
                mask.apply_column(&p.dims, bh, q0 + r, k0, keys, &mut st, BQ, r);
            }
        }
        tiles::softmax_cols(&mut st, keys, &first_query[..keys], &mut m, &mut l, &mut alpha);
        // O = α∘O + P·V; each 4-query tile runs over the keys its last query sees.
        for (t, range) in ranges[..q_tiles].iter_mut().enumerate() {
            let last = (t * TILE_ROWS + TILE_ROWS - 1).min(rows - 1);
            *range = (0, visible(last).saturating_sub(k0).min(keys));
        }
        tiles::accumulate_cols(&mut o, dp, &st, BQ, &v[k0 * dp..], &ranges[..q_tiles], Some(&alpha));
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
