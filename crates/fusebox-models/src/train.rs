//! The training loop's parts: learning-rate schedule, one optimizer step (gradient
//! accumulation, global-norm clipping, AdamW on every parameter), evaluation, and
//! the state a checkpoint needs to resume bit-identically.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fusebox::{AdamWConfig, ComputeBackend, Error, Result, Tensor};
use serde_json::{json, Value};

use crate::checkpoint;
use crate::comm::{Communicator, ReduceOp, SingleProcess};
use crate::config::ModelConfig;
use crate::data::addition::{self, Addition};
use crate::data::text::TextData;
use crate::data_parallel::{GradSync, DEFAULT_BUCKET_BYTES};
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
        Ok(())
    }

    /// Reads the settings [`Trainer::state_json`] wrote (its `"train"` object).
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
        };
        cfg.validate().map_err(|e| Error::Io(format!("trainer.json: {e}")))?;
        Ok(cfg)
    }

    /// Bytes a training run of `model` with these settings needs, estimated: parameters,
    /// gradients and the two AdamW moments (4 f32 copies), the activations one
    /// micro-batch saves for its backward, and the logits with their gradient. `None`
    /// when the count overflows.
    pub fn memory_estimate(&self, model: &ModelConfig, seq: usize) -> Option<u64> {
        let u = |x: usize| u64::try_from(x).ok();
        let params = model.param_count()?;
        let tokens = u(self.batch)?.checked_mul(u(seq)?)?;
        let (d, f, v) = (u(model.d_model)?, u(model.d_ff)?, u(model.vocab_size)?);
        let hd = u(model.d_model.checked_div(model.n_heads)?)?;
        let (q, kv) = (u(model.n_heads)?.checked_mul(hd)?, u(model.n_kv_heads)?.checked_mul(hd)?);
        // Per token and layer: block input, norms, q/k/v, attention output (split and
        // merged), residual, MLP pre-activation, up projection and activation.
        let per_layer = d.checked_mul(4)?.checked_add(q.checked_mul(3)?)?.checked_add(kv.checked_mul(2)?)?;
        let per_layer = per_layer.checked_add(f.checked_mul(3)?)?;
        let saved = tokens.checked_mul(u(model.n_layers)?)?.checked_mul(per_layer)?;
        // Logits and their gradient; the backward's transients, a few rows of the widest layer.
        let head = tokens.checked_mul(v)?.checked_mul(2)?;
        let transient = tokens.checked_mul(d.max(f))?.checked_mul(4)?;
        let floats = params.checked_mul(4)?.checked_add(saved)?.checked_add(head)?.checked_add(transient)?;
        floats.checked_mul(4)
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
    /// The checkpoint directory holding the state at `step`, if one was saved or loaded:
    /// saving the same step into it again is skipped.
    saved: Option<PathBuf>,
    /// The processes training together ([`SingleProcess`] unless [`Trainer::join`]ed).
    comm: Arc<dyn Communicator>,
}

/// What a checkpoint says about the run it came from, read before resuming it.
#[derive(Debug, Clone)]
pub struct ResumeInfo {
    /// The `step-N` directory.
    pub dir: PathBuf,
    /// Completed optimizer steps.
    pub step: u64,
    /// The training settings saved with it (absent in checkpoints older than the field).
    pub config: Option<TrainConfig>,
}

