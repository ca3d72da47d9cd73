//! f64 twins of the attention family: the full softmax over every key, plain loops.
//!
//! Layout `(batch, heads, seq, head_dim)`. Query head `h` reads kv head
//! `h / (Hq / Hkv)`. The causal mask is aligned bottom-right: query `i` sees key `j`
//! iff `j ≤ i + (Tk − Tq)`; with a sliding window of `W` keys also iff
//! `j > i + (Tk − Tq) − W` (the query at absolute position `p` sees `p − W < j ≤ p`).
//! Attention sinks `s [Hq]` (gpt-oss) add `e^(s_h)` to every row's softmax denominator
//! with no value: `p_ij = e^(z_ij − L_i)`, `L_i = ln(e^(s_h) + Σ_j e^(z_ij))`.

use crate::array::Array;

/// The mask of [`sdpa`]: additive values, or keep flags (0 drops a score); shape
/// `[Tq, Tk]` or `[B, Hq, Tq, Tk]`.
#[derive(Debug, Clone, Copy)]
pub enum TwinMask<'a> {
    /// Added to the scaled scores.
    Additive(&'a Array),
    /// Keep flags: 0 drops a score, anything else keeps it.
    Boolean(&'a Array),
}

/// `(out, lse)`: `out[b,h,i] = Σ_j p_ij·v[b,g,j]` with `p_ij = e^(s_ij)/Σ_j e^(s_ij)` over
/// the kept keys, `s_ij = scale·q_i·k_j (+ additive mask)`; `lse_i = ln Σ_j e^(s_ij)`.
/// A row with no kept key gives zeros and `lse = −∞`.
pub fn sdpa_with_lse(
    q: &Array,
    k: &Array,
    v: &Array,
    mask: Option<TwinMask>,
    causal: bool,
    scale: f64,
) -> (Array, Array) {
    windowed_with_lse(q, k, v, mask, causal, None, None, scale)
}

/// [`sdpa_with_lse`] where, with `causal` and a `window` of W keys, query `i` also
/// drops the keys `j ≤ i + (Tk − Tq) − W`, and with `sinks` head h's `e^(s_h)` joins
/// every row's denominator: `lse_i = ln(e^(s_h) + Σ_j e^(s_ij))`, `p_ij = e^(s_ij − lse_i)`
/// (a row with no kept key gives zeros and `lse = s_h`).
#[allow(clippy::too_many_arguments)]
fn windowed_with_lse(
    q: &Array,
    k: &Array,
    v: &Array,
    mask: Option<TwinMask>,
    causal: bool,
    window: Option<usize>,
    sinks: Option<&Array>,
    scale: f64,
) -> (Array, Array) {
    let (batch, hq, tq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let hkv = k.shape[1];
    let group = hq / hkv;
    let mut out = Array::zeros(vec![batch, hq, tq, d]);
    let mut lse = Array::zeros(vec![batch, hq, tq]);
    for b in 0..batch {
        for h in 0..hq {
            let g = h / group;
            for i in 0..tq {
                let scores = row_scores(q, k, mask, causal, window, scale, b, h, g, i);
                let mut kept: Vec<f64> = scores.iter().flatten().copied().collect();
                // The sink is one more term of the denominator (and of nothing else).
                let sink = sinks.map(|s| s.data[h]);
                kept.extend(sink);
                if kept.is_empty() {
                    *lse.at_mut(&[b, h, i]) = f64::NEG_INFINITY;
                    continue;
                }
                let max = kept.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = kept.iter().map(|s| (s - max).exp()).sum();
                *lse.at_mut(&[b, h, i]) = max + sum.ln();
                for (j, score) in scores.iter().enumerate() {
                    if let Some(s) = *score {
                        let p = (s - max).exp() / sum;
                        for e in 0..d {
                            out.data[i4(q, b, h, i, e)] += p * v.data[i4(v, b, g, j, e)];
                        }
                    }
                }
            }
        }
    }
    (out, lse)
}

/// The scores of query row `(b, h, i)` against every key of kv head `g`: `None` where
/// the causal mask, the window or the mask drops the key (or the score is −∞).
#[allow(clippy::too_many_arguments)]
fn row_scores(
    q: &Array,
    k: &Array,
    mask: Option<TwinMask>,
    causal: bool,
    window: Option<usize>,
    scale: f64,
    b: usize,
    h: usize,
    g: usize,
    i: usize,
) -> Vec<Option<f64>> {
    let (tq, d) = (q.shape[2], q.shape[3]);
    let tk = k.shape[2];
    (0..tk)
        .map(|j| {
            // Query i sits at position p = i + tk − tq (causal: tq ≤ tk): it sees j ≤ p,
            // and j > p − W.
            if causal {
                let p = i + tk - tq;
                if j > p || window.is_some_and(|w| j + w <= p) {
                    return None;
                }
            }
            let mut s = 0.0;
            for e in 0..d {
                s += q.data[i4(q, b, h, i, e)] * k.data[i4(k, b, g, j, e)];
            }
            s *= scale;
            match mask {
                None => {}
                Some(TwinMask::Additive(m)) => s += mask_value(m, b, h, i, j),
                Some(TwinMask::Boolean(m)) if mask_value(m, b, h, i, j) == 0.0 => return None,
                Some(TwinMask::Boolean(_)) => {}
            }
            if s == f64::NEG_INFINITY {
                None
            } else {
                Some(s)
            }
        })
        .collect()
}

/// Flat index of `[a, b, c, e]` in a rank-4 array.
fn i4(x: &Array, a: usize, b: usize, c: usize, e: usize) -> usize {
    ((a * x.shape[1] + b) * x.shape[2] + c) * x.shape[3] + e
}

fn mask_value(m: &Array, b: usize, h: usize, i: usize, j: usize) -> f64 {
    if m.shape.len() == 2 {
        m.data[i * m.shape[1] + j]
    } else {
        m.data[i4(m, b, h, i, j)]
    }
}

/// `sdpa` output only.
pub fn sdpa(q: &Array, k: &Array, v: &Array, mask: Option<TwinMask>, scale: f64, causal: bool) -> Array {
    sdpa_with_lse(q, k, v, mask, causal, scale).0
}

/// `softmax(q·kᵀ·scale [+ causal mask])·v`.
pub fn attention(q: &Array, k: &Array, v: &Array, scale: f64, causal: bool) -> Array {
    sdpa(q, k, v, None, scale, causal)
}

/// Causal attention, optionally over a sliding `window` of keys and with attention
/// `sinks` (`[Hq]`): `(output, logsumexp)`, the logsumexp including the sinks.
pub fn causal_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    window: Option<usize>,
    sinks: Option<&Array>,
    scale: f64,
) -> (Array, Array) {
    windowed_with_lse(q, k, v, None, true, window, sinks, scale)
}

/// The gradients of causal attention: dq, dk, dv, and the sinks' when there are sinks.
#[derive(Debug, Clone)]
pub struct TwinAttentionGradients {
    /// Like q.
    pub dq: Array,
    /// Like k, summed over each query group.
    pub dk: Array,
    /// Like v, summed over each query group.
    pub dv: Array,
    /// `[Hq]`, `Some` exactly when the forward had sinks.
    pub dsinks: Option<Array>,
}

/// The textbook backward of causal attention from the full P (with a sink, the row's
/// probabilities over keys and sink together, the sink's value being 0):
/// `dv_j = Σ_i P_ij·dO_i`, `dP_ij = dO_i·v_j`, `dS_ij = P_ij·(dP_ij − Σ_l P_il·dP_il)`,
/// `dq_i = scale·Σ_j dS_ij·k_j`, `dk_j = scale·Σ_i dS_ij·q_i`; dk, dv summed over each
/// group; the sink's `dS = P_sink·(0 − Σ_l P_il·dP_il)` summed over every row of its head.
/// P is 0 outside the causal mask and the `window`.
pub fn causal_attention_backward(
    q: &Array,
    k: &Array,
    v: &Array,
    d_out: &Array,
    window: Option<usize>,
    sinks: Option<&Array>,
    scale: f64,
) -> TwinAttentionGradients {
    let (batch, hq, tq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let (hkv, tk) = (k.shape[1], k.shape[2]);
    let group = hq / hkv;
    let mut dq = Array::zeros(q.shape.clone());
    let mut dk = Array::zeros(k.shape.clone());
    let mut dv = Array::zeros(v.shape.clone());
    let mut dsinks = Array::zeros(vec![hq]);
    for b in 0..batch {
        for h in 0..hq {
            let g = h / group;
            for i in 0..tq {
                let scores = row_scores(q, k, None, true, window, scale, b, h, g, i);
                let sink = sinks.map(|s| s.data[h]);
                let max = scores.iter().flatten().chain(&sink).copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = scores.iter().flatten().chain(&sink).map(|s| (s - max).exp()).sum();
                let p: Vec<f64> = scores.iter().map(|s| s.map_or(0.0, |s| (s - max).exp() / sum)).collect();
                let dp: Vec<f64> = (0..tk)
                    .map(|j| (0..d).map(|e| d_out.data[i4(d_out, b, h, i, e)] * v.data[i4(v, b, g, j, e)]).sum())
                    .collect();
                let p_dot_dp: f64 = (0..tk).map(|j| p[j] * dp[j]).sum();
                if let Some(s) = sink {
                    dsinks.data[h] -= (s - max).exp() / sum * p_dot_dp;
                }
                for j in 0..tk {
                    let ds = p[j] * (dp[j] - p_dot_dp);
                    for e in 0..d {
                        dv.data[i4(v, b, g, j, e)] += p[j] * d_out.data[i4(d_out, b, h, i, e)];
                        dq.data[i4(q, b, h, i, e)] += scale * ds * k.data[i4(k, b, g, j, e)];
                        dk.data[i4(k, b, g, j, e)] += scale * ds * q.data[i4(q, b, h, i, e)];
                    }
                }
            }
        }
    }
    TwinAttentionGradients { dq, dk, dv, dsinks: sinks.map(|_| dsinks) }
}

/// `[seq, kv_len]`: 0 where `j ≤ i + (kv_len − seq)`, −∞ elsewhere.
pub fn causal_mask(seq: usize, kv_len: usize) -> Array {
    let mut m = Array::zeros(vec![seq, kv_len]);
    for i in 0..seq {
        for j in 0..kv_len {
            if j + seq > i + kv_len {
                *m.at_mut(&[i, j]) = f64::NEG_INFINITY;
            }
        }
    }
    m
}

/// `softmax(scores·scale + causal_mask)` over the last dim of `[..., Tq, Tk]`.
pub fn causal_softmax(scores: &Array, scale: f64) -> Array {
    let r = scores.shape.len();
    let (tq, tk) = (scores.shape[r - 2], scores.shape[r - 1]);
    let mut out = Array::zeros(scores.shape.clone());
    for row in 0..scores.rows() {
        let i = row % tq;
        let seen = i + tk - tq + 1;
        let x = scores.row(row);
        let max = x[..seen].iter().map(|s| s * scale).fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = x[..seen].iter().map(|s| (s * scale - max).exp()).sum();
        for (j, s) in x[..seen].iter().enumerate() {
            out.data[row * tk + j] = (s * scale - max).exp() / sum;
        }
    }
    out
}

/// The cache after writing `new [B, Hkv, T, D]` at rows `pos .. pos + T`.
pub fn write_head_cache(cache: &Array, new: &Array, pos: usize) -> Array {
    let mut out = cache.clone();
    let (batch, heads, t, d) = (new.shape[0], new.shape[1], new.shape[2], new.shape[3]);
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..t {
                for e in 0..d {
                    *out.at_mut(&[b, h, pos + i, e]) = new.data[i4(new, b, h, i, e)];
                }
            }
        }
    }
    out
}

