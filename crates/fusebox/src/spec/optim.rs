//! Optimizer ops: the AdamW step, the global gradient norm and the clipping factor.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec::check;
use crate::tensor::Tensor;
use crate::types::AdamWConfig;

/// An AdamW step over `len` parameters of `dtype` (the moments are F32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdamWSpec {
    /// Parameters (elements of param, grad, m and v).
    pub len: usize,
    /// The parameter's and gradient's dtype.
    pub dtype: DType,
}

/// Hyper-parameters must make the step well defined: `0 ≤ β < 1` (else `1 − βᵗ` can be
/// 0) and every value finite.
pub fn adamw_config(op: &'static str, c: &AdamWConfig) -> Result<()> {
    for (name, beta) in [("beta1", c.beta1), ("beta2", c.beta2)] {
        if !(0.0..1.0).contains(&beta) {
            return Err(Error::value(op, name, "in [0, 1)", beta));
        }
    }
    for (name, x) in [("lr", c.lr), ("eps", c.eps), ("weight_decay", c.weight_decay), ("grad_scale", c.grad_scale)] {
        if !x.is_finite() {
            return Err(Error::value(op, name, "a finite number", x));
        }
    }
    Ok(())
}

/// `adamw_update(param, grad, m, v, config, step)`: `step ≥ 1`, the config
/// ([`adamw_config`]), param float, grad of its dtype, m and v F32, all of param's shape.
pub fn adamw_update(
    param: &Tensor,
    grad: &Tensor,
    m: &Tensor,
    v: &Tensor,
    config: &AdamWConfig,
    step: u64,
) -> Result<AdamWSpec> {
    const OP: &str = "adamw_update";
    if step == 0 {
        return Err(Error::value(OP, "step", "≥ 1 (steps count from 1)", step));
    }
    adamw_config(OP, config)?;
    check::float(OP, "param", param)?;
    check::same_dtype(OP, "grad", param, grad)?;
    check::dtype(OP, "m", m, DType::F32)?;
    check::dtype(OP, "v", v, DType::F32)?;
    check::same_shape(OP, "grad", param, grad)?;
    check::same_shape(OP, "m", param, m)?;
    check::same_shape(OP, "v", param, v)?;
    Ok(AdamWSpec { len: param.elem_count(), dtype: param.dtype() })
}

/// `global_norm(tensors)`: every tensor float (any shapes, any number of them).
pub fn global_norm(tensors: &[Tensor]) -> Result<()> {
    for (i, t) in tensors.iter().enumerate() {
        check::float("global_norm", &format!("tensor {i}"), t)?;
    }
    Ok(())
}

/// `clip_scale(global_norm, max_norm)`: `max_norm` not NaN and ≥ 0 (+∞ disables
/// clipping); `global_norm` finite and ≥ 0 (overflowed gradients cannot be rescaled).
pub fn clip_scale(global_norm: f32, max_norm: f32) -> Result<()> {
    const OP: &str = "clip_scale";
    if max_norm.is_nan() || max_norm < 0.0 {
        return Err(Error::value(OP, "max_norm", "a non-negative number", max_norm));
    }
    if !global_norm.is_finite() || global_norm < 0.0 {
        return Err(Error::value(OP, "global_norm", "a finite, non-negative number", global_norm));
    }
    Ok(())
}
