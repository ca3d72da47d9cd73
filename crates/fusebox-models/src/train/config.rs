//! [`TrainConfig`]: the settings of a run (sizes, the AdamW hyper-parameters, the
//! warmup + cosine schedule), their checks, and their form in `trainer.json`.

use fusebox::{Error, Result};
use serde_json::{json, Value};

use crate::config::ModelConfig;
use crate::transformer::{activation_bytes, Activations, Precision};

/// Training settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// Optimizer steps.
    pub steps: u64,
    /// Sequences per micro-batch.
    pub batch: usize,
    /// Micro-batches per optimizer step.
    pub accumulation: usize,
    /// Tokens per sequence (text data; the addition task fixes its own).
    pub seq_len: usize,
    /// Peak learning rate (after warmup).
    pub lr: f32,
    /// The cosine decays to `lr · min_lr_ratio`.
    pub min_lr_ratio: f32,
    /// Linear warmup steps.
    pub warmup: u64,
    /// AdamW decoupled weight decay (matrices only).
    pub weight_decay: f32,
    /// AdamW β₁.
    pub beta1: f32,
    /// AdamW β₂.
    pub beta2: f32,
    /// Clip the global gradient norm to this (0 = off).
    pub grad_clip: f32,
    /// Seed of initialisation and data sampling.
    pub seed: u64,
    /// Evaluate every this many steps (0 = only at the end).
    pub eval_every: u64,
    /// Validation batches per evaluation (text data).
    pub eval_batches: usize,
    /// Activation checkpointing: the forward keeps only each block's input and the
    /// backward recomputes the block ([`Activations::Recomputed`]); the same losses and
    /// gradients, bit for bit, in less memory and about one more forward of the blocks
    /// per step. A choice of each invocation, like the thread count: not written to
    /// `trainer.json`, so a resumed run uses it only when asked again.
    pub checkpoint_activations: bool,
    /// ZeRO stage of a data-parallel run: 0, every rank keeps the whole AdamW state; 1,
    /// each rank keeps the moments of its own `1/world_size` piece of the trained tensors,
    /// gradients are reduce-scattered and the updated parameters all-gathered; 2, as 1, and
    /// each rank keeps only its piece of the averaged gradient between steps (the backward
    /// still writes whole gradients). The same losses at every stage. A choice of each
    /// invocation, not written to `trainer.json`: a checkpoint of any stage and world size
    /// resumes at any other.
    pub zero: u8,
    /// The arithmetic of the linear layers' products ([`Precision::Bf16`]: BF16 operands,
    /// f32 accumulation; weights, AdamW state, gradients, norms, softmax, attention and
    /// the loss stay f32). BF16 keeps f32's exponent range, so no loss scaling is needed;
    /// a non-finite loss or gradient still stops the step. A choice of each invocation,
    /// not written to `trainer.json`.
    pub precision: Precision,
}

/// The defaults of a from-scratch run (`fusebox train` without flags): 3,000 steps of
/// 64 sequences of 128 tokens, peak learning rate 2e-3 after 100 warmup steps, weight
/// decay 0.1, clipping at 1.0, seed 1337, an evaluation every 500 steps.
impl Default for TrainConfig {
    fn default() -> TrainConfig {
        TrainConfig {
            steps: 3000,
            batch: 64,
            accumulation: 1,
            seq_len: 128,
            lr: 2e-3,
            min_lr_ratio: 0.1,
            warmup: 100,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            grad_clip: 1.0,
            seed: 1337,
            eval_every: 500,
            eval_batches: 8,
            checkpoint_activations: false,
            zero: 0,
            precision: Precision::F32,
        }
    }
}

impl TrainConfig {
    /// Learning rate at `step` (1-based): linear warmup, then cosine to `lr · min_lr_ratio`.
    pub fn lr_at(&self, step: u64) -> f32 {
        if step <= self.warmup && self.warmup > 0 {
            return self.lr * step as f32 / self.warmup as f32;
        }
        let span = self.steps.saturating_sub(self.warmup).max(1) as f32;
        let progress = ((step - self.warmup.min(step)) as f32 / span).min(1.0);
        let min_lr = self.lr * self.min_lr_ratio;
        min_lr + 0.5 * (self.lr - min_lr) * (1.0 + (std::f32::consts::PI * progress).cos())
    }

