//! The optimizer step, once for every run: a finiteness check, global-norm clipping and
//! AdamW with the schedule's learning rate, over whatever tensors the run trains (every
//! parameter, or LoRA adapters).

use std::path::Path;

use fusebox::{AdamWConfig, ComputeBackend, Error, Result};

use super::TrainConfig;
use crate::checkpoint;
use crate::params::{ParamSet, ParamSpec};

/// AdamW's first and second moments of every trained tensor (laid out as their specs).
#[derive(Debug)]
pub struct AdamW {
    m: ParamSet,
    v: ParamSet,
}

/// What one update did.
#[derive(Debug, Clone, Copy)]
pub struct Update {
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    /// Learning rate used.
    pub lr: f32,
}

impl AdamW {
    /// Zero moments for tensors of `specs` (a fresh run).
    pub fn zeros(b: &dyn ComputeBackend, specs: &[ParamSpec]) -> Result<AdamW> {
        Ok(AdamW { m: ParamSet::zeros(b, specs)?, v: ParamSet::zeros(b, specs)? })
    }

    /// The moments saved in the checkpoint directory `dir` (`optimizer.safetensors`).
    pub fn load(b: &dyn ComputeBackend, dir: &Path, specs: &[ParamSpec]) -> Result<AdamW> {
        let (m, v) = checkpoint::load_moments(b, dir, specs)?;
        Ok(AdamW { m, v })
    }

    /// `(m, v)`, as a checkpoint writes them.
    pub fn moments(&self) -> (&ParamSet, &ParamSet) {
        (&self.m, &self.v)
    }

    /// `(m, v)`, writable (a data-parallel run copies rank 0's).
    pub fn moments_mut(&mut self) -> (&mut ParamSet, &mut ParamSet) {
        (&mut self.m, &mut self.v)
    }

    /// Bytes the two moments hold.
    pub fn byte_len(&self) -> u64 {
        [&self.m, &self.v].iter().flat_map(|s| &s.tensors).map(|t| t.byte_len() as u64).sum()
    }

    /// Optimizer step `step` (from 1) of `params` with gradients `grads` (both laid out as
    /// `specs`), after a micro-batch mean loss of `loss`:
    ///
    /// 1. `‖g‖ = sqrt(Σ g²)` over every tensor; a non-finite loss or norm is an error and
    ///    nothing changes;
    /// 2. `clip = min(1, grad_clip / ‖g‖)` (1 when `grad_clip` is 0);
    /// 3. AdamW on every tensor with `g ← clip·g`, the learning rate of
    ///    [`TrainConfig::lr_at`], and weight decay on the specs marked `decay` only.
    pub fn update(
        &mut self,
        b: &dyn ComputeBackend,
        config: &TrainConfig,
        step: u64,
        loss: f32,
        specs: &[ParamSpec],
        params: &mut ParamSet,
        grads: &ParamSet,
    ) -> Result<Update> {
        let grad_norm = b.global_norm(&grads.tensors)?;
        check_finite(step, loss, grad_norm)?;
        let (clip, lr) = (clip_factor(b, config, grad_norm)?, config.lr_at(step));
        for (i, spec) in specs.iter().enumerate() {
            b.adamw_update(
                &mut params.tensors[i],
                &grads.tensors[i],
                &mut self.m.tensors[i],
                &mut self.v.tensors[i],
                &hyper(config, spec, lr, clip),
                step,
            )?;
        }
        Ok(Update { grad_norm, lr })
    }
}

/// An error (naming the step) unless the loss and the global gradient norm are finite.
pub(super) fn check_finite(step: u64, loss: f32, grad_norm: f32) -> Result<()> {
    if loss.is_finite() && grad_norm.is_finite() {
        return Ok(());
    }
    Err(Error::value(
        "train_step",
        format!("loss at step {step}"),
        "a finite value",
        format!("loss {loss}, gradient norm {grad_norm}"),
    ))
}

/// `min(1, grad_clip / ‖g‖)`, 1 when clipping is off.
pub(super) fn clip_factor(b: &dyn ComputeBackend, config: &TrainConfig, grad_norm: f32) -> Result<f32> {
    if config.grad_clip > 0.0 {
        b.clip_scale(grad_norm, config.grad_clip)
    } else {
        Ok(1.0)
    }
}

/// AdamW's settings for a tensor of `spec` at learning rate `lr`, gradients scaled by `clip`.
pub(super) fn hyper(config: &TrainConfig, spec: &ParamSpec, lr: f32, clip: f32) -> AdamWConfig {
    AdamWConfig {
        lr,
        beta1: config.beta1,
        beta2: config.beta2,
        eps: 1e-8,
        weight_decay: if spec.decay { config.weight_decay } else { 0.0 },
        // Clipping happens inside the step: g ← clip·g, no extra pass.
        grad_scale: clip,
    }
}
