//! Attention kernels: fused blockwise (flash-style) attention forward and backward,
//! masked and decode variants, and the small layout helpers around them.
//!
//! Layout is `(batch, heads, seq, head_dim)`. Query head `h` reads kv head
//! `h / (Hq/Hkv)` by index (GQA; K and V are never repeated). The causal mask is
//! aligned bottom-right: query `i` sees key `j` iff `j ≤ i + (Tk − Tq)`. The causal
//! ops take optional attention sinks (one logit per query head in each row's softmax
//! denominator, no value): the online softmax starts from the sink's term, and the
//! backward adds the sinks' gradient.
//!
//! - `forward`: the online-softmax forward over blocks of queries that share a kv head
//!   (64 queries of a head, or for decode the few queries of a whole GQA group), K and
//!   V read in place; it serves `attention`, `sdpa`, `causal_attention` and
//!   `decode_attention`.
//! - `decode`: the single-query forward (Tq = 1, no mask): per kv head, K streamed once
//!   scoring the group's query heads together, then V once accumulating their outputs.
//! - `backward`: the causal backward from the saved logsumexp, parallel over kv heads.
//! - `tiles`: the register-tiled block products and softmax steps both use.
//! - `layout`: the explicit mask, causal softmax, KV cache writes, head split/merge.
//!
//! Memory: besides inputs and outputs, the forward keeps per task one block of scores
//! (128 keys × 64 queries) and the block's accumulators; the backward keeps per task
//! padded copies of its group's Q and dO (O(T·D)) when D or Tq need padding, and one
//! 64 × 128 block of P and dS.
//! No T×T buffer is ever allocated.

mod backward;
mod batched_decode;
mod decode;
#[cfg(target_arch = "x86_64")]
mod decode_half_x86;
#[cfg(target_arch = "x86_64")]
mod decode_x86;
mod forward;
mod layout;
mod tiles;

pub use batched_decode::batched_decode_attention;
pub use layout::{causal_mask, causal_softmax, merge_heads, split_heads, write_head_cache};

use std::borrow::Cow;

use crate::cpu::convert::f32_data;
use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::Shape;
use crate::spec::attention::{self as spec, AttentionDims, MaskSpec};
use crate::tensor::Tensor;
use crate::types::*;
use half::{bf16, f16};

/// Sizes of one attention call (see [`AttentionDims`]).
type Dims = AttentionDims;

/// A mask row reader: additive f32 values or U32 keep flags, `[Tq, Tk]` shared by
/// every head or `[B, Hq, Tq, Tk]`.
#[derive(Clone, Copy)]
enum MaskValues<'a> {
    Additive(&'a [f32]),
    Boolean(&'a [u32]),
}

#[derive(Clone, Copy)]
struct Mask<'a> {
    values: MaskValues<'a>,
    per_head: bool,
}

