//! Attention: the fused forwards (`attention`, `sdpa`, `causal_attention`,
//! `decode_attention`), the causal backward, KV-cache scoring and writes, the
//! unfused causal softmax and mask, and the head split/merge layouts.
//!
//! Layout is `(batch, heads, seq, head_dim)`; query head `h` reads kv head
//! `h / (Hq/Hkv)` (GQA by index); the causal mask is aligned bottom-right: query `i`
//! sees key `j` iff `j ≤ i + (Tk − Tq)`, and with a sliding window of `W` keys also
//! `j > i + (Tk − Tq) − W` (query `i` sits at absolute position `p = i + Tk − Tq` and
//! sees keys `p − W < j ≤ p`). The causal ops take optional attention sinks: one f32
//! logit per query head added to each row's softmax denominator ([`sinks`]).

use crate::cpu::check;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::types::{AttentionMask, CausalAttentionResult};

/// The sizes of one attention call: queries `[batch, hq, tq, d]` against keys and
/// values `[batch, hkv, tk, d]` of one float `dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionDims {
    /// Batch size B.
    pub batch: usize,
    /// Query heads Hq (a multiple of `hkv`).
    pub hq: usize,
    /// Key/value heads Hkv (≥ 1).
    pub hkv: usize,
    /// Query length Tq.
    pub tq: usize,
    /// Key length Tk: the keys' rows, or the filled prefix `kv_len` of a cache.
    pub tk: usize,
    /// Head dimension D.
    pub d: usize,
    /// The dtype of q, k and v (F32, F16 or BF16).
    pub dtype: DType,
}

impl AttentionDims {
    /// Query heads per kv head (`Hq / Hkv`).
    pub fn group(&self) -> usize {
        self.hq / self.hkv
    }

    /// Number of keys query row `i` may see: all `tk`, or `i + (tk − tq) + 1` when causal.
    pub fn visible(&self, causal: bool, i: usize) -> usize {
        if causal {
            (i + 1 + self.tk - self.tq).min(self.tk)
        } else {
            self.tk
        }
    }

    /// The first key query row `i` of a causal call may see: 0 without a window, else
    /// `max(0, i + (tk − tq) + 1 − W)` (keys `p − W < j ≤ p` for the query's absolute
    /// position `p = i + tk − tq`). With [`visible`](Self::visible), row `i` sees keys
    /// `window_start(window, i) .. visible(true, i)`.
    pub fn window_start(&self, window: Option<usize>, i: usize) -> usize {
        match window {
            Some(w) => (i + 1 + self.tk - self.tq).saturating_sub(w),
            None => 0,
        }
    }
}

/// A sliding window of a causal attention op: `None` (full causal) or `Some(W)` with
/// `W ≥ 1` keys; `Some(0)` (a query that sees no key, not even itself) is an error
/// naming `op`.
pub fn window(op: &'static str, window: Option<usize>) -> Result<()> {
    if window == Some(0) {
        return Err(Error::value(op, "window", "None (full causal) or Some(W) with W ≥ 1 keys", "Some(0)"));
    }
    Ok(())
}

/// Attention sinks of a causal attention op: `None`, or one F32 logit per query head,
/// `[hq]`; anything else is an error naming `op`, what was expected and what came.
pub fn sinks(op: &'static str, sinks: Option<&Tensor>, hq: usize) -> Result<()> {
    let Some(s) = sinks else { return Ok(()) };
    if s.dtype() != DType::F32 {
        return Err(Error::dtype(op, "sinks", "f32 (one logit per query head)", s.dtype()));
    }
    if s.dims() != [hq] {
        return Err(Error::shape(op, "sinks", format!("[{hq}] (one logit per query head)"), s.shape()));
    }
    Ok(())
}

/// `q [B,Hq,Tq,D]` against keys/values `[B,Hkv,rows,D]` (rows = Tk, or the capacity of
/// a cache): one float dtype, rank 4, k and v of one shape, B and D shared, `Hq % Hkv
/// == 0`. Returns the sizes with `tk = rows`.
pub fn qkv(op: &'static str, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<AttentionDims> {
    check::float(op, "q", q)?;
    check::same_dtype(op, "k", q, k)?;
    check::same_dtype(op, "v", q, v)?;
    check::rank(op, "q", q, 4)?;
    check::rank(op, "k", k, 4)?;
    check::rank(op, "v", v, 4)?;
    check::same_shape(op, "v (must match k)", k, v)?;
    let (qd, kd) = (q.dims(), k.dims());
    let dims = AttentionDims { batch: qd[0], hq: qd[1], hkv: kd[1], tq: qd[2], tk: kd[2], d: qd[3], dtype: q.dtype() };
    if kd[0] != qd[0] || kd[3] != qd[3] {
        return Err(Error::shape(op, "k", format!("[{}, Hkv, Tk, {}]", qd[0], qd[3]), k.shape()));
    }
    if dims.hq.checked_rem(dims.hkv) != Some(0) {
        return Err(Error::shape(
            op,
            "heads",
            format!("query heads ({}) a multiple of kv heads", dims.hq),
            format!("{} kv heads", dims.hkv),
        ));
    }
    Ok(dims)
}

