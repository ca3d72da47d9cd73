//! `WgpuBackend`: construction, device memory (upload, read-back, copies, fills) and the
//! `ComputeBackend` impl, whose op methods delegate to the family files in `ops/`. A
//! converted op first calls its spec (`fusebox::spec`), returning its error for an
//! invalid call, then picks its kernel or the CPU fallback from the description (dtype,
//! the kernel's limits, word-aligned bindings).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fusebox::{cpu, spec};
use fusebox::{
    in_place_on_cpu, AdamWConfig, AttentionGradients, CausalAttentionResult, ComputeBackend, CrossEntropyOutput, DType,
    Device, DeviceKind, GeluForm, LinearGradients, MatmulGradients, NormGradients, NormOutput, Op, PairGradients,
    Result, RopeStyle, Shape, Tensor,
};

use crate::builder::WgpuBackendBuilder;
use crate::context::{buffer_of, Context};
use crate::kernels;
use crate::native_ops::{self, NATIVE_OPS};
use crate::ops::{
    activation, attention, binary, convert, f, layout, linear, matmul, norm, optim, quant, reduce, rope_embedding,
    softmax_loss, u, unary, Un,
};

/// fusebox on a GPU through wgpu.
#[derive(Debug, Clone)]
pub struct WgpuBackend {
    pub(crate) ctx: Arc<Context>,
    name: String,
}

impl WgpuBackend {
    /// Opens the best available adapter with the default settings
    /// (`WgpuBackend::builder().build()`); errors (naming what was tried) when none exists.
    pub fn new() -> Result<WgpuBackend> {
        Self::builder().build()
    }

    /// The settings of a backend, defaults filled in: see [`WgpuBackendBuilder`].
    pub fn builder() -> WgpuBackendBuilder {
        WgpuBackendBuilder::default()
    }

