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
//! `m = −∞, l = 0` (its scores are shifted by 0, never `−∞ − −∞`); it outputs zeros and
//! `lse = −∞`. An attention sink `s_h` is one more term of the sum with no value: the
//! row starts from `m = s_h, l = 1` (= `e^(s_h − m)`) instead, and the same updates
//! rescale it with everything else (a row that sees no key then gives zeros, `lse = s_h`).
//!
//! The work is cut into blocks of query *columns* that share one kv head, each a task
//! that walks the key blocks ([`BLOCK_K`] keys) its columns can see. A block's score
//! tile is kept transposed, `Sᵀ[key][column] = K·(scale·Q)ᵀ`: K is read in place (one
//! broadcast per element), the block's queries are transposed once, and the softmax
//! runs down the columns — max, exp and sums are plain vector operations, one lane per
//! query. `O += P·V` reads `Pᵀ` through its strides and V in place (padded once per call
//! when D is not a multiple of 16). Key blocks the causal mask hides from every column
//! are skipped, and within a block so are the query registers a key tile cannot be seen
//! from; keys past the block's last visible one are never read (a cache's unfilled
//! tail). With a sliding window, key blocks before the first column's window are
//! skipped too, and a key is masked for the columns past its last query row, so a block
//! reads about its rows plus W keys (cost O(T·W)). Blocks:
//! - long query runs (Tq ≥ 16): 64 consecutive queries of one head per block;
//! - a few queries (decode): the queries of every head of a GQA group together (16 or
//!   64 columns), so each kv head's cache is read once per group.

use super::tiles::{self, TILE_ROWS};
use super::{Dims, Problem};
use std::mem::MaybeUninit;

use crate::cpu::output;
use crate::cpu::pool::SharedMut;
use crate::cpu::simd;
use crate::cpu::CpuBackend;

/// Keys per block: a block's K rows, its score tile and its V rows (16 KiB each at
/// D = 64, 64 query columns) then fit L1 beside the block's queries; blocks of 128 and
/// of 32 keys ran slower (docs/performance.md, "Attention").
const BLOCK_K: usize = 64;
/// From this many queries per head on, blocks hold 64 queries of one head.
const PER_HEAD_MIN_TQ: usize = 16;

/// Writes the output `[B, Hq, Tq, D]` and logsumexp `[B, Hq, Tq]` of problem `p`
/// (every element of both: they may come uninitialized).
pub(super) fn forward(cpu: &CpuBackend, p: &Problem, out: &mut [MaybeUninit<f32>], lse: &mut [MaybeUninit<f32>]) {
    let Dims { batch, hkv, tk, d, .. } = p.dims;
    if lse.is_empty() {
        return;
    }
    if super::decode::applies(p) {
        return super::decode::forward(cpu, p, out, lse);
    }
    let dp = d.next_multiple_of(16);
    let padded = if d == dp { Vec::new() } else { padded_v(cpu, p, dp) };
    let v = if d == dp {
        Rows { data: p.v, head_stride: p.kv_stride }
    } else {
        Rows { data: &padded, head_stride: tk * dp }
    };
    let layout = Layout::new(p);
    let outputs = Outputs { out: SharedMut(out.as_mut_ptr()), lse: SharedMut(lse.as_mut_ptr()) };
    let blocks_per_group = layout.blocks_per_group();
    // Keys a block of columns reads: all of them, or about its rows plus a window.
    let span = match p.window {
        Some(w) if p.causal => tk.min(w.saturating_add(layout.rows)),
        _ => tk,
    };
    let work = layout.cols * span * d;
    let tasks = batch * hkv * blocks_per_group;
    let block_of = |task: usize| layout.block(task / blocks_per_group, task % blocks_per_group);
    cpu.for_each_index(tasks, work, |task| {
        let block = block_of(task);
        // The next task is most often this thread's next block: its query rows are
        // fetched while this block computes (they are read first, by one transpose).
        if task + 1 < tasks {
            let next = block_of(task + 1);
            if next.heads == 1 {
                simd::prefetch(p.q, (next.bh0 * p.dims.tq + next.i0) * d, next.len(p.dims.tq) * d);
            }
        }
        if layout.cols == 16 {
            forward_block::<16>(p, v, dp, &block, &outputs);
        } else {
            forward_block::<{ tiles::QUERY_COLS }>(p, v, dp, &block, &outputs);
        }
    });
}

