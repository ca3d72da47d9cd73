//! `WgpuBackend`: the `ComputeBackend` methods. Each native method first checks that
//! its inputs are exactly what its kernel handles (F32, consistent shapes, limits);
//! anything else goes to the CPU kernel, which computes it or returns its error.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fusebox::cpu;
use fusebox::{
    in_place_on_cpu, AdamWConfig, AttentionGradients, CausalAttentionResult, ComputeBackend, CrossEntropyOutput, DType,
    Device, DeviceKind, Error, GeluForm, LinearGradients, MatmulGradients, NormGradients, NormOutput, Op,
    PairGradients, Result, RopeStyle, Shape, Tensor, ToBackend,
};

use crate::context::{buffer_of, Context};
use crate::kernels;
use crate::ops::{f, is_f32, u, Bin, MatView, Un};

/// Runs the CPU kernel on host copies of the tensor arguments and uploads the result.
macro_rules! fallback {
    ($self:ident, $kernel:path; [$($t:ident),*] $(, $arg:expr)*) => {{
        $self.ctx.note_fallback(stringify!($kernel));
        $(let $t = $self.to_host($t)?;)*
        $kernel($self.cpu(), $(&$t,)* $($arg),*)?.to_backend($self)
    }};
}

/// The ops with a native kernel on this backend.
pub const NATIVE_OPS: &[Op] = &[
    Op::Name,
    Op::Device,
    Op::Supports,
    Op::Upload,
    Op::ToHost,
    Op::UsesDeviceStorage,
    Op::Synchronize,
    Op::ReleaseResources,
    Op::ReleaseTemporaryResources,
    Op::Zeros,
    Op::Copy,
    Op::CopyInto,
    Op::Fill,
    Op::PreprocessLinearWeight,
    Op::QuantizedMatmul,
    Op::Matmul,
    Op::MatmulBackward,
    Op::BatchedMatmul,
    Op::LinearForward,
    Op::LinearBackward,
    Op::LinearBackwardAccumulate,
    Op::Attention,
    Op::CausalAttention,
    Op::CausalAttentionBackward,
    Op::SupportsCausalAttention,
    Op::WriteHeadCache,
    Op::DecodeAttention,
    Op::SplitHeads,
    Op::MergeHeads,
    Op::Silu,
    Op::SiluBackward,
    Op::Gelu,
    Op::GeluBackward,
    Op::Relu,
    Op::ReluBackward,
    Op::Sigmoid,
    Op::SigmoidBackward,
    Op::Tanh,
    Op::TanhBackward,
    Op::SiluMul,
    Op::SiluMulBackward,
    Op::StableSoftplus,
    Op::RmsNorm,
    Op::RmsNormBackward,
    Op::LayerNorm,
    Op::LayerNormBackward,
    Op::AddRmsNorm,
    Op::Softmax,
    Op::SoftmaxBackward,
    Op::LogSoftmax,
    Op::CrossEntropy,
    Op::CrossEntropyBackward,
    Op::AdamwUpdate,
    Op::GlobalNorm,
    Op::Rope,
    Op::RopeBackward,
    Op::Embedding,
    Op::EmbeddingBackward,
    Op::ScatterAddRows,
    Op::SliceRows,
    Op::Add,
    Op::Sub,
    Op::Mul,
    Op::Div,
    Op::AddScalar,
    Op::SubScalar,
    Op::MulScalar,
    Op::DivScalar,
    Op::AddAssign,
    Op::SubAssign,
    Op::MulAssign,
    Op::DivAssign,
    Op::AddRow,
    Op::SubRow,
    Op::MulRow,
    Op::DivRow,
    Op::AddCol,
    Op::SubCol,
    Op::MulCol,
    Op::DivCol,
    Op::Add3,
    Op::ExpMul,
    Op::SubMul,
    Op::AddScaled,
    Op::Exp,
    Op::Log,
    Op::Sqrt,
    Op::Pow,
    Op::Neg,
    Op::Abs,
    Op::Clamp,
    Op::ExpInplace,
    Op::LogInplace,
    Op::SqrtInplace,
    Op::PowInplace,
    Op::NegInplace,
    Op::AbsInplace,
    Op::ClampInplace,
    Op::Permute,
    Op::Transpose,
];

/// The norms' `eps` rule (finite, ≥ 0); other values go to the CPU, which reports them.
fn eps_ok(eps: f32) -> bool {
    eps.is_finite() && eps >= 0.0
}

/// Keys (or query rows) one attention dispatch covers: llvmpipe ends a shader's loops
/// after 65535 iterations, so long loops are split across dispatches.
const KEY_CHUNK: usize = 128;

/// Rows the norms' weight-gradient kernel sums in one loop (more go to the CPU).
const MAX_DW_ROWS: usize = 32768;

/// Largest head dimension of the attention kernels (per-thread row buffers).
const MAX_HEAD_DIM: usize = 256;

/// fusebox on a GPU through wgpu.
#[derive(Debug, Clone)]
pub struct WgpuBackend {
    ctx: Arc<Context>,
    name: String,
}

impl WgpuBackend {
    /// Opens the best available adapter; errors (naming what was tried) when none exists.
    pub fn new() -> Result<WgpuBackend> {
        let ctx = Context::new()?;
        let name = format!("wgpu ({} / {:?})", ctx.info.name, ctx.info.backend);
        Ok(WgpuBackend { ctx: Arc::new(ctx), name })
    }

    /// Native kernel dispatches and buffer copies recorded since creation.
    pub fn native_dispatches(&self) -> u64 {
        self.ctx.dispatches.load(Ordering::Relaxed)
    }

    /// Op calls that ran on the CPU since creation.
    pub fn cpu_fallbacks(&self) -> u64 {
        self.ctx.fallbacks.load(Ordering::Relaxed)
    }

    /// The adapter: name, backend API, device type, driver.
    pub fn adapter_info(&self) -> String {
        let i = &self.ctx.info;
        format!("{} ({:?}, {:?}, driver {} {})", i.name, i.backend, i.device_type, i.driver, i.driver_info)
    }

    /// The limits this backend checks before binding or dispatching.
    pub fn limits_summary(&self) -> String {
        let l = &self.ctx.limits;
        format!(
            "max_buffer_size {} B, max_storage_buffer_binding_size {} B, max_compute_workgroups_per_dimension {}, \
             shader-f16 {}",
            l.max_buffer_size,
            l.max_storage_buffer_binding_size,
            l.max_compute_workgroups_per_dimension,
            self.ctx.features.contains(wgpu::Features::SHADER_F16)
        )
    }

