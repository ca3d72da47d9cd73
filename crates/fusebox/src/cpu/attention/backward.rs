//! The causal attention backward from the saved logsumexp (FlashAttention-2 style).
//!
//! With `s_ij = scale·q_i·k_j` and the saved `lse_i`, the probabilities are recomputed
//! blockwise as `P_ij = e^(s_ij − lse_i)` (0 where masked), never stored whole. Then
//!
//! ```text
//!   dV_j  = Σ_i P_ij·dO_i
//!   dP_ij = dO_i·v_j
//!   D_i   = Σ_j P_ij·dP_ij = dO_i·O_i          (one dot per row, from the saved output)
//!   dS_ij = P_ij·(dP_ij − D_i)                 (softmax backward)
//!   dQ_i  = scale·Σ_j dS_ij·k_j
//!   dK_j  = scale·Σ_i dS_ij·q_i
//! ```
//!
//! and, with GQA, dK and dV of a kv head sum over its query group. One task per
//! (batch, kv head) walks the key blocks; for each it runs every query block of every
//! query head of the group that sees the block, accumulating dK, dV of the block in
//! scratch and dQ of the group's heads in a per-task buffer. No two tasks write the
//! same gradient, so no atomics and the result is deterministic. Accumulation is f32.

/// Query rows per block of the backward.
const BLOCK_Q: usize = 64;
/// Keys per block of the backward (its scratch holds five `[BLOCK_K][dp]` buffers).
const BLOCK_K: usize = 128;
use super::tiles::{self, TILE_ROWS};
use super::{Dims, Problem};
use crate::cpu::pool::SharedMut;
use crate::cpu::simd;
use crate::cpu::CpuBackend;