/// Reads the step and training settings of the checkpoint `path` names (see
/// [`checkpoint::resolve`]) without loading its tensors.
pub fn resume_info(path: &Path) -> Result<ResumeInfo> {
    let dir = checkpoint::resolve(path)?;
    let file = dir.join("trainer.json");
    let text = std::fs::read_to_string(&file).map_err(|e| Error::Io(format!("{}: {e}", file.display())))?;
    let v: Value =
        serde_json::from_str(&text).map_err(|e| Error::Io(format!("{}: not valid JSON: {e}", file.display())))?;
    let step =
        v.get("step").and_then(Value::as_u64).ok_or_else(|| Error::Io(format!("{}: no 'step'", file.display())))?;
    let config = match v.get("train") {
        Some(t) => Some(TrainConfig::from_json(t).map_err(|e| Error::Io(format!("{}: {e}", file.display())))?),
        None => None,
    };
    Ok(ResumeInfo { dir, step, config })
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
        config.validate()?;
        model_config.validate()?;
        let model = Model::new(b, model_config, config.seed)?;
        let m = ParamSet::zeros(b, &model.net.specs)?;
        let v = ParamSet::zeros(b, &model.net.specs)?;
        let grads = ParamSet::zeros(b, &model.net.specs)?;
        let data_rng = Rng::new(config.seed.wrapping_add(1));
        Ok(Trainer { model, config, task, m, v, grads, step: 0, data_rng, saved: None, comm: Arc::new(SingleProcess) })
    }

    /// Continues the run saved in checkpoint `path` (an output directory or a `step-N`
    /// directory) for `config.steps` steps in all.
    pub fn resume(b: &dyn ComputeBackend, path: &Path, config: TrainConfig, task: Task) -> Result<Trainer> {
        config.validate()?;
        let (model, ckpt) = checkpoint::load_model(b, path)?;
        let (m, v) = checkpoint::load_moments(b, &ckpt.dir, &model.net.specs)?;
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
        if task.seq_len(&config) > model.config.max_seq {
            return Err(Error::value(
                "Trainer::resume",
                "seq_len",
                format!("≤ the checkpoint's max_seq {}", model.config.max_seq),
                task.seq_len(&config),
            ));
        }
        let grads = ParamSet::zeros(b, &model.net.specs)?;
        Ok(Trainer {
            model,
            config,
            task,
            m,
            v,
            grads,
            step,
            data_rng,
            saved: Some(ckpt.dir),
            comm: Arc::new(SingleProcess),
        })
    }

    /// Trains data-parallel with the other ranks of `comm`: rank 0's parameters and AdamW
    /// moments are copied to every rank (so all start from the same state whatever each
    /// loaded), and from now on every step averages gradients over the ranks.
    pub fn join(&mut self, b: &dyn ComputeBackend, comm: Arc<dyn Communicator>) -> Result<()> {
        let state = self.model.net.params.tensors.iter_mut().chain(&mut self.m.tensors).chain(&mut self.v.tensors);
        let mut state: Vec<&mut Tensor> = state.collect();
        comm.broadcast_tensors(b, &mut state, 0)?;
        // Every rank must be at the same step with the same data position; compare them.
        let here = [self.step as f32, (self.data_rng.state >> 40) as f32, (self.data_rng.state & 0xFF_FFFF) as f32];
        let mut most = here;
        comm.all_reduce(&mut most, ReduceOp::Max)?;
        if most != here {
            return Err(Error::value(
                "Trainer::join",
                format!("step and data position of rank {}", comm.rank()),
                "the same on every rank (resume every rank from the same checkpoint)",
                format!("step {}", self.step),
            ));
        }
        self.comm = comm;
        Ok(())
    }

    /// The processes this trainer trains with.
    pub fn communicator(&self) -> &Arc<dyn Communicator> {
        &self.comm
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

    /// One optimizer step: accumulate gradients over micro-batches, average them over
    /// the ranks, clip by global norm, AdamW on every parameter. A non-finite loss or
    /// gradient is an error and leaves the parameters untouched.
    ///
    /// A step draws `accumulation × world_size` micro-batches of the data in one sequence;
    /// rank `r` trains on micro-batches `r·accumulation ..` of them, so the ranks together
    /// see exactly what one process with `accumulation × world_size` sees, and the data
    /// position after a step is the same at any world size. The last micro-batch's backward
    /// starts averaging each bucket of gradients as it finishes them ([`GradSync`]).
    pub fn train_step(&mut self, b: &dyn ComputeBackend) -> Result<StepStats> {
        let step = self.step + 1;
        let seq = self.task.seq_len(&self.config);
        let accum = self.config.accumulation;
        let (rank, world) = (self.comm.rank(), self.comm.world_size());
        let comm = self.comm.clone();
        self.grads.fill_zero(b)?;
        let mut sync = GradSync::new(comm.as_ref(), self.grads.tensors.len(), DEFAULT_BUCKET_BYTES);
        let mut loss_sum = 0.0f64;
        for micro in 0..accum * world {
            let (ids, targets) = self.batch();
            if micro / accum != rank {
                continue;
            }
            let ids = host_u32(b, ids, self.config.batch, seq)?;
            let targets = host_u32(b, targets, self.config.batch, seq)?;
            let ignore = self.task.ignore_index();
            let scale = 1.0 / accum as f32;
            let loss = if micro % accum == accum - 1 {
                let mut ready = |g: &ParamSet, ids: &[usize]| sync.ready(b, g, ids);
                self.model.loss_and_grads_with(b, &ids, &targets, ignore, scale, &mut self.grads, &mut ready)?
            } else {
                self.model.loss_and_grads(b, &ids, &targets, ignore, scale, &mut self.grads)?
            };
            loss_sum += loss as f64;
        }
        sync.finish(b, &mut self.grads)?;
        let loss = if world > 1 {
            let mut l = [(loss_sum / accum as f64) as f32];
            self.comm.all_reduce(&mut l, ReduceOp::Average)?;
            l[0]
        } else {
            (loss_sum / accum as f64) as f32
        };
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
        for (i, spec) in self.model.net.specs.iter().enumerate() {
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
                &mut self.model.net.params.tensors[i],
                &self.grads.tensors[i],
                &mut self.m.tensors[i],
                &mut self.v.tensors[i],
                &hyper,
                step,
            )?;
        }
        self.step = step;
        self.saved = None;
        Ok(StepStats { step, loss, grad_norm, lr, tokens: self.config.batch * seq * accum * world })
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
            "world_size": self.comm.world_size(),
        })
    }

    /// Saves a checkpoint under `out` (see [`checkpoint::save`]) and returns its
    /// directory. The same step is never written twice: when `out/step-N` already holds
    /// this state (saved or resumed from, with no step since), it is returned as is.
    pub fn save(&mut self, b: &dyn ComputeBackend, out: &Path) -> Result<PathBuf> {
        let dir = out.join(format!("step-{}", self.step));
        if self.saved.as_deref().is_some_and(|s| same_path(s, &dir)) && checkpoint::is_complete(&dir) {
            return Ok(dir);
        }
        let dir = checkpoint::save(b, out, self.step, &self.model, Some((&self.m, &self.v)), &self.state_json())?;
        self.saved = Some(dir.clone());
        Ok(dir)
    }

    /// Whether the state at the current step is already saved in `out`.
    pub fn is_saved_in(&self, out: &Path) -> bool {
        let dir = out.join(format!("step-{}", self.step));
        self.saved.as_deref().is_some_and(|s| same_path(s, &dir))
    }
}