    /// Names of the ops that run natively.
    pub fn native_op_names() -> Vec<&'static str> {
        NATIVE_OPS.iter().map(|o| o.name()).collect()
    }

    /// `t` as a device tensor of this backend (uploaded when on the host).
    fn dev(&self, t: &Tensor) -> Result<Tensor> {
        if t.is_host() {
            self.upload(t)
        } else {
            Ok(t.clone())
        }
    }

    fn all_f32(ts: &[&Tensor]) -> bool {
        ts.iter().all(|t| is_f32(t))
    }

    fn unary_op(&self, op: &'static str, x: &Tensor, code: Un, p0: f32, p1: f32) -> Result<Option<Tensor>> {
        if !is_f32(x) {
            return Ok(None);
        }
        let x = self.dev(x)?;
        self.ctx.unary(op, &x, code, p0, p1).map(Some)
    }

    fn binary_op(&self, op: &'static str, a: &Tensor, b: &Tensor, code: Bin, c: f32) -> Result<Option<Tensor>> {
        if !Self::all_f32(&[a, b]) || a.shape() != b.shape() {
            return Ok(None);
        }
        let (a, b) = (self.dev(a)?, self.dev(b)?);
        self.ctx.binary(op, &a, &b, code, c).map(Some)
    }

    /// Row (`col` false) or column broadcast of a binary op.
    fn broadcast_op(&self, op: &'static str, x: &Tensor, v: &Tensor, code: Bin, col: bool) -> Result<Option<Tensor>> {
        if !Self::all_f32(&[x, v]) || x.rank() == 0 {
            return Ok(None);
        }
        let n = x.shape().last_dim();
        let rows = x.elem_count() / n.max(1);
        let ok = if col {
            (v.rank() == 1 && v.dims()[0] == rows) || v.dims() == &x.dims()[..x.rank() - 1]
        } else {
            v.rank() == 1 && v.dims()[0] == n
        };
        if !ok || n == 0 {
            return Ok(None);
        }
        let (x, v) = (self.dev(x)?, self.dev(v)?);
        let out = self.ctx.empty(op, x.shape().clone(), DType::F32)?;
        let k = if col { &kernels::COL } else { &kernels::ROW };
        let total = x.elem_count();
        self.ctx.flat(op, k, &[&x, &v, &out], &[code as u32, u(total)?, u(n)?], total)?;
        Ok(Some(out))
    }

    fn inplace_unary(&self, op: &'static str, x: &mut Tensor, code: Un, p0: f32, p1: f32) -> Result<bool> {
        if x.is_host() || !is_f32(x) {
            return Ok(false);
        }
        x.ensure_writable(op)?;
        let n = x.elem_count();
        self.ctx.flat(op, &kernels::UNARY_INPLACE, &[x], &[code as u32, u(n)?, f(p0), f(p1)], n)?;
        Ok(true)
    }

    fn assign_op(&self, op: &'static str, a: &mut Tensor, b: &Tensor, code: Bin) -> Result<bool> {
        if a.is_host() || !Self::all_f32(&[a, b]) || a.shape() != b.shape() {
            return Ok(false);
        }
        a.ensure_writable(op)?;
        let b = self.dev(b)?;
        let n = a.elem_count();
        self.ctx.flat(op, &kernels::BINARY_INPLACE, &[a, &b], &[code as u32, u(n)?], n)?;
        Ok(true)
    }

    /// Queues the per-chunk (max |x|, Σ (x/max)²) pairs of one f32 device tensor; `None`
    /// for an empty tensor.
    fn queue_sum_squares(&self, t: &Tensor) -> Result<Option<Tensor>> {
        let n = t.elem_count();
        if n == 0 {
            return Ok(None);
        }
        let chunks = n.div_ceil(4096);
        let part = self.ctx.empty("global_norm", [chunks, 2], DType::F32)?;
        self.ctx.dispatch("global_norm", &kernels::SUM_SQUARES, &[t, &part], &[u(n)?], chunks as u64)?;
        Ok(Some(part))
    }

    /// The permutation kernel for f32 tensors of rank ≤ 6.
    fn permute_native(&self, op: &'static str, x: &Tensor, perm: &[usize]) -> Result<Tensor> {
        let dims = x.dims();
        let r = dims.len();
        let mut strides = vec![1usize; r];
        for d in (0..r.saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * dims[d + 1];
        }
        let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
        let out = self.ctx.empty(op, Shape::new(out_dims.clone()), DType::F32)?;
        let n = x.elem_count();
        let mut params = vec![u(n)?, r as u32];
        // Six dims (unused ones 1) and six input strides in output-axis order (unused 0).
        for &dim in out_dims.iter().chain(std::iter::repeat(&1)).take(6) {
            params.push(u(dim)?);
        }
        for i in 0..6 {
            params.push(if let Some(&p) = perm.get(i) { u(strides[p])? } else { 0 });
        }
        self.ctx.flat(op, &kernels::PERMUTE, &[x, &out], &params, n)?;
        Ok(out)
    }

    /// Host-side grouping of `ids` for the deterministic scatter kernel:
    /// `[rows[U], starts[U + 1], order[M]]` with rows sorted.
    fn group_ids(ids: &[u32]) -> (Vec<u32>, usize) {
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
    fn scatter_rows(
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

    /// Whether q/k/v are attention inputs the kernels take: returns (B, Hq, Hkv, Tq, Tk, D).
    fn attention_dims(q: &Tensor, k: &Tensor, v: &Tensor) -> Option<(usize, usize, usize, usize, usize, usize)> {
        if !Self::all_f32(&[q, k, v]) || q.rank() != 4 || k.rank() != 4 || k.shape() != v.shape() {
            return None;
        }
        let (qd, kd) = (q.dims(), k.dims());
        let (b, hq, tq, d) = (qd[0], qd[1], qd[2], qd[3]);
        let (hkv, tk) = (kd[1], kd[2]);
        let ok = kd[0] == b && kd[3] == d && hkv > 0 && hq % hkv == 0 && d <= MAX_HEAD_DIM && d > 0;
        ok.then_some((b, hq, hkv, tq, tk, d))
    }

    #[allow(clippy::too_many_arguments)]
    fn attention_forward(
        &self,
        op: &'static str,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        dims: (usize, usize, usize, usize, usize, usize),
        tk: usize,
        scale: f32,
        causal: bool,
    ) -> Result<CausalAttentionResult> {
        let (b, hq, hkv, tq, cap, d) = dims;
        let (q, k, v) = (self.dev(q)?, self.dev(k)?, self.dev(v)?);
        let output = self.ctx.empty(op, q.shape().clone(), DType::F32)?;
        let logsumexp = self.ctx.empty(op, [b, hq, tq], DType::F32)?;
        let rows = b * hq * tq;
        let lsum = self.ctx.empty(op, [rows], DType::F32)?;
        let chunks = tk.div_ceil(KEY_CHUNK).max(1);
        for c in 0..chunks {
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
                (c == 0) as u32,
                (c + 1 == chunks) as u32,
            ];
            let args = [&q, &k, &v, &output, &logsumexp, &lsum];
            self.ctx.dispatch(op, &kernels::ATTENTION, &args, &params, (rows as u64).div_ceil(64))?;
        }
        Ok(CausalAttentionResult { output, logsumexp })
    }

    fn norm_dims(x: &Tensor, w: &Tensor) -> Option<(usize, usize)> {
        if x.rank() == 0 || w.rank() != 1 {
            return None;
        }
        let d = x.shape().last_dim();
        (w.dims()[0] == d && d > 0).then(|| (x.elem_count() / d, d))
    }

    fn stat_ok(t: &Tensor, x: &Tensor) -> bool {
        is_f32(t) && t.dims() == &x.dims()[..x.rank() - 1]
    }

    /// dx of rms (mean None) or layer norm, plus dw and db.
    fn norm_backward_native(
        &self,
        op: &'static str,
        x: &Tensor,
        w: &Tensor,
        mean: Option<&Tensor>,
        rstd: &Tensor,
        dy: &Tensor,
        (rows, d): (usize, usize),
    ) -> Result<NormGradients> {
        let (x, w, rstd, dy) = (self.dev(x)?, self.dev(w)?, self.dev(rstd)?, self.dev(dy)?);
        let mean = mean.map(|m| self.dev(m)).transpose()?;
        let has_mean = mean.is_some() as u32;
        let m = mean.as_ref().unwrap_or(&rstd);
        let dx = self.ctx.empty(op, x.shape().clone(), DType::F32)?;
        let dweight = self.ctx.empty(op, [d], DType::F32)?;
        let dbias = self.ctx.empty(op, [d], DType::F32)?;
        let params = [u(rows)?, u(d)?, has_mean];
        self.ctx.dispatch(op, &kernels::NORM_BACKWARD, &[&x, &w, m, &rstd, &dy, &dx], &params, rows as u64)?;
        self.ctx.flat(op, &kernels::NORM_DW, &[&x, m, &rstd, &dy, &dweight, &dbias], &params, d)?;
        Ok(NormGradients { dx, dweight, dbias: mean.is_some().then_some(dbias) })
    }

    /// Cross-entropy rows on the GPU: validated targets (read back), loss and gradient.
    fn cross_entropy_native(
        &self,
        op: &'static str,
        logits: &Tensor,
        targets: &Tensor,
        ignore: Option<u32>,
        d_loss: f32,
    ) -> Result<Option<(Tensor, Tensor, usize)>> {
        if !is_f32(logits) || logits.rank() != 2 || targets.dtype() != DType::U32 || targets.rank() != 1 {
            return Ok(None);
        }
        let (n, vocab) = (logits.dims()[0], logits.dims()[1]);
        if targets.dims()[0] != n || vocab == 0 {
            return Ok(None);
        }
        let host_t = self.to_host(targets)?;
        let ts = host_t.as_slice::<u32>()?;
        if ts.iter().any(|&t| Some(t) != ignore && t as usize >= vocab) {
            return Ok(None);
        }
        let count = ts.iter().filter(|&&t| Some(t) != ignore).count();
        let (logits, targets) = (self.dev(logits)?, self.dev(targets)?);
        let row_loss = self.ctx.empty(op, [n], DType::F32)?;
        let d_logits = self.ctx.empty(op, [n, vocab], DType::F32)?;
        let scale = if count > 0 { d_loss / count as f32 } else { 0.0 };
        let params = [u(n)?, u(vocab)?, ignore.is_some() as u32, ignore.unwrap_or(0), f(scale)];
        self.ctx.dispatch(
            op,
            &kernels::CROSS_ENTROPY,
            &[&logits, &targets, &row_loss, &d_logits],
            &params,
            n as u64,
        )?;
        Ok(Some((row_loss, d_logits, count)))
    }

    fn rope_native(
        &self,
        op: &'static str,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        style: RopeStyle,
        offset: usize,
        sign: f32,
    ) -> Result<Option<Tensor>> {
        if !Self::all_f32(&[x, cos, sin]) || x.rank() != 4 || cos.rank() != 2 || cos.shape() != sin.shape() {
            return Ok(None);
        }
        let dx = x.dims();
        let (t, dim) = (dx[2], dx[3]);
        let half = dim / 2;
        if dim % 2 != 0 || half == 0 || cos.dims()[1] != half || offset + t > cos.dims()[0] {
            return Ok(None);
        }
        let (x, cos, sin) = (self.dev(x)?, self.dev(cos)?, self.dev(sin)?);
        let out = self.ctx.empty(op, x.shape().clone(), DType::F32)?;
        let n = x.elem_count() / 2;
        let params = [u(n)?, u(t)?, u(half)?, (style == RopeStyle::Interleaved) as u32, u(offset)?, f(sign)];
        self.ctx.flat(op, &kernels::ROPE, &[&x, &cos, &sin, &out], &params, n)?;
        Ok(Some(out))
    }

    /// dst ← src on the device (both device tensors, same byte length).
    fn copy_device(&self, dst: &Tensor, src: &Tensor) -> Result<()> {
        let (db, sb) = (buffer_of(dst)?, buffer_of(src)?);
        let len = dst.byte_len() as u64;
        let (doff, soff) = (dst.byte_offset() as u64, src.byte_offset() as u64);
        if len.is_multiple_of(4) && doff.is_multiple_of(4) && soff.is_multiple_of(4) {
            if db.raw() == sb.raw() {
                let tmp = self.ctx.copy_tensor("copy_into", src)?;
                self.ctx.copy(buffer_of(&tmp)?.raw(), 0, db.raw(), doff, len);
            } else {
                self.ctx.copy(sb.raw(), soff, db.raw(), doff, len);
            }
            return Ok(());
        }
        // Unaligned (2-byte dtypes): patch the covering words on the host.
        let host = self.to_host(src)?;
        let start = doff / 4 * 4;
        let end = (doff + len).div_ceil(4) * 4;
        let mut words = self.ctx.read("copy_into", db.raw(), start, end - start)?;
        let at = (doff - start) as usize;
        words[at..at + len as usize].copy_from_slice(host.host_bytes()?);
        self.ctx.write("copy_into", db.raw(), start, &words)
    }
}

