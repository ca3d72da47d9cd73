//! What differs between the passes a block runs in, and nothing else: where the
//! positions, keys and values come from and go, and whether activations are saved.
//!
//! | pass | rows | positions | keys and values | saves |
//! |---|---|---|---|---|
//! | [`Pass::Train`] | `[B, T]` | `0..T` | this call's only | every block's activations |
//! | [`Pass::Cached`] | `[1, T]` | `pos..pos+T` | appended to one cache, read from it | nothing |
//! | [`Pass::Batch`] | `[N, 1]` | each row its own | each row appended to its own cache | nothing |
//!
//! A linear-attention layer has no keys and values: it carries the last inputs of its
//! convolution and its delta-rule state from token to token instead ([`LinearState`]),
//! which a pass at position 0 starts from zero and the others continue.

use fusebox::{CausalAttentionResult, ComputeBackend, DType, Error, Result, Tensor};

use super::arch::{Arch, Positions};
use super::cache::{KvCache, LinearState, RopeTables};
use super::checkpointing::SavedLayers;

/// Up to this many new tokens after a cache, a cached pass attends with each query on
/// its own, as one-token decode steps do (see [`Pass::attend`]).
const ROW_QUERIES: usize = 16;

/// How a block runs (see the module table).
pub(super) enum Pass<'a, 'c> {
    /// Training: positions `0..T` of every sequence; each block's activations pushed
    /// onto `saved` for the backward (which keeps what its mode says).
    Train { rope: &'a RopeTables, saved: &'a mut SavedLayers },
    /// One sequence's new tokens at positions `pos..` of its cache.
    Cached { cache: &'a mut KvCache, pos: usize },
    /// One new token per sequence, row `i` at position `positions[i]` of `caches[i]`.
    /// `rope` holds the rows `positions` of the global (0) and local (1) rope tables,
    /// gathered once per step when a layer first needs them.
    Batch { caches: &'a mut [&'c mut KvCache], positions: &'a [usize], rope: &'a mut [Option<(Tensor, Tensor)>; 2] },
}

impl Pass<'_, '_> {
    /// `[B, T, H·hd]` → the attention layout `[B, H, T, hd]`. A batch step's `N` rows
    /// are laid out as the `N` positions of one sequence, `[1, H, N, hd]`, so that
    /// rope reads row `i`'s angle from row `i` of its gathered table.
    pub(super) fn split_heads(&self, b: &dyn ComputeBackend, x: &Tensor, heads: usize) -> Result<Tensor> {
        match (self, x.dims()) {
            (Pass::Batch { .. }, &[n, 1, width]) => b.split_heads(&x.reshape([1, n, width])?, heads),
            // One position: the two orders are the same memory, so a reshape.
            (_, &[bsz, 1, width]) if heads > 0 && width % heads == 0 => x.reshape([bsz, heads, 1, width / heads]),
            _ => b.split_heads(x, heads),
        }
    }

    /// The learned position embeddings of the pass's positions added to `x` `[B, T, D]`.
    pub(super) fn add_positions(&self, b: &dyn ComputeBackend, x: &Tensor, wpe: &Tensor) -> Result<Tensor> {
        let (bsz, t, d) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let offset = match self {
            Pass::Train { .. } => 0,
            Pass::Cached { pos, .. } => *pos,
            Pass::Batch { positions, .. } => {
                let rows = b.index_select(wpe, &position_ids(b, positions)?)?;
                return b.add(x, &rows.reshape([bsz, 1, d])?);
            }
        };
        let rows = b.slice_rows(wpe, offset, t)?;
        b.add_row(&x.reshape([bsz, t * d])?, &rows.reshape([t * d])?)?.reshape([bsz, t, d])
    }