/// Causal attention of `q [B, Hq, Tq, D]` over the first `kv_len` rows of the caches
/// (the rows past `kv_len` are never read), optionally over a sliding `window` (the
/// query at position `p`, `kv_len − Tq ≤ p < kv_len`, sees rows `p − W < j ≤ p`) and
/// with attention `sinks`.
pub fn decode_attention(
    q: &Array,
    k_cache: &Array,
    v_cache: &Array,
    kv_len: usize,
    window: Option<usize>,
    sinks: Option<&Array>,
    scale: f64,
) -> Array {
    let prefix = |c: &Array| {
        let (batch, heads, d) = (c.shape[0], c.shape[1], c.shape[3]);
        let mut p = Array::zeros(vec![batch, heads, kv_len, d]);
        for b in 0..batch {
            for h in 0..heads {
                for j in 0..kv_len {
                    for e in 0..d {
                        *p.at_mut(&[b, h, j, e]) = c.data[i4(c, b, h, j, e)];
                    }
                }
            }
        }
        p
    };
    causal_attention(q, &prefix(k_cache), &prefix(v_cache), window, sinks, scale).0
}

/// One decode step of `N` sequences: row `i` of `q [N, Hq, Tq, D]` is
/// [`decode_attention`] over its own caches `[1, Hkv, capacity_i, D]` and `kv_lens[i]`,
/// the `sinks` shared.
pub fn batched_decode_attention(
    q: &Array,
    k_caches: &[&Array],
    v_caches: &[&Array],
    kv_lens: &[usize],
    window: Option<usize>,
    sinks: Option<&Array>,
    scale: f64,
) -> Array {
    let n = q.shape[0];
    let row: usize = q.shape[1..].iter().product();
    let mut out = Vec::with_capacity(n * row);
    for i in 0..n {
        let qi = Array::new(vec![1, q.shape[1], q.shape[2], q.shape[3]], q.data[i * row..(i + 1) * row].to_vec());
        out.extend(decode_attention(&qi, k_caches[i], v_caches[i], kv_lens[i], window, sinks, scale).data);
    }
    Array::new(q.shape.clone(), out)
}

/// `[B, T, H·D] → [B, H, T, D]`.
pub fn split_heads(x: &Array, heads: usize) -> Array {
    let (batch, t, c) = (x.shape[0], x.shape[1], x.shape[2]);
    let d = c / heads;
    let mut out = Array::zeros(vec![batch, heads, t, d]);
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..t {
                for e in 0..d {
                    *out.at_mut(&[b, h, i, e]) = x.at(&[b, i, h * d + e]);
                }
            }
        }
    }
    out
}

/// `[B, H, T, D] → [B, T, H·D]`.
pub fn merge_heads(x: &Array) -> Array {
    let (batch, heads, t, d) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let mut out = Array::zeros(vec![batch, t, heads * d]);
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..t {
                for e in 0..d {
                    *out.at_mut(&[b, i, h * d + e]) = x.data[i4(x, b, h, i, e)];
                }
            }
        }
    }
    out
}