impl ComputeBackend for WgpuBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn device(&self) -> Device {
        Device { kind: DeviceKind::Gpu, index: 0, name: self.ctx.info.name.clone(), memory_bytes: None }
    }

    fn supports(&self, op: Op) -> bool {
        NATIVE_OPS.contains(&op)
    }

    fn upload(&self, x: &Tensor) -> Result<Tensor> {
        if !x.is_host() {
            buffer_of(x)?;
            return Ok(x.clone());
        }
        let bytes = x.host_bytes()?;
        let buf = self.ctx.alloc("upload", bytes.len() as u64)?;
        if bytes.len().is_multiple_of(4) {
            self.ctx.write("upload", buf.raw(), 0, bytes)?;
        } else {
            let mut padded = bytes.to_vec();
            padded.resize(bytes.len().div_ceil(4) * 4, 0);
            self.ctx.write("upload", buf.raw(), 0, &padded)?;
        }
        Tensor::from_device(Box::new(buf), x.shape().clone(), x.dtype())
    }

    fn to_host(&self, x: &Tensor) -> Result<Tensor> {
        if x.is_host() {
            return Ok(x.clone());
        }
        let b = buffer_of(x)?;
        let off = x.byte_offset() as u64;
        let start = off / 4 * 4;
        let end = (off + x.byte_len() as u64).div_ceil(4) * 4;
        let data = self.ctx.read("to_host", b.raw(), start, end - start)?;
        let at = (off - start) as usize;
        let bytes = data.get(at..at + x.byte_len()).unwrap_or(&[]);
        Tensor::from_bytes(bytes, x.shape().clone(), x.dtype())
    }

    fn uses_device_storage(&self) -> bool {
        true
    }

    fn synchronize(&self) -> Result<()> {
        self.ctx.synchronize("synchronize")
    }

    fn release_resources(&self) -> Result<()> {
        self.ctx.synchronize("release_resources")?;
        self.ctx.release();
        Ok(())
    }

    fn release_temporary_resources(&self) -> Result<()> {
        self.ctx.synchronize("release_temporary_resources")?;
        self.ctx.release();
        Ok(())
    }

    fn zeros(&self, shape: &Shape, dtype: DType) -> Result<Tensor> {
        let be = dtype.block_elems();
        if be > 1 && !shape.last_dim().is_multiple_of(be) {
            return Tensor::zeros(shape.clone(), dtype);
        }
        if shape.checked_elem_count().is_none() {
            return Tensor::zeros(shape.clone(), dtype);
        }
        self.ctx.zeros("zeros", shape.clone(), dtype)
    }

    fn copy(&self, x: &Tensor) -> Result<Tensor> {
        if x.is_host() || !x.byte_offset().is_multiple_of(4) {
            return fallback!(self, cpu::memory::copy; [x]);
        }
        self.ctx.copy_tensor("copy", x)
    }

    fn copy_into(&self, dst: &mut Tensor, src: &Tensor) -> Result<()> {
        if dst.is_host() || dst.shape() != src.shape() || dst.dtype() != src.dtype() {
            let src = self.to_host(src)?;
            if dst.is_host() {
                return cpu::memory::copy_into(self.cpu(), dst, &src);
            }
            let mut host = self.to_host(dst)?;
            return cpu::memory::copy_into(self.cpu(), &mut host, &src);
        }
        dst.ensure_writable("copy_into")?;
        let src = self.dev(src)?;
        self.copy_device(dst, &src)
    }

    fn fill(&self, dst: &mut Tensor, value: f32) -> Result<()> {
        if self.inplace_unary("fill", dst, Un::Fill, value, 0.0)? {
            return Ok(());
        }
        self.ctx.note_fallback("in place");
        in_place_on_cpu(self, dst, |cpu, dst| cpu::memory::fill(cpu, dst, value))
    }

    fn preprocess_linear_weight(&self, w: &Tensor) -> Result<Tensor> {
        let host = self.to_host(w)?;
        cpu::memory::preprocess_linear_weight(self.cpu(), &host)?;
        self.dev(w)
    }

    fn quantized_matmul(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        const OP: &str = "quantized_matmul";
        let fmt = match w.dtype() {
            DType::Q8_0 => 0,
            DType::Q4_1 => 1,
            _ => u32::MAX,
        };
        let ok = fmt != u32::MAX
            && is_f32(x)
            && x.rank() >= 1
            && w.rank() == 2
            && w.byte_offset().is_multiple_of(4)
            && x.shape().last_dim() == w.dims()[1]
            && w.dims()[1].is_multiple_of(32);
        if !ok {
            return fallback!(self, cpu::quant::quantized_matmul; [x, w]);
        }
        let (n_out, k) = (w.dims()[0], w.dims()[1]);
        let rows = x.elem_count() / k.max(1);
        let mut dims = x.dims().to_vec();
        *dims.last_mut().unwrap_or(&mut 0) = n_out;
        let (x, w) = (self.dev(x)?, self.dev(w)?);
        let y = self.ctx.empty(OP, Shape::new(dims), DType::F32)?;
        if k == 0 {
            return self.ctx.zeros(OP, y.shape().clone(), DType::F32);
        }
        let params = [u(rows)?, u(n_out)?, u(k)?, fmt];
        self.ctx.dispatch(
            OP,
            &kernels::QUANTIZED_MATMUL,
            &[&x, &w, &y],
            &params,
            ((rows * n_out) as u64).div_ceil(64),
        )?;
        Ok(y)
    }

    fn matmul(&self, a: &Tensor, b: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor> {
        match self.matmul_plan(a, b, transpose_a, transpose_b) {
            Some(p) => self.matmul_native("matmul", a, b, p),
            None => fallback!(self, cpu::matmul::matmul; [a, b], transpose_a, transpose_b),
        }
    }

    fn matmul_backward(
        &self,
        a: &Tensor,
        b: &Tensor,
        d_out: &Tensor,
        transpose_a: bool,
        transpose_b: bool,
    ) -> Result<MatmulGradients> {
        let plan = self.matmul_plan(a, b, transpose_a, transpose_b);
        match plan {
            Some(p) if is_f32(d_out) && d_out.dims() == p.out_dims.as_slice() => {
                self.matmul_backward_native(a, b, d_out, p)
            }
            _ => fallback!(self, cpu::matmul::matmul_backward; [a, b, d_out], transpose_a, transpose_b),
        }
    }

    fn batched_matmul(&self, a: &Tensor, b: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor> {
        match self.matmul_plan(a, b, transpose_a, transpose_b) {
            Some(p) if a.rank() == 3 && b.rank() == 3 => self.matmul_native("batched_matmul", a, b, p),
            _ => fallback!(self, cpu::matmul::batched_matmul; [a, b], transpose_a, transpose_b),
        }
    }

    fn linear_forward(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        const OP: &str = "linear_forward";
        let ok = Self::all_f32(&[x, w])
            && x.rank() >= 1
            && w.rank() == 2
            && x.shape().last_dim() == w.dims()[1]
            && bias.is_none_or(|b| is_f32(b) && b.rank() == 1 && b.dims()[0] == w.dims()[0]);
        if !ok {
            if matches!(w.dtype(), DType::Q8_0 | DType::Q4_1) && bias.is_none() {
                return self.quantized_matmul(x, w);
            }
            let bias = bias.map(|b| self.to_host(b)).transpose()?;
            return fallback!(self, cpu::matmul::linear_forward; [x, w], bias.as_ref());
        }
        let (out, k) = (w.dims()[0], w.dims()[1]);
        let m = x.elem_count() / k.max(1);
        let mut dims = x.dims().to_vec();
        *dims.last_mut().unwrap_or(&mut 0) = out;
        let (x, w) = (self.dev(x)?, self.dev(w)?);
        let bias = bias.map(|b| self.dev(b)).transpose()?;
        let y = self.ctx.empty(OP, Shape::new(dims), DType::F32)?;
        if k == 0 {
            let z = self.ctx.zeros(OP, y.shape().clone(), DType::F32)?;
            return match bias {
                Some(b) => self.add_row(&z, &b),
                None => Ok(z),
            };
        }
        // W in row blocks that each fit one binding (a large vocabulary's lm head).
        let per = self.ctx.rows_per_binding(k);
        let mut r0 = 0;
        while r0 < out {
            let r1 = (r0 + per).min(out);
            let wb = Context::row_block(&w, k, r0, r1 - r0)?;
            let yb = y.view(r0, Shape::new(vec![y.elem_count() - r0]))?;
            let bb = bias.as_ref().map(|b| b.view(r0, Shape::new(vec![r1 - r0]))).transpose()?;
            self.ctx.gemm(
                OP,
                (&x, MatView::rows(k, 0)),
                (&wb, MatView::rows(k, 0).t()),
                bb.as_ref(),
                (&yb, MatView::rows(out, 0)),
                (m, r1 - r0, k, 1),
                false,
            )?;
            r0 = r1;
        }
        Ok(y)
    }

    fn linear_backward(&self, x: &Tensor, w: &Tensor, d_out: &Tensor, with_bias: bool) -> Result<LinearGradients> {
        const OP: &str = "linear_backward";
        if !Self::linear_backward_ok(x, w, d_out) {
            return fallback!(self, cpu::matmul::linear_backward; [x, w, d_out], with_bias);
        }
        let dweight = self.ctx.empty(OP, w.shape().clone(), DType::F32)?;
        let dbias = if with_bias { Some(self.ctx.empty(OP, [w.dims()[0]], DType::F32)?) } else { None };
        let dx = self.linear_backward_native(OP, x, w, d_out, &dweight, dbias.as_ref(), false)?;
        Ok(LinearGradients { dx, dweight, dbias })
    }

    fn linear_backward_accumulate(
        &self,
        x: &Tensor,
        w: &Tensor,
        d_out: &Tensor,
        dweight: &mut Tensor,
        dbias: Option<&mut Tensor>,
    ) -> Result<Tensor> {
        const OP: &str = "linear_backward_accumulate";
        let ok = Self::linear_backward_ok(x, w, d_out)
            && !dweight.is_host()
            && is_f32(dweight)
            && dweight.shape() == w.shape()
            && dbias.as_ref().is_none_or(|b| !b.is_host() && is_f32(b) && b.dims() == [w.dims()[0]]);
        if !ok {
            self.ctx.note_fallback("in place");
            let (x, w, d_out) = (self.to_host(x)?, self.to_host(w)?, self.to_host(d_out)?);
            if dweight.is_host() && dbias.as_ref().is_none_or(|b| b.is_host()) {
                return cpu::matmul::linear_backward_accumulate(self.cpu(), &x, &w, &d_out, dweight, dbias)?
                    .to_backend(self);
            }
            let mut dw_host = self.to_host(dweight)?;
            let mut db_host = dbias.as_deref().map(|b| self.to_host(b)).transpose()?;
            let dx =
                cpu::matmul::linear_backward_accumulate(self.cpu(), &x, &w, &d_out, &mut dw_host, db_host.as_mut())?;
            self.copy_into(dweight, &dw_host)?;
            if let (Some(dst), Some(host)) = (dbias, db_host) {
                self.copy_into(dst, &host)?;
            }
            return dx.to_backend(self);
        }
        dweight.ensure_writable(OP)?;
        if let Some(b) = dbias.as_ref() {
            b.ensure_writable(OP)?;
        }
        self.linear_backward_native(OP, x, w, d_out, dweight, dbias.as_deref(), true)
    }

    fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, scale: f32, causal: bool) -> Result<Tensor> {
        match Self::attention_dims(q, k, v) {
            Some(d) if !causal || d.3 <= d.4 => {
                Ok(self.attention_forward("attention", q, k, v, d, d.4, scale, causal)?.output)
            }
            _ => fallback!(self, cpu::attention::attention; [q, k, v], scale, causal),
        }
    }

    fn causal_attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> Result<CausalAttentionResult> {
        match Self::attention_dims(q, k, v) {
            Some(d) if d.3 <= d.4 => self.attention_forward("causal_attention", q, k, v, d, d.4, scale, true),
            _ => fallback!(self, cpu::attention::causal_attention; [q, k, v], scale),
        }
    }

    fn causal_attention_backward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        result: &CausalAttentionResult,
        d_out: &Tensor,
        scale: f32,
    ) -> Result<AttentionGradients> {
        const OP: &str = "causal_attention_backward";
        let dims = Self::attention_dims(q, k, v).filter(|d| {
            d.3 <= d.4
                && Self::all_f32(&[&result.output, &result.logsumexp, d_out])
                && result.output.shape() == q.shape()
                && d_out.shape() == q.shape()
                && result.logsumexp.dims() == [d.0, d.1, d.3]
        });
        let Some((b, hq, hkv, tq, tk, d)) = dims else {
            let result = CausalAttentionResult {
                output: self.to_host(&result.output)?,
                logsumexp: self.to_host(&result.logsumexp)?,
            };
            let d_out = self.to_host(d_out)?;
            return fallback!(self, cpu::attention::causal_attention_backward; [q, k, v], &result, &d_out, scale);
        };
        let (q, k, v) = (self.dev(q)?, self.dev(k)?, self.dev(v)?);
        let (o, lse, dout) = (self.dev(&result.output)?, self.dev(&result.logsumexp)?, self.dev(d_out)?);
        let rows = b * hq * tq;
        let delta = self.ctx.empty(OP, [rows], DType::F32)?;
        self.ctx.dispatch(
            OP,
            &kernels::ATTN_DELTA,
            &[&o, &dout, &delta],
            &[u(rows)?, u(d)?],
            (rows as u64).div_ceil(64),
        )?;
        let dq = self.ctx.empty(OP, q.shape().clone(), DType::F32)?;
        let dk = self.ctx.empty(OP, k.shape().clone(), DType::F32)?;
        let dv = self.ctx.empty(OP, v.shape().clone(), DType::F32)?;
        let groups = (rows as u64).div_ceil(64);
        let chunks = tk.div_ceil(KEY_CHUNK).max(1);
        for c in 0..chunks {
            let (j0, j1) = (c * KEY_CHUNK, ((c + 1) * KEY_CHUNK).min(tk));
            let p = [u(rows)?, u(hq)?, u(hkv)?, u(tq)?, u(tk)?, u(d)?, f(scale), u(j0)?, u(j1)?, (c == 0) as u32];
            self.ctx.dispatch(OP, &kernels::ATTN_DQ, &[&q, &k, &v, &lse, &dout, &delta, &dq], &p, groups)?;
        }
        let kv_rows = b * hkv * tk;
        let groups = (kv_rows as u64).div_ceil(64);
        let chunks = tq.div_ceil(KEY_CHUNK).max(1);
        for g in 0..hq / hkv {
            for c in 0..chunks {
                let (i0, i1) = (c * KEY_CHUNK, ((c + 1) * KEY_CHUNK).min(tq));
                let first = (g == 0 && c == 0) as u32;
                let p = [u(kv_rows)?, u(hq)?, u(hkv)?, u(tq)?, u(tk)?, u(d)?, f(scale), u(g)?, u(i0)?, u(i1)?, first];
                let args = [&q, &k, &v, &lse, &dout, &delta, &dk, &dv];
                self.ctx.dispatch(OP, &kernels::ATTN_DKV, &args, &p, groups)?;
            }
        }
        Ok(AttentionGradients { dq, dk, dv })
    }

    fn supports_causal_attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, _scale: f32) -> bool {
        Self::attention_dims(q, k, v).is_some_and(|d| d.3 <= d.4)
    }

    fn write_head_cache(&self, cache: &mut Tensor, new: &Tensor, pos: usize) -> Result<()> {
        const OP: &str = "write_head_cache";
        let ok = !cache.is_host()
            && Self::all_f32(&[cache, new])
            && cache.rank() == 4
            && new.rank() == 4
            && cache.dims()[0] == new.dims()[0]
            && cache.dims()[1] == new.dims()[1]
            && cache.dims()[3] == new.dims()[3]
            && pos.checked_add(new.dims()[2]).is_some_and(|e| e <= cache.dims()[2]);
        if !ok {
            let new = self.to_host(new)?;
            self.ctx.note_fallback("in place");
            return in_place_on_cpu(self, cache, |cpu, cache| cpu::attention::write_head_cache(cpu, cache, &new, pos));
        }
        cache.ensure_writable(OP)?;
        let new = self.dev(new)?;
        let (b, h, cap, d) = (cache.dims()[0], cache.dims()[1], cache.dims()[2], cache.dims()[3]);
        let t = new.dims()[2];
        let (cb, nb) = (buffer_of(cache)?, buffer_of(&new)?);
        if cb.raw() == nb.raw() {
            return Err(Error::SharedStorage { op: OP });
        }
        for bh in 0..b * h {
            let dst = cache.byte_offset() as u64 + ((bh * cap + pos) * d * 4) as u64;
            let src = new.byte_offset() as u64 + (bh * t * d * 4) as u64;
            self.ctx.copy(nb.raw(), src, cb.raw(), dst, (t * d * 4) as u64);
        }
        Ok(())
    }

    fn decode_attention(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        kv_len: usize,
        scale: f32,
    ) -> Result<Tensor> {
        match Self::attention_dims(q, k_cache, v_cache) {
            Some(d) if d.3 <= kv_len && kv_len <= d.4 && d.3 > 0 => {
                Ok(self.attention_forward("decode_attention", q, k_cache, v_cache, d, kv_len, scale, true)?.output)
            }
            _ => fallback!(self, cpu::attention::decode_attention; [q, k_cache, v_cache], kv_len, scale),
        }
    }

    fn split_heads(&self, x: &Tensor, heads: usize) -> Result<Tensor> {
        let ok = is_f32(x) && x.rank() == 3 && heads > 0 && x.dims()[2].is_multiple_of(heads);
        if !ok {
            return fallback!(self, cpu::attention::split_heads; [x], heads);
        }
        let (b, t, hd) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let x4 = self.dev(x)?.reshape([b, t, heads, hd / heads])?;
        self.permute_native("split_heads", &x4, &[0, 2, 1, 3])
    }

    fn merge_heads(&self, x: &Tensor) -> Result<Tensor> {
        if !is_f32(x) || x.rank() != 4 {
            return fallback!(self, cpu::attention::merge_heads; [x]);
        }
        let (b, h, t, d) = (x.dims()[0], x.dims()[1], x.dims()[2], x.dims()[3]);
        let x = self.dev(x)?;
        self.permute_native("merge_heads", &x, &[0, 2, 1, 3])?.reshape([b, t, h * d])
    }

    fn silu(&self, x: &Tensor) -> Result<Tensor> {
        match self.unary_op("silu", x, Un::Silu, 0.0, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::activation::silu; [x]),
        }
    }

    fn silu_backward(&self, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
        match self.binary_op("silu_backward", x, d_out, Bin::SiluBwd, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::activation::silu_backward; [x, d_out]),
        }
    }

    fn gelu(&self, x: &Tensor, form: GeluForm) -> Result<Tensor> {
        let code = if form == GeluForm::Tanh { Un::GeluTanh } else { Un::GeluErf };
        match self.unary_op("gelu", x, code, 0.0, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::activation::gelu; [x], form),
        }
    }

    fn gelu_backward(&self, x: &Tensor, d_out: &Tensor, form: GeluForm) -> Result<Tensor> {
        let code = if form == GeluForm::Tanh { Bin::GeluTanhBwd } else { Bin::GeluErfBwd };
        match self.binary_op("gelu_backward", x, d_out, code, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::activation::gelu_backward; [x, d_out], form),
        }
    }

    fn relu(&self, x: &Tensor) -> Result<Tensor> {
        match self.unary_op("relu", x, Un::Relu, 0.0, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::activation::relu; [x]),
        }
    }

    fn relu_backward(&self, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
        match self.binary_op("relu_backward", x, d_out, Bin::ReluBwd, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::activation::relu_backward; [x, d_out]),
        }
    }

    fn sigmoid(&self, x: &Tensor) -> Result<Tensor> {
        match self.unary_op("sigmoid", x, Un::Sigmoid, 0.0, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::activation::sigmoid; [x]),
        }
    }

    fn sigmoid_backward(&self, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
        match self.binary_op("sigmoid_backward", x, d_out, Bin::SigmoidBwd, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::activation::sigmoid_backward; [x, d_out]),
        }
    }

    fn tanh(&self, x: &Tensor) -> Result<Tensor> {
        match self.unary_op("tanh", x, Un::Tanh, 0.0, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::activation::tanh; [x]),
        }
    }

    fn tanh_backward(&self, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
        match self.binary_op("tanh_backward", x, d_out, Bin::TanhBwd, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::activation::tanh_backward; [x, d_out]),
        }
    }

    fn silu_mul(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        match self.binary_op("silu_mul", gate, up, Bin::SiluMul, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::activation::silu_mul; [gate, up]),
        }
    }

    fn silu_mul_backward(&self, gate: &Tensor, up: &Tensor, d_out: &Tensor) -> Result<PairGradients> {
        const OP: &str = "silu_mul_backward";
        if !Self::all_f32(&[gate, up, d_out]) || gate.shape() != up.shape() || gate.shape() != d_out.shape() {
            return fallback!(self, cpu::activation::silu_mul_backward; [gate, up, d_out]);
        }
        let (g, up, dy) = (self.dev(gate)?, self.dev(up)?, self.dev(d_out)?);
        let da = self.ctx.empty(OP, g.shape().clone(), DType::F32)?;
        let db = self.ctx.empty(OP, g.shape().clone(), DType::F32)?;
        let n = g.elem_count();
        self.ctx.flat(OP, &kernels::SILU_MUL_BACKWARD, &[&g, &up, &dy, &da, &db], &[0, u(n)?], n)?;
        Ok(PairGradients { da, db })
    }

    fn stable_softplus(&self, x: &Tensor) -> Result<Tensor> {
        match self.unary_op("stable_softplus", x, Un::Softplus, 0.0, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::activation::stable_softplus; [x]),
        }
    }

    fn rms_norm(&self, x: &Tensor, weight: &Tensor, eps: f32) -> Result<NormOutput> {
        const OP: &str = "rms_norm";
        let dims = Self::norm_dims(x, weight).filter(|_| Self::all_f32(&[x, weight]) && eps_ok(eps));
        let Some((rows, d)) = dims else {
            return fallback!(self, cpu::norm::rms_norm; [x, weight], eps);
        };
        let (x, w) = (self.dev(x)?, self.dev(weight)?);
        let output = self.ctx.empty(OP, x.shape().clone(), DType::F32)?;
        let rstd = self.ctx.empty(OP, Shape::new(x.dims()[..x.rank() - 1].to_vec()), DType::F32)?;
        let params = [u(rows)?, u(d)?, f(eps)];
        self.ctx.dispatch(OP, &kernels::RMS_NORM, &[&x, &w, &output, &rstd], &params, rows as u64)?;
        Ok(NormOutput { output, mean: None, rstd })
    }

    fn rms_norm_backward(&self, x: &Tensor, weight: &Tensor, rstd: &Tensor, d_out: &Tensor) -> Result<NormGradients> {
        let dims = Self::norm_dims(x, weight).filter(|&(rows, _)| {
            rows <= MAX_DW_ROWS
                && Self::all_f32(&[x, weight, d_out])
                && Self::stat_ok(rstd, x)
                && d_out.shape() == x.shape()
        });
        match dims {
            Some(rd) => self.norm_backward_native("rms_norm_backward", x, weight, None, rstd, d_out, rd),
            None => fallback!(self, cpu::norm::rms_norm_backward; [x, weight, rstd, d_out]),
        }
    }

    fn layer_norm(&self, x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<NormOutput> {
        const OP: &str = "layer_norm";
        let dims = Self::norm_dims(x, weight)
            .filter(|_| Self::all_f32(&[x, weight, bias]) && bias.shape() == weight.shape() && eps_ok(eps));
        let Some((rows, d)) = dims else {
            return fallback!(self, cpu::norm::layer_norm; [x, weight, bias], eps);
        };
        let (x, w, b) = (self.dev(x)?, self.dev(weight)?, self.dev(bias)?);
        let output = self.ctx.empty(OP, x.shape().clone(), DType::F32)?;
        let stat = Shape::new(x.dims()[..x.rank() - 1].to_vec());
        let mean = self.ctx.empty(OP, stat.clone(), DType::F32)?;
        let rstd = self.ctx.empty(OP, stat, DType::F32)?;
        let params = [u(rows)?, u(d)?, f(eps)];
        self.ctx.dispatch(OP, &kernels::LAYER_NORM, &[&x, &w, &b, &output, &mean, &rstd], &params, rows as u64)?;
        Ok(NormOutput { output, mean: Some(mean), rstd })
    }

    fn layer_norm_backward(
        &self,
        x: &Tensor,
        weight: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        d_out: &Tensor,
    ) -> Result<NormGradients> {
        let dims = Self::norm_dims(x, weight).filter(|&(rows, _)| {
            rows <= MAX_DW_ROWS
                && Self::all_f32(&[x, weight, d_out])
                && Self::stat_ok(rstd, x)
                && Self::stat_ok(mean, x)
                && d_out.shape() == x.shape()
        });
        match dims {
            Some(rd) => self.norm_backward_native("layer_norm_backward", x, weight, Some(mean), rstd, d_out, rd),
            None => fallback!(self, cpu::norm::layer_norm_backward; [x, weight, mean, rstd, d_out]),
        }
    }

    fn add_rms_norm(&self, a: &Tensor, b: &Tensor, weight: &Tensor, eps: f32) -> Result<(Tensor, NormOutput)> {
        const OP: &str = "add_rms_norm";
        let dims = Self::norm_dims(a, weight)
            .filter(|_| Self::all_f32(&[a, b, weight]) && a.shape() == b.shape() && eps_ok(eps));
        let Some((rows, d)) = dims else {
            return fallback!(self, cpu::norm::add_rms_norm; [a, b, weight], eps);
        };
        let (a, b, w) = (self.dev(a)?, self.dev(b)?, self.dev(weight)?);
        let s = self.ctx.empty(OP, a.shape().clone(), DType::F32)?;
        let output = self.ctx.empty(OP, a.shape().clone(), DType::F32)?;
        let rstd = self.ctx.empty(OP, Shape::new(a.dims()[..a.rank() - 1].to_vec()), DType::F32)?;
        let params = [u(rows)?, u(d)?, f(eps)];
        self.ctx.dispatch(OP, &kernels::ADD_RMS_NORM, &[&a, &b, &w, &s, &output, &rstd], &params, rows as u64)?;
        Ok((s, NormOutput { output, mean: None, rstd }))
    }

    fn softmax(&self, x: &Tensor, dim: usize) -> Result<Tensor> {
        match self.softmax_native("softmax", x, dim, 0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::softmax::softmax; [x], dim),
        }
    }

    fn softmax_backward(&self, y: &Tensor, d_out: &Tensor, dim: usize) -> Result<Tensor> {
        const OP: &str = "softmax_backward";
        let ok = Self::all_f32(&[y, d_out]) && y.rank() > 0 && dim + 1 == y.rank() && y.shape() == d_out.shape();
        if !ok || y.shape().last_dim() == 0 {
            return fallback!(self, cpu::softmax::softmax_backward; [y, d_out], dim);
        }
        let (y, dy) = (self.dev(y)?, self.dev(d_out)?);
        let d = y.shape().last_dim();
        let rows = y.elem_count() / d;
        let dx = self.ctx.empty(OP, y.shape().clone(), DType::F32)?;
        self.ctx.dispatch(OP, &kernels::SOFTMAX_BACKWARD, &[&y, &dy, &dx], &[u(rows)?, u(d)?], rows as u64)?;
        Ok(dx)
    }

    fn log_softmax(&self, x: &Tensor, dim: usize) -> Result<Tensor> {
        match self.softmax_native("log_softmax", x, dim, 1)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::softmax::log_softmax; [x], dim),
        }
    }

    fn cross_entropy(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        ignore_index: Option<u32>,
    ) -> Result<CrossEntropyOutput> {
        const OP: &str = "cross_entropy";
        let Some((row_loss, d_logits, count)) = self.cross_entropy_native(OP, logits, targets, ignore_index, 1.0)?
        else {
            return fallback!(self, cpu::loss::cross_entropy; [logits, targets], ignore_index);
        };
        let loss = self.ctx.empty(OP, Shape::new(vec![]), DType::F32)?;
        let n = row_loss.elem_count();
        let scale = if count > 0 { 1.0 / count as f32 } else { 0.0 };
        let sum = self.ctx.empty(OP, [1], DType::F32)?;
        self.ctx.sum_rows(OP, &row_loss, n, 1, &sum)?;
        let mean = self.ctx.unary(OP, &sum, Un::MulS, scale, 0.0)?;
        self.copy_device(&loss, &mean)?;
        Ok(CrossEntropyOutput { loss, d_logits, count })
    }

    fn cross_entropy_backward(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        ignore_index: Option<u32>,
        d_loss: f32,
    ) -> Result<Tensor> {
        match self.cross_entropy_native("cross_entropy_backward", logits, targets, ignore_index, d_loss)? {
            Some((_, d_logits, _)) => Ok(d_logits),
            None => fallback!(self, cpu::loss::cross_entropy_backward; [logits, targets], ignore_index, d_loss),
        }
    }

    fn adamw_update(
        &self,
        param: &mut Tensor,
        grad: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        config: &AdamWConfig,
        step: u64,
    ) -> Result<()> {
        const OP: &str = "adamw_update";
        let config_ok = (0.0..1.0).contains(&config.beta1)
            && (0.0..1.0).contains(&config.beta2)
            && config.lr.is_finite()
            && config.eps.is_finite()
            && config.weight_decay.is_finite()
            && config.grad_scale.is_finite();
        let ok = step > 0
            && config_ok
            && !param.is_host()
            && !m.is_host()
            && !v.is_host()
            && Self::all_f32(&[param, grad, m, v])
            && grad.shape() == param.shape()
            && m.shape() == param.shape()
            && v.shape() == param.shape();
        if !ok {
            self.ctx.note_fallback("in place");
            let grad = self.to_host(grad)?;
            if param.is_host() && m.is_host() && v.is_host() {
                return cpu::optim::adamw_update(self.cpu(), param, &grad, m, v, config, step);
            }
            let (mut p_h, mut m_h, mut v_h) = (self.to_host(param)?, self.to_host(m)?, self.to_host(v)?);
            cpu::optim::adamw_update(self.cpu(), &mut p_h, &grad, &mut m_h, &mut v_h, config, step)?;
            self.copy_into(param, &p_h)?;
            self.copy_into(m, &m_h)?;
            return self.copy_into(v, &v_h);
        }
        param.ensure_writable(OP)?;
        m.ensure_writable(OP)?;
        v.ensure_writable(OP)?;
        let grad = self.dev(grad)?;
        let bc1 = 1.0 - (config.beta1 as f64).powf(step as f64);
        let bc2 = 1.0 - (config.beta2 as f64).powf(step as f64);
        let n = param.elem_count();
        let params = [
            u(n)?,
            f(config.beta1),
            f(config.beta2),
            f(config.lr),
            f(config.eps),
            f(config.weight_decay),
            f((1.0 / bc1) as f32),
            f((1.0 / bc2.sqrt()) as f32),
            f(config.grad_scale),
        ];
        self.ctx.flat(OP, &kernels::ADAMW, &[param, &grad, m, v], &params, n)
    }

    fn global_norm(&self, tensors: &[Tensor]) -> Result<f32> {
        if tensors.iter().any(|t| t.is_host() || !is_f32(t)) {
            self.ctx.note_fallback("in place");
            let host = tensors.iter().map(|t| self.to_host(t)).collect::<Result<Vec<_>>>()?;
            return cpu::optim::global_norm(self.cpu(), &host);
        }
        // Every tensor's partials are queued before the first read, so they go out together.
        let parts = tensors.iter().map(|t| self.queue_sum_squares(t)).collect::<Result<Vec<_>>>()?;
        let mut total = 0.0f64;
        for part in parts.iter().flatten() {
            let host = self.to_host(part)?;
            // Σ over chunks of m²·s, in f64 and in chunk order.
            total += host.as_slice::<f32>()?.chunks_exact(2).map(|p| (p[0] as f64).powi(2) * p[1] as f64).sum::<f64>();
        }
        Ok(total.sqrt() as f32)
    }

    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor, style: RopeStyle, offset: usize) -> Result<Tensor> {
        match self.rope_native("rope", x, cos, sin, style, offset, 1.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::rope::rope; [x, cos, sin], style, offset),
        }
    }

    fn rope_backward(
        &self,
        d_out: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        style: RopeStyle,
        offset: usize,
    ) -> Result<Tensor> {
        match self.rope_native("rope_backward", d_out, cos, sin, style, offset, -1.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::rope::rope_backward; [d_out, cos, sin], style, offset),
        }
    }

    fn embedding(&self, ids: &Tensor, table: &Tensor) -> Result<Tensor> {
        const OP: &str = "embedding";
        let ok = ids.dtype() == DType::U32 && is_f32(table) && table.rank() == 2 && table.dims()[1] > 0;
        if !ok {
            return fallback!(self, cpu::embedding::embedding; [ids, table]);
        }
        let (vocab, d) = (table.dims()[0], table.dims()[1]);
        let host_ids = self.to_host(ids)?;
        if host_ids.as_slice::<u32>()?.iter().any(|&i| i as usize >= vocab) {
            return fallback!(self, cpu::embedding::embedding; [ids, table]);
        }
        let mut dims = ids.dims().to_vec();
        dims.push(d);
        let out = self.ctx.empty(OP, Shape::new(dims), DType::F32)?;
        let n = out.elem_count();
        if n == 0 {
            return Ok(out);
        }
        let (ids, table) = (self.dev(ids)?, self.dev(table)?);
        let per = self.ctx.rows_per_binding(d);
        let mut r0 = 0;
        while r0 < vocab {
            let r1 = (r0 + per).min(vocab);
            let block = Context::row_block(&table, d, r0, r1 - r0)?;
            self.ctx.flat(OP, &kernels::EMBEDDING, &[&ids, &block, &out], &[u(n)?, u(d)?, u(r0)?, u(r1)?], n)?;
            r0 = r1;
        }
        Ok(out)
    }

    fn embedding_backward(&self, ids: &Tensor, d_out: &Tensor, vocab: usize) -> Result<Tensor> {
        const OP: &str = "embedding_backward";
        let ok = ids.dtype() == DType::U32
            && is_f32(d_out)
            && d_out.rank() == ids.rank() + 1
            && d_out.dims()[..ids.rank()] == *ids.dims()
            && d_out.shape().last_dim() > 0;
        if !ok {
            return fallback!(self, cpu::embedding::embedding_backward; [ids, d_out], vocab);
        }
        let host_ids = self.to_host(ids)?;
        let idv = host_ids.as_slice::<u32>()?;
        if idv.iter().any(|&i| i as usize >= vocab) {
            return fallback!(self, cpu::embedding::embedding_backward; [ids, d_out], vocab);
        }
        let d = d_out.shape().last_dim();
        let table = self.ctx.zeros(OP, [vocab, d], DType::F32)?;
        let src = self.dev(d_out)?;
        self.scatter_rows(OP, &table, idv, &src, d, false)?;
        Ok(table)
    }

    fn scatter_add_rows(&self, dst: &mut Tensor, ids: &Tensor, src: &Tensor) -> Result<()> {
        const OP: &str = "scatter_add_rows";
        let ok = !dst.is_host()
            && Self::all_f32(&[dst, src])
            && ids.dtype() == DType::U32
            && ids.rank() == 1
            && dst.rank() >= 1
            && src.rank() == dst.rank()
            && src.dims()[0] == ids.dims()[0]
            && src.dims()[1..] == dst.dims()[1..];
        let host_ids = if ok { Some(self.to_host(ids)?) } else { None };
        let rows = dst.dims().first().copied().unwrap_or(0);
        let valid = host_ids
            .as_ref()
            .and_then(|h| h.as_slice::<u32>().ok())
            .is_some_and(|s| s.iter().all(|&i| (i as usize) < rows));
        if !valid {
            let (ids, src) = (self.to_host(ids)?, self.to_host(src)?);
            self.ctx.note_fallback("in place");
            return in_place_on_cpu(self, dst, |cpu, dst| cpu::embedding::scatter_add_rows(cpu, dst, &ids, &src));
        }
        dst.ensure_writable(OP)?;
        let d = dst.elem_count() / rows.max(1);
        let src = self.dev(src)?;
        let idv = host_ids.as_ref().map(|h| h.as_slice::<u32>()).transpose()?.unwrap_or(&[]);
        self.scatter_rows(OP, dst, idv, &src, d, true)
    }

    fn slice_rows(&self, x: &Tensor, start: usize, len: usize) -> Result<Tensor> {
        let ok = !x.is_host()
            && x.rank() >= 1
            && start.checked_add(len).is_some_and(|e| e <= x.dims()[0])
            && matches!(x.dtype(), DType::F32 | DType::U32);
        if !ok {
            return fallback!(self, cpu::embedding::slice_rows; [x], start, len);
        }
        let row = x.elem_count() / x.dims()[0].max(1);
        let mut dims = x.dims().to_vec();
        dims[0] = len;
        let view = x.view(start * row, Shape::new(dims))?;
        self.ctx.copy_tensor("slice_rows", &view)
    }

    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        match self.binary_op("add", a, b, Bin::Add, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::add; [a, b]),
        }
    }

    fn sub(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        match self.binary_op("sub", a, b, Bin::Sub, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::sub; [a, b]),
        }
    }

    fn mul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        match self.binary_op("mul", a, b, Bin::Mul, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::mul; [a, b]),
        }
    }

    fn div(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        match self.binary_op("div", a, b, Bin::Div, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::div; [a, b]),
        }
    }

    fn add_scalar(&self, a: &Tensor, s: f32) -> Result<Tensor> {
        match self.unary_op("add_scalar", a, Un::AddS, s, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::add_scalar; [a], s),
        }
    }

    fn sub_scalar(&self, a: &Tensor, s: f32) -> Result<Tensor> {
        match self.unary_op("sub_scalar", a, Un::SubS, s, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::sub_scalar; [a], s),
        }
    }

    fn mul_scalar(&self, a: &Tensor, s: f32) -> Result<Tensor> {
        match self.unary_op("mul_scalar", a, Un::MulS, s, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::mul_scalar; [a], s),
        }
    }

    fn div_scalar(&self, a: &Tensor, s: f32) -> Result<Tensor> {
        match self.unary_op("div_scalar", a, Un::DivS, s, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::div_scalar; [a], s),
        }
    }

    fn add_assign(&self, a: &mut Tensor, b: &Tensor) -> Result<()> {
        if self.assign_op("add_assign", a, b, Bin::Add)? {
            return Ok(());
        }
        let b = self.to_host(b)?;
        in_place_on_cpu(self, a, |cpu, a| cpu::elementwise::add_assign(cpu, a, &b))
    }

    fn sub_assign(&self, a: &mut Tensor, b: &Tensor) -> Result<()> {
        if self.assign_op("sub_assign", a, b, Bin::Sub)? {
            return Ok(());
        }
        let b = self.to_host(b)?;
        in_place_on_cpu(self, a, |cpu, a| cpu::elementwise::sub_assign(cpu, a, &b))
    }

    fn mul_assign(&self, a: &mut Tensor, b: &Tensor) -> Result<()> {
        if self.assign_op("mul_assign", a, b, Bin::Mul)? {
            return Ok(());
        }
        let b = self.to_host(b)?;
        in_place_on_cpu(self, a, |cpu, a| cpu::elementwise::mul_assign(cpu, a, &b))
    }

    fn div_assign(&self, a: &mut Tensor, b: &Tensor) -> Result<()> {
        if self.assign_op("div_assign", a, b, Bin::Div)? {
            return Ok(());
        }
        let b = self.to_host(b)?;
        in_place_on_cpu(self, a, |cpu, a| cpu::elementwise::div_assign(cpu, a, &b))
    }

    fn add_row(&self, x: &Tensor, row: &Tensor) -> Result<Tensor> {
        match self.broadcast_op("add_row", x, row, Bin::Add, false)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::add_row; [x, row]),
        }
    }

    fn sub_row(&self, x: &Tensor, row: &Tensor) -> Result<Tensor> {
        match self.broadcast_op("sub_row", x, row, Bin::Sub, false)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::sub_row; [x, row]),
        }
    }

    fn mul_row(&self, x: &Tensor, row: &Tensor) -> Result<Tensor> {
        match self.broadcast_op("mul_row", x, row, Bin::Mul, false)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::mul_row; [x, row]),
        }
    }

    fn div_row(&self, x: &Tensor, row: &Tensor) -> Result<Tensor> {
        match self.broadcast_op("div_row", x, row, Bin::Div, false)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::div_row; [x, row]),
        }
    }

    fn add_col(&self, x: &Tensor, col: &Tensor) -> Result<Tensor> {
        match self.broadcast_op("add_col", x, col, Bin::Add, true)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::add_col; [x, col]),
        }
    }

    fn sub_col(&self, x: &Tensor, col: &Tensor) -> Result<Tensor> {
        match self.broadcast_op("sub_col", x, col, Bin::Sub, true)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::sub_col; [x, col]),
        }
    }

    fn mul_col(&self, x: &Tensor, col: &Tensor) -> Result<Tensor> {
        match self.broadcast_op("mul_col", x, col, Bin::Mul, true)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::mul_col; [x, col]),
        }
    }

    fn div_col(&self, x: &Tensor, col: &Tensor) -> Result<Tensor> {
        match self.broadcast_op("div_col", x, col, Bin::Div, true)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::div_col; [x, col]),
        }
    }

    fn add3(&self, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<Tensor> {
        match self.ternary_op("add3", a, b, c, 0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::add3; [a, b, c]),
        }
    }

    fn exp_mul(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        match self.binary_op("exp_mul", x, y, Bin::ExpMul, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::exp_mul; [x, y]),
        }
    }

    fn sub_mul(&self, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<Tensor> {
        match self.ternary_op("sub_mul", a, b, c, 1)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::sub_mul; [a, b, c]),
        }
    }

    fn add_scaled(&self, a: &Tensor, b: &Tensor, c: f32) -> Result<Tensor> {
        match self.binary_op("add_scaled", a, b, Bin::AddScaled, c)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::add_scaled; [a, b], c),
        }
    }

    fn exp(&self, x: &Tensor) -> Result<Tensor> {
        match self.unary_op("exp", x, Un::Exp, 0.0, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::exp; [x]),
        }
    }

    fn log(&self, x: &Tensor) -> Result<Tensor> {
        match self.unary_op("log", x, Un::Log, 0.0, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::log; [x]),
        }
    }

    fn sqrt(&self, x: &Tensor) -> Result<Tensor> {
        match self.unary_op("sqrt", x, Un::Sqrt, 0.0, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::sqrt; [x]),
        }
    }

    fn pow(&self, x: &Tensor, p: f32) -> Result<Tensor> {
        match self.unary_op("pow", x, Un::Pow, p, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::pow; [x], p),
        }
    }

    fn neg(&self, x: &Tensor) -> Result<Tensor> {
        match self.unary_op("neg", x, Un::Neg, 0.0, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::neg; [x]),
        }
    }

    fn abs(&self, x: &Tensor) -> Result<Tensor> {
        match self.unary_op("abs", x, Un::Abs, 0.0, 0.0)? {
            Some(t) => Ok(t),
            None => fallback!(self, cpu::elementwise::abs; [x]),
        }
    }

    fn clamp(&self, x: &Tensor, lo: f32, hi: f32) -> Result<Tensor> {
        // lo > hi (or NaN bounds) go to the CPU, which reports them.
        if lo <= hi {
            if let Some(t) = self.unary_op("clamp", x, Un::Clamp, lo, hi)? {
                return Ok(t);
            }
        }
        fallback!(self, cpu::elementwise::clamp; [x], lo, hi)
    }

    fn exp_inplace(&self, x: &mut Tensor) -> Result<()> {
        if self.inplace_unary("exp_inplace", x, Un::Exp, 0.0, 0.0)? {
            return Ok(());
        }
        in_place_on_cpu(self, x, cpu::elementwise::exp_inplace)
    }

    fn log_inplace(&self, x: &mut Tensor) -> Result<()> {
        if self.inplace_unary("log_inplace", x, Un::Log, 0.0, 0.0)? {
            return Ok(());
        }
        in_place_on_cpu(self, x, cpu::elementwise::log_inplace)
    }

    fn sqrt_inplace(&self, x: &mut Tensor) -> Result<()> {
        if self.inplace_unary("sqrt_inplace", x, Un::Sqrt, 0.0, 0.0)? {
            return Ok(());
        }
        in_place_on_cpu(self, x, cpu::elementwise::sqrt_inplace)
    }

    fn pow_inplace(&self, x: &mut Tensor, p: f32) -> Result<()> {
        if self.inplace_unary("pow_inplace", x, Un::Pow, p, 0.0)? {
            return Ok(());
        }
        in_place_on_cpu(self, x, |cpu, x| cpu::elementwise::pow_inplace(cpu, x, p))
    }

    fn neg_inplace(&self, x: &mut Tensor) -> Result<()> {
        if self.inplace_unary("neg_inplace", x, Un::Neg, 0.0, 0.0)? {
            return Ok(());
        }
        in_place_on_cpu(self, x, cpu::elementwise::neg_inplace)
    }

    fn abs_inplace(&self, x: &mut Tensor) -> Result<()> {
        if self.inplace_unary("abs_inplace", x, Un::Abs, 0.0, 0.0)? {
            return Ok(());
        }
        in_place_on_cpu(self, x, cpu::elementwise::abs_inplace)
    }

    fn clamp_inplace(&self, x: &mut Tensor, lo: f32, hi: f32) -> Result<()> {
        if lo <= hi && self.inplace_unary("clamp_inplace", x, Un::Clamp, lo, hi)? {
            return Ok(());
        }
        in_place_on_cpu(self, x, |cpu, x| cpu::elementwise::clamp_inplace(cpu, x, lo, hi))
    }

    fn permute(&self, x: &Tensor, perm: &[usize]) -> Result<Tensor> {
        let r = x.rank();
        let mut seen = [false; 6];
        let ok = is_f32(x)
            && r <= 6
            && perm.len() == r
            && perm.iter().all(|&p| p < r && !std::mem::replace(&mut seen[p], true));
        if !ok {
            return fallback!(self, cpu::layout::permute; [x], perm);
        }
        let x = self.dev(x)?;
        self.permute_native("permute", &x, perm)
    }

    fn transpose(&self, x: &Tensor, dim0: usize, dim1: usize) -> Result<Tensor> {
        let r = x.rank();
        if !is_f32(x) || r > 6 || dim0 >= r || dim1 >= r {
            return fallback!(self, cpu::layout::transpose; [x], dim0, dim1);
        }
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(dim0, dim1);
        let x = self.dev(x)?;
        self.permute_native("transpose", &x, &perm)
    }
}

