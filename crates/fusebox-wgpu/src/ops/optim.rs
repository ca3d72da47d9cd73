//! Optimizer ops: AdamW update and global gradient norm. F16/BF16 parameters and
//! gradients are widened on the device (the moments are F32, as the CPU requires); a
//! 16-bit parameter is stepped in f32 and rounded once on the way back.

use fusebox::cpu;
use fusebox::spec::optim as spec;
use fusebox::{AdamWConfig, ComputeBackend, DType, Result, Tensor};

use crate::backend::WgpuBackend;
use crate::kernels;
use crate::ops::convert::word_aligned;
use crate::ops::{f, u};

pub(crate) fn adamw_update(
    be: &WgpuBackend,
    param: &mut Tensor,
    grad: &Tensor,
    m: &mut Tensor,
    v: &mut Tensor,
    config: &AdamWConfig,
    step: u64,
) -> Result<()> {
    const OP: &str = "adamw_update";
    spec::adamw_update(param, grad, m, v, config, step)?;
    let on_device = !param.is_host() && !m.is_host() && !v.is_host();
    if !on_device || !word_aligned(&[param, grad]) {
        be.ctx.note_fallback("in place");
        let grad = be.to_host(grad)?;
        if param.is_host() && m.is_host() && v.is_host() {
            return cpu::optim::adamw_update(be.cpu(), param, &grad, m, v, config, step);
        }
        let (mut p_h, mut m_h, mut v_h) = (be.to_host(param)?, be.to_host(m)?, be.to_host(v)?);
        cpu::optim::adamw_update(be.cpu(), &mut p_h, &grad, &mut m_h, &mut v_h, config, step)?;
        be.copy_into(param, &p_h)?;
        be.copy_into(m, &m_h)?;
        return be.copy_into(v, &v_h);
    }
    param.ensure_writable(OP)?;
    m.ensure_writable(OP)?;
    v.ensure_writable(OP)?;
    let grad = be.widen(OP, grad)?;
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
    be.update_widened(OP, &[&*param], |p| be.ctx.flat(OP, &kernels::ADAMW, &[&p[0], &grad, m, v], &params, n))
}

pub(crate) fn global_norm(be: &WgpuBackend, tensors: &[Tensor]) -> Result<f32> {
    spec::global_norm(tensors)?;
    if tensors.iter().any(|t| t.is_host() || !word_aligned(&[t])) {
        be.ctx.note_fallback("in place");
        let host = tensors.iter().map(|t| be.to_host(t)).collect::<Result<Vec<_>>>()?;
        return cpu::optim::global_norm(be.cpu(), &host);
    }
    // Every tensor's partials are queued before the first read, so they go out together.
    let parts =
        tensors.iter().map(|t| be.queue_sum_squares(&be.widen("global_norm", t)?)).collect::<Result<Vec<_>>>()?;
    let mut total = 0.0f64;
    for part in parts.iter().flatten() {
        let host = be.to_host(part)?;
        // Σ over chunks of m²·s, in f64 and in chunk order.
        total += host.as_slice::<f32>()?.chunks_exact(2).map(|p| (p[0] as f64).powi(2) * p[1] as f64).sum::<f64>();
    }
    Ok(total.sqrt() as f32)
}

impl WgpuBackend {
    /// Queues the per-chunk (max |x|, Σ (x/max)²) pairs of one f32 device tensor; `None`
    /// for an empty tensor.
    pub(crate) fn queue_sum_squares(&self, t: &Tensor) -> Result<Option<Tensor>> {
        let n = t.elem_count();
        if n == 0 {
            return Ok(None);
        }
        let chunks = n.div_ceil(4096);
        let part = self.ctx.empty("global_norm", [chunks, 2], DType::F32)?;
        self.ctx.dispatch("global_norm", &kernels::SUM_SQUARES, &[t, &part], &[u(n)?], chunks as u64)?;
        Ok(Some(part))
    }
}