/// A causal call needs `Tq ≤ Tk` (the mask is aligned bottom-right).
fn causal_lengths(op: &'static str, dims: &AttentionDims) -> Result<()> {
    if dims.tq > dims.tk {
        return Err(Error::shape(op, "query length (causal)", format!("Tq ≤ Tk = {}", dims.tk), dims.tq));
    }
    Ok(())
}

/// `attention(q, k, v, scale, causal)`: [`qkv`], and `Tq ≤ Tk` when causal.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool) -> Result<AttentionDims> {
    masked("attention", q, k, v, causal)
}

fn masked(op: &'static str, q: &Tensor, k: &Tensor, v: &Tensor, causal: bool) -> Result<AttentionDims> {
    let dims = qkv(op, q, k, v)?;
    if causal {
        causal_lengths(op, &dims)?;
    }
    Ok(dims)
}

/// How an `sdpa` mask applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskSpec {
    /// `[B, Hq, Tq, Tk]` (one mask per head) rather than `[Tq, Tk]` shared by every head.
    pub per_head: bool,
    /// A U32 keep/drop mask rather than additive F32 values.
    pub boolean: bool,
}

/// `sdpa(q, k, v, mask, scale, causal)`: as [`attention`]; an additive mask is F32, a
/// boolean one U32, either `[Tq, Tk]` or `[B, Hq, Tq, Tk]`.
pub fn sdpa(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<AttentionMask<'_>>,
    causal: bool,
) -> Result<(AttentionDims, Option<MaskSpec>)> {
    const OP: &str = "sdpa";
    let dims = masked(OP, q, k, v, causal)?;
    let Some(mask) = mask else { return Ok((dims, None)) };
    let (t, boolean) = match mask {
        AttentionMask::Additive(t) => {
            check::dtype(OP, "additive mask", t, DType::F32)?;
            (t, false)
        }
        AttentionMask::Boolean(t) => {
            check::dtype(OP, "boolean mask", t, DType::U32)?;
            (t, true)
        }
    };
    let shared = [dims.tq, dims.tk];
    let full = [dims.batch, dims.hq, dims.tq, dims.tk];
    let per_head = if t.dims() == shared {
        false
    } else if t.dims() == full {
        true
    } else {
        return Err(Error::shape(OP, "mask", format!("{:?} or {:?}", shared, full), t.shape()));
    };
    Ok((dims, Some(MaskSpec { per_head, boolean })))
}

/// `causal_attention(q, k, v, window, sinks, scale)`: [`qkv`], `Tq ≤ Tk`, a valid
/// [`window`] and valid [`sinks`].
pub fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<usize>,
    sinks: Option<&Tensor>,
) -> Result<AttentionDims> {
    const OP: &str = "causal_attention";
    self::window(OP, window)?;
    let dims = masked(OP, q, k, v, true)?;
    self::sinks(OP, sinks, dims.hq)?;
    Ok(dims)
}

/// `causal_attention_backward(q, k, v, result, d_out, window, sinks, scale)`: as
/// [`causal_attention`]; `result.output` and `d_out` of q's dtype and shape,
/// `result.logsumexp` F32 `[B, Hq, Tq]`.
pub fn causal_attention_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    result: &CausalAttentionResult,
    d_out: &Tensor,
    window: Option<usize>,
    sinks: Option<&Tensor>,
) -> Result<AttentionDims> {
    const OP: &str = "causal_attention_backward";
    self::window(OP, window)?;
    let dims = masked(OP, q, k, v, true)?;
    self::sinks(OP, sinks, dims.hq)?;
    check::same_dtype(OP, "output", q, &result.output)?;
    check::same_shape(OP, "output", q, &result.output)?;
    check::same_dtype(OP, "d_out", q, d_out)?;
    check::same_shape(OP, "d_out", q, d_out)?;
    check::dtype(OP, "logsumexp", &result.logsumexp, DType::F32)?;
    check::shape(OP, "logsumexp", &result.logsumexp, &[dims.batch, dims.hq, dims.tq])?;
    Ok(dims)
}

