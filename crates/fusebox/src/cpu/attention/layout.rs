//! The unfused pieces around attention: the explicit causal mask, the causal softmax,
//! KV cache writes and the head split/merge layouts.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::cpu::convert::{f32_data, from_f32};
use crate::cpu::pool::SERIAL_WORK;
use crate::cpu::simd;
use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::Shape;
use crate::spec::attention as spec;
use crate::tensor::Tensor;

/// The additive causal mask aligned bottom-right: `0` where `j ≤ i + (kv_len − seq)`,
/// `−∞` elsewhere.
///
/// # Shapes
/// → `[seq, kv_len]` f32; `seq ≤ kv_len`.
pub fn causal_mask(cpu: &CpuBackend, seq: usize, kv_len: usize) -> Result<Tensor> {
    // Called directly by backends (not through `on_cpu!`): hold this backend's ISA.
    let _isa = cpu.enter();
    spec::causal_mask(seq, kv_len)?;
    let mut mask = vec![0.0f32; seq * kv_len];
    cpu.for_each_chunk(&mut mask, kv_len, 1, |i, row| {
        row[i + 1 + kv_len - seq..].fill(f32::NEG_INFINITY);
    });
    Tensor::from_vec(mask, Shape::new([seq, kv_len]))
}

/// `softmax(scores·scale + causal_mask)` over the last dim, mask aligned bottom-right
/// (row i of each `[Tq, Tk]` matrix sees keys `j ≤ i + (Tk − Tq)`; the rest are 0).
///
/// # Shapes
/// `scores`: `[..., Tq, Tk]`, `Tq ≤ Tk` → same.
pub fn causal_softmax(cpu: &CpuBackend, scores: &Tensor, scale: f32) -> Result<Tensor> {
    const OP: &str = "causal_softmax";
    let (tq, tk) = spec::causal_softmax(scores)?;
    let x = f32_data(OP, "scores", scores)?;
    let mut out = vec![0.0f32; x.len()];
    cpu.for_each_chunk(&mut out, tk, 16, |row, y| {
        // Row i sees n = i + (Tk − Tq) + 1 ≥ 1 keys; the rest stay 0.
        let n = row % tq + 1 + tk - tq;
        let seen = &mut y[..n];
        for (o, &s) in seen.iter_mut().zip(&x[row * tk..row * tk + n]) {
            *o = s * scale;
        }
        let m = simd::max(seen);
        if m == f32::NEG_INFINITY {
            seen.fill(0.0);
            return;
        }
        let sum = simd::exp_sub_sum(seen, m);
        simd::scale(seen, 1.0 / sum);
    });
    from_f32(out, scores.shape().clone(), scores.dtype())
}

/// Writes `new` into rows `pos .. pos + T` of a preallocated cache, in place (no copy
/// of the cache; a cache whose storage is shared is refused). F32 rows written into an
/// F16/BF16 cache are rounded to nearest, ties to even.
///
/// # Shapes
/// `cache`: `[B, Hkv, capacity, D]` (F32, F16 or BF16); `new`: `[B, Hkv, T, D]`, the
/// cache's dtype or F32; `pos + T ≤ capacity`.
pub fn write_head_cache(cpu: &CpuBackend, cache: &mut Tensor, new: &Tensor, pos: usize) -> Result<()> {
    const OP: &str = "write_head_cache";
    let spec::CacheWrite { capacity, rows: t, d, dtype, new_dtype, .. } = spec::write_head_cache(cache, new, pos)?;
    cache.ensure_writable(OP)?;
    if t * d == 0 {
        return Ok(());
    }
    // The work is the rows written (T·D per head), not the cache's size: a decode step
    // writes one row per head, far too little for a parallel loop. (`len / head` is the
    // number of heads, in elements or in bytes alike.)
    let parallel = |len: usize, head: usize| len / head.max(1) * t * d >= SERIAL_WORK;
    if new_dtype != dtype {
        // F32 rows into a 16-bit cache (the only mixed pair the spec accepts).
        let src = new.as_slice::<f32>()?;
        let (head, rows) = (capacity * d, t * d);
        let at = pos * d..pos * d + rows;
        match dtype {
            DType::F16 => for_each_head(cpu, cache.as_mut_slice::<f16>()?, head, rows, parallel, |h, slab| {
                slab[at.clone()].convert_from_f32_slice(&src[h * rows..(h + 1) * rows]);
            }),
            _ => for_each_head(cpu, cache.as_mut_slice::<bf16>()?, head, rows, parallel, |h, slab| {
                slab[at.clone()].convert_from_f32_slice(&src[h * rows..(h + 1) * rows]);
            }),
        }
        return Ok(());
    }
    let elem = cache.dtype().storage_bytes(1);
    let (head_bytes, rows_bytes) = (capacity * d * elem, t * d * elem);
    let src = new.host_bytes()?;
    let dst = cache.host_bytes_mut()?;
    for_each_head(cpu, dst, head_bytes, t * d, parallel, |head, slab| {
        slab[pos * d * elem..pos * d * elem + rows_bytes]
            .copy_from_slice(&src[head * rows_bytes..(head + 1) * rows_bytes]);
    });
    Ok(())
}

