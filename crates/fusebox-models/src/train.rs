//! The training loop's parts: learning-rate schedule, one optimizer step (gradient
//! accumulation, global-norm clipping, AdamW on every parameter), evaluation, and
//! the state a checkpoint needs to resume bit-identically.

use std::path::{Path, PathBuf};

use fusebox::{AdamWConfig, ComputeBackend, Error, Result, Tensor};
use serde_json::{json, Value};

use crate::checkpoint;
use crate::config::ModelConfig;
use crate::data::addition::{self, Addition};
use crate::data::text::TextData;
use crate::model::Model;
use crate::params::ParamSet;
use crate::rng::Rng;
use crate::sampler::argmax;

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

    fn to_json(&self) -> Value {
        json!({
            "steps": self.steps, "batch": self.batch, "accumulation": self.accumulation, "seq_len": self.seq_len,
            "lr": self.lr, "min_lr_ratio": self.min_lr_ratio, "warmup": self.warmup, "weight_decay": self.weight_decay,
            "beta1": self.beta1, "beta2": self.beta2, "grad_clip": self.grad_clip, "seed": self.seed,
            "eval_every": self.eval_every, "eval_batches": self.eval_batches,
        })
    }
}

/// Where training data comes from.
#[derive(Debug, Clone)]
pub enum Task {
    /// The built-in addition task.
    Addition(Addition),
    /// Byte-level text.
    Text(TextData),
    /// Uniformly random tokens of a vocabulary (benchmarks).
    Random {
        /// Tokens are drawn from `0..vocab_size`.
        vocab_size: usize,
    },
}

impl Task {
    /// Vocabulary the model needs.
    pub fn vocab_size(&self) -> usize {
        match self {
            Task::Addition(_) => addition::VOCAB,
            Task::Text(_) => crate::data::text::VOCAB,
            Task::Random { vocab_size } => *vocab_size,
        }
    }
    /// Tokens per training sequence.
    pub fn seq_len(&self, cfg: &TrainConfig) -> usize {
        match self {
            Task::Addition(_) => addition::SEQ_LEN - 1,
            Task::Text(_) | Task::Random { .. } => cfg.seq_len,
        }
    }
    /// Target id that does not count in the loss.
    pub fn ignore_index(&self) -> Option<u32> {
        match self {
            Task::Addition(_) => Some(addition::PAD),
            Task::Text(_) | Task::Random { .. } => None,
        }
    }
}

/// Results of one optimizer step.
#[derive(Debug, Clone, Copy)]
pub struct StepStats {
    /// The step just taken (from 1).
    pub step: u64,
    /// Mean training loss of the step.
    pub loss: f32,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    /// Learning rate used.
    pub lr: f32,
    /// Tokens the step trained on.
    pub tokens: usize,
}

/// Results of an evaluation.
#[derive(Debug, Clone, Copy)]
pub struct EvalStats {
    /// Mean held-out loss.
    pub loss: f32,
    /// Exact-match accuracy on the held-out problems (addition task).
    pub accuracy: Option<f64>,
}

/// A model with its optimizer state and data position.
#[derive(Debug)]
pub struct Trainer {
    /// The model being trained.
    pub model: Model,
    /// The training settings.
    pub config: TrainConfig,
    /// The data.
    pub task: Task,
    m: ParamSet,
    v: ParamSet,
    /// Gradient buffers, allocated once and zeroed in place each step.
    grads: ParamSet,
    /// Completed optimizer steps.
    pub step: u64,
    data_rng: Rng,
}

fn host_u32(b: &dyn ComputeBackend, v: Vec<u32>, rows: usize, cols: usize) -> Result<Tensor> {
    b.upload(&Tensor::from_vec(v, [rows, cols])?)
}