/// A decode call: the attention over the first `kv_len` rows of caches with room for
/// `capacity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeSpec {
    /// The sizes, with `tk = kv_len`; `dims.dtype` is q's (and the output's) dtype.
    pub dims: AttentionDims,
    /// Rows each cache head holds.
    pub capacity: usize,
    /// The dtype both caches store (F32, F16 or BF16); it may differ from q's: a 16-bit
    /// cache is read as f32 and every product accumulates in f32.
    pub cache_dtype: DType,
}

/// The dtypes a KV cache may store: F32, or F16 / BF16 (half the bytes to read per
/// position).
pub const CACHE_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// A KV cache tensor's dtype must be one of [`CACHE_DTYPES`].
fn cache_dtype(op: &'static str, what: &str, cache: &Tensor) -> Result<DType> {
    if CACHE_DTYPES.contains(&cache.dtype()) {
        Ok(cache.dtype())
    } else {
        Err(Error::dtype(op, what, "a cache dtype (f32, f16 or bf16)", cache.dtype()))
    }
}

/// `decode_attention(q, k_cache, v_cache, kv_len, window, sinks, scale)`: q
/// `[B, Hq, Tq, D]` float; the caches `[B, Hkv, capacity, D]` of one cache dtype (F32,
/// F16 or BF16, not necessarily q's: the cache's dtype is its storage format), B and D
/// shared with q, `Hq % Hkv == 0`, `kv_len ≤ capacity`, `Tq ≤ kv_len`, a valid
/// [`window`] and valid [`sinks`].
pub fn decode_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    kv_len: usize,
    window: Option<usize>,
    sinks: Option<&Tensor>,
) -> Result<DecodeSpec> {
    const OP: &str = "decode_attention";
    self::window(OP, window)?;
    check::float(OP, "q", q)?;
    let cache_dtype = self::cache_dtype(OP, "k_cache", k_cache)?;
    if v_cache.dtype() != cache_dtype {
        return Err(Error::dtype(OP, "v_cache (must match k_cache's dtype)", cache_dtype, v_cache.dtype()));
    }
    // The shape rules of [`qkv`], which also asks one dtype of q and the caches.
    check::rank(OP, "q", q, 4)?;
    check::rank(OP, "k_cache", k_cache, 4)?;
    check::rank(OP, "v_cache", v_cache, 4)?;
    check::same_shape(OP, "v_cache (must match k_cache)", k_cache, v_cache)?;
    let (qd, kd) = (q.dims(), k_cache.dims());
    if kd[0] != qd[0] || kd[3] != qd[3] {
        return Err(Error::shape(OP, "k_cache", format!("[{}, Hkv, capacity, {}]", qd[0], qd[3]), k_cache.shape()));
    }
    let (hq, hkv) = (qd[1], kd[1]);
    if hq.checked_rem(hkv) != Some(0) {
        return Err(Error::shape(
            OP,
            "heads",
            format!("query heads ({hq}) a multiple of kv heads"),
            format!("{hkv} kv heads"),
        ));
    }
    let capacity = kd[2];
    if kv_len > capacity {
        return Err(Error::value(OP, "kv_len", format!("≤ cache capacity {capacity}"), kv_len));
    }
    let dims = AttentionDims { batch: qd[0], hq, hkv, tq: qd[2], tk: kv_len, d: qd[3], dtype: q.dtype() };
    causal_lengths(OP, &dims)?;
    self::sinks(OP, sinks, hq)?;
    Ok(DecodeSpec { dims, capacity, cache_dtype })
}