/// How queries are grouped into blocks of columns.
struct Layout {
    /// Columns per block (16 or 64).
    cols: usize,
    /// Query heads per block (consecutive heads of one GQA group) and how many such
    /// head chunks a group has.
    heads: usize,
    head_chunks: usize,
    /// Query rows per block and how many row chunks a head has.
    rows: usize,
    row_chunks: usize,
    group: usize,
    hq: usize,
    hkv: usize,
}

impl Layout {
    fn new(p: &Problem) -> Layout {
        let Dims { hq, hkv, tq, .. } = p.dims;
        let group = p.dims.group();
        let (cols, heads) = if tq >= PER_HEAD_MIN_TQ {
            (tiles::QUERY_COLS, 1)
        } else if group * tq <= 16 {
            (16, group)
        } else {
            (tiles::QUERY_COLS, group.min(tiles::QUERY_COLS))
        };
        let rows = (cols / heads).min(tq);
        Layout { cols, heads, head_chunks: group.div_ceil(heads), rows, row_chunks: tq.div_ceil(rows), group, hq, hkv }
    }

    fn blocks_per_group(&self) -> usize {
        self.head_chunks * self.row_chunks
    }

    /// Block `idx` of kv head `kv_head` (a `b·Hkv + g` index).
    fn block(&self, kv_head: usize, idx: usize) -> QueryBlock {
        let (hc, rc) = (idx / self.row_chunks, idx % self.row_chunks);
        let first_head = hc * self.heads;
        QueryBlock {
            kv_head,
            bh0: (kv_head / self.hkv) * self.hq + (kv_head % self.hkv) * self.group + first_head,
            heads: self.heads.min(self.group - first_head),
            i0: rc * self.rows,
            rows: self.rows,
        }
    }
}

/// A block of query columns sharing kv head `kv_head`, in row-major order over
/// (query row, head): column `j` is row `i0 + j / heads` of query head `bh0 + j % heads`
/// (a `b·Hq + h` index), for rows `i0 .. min(i0 + rows, Tq)`. Visibility grows with j.
struct QueryBlock {
    kv_head: usize,
    bh0: usize,
    heads: usize,
    i0: usize,
    rows: usize,
}

impl QueryBlock {
    /// Number of columns (rows clipped to Tq).
    fn len(&self, tq: usize) -> usize {
        self.heads * self.rows.min(tq - self.i0)
    }
    /// `(query head, query row)` of column `j`.
    fn column(&self, j: usize) -> (usize, usize) {
        (self.bh0 + j % self.heads, self.i0 + j / self.heads)
    }
}

/// The output buffers, written row by row by the block that owns each query row.
struct Outputs {
    out: SharedMut<MaybeUninit<f32>>,
    lse: SharedMut<MaybeUninit<f32>>,
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

/// The value rows of every (batch, kv head): head h's rows start at `h·head_stride`,
/// each `dp` floats.
#[derive(Clone, Copy)]
struct Rows<'a> {
    data: &'a [f32],
    head_stride: usize,
}

