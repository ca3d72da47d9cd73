//! Rotary position embedding, embedding lookup and row scatters. F16/BF16: rope widens x
//! (the tables stay F32) and narrows its output, a 16-bit table is gathered as bits, the
//! embedding gradient is F32 from any float d_out, and a 16-bit scatter destination is
//! updated through an f32 copy (each element rounded once).

use fusebox::cpu;
use fusebox::spec::embedding::{self as spec, ScatterSpec, TableSpec};
use fusebox::spec::rope::{self as rope_spec, RopeSpec};
use fusebox::{in_place_on_cpu, ComputeBackend, DType, Result, RopeStyle, Shape, Tensor};

use crate::backend::WgpuBackend;
use crate::context::Context;
use crate::kernels;
use crate::ops::convert::word_aligned;
use crate::ops::{f, u};

pub(crate) fn rope(
    be: &WgpuBackend,
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    style: RopeStyle,
    offset: usize,
) -> Result<Tensor> {
    let s = rope_spec::rope("rope", "x", x, cos, sin, offset)?;
    // The shader rotates whole rows; partial rotary runs on the CPU.
    if s.d == 0 || 2 * s.pairs != s.d || !word_aligned(&[x]) {
        return fallback!(be, cpu::rope::rope; [x, cos, sin], style, offset);
    }
    be.rope_native("rope", x, cos, sin, s, style, offset, 1.0)
}

pub(crate) fn rope_backward(
    be: &WgpuBackend,
    d_out: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    style: RopeStyle,
    offset: usize,
) -> Result<Tensor> {
    let s = rope_spec::rope("rope_backward", "d_out", d_out, cos, sin, offset)?;
    if s.d == 0 || 2 * s.pairs != s.d || !word_aligned(&[d_out]) {
        return fallback!(be, cpu::rope::rope_backward; [d_out, cos, sin], style, offset);
    }
    be.rope_native("rope_backward", d_out, cos, sin, s, style, offset, -1.0)
}

pub(crate) fn embedding(be: &WgpuBackend, ids: &Tensor, table: &Tensor) -> Result<Tensor> {
    const OP: &str = "embedding";
    let TableSpec { rows: vocab, dim: d, dtype } = spec::embedding(ids, table)?;
    if !dtype.is_float() || d == 0 || !word_aligned(&[table]) {
        return fallback!(be, cpu::embedding::embedding; [ids, table]);
    }
    let host_ids = be.to_host(ids)?;
    spec::ids(OP, "ids", host_ids.as_slice::<u32>()?, vocab)?;
    let mut dims = ids.dims().to_vec();
    dims.push(d);
    let out = be.ctx.empty(OP, Shape::new(dims), table.dtype())?;
    let n = out.elem_count();
    if n == 0 {
        return Ok(out);
    }
    let (ids, table) = (be.dev(ids)?, be.dev(table)?);
    // 16-bit tables: one thread per output word, blocks starting on a word.
    let (kernel, items, per) = if table.dtype() == DType::F32 {
        (&kernels::EMBEDDING, n, be.ctx.rows_per_binding(d))
    } else {
        (&kernels::EMBEDDING16, n.div_ceil(2), (be.ctx.rows_per_binding(d) & !1).max(2))
    };
    let mut r0 = 0;
    while r0 < vocab {
        let r1 = (r0 + per).min(vocab);
        let block = Context::row_block(&table, d, r0, r1 - r0)?;
        be.ctx.flat(OP, kernel, &[&ids, &block, &out], &[u(n)?, u(d)?, u(r0)?, u(r1)?], items)?;
        r0 = r1;
    }
    Ok(out)
}

pub(crate) fn embedding_backward(be: &WgpuBackend, ids: &Tensor, d_out: &Tensor, vocab: usize) -> Result<Tensor> {
    const OP: &str = "embedding_backward";
    let TableSpec { dim: d, .. } = spec::embedding_backward(ids, d_out, vocab)?;
    if d == 0 || !word_aligned(&[d_out]) {
        return fallback!(be, cpu::embedding::embedding_backward; [ids, d_out], vocab);
    }
    let host_ids = be.to_host(ids)?;
    let idv = host_ids.as_slice::<u32>()?;
    spec::ids(OP, "ids", idv, vocab)?;
    let table = be.ctx.zeros(OP, [vocab, d], DType::F32)?;
    let src = be.widen(OP, d_out)?;
    be.scatter_rows(OP, &table, idv, &src, d, false)?;
    Ok(table)
}

