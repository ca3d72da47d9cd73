//! Attention: forward (full, causal, decode), backward, KV-cache writes. F16/BF16 q, k,
//! v (and d_out, the saved output) are widened to f32 on the device; outputs and
//! gradients are stored in q's dtype, the logsumexp stays F32, as on the CPU.
//!
//! Attention sinks (gpt-oss): the forward kernels start each row's online softmax from
//! the sink's term (see attention.wgsl); the backward's dq, dk, dv kernels need nothing
//! more (the saved logsumexp includes the sinks), and `attn_dsinks.wgsl` sums the sinks'
//! gradient.

use fusebox::cpu;
use fusebox::spec::attention::{self as spec, AttentionDims, DecodeSpec};
use fusebox::{
    in_place_on_cpu, AttentionGradients, CausalAttentionResult, ComputeBackend, DType, Error, Result, Shape, Tensor,
};

use crate::backend::WgpuBackend;
use crate::context::buffer_of;
use crate::kernels;
use crate::ops::convert::word_aligned;
use crate::ops::{f, u};

/// Keys (or query rows) one attention dispatch covers: llvmpipe ends a shader's loops
/// after 65535 iterations, so long loops are split across dispatches.
pub(crate) const KEY_CHUNK: usize = 128;

/// Largest head dimension of the attention kernels (per-thread row buffers).
pub(crate) const MAX_HEAD_DIM: usize = 256;

/// Whether the attention kernels take a validated call: a head dimension they hold
/// (per-thread row buffers of `MAX_HEAD_DIM`) and every tensor bindable.
fn native(dims: &AttentionDims, ts: &[&Tensor]) -> bool {
    dims.d > 0 && dims.d <= MAX_HEAD_DIM && word_aligned(ts)
}

pub(crate) fn attention(
    be: &WgpuBackend,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let dims = spec::attention(q, k, v, causal)?;
    if !native(&dims, &[q, k, v]) {
        return fallback!(be, cpu::attention::attention; [q, k, v], scale, causal);
    }
    Ok(be.attention_forward("attention", q, k, v, dims, dims.tk, None, None, scale, causal)?.output)
}

/// Host copies of the sinks for the CPU fallback.
fn host_sinks(be: &WgpuBackend, sinks: Option<&Tensor>) -> Result<Option<Tensor>> {
    sinks.map(|s| be.to_host(s)).transpose()
}

/// The tensors a call binds, the sinks among them when there are some.
fn with_sinks<'a>(ts: &[&'a Tensor], sinks: Option<&'a Tensor>) -> Vec<&'a Tensor> {
    ts.iter().copied().chain(sinks).collect()
}

pub(crate) fn causal_attention(
    be: &WgpuBackend,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<usize>,
    sinks: Option<&Tensor>,
    scale: f32,
) -> Result<CausalAttentionResult> {
    let dims = spec::causal_attention(q, k, v, window, sinks)?;
    if !native(&dims, &with_sinks(&[q, k, v], sinks)) {
        let sinks = host_sinks(be, sinks)?;
        return fallback!(be, cpu::attention::causal_attention; [q, k, v], window, sinks.as_ref(), scale);
    }
    be.attention_forward("causal_attention", q, k, v, dims, dims.tk, window, sinks, scale, true)
}