impl Trainer {
    /// A fresh run: model initialised from `config.seed`.
    pub fn new(b: &dyn ComputeBackend, model_config: ModelConfig, config: TrainConfig, task: Task) -> Result<Trainer> {
        if model_config.vocab_size != task.vocab_size() {
            return Err(Error::value("Trainer", "vocab_size", task.vocab_size(), model_config.vocab_size));
        }
        if task.seq_len(&config) > model_config.max_seq {
            return Err(Error::value(
                "Trainer",
                "seq_len",
                format!("≤ max_seq {}", model_config.max_seq),
                task.seq_len(&config),
            ));
        }
        if config.batch == 0 || config.accumulation == 0 {
            return Err(Error::value(
                "Trainer",
                "batch and accumulation",
                "positive",
                format!("{} and {}", config.batch, config.accumulation),
            ));
        }
        let model = Model::new(b, model_config, config.seed)?;
        let m = ParamSet::zeros(b, &model.specs)?;
        let v = ParamSet::zeros(b, &model.specs)?;
        let grads = ParamSet::zeros(b, &model.specs)?;
        let data_rng = Rng::new(config.seed.wrapping_add(1));
        Ok(Trainer { model, config, task, m, v, grads, step: 0, data_rng })
    }

    /// Continues the run saved in checkpoint `path` (an output directory or a `step-N`
    /// directory) for `config.steps` steps in all.
    pub fn resume(b: &dyn ComputeBackend, path: &Path, config: TrainConfig, task: Task) -> Result<Trainer> {
        let (model, ckpt) = checkpoint::load_model(b, path)?;
        let (m, v) = checkpoint::load_moments(b, &ckpt.dir, &model.specs)?;
        let field = |name: &str| {
            ckpt.trainer
                .get(name)
                .and_then(Value::as_u64)
                .ok_or_else(|| Error::Io(format!("{}: trainer.json has no '{name}'", ckpt.dir.display())))
        };
        let step = field("step")?;
        let data_rng = Rng { state: field("data_rng")? };
        if model.config.vocab_size != task.vocab_size() {
            return Err(Error::value(
                "Trainer::resume",
                "vocab_size of the data",
                model.config.vocab_size,
                task.vocab_size(),
            ));
        }
        let grads = ParamSet::zeros(b, &model.specs)?;
        Ok(Trainer { model, config, task, m, v, grads, step, data_rng })
    }

    fn batch(&mut self) -> (Vec<u32>, Vec<u32>) {
        let (batch, seq) = (self.config.batch, self.task.seq_len(&self.config));
        match &self.task {
            Task::Addition(a) => a.train_batch(&mut self.data_rng, batch),
            Task::Text(t) => TextData::batch(&t.train, &mut self.data_rng, batch, seq),
            Task::Random { vocab_size } => {
                let n = batch * seq;
                let ids: Vec<u32> = (0..n).map(|_| self.data_rng.below(*vocab_size) as u32).collect();
                let targets: Vec<u32> = (0..n).map(|_| self.data_rng.below(*vocab_size) as u32).collect();
                (ids, targets)
            }
        }
    }

    /// One optimizer step: accumulate gradients over micro-batches, clip by global
    /// norm, AdamW on every parameter. A non-finite loss or gradient is an error and
    /// leaves the parameters untouched.
    pub fn train_step(&mut self, b: &dyn ComputeBackend) -> Result<StepStats> {
        let step = self.step + 1;
        let seq = self.task.seq_len(&self.config);
        let accum = self.config.accumulation;
        self.grads.fill_zero(b)?;
        let mut loss_sum = 0.0f64;
        for _ in 0..accum {
            let (ids, targets) = self.batch();
            let ids = host_u32(b, ids, self.config.batch, seq)?;
            let targets = host_u32(b, targets, self.config.batch, seq)?;
            let ignore = self.task.ignore_index();
            loss_sum +=
                self.model.loss_and_grads(b, &ids, &targets, ignore, 1.0 / accum as f32, &mut self.grads)? as f64;
        }
        let loss = (loss_sum / accum as f64) as f32;
        let grad_norm = b.global_norm(&self.grads.tensors)?;
        if !loss.is_finite() || !grad_norm.is_finite() {
            return Err(Error::value(
                "train_step",
                format!("loss at step {step}"),
                "a finite value",
                format!("loss {loss}, gradient norm {grad_norm}"),
            ));
        }
        let clip = if self.config.grad_clip > 0.0 { b.clip_scale(grad_norm, self.config.grad_clip)? } else { 1.0 };
        let lr = self.config.lr_at(step);
        for (i, spec) in self.model.specs.iter().enumerate() {
            let hyper = AdamWConfig {
                lr,
                beta1: self.config.beta1,
                beta2: self.config.beta2,
                eps: 1e-8,
                weight_decay: if spec.decay { self.config.weight_decay } else { 0.0 },
                // Clipping happens inside the step: g ← clip·g, no extra pass.
                grad_scale: clip,
            };
            b.adamw_update(
                &mut self.model.params.tensors[i],
                &self.grads.tensors[i],
                &mut self.m.tensors[i],
                &mut self.v.tensors[i],
                &hyper,
                step,
            )?;
        }
        self.step = step;
        Ok(StepStats { step, loss, grad_norm, lr, tokens: self.config.batch * seq * accum })
    }