/// `f(h, slab)` for each `head`-long slab of `data`: a parallel loop where
/// `parallel(data.len(), head)` says the writes are worth one, else on the caller.
fn for_each_head<T: Send>(
    cpu: &CpuBackend,
    data: &mut [T],
    head: usize,
    work: usize,
    parallel: impl Fn(usize, usize) -> bool,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    if parallel(data.len(), head) {
        cpu.for_each_chunk(data, head, work, f);
    } else {
        data.chunks_mut(head.max(1)).enumerate().for_each(|(h, slab)| f(h, slab));
    }
}

/// `[B, T, H·D] → [B, H, T, D]`.
///
/// # Shapes
/// `x`: `[B, T, H·D]` → `[B, H, T, D]`; any element dtype.
pub fn split_heads(cpu: &CpuBackend, x: &Tensor, heads: usize) -> Result<Tensor> {
    let spec::HeadsLayout { batch: b, seq: t, d, elem_bytes: elem, .. } = spec::split_heads(x, heads)?;
    let c = heads * d;
    let mut out = Tensor::zeros(Shape::new([b, heads, t, d]), x.dtype())?;
    let row = d * elem;
    let src = x.host_bytes()?;
    let dst = out.host_bytes_mut()?;
    if row > 0 {
        // Output row (b, h, t) ← input bytes of head h in row (b, t).
        cpu.for_each_chunk(dst, row, 1, |idx, o| {
            let (bh, ti) = (idx / t, idx % t);
            let (bi, h) = (bh / heads, bh % heads);
            let start = ((bi * t + ti) * c + h * d) * elem;
            o.copy_from_slice(&src[start..start + row]);
        });
    }
    Ok(out)
}

/// `[B, H, T, D] → [B, T, H·D]`.
///
/// # Shapes
/// `x`: `[B, H, T, D]` → `[B, T, H·D]`; any element dtype.
pub fn merge_heads(cpu: &CpuBackend, x: &Tensor) -> Result<Tensor> {
    let spec::HeadsLayout { batch: b, heads, seq: t, d, elem_bytes: elem } = spec::merge_heads(x)?;
    let mut out = Tensor::zeros(Shape::new([b, t, heads * d]), x.dtype())?;
    let row = d * elem;
    let src = x.host_bytes()?;
    let dst = out.host_bytes_mut()?;
    if row > 0 {
        // Output bytes of head h in row (b, t) ← input row (b, h, t).
        cpu.for_each_chunk(dst, row, 1, |idx, o| {
            let (bt, h) = (idx / heads, idx % heads);
            let (bi, ti) = (bt / t, bt % t);
            let start = ((bi * heads + h) * t + ti) * row;
            o.copy_from_slice(&src[start..start + row]);
        });
    }
    Ok(out)
}