pub(crate) fn causal_attention_backward(
    be: &WgpuBackend,
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
    if !native(&dims, &with_sinks(&[q, k, v, &result.output, d_out, &result.logsumexp], sinks)) {
        let result =
            CausalAttentionResult { output: be.to_host(&result.output)?, logsumexp: be.to_host(&result.logsumexp)? };
        let (d_out, sinks) = (be.to_host(d_out)?, host_sinks(be, sinks)?);
        return fallback!(
            be,
            cpu::attention::causal_attention_backward;
            [q, k, v],
            &result,
            &d_out,
            window,
            sinks.as_ref(),
            scale
        );
    }
    let AttentionDims { batch: b, hq, hkv, tq, tk, d, .. } = dims;
    let dtype = q.dtype();
    let (q, k, v) = (be.widen(OP, q)?, be.widen(OP, k)?, be.widen(OP, v)?);
    let (o, lse, dout) = (be.widen(OP, &result.output)?, be.dev(&result.logsumexp)?, be.widen(OP, d_out)?);
    let rows = b * hq * tq;
    let delta = be.ctx.empty(OP, [rows], DType::F32)?;
    be.ctx.dispatch(OP, &kernels::ATTN_DELTA, &[&o, &dout, &delta], &[u(rows)?, u(d)?], (rows as u64).div_ceil(64))?;
    let dq = be.ctx.empty(OP, q.shape().clone(), DType::F32)?;
    let dk = be.ctx.empty(OP, k.shape().clone(), DType::F32)?;
    let dv = be.ctx.empty(OP, v.shape().clone(), DType::F32)?;
    let groups = (rows as u64).div_ceil(64);
    let w = window_param(window, tk)?;
    // Key chunks before the first query row's window are seen by no row: skipped.
    let chunks = first_chunk(&dims, window)..tk.div_ceil(KEY_CHUNK).max(1);
    let c0 = chunks.start;
    for c in chunks {
        let (j0, j1) = (c * KEY_CHUNK, ((c + 1) * KEY_CHUNK).min(tk));
        let p = [u(rows)?, u(hq)?, u(hkv)?, u(tq)?, u(tk)?, u(d)?, f(scale), u(j0)?, u(j1)?, (c == c0) as u32, w];
        be.ctx.dispatch(OP, &kernels::ATTN_DQ, &[&q, &k, &v, &lse, &dout, &delta, &dq], &p, groups)?;
    }
    let kv_rows = b * hkv * tk;
    let groups = (kv_rows as u64).div_ceil(64);
    let chunks = tq.div_ceil(KEY_CHUNK).max(1);
    for g in 0..hq / hkv {
        for c in 0..chunks {
            let (i0, i1) = (c * KEY_CHUNK, ((c + 1) * KEY_CHUNK).min(tq));
            let first = (g == 0 && c == 0) as u32;
            let p = [u(kv_rows)?, u(hq)?, u(hkv)?, u(tq)?, u(tk)?, u(d)?, f(scale), u(g)?, u(i0)?, u(i1)?, first, w];
            let args = [&q, &k, &v, &lse, &dout, &delta, &dk, &dv];
            be.ctx.dispatch(OP, &kernels::ATTN_DKV, &args, &p, groups)?;
        }
    }
    let dsinks = match sinks {
        Some(s) => Some(be.sink_gradients(&dims, &be.dev(s)?, &lse, &delta)?),
        None => None,
    };
    Ok(AttentionGradients {
        dq: be.narrow(OP, dq, dtype)?,
        dk: be.narrow(OP, dk, dtype)?,
        dv: be.narrow(OP, dv, dtype)?,
        dsinks,
    })
}

pub(crate) fn supports_causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<usize>,
    sinks: Option<&Tensor>,
) -> bool {
    spec::causal_attention(q, k, v, window, sinks).is_ok_and(|dims| native(&dims, &with_sinks(&[q, k, v], sinks)))
}

/// The kernels' `window` parameter: 0 for none, else W (at most Tk: a window of Tk
/// keys or more is full causal).
fn window_param(window: Option<usize>, tk: usize) -> Result<u32> {
    u(window.map_or(0, |w| w.min(tk)))
}

/// The first key chunk a causal call's first query row sees (0 without a window):
/// rows' windows start later with the row, so no row sees a chunk before it.
fn first_chunk(dims: &AttentionDims, window: Option<usize>) -> usize {
    dims.window_start(window, 0) / KEY_CHUNK
}