    /// `q` and `k` rotated to the pass's positions with layer `l`'s rope (unchanged for
    /// learned positions).
    pub(super) fn rope(
        &mut self,
        b: &dyn ComputeBackend,
        arch: &Arch,
        l: usize,
        q: Tensor,
        k: Tensor,
    ) -> Result<(Tensor, Tensor)> {
        if arch.positions != Positions::Rope {
            return Ok((q, k));
        }
        let style = arch.rope_of(l).style;
        let ((cos, sin), offset) = match self {
            Pass::Train { rope, .. } => (rope.of(l)?, 0),
            Pass::Cached { cache, pos } => (cache.rope.of(l)?, *pos),
            Pass::Batch { caches, positions, rope } => {
                let table = &mut rope[usize::from(caches[0].rope.is_local(l))];
                if table.is_none() {
                    *table = Some(gather_rope_rows(b, caches, positions, l)?);
                }
                let (cos, sin) = table.as_ref().ok_or_else(|| Error::value("rope", "tables", "gathered", "none"))?;
                ((cos, sin), 0)
            }
        };
        Ok((b.rope(&q, cos, sin, style, offset)?, b.rope(&k, cos, sin, style, offset)?))
    }

    /// Attention of layer `l` for `q`, `k`, `v` in the attention layout (with the
    /// layer's sink logits `[Hq]` when it has them): the pass's
    /// keys and values written where it keeps them, then the heads of the output merged,
    /// `[B, T, Hq·hd]`; in training also the result the backward needs.
    ///
    /// Training and a prompt (at position 0) run the fused causal attention over this
    /// call's keys; later tokens `decode_attention` over the first `pos + T` cached
    /// positions (up to `ROW_QUERIES` of them each query alone, over its own prefix,
    /// with the one-token step's arithmetic); a batch step `batched_decode_attention`, each row over its own cache.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend(
        &mut self,
        b: &dyn ComputeBackend,
        arch: &Arch,
        l: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        sinks: Option<&Tensor>,
    ) -> Result<(Tensor, Option<CausalAttentionResult>)> {
        let (window, scale) = (arch.window(l), arch.attn_scale);
        match self {
            Pass::Train { .. } => {
                let r = b.causal_attention(q, k, v, window, sinks, scale)?;
                Ok((merge_heads(b, &r.output)?, Some(r)))
            }
            Pass::Cached { cache, pos } => {
                b.write_head_cache(&mut cache.k[l], k, *pos)?;
                b.write_head_cache(&mut cache.v[l], v, *pos)?;
                let t = q.dims()[2];
                let out = if *pos == 0 {
                    b.causal_attention(q, k, v, window, sinks, scale)?.output
                } else if (2..=ROW_QUERIES).contains(&t) {
                    // A few tokens after the cache (a speculative draft's verification):
                    // each query as the one-token decode step at its position would run
                    // it, so that its logits have that step's bits.
                    let width = arch.n_heads * arch.head_dim;
                    let q = b.split_heads(&b.merge_heads(q)?.reshape([t, 1, width])?, arch.n_heads)?;
                    let lens: Vec<usize> = (1..=t).map(|i| *pos + i).collect();
                    let (kc, vc) = (vec![&cache.k[l]; t], vec![&cache.v[l]; t]);
                    let out = b.batched_decode_attention(&q, &kc, &vc, &lens, window, sinks, scale)?;
                    return Ok((merge_heads(b, &out)?.reshape([1, t, width])?, None));
                } else {
                    b.decode_attention(q, &cache.k[l], &cache.v[l], *pos + q.dims()[2], window, sinks, scale)?
                };
                Ok((merge_heads(b, &out)?, None))
            }
            Pass::Batch { caches, positions, .. } => {
                let n = positions.len();
                for (i, c) in caches.iter_mut().enumerate() {
                    b.write_head_cache(&mut c.k[l], &b.slice(k, 2, i, 1)?, positions[i])?;
                    b.write_head_cache(&mut c.v[l], &b.slice(v, 2, i, 1)?, positions[i])?;
                }
                // `[1, Hq, N, hd]` → `[N, Hq, 1, hd]`: one query per sequence.
                let width = arch.n_heads * arch.head_dim;
                let q = b.split_heads(&b.merge_heads(q)?.reshape([n, 1, width])?, arch.n_heads)?;
                let lens: Vec<usize> = positions.iter().map(|p| p + 1).collect();
                let kc: Vec<&Tensor> = caches.iter().map(|c| &c.k[l]).collect();
                let vc: Vec<&Tensor> = caches.iter().map(|c| &c.v[l]).collect();
                let out = b.batched_decode_attention(&q, &kc, &vc, &lens, window, sinks, scale)?;
                Ok((merge_heads(b, &out)?, None))
            }
        }
    }
}

