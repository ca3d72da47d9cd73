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
//! and, with GQA, dK and dV of a kv head sum over its query group. With a sliding
//! window of W keys, P is 0 outside each row's window and a key block runs only the
//! query blocks whose rows see it (cost O(T·W)). One task per
//! (batch, kv head) walks the key blocks; for each it runs every query block of every
//! query head of the group that sees the block, accumulating dK, dV of the block and dQ
//! of the group's heads straight into the (zeroed) outputs, or into padded scratch when
//! D or Tq do not fit the register tiles. No two tasks write the same gradient, so no
//! atomics and the result is deterministic. Accumulation is f32. The kernels keep the
//! scores unscaled (`q·k`) and fold `scale` into dS once, so neither Q nor the
//! gradients are rescaled in a pass of their own.
//!
//! Attention sinks change nothing above: the saved `lse_i` includes the sink's term, so
//! `P_ij = e^(s_ij − lse_i)` are already the probabilities with the sink, and the sink
//! (a score with no value, so `dP = 0` for it) adds nothing to `D_i`. Its own gradient,
//! `dsink_h = Σ_{b,i} P_sink·(0 − D_i) = −Σ_{b,i} e^(s_h − lse_i)·D_i`, is
//! [`sink_gradients`].

/// Query rows per block of the backward.
const BLOCK_Q: usize = 64;
/// Keys per block of the backward (its scratch holds six `[BLOCK_K][dp]` buffers).
const BLOCK_K: usize = 128;
use std::borrow::Cow;
use std::mem::MaybeUninit;

use super::tiles::{self, TILE_ROWS};
use super::{Dims, Problem};
use crate::cpu::convert::init_default;
use crate::cpu::pool::SharedMut;
use crate::cpu::simd;
use crate::cpu::CpuBackend;

/// An uninitialized output buffer.
type Slots<'a> = &'a mut [MaybeUninit<f32>];

/// Writes every element of the gradients `(dq, dk, dv)` of causal problem `p`, given its
/// output `o`, logsumexp and `d_out`. The buffers come uninitialized: each task zeroes
/// the rows it owns just before accumulating into them (while they are in its cache,
/// instead of a zeroing pass over all of them beforehand).
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
    (dq, dk, dv): (Slots, Slots, Slots),
) {
    let Dims { batch, hq, hkv, tq, tk, d, .. } = p.dims;
    let group = p.dims.group();
    let heads = batch * hkv;
    let key_blocks = tk.div_ceil(BLOCK_K);
    let splits = if heads >= cpu.threads() { 1 } else { cpu.threads().div_ceil(heads).min(key_blocks).max(1) };
    let ranges = split_key_blocks(p, splits);
    let group_len = group * tq * d;
    // dq shares of the key ranges, [heads][splits][group·Tq·D] (empty with one range);
    // task t initializes share t.
    let shares_len = if splits > 1 { heads * splits * group_len } else { 0 };
    let mut shares: Vec<f32> = Vec::with_capacity(shares_len);
    let share_slots = &mut shares.spare_capacity_mut()[..shares_len];
    let (dq_ptr, dk_ptr, dv_ptr) = (SharedMut(dq.as_mut_ptr()), SharedMut(dk.as_mut_ptr()), SharedMut(dv.as_mut_ptr()));
    let share_ptr = SharedMut(share_slots.as_mut_ptr());
    // Keys a query row sees: all of them, or a window.
    let span = p.window.map_or(tk, |w| w.min(tk));
    cpu.for_each_index(heads * splits, group * tq * span * d / splits, |task| {
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
        let dq_out = init_default(dq_out);
        let mut ws = WORKSPACE.with(|w| w.take());
        let dp = p.dims.d.next_multiple_of(16);
        let mut blk = ws.block.take().filter(|b| b.kr.len() == BLOCK_K * dp).unwrap_or_else(|| KeyBlock::new(dp));
        let mut grads = ws.grads.take().filter(|g| g.dk.len() == BLOCK_K * dp).unwrap_or_else(|| KeyGrads::new(dp));
        let mut task = KvHeadBackward::new(p, kv_head, o, lse, d_out, &mut ws);
        task.run((kb_lo, kb_hi), dq_out, dk_out, dv_out, &mut blk, &mut grads);
        task.release(&mut ws);
        (ws.block, ws.grads) = (Some(blk), Some(grads));
        WORKSPACE.with(|w| w.set(ws));
    });
    if splits > 1 {
        // SAFETY: the tasks above initialized every share (task t wrote all of share t).
        unsafe { shares.set_len(shares_len) };
        // dq of each group = Σ of its shares, in range order.
        cpu.for_each_chunk(dq, group_len, splits, |kv_head, dq_g| {
            let mut parts =
                shares[kv_head * splits * group_len..(kv_head + 1) * splits * group_len].chunks_exact(group_len);
            let dq_g = dq_g.write_copy_of_slice(parts.next().unwrap_or(&[]));
            for share in parts {
                for (y, &x) in dq_g.iter_mut().zip(share) {
                    *y += x;
                }
            }
        });
    }
}