pub(crate) fn scatter_add_rows(be: &WgpuBackend, dst: &mut Tensor, ids: &Tensor, src: &Tensor) -> Result<()> {
    const OP: &str = "scatter_add_rows";
    let ScatterSpec { rows, row: d, .. } = spec::scatter(OP, "dst", dst, ids, src)?;
    let host_ids = be.to_host(ids)?;
    let idv = host_ids.as_slice::<u32>()?;
    spec::ids(OP, "ids", idv, rows)?;
    if dst.is_host() || !word_aligned(&[dst, src]) {
        let (ids, src) = (be.to_host(ids)?, be.to_host(src)?);
        be.ctx.note_fallback("in place");
        return in_place_on_cpu(be, dst, |cpu, dst| cpu::embedding::scatter_add_rows(cpu, dst, &ids, &src));
    }
    dst.ensure_writable(OP)?;
    let src = be.widen(OP, src)?;
    be.update_widened(OP, &[&*dst], |dst| be.scatter_rows(OP, &dst[0], idv, &src, d, true))
}

impl WgpuBackend {
    /// Host-side grouping of `ids` for the deterministic scatter kernel:
    /// `[rows[U], starts[U + 1], order[M]]` with rows sorted.
    pub(crate) fn group_ids(ids: &[u32]) -> (Vec<u32>, usize) {
        let mut order: Vec<u32> = (0..ids.len() as u32).collect();
        order.sort_by_key(|&i| (ids[i as usize], i));
        let mut rows = Vec::new();
        let mut starts = Vec::new();
        for (k, &i) in order.iter().enumerate() {
            let r = ids[i as usize];
            if rows.last() != Some(&r) {
                rows.push(r);
                starts.push(k as u32);
            }
        }
        starts.push(order.len() as u32);
        let nu = rows.len();
        let mut meta = rows;
        meta.extend(starts);
        meta.extend(order);
        (meta, nu)
    }

    /// `dst[ids[n]] (+)= src[n]` for f32 `[*, d]` rows, block by block of dst rows so
    /// that tables beyond one binding work.
    pub(crate) fn scatter_rows(
        &self,
        op: &'static str,
        dst: &Tensor,
        ids: &[u32],
        src: &Tensor,
        d: usize,
        acc: bool,
    ) -> Result<()> {
        if ids.is_empty() || d == 0 {
            return Ok(());
        }
        let (meta, nu) = Self::group_ids(ids);
        let rows: Vec<u32> = meta[..nu].to_vec();
        let meta = self.upload(&Tensor::from_vec(meta, [nu * 2 + 1 + ids.len()])?)?;
        let vocab = dst.elem_count() / d;
        let per = self.ctx.rows_per_binding(d);
        let mut r0 = 0usize;
        while r0 < vocab {
            let r1 = (r0 + per).min(vocab);
            let u0 = rows.partition_point(|&r| (r as usize) < r0);
            let u1 = rows.partition_point(|&r| (r as usize) < r1);
            if u1 > u0 {
                let block = crate::context::Context::row_block(dst, d, r0, r1 - r0)?;
                let count = (u1 - u0) * d;
                let params = [u(nu)?, u(d)?, u(u0)?, u(count)?, u(r0)?, acc as u32];
                self.ctx.flat(op, &kernels::SCATTER_ROWS, &[&meta, src, &block], &params, count)?;
            }
            r0 = r1;
        }
        Ok(())
    }

    /// The rotation of a validated call (`sign` −1: the inverse, for the backward).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rope_native(
        &self,
        op: &'static str,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        s: RopeSpec,
        style: RopeStyle,
        offset: usize,
        sign: f32,
    ) -> Result<Tensor> {
        let RopeSpec { seq: t, d: dim, dtype, .. } = s;
        let half = dim / 2;
        let (x, cos, sin) = (self.widen(op, x)?, self.dev(cos)?, self.dev(sin)?);
        let out = self.ctx.empty(op, x.shape().clone(), DType::F32)?;
        let n = x.elem_count() / 2;
        let params = [u(n)?, u(t)?, u(half)?, (style == RopeStyle::Interleaved) as u32, u(offset)?, f(sign)];
        self.ctx.flat(op, &kernels::ROPE, &[&x, &cos, &sin, &out], &params, n)?;
        self.narrow(op, out, dtype)
    }
}