impl Pass<'_, '_> {
    /// Layer `l`'s causal depthwise convolution (then SiLU) of `x` `[B, C, T]` with
    /// weights `w` `[C, K]`: training and a prompt at position 0 see zeros before
    /// their first input; later tokens continue from the inputs the state keeps, which
    /// are then replaced by the last `K − 1` inputs.
    pub(super) fn linear_conv(
        &mut self,
        b: &dyn ComputeBackend,
        l: usize,
        x: &Tensor,
        w: &Tensor,
        bias: &Tensor,
    ) -> Result<Tensor> {
        let keep = w.dims()[1].saturating_sub(1);
        match self {
            Pass::Train { .. } => b.depthwise_conv1d_silu(x, w, bias),
            Pass::Cached { cache, pos } => {
                let state = linear_state(cache, l)?;
                let prev = if *pos == 0 { b.zeros(state.conv.shape(), DType::F32)? } else { state.conv.clone() };
                let y = b.depthwise_conv1d_silu_ctx(&prev, x, w, bias)?;
                state.conv = last_inputs(b, &prev, x, keep)?;
                Ok(y)
            }
            Pass::Batch { caches, positions, .. } => {
                // Row i of x `[N, C, 1]` continues sequence i: its previous inputs stacked
                // `[N, C, K − 1]` (zeros for a sequence at position 0).
                let prev = caches
                    .iter_mut()
                    .zip(positions.iter())
                    .map(|(c, &p)| {
                        let s = linear_state(c, l)?;
                        if p == 0 {
                            b.zeros(s.conv.shape(), DType::F32)
                        } else {
                            Ok(s.conv.clone())
                        }
                    })
                    .collect::<Result<Vec<_>>>()?;
                let prev = b.concat(&prev, 0)?;
                let y = b.depthwise_conv1d_silu_ctx(&prev, x, w, bias)?;
                let next = last_inputs(b, &prev, x, keep)?;
                for (i, c) in caches.iter_mut().enumerate() {
                    linear_state(c, l)?.conv = b.slice(&next, 0, i, 1)?;
                }
                Ok(y)
            }
        }
    }

    /// Layer `l`'s gated delta rule on `[q, k, v, g, β]` (`[B, T, Hk, dk]` twice,
    /// `[B, T, Hv, dv]`, `[B, T, Hv]` twice) → `[B, T, Hv, dv]`: chunked from a zero
    /// state in training and for a prompt at position 0, chunked from the kept state for
    /// a later prompt, and the recurrent step (the state updated in place) for one token.
    pub(super) fn delta_rule(
        &mut self,
        b: &dyn ComputeBackend,
        l: usize,
        [q, k, v, g, beta]: [&Tensor; 5],
        scale: f32,
    ) -> Result<Tensor> {
        let (bsz, t, hv, dv) = (v.dims()[0], v.dims()[1], v.dims()[2], v.dims()[3]);
        // One token per row: `[N, 1, H, d]` → `[N, H, d]` for the recurrent step.
        let step = |x: &Tensor| {
            let d = x.dims();
            x.reshape(if d.len() == 4 { vec![d[0], d[2], d[3]] } else { vec![d[0], d[2]] })
        };
        match self {
            Pass::Train { .. } => Ok(b.gated_delta_rule(q, k, v, g, beta, None, scale)?.out),
            Pass::Cached { cache, pos } => {
                let state = linear_state(cache, l)?;
                if *pos > 0 && t == 1 {
                    let out = b.gated_delta_rule_step(
                        &step(q)?,
                        &step(k)?,
                        &step(v)?,
                        &step(g)?,
                        &step(beta)?,
                        &mut state.delta,
                        scale,
                    )?;
                    return out.reshape([bsz, 1, hv, dv]);
                }
                let init = (*pos > 0).then_some(&state.delta);
                let r = b.gated_delta_rule(q, k, v, g, beta, init, scale)?;
                state.delta = r.state;
                Ok(r.out)
            }
            Pass::Batch { caches, positions, .. } => {
                let mut states = Vec::with_capacity(caches.len());
                for (c, &p) in caches.iter_mut().zip(positions.iter()) {
                    let s = &mut linear_state(c, l)?.delta;
                    if p == 0 {
                        b.fill(s, 0.0)?;
                    }
                    states.push(s);
                }
                let out = b.batched_gated_delta_rule_step(
                    &step(q)?,
                    &step(k)?,
                    &step(v)?,
                    &step(g)?,
                    &step(beta)?,
                    &mut states,
                    scale,
                )?;
                out.reshape([bsz, 1, hv, dv])
            }
        }
    }
}