/// What `matmul` computes for given operands: shapes and strided views.
#[derive(Debug, Clone)]
pub struct MatmulPlan {
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    a_view: MatView,
    b_view: MatView,
    b_shared: bool,
    ta: bool,
    tb: bool,
    out_dims: Vec<usize>,
}

impl WgpuBackend {
    fn linear_backward_ok(x: &Tensor, w: &Tensor, d_out: &Tensor) -> bool {
        Self::all_f32(&[x, w, d_out])
            && x.rank() >= 1
            && w.rank() == 2
            && x.shape().last_dim() == w.dims()[1]
            && d_out.rank() == x.rank()
            && d_out.dims()[..x.rank() - 1] == x.dims()[..x.rank() - 1]
            && d_out.shape().last_dim() == w.dims()[0]
    }

    /// dx = dy·W (returned), dW (+)= dyᵀ·x, dbias (+)= Σ_rows dy; W in row blocks
    /// that each fit one binding.
    #[allow(clippy::too_many_arguments)]
    fn linear_backward_native(
        &self,
        op: &'static str,
        x: &Tensor,
        w: &Tensor,
        d_out: &Tensor,
        dweight: &Tensor,
        dbias: Option<&Tensor>,
        accumulate: bool,
    ) -> Result<Tensor> {
        let (out, k) = (w.dims()[0], w.dims()[1]);
        let m = x.elem_count() / k.max(1);
        let (x, w, dy) = (self.dev(x)?, self.dev(w)?, self.dev(d_out)?);
        let dx = self.ctx.zeros(op, x.shape().clone(), DType::F32)?;
        if !accumulate && (m == 0 || k == 0) {
            self.ctx.zeros_into(op, dweight)?;
        }
        let per = self.ctx.rows_per_binding(k.max(m));
        let mut r0 = 0;
        while r0 < out {
            let r1 = (r0 + per).min(out);
            let wb = Context::row_block(&w, k, r0, r1 - r0)?;
            let dyb = dy.view(r0, Shape::new(vec![dy.elem_count() - r0]))?;
            // dx += dy[:, r0..r1] · W[r0..r1, :]
            self.ctx.gemm(
                op,
                (&dyb, MatView::rows(out, 0)),
                (&wb, MatView::rows(k, 0)),
                None,
                (&dx, MatView::rows(k, 0)),
                (m, k, r1 - r0, 1),
                true,
            )?;
            // dW[r0..r1, :] (+)= dy[:, r0..r1]ᵀ · x
            let dwb = Context::row_block(dweight, k, r0, r1 - r0)?;
            self.ctx.gemm(
                op,
                (&dyb, MatView::rows(out, 0).t()),
                (&x, MatView::rows(k, 0)),
                None,
                (&dwb, MatView::rows(k, 0)),
                (r1 - r0, k, m, 1),
                accumulate,
            )?;
            r0 = r1;
        }
        if let Some(db) = dbias {
            self.ctx.sum_rows_into(op, &dy, m, out, db, accumulate)?;
        }
        Ok(dx)
    }