/// Writes `(dq, dk, dv)` (every element) of causal problem `p` given its output `o`,
/// logsumexp and `d_out`.
///
/// One task per (batch, kv head). When there are fewer kv heads than threads, each kv
/// head's key blocks are also split into contiguous ranges of about equal causal work:
/// a range's task owns dk, dv of its keys and writes its share of dq into a buffer of
/// its own; the shares are then summed in range order (deterministic for a fixed
/// thread count).
pub(super) fn backward(
    cpu: &CpuBackend,
    p: &Problem,
    o: &[f32],
    lse: &[f32],
    d_out: &[f32],
    (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
) {
    let Dims { batch, hq, hkv, tq, tk, d } = p.dims;
    let group = p.dims.group();
    let heads = batch * hkv;
    let key_blocks = tk.div_ceil(BLOCK_K);
    let splits = if heads >= cpu.threads() { 1 } else { cpu.threads().div_ceil(heads).min(key_blocks).max(1) };
    let ranges = split_key_blocks(p, splits);
    let group_len = group * tq * d;
    // dq shares of the key ranges, [heads][splits][group·Tq·D] (empty with one range).
    let mut shares = vec![0.0f32; if splits > 1 { heads * splits * group_len } else { 0 }];
    let (dq_ptr, dk_ptr, dv_ptr) = (SharedMut(dq.as_mut_ptr()), SharedMut(dk.as_mut_ptr()), SharedMut(dv.as_mut_ptr()));
    let share_ptr = SharedMut(shares.as_mut_ptr());
    cpu.for_each_index(heads * splits, group * tq * tk * d / splits, |task| {
        let (kv_head, split) = (task / splits, task % splits);
        let (kb_lo, kb_hi) = ranges[split];
        let (k_lo, k_hi) = (kb_lo * BLOCK_K, (kb_hi * BLOCK_K).min(tk));
        let bh0 = (kv_head / hkv) * hq + (kv_head % hkv) * group;
        // SAFETY: task (kv_head, split) alone writes dk and dv of keys k_lo..k_hi of its kv
        // head, and either dq of the group's query heads bh0 .. bh0 + group (one range)
        // or its own share buffer; all ranges are in bounds.
        let (dq_out, dk_out, dv_out) = unsafe {
            (
                if splits == 1 {
                    dq_ptr.slice(bh0 * tq * d, group_len)
                } else {
                    share_ptr.slice(task * group_len, group_len)
                },
                dk_ptr.slice((kv_head * tk + k_lo) * d, (k_hi - k_lo) * d),
                dv_ptr.slice((kv_head * tk + k_lo) * d, (k_hi - k_lo) * d),
            )
        };
        let mut ws = WORKSPACE.with(|w| w.take());
        let dp = p.dims.d.next_multiple_of(16);
        let mut blk = ws.block.take().filter(|b| b.kr.len() == BLOCK_K * dp).unwrap_or_else(|| KeyBlock::new(dp));
        let mut task = KvHeadBackward::new(p, kv_head, o, lse, d_out, &mut ws);
        task.run((kb_lo, kb_hi), dq_out, dk_out, dv_out, &mut blk);
        task.release(&mut ws);
        ws.block = Some(blk);
        WORKSPACE.with(|w| w.set(ws));
    });
    if splits > 1 {
        // dq of each group = Σ of its shares, in range order.
        cpu.for_each_chunk(dq, group_len, splits, |kv_head, dq_g| {
            dq_g.copy_from_slice(&shares[kv_head * splits * group_len..][..group_len]);
            for share in
                shares[kv_head * splits * group_len..(kv_head + 1) * splits * group_len].chunks_exact(group_len).skip(1)
            {
                for (y, &x) in dq_g.iter_mut().zip(share) {
                    *y += x;
                }
            }
        });
    }
}

/// `splits` contiguous ranges of key blocks with about equal work: key block `kb` is
/// seen by the `Tq − max(0, kb·BLOCK_K − (Tk − Tq))` last query rows.
fn split_key_blocks(p: &Problem, splits: usize) -> Vec<(usize, usize)> {
    let Dims { tq, tk, .. } = p.dims;
    let key_blocks = tk.div_ceil(BLOCK_K);
    let work = |kb: usize| (tq - (kb * BLOCK_K).saturating_sub(tk - tq).min(tq)).max(1);
    let total: usize = (0..key_blocks).map(work).sum();
    let mut ranges = Vec::with_capacity(splits);
    let (mut lo, mut done) = (0, 0);
    for s in 1..=splits {
        let target = total * s / splits;
        let mut hi = lo;
        while hi < key_blocks && (done < target || hi == lo) && key_blocks - hi > splits - s {
            done += work(hi);
            hi += 1;
        }
        if s == splits {
            while hi < key_blocks {
                done += work(hi);
                hi += 1;
            }
        }
        ranges.push((lo, hi));
        lo = hi;
    }
    ranges
}

/// The buffers of one backward task, reused by the next task on the same thread (and the
/// next call): a task allocates nothing, so the allocator neither faults fresh pages in nor
/// trims them (which measured 10% of the backward at T = 256, in page faults and TLB
/// shootdowns).
#[derive(Default)]
struct Workspace {
    qs: Vec<f32>,
    dos: Vec<f32>,
    dqa: Vec<f32>,
    lse: Vec<f32>,
    delta: Vec<f32>,
    block: Option<KeyBlock>,
}

thread_local! {
    /// Taken out while a task runs (a nested task would start a fresh one).
    static WORKSPACE: std::cell::Cell<Workspace> = std::cell::Cell::new(Workspace::default());
}

/// `v` cleared and refilled with `len` copies of `value` (keeping its allocation).
fn refill(mut v: Vec<f32>, len: usize, value: f32) -> Vec<f32> {
    v.clear();
    v.resize(len, value);
    v
}

/// The backward of one (batch, kv head) and its query group.
struct KvHeadBackward<'a> {
    p: &'a Problem<'a>,
    kv_head: usize,
    dp: usize,
    /// Rows per query head in the padded per-group buffers (a multiple of BLOCK_Q).
    tq_p: usize,
    /// `[group][tq_p][dp]`: scale·Q, dO, and the dQ accumulator (scaled at the end).
    qs: Vec<f32>,
    dos: Vec<f32>,
    dqa: Vec<f32>,
    /// `[group][tq_p]`: saved logsumexp and `D_i = dO_i·O_i`.
    lse: Vec<f32>,
    delta: Vec<f32>,
}