pub(crate) fn write_head_cache(be: &WgpuBackend, cache: &mut Tensor, new: &Tensor, pos: usize) -> Result<()> {
    const OP: &str = "write_head_cache";
    let w = spec::write_head_cache(cache, new, pos)?;
    if cache.is_host() || !word_aligned(&[cache, new]) {
        let new = be.to_host(new)?;
        be.ctx.note_fallback("in place");
        return in_place_on_cpu(be, cache, |cpu, cache| cpu::attention::write_head_cache(cpu, cache, &new, pos));
    }
    cache.ensure_writable(OP)?;
    let new = be.dev(new)?;
    let (b, h, cap, d, t) = (w.batch, w.heads, w.capacity, w.d, w.rows);
    let (cb, nb) = (buffer_of(cache)?, buffer_of(&new)?);
    if cb.raw() == nb.raw() {
        return Err(Error::SharedStorage { op: OP });
    }
    // F32 rows into a 16-bit cache: rounded (to nearest, ties to even) on the device first.
    let new = if w.new_dtype != w.dtype { be.narrow(OP, new, w.dtype)? } else { new };
    let nb = buffer_of(&new)?;
    // Rows are copied buffer to buffer when their byte ranges are 4-byte aligned (F32,
    // or 16-bit with an even head dim), else by the 16-bit copy kernel.
    let elem = cache.dtype().storage_bytes(1);
    let row_bytes = (t * d * elem) as u64;
    for bh in 0..b * h {
        let (dst, src) = ((bh * cap + pos) * d, bh * t * d);
        if (d * elem).is_multiple_of(4) {
            let dst_b = cache.byte_offset() as u64 + (dst * elem) as u64;
            be.ctx.copy(nb.raw(), new.byte_offset() as u64 + (src * elem) as u64, cb.raw(), dst_b, row_bytes);
        } else {
            be.permute_into(OP, (&new, src), &Shape::new(vec![t * d]), &[0], (cache, dst))?;
        }
    }
    Ok(())
}

pub(crate) fn decode_attention(
    be: &WgpuBackend,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    kv_len: usize,
    window: Option<usize>,
    sinks: Option<&Tensor>,
    scale: f32,
) -> Result<Tensor> {
    let DecodeSpec { dims, capacity, cache_dtype } =
        spec::decode_attention(q, k_cache, v_cache, kv_len, window, sinks)?;
    if dims.tq == 0 || !native(&dims, &with_sinks(&[q, k_cache, v_cache], sinks)) {
        let sinks = host_sinks(be, sinks)?;
        return fallback!(
            be,
            cpu::attention::decode_attention;
            [q, k_cache, v_cache],
            kv_len,
            window,
            sinks.as_ref(),
            scale
        );
    }
    if cache_dtype != DType::F32 {
        // 16-bit caches are read in place, each element widened in the kernel.
        return be.attention_kv16(q, k_cache, v_cache, dims, capacity, cache_dtype, window, sinks, scale);
    }
    Ok(be
        .attention_forward("decode_attention", q, k_cache, v_cache, dims, capacity, window, sinks, scale, true)?
        .output)
}

impl WgpuBackend {
    /// The sinks' gradient `[Hq]` from the saved logsumexp and `delta = dO·O` (`[B, Hq,
    /// Tq]` each, on the device), in dispatches of at most [`KEY_CHUNK`]·64 rows.
    fn sink_gradients(&self, dims: &AttentionDims, sinks: &Tensor, lse: &Tensor, delta: &Tensor) -> Result<Tensor> {
        const OP: &str = "causal_attention_backward";
        let AttentionDims { batch: b, hq, tq, .. } = *dims;
        let dsinks = self.ctx.empty(OP, [hq], DType::F32)?;
        let rows = b * tq;
        let chunk = KEY_CHUNK * 64;
        for c in 0..rows.div_ceil(chunk).max(1) {
            let (n0, n1) = (c * chunk, ((c + 1) * chunk).min(rows));
            let p = [u(hq)?, u(tq)?, u(n0)?, u(n1)?, (c == 0) as u32];
            let args = [lse, delta, sinks, &dsinks];
            self.ctx.dispatch(OP, &kernels::ATTN_DSINKS, &args, &p, (hq as u64).div_ceil(64))?;
        }
        Ok(dsinks)
    }