/// Whether two paths name the same file (compared canonically when both exist).
fn same_path(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Style;
    use crate::model::param_specs;
    use fusebox::CpuBackend;

    fn config() -> TrainConfig {
        TrainConfig {
            steps: 10,
            batch: 2,
            accumulation: 1,
            seq_len: 12,
            lr: 1e-3,
            min_lr_ratio: 0.1,
            warmup: 2,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            grad_clip: 1.0,
            seed: 3,
            eval_every: 0,
            eval_batches: 1,
        }
    }

    fn model_config() -> ModelConfig {
        ModelConfig { n_layers: 1, d_model: 16, d_ff: 32, ..ModelConfig::tiny(Style::Gpt2, addition::VOCAB, 16) }
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
    fn resume_refuses_batch_and_accumulation_zero() {
        let b = CpuBackend::with_threads(1).unwrap();
        let out = std::env::temp_dir().join(format!("fusebox-train-zero-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let mut t = Trainer::new(&b, model_config(), config(), Task::Addition(Addition::new(1))).unwrap();
        t.train_step(&b).unwrap();
        t.save(&b, &out).unwrap();
        for c in [TrainConfig { batch: 0, ..config() }, TrainConfig { accumulation: 0, ..config() }] {
            let e = Trainer::resume(&b, &out, c, Task::Addition(Addition::new(1))).unwrap_err();
            assert!(e.to_string().contains("at least 1"), "{e}");
        }
        std::fs::remove_dir_all(&out).unwrap();
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
        let cfg = model_config();
        let small = config().memory_estimate(&cfg, 12).unwrap();
        assert!(small >= 16 * cfg.param_count().unwrap(), "four f32 copies of the parameters at least");
        let big = TrainConfig { batch: 1000, ..config() }.memory_estimate(&cfg, 12).unwrap();
        assert!(big > small * 10);
        let huge = ModelConfig { n_layers: usize::MAX, ..cfg.clone() };
        assert_eq!(config().memory_estimate(&huge, 12), None);
        assert!(huge.validate().is_err());
        assert!(TrainConfig { batch: usize::MAX, ..config() }.memory_estimate(&cfg, usize::MAX).is_none());
    }

    #[cfg(unix)]
    #[test]
    fn the_same_step_is_never_saved_twice() {
        use std::os::unix::fs::MetadataExt;
        let b = CpuBackend::with_threads(1).unwrap();
        let out = std::env::temp_dir().join(format!("fusebox-train-once-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let mut t = Trainer::new(&b, model_config(), config(), Task::Addition(Addition::new(1))).unwrap();
        t.train_step(&b).unwrap();
        let dir = t.save(&b, &out).unwrap();
        let inode = |d: &Path| std::fs::metadata(d.join("model.safetensors")).unwrap().ino();
        let first = inode(&dir);
        // A --save-every save at the last step, then the final save: one write.
        assert_eq!(t.save(&b, &out).unwrap(), dir);
        assert_eq!(inode(&dir), first, "the second save rewrote the checkpoint");
        assert!(t.is_saved_in(&out));
        // A resumed trainer does not rewrite the checkpoint it came from.
        let mut r = Trainer::resume(&b, &out, config(), Task::Addition(Addition::new(1))).unwrap();
        assert_eq!(r.save(&b, &out).unwrap(), dir);
        assert_eq!(inode(&dir), first);
        // After a step the next save writes step 2.
        r.train_step(&b).unwrap();
        assert!(!r.is_saved_in(&out));
        assert!(r.save(&b, &out).unwrap().ends_with("step-2"));
        std::fs::remove_dir_all(&out).unwrap();
    }
}