/// One block of `COLS` query columns over every key block they can see.
fn forward_block<const COLS: usize>(p: &Problem, v: Rows, dp: usize, blk: &QueryBlock, outputs: &Outputs) {
    let d = p.dims.d;
    // The block's buffers come from the thread's scratch (no allocation per block, which
    // the allocator would fault in and trim again): qt, o, st, tail.
    let lens = [d * COLS, COLS * dp, BLOCK_K * COLS, TILE_ROWS * d];
    output::with_scratch(lens.iter().sum(), |buf| {
        let (qt, rest) = buf.split_at_mut(lens[0]);
        let (o, rest) = rest.split_at_mut(lens[1]);
        let (st, tail) = rest.split_at_mut(lens[2]);
        forward_block_in::<COLS>(p, v, dp, blk, outputs, [qt, o, st, tail]);
    })
}

/// [`forward_block`] with its buffers: `qt` `[d][COLS]`, `o` `[COLS][dp]`, `st`
/// `[BLOCK_K][COLS]`, `tail` `[TILE_ROWS][d]` (contents unspecified on entry).
fn forward_block_in<const COLS: usize>(
    p: &Problem,
    v: Rows,
    dp: usize,
    blk: &QueryBlock,
    outputs: &Outputs,
    [qt, o, st, tail]: [&mut [f32]; 4],
) {
    let Dims { tq, tk, d, .. } = p.dims;
    let n = blk.len(tq);
    let k = &p.k[blk.kv_head * p.kv_stride..];
    let v = &v.data[blk.kv_head * v.head_stride..];
    // qt[d][j] = scale·q[column j][d]; columns past n stay 0.
    qt.fill(0.0);
    if blk.heads == 1 {
        // The columns are consecutive rows of one head: one blocked transpose.
        let src = &p.q[(blk.bh0 * tq + blk.i0) * d..];
        simd::transpose_into(src, d, n, d, qt, COLS);
        simd::scale(qt, p.scale);
    } else {
        for j in 0..n {
            let (bh, i) = blk.column(j);
            let src = &p.q[(bh * tq + i) * d..(bh * tq + i + 1) * d];
            for (dd, &x) in src.iter().enumerate() {
                qt[dd * COLS + j] = x * p.scale;
            }
        }
    }
    o.fill(0.0);
    let (mut m, mut l, mut alpha) = ([f32::NEG_INFINITY; COLS], [0.0f32; COLS], [1.0f32; COLS]);
    if p.sinks.is_some() {
        start_at_sinks(p, blk, n, &mut m, &mut l);
    }
    let mut key_cols = [(0usize, 0usize); BLOCK_K];
    let mut tile_cols = [(0usize, 0usize); BLOCK_K / TILE_ROWS];
    let mut ranges = [(0usize, 0usize); tiles::QUERY_COLS / TILE_ROWS];
    let col_tiles = n.div_ceil(TILE_ROWS);
    let keys_of = |j: usize| p.keys(blk.column(j).1);
    // Rows grow with the column: the first column's window starts first and the last
    // column sees the last key; key blocks outside `first .. seen` are skipped.
    let (first, seen) = (keys_of(0).0, keys_of(n - 1).1);
    for kb in first / BLOCK_K..seen.div_ceil(BLOCK_K) {
        let k0 = kb * BLOCK_K;
        let keys = seen.min(k0 + BLOCK_K) - k0;
        // Key j = k0 + c is seen by query rows j − (Tk − Tq) ..< j + W − (Tk − Tq), i.e.
        // by columns heads·(row − i0) of those rows.
        for (c, cols) in key_cols[..keys].iter_mut().enumerate() {
            let j = k0 + c;
            let (lo_row, hi_row) = if p.causal {
                let hi = match p.window {
                    Some(w) => j.saturating_add(w).saturating_add(tq).saturating_sub(tk + blk.i0),
                    None => COLS,
                };
                ((j + tq).saturating_sub(tk + blk.i0), hi)
            } else {
                (0, COLS)
            };
            *cols = ((blk.heads * lo_row).min(COLS), blk.heads.saturating_mul(hi_row).min(COLS));
        }
        let key_tiles = keys.div_ceil(TILE_ROWS);
        for (t, cols) in tile_cols[..key_tiles].iter_mut().enumerate() {
            let last = (t * TILE_ROWS + TILE_ROWS).min(keys) - 1;
            *cols = (key_cols[t * TILE_ROWS].0, key_cols[last].1);
        }
        // Sᵀ = K·(scale·Q)ᵀ, skipping the query registers a key tile cannot be seen from.
        // Whole key tiles read K in place; a partial last one goes through a zero-padded
        // copy, so no row past the block's keys is read.
        let whole = keys / TILE_ROWS;
        tiles::scores(st, COLS, &k[k0 * d..], d, d, qt, COLS, &tile_cols[..whole]);
        if whole < key_tiles {
            let rest = keys - whole * TILE_ROWS;
            tail.fill(0.0);
            tail[..rest * d].copy_from_slice(&k[(k0 + whole * TILE_ROWS) * d..(k0 + keys) * d]);
            let st_tail = &mut st[whole * TILE_ROWS * COLS..];
            tiles::scores(st_tail, COLS, tail, d, d, qt, COLS, &tile_cols[whole..key_tiles]);
        }
        if let Some(mask) = p.mask {
            for j in 0..n {
                let (bh, i) = blk.column(j);
                mask.apply(&p.dims, bh, i, k0, keys, st, COLS, j);
            }
        }
        tiles::softmax_cols(st, COLS, keys, &key_cols[..keys], &mut m, &mut l, &mut alpha);
        // O = α∘O + P·V; each 4-column tile runs from the first key its first column
        // sees to the last its last column sees (P is 0 outside each column's keys).
        for (t, range) in ranges[..col_tiles].iter_mut().enumerate() {
            let last = (t * TILE_ROWS + TILE_ROWS - 1).min(n - 1);
            let (lo, hi) = (keys_of(t * TILE_ROWS).0, keys_of(last).1);
            let hi = hi.saturating_sub(k0).min(keys);
            *range = (lo.saturating_sub(k0).min(hi), hi);
        }
        tiles::accumulate_cols(o, dp, st, COLS, &v[k0 * dp..], &ranges[..col_tiles], Some(&alpha));
    }
    for j in 0..n {
        let (bh, i) = blk.column(j);
        let row = bh * tq + i;
        // SAFETY: query row `row` belongs to this block alone (blocks partition the query
        // rows), and row·D + D ≤ the output's length, row < the logsumexp's length.
        let (out, lse) = unsafe { (outputs.out.slice(row * d, d), outputs.lse.slice(row, 1)) };
        finish_row(&o[j * dp..j * dp + d], m[j], l[j], out, &mut lse[0]);
    }
}

/// Starts the online softmax of the block's first `n` columns from their heads' sinks
/// (`m = s_h`, `l = 1`). Out of line: calls without sinks keep the block loop as it was.
#[cold]
#[inline(never)]
fn start_at_sinks(p: &Problem, blk: &QueryBlock, n: usize, m: &mut [f32], l: &mut [f32]) {
    for j in 0..n {
        (m[j], l[j]) = p.softmax_start(blk.column(j).0);
    }
}

/// `out = o/l`, `lse = m + ln l`; zeros and −∞ for a row that saw no key. Writes every
/// element of `out` (`o` is at least as long) and `lse`.
pub(super) fn finish_row(o: &[f32], m: f32, l: f32, out: &mut [MaybeUninit<f32>], lse: &mut MaybeUninit<f32>) {
    let o = &o[..out.len()];
    if l > 0.0 {
        let inv = 1.0 / l;
        for (y, &x) in out.iter_mut().zip(o) {
            y.write(x * inv);
        }
        lse.write(m + l.ln());
    } else {
        // Exactly zero (not 0·o: o may hold 0·∞ = NaN from masked keys' values).
        for y in out.iter_mut() {
            y.write(0.0);
        }
        lse.write(f32::NEG_INFINITY);
    }
}