/// The attention sinks' gradient `[Hq]`: `dsink_h = −Σ_{b,i} e^(s_h − lse_{b,h,i})·D_{b,h,i}`
/// with `D = dO·O` per query row (`o`, `d_out`: `[B, Hq, Tq, D]`; `lse`: `[B, Hq, Tq]`).
/// A row whose `lse` is −∞ (no key and a sink of −∞) has no sink weight and adds 0. The
/// sum runs over b, then i, in f64 (one task per head: deterministic).
pub(super) fn sink_gradients(
    cpu: &CpuBackend,
    dims: &Dims,
    sinks: &[f32],
    lse: &[f32],
    o: &[f32],
    d_out: &[f32],
) -> Vec<f32> {
    let Dims { batch, hq, tq, d, .. } = *dims;
    let mut dsinks = vec![0.0f32; hq];
    cpu.for_each_chunk(&mut dsinks, 1, batch * tq * d, |h, slot| {
        let mut sum = 0.0f64;
        for b in 0..batch {
            for i in 0..tq {
                let row = (b * hq + h) * tq + i;
                if lse[row] == f32::NEG_INFINITY {
                    continue;
                }
                let weight = (sinks[h] as f64 - lse[row] as f64).exp();
                let delta = simd::dot(&d_out[row * d..(row + 1) * d], &o[row * d..(row + 1) * d]);
                sum += weight * delta as f64;
            }
        }
        slot[0] = -sum as f32;
    });
    dsinks
}