    /// Checks every setting is usable: positive sizes, finite non-negative rates, betas
    /// in [0, 1); the error names the field, what it must be and what came.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, expected: &str, got: String| Err(Error::value("TrainConfig", what, expected, got));
        for (name, v) in [("batch", self.batch), ("accumulation", self.accumulation), ("seq_len", self.seq_len)] {
            if v == 0 {
                return bad(name, "at least 1", v.to_string());
            }
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad("lr", "a finite number > 0", self.lr.to_string());
        }
        for (name, v) in [("weight_decay", self.weight_decay), ("grad_clip", self.grad_clip)] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(name, "a finite number ≥ 0", v.to_string());
            }
        }
        if !(self.min_lr_ratio.is_finite() && (0.0..=1.0).contains(&self.min_lr_ratio)) {
            return bad("min_lr_ratio", "in [0, 1]", self.min_lr_ratio.to_string());
        }
        for (name, v) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(v.is_finite() && (0.0..1.0).contains(&v)) {
                return bad(name, "in [0, 1)", v.to_string());
            }
        }
        if self.zero > 2 {
            return bad("zero", "a ZeRO stage of 0, 1 or 2", self.zero.to_string());
        }
        Ok(())
    }

    /// Reads the settings [`Trainer::state_json`](super::Trainer::state_json) wrote (its `"train"` object).
    pub fn from_json(v: &Value) -> Result<TrainConfig> {
        let field = |name: &str| v.get(name).ok_or_else(|| Error::Io(format!("trainer.json: 'train' has no '{name}'")));
        let uint = |name: &str| -> Result<u64> {
            field(name)?
                .as_u64()
                .ok_or_else(|| Error::Io(format!("trainer.json: 'train.{name}' is not a non-negative integer")))
        };
        let size = |name: &str| -> Result<usize> {
            usize::try_from(uint(name)?)
                .map_err(|_| Error::Io(format!("trainer.json: 'train.{name}' does not fit this machine's usize")))
        };
        let float = |name: &str| -> Result<f32> {
            field(name)?
                .as_f64()
                .map(|x| x as f32)
                .ok_or_else(|| Error::Io(format!("trainer.json: 'train.{name}' is not a number")))
        };
        let cfg = TrainConfig {
            steps: uint("steps")?,
            batch: size("batch")?,
            accumulation: size("accumulation")?,
            seq_len: size("seq_len")?,
            lr: float("lr")?,
            min_lr_ratio: float("min_lr_ratio")?,
            warmup: uint("warmup")?,
            weight_decay: float("weight_decay")?,
            beta1: float("beta1")?,
            beta2: float("beta2")?,
            grad_clip: float("grad_clip")?,
            seed: uint("seed")?,
            eval_every: uint("eval_every")?,
            eval_batches: size("eval_batches")?,
            checkpoint_activations: false,
            zero: 0,
            precision: Precision::F32,
        };
        cfg.validate().map_err(|e| Error::Io(format!("trainer.json: {e}")))?;
        Ok(cfg)
    }

    /// What the forward keeps for the backward in this run.
    pub fn activations(&self) -> Activations {
        if self.checkpoint_activations {
            Activations::Recomputed
        } else {
            Activations::Saved
        }
    }

    /// Bytes a training run of `model` with these settings needs, estimated (see
    /// [`memory_breakdown`](Self::memory_breakdown)). `None` when the model is not valid
    /// or the count overflows.
    pub fn memory_estimate(&self, model: &ModelConfig, seq: usize) -> Option<u64> {
        self.memory_breakdown(model, seq)?.total()
    }

    /// The bytes of [`memory_estimate`](Self::memory_estimate), part by part: parameters,
    /// gradients and the two AdamW moments (4 f32 copies), the activations one
    /// micro-batch of `batch × seq` tokens keeps for its backward (with and without
    /// checkpointing), the logits with their gradient, and the backward's transients.
    pub fn memory_breakdown(&self, model: &ModelConfig, seq: usize) -> Option<MemoryEstimate> {
        self.memory_breakdown_per_rank(model, seq, 1)
    }

    /// [`memory_breakdown`](Self::memory_breakdown) of one rank of `world`: under ZeRO
    /// (`zero` ≥ 1) the two AdamW moments are `1/world` of the parameters' (rounded up);
    /// the parameters and the gradients the backward writes stay whole.
    pub fn memory_breakdown_per_rank(&self, model: &ModelConfig, seq: usize, world: usize) -> Option<MemoryEstimate> {
        // A valid model's parameters fit in this machine, so its layers can be built.
        model.validate().ok()?;
        let u = |x: usize| u64::try_from(x).ok();
        let tokens = self.batch.checked_mul(seq)?;
        let arch = model.arch();
        let (d, f, v) = (u(model.d_model)?, u(model.d_ff)?, u(model.vocab_size)?);
        let t = u(tokens)?;
        Some(MemoryEstimate {
            state: {
                let p = model.param_count()?;
                let moments = if self.zero > 0 { p.div_ceil(world.max(1) as u64) } else { p };
                p.checked_mul(2 * 4)?.checked_add(moments.checked_mul(2 * 4)?)?
            },
            activations: activation_bytes(&arch, tokens, self.activations())?,
            activations_saved: activation_bytes(&arch, tokens, Activations::Saved)?,
            activations_checkpointed: activation_bytes(&arch, tokens, Activations::Recomputed)?,
            logits: t.checked_mul(v)?.checked_mul(2 * 4)?,
            // A few rows of the widest layer.
            transient: t.checked_mul(d.max(f))?.checked_mul(4 * 4)?,
        })
    }

    /// The settings as `trainer.json`'s `"train"` object (read by [`TrainConfig::from_json`]).
    pub fn to_json(&self) -> Value {
        json!({
            "steps": self.steps, "batch": self.batch, "accumulation": self.accumulation, "seq_len": self.seq_len,
            "lr": self.lr, "min_lr_ratio": self.min_lr_ratio, "warmup": self.warmup, "weight_decay": self.weight_decay,
            "beta1": self.beta1, "beta2": self.beta2, "grad_clip": self.grad_clip, "seed": self.seed,
            "eval_every": self.eval_every, "eval_batches": self.eval_batches,
        })
    }
}