/// `head_prefix_matmul(q, k_cache, len)`: q `[B, Hq, Tq, D]` float, the cache
/// `[B, Hkv, capacity, D]` of its dtype, `Hq % Hkv == 0`, `len ≤ capacity`. Returns
/// the sizes with `tk = len` and the capacity.
pub fn head_prefix_matmul(q: &Tensor, k_cache: &Tensor, len: usize) -> Result<DecodeSpec> {
    const OP: &str = "head_prefix_matmul";
    check::float(OP, "q", q)?;
    check::same_dtype(OP, "k_cache", q, k_cache)?;
    check::rank(OP, "q", q, 4)?;
    check::rank(OP, "k_cache", k_cache, 4)?;
    let (qd, kd) = (q.dims(), k_cache.dims());
    let (batch, hq, tq, d) = (qd[0], qd[1], qd[2], qd[3]);
    let (hkv, capacity) = (kd[1], kd[2]);
    if kd[0] != batch || kd[3] != d {
        return Err(Error::shape(
            OP,
            "k_cache ([B, Hkv, capacity, D] with q's B and D)",
            format!("[{batch}, Hkv, capacity, {d}]"),
            k_cache.shape(),
        ));
    }
    if hkv == 0 || hq % hkv != 0 {
        return Err(Error::shape(OP, "k_cache heads (must divide q's heads)", format!("a divisor of {hq}"), hkv));
    }
    if len > capacity {
        return Err(Error::value(OP, "len", format!("≤ capacity {capacity}"), len));
    }
    let dims = AttentionDims { batch, hq, hkv, tq, tk: len, d, dtype: q.dtype() };
    Ok(DecodeSpec { dims, capacity, cache_dtype: q.dtype() })
}

/// A cache write: `rows` new rows at `pos` in each of `batch · heads` heads of
/// `capacity` rows of `d` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheWrite {
    /// Batch size B.
    pub batch: usize,
    /// Heads Hkv.
    pub heads: usize,
    /// Rows per head of the cache.
    pub capacity: usize,
    /// New rows T per head.
    pub rows: usize,
    /// Head dimension D.
    pub d: usize,
    /// The cache's dtype (F32, F16 or BF16).
    pub dtype: DType,
    /// The new rows' dtype: the cache's, or F32 rounded to the cache's dtype (to
    /// nearest, ties to even) as it is written.
    pub new_dtype: DType,
}

/// `write_head_cache(cache, new, pos)`: a cache `[B, Hkv, capacity, D]` of a cache
/// dtype (F32, F16 or BF16), `new` `[B, Hkv, T, D]` of the cache's dtype or F32 (rounded
/// to the cache's), `pos + T ≤ capacity`.
pub fn write_head_cache(cache: &Tensor, new: &Tensor, pos: usize) -> Result<CacheWrite> {
    const OP: &str = "write_head_cache";
    let dtype = cache_dtype(OP, "cache", cache)?;
    if new.dtype() != dtype && new.dtype() != DType::F32 {
        return Err(Error::dtype(
            OP,
            "new",
            format!("the cache's dtype ({dtype}) or f32 (rounded to the cache's dtype)"),
            new.dtype(),
        ));
    }
    check::rank(OP, "cache", cache, 4)?;
    check::rank(OP, "new", new, 4)?;
    let (cd, nd) = (cache.dims(), new.dims());
    if nd[0] != cd[0] || nd[1] != cd[1] || nd[3] != cd[3] {
        return Err(Error::shape(OP, "new", format!("[{}, {}, T, {}]", cd[0], cd[1], cd[3]), new.shape()));
    }
    let (capacity, rows) = (cd[2], nd[2]);
    if pos.checked_add(rows).is_none_or(|end| end > capacity) {
        return Err(Error::value(OP, "pos + T", format!("≤ capacity {capacity}"), format!("{pos} + {rows}")));
    }
    Ok(CacheWrite { batch: cd[0], heads: cd[1], capacity, rows, d: cd[3], dtype, new_dtype: new.dtype() })
}

/// `causal_mask(seq, kv_len)`: `seq ≤ kv_len`.
pub fn causal_mask(seq: usize, kv_len: usize) -> Result<()> {
    if seq > kv_len {
        return Err(Error::value("causal_mask", "seq", format!("≤ kv_len = {kv_len}"), seq));
    }
    Ok(())
}

/// `causal_softmax(scores, scale)`: float scores `[..., Tq, Tk]` with `Tq ≤ Tk`.
/// Returns `(Tq, Tk)`.
pub fn causal_softmax(scores: &Tensor) -> Result<(usize, usize)> {
    const OP: &str = "causal_softmax";
    check::float(OP, "scores", scores)?;
    check::min_rank(OP, "scores", scores, 2)?;
    let dims = scores.dims();
    let (tq, tk) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    if tq > tk {
        return Err(Error::shape(OP, "scores", format!("[..., Tq, Tk] with Tq ≤ Tk = {tk}"), scores.shape()));
    }
    Ok((tq, tk))
}

/// The sizes of a head split or merge: `[B, T, H·D] ↔ [B, H, T, D]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadsLayout {
    /// Batch size B.
    pub batch: usize,
    /// Sequence length T.
    pub seq: usize,
    /// Heads H.
    pub heads: usize,
    /// Head dimension D.
    pub d: usize,
    /// Bytes per element.
    pub elem_bytes: usize,
}

