//! The `ComputeBackend` trait: every tensor operation a transformer needs, forward
//! and backward. Each method has a CPU implementation as its default, so a new
//! backend implements `name`, `device`, `upload` and `to_host` and overrides only
//! what it accelerates; what it does not override runs on the CPU (inputs copied to
//! the host, outputs uploaded back) and `supports` reports it as a fallback.
//!
//! Conventions: tensors are row-major and contiguous; attention layout is
//! `(batch, heads, seq, head_dim)`; every floating-point op accepts F32, F16 and BF16
//! (computing in f32; outputs take the input dtype) unless it says otherwise; mixed
//! dtypes are an error; saved statistics are f32.

use std::fmt::Debug;
use std::sync::Arc;

use crate::cpu::{self, CpuBackend};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::shape::Shape;
use crate::tensor::{Device, Tensor};
use crate::types::*;

/// Moves op results to a backend's memory (used by the CPU fallbacks).
pub trait ToBackend: Sized {
    /// `self` with every tensor uploaded to `backend`.
    fn to_backend<B: ComputeBackend + ?Sized>(self, backend: &B) -> Result<Self>;
}

impl ToBackend for Tensor {
    fn to_backend<B: ComputeBackend + ?Sized>(self, backend: &B) -> Result<Self> {
        if backend.uses_device_storage() {
            backend.upload(&self)
        } else {
            Ok(self)
        }
    }
}
impl<T: ToBackend> ToBackend for Option<T> {
    fn to_backend<B: ComputeBackend + ?Sized>(self, backend: &B) -> Result<Self> {
        self.map(|t| t.to_backend(backend)).transpose()
    }
}
impl<T: ToBackend> ToBackend for Vec<T> {
    fn to_backend<B: ComputeBackend + ?Sized>(self, backend: &B) -> Result<Self> {
        self.into_iter().map(|t| t.to_backend(backend)).collect()
    }
}
impl<A: ToBackend, C: ToBackend> ToBackend for (A, C) {
    fn to_backend<B: ComputeBackend + ?Sized>(self, backend: &B) -> Result<Self> {
        Ok((self.0.to_backend(backend)?, self.1.to_backend(backend)?))
    }
}
macro_rules! plain_to_backend {
    ($($t:ty),*) => {$(
        impl ToBackend for $t {
            fn to_backend<B: ComputeBackend + ?Sized>(self, _backend: &B) -> Result<Self> { Ok(self) }
        }
    )*};
}
plain_to_backend!((), f32, bool, usize);
macro_rules! struct_to_backend {
    ($t:ident { $($field:ident),* } $(, $plain:ident)*) => {
        impl ToBackend for $t {
            fn to_backend<B: ComputeBackend + ?Sized>(self, backend: &B) -> Result<Self> {
                Ok($t { $($field: self.$field.to_backend(backend)?,)* $($plain: self.$plain,)* })
            }
        }
    };
}
struct_to_backend!(CausalAttentionResult { output, logsumexp });
struct_to_backend!(AttentionGradients { dq, dk, dv, dsinks });
struct_to_backend!(NormOutput { output, mean, rstd });
struct_to_backend!(NormGradients { dx, dweight, dbias });
struct_to_backend!(MatmulGradients { da, db });
struct_to_backend!(LinearGradients { dx, dweight, dbias });
struct_to_backend!(PairGradients { da, db });
struct_to_backend!(ConvGradients { dx, dw, dbias, d_ctx });
struct_to_backend!(GatedNormGradients { dx, dz, dweight });
struct_to_backend!(GateOutput { g, beta });
struct_to_backend!(GateGradients { da, db, da_log, ddt_bias });
struct_to_backend!(CrossEntropyOutput { loss, d_logits }, count);
struct_to_backend!(TopK { values, indices });
struct_to_backend!(Routed { weights, experts });
struct_to_backend!(DeltaRuleOutput { out, state });
struct_to_backend!(DeltaRuleGradients { dq, dk, dv, dg, dbeta, d_initial_state });

/// Runs a CPU kernel for an op a backend does not compute natively: the named tensor
/// arguments are brought to the host, the kernel runs on the backend's CPU backend
/// (`cpu()`), and the result is uploaded back. The trait's default methods are this
/// macro; a backend overriding an op calls it for the inputs its kernel does not take.
///
/// `on_cpu!(backend, kernel_path; [tensor args], other args...)` calls
/// `kernel_path(backend.cpu(), &tensor_args..., other_args...)`. For a kernel whose
/// tensors are not its first arguments, `on_cpu!(backend, [tensor args] => |cpu| call)`
/// evaluates `call` with each tensor argument rebound to a reference to its host copy.
#[macro_export]
macro_rules! on_cpu {
    ($self:expr, [$($t:ident),*] => |$cpu:ident| $call:expr) => {{
        let backend = $self;
        $(let $t = &$crate::ComputeBackend::to_host(backend, $t)?;)*
        let $cpu = $crate::ComputeBackend::cpu(backend);
        let _isa = $cpu.enter();
        $crate::ToBackend::to_backend($call?, backend)
    }};
    ($self:expr, $kernel:path; [$($t:ident),*] $(, $arg:expr)*) => {{
        let backend = $self;
        $(let $t = $crate::ComputeBackend::to_host(backend, $t)?;)*
        let cpu = $crate::ComputeBackend::cpu(backend);
        let _isa = cpu.enter();
        $crate::ToBackend::to_backend($kernel(cpu, $(&$t,)* $($arg),*)?, backend)
    }};
}