/// A training run's memory, estimated in bytes (see [`TrainConfig::memory_breakdown`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// Parameters, gradients and the two AdamW moments (this rank's piece of them under ZeRO).
    pub state: u64,
    /// The activations a micro-batch keeps for its backward in this run
    /// (`activations_checkpointed` with checkpointing, else `activations_saved`).
    pub activations: u64,
    /// The same without activation checkpointing: every block's activations.
    pub activations_saved: u64,
    /// The same with activation checkpointing: each block's input, and one block's
    /// activations recomputed at a time.
    pub activations_checkpointed: u64,
    /// The logits and their gradient, `batch × seq × vocab` f32 each.
    pub logits: u64,
    /// The backward's transients.
    pub transient: u64,
}

impl MemoryEstimate {
    /// Every part together; `None` on overflow.
    pub fn total(&self) -> Option<u64> {
        self.per_step()?.checked_add(self.state)
    }

    /// What a step allocates and frees again: activations, logits and the backward's
    /// transients; `None` on overflow.
    pub fn per_step(&self) -> Option<u64> {
        self.activations.checked_add(self.logits)?.checked_add(self.transient)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Style;
    use crate::model::param_specs;

    /// The defaults with a small batch of short sequences.
    fn config() -> TrainConfig {
        TrainConfig { batch: 2, seq_len: 12, ..TrainConfig::default() }
    }

    #[test]
    fn bad_settings_are_refused_by_name() {
        type Spoil = fn(&mut TrainConfig);
        let cases: [(&str, Spoil); 9] = [
            ("batch", |c| c.batch = 0),
            ("accumulation", |c| c.accumulation = 0),
            ("lr", |c| c.lr = -1.0),
            ("lr", |c| c.lr = f32::NAN),
            ("grad_clip", |c| c.grad_clip = f32::NAN),
            ("grad_clip", |c| c.grad_clip = -1.0),
            ("weight_decay", |c| c.weight_decay = f32::INFINITY),
            ("beta2", |c| c.beta2 = 1.0),
            ("min_lr_ratio", |c| c.min_lr_ratio = 2.0),
        ];
        for (field, spoil) in cases {
            let mut c = config();
            spoil(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
        assert!(config().validate().is_ok());
    }

    #[test]
    fn settings_round_trip_through_trainer_json() {
        let c = TrainConfig { lr: 0.0125, steps: 77, warmup: 9, ..config() };
        assert_eq!(TrainConfig::from_json(&c.to_json()).unwrap(), c);
        let mut v = c.to_json();
        v["batch"] = json!(0);
        assert!(TrainConfig::from_json(&v).unwrap_err().to_string().contains("batch"));
        v["batch"] = json!("two");
        assert!(TrainConfig::from_json(&v).unwrap_err().to_string().contains("'train.batch'"));
    }

    #[test]
    fn param_count_matches_the_layout_and_the_estimate_grows_with_the_run() {
        for style in Style::ALL {
            for tied in [true, false] {
                let cfg = ModelConfig { tied_embeddings: tied, ..ModelConfig::tiny(style, 50, 24) };
                let (specs, _) = param_specs(&cfg);
                let n: usize = specs.iter().map(|s| s.shape.elem_count()).sum();
                assert_eq!(cfg.param_count(), Some(n as u64), "{style:?} tied {tied}");
            }
        }
        let cfg = ModelConfig { n_layers: 1, d_model: 16, d_ff: 32, ..ModelConfig::tiny(Style::Gpt2, 14, 16) };
        let small = config().memory_estimate(&cfg, 12).unwrap();
        assert!(small >= 16 * cfg.param_count().unwrap(), "four f32 copies of the parameters at least");
        let big = TrainConfig { batch: 1000, ..config() }.memory_estimate(&cfg, 12).unwrap();
        assert!(big > small * 10);
        let parts = config().memory_breakdown(&cfg, 12).unwrap();
        let checkpointed = TrainConfig { checkpoint_activations: true, ..config() };
        let lean = checkpointed.memory_breakdown(&cfg, 12).unwrap();
        assert_eq!((parts.activations, lean.activations), (parts.activations_saved, lean.activations_checkpointed));
        assert_eq!(
            (parts.activations_saved, parts.activations_checkpointed),
            (lean.activations_saved, lean.activations_checkpointed)
        );
        assert_eq!(lean.total().unwrap() + parts.activations - lean.activations, small);
        let deep = ModelConfig { n_layers: 12, ..cfg.clone() };
        let (all, kept) =
            (config().memory_estimate(&deep, 12).unwrap(), checkpointed.memory_estimate(&deep, 12).unwrap());
        assert!(kept < all, "checkpointing lowers the estimate: {kept} vs {all}");
        let huge = ModelConfig { n_layers: usize::MAX, ..cfg.clone() };
        assert_eq!(config().memory_estimate(&huge, 12), None);
        let p = cfg.param_count().unwrap();
        let sharded = TrainConfig { zero: 1, ..config() }.memory_breakdown_per_rank(&cfg, 12, 2).unwrap();
        assert_eq!(parts.state - sharded.state, 8 * p - 8 * p.div_ceil(2), "--zero 1 halves the moments on 2 ranks");
        let e = TrainConfig { zero: 3, ..config() }.validate().unwrap_err().to_string();
        assert!(e.contains("zero"), "{e}");
        assert!(huge.validate().is_err());
        assert!(TrainConfig { batch: usize::MAX, ..config() }.memory_estimate(&cfg, usize::MAX).is_none());
    }
}