impl<'a> KvHeadBackward<'a> {
    fn new(p: &'a Problem<'a>, kv_head: usize, o: &[f32], lse: &[f32], d_out: &[f32], ws: &mut Workspace) -> Self {
        let Dims { hq, hkv, tq, d, .. } = p.dims;
        let group = p.dims.group();
        let dp = d.next_multiple_of(16);
        let tq_p = tq.div_ceil(BLOCK_Q) * BLOCK_Q;
        let bh0 = (kv_head / hkv) * hq + (kv_head % hkv) * group;
        let len = group * tq_p * dp;
        let mut qs = refill(std::mem::take(&mut ws.qs), len, 0.0);
        let mut dos = refill(std::mem::take(&mut ws.dos), len, 0.0);
        let mut lse_g = refill(std::mem::take(&mut ws.lse), group * tq_p, f32::NEG_INFINITY);
        let mut delta = refill(std::mem::take(&mut ws.delta), group * tq_p, 0.0);
        for h in 0..group {
            for i in 0..tq {
                let src = ((bh0 + h) * tq + i) * d;
                let dst = (h * tq_p + i) * dp;
                for (x, &y) in qs[dst..dst + d].iter_mut().zip(&p.q[src..src + d]) {
                    *x = y * p.scale;
                }
                dos[dst..dst + d].copy_from_slice(&d_out[src..src + d]);
                lse_g[h * tq_p + i] = lse[(bh0 + h) * tq + i];
                delta[h * tq_p + i] = simd::dot(&d_out[src..src + d], &o[src..src + d]);
            }
        }
        let dqa = refill(std::mem::take(&mut ws.dqa), len, 0.0);
        KvHeadBackward { p, kv_head, dp, tq_p, qs, dos, dqa, lse: lse_g, delta }
    }

    /// Returns the buffers to the workspace.
    fn release(self, ws: &mut Workspace) {
        (ws.qs, ws.dos, ws.dqa, ws.lse, ws.delta) = (self.qs, self.dos, self.dqa, self.lse, self.delta);
    }

    /// Runs key blocks `kb_lo..kb_hi`: writes dk, dv of their keys (`dk_out`, `dv_out`
    /// start at key `kb_lo·BLOCK_K`) and the group's dq from these keys (`dq_out`).
    fn run(
        &mut self,
        (kb_lo, kb_hi): (usize, usize),
        dq_out: &mut [f32],
        dk_out: &mut [f32],
        dv_out: &mut [f32],
        blk: &mut KeyBlock,
    ) {
        let Dims { tq, tk, d, .. } = self.p.dims;
        let dp = self.dp;
        let k_lo = kb_lo * BLOCK_K;
        for kb in kb_lo..kb_hi {
            let k0 = kb * BLOCK_K;
            let nk = BLOCK_K.min(tk - k0);
            blk.load(self.p, self.kv_head, k0, nk);
            // Query rows see key k0 from i = k0 − (Tk − Tq) on: earlier query blocks are skipped.
            let first_block = k0.saturating_sub(tk - tq) / BLOCK_Q;
            for h in 0..self.p.dims.group() {
                for qb in first_block..tq.div_ceil(BLOCK_Q) {
                    self.query_block(blk, h, qb * BLOCK_Q, k0, nk);
                }
            }
            for c in 0..nk {
                let row = (k0 - k_lo + c) * d..(k0 - k_lo + c + 1) * d;
                dk_out[row.clone()].copy_from_slice(&blk.dk[c * dp..c * dp + d]);
                dv_out[row].copy_from_slice(&blk.dv[c * dp..c * dp + d]);
            }
        }
        let group = self.p.dims.group();
        for h in 0..group {
            for i in 0..tq {
                let src = (h * self.tq_p + i) * dp;
                for (y, &x) in dq_out[(h * tq + i) * d..(h * tq + i + 1) * d].iter_mut().zip(&self.dqa[src..src + d]) {
                    *y = x * self.p.scale;
                }
            }
        }
    }