/// Wraps a backend's `impl ComputeBackend for T { ... }` block and also defines
/// `T::OVERRIDDEN`, the names of the methods the block defines, in order: the list of
/// ops the backend overrides, knowable without reflection. [`check_native_ops`]
/// compares it with the backend's `supports`.
///
/// ```
/// use fusebox::{ComputeBackend, CpuBackend, Device, Result, Tensor};
///
/// #[derive(Debug)]
/// struct Host;
/// fusebox::backend_impl! {
///     impl ComputeBackend for Host {
///         fn name(&self) -> &str { "host" }
///         fn device(&self) -> Device { Device::cpu() }
///         fn upload(&self, x: &Tensor) -> Result<Tensor> { Ok(x.clone()) }
///         fn to_host(&self, x: &Tensor) -> Result<Tensor> { Ok(x.clone()) }
///     }
/// }
/// assert_eq!(Host::OVERRIDDEN, ["name", "device", "upload", "to_host"]);
/// ```
#[macro_export]
macro_rules! backend_impl {
    (
        impl ComputeBackend for $ty:ty {
            $( $(#[$attr:meta])* fn $name:ident ( $($params:tt)* ) $(-> $ret:ty)? $body:block )*
        }
    ) => {
        impl $crate::ComputeBackend for $ty {
            $( $(#[$attr])* fn $name ( $($params)* ) $(-> $ret)? $body )*
        }

        impl $ty {
            /// The `ComputeBackend` methods this backend overrides (from its impl block).
            pub const OVERRIDDEN: &'static [&'static str] = &[$(stringify!($name)),*];
        }
    };
}

/// Trait methods that are not operations: helpers every backend may override without
/// it meaning anything about `supports`.
pub const NON_OP_METHODS: &[&str] = &["cpu"];

/// Checks a backend's native list against the methods it overrides (its
/// [`backend_impl!`] `OVERRIDDEN`): every overridden method must be an op that
/// `supports` reports, and every op `supports` reports must be overridden. Returns one
/// line per op that drifted, naming it and the backend.
pub fn check_native_ops(
    backend: &str,
    overridden: &[&str],
    supports: impl Fn(Op) -> bool,
) -> std::result::Result<(), Vec<String>> {
    let mut drift = Vec::new();
    for name in overridden.iter().filter(|n| !NON_OP_METHODS.contains(n)) {
        match Op::from_name(name) {
            None => drift.push(format!("{backend}: overrides `{name}`, which is no `Op` (add it to op.rs)")),
            Some(op) if !supports(op) => {
                drift.push(format!("{backend}: overrides `{name}` but `supports(Op::{op:?})` is false"))
            }
            Some(_) => {}
        }
    }
    for &op in Op::ALL {
        if supports(op) && !overridden.contains(&op.name()) {
            drift.push(format!("{backend}: `supports(Op::{op:?})` is true but `{}` is not overridden", op.name()));
        }
    }
    if drift.is_empty() {
        Ok(())
    } else {
        Err(drift)
    }
}

fn opt_to_host<B: ComputeBackend + ?Sized>(b: &B, t: Option<&Tensor>) -> Result<Option<Tensor>> {
    t.map(|t| b.to_host(t)).transpose()
}

/// An accumulating linear backward on host tensors (`cpu::matmul::linear_backward_accumulate`
/// and its BF16 twin): `dW += …`, `dbias += …`, returns `dx`.
type LinearAccumulate = fn(&CpuBackend, &Tensor, &Tensor, &Tensor, &mut Tensor, Option<&mut Tensor>) -> Result<Tensor>;

/// Runs `kernel` for any backend: in place when the gradients are host tensors, else on
/// host copies that are written back with the backend's `copy_into`.
fn linear_accumulate_on_cpu<B: ComputeBackend + ?Sized>(
    b: &B,
    kernel: LinearAccumulate,
    (x, w, d_out): (&Tensor, &Tensor, &Tensor),
    dweight: &mut Tensor,
    dbias: Option<&mut Tensor>,
) -> Result<Tensor> {
    let (x, w, d_out) = (b.to_host(x)?, b.to_host(w)?, b.to_host(d_out)?);
    if dweight.is_host() && dbias.as_ref().is_none_or(|db| db.is_host()) {
        return kernel(b.cpu(), &x, &w, &d_out, dweight, dbias)?.to_backend(b);
    }
    // Device-resident gradients: accumulate into host copies, then write them back.
    let mut dw_host = b.to_host(dweight)?;
    let mut db_host = opt_to_host(b, dbias.as_deref())?;
    let dx = kernel(b.cpu(), &x, &w, &d_out, &mut dw_host, db_host.as_mut())?;
    b.copy_into(dweight, &b.upload(&dw_host)?)?;
    if let (Some(dst), Some(host)) = (dbias, db_host) {
        b.copy_into(dst, &b.upload(&host)?)?;
    }
    dx.to_backend(b)
}

/// Runs an in-place CPU kernel on `dst`: directly when `dst` is on the host, else on a
/// host copy that is then written back with the backend's `copy_into`.
pub fn in_place_on_cpu<B: ComputeBackend + ?Sized>(
    backend: &B,
    dst: &mut Tensor,
    kernel: impl FnOnce(&CpuBackend, &mut Tensor) -> Result<()>,
) -> Result<()> {
    let cpu = backend.cpu();
    if dst.is_host() {
        let _isa = cpu.enter();
        return kernel(cpu, dst);
    }
    let mut host = backend.to_host(dst)?;
    {
        let _isa = cpu.enter();
        kernel(cpu, &mut host)?;
    }
    let back = backend.upload(&host)?;
    backend.copy_into(dst, &back)
}

/// Picks a backend by name: `"cpu"` (also `"cpu:N"` for N threads). Errors name the
/// backends this build knows.
pub fn create_backend(name: &str) -> Result<Arc<dyn ComputeBackend>> {
    let lower = name.trim().to_ascii_lowercase();
    if lower == "cpu" {
        return Ok(Arc::new(CpuBackend::new()?));
    }
    if let Some(threads) = lower.strip_prefix("cpu:") {
        let n: usize = threads
            .parse()
            .map_err(|_| Error::value("create_backend", "thread count in 'cpu:N'", "a positive integer", threads))?;
        return Ok(Arc::new(CpuBackend::with_threads(n)?));
    }
    let reason = match lower.as_str() {
        "wgpu" | "vulkan" | "metal" | "dx12" | "cuda" => {
            format!("backend '{name}' is not compiled into this build; available: {}", available_backends().join(", "))
        }
        _ => format!("unknown backend '{name}'; known: {}", available_backends().join(", ")),
    };
    Err(Error::unsupported("create_backend", reason))
}

/// Names of the backends compiled into this build that can be created here.
pub fn available_backends() -> Vec<&'static str> {
    vec!["cpu"]
}

/// Every tensor operation of fusebox. See the module docs for conventions; each
/// method's documentation is its contract (the maths, `# Shapes`), its arguments' rules
/// are its spec in [`spec`](crate::spec), and [`Op`] names every method.
pub trait ComputeBackend: Send + Sync + Debug {
    // ───────────────────────── device, memory, dtypes ─────────────────────────

    /// Human-readable backend name (`"cpu"`, `"wgpu (lavapipe)"`, ...).
    fn name(&self) -> &str;

    /// The device this backend computes on.
    fn device(&self) -> Device;

    /// Whether `op` runs natively here (`false`: it falls back to the CPU).
    fn supports(&self, op: Op) -> bool {
        let _ = op;
        false
    }

    /// Moves a tensor into this backend's memory (a cheap clone for host backends).
    fn upload(&self, x: &Tensor) -> Result<Tensor>;

    /// Moves a tensor to host memory (a cheap clone when it is already there).
    fn to_host(&self, x: &Tensor) -> Result<Tensor>;

    /// Whether tensors made by this backend live off the host.
    fn uses_device_storage(&self) -> bool {
        false
    }

    /// Waits for all queued work to finish.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// Frees caches, pools and workspaces.
    fn release_resources(&self) -> Result<()> {
        Ok(())
    }

    /// Frees per-call workspaces only, keeping long-lived caches.
    fn release_temporary_resources(&self) -> Result<()> {
        Ok(())
    }

    /// The CPU backend that runs this backend's fallbacks (the process-wide default
    /// one unless overridden; `CpuBackend` returns itself).
    fn cpu(&self) -> &CpuBackend {
        cpu::default_cpu()
    }

    /// A zero-filled tensor.
    ///
    /// # Shapes
    /// `shape` → `shape`, any dtype (block formats need a last dim multiple of the block).
    fn zeros(&self, shape: &Shape, dtype: DType) -> Result<Tensor> {
        crate::spec::memory::zeros(shape, dtype)?;
        Tensor::zeros(shape.clone(), dtype)?.to_backend(self)
    }

    /// A fresh, uniquely owned copy of `x` (writable in place).
    ///
    /// # Shapes
    /// any → same shape and dtype.
    fn copy(&self, x: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::memory::copy; [x])
    }

    /// `dst ← src`, in place. `dst` must be writable and match `src` in shape and dtype.
    ///
    /// # Shapes
    /// `dst`, `src`: equal shapes and dtypes.
    fn copy_into(&self, dst: &mut Tensor, src: &Tensor) -> Result<()> {
        crate::spec::memory::copy_into(dst, src)?;
        if !dst.is_host() {
            return Err(Error::unsupported(
                "copy_into",
                format!("backend '{}' keeps tensors on its device but does not implement copy_into", self.name()),
            ));
        }
        let src = self.to_host(src)?;
        cpu::memory::copy_into(self.cpu(), dst, &src)
    }

    /// Sets every element of `dst` to `value` in place (rounded to `dst`'s dtype);
    /// `dst` must be writable. Zeroes gradient buffers without reallocating them.
    ///
    /// # Shapes
    /// `dst`: any shape, F32/F16/BF16 → unchanged.
    fn fill(&self, dst: &mut Tensor, value: f32) -> Result<()> {
        in_place_on_cpu(self, dst, |cpu, dst| cpu::memory::fill(cpu, dst, value))
    }

    /// Converts among F32, F16 and BF16 (round to nearest even), or U32 ↔ F32
    /// (ids as exact integers; F32 → U32 needs non-negative integral values).
    ///
    /// # Shapes
    /// any → same shape, dtype `dtype`.
    fn cast(&self, x: &Tensor, dtype: DType) -> Result<Tensor> {
        on_cpu!(self, cpu::memory::cast; [x], dtype)
    }

    /// Called once when a model loads: returns the weight `[out, in]` in the layout
    /// this backend's `linear_forward`/`quantized_matmul` read fastest. The result is
    /// only meant for those two ops.
    ///
    /// # Shapes
    /// `w`: `[out, in]` → backend-specific, same logical shape.
    fn preprocess_linear_weight(&self, w: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::memory::preprocess_linear_weight; [w])
    }

    /// FP8 E4M3 → f32: `x = (−1)^s · 2^(e−7) · (1 + m/8)`, subnormals `2^−6 · m/8`, NaN kept.
    ///
    /// # Shapes
    /// any (F8E4M3) → same shape, F32.
    fn f8e4m3_to_f32(&self, x: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::memory::f8e4m3_to; [x], DType::F32)
    }

    /// FP8 E4M3 → f16 (exact).
    ///
    /// # Shapes
    /// any (F8E4M3) → same shape, F16.
    fn f8e4m3_to_f16(&self, x: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::memory::f8e4m3_to; [x], DType::F16)
    }

    /// FP8 E4M3 → bf16 (exact).
    ///
    /// # Shapes
    /// any (F8E4M3) → same shape, BF16.
    fn f8e4m3_to_bf16(&self, x: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::memory::f8e4m3_to; [x], DType::BF16)
    }

    /// Quantizes float values into a GGUF block format (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
    /// IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) or FP8 E4M3, giving the blocks ggml's
    /// `ggml_quantize_chunk` writes without an importance matrix.
    ///
    /// # Shapes
    /// `[..., n]` float, n a multiple of the block size → same shape, dtype `dtype`.
    fn quantize(&self, x: &Tensor, dtype: DType) -> Result<Tensor> {
        on_cpu!(self, cpu::quant::quantize; [x], dtype)
    }

    /// Block format or FP8 → f32 values.
    ///
    /// # Shapes
    /// any → same shape, F32.
    fn dequantize(&self, x: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::quant::dequantize; [x])
    }

    /// `y = x · Wᵀ` read straight from W's blocks (never materialising W in f32). With
    /// few rows of x (decoding), a backend may use `x̃`, x rounded to 8 bits per block
    /// (see [`crate::spec::quant::int_activation_block`]), for integer dot products.
    ///
    /// # Shapes
    /// `x`: `[..., in]` float; `w`: `[out, in]` block format → `[..., out]`, x's dtype.
    fn quantized_matmul(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::quant::quantized_matmul; [x, w])
    }

    /// `dx = dy · W` read straight from W's blocks: the input gradient of
    /// `y = quantized_matmul(x, W)` with W frozen (LoRA/QLoRA on a quantized base), never
    /// materialising W in f32.
    ///
    /// # Shapes
    /// `dy`: `[..., out]` float; `w`: `[out, in]` block format → `[..., in]`, dy's dtype.
    fn quantized_matmul_backward(&self, dy: &Tensor, w: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::quant::quantized_matmul_backward; [dy, w])
    }

    // ───────────────────────────── linear algebra ─────────────────────────────

    /// `out = op(a) · op(b)`, `op` transposing the last two dims when its flag is set;
    /// batched over leading dims (b may be 2-d and is then shared by every batch).
    ///
    /// # Shapes
    /// `a`: `[..., m, k]` (`[..., k, m]` if `transpose_a`); `b`: `[..., k, n]` or `[k, n]`
    /// (`[..., n, k]` / `[n, k]` if `transpose_b`) → `[..., m, n]`.
    fn matmul(&self, a: &Tensor, b: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor> {
        on_cpu!(self, cpu::matmul::matmul; [a, b], transpose_a, transpose_b)
    }

    /// Backward of `matmul`: `da`, `db` (db summed over the batch when b was shared).
    ///
    /// # Shapes
    /// as `matmul`; `d_out`: `[..., m, n]` → `da` like `a`, `db` like `b`.
    fn matmul_backward(
        &self,
        a: &Tensor,
        b: &Tensor,
        d_out: &Tensor,
        transpose_a: bool,
        transpose_b: bool,
    ) -> Result<MatmulGradients> {
        on_cpu!(self, cpu::matmul::matmul_backward; [a, b, d_out], transpose_a, transpose_b)
    }

    /// `out[i] = op(a[i]) · op(b[i])` for rank-3 operands.
    ///
    /// # Shapes
    /// `a`: `[n, m, k]`, `b`: `[n, k, p]` (last two dims swapped by the flags) → `[n, m, p]`.
    fn batched_matmul(&self, a: &Tensor, b: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor> {
        on_cpu!(self, cpu::matmul::batched_matmul; [a, b], transpose_a, transpose_b)
    }

    /// `y = x · Wᵀ + bias`.
    ///
    /// # Shapes
    /// `x`: `[..., in]`; `w`: `[out, in]`; `bias`: `[out]` → `[..., out]`.
    fn linear_forward(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let bias = opt_to_host(self, bias)?;
        on_cpu!(self, cpu::matmul::linear_forward; [x, w], bias.as_ref())
    }

    /// Backward of `linear_forward`: `dx = dy · W`, `dW = dyᵀ · x`, `dbias = Σ_rows dy`.
    ///
    /// # Shapes
    /// `x`: `[..., in]`; `w`: `[out, in]`; `d_out`: `[..., out]` → dx `[..., in]`,
    /// dW `[out, in]`, dbias `[out]` when `with_bias`.
    fn linear_backward(&self, x: &Tensor, w: &Tensor, d_out: &Tensor, with_bias: bool) -> Result<LinearGradients> {
        on_cpu!(self, cpu::matmul::linear_backward; [x, w, d_out], with_bias)
    }

    /// Backward of `linear_forward` that adds the parameter gradients into existing
    /// tensors: `dW += dyᵀ · x`, `dbias += Σ_rows dy`, and returns `dx = dy · W`.
    /// Gradient accumulation without a temporary `dW` or a separate add pass;
    /// `dweight` and `dbias` must be writable.
    ///
    /// # Shapes
    /// `x`: `[..., in]`; `w`: `[out, in]`; `d_out`: `[..., out]`; `dweight`: `[out, in]`;
    /// `dbias`: `[out]`; all of one float dtype → dx `[..., in]`.
    fn linear_backward_accumulate(
        &self,
        x: &Tensor,
        w: &Tensor,
        d_out: &Tensor,
        dweight: &mut Tensor,
        dbias: Option<&mut Tensor>,
    ) -> Result<Tensor> {
        linear_accumulate_on_cpu(self, cpu::matmul::linear_backward_accumulate, (x, w, d_out), dweight, dbias)
    }

    /// `y = bf16(x) · bf16(W)ᵀ + bias`: [`linear_forward`](Self::linear_forward) with x
    /// and W rounded to BF16 (round to nearest even) and the products accumulated in
    /// f32, the matmul of mixed-precision (BF16) training; the bias is added in f32.
    /// The CPU runs `vdpbf16ps` where the CPU has AVX-512 BF16, else the same rounded
    /// products with f32 arithmetic.
    ///
    /// # Shapes
    /// `x`: `[..., in]`; `w`: `[out, in]`; `bias`: `[out]` → `[..., out]`.
    fn linear_forward_bf16(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let bias = opt_to_host(self, bias)?;
        on_cpu!(self, cpu::bf16_gemm::linear::linear_forward_bf16; [x, w], bias.as_ref())
    }

    /// Backward of [`linear_forward_bf16`](Self::linear_forward_bf16) adding into the
    /// parameter gradients, with BF16 operands and f32 accumulation:
    /// `dW += bf16(dy)ᵀ · bf16(x)`, `dbias += Σ_rows dy` (f32), returns
    /// `dx = bf16(dy) · bf16(W)`. The gradients stay f32 (master weights).
    ///
    /// # Shapes
    /// as [`linear_backward_accumulate`](Self::linear_backward_accumulate).
    fn linear_backward_accumulate_bf16(
        &self,
        x: &Tensor,
        w: &Tensor,
        d_out: &Tensor,
        dweight: &mut Tensor,
        dbias: Option<&mut Tensor>,
    ) -> Result<Tensor> {
        let kernel = cpu::bf16_gemm::linear::linear_backward_accumulate_bf16;
        linear_accumulate_on_cpu(self, kernel, (x, w, d_out), dweight, dbias)
    }

    /// Scores of queries against the first `len` cached keys:
    /// `s[b,h,i,j] = q[b,h,i,:] · k_cache[b, h/(Hq/Hkv), j, :]` for `j < len` (no scale).
    ///
    /// # Shapes
    /// `q`: `[B, Hq, Tq, D]`; `k_cache`: `[B, Hkv, capacity, D]`, `len ≤ capacity` →
    /// `[B, Hq, Tq, len]`.
    fn head_prefix_matmul(&self, q: &Tensor, k_cache: &Tensor, len: usize) -> Result<Tensor> {
        on_cpu!(self, cpu::matmul::head_prefix_matmul; [q, k_cache], len)
    }

    // ──────────────────────────── mixture of experts ────────────────────────────

    /// The router of a mixture-of-experts layer: per row of logits `l` (one per expert),
    /// the k experts with the largest logits, largest first (ties: lower index first), and
    /// their weights: `softmax(l)` at them ([`Routing::SoftmaxTopK`]), or the softmax over
    /// the k chosen logits alone ([`Routing::SoftmaxTopKNormalized`],
    /// [`Routing::TopKSoftmax`]).
    ///
    /// # Shapes
    /// `logits`: `[..., E]`, `1 ≤ k ≤ E` → weights `[..., k]` (logits' dtype), experts
    /// `[..., k]` U32.
    fn moe_route(&self, logits: &Tensor, k: usize, routing: Routing) -> Result<Routed> {
        on_cpu!(self, cpu::moe::moe_route; [logits], k, routing)
    }

    /// Gradient of `moe_route`'s weights with respect to the logits (the choice of experts
    /// is piecewise constant): with `p = softmax(l)`, `∂L/∂l_i = p_i·(g_i − Σ_j w_j·g_j)`
    /// unnormalised, `∂L/∂l_{e_j} = w_j·(g_j − Σ w·g)` (others 0) normalised, where `g`
    /// is `d_weights` placed at the chosen experts.
    ///
    /// # Shapes
    /// `logits`: `[..., E]`; `experts`: `[..., k]` U32 (the forward's); `d_weights`:
    /// `[..., k]`, logits' dtype → `[..., E]`, logits' dtype.
    fn moe_route_backward(
        &self,
        logits: &Tensor,
        experts: &Tensor,
        d_weights: &Tensor,
        routing: Routing,
    ) -> Result<Tensor> {
        on_cpu!(self, cpu::moe::moe_route_backward; [logits, experts, d_weights], routing)
    }

    /// Each row times its own expert's weight: `y[t, j] = x[t, r(j)] · W[experts[t, j]]ᵀ`,
    /// `r(j) = 0` when x has one row per token (the gate and up projections, shared by the
    /// k experts), `j` when it has one per chosen expert (the down projection). W is in x's
    /// float dtype or a storage format, read from its blocks as `quantized_matmul` does;
    /// each chosen expert's weight is read once per call, the others not at all.
    ///
    /// # Shapes
    /// `x`: `[T, R, K]` (R = 1 or k); `w`: `[E, N, K]`; `experts`: `[T, k]` U32 →
    /// `[T, k, N]`, x's dtype.
    fn expert_matmul(&self, x: &Tensor, w: &Tensor, experts: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::moe::expert_matmul; [x, w, experts])
    }

    /// Backward of `expert_matmul`: returns `dx[t, r(j)] = Σ dy[t, j] · W[experts[t, j]]`
    /// (from W's blocks for a storage format) and, when `dw` is given (float W only; it
    /// must be writable), adds `dW[e] += Σ_{experts[t, j] = e} dy[t, j]ᵀ · x[t, r(j)]`.
    ///
    /// # Shapes
    /// as `expert_matmul`; `dy`: `[T, k, N]`, x's dtype; `dw`: `[E, N, K]`, w's dtype →
    /// `[T, R, K]`, x's dtype.
    fn expert_matmul_backward(
        &self,
        x: &Tensor,
        w: &Tensor,
        experts: &Tensor,
        dy: &Tensor,
        dw: Option<&mut Tensor>,
    ) -> Result<Tensor> {
        let (x, w, experts, dy) = (self.to_host(x)?, self.to_host(w)?, self.to_host(experts)?, self.to_host(dy)?);
        let cpu = self.cpu();
        let _isa = cpu.enter();
        match dw {
            Some(dw) if !dw.is_host() => {
                // Device-resident gradient: accumulate into a host copy, then write it back.
                let mut host = self.to_host(dw)?;
                let dx = cpu::moe::expert_matmul_backward(cpu, &x, &w, &experts, &dy, Some(&mut host))?;
                self.copy_into(dw, &self.upload(&host)?)?;
                dx.to_backend(self)
            }
            dw => cpu::moe::expert_matmul_backward(cpu, &x, &w, &experts, &dy, dw)?.to_backend(self),
        }
    }

    // ──────────────────────────── linear attention ─────────────────────────────

    /// The gated delta rule (Gated DeltaNet), chunked for prompts and training. Per
    /// sequence b and value head h (reading key head `h / (Hv/Hk)`), a state S
    /// (`Dk × Dv`) starts at `initial_state[b, h]` (zeros when `None`) and for each token
    /// t: `S ← e^{g_t}·S; u = Sᵀk_t; S ← S + k_t·(β_t(v_t − u))ᵀ; o_t = Sᵀ(scale·q_t)`.
    /// Computed 64 tokens at a time in the WY form (a triangular solve inside a chunk,
    /// matrix products between chunks); agrees with the token-by-token recurrence (and
    /// `gated_delta_rule_step` applied T times) within f32 rounding. No normalisation
    /// happens inside: callers l2-normalise q and k first, and pass `scale = Dk^-½`.
    ///
    /// # Shapes
    /// `q`, `k`: `[B, T, Hk, Dk]`; `v`: `[B, T, Hv, Dv]`, `Hv % Hk == 0`; `g`, `beta`:
    /// `[B, T, Hv]`; `initial_state`: `[B, Hv, Dk, Dv]`; all F32 → out `[B, T, Hv, Dv]`,
    /// state `[B, Hv, Dk, Dv]`.
    fn gated_delta_rule(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        g: &Tensor,
        beta: &Tensor,
        initial_state: Option<&Tensor>,
        scale: f32,
    ) -> Result<DeltaRuleOutput> {
        let initial_state = opt_to_host(self, initial_state)?;
        on_cpu!(self, [q, k, v, g, beta] => |c| cpu::delta::gated_delta_rule(c, q, k, v, g, beta, initial_state.as_ref(), scale))
    }

    /// Backward of `gated_delta_rule`: the gradients of q, k, v, g, β (and of the
    /// initial state when one was given) from `d_out` and `d_state`, the gradient
    /// flowing into the final state (`None`: zero). Keeps the state only at chunk
    /// boundaries (a forward scan recomputes them) and recomputes inside each chunk;
    /// the maths is in `cpu::delta::backward`.
    ///
    /// # Shapes
    /// as `gated_delta_rule`; `d_out`: `[B, T, Hv, Dv]`; `d_state`: `[B, Hv, Dk, Dv]` →
    /// dq, dk `[B, T, Hk, Dk]` (summed over each key head's value heads), dv
    /// `[B, T, Hv, Dv]`, dg, dbeta `[B, T, Hv]`, d_initial_state `[B, Hv, Dk, Dv]`; all F32.
    fn gated_delta_rule_backward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        g: &Tensor,
        beta: &Tensor,
        initial_state: Option<&Tensor>,
        d_out: &Tensor,
        d_state: Option<&Tensor>,
        scale: f32,
    ) -> Result<DeltaRuleGradients> {
        let initial_state = opt_to_host(self, initial_state)?;
        let d_state = opt_to_host(self, d_state)?;
        on_cpu!(self, [q, k, v, g, beta, d_out] => |c| cpu::delta::gated_delta_rule_backward(
            c, q, k, v, g, beta, initial_state.as_ref(), d_out, d_state.as_ref(), scale
        ))
    }

    /// One decode step of the gated delta rule (T = 1), the state updated in place:
    /// per sequence b and value head h, `S ← e^{g}·S; u = Sᵀk; S ← S + k·(β(v − u))ᵀ`,
    /// returning `o = Sᵀ(scale·q)` (the new S). One pass over the state.
    ///
    /// # Shapes
    /// `q`, `k`: `[B, Hk, Dk]`; `v`: `[B, Hv, Dv]`, `Hv % Hk == 0`; `g`, `beta`: `[B, Hv]`;
    /// `state`: `[B, Hv, Dk, Dv]` (writable); all F32 → `[B, Hv, Dv]`.
    fn gated_delta_rule_step(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        g: &Tensor,
        beta: &Tensor,
        state: &mut Tensor,
        scale: f32,
    ) -> Result<Tensor> {
        let (q, k, v, g, beta) =
            (self.to_host(q)?, self.to_host(k)?, self.to_host(v)?, self.to_host(g)?, self.to_host(beta)?);
        let mut out = None;
        in_place_on_cpu(self, state, |cpu, state| {
            out = Some(cpu::delta::gated_delta_rule_step(cpu, &q, &k, &v, &g, &beta, state, scale)?);
            Ok(())
        })?;
        out.ok_or_else(|| Error::unsupported("gated_delta_rule_step", "the kernel returned no output"))?
            .to_backend(self)
    }

    /// The server's ragged decode step: row i of q, k, v, g, β advances `states[i]`
    /// (each sequence its own state), exactly as `gated_delta_rule_step` on that row
    /// alone would (bit for bit).
    ///
    /// # Shapes
    /// `q`, `k`: `[N, Hk, Dk]`; `v`: `[N, Hv, Dv]`; `g`, `beta`: `[N, Hv]`; `states[i]`:
    /// `[1, Hv, Dk, Dv]` (writable), `states.len() == N`; all F32 → `[N, Hv, Dv]`.
    fn batched_gated_delta_rule_step(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        g: &Tensor,
        beta: &Tensor,
        states: &mut [&mut Tensor],
        scale: f32,
    ) -> Result<Tensor> {
        let views: Vec<&Tensor> = states.iter().map(|s| &**s).collect();
        crate::spec::delta::batched_gated_delta_rule_step(q, k, v, g, beta, &views, scale)?;
        // Refused before any state is written (the copies below are written back one by one).
        for s in states.iter() {
            s.ensure_writable("batched_gated_delta_rule_step")?;
        }
        let (q, k, v, g, beta) =
            (self.to_host(q)?, self.to_host(k)?, self.to_host(v)?, self.to_host(g)?, self.to_host(beta)?);
        let cpu = self.cpu();
        let _isa = cpu.enter();
        if states.iter().all(|s| s.is_host()) {
            return cpu::delta::batched_gated_delta_rule_step(cpu, &q, &k, &v, &g, &beta, states, scale)?
                .to_backend(self);
        }
        let mut host = states.iter().map(|s| cpu::memory::copy(cpu, &self.to_host(s)?)).collect::<Result<Vec<_>>>()?;
        let mut refs: Vec<&mut Tensor> = host.iter_mut().collect();
        let out = cpu::delta::batched_gated_delta_rule_step(cpu, &q, &k, &v, &g, &beta, &mut refs, scale)?;
        for (dst, h) in states.iter_mut().zip(&host) {
            self.copy_into(dst, &self.upload(h)?)?;
        }
        out.to_backend(self)
    }

    // ──────────────────────────────── attention ────────────────────────────────

    /// `out = softmax(q·kᵀ·scale [+ causal mask])·v`, GQA by index (query head h reads
    /// kv head `h / (Hq/Hkv)`), causal mask aligned bottom-right: query i sees keys
    /// `j ≤ i + (Tk − Tq)`.
    ///
    /// # Shapes
    /// `q`: `[B, Hq, Tq, D]`; `k`, `v`: `[B, Hkv, Tk, D]`, `Hq % Hkv == 0`, `Tq ≤ Tk`
    /// when causal → `[B, Hq, Tq, D]`.
    fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, scale: f32, causal: bool) -> Result<Tensor> {
        on_cpu!(self, cpu::attention::attention; [q, k, v], scale, causal)
    }

    /// `attention` with an optional mask: additive (added to the scaled scores) or
    /// boolean (U32, 0 masks a score out); a row with every score masked gives zeros.
    ///
    /// # Shapes
    /// as `attention`; mask `[Tq, Tk]` or `[B, Hq, Tq, Tk]` → `[B, Hq, Tq, D]`.
    fn sdpa(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<AttentionMask<'_>>,
        scale: f32,
        causal: bool,
    ) -> Result<Tensor> {
        let mask_host = match mask {
            Some(AttentionMask::Additive(m)) | Some(AttentionMask::Boolean(m)) => Some(self.to_host(m)?),
            None => None,
        };
        let host_mask = match (mask, mask_host.as_ref()) {
            (Some(AttentionMask::Additive(_)), Some(m)) => Some(AttentionMask::Additive(m)),
            (Some(AttentionMask::Boolean(_)), Some(m)) => Some(AttentionMask::Boolean(m)),
            _ => None,
        };
        on_cpu!(self, cpu::attention::sdpa; [q, k, v], host_mask, scale, causal)
    }

    /// Fused causal attention, blockwise with an online softmax, memory O(T): returns
    /// the output and the per-row logsumexp that the backward needs. Query `i` (at
    /// absolute position `p = i + Tk − Tq`) sees keys `j ≤ p`, and with a sliding
    /// `window` of `W` keys only `p − W < j ≤ p` (cost O(T·W) rather than O(T²));
    /// `None` is full causal, `Some(0)` an error.
    ///
    /// **Attention sinks** (gpt-oss): with `sinks = Some(s)`, one learned logit `s_h` per
    /// query head joins each row's softmax denominator and carries no value:
    /// `p_ij = exp(z_ij − L_i)`, `L_i = ln(exp(s_h) + Σ_j exp(z_ij))`,
    /// `out_i = Σ_j p_ij·v_j` (`z` the scaled, masked scores), so a row's weights sum to
    /// less than 1. The returned logsumexp is this `L`, the sink included; a row that sees
    /// no key gives zeros and `L = s_h`. A sink of `−∞` is the same as none.
    ///
    /// # Shapes
    /// `q`: `[B, Hq, Tq, D]`; `k`, `v`: `[B, Hkv, Tk, D]`, `Tq ≤ Tk`; `sinks`: `[Hq]`
    /// F32 → output `[B, Hq, Tq, D]`, logsumexp `[B, Hq, Tq]` f32.
    fn causal_attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        window: Option<usize>,
        sinks: Option<&Tensor>,
        scale: f32,
    ) -> Result<CausalAttentionResult> {
        let sinks = sinks.map(|s| self.to_host(s)).transpose()?;
        on_cpu!(self, cpu::attention::causal_attention; [q, k, v], window, sinks.as_ref(), scale)
    }

    /// Backward of `causal_attention` from the saved logsumexp (the T×T matrix is
    /// recomputed blockwise, never stored): `dq`, and `dk`, `dv` summed over each group.
    /// `window` and `sinks` must be the forward's. With sinks the saved logsumexp holds
    /// the sink's term, so dq, dk, dv follow the formulas without sinks given `L`, and
    /// `dsinks_h = −Σ_{b,i} exp(s_h − L_{b,h,i})·D_{b,h,i}` with `D_i = Σ_d dO_id·O_id`
    /// (the sink's weight times minus the row's `dO·O`).
    ///
    /// # Shapes
    /// as `causal_attention`; `d_out`: `[B, Hq, Tq, D]` → dq like q, dk/dv like k/v,
    /// dsinks `[Hq]` f32 (`Some` exactly when `sinks` is).
    #[allow(clippy::too_many_arguments)]
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
        let result = CausalAttentionResult {
            output: self.to_host(&result.output)?,
            logsumexp: self.to_host(&result.logsumexp)?,
        };
        let sinks = sinks.map(|s| self.to_host(s)).transpose()?;
        let d_out = self.to_host(d_out)?;
        on_cpu!(self, cpu::attention::causal_attention_backward; [q, k, v], &result, &d_out, window, sinks.as_ref(), scale)
    }

    /// Whether `causal_attention` (and its backward) run natively for these inputs, this
    /// `window` and these `sinks`.
    fn supports_causal_attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        window: Option<usize>,
        sinks: Option<&Tensor>,
        scale: f32,
    ) -> bool {
        let _ = (q, k, v, window, sinks, scale);
        self.supports(Op::CausalAttention)
    }

    /// The additive causal mask, aligned bottom-right: `0` where `j ≤ i + (kv_len − seq)`,
    /// `−∞` elsewhere.
    ///
    /// # Shapes
    /// → `[seq, kv_len]` f32 (`seq ≤ kv_len`).
    fn causal_mask(&self, seq: usize, kv_len: usize) -> Result<Tensor> {
        cpu::attention::causal_mask(self.cpu(), seq, kv_len)?.to_backend(self)
    }

    /// `softmax(scores·scale + causal_mask)` over the last dim (mask aligned bottom-right).
    ///
    /// # Shapes
    /// `scores`: `[..., Tq, Tk]`, `Tq ≤ Tk` → same.
    fn causal_softmax(&self, scores: &Tensor, scale: f32) -> Result<Tensor> {
        on_cpu!(self, cpu::attention::causal_softmax; [scores], scale)
    }

    /// Writes `new` into rows `pos .. pos + T` of a preallocated cache, in place.
    ///
    /// # Shapes
    /// `cache`: `[B, Hkv, capacity, D]`; `new`: `[B, Hkv, T, D]`; error if `pos + T > capacity`.
    fn write_head_cache(&self, cache: &mut Tensor, new: &Tensor, pos: usize) -> Result<()> {
        let new = self.to_host(new)?;
        in_place_on_cpu(self, cache, |cpu, cache| cpu::attention::write_head_cache(cpu, cache, &new, pos))
    }

    /// Attention of a few new queries over the first `kv_len` cached positions, reading
    /// the caches in place; the new queries sit at the end (`kv_len − Tq .. kv_len`) and
    /// are masked causally among themselves. GQA by index. With a sliding `window` of
    /// `W` keys the query at position `p` sees only cache rows `p − W < j ≤ p` (rows
    /// before are never read); `None` is full causal, `Some(0)` an error. `sinks` adds
    /// one logit per query head to each row's softmax denominator, as in
    /// `causal_attention`.
    ///
    /// # Shapes
    /// `q`: `[B, Hq, Tq, D]`; caches `[B, Hkv, capacity, D]`, `Tq ≤ kv_len ≤ capacity`;
    /// `sinks`: `[Hq]` F32 → `[B, Hq, Tq, D]`.
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
        let sinks = sinks.map(|s| self.to_host(s)).transpose()?;
        on_cpu!(self, cpu::attention::decode_attention; [q, k_cache, v_cache], kv_len, window, sinks.as_ref(), scale)
    }

    /// One decode step of `N` sequences at once, each over its own caches and filled
    /// length (ragged): sequence `i` is exactly
    /// `decode_attention(q[i], k_caches[i], v_caches[i], kv_lens[i], window, sinks, scale)`
    /// (its result does not depend on the other sequences of the call). The caches'
    /// dtypes are those `decode_attention` accepts; the sinks are shared by every sequence.
    ///
    /// # Shapes
    /// `q`: `[N, Hq, Tq, D]`; `k_caches[i]`, `v_caches[i]`: `[1, Hkv, capacity_i, D]`,
    /// `Tq ≤ kv_lens[i] ≤ capacity_i`; `sinks`: `[Hq]` F32 → `[N, Hq, Tq, D]`.
    fn batched_decode_attention(
        &self,
        q: &Tensor,
        k_caches: &[&Tensor],
        v_caches: &[&Tensor],
        kv_lens: &[usize],
        window: Option<usize>,
        sinks: Option<&Tensor>,
        scale: f32,
    ) -> Result<Tensor> {
        let host = |ts: &[&Tensor]| ts.iter().map(|t| self.to_host(t)).collect::<Result<Vec<Tensor>>>();
        let (k, v) = (host(k_caches)?, host(v_caches)?);
        let (k, v): (Vec<&Tensor>, Vec<&Tensor>) = (k.iter().collect(), v.iter().collect());
        let sinks = sinks.map(|s| self.to_host(s)).transpose()?;
        on_cpu!(self, [q] => |c| cpu::attention::batched_decode_attention(c, q, &k, &v, kv_lens, window, sinks.as_ref(), scale))
    }

    /// `[B, T, H·D] → [B, H, T, D]`.
    ///
    /// # Shapes
    /// `x`: `[B, T, H·D]` → `[B, H, T, D]`.
    fn split_heads(&self, x: &Tensor, heads: usize) -> Result<Tensor> {
        on_cpu!(self, cpu::attention::split_heads; [x], heads)
    }

    /// `[B, H, T, D] → [B, T, H·D]`.
    ///
    /// # Shapes
    /// `x`: `[B, H, T, D]` → `[B, T, H·D]`.
    fn merge_heads(&self, x: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::attention::merge_heads; [x])
    }

    // ─────────────────────────────── activations ───────────────────────────────

    /// `silu(x) = x·σ(x)`.
    ///
    /// # Shapes
    /// any → same.
    fn silu(&self, x: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::activation::silu; [x])
    }

    /// `dx = dy·σ(x)·(1 + x·(1 − σ(x)))`.
    ///
    /// # Shapes
    /// `x`, `d_out`: equal → same.
    fn silu_backward(&self, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::activation::silu_backward; [x, d_out])
    }

    /// GELU in its tanh or erf form (see [`GeluForm`]).
    ///
    /// # Shapes
    /// any → same.
    fn gelu(&self, x: &Tensor, form: GeluForm) -> Result<Tensor> {
        on_cpu!(self, cpu::activation::gelu; [x], form)
    }

    /// `dx = dy·gelu'(x)` for the chosen form.
    ///
    /// # Shapes
    /// `x`, `d_out`: equal → same.
    fn gelu_backward(&self, x: &Tensor, d_out: &Tensor, form: GeluForm) -> Result<Tensor> {
        on_cpu!(self, cpu::activation::gelu_backward; [x, d_out], form)
    }

    /// `max(x, 0)`.
    ///
    /// # Shapes
    /// any → same.
    fn relu(&self, x: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::activation::relu; [x])
    }

    /// `dx = dy·[x > 0]`.
    ///
    /// # Shapes
    /// `x`, `d_out`: equal → same.
    fn relu_backward(&self, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::activation::relu_backward; [x, d_out])
    }

    /// `σ(x) = 1/(1 + e^−x)`.
    ///
    /// # Shapes
    /// any → same.
    fn sigmoid(&self, x: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::activation::sigmoid; [x])
    }

    /// `dx = dy·σ(x)·(1 − σ(x))`.
    ///
    /// # Shapes
    /// `x`, `d_out`: equal → same.
    fn sigmoid_backward(&self, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::activation::sigmoid_backward; [x, d_out])
    }

    /// `tanh(x)`.
    ///
    /// # Shapes
    /// any → same.
    fn tanh(&self, x: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::activation::tanh; [x])
    }

    /// `dx = dy·(1 − tanh²(x))`.
    ///
    /// # Shapes
    /// `x`, `d_out`: equal → same.
    fn tanh_backward(&self, x: &Tensor, d_out: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::activation::tanh_backward; [x, d_out])
    }

    /// The SwiGLU gate: `silu(gate)·up`.
    ///
    /// # Shapes
    /// `gate`, `up`: equal → same.
    fn silu_mul(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::activation::silu_mul; [gate, up])
    }

    /// `d_gate = dy·up·silu'(gate)`, `d_up = dy·silu(gate)` (as `da`, `db`).
    ///
    /// # Shapes
    /// `gate`, `up`, `d_out`: equal → two tensors of that shape.
    fn silu_mul_backward(&self, gate: &Tensor, up: &Tensor, d_out: &Tensor) -> Result<PairGradients> {
        on_cpu!(self, cpu::activation::silu_mul_backward; [gate, up, d_out])
    }

    /// The GeGLU gate: `gelu(gate)·up`, fused (no `gelu(gate)` tensor); Gemma's MLP uses
    /// the tanh form.
    ///
    /// # Shapes
    /// `gate`, `up`: equal → same.
    fn gelu_mul(&self, gate: &Tensor, up: &Tensor, form: GeluForm) -> Result<Tensor> {
        on_cpu!(self, cpu::activation::gelu_mul; [gate, up], form)
    }

    /// `d_gate = dy·up·gelu'(gate)`, `d_up = dy·gelu(gate)` (as `da`, `db`), for the
    /// forward's `form`.
    ///
    /// # Shapes
    /// `gate`, `up`, `d_out`: equal → two tensors of that shape.
    fn gelu_mul_backward(&self, gate: &Tensor, up: &Tensor, d_out: &Tensor, form: GeluForm) -> Result<PairGradients> {
        on_cpu!(self, cpu::activation::gelu_mul_backward; [gate, up, d_out], form)
    }

    /// gpt-oss's clamped SwiGLU: `(u' + 1)·g'·σ(α·g')` with `g' = min(gate, limit)` and
    /// `u' = clamp(up, −limit, limit)` (gpt-oss: α = 1.702, limit 7). α must be finite and
    /// the limit finite and > 0.
    ///
    /// # Shapes
    /// `gate`, `up`: equal → same.
    fn clamped_swiglu(&self, gate: &Tensor, up: &Tensor, alpha: f32, limit: f32) -> Result<Tensor> {
        on_cpu!(self, cpu::activation::clamped_swiglu; [gate, up], alpha, limit)
    }

    /// Backward of `clamped_swiglu` (as `da`, `db`): with `s = σ(α·g')`,
    /// `d_gate = dy·(u' + 1)·(s + α·g'·s·(1 − s))` where `gate ≤ limit`, else 0;
    /// `d_up = dy·g'·s` where `|up| ≤ limit`, else 0.
    ///
    /// # Shapes
    /// `gate`, `up`, `d_out`: equal → two tensors of that shape.
    fn clamped_swiglu_backward(
        &self,
        gate: &Tensor,
        up: &Tensor,
        d_out: &Tensor,
        alpha: f32,
        limit: f32,
    ) -> Result<PairGradients> {
        on_cpu!(self, cpu::activation::clamped_swiglu_backward; [gate, up, d_out], alpha, limit)
    }

    /// `max(x, ln(1 + exp(min(x, 88))))`: softplus that neither overflows nor loses large x.
    ///
    /// # Shapes
    /// any → same.
    fn stable_softplus(&self, x: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::activation::stable_softplus; [x])
    }

    /// The Gated DeltaNet gates (Qwen3-Next, Qwen3.5), per row and head h:
    /// `β = σ(b)`, `g = −e^{a_log[h]}·softplus(a + dt_bias[h])` (softplus as
    /// `stable_softplus`), computed in f32 whatever the input dtype.
    ///
    /// # Shapes
    /// `a`, `b`: `[..., H]` (one float dtype); `a_log`, `dt_bias`: `[H]` (one float dtype,
    /// F32 in models) → g, beta `[..., H]` F32.
    fn gdn_gates(&self, a: &Tensor, b: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<GateOutput> {
        on_cpu!(self, cpu::gates::gdn_gates; [a, b, a_log, dt_bias])
    }

    /// Backward of `gdn_gates`: with `x = a + dt_bias[h]`, `da = −dg·e^{a_log[h]}·σ(x)`,
    /// `db = dβ·β(1 − β)`, `da_log[h] = Σ_rows dg·g`, `ddt_bias[h] = Σ_rows da`.
    ///
    /// # Shapes
    /// `a`, `b`: `[..., H]`; `a_log`, `dt_bias`: `[H]`; `dg`, `dbeta`: `[..., H]` F32 →
    /// da, db `[..., H]` (a's dtype), da_log, ddt_bias `[H]` (a_log's dtype).
    fn gdn_gates_backward(
        &self,
        a: &Tensor,
        b: &Tensor,
        a_log: &Tensor,
        dt_bias: &Tensor,
        dg: &Tensor,
        dbeta: &Tensor,
    ) -> Result<GateGradients> {
        on_cpu!(self, cpu::gates::gdn_gates_backward; [a, b, a_log, dt_bias, dg, dbeta])
    }

    // ────────────────────────────── normalization ──────────────────────────────

    /// `y = x·w / sqrt(mean(x²) + eps)` over the last dim; saves `rstd`.
    ///
    /// # Shapes
    /// `x`: `[..., D]`; `weight`: `[D]` → output `[..., D]`, rstd `[...]` f32, mean `None`.
    fn rms_norm(&self, x: &Tensor, weight: &Tensor, eps: f32) -> Result<NormOutput> {
        on_cpu!(self, cpu::norm::rms_norm; [x, weight], eps)
    }

    /// With `x̂ = x·r`: `dx = r·(dy·w − x̂·mean(dy·w·x̂))`, `dw = Σ_rows dy·x̂`.
    ///
    /// # Shapes
    /// `x`, `d_out`: `[..., D]`; `weight`: `[D]`; `rstd`: `[...]` → dx `[..., D]`, dweight `[D]`.
    fn rms_norm_backward(&self, x: &Tensor, weight: &Tensor, rstd: &Tensor, d_out: &Tensor) -> Result<NormGradients> {
        on_cpu!(self, cpu::norm::rms_norm_backward; [x, weight, rstd, d_out])
    }

    /// `y = (x − mean)/sqrt(var + eps)·w + b` over the last dim; saves mean and rstd.
    ///
    /// # Shapes
    /// `x`: `[..., D]`; `weight`, `bias`: `[D]` → output `[..., D]`, mean and rstd `[...]` f32.
    fn layer_norm(&self, x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<NormOutput> {
        on_cpu!(self, cpu::norm::layer_norm; [x, weight, bias], eps)
    }

    /// With `x̂ = (x − μ)·r`, `g = dy·w`: `dx = r·(g − mean(g) − x̂·mean(g·x̂))`,
    /// `dw = Σ_rows dy·x̂`, `db = Σ_rows dy`.
    ///
    /// # Shapes
    /// `x`, `d_out`: `[..., D]`; `weight`: `[D]`; `mean`, `rstd`: `[...]` → dx, dweight, dbias.
    fn layer_norm_backward(
        &self,
        x: &Tensor,
        weight: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        d_out: &Tensor,
    ) -> Result<NormGradients> {
        on_cpu!(self, cpu::norm::layer_norm_backward; [x, weight, mean, rstd, d_out])
    }

    /// `s = a + b` and `rms_norm(s, w)` in one pass (the residual add before a norm).
    ///
    /// # Shapes
    /// `a`, `b`: `[..., D]`; `weight`: `[D]` → (`s` `[..., D]`, norm output as `rms_norm`).
    fn add_rms_norm(&self, a: &Tensor, b: &Tensor, weight: &Tensor, eps: f32) -> Result<(Tensor, NormOutput)> {
        on_cpu!(self, cpu::norm::add_rms_norm; [a, b, weight], eps)
    }

    /// `rms_norm(x, w)·silu(z)`.
    ///
    /// # Shapes
    /// `x`, `z`: `[..., D]`; `weight`: `[D]` → `[..., D]`.
    fn rms_norm_gated(&self, x: &Tensor, z: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
        on_cpu!(self, cpu::norm::rms_norm_gated; [x, z, weight], eps)
    }

    /// Backward of `rms_norm_gated` (`y = x·r·w·silu(z)`, `r = 1/sqrt(mean(x²) + eps)`),
    /// recomputing r: with `u = dy·silu(z)`, `x̂ = x·r`: `dx = r·(u·w − x̂·mean(u·w·x̂))`,
    /// `dz = dy·x̂·w·silu'(z)`, `dw = Σ_rows u·x̂`.
    ///
    /// # Shapes
    /// `x`, `z`, `d_out`: `[..., D]`; `weight`: `[D]` → dx, dz `[..., D]`, dweight `[D]`.
    fn rms_norm_gated_backward(
        &self,
        x: &Tensor,
        z: &Tensor,
        weight: &Tensor,
        d_out: &Tensor,
        eps: f32,
    ) -> Result<GatedNormGradients> {
        on_cpu!(self, cpu::norm::rms_norm_gated_backward; [x, z, weight, d_out], eps)
    }

    /// RMS norm over the channel axis: `y[b,c,t] = x[b,c,t]·w[c] / sqrt(mean_c(x[b,·,t]²) + eps)`.
    ///
    /// # Shapes
    /// `x`: `[B, C, T]`; `weight`: `[C]` → `[B, C, T]`.
    fn rms_norm_channel(&self, x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
        on_cpu!(self, cpu::norm::rms_norm_channel; [x, weight], eps)
    }

    /// Group norm: channels split into `groups`; each (batch, group) normalized over its
    /// channels and spatial positions, then `·w[c] + b[c]`.
    ///
    /// # Shapes
    /// `x`: `[B, C, ...]`, `C % groups == 0`; `weight`, `bias`: `[C]` → same as x.
    fn group_norm(&self, x: &Tensor, groups: usize, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<Tensor> {
        on_cpu!(self, [x, weight, bias] => |c| cpu::norm::group_norm(c, x, groups, weight, bias, eps))
    }

    /// `rms_norm(x, w)·(1 + scale) + shift`, scale and shift per batch row.
    ///
    /// # Shapes
    /// `x`: `[B, T, D]`; `weight`: `[D]`; `scale`, `shift`: `[B, D]` → `[B, T, D]`.
    fn adaln_modulate(&self, x: &Tensor, weight: &Tensor, scale: &Tensor, shift: &Tensor, eps: f32) -> Result<Tensor> {
        on_cpu!(self, cpu::norm::adaln_modulate; [x, weight, scale, shift], eps)
    }

    /// `(x − mean)/sqrt(var + eps)` per row, no affine (the core of layer_norm).
    ///
    /// # Shapes
    /// `x`: `[..., D]` → same.
    fn normalize(&self, x: &Tensor, eps: f32) -> Result<Tensor> {
        on_cpu!(self, cpu::norm::normalize; [x], eps)
    }

    /// `y = x / sqrt(Σx² + eps)` over the last dim (a sum, eps inside the root: FLA's and
    /// transformers' `l2norm` of the delta rule's q and k); saves `rnorm = 1/sqrt(Σx² + eps)`
    /// in the `rstd` field.
    ///
    /// # Shapes
    /// `x`: `[..., D]` → output `[..., D]`, rstd (rnorm) `[...]` f32, mean `None`.
    fn l2_norm(&self, x: &Tensor, eps: f32) -> Result<NormOutput> {
        on_cpu!(self, cpu::norm::l2_norm; [x], eps)
    }

    /// With `x̂ = x·r` (r = the forward's rnorm): `dx = r·(dy − x̂·Σ(dy·x̂))`.
    ///
    /// # Shapes
    /// `x`, `d_out`: `[..., D]`; `rnorm`: `[...]` f32 → dx `[..., D]`.
    fn l2_norm_backward(&self, x: &Tensor, rnorm: &Tensor, d_out: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::norm::l2_norm_backward; [x, rnorm, d_out])
    }

    // ───────────────────────── softmax, loss, optimizer ────────────────────────

    /// `y = exp(x − max)/Σ exp(x − max)` along `dim`; a row of all `−∞` gives zeros.
    ///
    /// # Shapes
    /// any, `dim < rank` → same.
    fn softmax(&self, x: &Tensor, dim: usize) -> Result<Tensor> {
        on_cpu!(self, cpu::softmax::softmax; [x], dim)
    }

    /// `dx = y·(dy − Σ(dy·y))` along `dim`, from the forward's output `y`.
    ///
    /// # Shapes
    /// `y`, `d_out`: equal → same.
    fn softmax_backward(&self, y: &Tensor, d_out: &Tensor, dim: usize) -> Result<Tensor> {
        on_cpu!(self, cpu::softmax::softmax_backward; [y, d_out], dim)
    }

    /// `x − max − ln Σ exp(x − max)` along `dim`; a row of all `−∞` gives `−∞`, never NaN.
    ///
    /// # Shapes
    /// any, `dim < rank` → same.
    fn log_softmax(&self, x: &Tensor, dim: usize) -> Result<Tensor> {
        on_cpu!(self, cpu::softmax::log_softmax; [x], dim)
    }

    /// Fused cross-entropy: mean over counted rows of `logsumexp(z) − z[target]`, and
    /// `d_logits = (softmax(z) − onehot(target))/count` in the same pass. Rows whose
    /// target equals `ignore_index` count for nothing; targets ≥ V are an error.
    ///
    /// # Shapes
    /// `logits`: `[N, V]`; `targets`: `[N]` U32 → loss scalar f32, d_logits `[N, V]` f32.
    fn cross_entropy(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        ignore_index: Option<u32>,
    ) -> Result<CrossEntropyOutput> {
        on_cpu!(self, cpu::loss::cross_entropy; [logits, targets], ignore_index)
    }

    /// `d_logits = d_loss·(softmax(z) − onehot(target))/count`.
    ///
    /// # Shapes
    /// as `cross_entropy` → `[N, V]` f32.
    fn cross_entropy_backward(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        ignore_index: Option<u32>,
        d_loss: f32,
    ) -> Result<Tensor> {
        on_cpu!(self, cpu::loss::cross_entropy_backward; [logits, targets], ignore_index, d_loss)
    }

    /// One AdamW step in place (`step` counts from 1), with `g = config.grad_scale·grad`:
    /// `m ← β₁m + (1−β₁)g`, `v ← β₂v + (1−β₂)g²`, `m̂ = m/(1−β₁ᵗ)`, `v̂ = v/(1−β₂ᵗ)`,
    /// `p ← p − lr·(m̂/(√v̂ + ε) + λ·p)`.
    ///
    /// # Shapes
    /// `param`, `grad`, `m`, `v`: equal shapes; m and v F32; param and grad float.
    fn adamw_update(
        &self,
        param: &mut Tensor,
        grad: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        config: &AdamWConfig,
        step: u64,
    ) -> Result<()> {
        let grad = self.to_host(grad)?;
        let on_host = param.is_host() && m.is_host() && v.is_host();
        if on_host {
            return cpu::optim::adamw_update(self.cpu(), param, &grad, m, v, config, step);
        }
        let (mut p_h, mut m_h, mut v_h) = (self.to_host(param)?, self.to_host(m)?, self.to_host(v)?);
        cpu::optim::adamw_update(self.cpu(), &mut p_h, &grad, &mut m_h, &mut v_h, config, step)?;
        self.copy_into(param, &self.upload(&p_h)?)?;
        self.copy_into(m, &self.upload(&m_h)?)?;
        self.copy_into(v, &self.upload(&v_h)?)
    }

    /// `sqrt(Σ_t Σ_i t_i²)` over all tensors (accumulated in f64).
    ///
    /// # Shapes
    /// any number of float tensors of any shapes → a number.
    fn global_norm(&self, tensors: &[Tensor]) -> Result<f32> {
        let host = tensors.iter().map(|t| self.to_host(t)).collect::<Result<Vec<_>>>()?;
        cpu::optim::global_norm(self.cpu(), &host)
    }

    /// The factor that clips gradients to `max_norm`: `min(1, max_norm/(norm + 1e-6))`.
    ///
    /// # Shapes
    /// numbers → a number.
    fn clip_scale(&self, global_norm: f32, max_norm: f32) -> Result<f32> {
        cpu::optim::clip_scale(global_norm, max_norm)
    }

    // ───────────────────────── positions and embeddings ────────────────────────

    /// Rotary embedding at positions `offset + t`: each pair `(a, b)` becomes
    /// `(a·cos − b·sin, a·sin + b·cos)` with `cos[p, i]`, `sin[p, i]` for pair i; pairs
    /// are `(i, i + D/2)` (HalfSplit) or `(2i, 2i+1)` (Interleaved). Tables of `R/2 < D/2`
    /// angles rotate only the first R dims (pairs `(i, i + R/2)` or `(2i, 2i+1)`, i < R/2)
    /// and pass the rest through: partial rotary (Qwen3.5, Phi-2).
    ///
    /// # Shapes
    /// `x`: `[B, H, T, D]`, D even; `cos`, `sin`: `[P, R/2]` f32, `2 ≤ R ≤ D`,
    /// `offset + T ≤ P` → same as x.
    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor, style: RopeStyle, offset: usize) -> Result<Tensor> {
        on_cpu!(self, cpu::rope::rope; [x, cos, sin], style, offset)
    }

    /// Backward of `rope`: the inverse rotation of `d_out` (`sin → −sin`).
    ///
    /// # Shapes
    /// as `rope`.
    fn rope_backward(
        &self,
        d_out: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        style: RopeStyle,
        offset: usize,
    ) -> Result<Tensor> {
        on_cpu!(self, cpu::rope::rope_backward; [d_out, cos, sin], style, offset)
    }

    /// `out[..., :] = table[ids[...], :]`; quantized tables are dequantized row by row
    /// (output f32); an id ≥ V is an error.
    ///
    /// # Shapes
    /// `ids`: `[...]` U32; `table`: `[V, D]` → `[..., D]`.
    fn embedding(&self, ids: &Tensor, table: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::embedding::embedding; [ids, table])
    }

    /// `dtable[ids[n], :] += d_out[n, :]` into zeros (f32).
    ///
    /// # Shapes
    /// `ids`: `[...]` U32; `d_out`: `[..., D]` → `[vocab, D]` f32.
    fn embedding_backward(&self, ids: &Tensor, d_out: &Tensor, vocab: usize) -> Result<Tensor> {
        on_cpu!(self, cpu::embedding::embedding_backward; [ids, d_out], vocab)
    }

    /// Gathers rows (first-axis slices): `out[i] = x[ids[i]]`.
    ///
    /// # Shapes
    /// `x`: `[N, ...]`; `ids`: `[M]` U32 → `[M, ...]`.
    fn index_select(&self, x: &Tensor, ids: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::embedding::index_select; [x, ids])
    }

    /// `dst[ids[i]] += src[i]`, in place.
    ///
    /// # Shapes
    /// `dst`: `[N, ...]`; `ids`: `[M]` U32; `src`: `[M, ...]`.
    fn scatter_add_rows(&self, dst: &mut Tensor, ids: &Tensor, src: &Tensor) -> Result<()> {
        let (ids, src) = (self.to_host(ids)?, self.to_host(src)?);
        in_place_on_cpu(self, dst, |cpu, dst| cpu::embedding::scatter_add_rows(cpu, dst, &ids, &src))
    }

    /// Rows `start .. start + len` along the first axis.
    ///
    /// # Shapes
    /// `x`: `[N, ...]` → `[len, ...]`.
    fn slice_rows(&self, x: &Tensor, start: usize, len: usize) -> Result<Tensor> {
        on_cpu!(self, cpu::embedding::slice_rows; [x], start, len)
    }

    /// `out = x` with `out[ids[i]] += src[i]` (a new tensor; the gradient of `index_select`).
    ///
    /// # Shapes
    /// `x`: `[N, ...]`; `ids`: `[M]` U32; `src`: `[M, ...]` → `[N, ...]`.
    fn index_add(&self, x: &Tensor, ids: &Tensor, src: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::embedding::index_add; [x, ids, src])
    }

    // ───────────────────────── elementwise and broadcast ───────────────────────

    /// `out = a + b`, elementwise.
    ///
    /// # Shapes
    /// `a`, `b`: equal shapes and dtypes → same.
    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::add; [a, b])
    }

    /// `out = a − b`, elementwise.
    ///
    /// # Shapes
    /// `a`, `b`: equal shapes and dtypes → same.
    fn sub(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::sub; [a, b])
    }

    /// `out = a · b`, elementwise.
    ///
    /// # Shapes
    /// `a`, `b`: equal shapes and dtypes → same.
    fn mul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::mul; [a, b])
    }

    /// `out = a / b`, elementwise.
    ///
    /// # Shapes
    /// `a`, `b`: equal shapes and dtypes → same.
    fn div(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::div; [a, b])
    }

    /// `out = a + s` with a scalar `s`.
    ///
    /// # Shapes
    /// any → same.
    fn add_scalar(&self, a: &Tensor, s: f32) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::add_scalar; [a], s)
    }

    /// `out = a − s` with a scalar `s`.
    ///
    /// # Shapes
    /// any → same.
    fn sub_scalar(&self, a: &Tensor, s: f32) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::sub_scalar; [a], s)
    }

    /// `out = a · s` with a scalar `s`.
    ///
    /// # Shapes
    /// any → same.
    fn mul_scalar(&self, a: &Tensor, s: f32) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::mul_scalar; [a], s)
    }

    /// `out = a / s` with a scalar `s`.
    ///
    /// # Shapes
    /// any → same.
    fn div_scalar(&self, a: &Tensor, s: f32) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::div_scalar; [a], s)
    }

    /// `a ← a + b`, in place (a must be writable).
    ///
    /// # Shapes
    /// `a`, `b`: equal shapes and dtypes.
    fn add_assign(&self, a: &mut Tensor, b: &Tensor) -> Result<()> {
        let b = self.to_host(b)?;
        in_place_on_cpu(self, a, |cpu, a| cpu::elementwise::add_assign(cpu, a, &b))
    }

    /// `a ← a − b`, in place (a must be writable).
    ///
    /// # Shapes
    /// `a`, `b`: equal shapes and dtypes.
    fn sub_assign(&self, a: &mut Tensor, b: &Tensor) -> Result<()> {
        let b = self.to_host(b)?;
        in_place_on_cpu(self, a, |cpu, a| cpu::elementwise::sub_assign(cpu, a, &b))
    }

    /// `a ← a · b`, in place (a must be writable).
    ///
    /// # Shapes
    /// `a`, `b`: equal shapes and dtypes.
    fn mul_assign(&self, a: &mut Tensor, b: &Tensor) -> Result<()> {
        let b = self.to_host(b)?;
        in_place_on_cpu(self, a, |cpu, a| cpu::elementwise::mul_assign(cpu, a, &b))
    }

    /// `a ← a / b`, in place (a must be writable).
    ///
    /// # Shapes
    /// `a`, `b`: equal shapes and dtypes.
    fn div_assign(&self, a: &mut Tensor, b: &Tensor) -> Result<()> {
        let b = self.to_host(b)?;
        in_place_on_cpu(self, a, |cpu, a| cpu::elementwise::div_assign(cpu, a, &b))
    }

    /// `out[..., j] = x[..., j] + row[j]`: a row vector broadcast over every row.
    ///
    /// # Shapes
    /// `x`: `[..., N]`; `row`: `[N]` → `[..., N]`.
    fn add_row(&self, x: &Tensor, row: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::add_row; [x, row])
    }

    /// `out[..., j] = x[..., j] − row[j]`: a row vector broadcast over every row.
    ///
    /// # Shapes
    /// `x`: `[..., N]`; `row`: `[N]` → `[..., N]`.
    fn sub_row(&self, x: &Tensor, row: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::sub_row; [x, row])
    }

    /// `out[..., j] = x[..., j] · row[j]`: a row vector broadcast over every row.
    ///
    /// # Shapes
    /// `x`: `[..., N]`; `row`: `[N]` → `[..., N]`.
    fn mul_row(&self, x: &Tensor, row: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::mul_row; [x, row])
    }

    /// `out[..., j] = x[..., j] / row[j]`: a row vector broadcast over every row.
    ///
    /// # Shapes
    /// `x`: `[..., N]`; `row`: `[N]` → `[..., N]`.
    fn div_row(&self, x: &Tensor, row: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::div_row; [x, row])
    }

    /// `out[i, j] = x[i, j] + col[i]`: a column vector broadcast over every column
    /// (x viewed as a matrix of its rows).
    ///
    /// # Shapes
    /// `x`: `[..., N]` with M rows in all; `col`: `[M]` (or x's shape without its last dim) → like x.
    fn add_col(&self, x: &Tensor, col: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::add_col; [x, col])
    }

    /// `out[i, j] = x[i, j] − col[i]`: a column vector broadcast over every column
    /// (x viewed as a matrix of its rows).
    ///
    /// # Shapes
    /// `x`: `[..., N]` with M rows in all; `col`: `[M]` (or x's shape without its last dim) → like x.
    fn sub_col(&self, x: &Tensor, col: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::sub_col; [x, col])
    }

    /// `out[i, j] = x[i, j] · col[i]`: a column vector broadcast over every column
    /// (x viewed as a matrix of its rows).
    ///
    /// # Shapes
    /// `x`: `[..., N]` with M rows in all; `col`: `[M]` (or x's shape without its last dim) → like x.
    fn mul_col(&self, x: &Tensor, col: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::mul_col; [x, col])
    }

    /// `out[i, j] = x[i, j] / col[i]`: a column vector broadcast over every column
    /// (x viewed as a matrix of its rows).
    ///
    /// # Shapes
    /// `x`: `[..., N]` with M rows in all; `col`: `[M]` (or x's shape without its last dim) → like x.
    fn div_col(&self, x: &Tensor, col: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::div_col; [x, col])
    }

    /// `a + b + c`.
    ///
    /// # Shapes
    /// equal shapes → same.
    fn add3(&self, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::add3; [a, b, c])
    }

    /// `x·exp(y)`.
    ///
    /// # Shapes
    /// equal shapes → same.
    fn exp_mul(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::exp_mul; [x, y])
    }

    /// `(a − b)·c`.
    ///
    /// # Shapes
    /// equal shapes → same.
    fn sub_mul(&self, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::sub_mul; [a, b, c])
    }

    /// `a + b·c` with a scalar `c` (axpy).
    ///
    /// # Shapes
    /// `a`, `b`: equal shapes → same.
    fn add_scaled(&self, a: &Tensor, b: &Tensor, c: f32) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::add_scaled; [a, b], c)
    }

    /// `exp(x)`, elementwise.
    ///
    /// # Shapes
    /// any → same.
    fn exp(&self, x: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::exp; [x])
    }

    /// `ln(x)`, elementwise.
    ///
    /// # Shapes
    /// any → same.
    fn log(&self, x: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::log; [x])
    }

    /// `√x`, elementwise.
    ///
    /// # Shapes
    /// any → same.
    fn sqrt(&self, x: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::sqrt; [x])
    }

    /// `x^p`, elementwise.
    ///
    /// # Shapes
    /// any → same.
    fn pow(&self, x: &Tensor, p: f32) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::pow; [x], p)
    }

    /// `−x`, elementwise.
    ///
    /// # Shapes
    /// any → same.
    fn neg(&self, x: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::neg; [x])
    }

    /// `|x|`, elementwise.
    ///
    /// # Shapes
    /// any → same.
    fn abs(&self, x: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::abs; [x])
    }

    /// `min(max(x, lo), hi)`, elementwise.
    ///
    /// # Shapes
    /// any → same.
    fn clamp(&self, x: &Tensor, lo: f32, hi: f32) -> Result<Tensor> {
        on_cpu!(self, cpu::elementwise::clamp; [x], lo, hi)
    }

    /// `x ← exp(x)`, in place (x must be writable).
    ///
    /// # Shapes
    /// any.
    fn exp_inplace(&self, x: &mut Tensor) -> Result<()> {
        in_place_on_cpu(self, x, cpu::elementwise::exp_inplace)
    }

    /// `x ← ln(x)`, in place (x must be writable).
    ///
    /// # Shapes
    /// any.
    fn log_inplace(&self, x: &mut Tensor) -> Result<()> {
        in_place_on_cpu(self, x, cpu::elementwise::log_inplace)
    }

    /// `x ← √x`, in place (x must be writable).
    ///
    /// # Shapes
    /// any.
    fn sqrt_inplace(&self, x: &mut Tensor) -> Result<()> {
        in_place_on_cpu(self, x, cpu::elementwise::sqrt_inplace)
    }

    /// `x ← x^p`, in place (x must be writable).
    ///
    /// # Shapes
    /// any.
    fn pow_inplace(&self, x: &mut Tensor, p: f32) -> Result<()> {
        in_place_on_cpu(self, x, |cpu, x| cpu::elementwise::pow_inplace(cpu, x, p))
    }

    /// `x ← −x`, in place (x must be writable).
    ///
    /// # Shapes
    /// any.
    fn neg_inplace(&self, x: &mut Tensor) -> Result<()> {
        in_place_on_cpu(self, x, cpu::elementwise::neg_inplace)
    }

    /// `x ← |x|`, in place (x must be writable).
    ///
    /// # Shapes
    /// any.
    fn abs_inplace(&self, x: &mut Tensor) -> Result<()> {
        in_place_on_cpu(self, x, cpu::elementwise::abs_inplace)
    }

    /// `x ← min(max(x, lo), hi)`, in place (x must be writable).
    ///
    /// # Shapes
    /// any.
    fn clamp_inplace(&self, x: &mut Tensor, lo: f32, hi: f32) -> Result<()> {
        in_place_on_cpu(self, x, |cpu, x| cpu::elementwise::clamp_inplace(cpu, x, lo, hi))
    }

    // ──────────────────────────────── reductions ───────────────────────────────

    /// `Σ x` along `axis` (which is removed), or over everything when `axis` is `None`
    /// (a scalar); f32 accumulation, result in x's dtype.
    ///
    /// # Shapes
    /// `x`: any → x's shape without `axis`, or `[]`.
    fn sum(&self, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
        on_cpu!(self, cpu::reduce::sum; [x], axis)
    }

    /// `mean(x)` along `axis` (which is removed), or over everything when `axis` is `None`
    /// (a scalar); f32 accumulation, result in x's dtype.
    ///
    /// # Shapes
    /// `x`: any → x's shape without `axis`, or `[]`.
    fn mean(&self, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
        on_cpu!(self, cpu::reduce::mean; [x], axis)
    }

    /// `max(x)` along `axis` (which is removed), or over everything when `axis` is `None`
    /// (a scalar); f32 accumulation, result in x's dtype.
    ///
    /// # Shapes
    /// `x`: any → x's shape without `axis`, or `[]`.
    fn max(&self, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
        on_cpu!(self, cpu::reduce::max; [x], axis)
    }

    /// `population variance mean((x − mean)²)` along `axis` (which is removed), or over everything when `axis` is `None`
    /// (a scalar); f32 accumulation, result in x's dtype.
    ///
    /// # Shapes
    /// `x`: any → x's shape without `axis`, or `[]`.
    fn var(&self, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
        on_cpu!(self, cpu::reduce::var; [x], axis)
    }

    /// `Σ |x|` along `axis` (which is removed), or over everything when `axis` is `None`
    /// (a scalar); f32 accumulation, result in x's dtype.
    ///
    /// # Shapes
    /// `x`: any → x's shape without `axis`, or `[]`.
    fn sum_abs(&self, x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
        on_cpu!(self, cpu::reduce::sum_abs; [x], axis)
    }

    /// Index of the first maximum along `axis` (removed).
    ///
    /// # Shapes
    /// `x`: any → x's shape without `axis`, U32.
    fn argmax(&self, x: &Tensor, axis: usize) -> Result<Tensor> {
        on_cpu!(self, cpu::reduce::argmax; [x], axis)
    }

    /// The `k` largest values along the last dim, in descending order (ties: lower index
    /// first), with their indices.
    ///
    /// # Shapes
    /// `x`: `[..., N]`, `k ≤ N` → values `[..., k]` (x's dtype), indices `[..., k]` U32.
    fn topk(&self, x: &Tensor, k: usize) -> Result<TopK> {
        on_cpu!(self, cpu::reduce::topk; [x], k)
    }

    /// Gradient of `max` along `axis`: `d_out` routed to the first arg-max, zeros elsewhere.
    ///
    /// # Shapes
    /// `x`: any; `d_out`: x's shape without `axis` → like x.
    fn max_backward(&self, x: &Tensor, d_out: &Tensor, axis: usize) -> Result<Tensor> {
        on_cpu!(self, cpu::reduce::max_backward; [x, d_out], axis)
    }

    /// Sums a broadcast gradient back to `shape` (numpy broadcasting rules: leading
    /// dims summed away, size-1 dims summed and kept).
    ///
    /// # Shapes
    /// `x`: a shape `shape` broadcasts to → `shape`.
    fn sum_to_shape(&self, x: &Tensor, shape: &Shape) -> Result<Tensor> {
        on_cpu!(self, cpu::reduce::sum_to_shape; [x], shape)
    }

    // ───────────────────────────────── layout ──────────────────────────────────

    /// The same elements with another shape (no copy: tensors are contiguous).
    ///
    /// # Shapes
    /// any → `shape` with the same element count.
    fn reshape(&self, x: &Tensor, shape: &Shape) -> Result<Tensor> {
        x.reshape(shape.clone())
    }

    /// Reorders the axes: `out` dim i is x's dim `perm[i]` (materialised).
    ///
    /// # Shapes
    /// `x`: rank r; `perm`: a permutation of `0..r` → permuted shape.
    fn permute(&self, x: &Tensor, perm: &[usize]) -> Result<Tensor> {
        on_cpu!(self, cpu::layout::permute; [x], perm)
    }

    /// Swaps two axes (materialised).
    ///
    /// # Shapes
    /// `x`: rank r, `dim0, dim1 < r` → those dims swapped.
    fn transpose(&self, x: &Tensor, dim0: usize, dim1: usize) -> Result<Tensor> {
        on_cpu!(self, cpu::layout::transpose; [x], dim0, dim1)
    }

    /// Elements `start .. start + len` along `axis` (materialised).
    ///
    /// # Shapes
    /// `x`: `[..., N, ...]` → `[..., len, ...]`.
    fn slice(&self, x: &Tensor, axis: usize, start: usize, len: usize) -> Result<Tensor> {
        on_cpu!(self, cpu::layout::slice; [x], axis, start, len)
    }

    /// Gradient of `slice`: `d_out` scattered into zeros of the input's shape.
    ///
    /// # Shapes
    /// `d_out`: `input_shape` with `len` along `axis` → `input_shape`.
    fn slice_backward(&self, d_out: &Tensor, input_shape: &Shape, axis: usize, start: usize) -> Result<Tensor> {
        on_cpu!(self, cpu::layout::slice_backward; [d_out], input_shape, axis, start)
    }

    /// Index `index` along `axis`, which is removed.
    ///
    /// # Shapes
    /// `x`: `[..., N, ...]` → `[..., ...]`.
    fn select(&self, x: &Tensor, axis: usize, index: usize) -> Result<Tensor> {
        on_cpu!(self, cpu::layout::select; [x], axis, index)
    }

    /// Joins tensors along `axis` (all other dims and the dtype must agree).
    ///
    /// # Shapes
    /// `[..., Nᵢ, ...]` each → `[..., ΣNᵢ, ...]`.
    fn concat(&self, xs: &[Tensor], axis: usize) -> Result<Tensor> {
        let host = xs.iter().map(|t| self.to_host(t)).collect::<Result<Vec<_>>>()?;
        cpu::layout::concat(self.cpu(), &host, axis)?.to_backend(self)
    }

    /// Broadcasts to `shape` (numpy rules: new leading dims, size-1 dims repeated; materialised).
    ///
    /// # Shapes
    /// `x`: broadcastable to `shape` → `shape`.
    fn expand(&self, x: &Tensor, shape: &Shape) -> Result<Tensor> {
        on_cpu!(self, cpu::layout::expand; [x], shape)
    }

    // ────────────────────────────── convolutions ───────────────────────────────

    /// 1-d convolution (cross-correlation):
    /// `y[b,o,t] = bias[o] + Σ_{c∈group(o), k} w[o, c, k]·x[b, c, t·stride + k·dilation − padding]`.
    ///
    /// # Shapes
    /// `x`: `[B, Cin, L]`; `w`: `[Cout, Cin/groups, K]`; `bias`: `[Cout]` →
    /// `[B, Cout, (L + 2·padding − dilation·(K−1) − 1)/stride + 1]`.
    fn conv1d(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, config: &Conv1dConfig) -> Result<Tensor> {
        let bias = opt_to_host(self, bias)?;
        on_cpu!(self, cpu::conv::conv1d; [x, w], bias.as_ref(), config)
    }

    /// Transposed 1-d convolution (the gradient of conv1d w.r.t. its input, plus bias):
    /// `y[b, o, t·stride + k·dilation − padding] += w[c, o, k]·x[b, c, t]`.
    ///
    /// # Shapes
    /// `x`: `[B, Cin, L]`; `w`: `[Cin, Cout/groups, K]`; `bias`: `[Cout]` →
    /// `[B, Cout, (L−1)·stride − 2·padding + dilation·(K−1) + output_padding + 1]`.
    fn conv_transpose1d(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, config: &Conv1dConfig) -> Result<Tensor> {
        let bias = opt_to_host(self, bias)?;
        on_cpu!(self, cpu::conv::conv_transpose1d; [x, w], bias.as_ref(), config)
    }

    /// 2-d convolution (cross-correlation) with per-axis stride, padding, dilation, and groups.
    ///
    /// # Shapes
    /// `x`: `[B, Cin, H, W]`; `w`: `[Cout, Cin/groups, Kh, Kw]`; `bias`: `[Cout]` →
    /// `[B, Cout, Ho, Wo]` with `Ho = (H + 2·ph − dh·(Kh−1) − 1)/sh + 1` (likewise Wo).
    fn conv2d(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, config: &Conv2dConfig) -> Result<Tensor> {
        let bias = opt_to_host(self, bias)?;
        on_cpu!(self, cpu::conv::conv2d; [x, w], bias.as_ref(), config)
    }

    /// Causal depthwise conv then SiLU:
    /// `y[b,c,t] = silu(bias[c] + Σ_k w[c,k]·x[b, c, t + k − (K−1)])` (x is 0 before t = 0).
    ///
    /// # Shapes
    /// `x`: `[B, C, L]`; `w`: `[C, K]`; `bias`: `[C]` → `[B, C, L]`.
    fn depthwise_conv1d_silu(&self, x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::conv::depthwise_conv1d_silu; [x, w, bias])
    }

    /// Causal depthwise conv plus bias: `y[b,c,t] = bias[c] + Σ_k w[c,k]·x[b, c, t + k − (K−1)]`.
    ///
    /// # Shapes
    /// `x`: `[B, C, L]`; `w`: `[C, K]`; `bias`: `[C]` → `[B, C, L]`.
    fn depthwise_conv1d_bias(&self, x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::conv::depthwise_conv1d_bias; [x, w, bias])
    }

    /// `depthwise_conv1d_bias` over `[ctx, x]` (ctx the K−1 previous inputs, e.g. a
    /// streaming state) without concatenating them.
    ///
    /// # Shapes
    /// `ctx`: `[B, C, K−1]`; `x`: `[B, C, L]`; `w`: `[C, K]`; `bias`: `[C]` → `[B, C, L]`.
    fn depthwise_conv1d_bias_ctx(&self, ctx: &Tensor, x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::conv::depthwise_conv1d_bias_ctx; [ctx, x, w, bias])
    }

    /// `depthwise_conv1d_silu` over `[ctx, x]` (ctx the K−1 previous inputs, a streaming
    /// state) without concatenating them; with L = 1 it is the decode step of a Gated
    /// DeltaNet layer's conv (`causal_conv1d_update`).
    ///
    /// # Shapes
    /// `ctx`: `[B, C, K−1]`; `x`: `[B, C, L]`; `w`: `[C, K]`; `bias`: `[C]` → `[B, C, L]`.
    fn depthwise_conv1d_silu_ctx(&self, ctx: &Tensor, x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<Tensor> {
        on_cpu!(self, cpu::conv::depthwise_conv1d_silu_ctx; [ctx, x, w, bias])
    }

    /// Backward of `depthwise_conv1d_silu` (ctx `None`: zeros before t = 0) or of
    /// `depthwise_conv1d_silu_ctx` (ctx given; `d_ctx` returned). With z = [ctx, x],
    /// `pre = bias + Σ_k w[k]·z[t + k]` and `g = dy·silu'(pre)`: `dbias = Σ g`,
    /// `dw[k] = Σ g[t]·z[t + k]`, `dz[j] = Σ_k w[k]·g[j − k]` (split into d_ctx, dx).
    ///
    /// # Shapes
    /// `ctx`: `[B, C, K−1]`; `x`, `d_out`: `[B, C, L]`; `w`: `[C, K]`; `bias`: `[C]` →
    /// dx `[B, C, L]`, dw `[C, K]`, dbias `[C]`, d_ctx `[B, C, K−1]`.
    fn depthwise_conv1d_silu_backward(
        &self,
        ctx: Option<&Tensor>,
        x: &Tensor,
        w: &Tensor,
        bias: &Tensor,
        d_out: &Tensor,
    ) -> Result<ConvGradients> {
        let ctx = opt_to_host(self, ctx)?;
        on_cpu!(self, [x, w, bias, d_out] => |c| cpu::conv::depthwise_conv1d_silu_backward(c, ctx.as_ref(), x, w, bias, d_out))
    }
}