impl Mask<'_> {
    /// Applies mask row `i` of query head `bh` (`b·Hq + h`) to the scores of keys
    /// `k0 .. k0 + keys` held in column `col` of a transposed score block
    /// (`st[c·ld + col]`): adds the additive values, or sets dropped scores to −∞.
    fn apply(&self, dims: &Dims, bh: usize, i: usize, k0: usize, keys: usize, st: &mut [f32], ld: usize, col: usize) {
        let row = if self.per_head { bh * dims.tq + i } else { i };
        let range = row * dims.tk + k0..row * dims.tk + k0 + keys;
        let scores = st.iter_mut().skip(col).step_by(ld);
        match self.values {
            MaskValues::Additive(m) => {
                for (x, &a) in scores.zip(&m[range]) {
                    *x += a;
                }
            }
            MaskValues::Boolean(m) => {
                for (x, &keep) in scores.zip(&m[range]) {
                    if keep == 0 {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
}

/// One attention problem: f32 queries `[B,Hq,Tq,D]`, keys and values of element `T`
/// (f32; F16/BF16 only for the single-query decode path) read in place as
/// `kv_stride`-spaced `[Tk, D]` slabs per (batch, kv head) (Tk = the whole tensor, or
/// the filled prefix of a cache).
struct Problem<'a, T = f32> {
    dims: Dims,
    q: &'a [f32],
    k: &'a [T],
    v: &'a [T],
    kv_stride: usize,
    scale: f32,
    causal: bool,
    /// A causal call's sliding window: row `i` sees keys
    /// `dims.window_start(window, i) .. dims.visible(true, i)`.
    window: Option<usize>,
    mask: Option<Mask<'a>>,
    /// A causal call's attention sinks, one logit per query head (`[Hq]`): each row's
    /// softmax starts from the sink's term (running max `s_h`, running sum 1).
    sinks: Option<&'a [f32]>,
}

impl<T> Problem<'_, T> {
    /// The online softmax's starting `(m, l)` for a row of query head `bh` (a `b·Hq + h`
    /// index): `(−∞, 0)`, or with a sink `(s_h, 1)` (its term `e^(s_h − m)` in the sum).
    fn softmax_start(&self, bh: usize) -> (f32, f32) {
        match self.sinks {
            Some(s) => (s[bh % self.dims.hq], 1.0),
            None => (f32::NEG_INFINITY, 0.0),
        }
    }

    /// Keys `lo .. hi` query row `i` sees (all `0 .. Tk` when not causal).
    fn keys(&self, i: usize) -> (usize, usize) {
        let hi = self.dims.visible(self.causal, i);
        let lo = if self.causal { self.dims.window_start(self.window, i).min(hi) } else { 0 };
        (lo, hi)
    }
}

/// Runs the forward and writes the output in `dtype`; returns it with the f32 logsumexp.
fn run_forward(cpu: &CpuBackend, p: &Problem, dtype: DType) -> Result<(Tensor, Tensor)> {
    let Dims { batch, hq, tq, d, .. } = p.dims;
    let (out_shape, lse_shape) = (Shape::new([batch, hq, tq, d]), Shape::new([batch, hq, tq]));
    let (n_out, n_lse) = (out_shape.elem_count(), lse_shape.elem_count());
    let (mut out, mut lse) = (Vec::<f32>::with_capacity(n_out), Vec::<f32>::with_capacity(n_lse));
    forward::forward(cpu, p, &mut out.spare_capacity_mut()[..n_out], &mut lse.spare_capacity_mut()[..n_lse]);
    // SAFETY: `forward` writes every element of both (a panic in it propagates before
    // this line, dropping them empty).
    unsafe { (out.set_len(n_out), lse.set_len(n_lse)) };
    Ok((in_dtype(Tensor::from_vec(out, out_shape)?, dtype)?, Tensor::from_vec(lse, lse_shape)?))
}

/// An f32 result tensor in the op's dtype (F32: as is; F16/BF16: converted once).
fn in_dtype(t: Tensor, dtype: DType) -> Result<Tensor> {
    if dtype == DType::F32 {
        Ok(t)
    } else {
        Tensor::from_f32_as(t.as_slice::<f32>()?, t.shape().clone(), dtype)
    }
}

/// `softmax(q·kᵀ·scale [+ causal mask])·v` with GQA by index.
///
/// # Shapes
/// `q`: `[B, Hq, Tq, D]`; `k`, `v`: `[B, Hkv, Tk, D]` (`Hq % Hkv == 0`; `Tq ≤ Tk` when causal)
/// → `[B, Hq, Tq, D]`.
pub fn attention(cpu: &CpuBackend, q: &Tensor, k: &Tensor, v: &Tensor, scale: f32, causal: bool) -> Result<Tensor> {
    let dims = spec::attention(q, k, v, causal)?;
    forward_full("attention", cpu, q, k, v, dims, None, scale, causal)
}

/// `attention` with an optional additive (f32) or boolean (U32, 0 drops) mask; a row
/// whose every score is masked yields zeros.
///
/// # Shapes
/// as [`attention`]; mask `[Tq, Tk]` or `[B, Hq, Tq, Tk]` → `[B, Hq, Tq, D]`.
pub fn sdpa(
    cpu: &CpuBackend,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<AttentionMask<'_>>,
    scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let (dims, mask_spec) = spec::sdpa(q, k, v, mask, causal)?;
    let mask = mask.zip(mask_spec).map(|(m, s)| mask_reader(m, s)).transpose()?;
    forward_full("sdpa", cpu, q, k, v, dims, mask, scale, causal)
}

/// The forward over whole k and v (`tk` rows each) of a validated call.
#[allow(clippy::too_many_arguments)]
fn forward_full(
    op: &'static str,
    cpu: &CpuBackend,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    dims: Dims,
    mask: Option<Mask<'_>>,
    scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let (qf, kf, vf) = (f32_data(op, "q", q)?, f32_data(op, "k", k)?, f32_data(op, "v", v)?);
    let kv_stride = dims.tk * dims.d;
    let p = Problem { dims, q: &qf, k: &kf, v: &vf, kv_stride, scale, causal, window: None, mask, sinks: None };
    Ok(run_forward(cpu, &p, q.dtype())?.0)
}

/// The reader of a mask the spec accepted.
fn mask_reader<'a>(mask: AttentionMask<'a>, spec: MaskSpec) -> Result<Mask<'a>> {
    let values = match mask {
        AttentionMask::Additive(t) => MaskValues::Additive(t.as_slice::<f32>()?),
        AttentionMask::Boolean(t) => MaskValues::Boolean(t.as_slice::<u32>()?),
    };
    Ok(Mask { values, per_head: spec.per_head })
}