/// Layer `l`'s linear-attention state in `cache`, or an error naming the layer.
fn linear_state(cache: &mut KvCache, l: usize) -> Result<&mut LinearState> {
    cache.linear.get_mut(l).and_then(Option::as_mut).ok_or_else(|| {
        Error::value("Transformer::forward_cached", "cache", format!("a linear state for layer {l}"), "none")
    })
}

/// The last `keep` inputs of `[prev, x]` along time (`[B, C, K − 1]` and `[B, C, T]` →
/// `[B, C, keep]`): what the convolution needs of the past at the next token.
fn last_inputs(b: &dyn ComputeBackend, prev: &Tensor, x: &Tensor, keep: usize) -> Result<Tensor> {
    let all = b.concat(&[prev.clone(), x.clone()], 2)?;
    let len = all.dims()[2];
    b.slice(&all, 2, len - keep, keep)
}

/// `[B, H, T, D] → [B, T, H·D]`; for one position (T = 1) the two orders are the same
/// memory, so a reshape.
fn merge_heads(b: &dyn ComputeBackend, x: &Tensor) -> Result<Tensor> {
    match *x.dims() {
        [bsz, h, 1, d] => x.reshape([bsz, 1, h * d]),
        _ => b.merge_heads(x),
    }
}

/// Rows `positions` of layer `l`'s `(cos, sin)` tables. Every cache holds the same
/// angles; a position past the first cache's table is read from its own cache's.
fn gather_rope_rows(
    b: &dyn ComputeBackend,
    caches: &[&mut KvCache],
    positions: &[usize],
    l: usize,
) -> Result<(Tensor, Tensor)> {
    let (cos, sin) = caches[0].rope.of(l)?;
    let mut gathered = Vec::with_capacity(2);
    for (i, base) in [cos, sin].into_iter().enumerate() {
        if positions.iter().all(|&p| p < base.dims()[0]) {
            gathered.push(b.index_select(base, &position_ids(b, positions)?)?);
            continue;
        }
        let rows = caches
            .iter()
            .zip(positions)
            .map(|(c, &p)| {
                let (cc, cs) = c.rope.of(l)?;
                b.slice_rows(if i == 0 { cc } else { cs }, p, 1)
            })
            .collect::<Result<Vec<_>>>()?;
        gathered.push(b.concat(&rows, 0)?);
    }
    let sin = gathered.pop().ok_or_else(|| Error::value("rope", "tables", "two", "one"))?;
    let cos = gathered.pop().ok_or_else(|| Error::value("rope", "tables", "two", "none"))?;
    Ok((cos, sin))
}

/// Positions as a `[N]` U32 tensor on `b`.
fn position_ids(b: &dyn ComputeBackend, positions: &[usize]) -> Result<Tensor> {
    let ids: Vec<u32> = positions
        .iter()
        .map(|&p| u32::try_from(p).map_err(|_| Error::value("Transformer::forward_batch", "position", "< 2³²", p)))
        .collect::<Result<_>>()?;
    b.upload(&Tensor::from_vec(ids, [positions.len()])?)
}