    /// The adapters there are, as `index: name (backend API, device type)`; the index and
    /// the name are what [`AdapterChoice`](crate::AdapterChoice) takes.
    pub fn adapters() -> Vec<String> {
        Context::adapters()
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let info = a.get_info();
                format!("{i}: {} ({:?}, {:?})", info.name, info.backend, info.device_type)
            })
            .collect()
    }

    pub(crate) fn from_context(ctx: Context) -> WgpuBackend {
        let name = format!("wgpu ({} / {:?})", ctx.info.name, ctx.info.backend);
        WgpuBackend { ctx: Arc::new(ctx), name }
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
    pub(crate) fn dev(&self, t: &Tensor) -> Result<Tensor> {
        if t.is_host() {
            self.upload(t)
        } else {
            Ok(t.clone())
        }
    }

    /// `x ← unop(x)` on the device (a 16-bit `x` through an f32 copy); false when the
    /// kernel does not take `x`.
    pub(crate) fn inplace_unary(&self, op: &'static str, x: &mut Tensor, code: Un, p0: f32, p1: f32) -> Result<bool> {
        if x.is_host() || convert::common_float(&[x]).is_none() {
            return Ok(false);
        }
        x.ensure_writable(op)?;
        let n = x.elem_count();
        let params = [code as u32, u(n)?, f(p0), f(p1)];
        self.update_widened(op, &[&*x], |x| self.ctx.flat(op, &kernels::UNARY_INPLACE, &[&x[0]], &params, n))?;
        Ok(true)
    }

    /// dst ← src on the device (both device tensors, same byte length).
    pub(crate) fn copy_device(&self, dst: &Tensor, src: &Tensor) -> Result<()> {
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

// The impl block is wrapped so that `WgpuBackend::OVERRIDDEN` lists its methods, which
// the native-list test compares with `NATIVE_OPS`.
fusebox::backend_impl! {
    impl ComputeBackend for WgpuBackend {
        fn name(&self) -> &str {
            &self.name
        }

        fn device(&self) -> Device {
            Device { kind: DeviceKind::Gpu, index: 0, name: self.ctx.info.name.clone(), memory_bytes: None }
        }

        fn supports(&self, op: Op) -> bool {
            native_ops::is_native(op)
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
            spec::memory::zeros(shape, dtype)?;
            self.ctx.zeros("zeros", shape.clone(), dtype)
        }

        fn copy(&self, x: &Tensor) -> Result<Tensor> {
            if x.is_host() || !x.byte_offset().is_multiple_of(4) {
                return fallback!(self, cpu::memory::copy; [x]);
            }
            self.ctx.copy_tensor("copy", x)
        }

        fn copy_into(&self, dst: &mut Tensor, src: &Tensor) -> Result<()> {
            spec::memory::copy_into(dst, src)?;
            if dst.is_host() {
                let src = self.to_host(src)?;
                return cpu::memory::copy_into(self.cpu(), dst, &src);
            }
            dst.ensure_writable("copy_into")?;
            let src = self.dev(src)?;
            self.copy_device(dst, &src)
        }

        fn fill(&self, dst: &mut Tensor, value: f32) -> Result<()> {
            spec::memory::fill(dst)?;
            if self.inplace_unary("fill", dst, Un::Fill, value, 0.0)? {
                return Ok(());
            }
            self.ctx.note_fallback("in place");
            in_place_on_cpu(self, dst, |cpu, dst| cpu::memory::fill(cpu, dst, value))
        }

        fn cast(&self, x: &Tensor, dtype: DType) -> Result<Tensor> {
            convert::cast(self, x, dtype)
        }

        fn preprocess_linear_weight(&self, w: &Tensor) -> Result<Tensor> {
            fusebox::spec::quant::preprocess_linear_weight(w)?;
            self.dev(w)
        }

        fn quantized_matmul(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
            quant::quantized_matmul(self, x, w)
        }

        fn matmul(&self, a: &Tensor, b: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor> {
            matmul::matmul(self, a, b, transpose_a, transpose_b)
        }

        fn matmul_backward(
            &self,
            a: &Tensor,
            b: &Tensor,
            d_out: &Tensor,
            transpose_a: bool,
            transpose_b: bool,
        ) -> Result<MatmulGradients> {
            matmul::matmul_backward(self, a, b, d_out, transpose_a, transpose_b)
        }

        fn batched_matmul(&self, a: &Tensor, b: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor> {
            matmul::batched_matmul(self, a, b, transpose_a, transpose_b)
        }

        fn linear_forward(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
            linear::linear_forward(self, x, w, bias)
        }

        fn linear_backward(&self, x: &Tensor, w: &Tensor, d_out: &Tensor, with_bias: bool) -> Result<LinearGradients> {
            linear::linear_backward(self, x, w, d_out, with_bias)
        }

        fn linear_backward_accumulate(
            &self,
            x: &Tensor,
            w: &Tensor,
            d_out: &Tensor,
            dweight: &mut Tensor,
            dbias: Option<&mut Tensor>,
        ) -> Result<Tensor> {
            linear::linear_backward_accumulate(self, x, w, d_out, dweight, dbias)
        }

        fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, scale: f32, causal: bool) -> Result<Tensor> {
            attention::attention(self, q, k, v, scale, causal)
        }

        fn causal_attention(
            &self,
            q: &Tensor,
            k: &Tensor,
            v: &Tensor,
            window: Option<usize>,
            sinks: Option<&Tensor>,
            scale: f32,
        ) -> Result<CausalAttentionResult> {
            attention::causal_attention(self, q, k, v, window, sinks, scale)
        }

        fn causal_attention_backward(
            &self,
            q: &Tensor,
            k: &Tensor,
            v: &Tensor,
            result: &CausalAttentionResult,
            d_out: &Tensor,
            window: Option<usize>,
            sinks: Option<&Tensor>,
            scale: f32,
        ) -> Result<AttentionGradients> {
            attention::causal_attention_backward(self, q, k, v, result, d_out, window, sinks, scale)
        }

        fn supports_causal_attention(
            &self,
            q: &Tensor,
            k: &Tensor,
            v: &Tensor,
            window: Option<usize>,
            sinks: Option<&Tensor>,
            _scale: f32,
        ) -> bool {
            attention::supports_causal_attention(q, k, v, window, sinks)
        }

        fn write_head_cache(&self, cache: &mut Tensor, new: &Tensor, pos: usize) -> Result<()> {
            attention::write_head_cache(self, cache, new, pos)
        }

        fn decode_attention(
            &self,
            q: &Tensor,
            k_cache: &Tensor,
            v_cache: &Tensor,
            kv_len: usize,
            window: Option<usize>,
            sinks: Option<&Tensor>,
            scale: f32,
        ) -> Result<Tensor> {
            attention::decode_attention(self, q, k_cache, v_cache, kv_len, window, sinks, scale)
        }

        fn split_heads(&self, x: &Tensor, heads: usize) -> Result<Tensor> {
            layout::split_heads(self, x, heads)
        }

        fn merge_heads(&self, x: &Tensor) -> Result<Tensor> {
            layout::merge_heads(self, x)
        }

        fn silu(&self, x: &Tensor) -> Result<Tensor> {
            activation::silu(self, x)
        }

        fn silu_backward(&self, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
            activation::silu_backward(self, x, d_out)
        }

        fn gelu(&self, x: &Tensor, form: GeluForm) -> Result<Tensor> {
            activation::gelu(self, x, form)
        }

        fn gelu_backward(&self, x: &Tensor, d_out: &Tensor, form: GeluForm) -> Result<Tensor> {
            activation::gelu_backward(self, x, d_out, form)
        }

        fn relu(&self, x: &Tensor) -> Result<Tensor> {
            activation::relu(self, x)
        }

        fn relu_backward(&self, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
            activation::relu_backward(self, x, d_out)
        }

        fn sigmoid(&self, x: &Tensor) -> Result<Tensor> {
            activation::sigmoid(self, x)
        }

        fn sigmoid_backward(&self, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
            activation::sigmoid_backward(self, x, d_out)
        }

        fn tanh(&self, x: &Tensor) -> Result<Tensor> {
            activation::tanh(self, x)
        }

        fn tanh_backward(&self, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
            activation::tanh_backward(self, x, d_out)
        }

        fn silu_mul(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
            activation::silu_mul(self, gate, up)
        }

        fn silu_mul_backward(&self, gate: &Tensor, up: &Tensor, d_out: &Tensor) -> Result<PairGradients> {
            activation::silu_mul_backward(self, gate, up, d_out)
        }

        fn gelu_mul(&self, gate: &Tensor, up: &Tensor, form: GeluForm) -> Result<Tensor> {
            activation::gelu_mul(self, gate, up, form)
        }

        fn gelu_mul_backward(
            &self,
            gate: &Tensor,
            up: &Tensor,
            d_out: &Tensor,
            form: GeluForm,
        ) -> Result<PairGradients> {
            activation::gelu_mul_backward(self, gate, up, d_out, form)
        }

        fn stable_softplus(&self, x: &Tensor) -> Result<Tensor> {
            activation::stable_softplus(self, x)
        }

        fn rms_norm(&self, x: &Tensor, weight: &Tensor, eps: f32) -> Result<NormOutput> {
            norm::rms_norm(self, x, weight, eps)
        }

        fn rms_norm_backward(&self, x: &Tensor, weight: &Tensor, rstd: &Tensor, d_out: &Tensor) -> Result<NormGradients> {
            norm::rms_norm_backward(self, x, weight, rstd, d_out)
        }

        fn layer_norm(&self, x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<NormOutput> {
            norm::layer_norm(self, x, weight, bias, eps)
        }

        fn layer_norm_backward(
            &self,
            x: &Tensor,
            weight: &Tensor,
            mean: &Tensor,
            rstd: &Tensor,
            d_out: &Tensor,
        ) -> Result<NormGradients> {
            norm::layer_norm_backward(self, x, weight, mean, rstd, d_out)
        }

        fn add_rms_norm(&self, a: &Tensor, b: &Tensor, weight: &Tensor, eps: f32) -> Result<(Tensor, NormOutput)> {
            norm::add_rms_norm(self, a, b, weight, eps)
        }

        fn softmax(&self, x: &Tensor, dim: usize) -> Result<Tensor> {
            softmax_loss::softmax(self, x, dim)
        }

        fn softmax_backward(&self, y: &Tensor, d_out: &Tensor, dim: usize) -> Result<Tensor> {
            softmax_loss::softmax_backward(self, y, d_out, dim)
        }

        fn log_softmax(&self, x: &Tensor, dim: usize) -> Result<Tensor> {
            softmax_loss::log_softmax(self, x, dim)
        }

        fn cross_entropy(
            &self,
            logits: &Tensor,
            targets: &Tensor,
            ignore_index: Option<u32>,
        ) -> Result<CrossEntropyOutput> {
            softmax_loss::cross_entropy(self, logits, targets, ignore_index)
        }

        fn cross_entropy_backward(
            &self,
            logits: &Tensor,
            targets: &Tensor,
            ignore_index: Option<u32>,
            d_loss: f32,
        ) -> Result<Tensor> {
            softmax_loss::cross_entropy_backward(self, logits, targets, ignore_index, d_loss)
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
            optim::adamw_update(self, param, grad, m, v, config, step)
        }

        fn global_norm(&self, tensors: &[Tensor]) -> Result<f32> {
            optim::global_norm(self, tensors)
        }

        fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor, style: RopeStyle, offset: usize) -> Result<Tensor> {
            rope_embedding::rope(self, x, cos, sin, style, offset)
        }

        fn rope_backward(
            &self,
            d_out: &Tensor,
            cos: &Tensor,
            sin: &Tensor,
            style: RopeStyle,
            offset: usize,
        ) -> Result<Tensor> {
            rope_embedding::rope_backward(self, d_out, cos, sin, style, offset)
        }

        fn embedding(&self, ids: &Tensor, table: &Tensor) -> Result<Tensor> {
            rope_embedding::embedding(self, ids, table)
        }

        fn embedding_backward(&self, ids: &Tensor, d_out: &Tensor, vocab: usize) -> Result<Tensor> {
            rope_embedding::embedding_backward(self, ids, d_out, vocab)
        }

        fn scatter_add_rows(&self, dst: &mut Tensor, ids: &Tensor, src: &Tensor) -> Result<()> {
            rope_embedding::scatter_add_rows(self, dst, ids, src)
        }

        fn slice_rows(&self, x: &Tensor, start: usize, len: usize) -> Result<Tensor> {
            layout::slice_rows(self, x, start, len)
        }

        fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
            binary::add(self, a, b)
        }

        fn sub(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
            binary::sub(self, a, b)
        }

        fn mul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
            binary::mul(self, a, b)
        }

        fn div(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
            binary::div(self, a, b)
        }

        fn add_scalar(&self, a: &Tensor, s: f32) -> Result<Tensor> {
            binary::add_scalar(self, a, s)
        }

        fn sub_scalar(&self, a: &Tensor, s: f32) -> Result<Tensor> {
            binary::sub_scalar(self, a, s)
        }

        fn mul_scalar(&self, a: &Tensor, s: f32) -> Result<Tensor> {
            binary::mul_scalar(self, a, s)
        }

        fn div_scalar(&self, a: &Tensor, s: f32) -> Result<Tensor> {
            binary::div_scalar(self, a, s)
        }

        fn add_assign(&self, a: &mut Tensor, b: &Tensor) -> Result<()> {
            binary::add_assign(self, a, b)
        }

        fn sub_assign(&self, a: &mut Tensor, b: &Tensor) -> Result<()> {
            binary::sub_assign(self, a, b)
        }

        fn mul_assign(&self, a: &mut Tensor, b: &Tensor) -> Result<()> {
            binary::mul_assign(self, a, b)
        }

        fn div_assign(&self, a: &mut Tensor, b: &Tensor) -> Result<()> {
            binary::div_assign(self, a, b)
        }

        fn add_row(&self, x: &Tensor, row: &Tensor) -> Result<Tensor> {
            binary::add_row(self, x, row)
        }

        fn sub_row(&self, x: &Tensor, row: &Tensor) -> Result<Tensor> {
            binary::sub_row(self, x, row)
        }

        fn mul_row(&self, x: &Tensor, row: &Tensor) -> Result<Tensor> {
            binary::mul_row(self, x, row)
        }

        fn div_row(&self, x: &Tensor, row: &Tensor) -> Result<Tensor> {
            binary::div_row(self, x, row)
        }

        fn add_col(&self, x: &Tensor, col: &Tensor) -> Result<Tensor> {
            binary::add_col(self, x, col)
        }

        fn sub_col(&self, x: &Tensor, col: &Tensor) -> Result<Tensor> {
            binary::sub_col(self, x, col)
        }

        fn mul_col(&self, x: &Tensor, col: &Tensor) -> Result<Tensor> {
            binary::mul_col(self, x, col)
        }

        fn div_col(&self, x: &Tensor, col: &Tensor) -> Result<Tensor> {
            binary::div_col(self, x, col)
        }

        fn add3(&self, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<Tensor> {
            binary::add3(self, a, b, c)
        }

        fn exp_mul(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
            binary::exp_mul(self, x, y)
        }

        fn sub_mul(&self, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<Tensor> {
            binary::sub_mul(self, a, b, c)
        }

        fn add_scaled(&self, a: &Tensor, b: &Tensor, c: f32) -> Result<Tensor> {
            binary::add_scaled(self, a, b, c)
        }

        fn exp(&self, x: &Tensor) -> Result<Tensor> {
            unary::exp(self, x)
        }

        fn log(&self, x: &Tensor) -> Result<Tensor> {
            unary::log(self, x)
        }

        fn sqrt(&self, x: &Tensor) -> Result<Tensor> {
            unary::sqrt(self, x)
        }

        fn pow(&self, x: &Tensor, p: f32) -> Result<Tensor> {
            unary::pow(self, x, p)
        }

        fn neg(&self, x: &Tensor) -> Result<Tensor> {
            unary::neg(self, x)
        }

        fn abs(&self, x: &Tensor) -> Result<Tensor> {
            unary::abs(self, x)
        }

        fn clamp(&self, x: &Tensor, lo: f32, hi: f32) -> Result<Tensor> {
            unary::clamp(self, x, lo, hi)
        }

        fn exp_inplace(&self, x: &mut Tensor) -> Result<()> {
            unary::exp_inplace(self, x)
        }

        fn log_inplace(&self, x: &mut Tensor) -> Result<()> {
            unary::log_inplace(self, x)
        }

        fn sqrt_inplace(&self, x: &mut Tensor) -> Result<()> {
            unary::sqrt_inplace(self, x)
        }

        fn pow_inplace(&self, x: &mut Tensor, p: f32) -> Result<()> {
            unary::pow_inplace(self, x, p)
        }

        fn neg_inplace(&self, x: &mut Tensor) -> Result<()> {
            unary::neg_inplace(self, x)
        }

        fn abs_inplace(&self, x: &mut Tensor) -> Result<()> {
            unary::abs_inplace(self, x)
        }

        fn clamp_inplace(&self, x: &mut Tensor, lo: f32, hi: f32) -> Result<()> {
            unary::clamp_inplace(self, x, lo, hi)
        }

        fn sum(&self, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
            reduce::sum(self, x, axis)
        }

        fn mean(&self, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
            reduce::mean(self, x, axis)
        }

        fn max(&self, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
            reduce::max(self, x, axis)
        }

        fn var(&self, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
            reduce::var(self, x, axis)
        }

        fn sum_abs(&self, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
            reduce::sum_abs(self, x, axis)
        }

        fn argmax(&self, x: &Tensor, axis: usize) -> Result<Tensor> {
            reduce::argmax(self, x, axis)
        }

        fn max_backward(&self, x: &Tensor, d_out: &Tensor, axis: usize) -> Result<Tensor> {
            reduce::max_backward(self, x, d_out, axis)
        }

        fn sum_to_shape(&self, x: &Tensor, shape: &Shape) -> Result<Tensor> {
            reduce::sum_to_shape(self, x, shape)
        }

        fn permute(&self, x: &Tensor, perm: &[usize]) -> Result<Tensor> {
            layout::permute(self, x, perm)
        }

        fn transpose(&self, x: &Tensor, dim0: usize, dim1: usize) -> Result<Tensor> {
            layout::transpose(self, x, dim0, dim1)
        }
    }
}