    fn matmul_plan(&self, a: &Tensor, b: &Tensor, ta: bool, tb: bool) -> Option<MatmulPlan> {
        if !Self::all_f32(&[a, b]) || a.rank() < 2 || b.rank() < 2 {
            return None;
        }
        let (ad, bd) = (a.dims(), b.dims());
        let ar = ad.len();
        let (a0, a1) = (ad[ar - 2], ad[ar - 1]);
        let br = bd.len();
        let (b0, b1) = (bd[br - 2], bd[br - 1]);
        let (m, k) = if ta { (a1, a0) } else { (a0, a1) };
        let (kb, n) = if tb { (b1, b0) } else { (b0, b1) };
        let b_shared = br == 2;
        if k != kb || (!b_shared && bd[..br - 2] != ad[..ar - 2]) {
            return None;
        }
        let batch: usize = ad[..ar - 2].iter().product();
        let a_view = if ta { MatView::rows(m, a0 * a1).t() } else { MatView::rows(k, a0 * a1) };
        let bb = if b_shared { 0 } else { b0 * b1 };
        let b_view = if tb { MatView::rows(k, bb).t() } else { MatView::rows(n, bb) };
        let mut out_dims = ad[..ar - 2].to_vec();
        out_dims.extend([m, n]);
        Some(MatmulPlan { m, n, k, batch, a_view, b_view, b_shared, ta, tb, out_dims })
    }