    /// Query rows `q0 .. q0 + BLOCK_Q` of group head `h` against key block `k0 .. k0 + nk`.
    fn query_block(&mut self, blk: &mut KeyBlock, h: usize, q0: usize, k0: usize, nk: usize) {
        let Dims { tq, .. } = self.p.dims;
        let dp = self.dp;
        let rows = BLOCK_Q.min(tq - q0);
        let rows_p = rows.next_multiple_of(TILE_ROWS);
        let tiles = rows_p / TILE_ROWS;
        let base = h * self.tq_p + q0;
        for r in 0..rows_p {
            blk.visible[r] = if r < rows { self.p.dims.visible(true, q0 + r).saturating_sub(k0).min(nk) } else { 0 };
        }
        for t in 0..tiles {
            // Visible counts grow with the row (padding rows aside): take the tile's max.
            let cols = blk.visible[t * TILE_ROWS..(t + 1) * TILE_ROWS].iter().fold(0, |a, &b| a.max(b));
            blk.q_ranges[t] = (0, cols);
        }
        let qs = &self.qs[base * dp..(base + rows_p) * dp];
        let dos = &self.dos[base * dp..(base + rows_p) * dp];
        let d = self.p.dims.d;
        let cols = &blk.q_ranges[..tiles];
        // S = (scale·Q)·Kᵀ and dP = dO·Vᵀ on the tiles the mask leaves visible.
        tiles::scores(&mut blk.p, BLOCK_K, qs, dp, d, &blk.kt, BLOCK_K, cols);
        tiles::scores(&mut blk.ds, BLOCK_K, dos, dp, d, &blk.vt, BLOCK_K, cols);
        // P = e^(S − lse); dS = P∘(dP − D); zero past the diagonal.
        tiles::probs_and_grads(
            &mut blk.p,
            &mut blk.ds,
            BLOCK_K,
            &blk.visible[..rows_p],
            &self.lse[base..base + rows_p],
            &self.delta[base..base + rows_p],
        );
        // Key row j of the block is seen by query rows i ≥ k0 + j − (Tk − Tq) − q0.
        let key_tiles = nk.div_ceil(TILE_ROWS);
        let shift = self.p.dims.tk - tq + q0;
        for t in 0..key_tiles {
            blk.k_ranges[t] = ((k0 + t * TILE_ROWS).saturating_sub(shift).min(rows), rows);
        }
        let k_ranges = &blk.k_ranges[..key_tiles];
        // dV += Pᵀ·dO and dK += dSᵀ·(scale·Q): A read transposed through its strides.
        tiles::accumulate_cols(&mut blk.dv, dp, &blk.p, BLOCK_K, dos, k_ranges, None);
        tiles::accumulate_cols(&mut blk.dk, dp, &blk.ds, BLOCK_K, qs, k_ranges, None);
        // dQ += dS·K (the factor `scale` is applied once at the end).
        let dq = &mut self.dqa[base * dp..(base + rows_p) * dp];
        tiles::accumulate_rows(dq, dp, &blk.ds, BLOCK_K, &blk.kr, &blk.q_ranges[..tiles], None);
    }
}

/// Scratch of one key block: K and V packed for the products, the dK/dV accumulators,
/// and a block of P and dS.
struct KeyBlock {
    /// `[dp][BLOCK_K]`: K and V transposed.
    kt: Vec<f32>,
    vt: Vec<f32>,
    /// `[BLOCK_K][dp]`: K rows, and the dK, dV accumulators.
    kr: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
    /// `[BLOCK_Q][BLOCK_K]`: probabilities, and dP turned into dS in place.
    p: Vec<f32>,
    ds: Vec<f32>,
    visible: [usize; BLOCK_Q],
    q_ranges: [(usize, usize); BLOCK_Q / TILE_ROWS],
    k_ranges: [(usize, usize); BLOCK_K / TILE_ROWS],
}

impl KeyBlock {
    fn new(dp: usize) -> KeyBlock {
        KeyBlock {
            kt: vec![0.0; dp * BLOCK_K],
            vt: vec![0.0; dp * BLOCK_K],
            kr: vec![0.0; BLOCK_K * dp],
            dk: vec![0.0; BLOCK_K * dp],
            dv: vec![0.0; BLOCK_K * dp],
            p: vec![0.0; BLOCK_Q * BLOCK_K],
            ds: vec![0.0; BLOCK_Q * BLOCK_K],
            visible: [0; BLOCK_Q],
            q_ranges: [(0, 0); BLOCK_Q / TILE_ROWS],
            k_ranges: [(0, 0); BLOCK_K / TILE_ROWS],
        }
    }

    /// Packs keys `k0 .. k0 + nk` of `kv_head` (zeros past `nk`) and clears dK, dV.
    fn load(&mut self, p: &Problem, kv_head: usize, k0: usize, nk: usize) {
        let d = p.dims.d;
        let dp = self.kr.len() / BLOCK_K;
        if nk < BLOCK_K {
            self.kt.fill(0.0);
            self.vt.fill(0.0);
            self.kr.fill(0.0);
        }
        let start = kv_head * p.kv_stride + k0 * d;
        // The rows are first copied in order (a sequential read the hardware prefetches),
        // then transposed from cache: transposing straight from memory stalled on every
        // strided miss. V's rows pass through the dV buffer before it is cleared.
        for c in 0..nk {
            self.kr[c * dp..c * dp + d].copy_from_slice(&p.k[start + c * d..start + (c + 1) * d]);
            self.dv[c * dp..c * dp + d].copy_from_slice(&p.v[start + c * d..start + (c + 1) * d]);
        }
        simd::transpose_into(&self.kr, dp, nk, d, &mut self.kt, BLOCK_K);
        simd::transpose_into(&self.dv, dp, nk, d, &mut self.vt, BLOCK_K);
        self.dk.fill(0.0);
        self.dv.fill(0.0);
    }
}