/// Fused causal attention, blockwise with an online softmax and O(T) memory; returns
/// the output and the per-row logsumexp `ln Σ_j exp(s_ij)` (f32) the backward needs.
/// With a `window` of W keys, query `i` (position `p = i + Tk − Tq`) sees keys
/// `p − W < j ≤ p`, and key blocks outside every window of a query block are skipped
/// (cost O(T·W)). With `sinks`, head h's logit `s_h` joins every row's denominator
/// without a value: `L_i = ln(e^(s_h) + Σ_j e^(s_ij))`, `out_i = Σ_j e^(s_ij − L_i)·v_j`,
/// and the logsumexp returned is `L` (the online softmax starts each row at
/// `m = s_h, l = 1`).
///
/// # Shapes
/// `q`: `[B, Hq, Tq, D]`; `k`, `v`: `[B, Hkv, Tk, D]`, `Tq ≤ Tk`; `sinks`: `[Hq]` f32
/// → output `[B, Hq, Tq, D]`, logsumexp `[B, Hq, Tq]`.
pub fn causal_attention(
    cpu: &CpuBackend,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<usize>,
    sinks: Option<&Tensor>,
    scale: f32,
) -> Result<CausalAttentionResult> {
    const OP: &str = "causal_attention";
    let dims = spec::causal_attention(q, k, v, window, sinks)?;
    let (qf, kf, vf) = (f32_data(OP, "q", q)?, f32_data(OP, "k", k)?, f32_data(OP, "v", v)?);
    let sinks = sinks.map(|s| s.as_slice::<f32>()).transpose()?;
    let kv_stride = dims.tk * dims.d;
    let p = Problem { dims, q: &qf, k: &kf, v: &vf, kv_stride, scale, causal: true, window, mask: None, sinks };
    let (output, logsumexp) = run_forward(cpu, &p, q.dtype())?;
    Ok(CausalAttentionResult { output, logsumexp })
}