    fn matmul_native(&self, op: &'static str, a: &Tensor, b: &Tensor, p: MatmulPlan) -> Result<Tensor> {
        let (a, b) = (self.dev(a)?, self.dev(b)?);
        let c = self.ctx.zeros(op, Shape::new(p.out_dims.clone()), DType::F32)?;
        if p.k == 0 {
            return Ok(c);
        }
        self.ctx.gemm(
            op,
            (&a, p.a_view),
            (&b, p.b_view),
            None,
            (&c, MatView::rows(p.n, p.m * p.n)),
            (p.m, p.n, p.k, p.batch),
            false,
        )?;
        Ok(c)
    }

    fn matmul_backward_native(&self, a: &Tensor, b: &Tensor, d_out: &Tensor, p: MatmulPlan) -> Result<MatmulGradients> {
        const OP: &str = "matmul_backward";
        let (a, b, dc) = (self.dev(a)?, self.dev(b)?, self.dev(d_out)?);
        let (m, n, k, batch) = (p.m, p.n, p.k, p.batch);
        let dc_view = MatView::rows(n, m * n);
        let da = self.ctx.zeros(OP, a.shape().clone(), DType::F32)?;
        let db = self.ctx.zeros(OP, b.shape().clone(), DType::F32)?;
        // op(A)·op(B) = C ⇒ d op(A) = dC·op(B)ᵀ (m×k), d op(B) = op(A)ᵀ·dC (k×n); a
        // transposed operand's gradient is the transposed product, written through
        // its own (transposed) view.
        let (a_rows, a_cols) = (a.dims()[a.rank() - 2], a.dims()[a.rank() - 1]);
        let da_view = MatView::rows(a_cols, a_rows * a_cols);
        if m > 0 && k > 0 && n > 0 {
            if !p.ta {
                self.ctx.gemm(OP, (&dc, dc_view), (&b, p.b_view.t()), None, (&da, da_view), (m, k, n, batch), false)?;
            } else {
                self.ctx.gemm(OP, (&b, p.b_view), (&dc, dc_view.t()), None, (&da, da_view), (k, m, n, batch), false)?;
            }
            let (b_rows, b_cols) = (b.dims()[b.rank() - 2], b.dims()[b.rank() - 1]);
            let tmp;
            let (db_target, db_batch) = if p.b_shared && batch > 1 {
                tmp = self.ctx.empty(OP, [batch, b_rows, b_cols], DType::F32)?;
                (&tmp, b_rows * b_cols)
            } else {
                (&db, if p.b_shared { 0 } else { b_rows * b_cols })
            };
            let db_view = MatView::rows(b_cols, db_batch);
            let a_view = p.a_view;
            if !p.tb {
                self.ctx.gemm(
                    OP,
                    (&a, a_view.t()),
                    (&dc, dc_view),
                    None,
                    (db_target, db_view),
                    (k, n, m, batch),
                    false,
                )?;
            } else {
                self.ctx.gemm(
                    OP,
                    (&dc, dc_view.t()),
                    (&a, a_view),
                    None,
                    (db_target, db_view),
                    (n, k, m, batch),
                    false,
                )?;
            }
            if p.b_shared && batch > 1 {
                self.ctx.sum_rows(OP, db_target, batch, b_rows * b_cols, &db)?;
            }
        }
        Ok(MatmulGradients { da, db })
    }