/// Bytes per element of a layout op's input (block-quantized dtypes are refused).
pub fn elem_bytes(op: &'static str, x: &Tensor) -> Result<usize> {
    if x.dtype().block_elems() != 1 {
        return Err(Error::dtype(op, "x", "an element dtype (f32, f16, bf16, u32)", x.dtype()));
    }
    Ok(x.dtype().storage_bytes(1))
}

/// `split_heads(x, heads)`: x `[B, T, H·D]` of an element dtype, `heads` a divisor of
/// the last dim.
pub fn split_heads(x: &Tensor, heads: usize) -> Result<HeadsLayout> {
    const OP: &str = "split_heads";
    check::rank(OP, "x", x, 3)?;
    let elem_bytes = elem_bytes(OP, x)?;
    let (batch, seq, c) = (x.dims()[0], x.dims()[1], x.dims()[2]);
    if heads == 0 || c % heads != 0 {
        return Err(Error::value(OP, "heads", format!("a divisor of the last dim {c}"), heads));
    }
    Ok(HeadsLayout { batch, seq, heads, d: c / heads, elem_bytes })
}

/// `merge_heads(x)`: x `[B, H, T, D]` of an element dtype.
pub fn merge_heads(x: &Tensor) -> Result<HeadsLayout> {
    const OP: &str = "merge_heads";
    check::rank(OP, "x", x, 4)?;
    let elem_bytes = elem_bytes(OP, x)?;
    let (batch, heads, seq, d) = (x.dims()[0], x.dims()[1], x.dims()[2], x.dims()[3]);
    Ok(HeadsLayout { batch, seq, heads, d, elem_bytes })
}

/// A batched decode call: `n` sequences, each its own [`DecodeSpec`] (its cache's
/// capacity and filled length).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchedDecodeSpec {
    /// Sequences (q's batch).
    pub n: usize,
    /// Per sequence: the sizes of its [`decode_attention`] (batch 1).
    pub rows: Vec<DecodeSpec>,
}

/// `batched_decode_attention(q, k_caches, v_caches, kv_lens, window, sinks, scale)`: q
/// `[N, Hq, Tq, D]` float; valid [`sinks`] (shared by every sequence); one cache pair
/// and one length per sequence (`k_caches.len() == v_caches.len() == kv_lens.len() ==
/// N`), and sequence `i` with its row of q, `[1, Hq, Tq, D]`, is a valid
/// [`decode_attention`] call: caches `[1, Hkv, capacity_i, D]` of the dtypes
/// `decode_attention` accepts, `Tq ≤ kv_lens[i] ≤ capacity_i`. Capacities and lengths
/// may differ between sequences (ragged).
pub fn batched_decode_attention(
    q: &Tensor,
    k_caches: &[&Tensor],
    v_caches: &[&Tensor],
    kv_lens: &[usize],
    window: Option<usize>,
    sinks: Option<&Tensor>,
) -> Result<BatchedDecodeSpec> {
    const OP: &str = "batched_decode_attention";
    self::window(OP, window)?;
    check::float(OP, "q", q)?;
    check::rank(OP, "q", q, 4)?;
    let qd = q.dims();
    self::sinks(OP, sinks, qd[1])?;
    let (n, row) = (qd[0], qd[1] * qd[2] * qd[3]);
    for (what, len) in [("k_caches", k_caches.len()), ("v_caches", v_caches.len()), ("kv_lens", kv_lens.len())] {
        if len != n {
            return Err(Error::shape(OP, format!("{what} (one per sequence of q)"), n, len));
        }
    }
    let mut rows = Vec::with_capacity(n);
    for i in 0..n {
        let qi = q.view(i * row, [1, qd[1], qd[2], qd[3]])?;
        let per = decode_attention(&qi, k_caches[i], v_caches[i], kv_lens[i], window, None).map_err(|e| match e {
            Error::Shape { what, expected, got, .. } => {
                Error::Shape { op: OP, what: format!("sequence {i}: {what}"), expected, got }
            }
            Error::DType { what, expected, got, .. } => {
                Error::DType { op: OP, what: format!("sequence {i}: {what}"), expected, got }
            }
            Error::Value { what, expected, got, .. } => {
                Error::Value { op: OP, what: format!("sequence {i}: {what}"), expected, got }
            }
            other => other,
        })?;
        rows.push(per);
    }
    Ok(BatchedDecodeSpec { n, rows })
}