/// Backward of [`causal_attention`] from the saved logsumexp: P is recomputed
/// blockwise; `dq`, and `dk`, `dv` summed over each query group. `window` and `sinks`
/// are the forward's; key blocks no query of a block sees are skipped. The saved
/// logsumexp includes the sinks' terms, so dq, dk, dv need nothing more for them; the
/// sinks' gradient is `dsinks_h = −Σ_{b,i} e^(s_h − L_{b,h,i})·(dO·O)_{b,h,i}`.
///
/// # Shapes
/// as [`causal_attention`]; `result.output` and `d_out` `[B, Hq, Tq, D]` (dtype of q),
/// `result.logsumexp` `[B, Hq, Tq]` f32 → dq like q, dk/dv like k/v, dsinks `[Hq]` f32.
pub fn causal_attention_backward(
    cpu: &CpuBackend,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    result: &CausalAttentionResult,
    d_out: &Tensor,
    window: Option<usize>,
    sinks: Option<&Tensor>,
    scale: f32,
) -> Result<AttentionGradients> {
    const OP: &str = "causal_attention_backward";
    let dims = spec::causal_attention_backward(q, k, v, result, d_out, window, sinks)?;
    let (qf, kf, vf) = (f32_data(OP, "q", q)?, f32_data(OP, "k", k)?, f32_data(OP, "v", v)?);
    let of = f32_data(OP, "output", &result.output)?;
    let dof = f32_data(OP, "d_out", d_out)?;
    let lse = result.logsumexp.as_slice::<f32>()?;
    let sinks = sinks.map(|s| s.as_slice::<f32>()).transpose()?;
    let kv_stride = dims.tk * dims.d;
    let p = Problem { dims, q: &qf, k: &kf, v: &vf, kv_stride, scale, causal: true, window, mask: None, sinks };
    let lens = [q, k, v].map(|t| t.shape().elem_count());
    let [mut dq, mut dk, mut dv] = lens.map(Vec::<f32>::with_capacity);
    backward::backward(
        cpu,
        &p,
        &of,
        lse,
        &dof,
        (
            &mut dq.spare_capacity_mut()[..lens[0]],
            &mut dk.spare_capacity_mut()[..lens[1]],
            &mut dv.spare_capacity_mut()[..lens[2]],
        ),
    );
    // SAFETY: `backward` writes every element of its three buffers (a panic in it
    // propagates before this line, dropping them empty).
    unsafe { (dq.set_len(lens[0]), dk.set_len(lens[1]), dv.set_len(lens[2])) };
    let dsinks = sinks
        .map(|s| Tensor::from_vec(backward::sink_gradients(cpu, &dims, s, lse, &of, &dof), [dims.hq]))
        .transpose()?;
    let grad = |g: Vec<f32>, like: &Tensor| in_dtype(Tensor::from_vec(g, like.shape().clone())?, q.dtype());
    Ok(AttentionGradients { dq: grad(dq, q)?, dk: grad(dk, k)?, dv: grad(dv, v)?, dsinks })
}

/// Attention of `Tq` new queries over the first `kv_len` rows of preallocated caches,
/// read in place (rows past `kv_len` are never touched). The queries sit at positions
/// `kv_len − Tq .. kv_len` and are masked causally among themselves. GQA by index.
/// With a `window` of W keys the query at position `p` sees rows `p − W < j ≤ p`;
/// earlier rows are not read. `sinks` as in [`causal_attention`].
///
/// # Shapes
/// `q`: `[B, Hq, Tq, D]`; caches `[B, Hkv, capacity, D]`, `Tq ≤ kv_len ≤ capacity`;
/// `sinks`: `[Hq]` f32 → `[B, Hq, Tq, D]`.
pub fn decode_attention(
    cpu: &CpuBackend,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    kv_len: usize,
    window: Option<usize>,
    sinks: Option<&Tensor>,
    scale: f32,
) -> Result<Tensor> {
    const OP: &str = "decode_attention";
    let spec::DecodeSpec { dims, capacity, cache_dtype } =
        spec::decode_attention(q, k_cache, v_cache, kv_len, window, sinks)?;
    let sinks = sinks.map(|s| s.as_slice::<f32>()).transpose()?;
    // No query sees a row before the first query's window: the problem starts at that
    // row (shifting every key by `first` keeps the bottom-right alignment and the
    // windows), so those rows are neither read nor converted.
    let first = dims.window_start(window, 0);
    let dims = Dims { tk: kv_len - first, ..dims };
    let qf = f32_data(OP, "q", q)?;
    if cache_dtype != DType::F32 && dims.tq == 1 && dims.d > 0 {
        // One query reads each cache row once: 16-bit rows are widened as they are read.
        let kv_stride = capacity * dims.d;
        return match cache_dtype {
            DType::F16 => {
                let (k, v) = (cache_rows::<f16>(k_cache, first)?, cache_rows::<f16>(v_cache, first)?);
                let p = Problem { dims, q: &qf, k, v, kv_stride, scale, causal: true, window, mask: None, sinks };
                run_decode(cpu, &p, q.dtype())
            }
            _ => {
                let (k, v) = (cache_rows::<bf16>(k_cache, first)?, cache_rows::<bf16>(v_cache, first)?);
                let p = Problem { dims, q: &qf, k, v, kv_stride, scale, causal: true, window, mask: None, sinks };
                run_decode(cpu, &p, q.dtype())
            }
        };
    }
    // Several queries (a chunk of a prompt): the blocked forward, over f32 rows (a 16-bit
    // cache's rows `first .. kv_len` are widened once per call and read by every query).
    let (kf, kv_stride) = cache_rows_f32(OP, k_cache, first, kv_len)?;
    let (vf, _) = cache_rows_f32(OP, v_cache, first, kv_len)?;
    let p = Problem { dims, q: &qf, k: &kf, v: &vf, kv_stride, scale, causal: true, window, mask: None, sinks };
    Ok(run_forward(cpu, &p, q.dtype())?.0)
}

