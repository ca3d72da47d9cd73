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
        if !loss.is_finite() || !grad_norm.is_finite() {
            return Err(Error::value(
                "train_step",
                format!("loss at step {step}"),
                "a finite value",
                format!("loss {loss}, gradient norm {grad_norm}"),
            ));
        }
        let clip = if config.grad_clip > 0.0 { b.clip_scale(grad_norm, config.grad_clip)? } else { 1.0 };
        let lr = config.lr_at(step);
        for (i, spec) in specs.iter().enumerate() {
            let hyper = AdamWConfig {
                lr,
                beta1: config.beta1,
                beta2: config.beta2,
                eps: 1e-8,
                weight_decay: if spec.decay { config.weight_decay } else { 0.0 },
                // Clipping happens inside the step: g ← clip·g, no extra pass.
                grad_scale: clip,
            };
            b.adamw_update(
                &mut params.tensors[i],
                &grads.tensors[i],
                &mut self.m.tensors[i],
                &mut self.v.tensors[i],
                &hyper,
                step,
            )?;
        }
        Ok(Update { grad_norm, lr })
    }
}