/// `splits` contiguous ranges of key blocks with about equal work: key block `kb` is
/// seen by the query rows of [`rows_seeing`].
fn split_key_blocks(p: &Problem, splits: usize) -> Vec<(usize, usize)> {
    let tk = p.dims.tk;
    let key_blocks = tk.div_ceil(BLOCK_K);
    let work = |kb: usize| {
        let (lo, hi) = rows_seeing(p, kb * BLOCK_K, (kb * BLOCK_K + BLOCK_K).min(tk));
        hi.saturating_sub(lo).max(1)
    };
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

/// The query rows `lo .. hi` that see some key of `k0 .. k1` (`k0 < k1`): key `j` is
/// seen by rows `j − (Tk − Tq) ..< j + W − (Tk − Tq)` (up to Tq without a window).
fn rows_seeing(p: &Problem, k0: usize, k1: usize) -> (usize, usize) {
    let Dims { tq, tk, .. } = p.dims;
    let off = tk - tq;
    let lo = k0.saturating_sub(off).min(tq);
    let hi = match p.window {
        Some(w) => (k1 - 1).saturating_add(w).saturating_sub(off).min(tq),
        None => tq,
    };
    (lo, hi.max(lo))
}

/// The buffers of one backward task, reused by the next task on the same thread (and the
/// next call): a task allocates nothing, so the allocator neither faults fresh pages in nor
/// trims them (page faults and TLB shootdowns, a tenth of the backward at T = 256).
#[derive(Default)]
struct Workspace {
    qs: Vec<f32>,
    dos: Vec<f32>,
    dqa: Vec<f32>,
    lse: Vec<f32>,
    delta: Vec<f32>,
    block: Option<KeyBlock>,
    grads: Option<KeyGrads>,
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
///
/// The group's rows of Q, dO and dQ are `[group][tq_p][dp]`. When no padding is needed
/// (D a multiple of 16 and Tq of [`BLOCK_Q`]) that is exactly their layout in the inputs
/// and in the (zeroed) dq output, so Q and dO are read and dQ is accumulated in place;
/// otherwise they are zero-padded copies in the workspace.
struct KvHeadBackward<'a> {
    p: &'a Problem<'a>,
    kv_head: usize,
    dp: usize,
    /// Rows per query head in the group's buffers (a multiple of BLOCK_Q).
    tq_p: usize,
    /// Q and dO of the group (unscaled: the score scale is folded into dS).
    qs: Cow<'a, [f32]>,
    dos: Cow<'a, [f32]>,
    /// The padded dQ accumulator; `None` when dQ is accumulated in the output.
    dqa: Option<Vec<f32>>,
    /// `[group][tq_p]`: saved logsumexp and `D_i = dO_i·O_i`.
    lse: Vec<f32>,
    delta: Vec<f32>,
}

impl<'a> KvHeadBackward<'a> {
    fn new(p: &'a Problem<'a>, kv_head: usize, o: &[f32], lse: &[f32], d_out: &'a [f32], ws: &mut Workspace) -> Self {
        let Dims { hq, hkv, tq, d, .. } = p.dims;
        let group = p.dims.group();
        let dp = d.next_multiple_of(16);
        let tq_p = tq.div_ceil(BLOCK_Q) * BLOCK_Q;
        let bh0 = (kv_head / hkv) * hq + (kv_head % hkv) * group;
        let rows = bh0 * tq * d..(bh0 + group) * tq * d;
        let (qs, dos, dqa) = if d == dp && tq == tq_p {
            (Cow::Borrowed(&p.q[rows.clone()]), Cow::Borrowed(&d_out[rows]), None)
        } else {
            let len = group * tq_p * dp;
            let mut qs = refill(std::mem::take(&mut ws.qs), len, 0.0);
            let mut dos = refill(std::mem::take(&mut ws.dos), len, 0.0);
            for h in 0..group {
                for i in 0..tq {
                    let (src, dst) = (((bh0 + h) * tq + i) * d, (h * tq_p + i) * dp);
                    qs[dst..dst + d].copy_from_slice(&p.q[src..src + d]);
                    dos[dst..dst + d].copy_from_slice(&d_out[src..src + d]);
                }
            }
            (Cow::Owned(qs), Cow::Owned(dos), Some(refill(std::mem::take(&mut ws.dqa), len, 0.0)))
        };
        let mut lse_g = refill(std::mem::take(&mut ws.lse), group * tq_p, f32::NEG_INFINITY);
        let mut delta = refill(std::mem::take(&mut ws.delta), group * tq_p, 0.0);
        for h in 0..group {
            for i in 0..tq {
                let src = ((bh0 + h) * tq + i) * d;
                lse_g[h * tq_p + i] = lse[(bh0 + h) * tq + i];
                delta[h * tq_p + i] = simd::dot(&d_out[src..src + d], &o[src..src + d]);
            }
        }
        KvHeadBackward { p, kv_head, dp, tq_p, qs, dos, dqa, lse: lse_g, delta }
    }

    /// Returns the buffers to the workspace.
    fn release(self, ws: &mut Workspace) {
        if let Cow::Owned(v) = self.qs {
            ws.qs = v;
        }
        if let Cow::Owned(v) = self.dos {
            ws.dos = v;
        }
        if let Some(v) = self.dqa {
            ws.dqa = v;
        }
        (ws.lse, ws.delta) = (self.lse, self.delta);
    }

    /// Runs key blocks `kb_lo..kb_hi`: writes dk, dv of their keys (every element of
    /// `dk_out`, `dv_out`, which start at key `kb_lo·BLOCK_K`; each block's rows are zeroed
    /// just before its accumulation, while they stay in cache) and adds the group's dq
    /// from these keys into `dq_out` (zeroed).
    fn run(
        &mut self,
        (kb_lo, kb_hi): (usize, usize),
        dq_out: &mut [f32],
        dk_out: &mut [MaybeUninit<f32>],
        dv_out: &mut [MaybeUninit<f32>],
        blk: &mut KeyBlock,
        grads: &mut KeyGrads,
    ) {
        let Dims { tq, tk, d, .. } = self.p.dims;
        let dp = self.dp;
        let k_lo = kb_lo * BLOCK_K;
        let mut dqa = self.dqa.take();
        for kb in kb_lo..kb_hi {
            let k0 = kb * BLOCK_K;
            let nk = BLOCK_K.min(tk - k0);
            blk.load(self.p, self.kv_head, k0, nk);
            // dK and dV go straight into the outputs when their rows are the kernels'
            // (D a multiple of 16) and the block is whole register tiles of keys.
            let direct = d == dp && nk.is_multiple_of(TILE_ROWS);
            let out_rows = (k0 - k_lo) * d..(k0 - k_lo + nk) * d;
            let (dk, dv) = if direct {
                (init_default(&mut dk_out[out_rows.clone()]), init_default(&mut dv_out[out_rows.clone()]))
            } else {
                grads.dk.fill(0.0);
                grads.dv.fill(0.0);
                (&mut grads.dk[..], &mut grads.dv[..])
            };
            let dq: &mut [f32] = dqa.as_deref_mut().unwrap_or(dq_out);
            // Only the query blocks holding rows that see this key block run: rows see key
            // k0 from i = k0 − (Tk − Tq) on, and (with a window) key k0 + nk − 1 until
            // i = k0 + nk − 1 + W − (Tk − Tq).
            let (lo, hi) = rows_seeing(self.p, k0, k0 + nk);
            for h in 0..self.p.dims.group() {
                for qb in lo / BLOCK_Q..hi.div_ceil(BLOCK_Q) {
                    self.query_block(blk, (&mut *dk, &mut *dv), &mut *dq, h, qb * BLOCK_Q, k0, nk);
                }
            }
            if !direct {
                for c in 0..nk {
                    let row = (k0 - k_lo + c) * d..(k0 - k_lo + c + 1) * d;
                    dk_out[row.clone()].write_copy_of_slice(&grads.dk[c * dp..c * dp + d]);
                    dv_out[row].write_copy_of_slice(&grads.dv[c * dp..c * dp + d]);
                }
            }
        }
        if let Some(dqa) = dqa {
            for h in 0..self.p.dims.group() {
                for i in 0..tq {
                    let src = (h * self.tq_p + i) * dp;
                    dq_out[(h * tq + i) * d..(h * tq + i + 1) * d].copy_from_slice(&dqa[src..src + d]);
                }
            }
            self.dqa = Some(dqa);
        }
    }

    /// Query rows `q0 .. q0 + BLOCK_Q` of group head `h` against key block `k0 .. k0 + nk`,
    /// adding into the block's `(dk, dv)` (rows of `dp`) and the group's `dq`.
    #[allow(clippy::too_many_arguments)]
    fn query_block(
        &self,
        blk: &mut KeyBlock,
        (dk, dv): (&mut [f32], &mut [f32]),
        dq: &mut [f32],
        h: usize,
        q0: usize,
        k0: usize,
        nk: usize,
    ) {
        let Dims { tq, .. } = self.p.dims;
        let dp = self.dp;
        let rows = BLOCK_Q.min(tq - q0);
        let rows_p = rows.next_multiple_of(TILE_ROWS);
        let tiles = rows_p / TILE_ROWS;
        let base = h * self.tq_p + q0;
        for r in 0..rows_p {
            blk.visible[r] = if r < rows {
                let (lo, hi) = self.p.keys(q0 + r);
                let hi = hi.saturating_sub(k0).min(nk);
                (lo.saturating_sub(k0).min(hi), hi)
            } else {
                (nk, 0)
            };
        }
        for t in 0..tiles {
            // The keys some row of the tile sees (padding rows see none).
            let rows_t = &blk.visible[t * TILE_ROWS..(t + 1) * TILE_ROWS];
            let lo = rows_t.iter().fold(nk, |a, &(lo, _)| a.min(lo));
            let hi = rows_t.iter().fold(0, |a, &(_, hi)| a.max(hi));
            blk.q_ranges[t] = (lo.min(hi), hi);
        }
        let qs = &self.qs[base * dp..(base + rows_p) * dp];
        let dos = &self.dos[base * dp..(base + rows_p) * dp];
        let d = self.p.dims.d;
        let cols = &blk.q_ranges[..tiles];
        // S = Q·Kᵀ and dP = dO·Vᵀ on the tiles the mask leaves visible.
        tiles::scores(&mut blk.p, BLOCK_K, qs, dp, d, &blk.kt, BLOCK_K, cols);
        tiles::scores(&mut blk.ds, BLOCK_K, dos, dp, d, &blk.vt, BLOCK_K, cols);
        // P = e^(scale·S − lse); dS = scale·P∘(dP − D); zero past the diagonal.
        tiles::probs_and_grads(
            &mut blk.p,
            &mut blk.ds,
            BLOCK_K,
            &blk.visible[..rows_p],
            &self.lse[base..base + rows_p],
            &self.delta[base..base + rows_p],
            self.p.scale,
        );
        // The query rows of this block that see some key of each key tile.
        let key_tiles = nk.div_ceil(TILE_ROWS);
        for t in 0..key_tiles {
            let (lo, hi) = rows_seeing(self.p, k0 + t * TILE_ROWS, (k0 + t * TILE_ROWS + TILE_ROWS).min(k0 + nk));
            let hi = hi.saturating_sub(q0).min(rows);
            blk.k_ranges[t] = (lo.saturating_sub(q0).min(hi), hi);
        }
        let k_ranges = &blk.k_ranges[..key_tiles];
        // dV += Pᵀ·dO and dK += dSᵀ·Q: A read transposed through its strides.
        tiles::accumulate_cols(dv, dp, &blk.p, BLOCK_K, dos, k_ranges, None);
        tiles::accumulate_cols(dk, dp, &blk.ds, BLOCK_K, qs, k_ranges, None);
        // dQ += dS·K.
        let dq = &mut dq[base * dp..(base + rows_p) * dp];
        tiles::accumulate_rows(dq, dp, &blk.ds, BLOCK_K, &blk.kr, &blk.q_ranges[..tiles], None);
    }
}

/// Scratch of one key block: K and V packed for the products, and a block of P and dS.
struct KeyBlock {
    /// `[dp][BLOCK_K]`: K and V transposed.
    kt: Vec<f32>,
    vt: Vec<f32>,
    /// `[BLOCK_K][dp]`: K rows (read by dQ += dS·K), and V rows on their way to `vt`.
    kr: Vec<f32>,
    vr: Vec<f32>,
    /// `[BLOCK_Q][BLOCK_K]`: probabilities, and dP turned into dS in place.
    p: Vec<f32>,
    ds: Vec<f32>,
    /// Per query row: the keys `lo .. hi` of the block it sees.
    visible: [(usize, usize); BLOCK_Q],
    q_ranges: [(usize, usize); BLOCK_Q / TILE_ROWS],
    k_ranges: [(usize, usize); BLOCK_K / TILE_ROWS],
}

/// The dK, dV accumulators `[BLOCK_K][dp]` of a key block whose rows cannot be
/// accumulated in the outputs directly (D not a multiple of 16, or a partial tile).
struct KeyGrads {
    dk: Vec<f32>,
    dv: Vec<f32>,
}

impl KeyGrads {
    fn new(dp: usize) -> KeyGrads {
        KeyGrads { dk: vec![0.0; BLOCK_K * dp], dv: vec![0.0; BLOCK_K * dp] }
    }
}

impl KeyBlock {
    fn new(dp: usize) -> KeyBlock {
        KeyBlock {
            kt: vec![0.0; dp * BLOCK_K],
            vt: vec![0.0; dp * BLOCK_K],
            kr: vec![0.0; BLOCK_K * dp],
            vr: vec![0.0; BLOCK_K * dp],
            p: vec![0.0; BLOCK_Q * BLOCK_K],
            ds: vec![0.0; BLOCK_Q * BLOCK_K],
            visible: [(0, 0); BLOCK_Q],
            q_ranges: [(0, 0); BLOCK_Q / TILE_ROWS],
            k_ranges: [(0, 0); BLOCK_K / TILE_ROWS],
        }
    }

    /// Packs keys `k0 .. k0 + nk` of `kv_head` (zeros past `nk`).
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
        // strided miss.
        for c in 0..nk {
            self.kr[c * dp..c * dp + d].copy_from_slice(&p.k[start + c * d..start + (c + 1) * d]);
            self.vr[c * dp..c * dp + d].copy_from_slice(&p.v[start + c * d..start + (c + 1) * d]);
        }
        simd::transpose_into(&self.kr, dp, nk, d, &mut self.kt, BLOCK_K);
        simd::transpose_into(&self.vr, dp, nk, d, &mut self.vt, BLOCK_K);
    }
}