    fn softmax_native(&self, op: &'static str, x: &Tensor, dim: usize, mode: u32) -> Result<Option<Tensor>> {
        if !is_f32(x) || x.rank() == 0 || dim + 1 != x.rank() || x.shape().last_dim() == 0 {
            return Ok(None);
        }
        let x = self.dev(x)?;
        let d = x.shape().last_dim();
        let rows = x.elem_count() / d;
        let out = self.ctx.empty(op, x.shape().clone(), DType::F32)?;
        self.ctx.dispatch(op, &kernels::SOFTMAX, &[&x, &out], &[u(rows)?, u(d)?, mode], rows as u64)?;
        Ok(Some(out))
    }

    fn ternary_op(&self, op: &'static str, a: &Tensor, b: &Tensor, c: &Tensor, code: u32) -> Result<Option<Tensor>> {
        if !Self::all_f32(&[a, b, c]) || a.shape() != b.shape() || a.shape() != c.shape() {
            return Ok(None);
        }
        let (a, b, c) = (self.dev(a)?, self.dev(b)?, self.dev(c)?);
        let out = self.ctx.empty(op, a.shape().clone(), DType::F32)?;
        let n = a.elem_count();
        self.ctx.flat(op, &kernels::TERNARY, &[&a, &b, &c, &out], &[code, u(n)?], n)?;
        Ok(Some(out))
    }
}