    /// Held-out loss, and for the addition task greedy exact-match accuracy.
    ///
    /// Exact match is read off one teacher-forced pass: greedy decoding reproduces the
    /// answer exactly iff at every answer position the arg-max given the correct prefix
    /// is the correct token, so the batched pass gives the same score as decoding.
    pub fn evaluate(&self, b: &dyn ComputeBackend) -> Result<EvalStats> {
        match &self.task {
            Task::Addition(task) => {
                let seq = addition::SEQ_LEN - 1;
                let (mut loss_sum, mut correct, mut count) = (0.0f64, 0usize, 0usize);
                for chunk in task.eval.chunks(250) {
                    let mut ids = Vec::with_capacity(chunk.len() * seq);
                    let mut targets = Vec::with_capacity(chunk.len() * seq);
                    for &(x, y) in chunk {
                        let (i, t) = Addition::example(x, y);
                        ids.extend(i);
                        targets.extend(t);
                    }
                    let ids_t = host_u32(b, ids, chunk.len(), seq)?;
                    let (logits, _) = self.model.forward(b, &ids_t)?;
                    let n = chunk.len() * seq;
                    let targets_t = b.upload(&Tensor::from_vec(targets.clone(), [n])?)?;
                    let ce = b.cross_entropy(&logits, &targets_t, Some(addition::PAD))?;
                    loss_sum += b.to_host(&ce.loss)?.to_vec::<f32>()?[0] as f64 * chunk.len() as f64;
                    let logits = b.to_host(&logits)?.to_vec::<f32>()?;
                    let v = addition::VOCAB;
                    for p in 0..chunk.len() {
                        let all_right = (0..seq).filter(|&s| targets[p * seq + s] != addition::PAD).all(|s| {
                            let row = &logits[(p * seq + s) * v..(p * seq + s + 1) * v];
                            argmax(row) == targets[p * seq + s]
                        });
                        correct += all_right as usize;
                        count += 1;
                    }
                }
                Ok(EvalStats { loss: (loss_sum / count as f64) as f32, accuracy: Some(correct as f64 / count as f64) })
            }
            Task::Random { .. } => {
                Err(Error::unsupported("evaluate", "random-token benchmark data has no held-out set"))
            }
            Task::Text(data) => {
                let seq = self.config.seq_len;
                let mut rng = Rng::new(self.config.seed ^ 0xE7A1);
                let mut loss_sum = 0.0;
                let batches = self.config.eval_batches.max(1);
                for _ in 0..batches {
                    let (ids, targets) = TextData::batch(&data.valid, &mut rng, self.config.batch, seq);
                    let ids = host_u32(b, ids, self.config.batch, seq)?;
                    let targets = host_u32(b, targets, self.config.batch, seq)?;
                    loss_sum += self.model.loss(b, &ids, &targets, None)? as f64;
                }
                Ok(EvalStats { loss: (loss_sum / batches as f64) as f32, accuracy: None })
            }
        }
    }

    /// The trainer state written beside a checkpoint.
    pub fn state_json(&self) -> Value {
        json!({
            "step": self.step,
            "data_rng": self.data_rng.state,
            "task": match self.task { Task::Addition(_) => "addition", Task::Text(_) => "text", Task::Random { .. } => "random" },
            "train": self.config.to_json(),
        })
    }

    /// Saves a checkpoint under `out` (see [`checkpoint::save`]).
    pub fn save(&self, b: &dyn ComputeBackend, out: &Path) -> Result<PathBuf> {
        checkpoint::save(b, out, self.step, &self.model, Some((&self.m, &self.v)), &self.state_json())
    }
}