    /// `decode_attention` over F16/BF16 caches (`cache_dtype`), read in place: the
    /// attention kernel's key loop with each cache element widened as it is loaded.
    #[allow(clippy::too_many_arguments)]
    fn attention_kv16(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        dims: AttentionDims,
        cap: usize,
        cache_dtype: DType,
        window: Option<usize>,
        sinks: Option<&Tensor>,
        scale: f32,
    ) -> Result<Tensor> {
        const OP: &str = "decode_attention";
        let AttentionDims { batch: b, hq, hkv, tq, tk, d, .. } = dims;
        let kind = if cache_dtype == DType::F16 { 1u32 } else { 2 };
        let dtype = q.dtype();
        let (q, k, v) = (self.widen(OP, q)?, self.dev(k)?, self.dev(v)?);
        // Without sinks, q stands in for the unread sinks binding.
        let sinks = sinks.map(|s| self.dev(s)).transpose()?;
        let (has_sinks, sinks) = (sinks.is_some() as u32, sinks.unwrap_or_else(|| q.clone()));
        let output = self.ctx.empty(OP, q.shape().clone(), DType::F32)?;
        let logsumexp = self.ctx.empty(OP, [b, hq, tq], DType::F32)?;
        let rows = b * hq * tq;
        let lsum = self.ctx.empty(OP, [rows], DType::F32)?;
        let w = window_param(window, tk)?;
        let c0 = first_chunk(&dims, window);
        let chunks = tk.div_ceil(KEY_CHUNK).max(1);
        for c in c0..chunks {
            let (j0, j1) = (c * KEY_CHUNK, ((c + 1) * KEY_CHUNK).min(tk));
            let params = [
                u(rows)?,
                u(hq)?,
                u(hkv)?,
                u(tq)?,
                u(tk)?,
                u(cap)?,
                u(d)?,
                f(scale),
                1,
                u(j0)?,
                u(j1)?,
                (c == c0) as u32,
                (c + 1 == chunks) as u32,
                w,
                kind,
                has_sinks,
            ];
            let args = [&q, &k, &v, &output, &logsumexp, &lsum, &sinks];
            self.ctx.dispatch(OP, &kernels::ATTENTION_KV16, &args, &params, (rows as u64).div_ceil(64))?;
        }
        self.narrow(OP, output, dtype)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_forward(
        &self,
        op: &'static str,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        dims: AttentionDims,
        cap: usize,
        window: Option<usize>,
        sinks: Option<&Tensor>,
        scale: f32,
        causal: bool,
    ) -> Result<CausalAttentionResult> {
        let AttentionDims { batch: b, hq, hkv, tq, tk, d, .. } = dims;
        let dtype = q.dtype();
        let (q, k, v) = (self.widen(op, q)?, self.widen(op, k)?, self.widen(op, v)?);
        // Without sinks, q stands in for the unread sinks binding.
        let sinks = sinks.map(|s| self.dev(s)).transpose()?;
        let (has_sinks, sinks) = (sinks.is_some() as u32, sinks.unwrap_or_else(|| q.clone()));
        let output = self.ctx.empty(op, q.shape().clone(), DType::F32)?;
        let logsumexp = self.ctx.empty(op, [b, hq, tq], DType::F32)?;
        let rows = b * hq * tq;
        let lsum = self.ctx.empty(op, [rows], DType::F32)?;
        let w = window_param(window, tk)?;
        // Key chunks before the first query row's window are seen by no row: skipped (the
        // first chunk dispatched initializes the running state, the last normalizes).
        let c0 = if causal { first_chunk(&dims, window) } else { 0 };
        let chunks = tk.div_ceil(KEY_CHUNK).max(1);
        for c in c0..chunks {
            let (j0, j1) = (c * KEY_CHUNK, ((c + 1) * KEY_CHUNK).min(tk));
            let params = [
                u(rows)?,
                u(hq)?,
                u(hkv)?,
                u(tq)?,
                u(tk)?,
                u(cap)?,
                u(d)?,
                f(scale),
                causal as u32,
                u(j0)?,
                u(j1)?,
                (c == c0) as u32,
                (c + 1 == chunks) as u32,
                w,
                has_sinks,
            ];
            let args = [&q, &k, &v, &output, &logsumexp, &lsum, &sinks];
            self.ctx.dispatch(op, &kernels::ATTENTION, &args, &params, (rows as u64).div_ceil(64))?;
        }
        Ok(CausalAttentionResult { output: self.narrow(op, output, dtype)?, logsumexp })
    }
}