/// A 16-bit cache's elements from row `first` of its first head on (empty when it has
/// no rows).
fn cache_rows<T: crate::dtype::Element>(cache: &Tensor, first: usize) -> Result<&[T]> {
    let d = cache.dims()[3];
    Ok(cache.as_slice::<T>()?.get(first * d..).unwrap_or(&[]))
}

/// The single-query forward over a 16-bit cache (`decode::applies`), the output in `dtype`.
fn run_decode<T: decode::KvElem>(cpu: &CpuBackend, p: &Problem<T>, dtype: DType) -> Result<Tensor> {
    let Dims { batch, hq, d, .. } = p.dims;
    let n = batch * hq * d;
    let (mut out, mut lse) = (Vec::<f32>::with_capacity(n), Vec::<f32>::with_capacity(batch * hq));
    if batch * hq > 0 {
        decode::forward(cpu, p, &mut out.spare_capacity_mut()[..n], &mut lse.spare_capacity_mut()[..batch * hq]);
        // SAFETY: `decode::forward` writes every element of both (a panic in it propagates
        // before this line, dropping them empty).
        unsafe { (out.set_len(n), lse.set_len(batch * hq)) };
    }
    in_dtype(Tensor::from_vec(out, [batch, hq, 1, d])?, dtype)
}

/// Rows `first .. kv_len` of every head of a `[B, Hkv, capacity, D]` cache as f32 (row
/// `first` first), and the stride between heads: an F32 cache is borrowed in place
/// (rows outside the range are never read); F16/BF16 caches convert only those rows
/// of each head.
fn cache_rows_f32<'a>(
    op: &'static str,
    cache: &'a Tensor,
    first: usize,
    kv_len: usize,
) -> Result<(Cow<'a, [f32]>, usize)> {
    let dims = cache.dims();
    let (capacity, d) = (dims[2], dims[3]);
    if cache.dtype() == DType::F32 {
        // An empty cache (batch or heads 0) has no rows to skip.
        let rows = cache.as_slice::<f32>()?.get(first * d..).unwrap_or(&[]);
        return Ok((Cow::Borrowed(rows), capacity * d));
    }
    let heads = dims[0] * dims[1];
    let rows = kv_len - first;
    let mut out = Vec::with_capacity(heads * rows * d);
    for h in 0..heads {
        let part = cache.view((h * capacity + first) * d, Shape::new([rows * d]))?;
        out.extend_from_slice(&f32_data(op, "cache", &part)?);
    }
    Ok((Cow::Owned(out), rows * d))
}
