//! The training engine, one for every run: a [`Trainer`] over a parameter source
//! ([`ParamSource`]: a from-scratch [`Model`], or a pretrained model with every parameter
//! or LoRA adapters trained) and a data source ([`DataSource`]: the built-in tasks, or
//! token sequences of text and chat), with one optimizer step ([`AdamW::update`]:
//! finiteness check, global-norm clipping, AdamW, warmup + cosine schedule), one
//! checkpoint writer ([`checkpoint::save_contents`]) that resumes bit-identically, and a
//! [`Communicator`] that makes the run data-parallel.
//!
//! A step, in order:
//!
//! 1. zero the gradients;
//! 2. draw `accumulation × world_size` micro-batches; rank `r` computes the loss and
//!    gradients of micro-batches `r·accumulation ..` of them, each scaled by
//!    `1/accumulation`; the last one's backward starts averaging buckets of finished
//!    gradients over the ranks ([`GradSync`]);
//! 3. the loss is averaged over the ranks, then the optimizer step updates the trained
//!    tensors.
//!
//! Under ZeRO (`config.zero` ≥ 1, see [`ShardedAdamW`]) step 2 reduce-scatters the
//! buckets instead, each rank keeps the AdamW moments of its piece of the trained tensors
//! only, and step 3 updates that piece and all-gathers the parameters.

mod config;
mod data;
mod eval;
mod optimizer;
mod saved;
mod source;
mod zero;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fusebox::{ComputeBackend, Error, Result, Tensor};
use serde_json::{json, Value};

pub use self::config::{MemoryEstimate, TrainConfig};
pub use self::data::{Batch, DataSource, HeldOut, Task};
pub use self::eval::{evaluate, EvalStats};
pub use self::optimizer::{AdamW, Update};
pub use self::saved::{load_model, resume_info, ResumeInfo, Saved};
pub use self::source::ParamSource;
pub use self::zero::{GradShard, ShardedAdamW};
use crate::checkpoint::{self, Contents, MomentShard};
use crate::comm::{Communicator, ReduceOp, SingleProcess};
use crate::config::ModelConfig;
use crate::data_parallel::shard::ShardLayout;
use crate::data_parallel::{GradSync, DEFAULT_BUCKET_BYTES};
use crate::model::Model;
use crate::params::ParamSet;
use crate::rng::Rng;
use crate::transformer::{activation_bytes, Activations, LossOptions, NotListening};

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
    /// Tokens the step trained on, over every rank.
    pub tokens: usize,
}

/// Bytes a run holds in tensors (see [`Trainer::memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryReport {
    /// The model's parameters as stored (block formats at their block size).
    pub parameter_bytes: u64,
    /// The LoRA adapters (0 when every parameter is trained).
    pub adapter_bytes: u64,
    /// Gradients and AdamW's two moments of what is trained, as this rank holds them
    /// (`gradient_bytes + moment_bytes`).
    pub optimizer_bytes: u64,
    /// The gradients the backward writes (whole at every ZeRO stage).
    pub gradient_bytes: u64,
    /// The gradients kept between steps: whole, or none under `--zero 2` (its piece of the
    /// reduced gradient lives from the reduce-scatter to the end of the update).
    pub gradient_bytes_between_steps: u64,
    /// AdamW's two moments on this rank: its piece under ZeRO.
    pub moment_bytes: u64,
    /// The same unsharded (every trained tensor's).
    pub moment_bytes_whole: u64,
    /// The activations one micro-batch keeps for its backward, estimated
    /// ([`activation_bytes`]): as this run keeps them.
    pub activation_bytes: u64,
    /// The same without activation checkpointing (every block's activations).
    pub activation_bytes_saved: u64,
    /// The same with activation checkpointing (block inputs and one block's activations).
    pub activation_bytes_checkpointed: u64,
    /// The logits of one micro-batch and their gradient (f32, `batch × seq × vocab` each).
    pub logit_bytes: u64,
}

/// A training run: the model, its optimizer state, its data and data position.
#[derive(Debug)]
pub struct Trainer<S = Model, D = Task> {
    /// The model being trained.
    pub model: S,
    /// The training settings.
    pub config: TrainConfig,
    /// The data.
    pub data: D,
    /// Completed optimizer steps.
    pub step: u64,
    /// Where the data came from, saved in `trainer.json` (`"data_args"`) so that a
    /// resumed run can rebuild it; `Null` when the caller records nothing.
    pub data_args: Value,
    optimizer: Optimizer,
    /// Gradient buffers of what is trained, allocated once and zeroed in place each step
    /// (under `--zero 2`: allocated for the backward and freed after the reduce-scatter).
    grads: Option<ParamSet>,
    data_rng: Rng,
    /// The checkpoint directory holding the state at `step`, if one was saved or loaded:
    /// saving the same step into it again is skipped.
    saved: Option<PathBuf>,
    /// The processes training together ([`SingleProcess`] unless [`Trainer::join`]ed).
    comm: Arc<dyn Communicator>,
}

/// The AdamW state of a run.
#[derive(Debug)]
enum Optimizer {
    /// Every trained tensor's moments, on every rank.
    Whole(AdamW),
    /// This rank's ZeRO piece of them.
    Sharded(ShardedAdamW),
    /// Sharded, not built yet: the cut depends on the ranks, known once the trainer has
    /// joined them. Zeros, or read from this checkpoint directory.
    Pending(Option<PathBuf>),
}

impl Trainer<Model, Task> {
    /// A fresh from-scratch run: a model of `model_config` initialised from `config.seed`.
    pub fn scratch(b: &dyn ComputeBackend, model_config: ModelConfig, config: TrainConfig, task: Task) -> Result<Self> {
        config.validate()?;
        let model = Model::new(b, model_config, config.seed)?;
        Trainer::new(b, model, config, task)
    }
}

impl<S: ParamSource, D: DataSource> Trainer<S, D> {
    /// A fresh run of `model` on `data`; the data sampler starts from `config.seed + 1`.
    pub fn new(b: &dyn ComputeBackend, mut model: S, config: TrainConfig, data: D) -> Result<Self> {
        config.validate()?;
        model.net_mut().set_precision(config.precision);
        data.check(&model.net().arch, &config)?;
        let (specs, _) = model.trained();
        let optimizer =
            if config.zero == 0 { Optimizer::Whole(AdamW::zeros(b, specs)?) } else { Optimizer::Pending(None) };
        let grads = if config.zero < 2 { Some(ParamSet::zeros(b, specs)?) } else { None };
        let data_rng = Rng::new(config.seed.wrapping_add(1));
        Ok(Trainer {
            model,
            config,
            data,
            step: 0,
            data_args: Value::Null,
            optimizer,
            grads,
            data_rng,
            saved: None,
            comm: Arc::new(SingleProcess),
        })
    }

    /// Continues the run saved in `saved` (with `model` loaded from the same checkpoint)
    /// for `config.steps` steps in all: its AdamW moments, step and data position.
    pub fn resume(b: &dyn ComputeBackend, mut model: S, saved: &Saved, config: TrainConfig, data: D) -> Result<Self> {
        config.validate()?;
        model.net_mut().set_precision(config.precision);
        data.check(&model.net().arch, &config)?;
        let (specs, _) = model.trained();
        let optimizer = if config.zero == 0 {
            Optimizer::Whole(AdamW::load(b, &saved.dir, specs)?)
        } else {
            Optimizer::Pending(Some(saved.dir.clone()))
        };
        let grads = if config.zero < 2 { Some(ParamSet::zeros(b, specs)?) } else { None };
        Ok(Trainer {
            model,
            config,
            data,
            step: saved.step,
            data_args: saved.data_args(),
            optimizer,
            grads,
            data_rng: Rng { state: saved.data_rng },
            saved: Some(saved.dir.clone()),
            comm: Arc::new(SingleProcess),
        })
    }

    /// Trains data-parallel with the other ranks of `comm`: rank 0's trained tensors and
    /// AdamW moments are copied to every rank (so all start from the same state whatever
    /// each loaded), and from now on every step averages gradients over the ranks. Under
    /// ZeRO each rank instead builds its own piece of the moments (zeros, or read from the
    /// checkpoint resumed, which every rank must see).
    pub fn join(&mut self, b: &dyn ComputeBackend, comm: Arc<dyn Communicator>) -> Result<()> {
        let (_, params) = self.model.trained_mut();
        let mut state: Vec<&mut Tensor> = params.tensors.iter_mut().collect();
        if let Optimizer::Whole(opt) = &mut self.optimizer {
            let (m, v) = opt.moments_mut();
            state.extend(m.tensors.iter_mut().chain(&mut v.tensors));
        }
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

    /// Builds the sharded optimizer state for this rank if it is still pending.
    fn build_sharded(&mut self, b: &dyn ComputeBackend) -> Result<()> {
        if let Optimizer::Pending(from) = &self.optimizer {
            let (specs, _) = self.model.trained();
            let layout = shard_layout(specs, self.comm.world_size())?;
            let rank = self.comm.rank();
            let opt = match from {
                Some(dir) => ShardedAdamW::load(b, dir, specs, layout, rank)?,
                None => ShardedAdamW::zeros(b, layout, rank)?,
            };
            self.optimizer = Optimizer::Sharded(opt);
        }
        Ok(())
    }

    /// One optimizer step (see the module docs). A non-finite loss or gradient is an
    /// error and leaves the trained tensors untouched.
    ///
    /// Rank `r` of `world` trains on micro-batches `r·accumulation ..` of the
    /// `accumulation × world` the step draws, so the ranks together see exactly what one
    /// process with `accumulation × world` sees, and the data position after a step is
    /// the same at any world size.
    pub fn train_step(&mut self, b: &dyn ComputeBackend) -> Result<StepStats> {
        let step = self.step + 1;
        let accum = self.config.accumulation;
        let comm = self.comm.clone();
        let (rank, world) = (comm.rank(), comm.world_size());
        let ignore = self.data.ignore_index();
        let activations = self.config.activations();
        self.build_sharded(b)?;
        let grads = match &mut self.grads {
            Some(g) => {
                g.fill_zero(b)?;
                g
            }
            g @ None => g.insert(ParamSet::zeros(b, self.model.trained().0)?),
        };
        let layout = match &self.optimizer {
            Optimizer::Sharded(opt) => Some(opt.layout()),
            _ => None,
        };
        let mut sync = match layout {
            Some(layout) => GradSync::sharded(comm.as_ref(), layout, DEFAULT_BUCKET_BYTES),
            None => GradSync::new(comm.as_ref(), grads.tensors.len(), DEFAULT_BUCKET_BYTES),
        };
        let (mut loss_sum, mut tokens) = (0.0f64, 0usize);
        for micro in 0..accum * world {
            let batch = self.data.draw(&mut self.data_rng, &self.config);
            tokens += batch.tokens;
            if micro / accum != rank {
                continue;
            }
            let opts = LossOptions { ignore, grad_scale: 1.0 / accum as f32, activations };
            let loss = if micro % accum == accum - 1 {
                self.model.loss_and_grads(b, batch, opts, grads, &mut sync.listener(b))?
            } else {
                self.model.loss_and_grads(b, batch, opts, grads, &mut NotListening)?
            };
            loss_sum += loss as f64;
        }
        sync.finish(b, grads)?;
        let mut loss = [(loss_sum / accum as f64) as f32];
        if world > 1 {
            comm.all_reduce(&mut loss, ReduceOp::Average)?;
        }
        let (specs, params) = self.model.trained_mut();
        let update = match &mut self.optimizer {
            Optimizer::Whole(opt) => opt.update(b, &self.config, step, loss[0], specs, params, grads)?,
            Optimizer::Sharded(opt) if self.config.zero >= 2 => {
                // Only this rank's piece of the averaged gradient is kept (in the
                // optimizer's own buffer); the whole buffer goes until the next backward.
                opt.keep_gradient_piece(b, grads)?;
                self.grads = None;
                opt.update(b, comm.as_ref(), &self.config, step, loss[0], specs, params, GradShard::Kept)?
            }
            Optimizer::Sharded(opt) => {
                let shard = GradShard::InPlace(grads);
                opt.update(b, comm.as_ref(), &self.config, step, loss[0], specs, params, shard)?
            }
            Optimizer::Pending(_) => {
                return Err(Error::value("train_step", "optimizer state", "built", "pending"));
            }
        };
        self.step = step;
        self.saved = None;
        Ok(StepStats { step, loss: loss[0], grad_norm: update.grad_norm, lr: update.lr, tokens })
    }

    /// Held-out loss, and exact match where the data measures it (see [`evaluate`]).
    pub fn evaluate(&self, b: &dyn ComputeBackend) -> Result<EvalStats> {
        let held = self.data.held_out(&self.config)?;
        evaluate(b, self.model.net(), &held, self.data.ignore_index())
    }

    /// The trainer state written beside a checkpoint (`trainer.json`): the step, the data
    /// sampler's state, the settings, the ranks, the data, and the source's sections.
    pub fn state_json(&self) -> Value {
        let mut v = json!({
            "step": self.step,
            "data_rng": self.data_rng.state,
            "task": self.data.name(),
            "train": self.config.to_json(),
            "world_size": self.comm.world_size(),
            "data": self.data.description(),
        });
        if !self.data_args.is_null() {
            v["data_args"] = self.data_args.clone();
        }
        for (key, section) in self.model.checkpoint_state() {
            v[key] = section;
        }
        v
    }

    /// Saves a checkpoint under `out` (see [`checkpoint::save_contents`]) and returns its
    /// directory: the trained tensors, the AdamW moments, the source's `config.json` and
    /// files, and [`state_json`](Self::state_json). The same step is never written twice:
    /// when `out/step-N` already holds this state (saved or resumed from, with no step
    /// since), it is returned as is. Called on every rank: with whole moments rank 0 alone
    /// writes (the others return at once); under ZeRO every rank writes its piece of them
    /// ([`checkpoint::save_sharded`], collective).
    pub fn save(&mut self, b: &dyn ComputeBackend, out: &Path) -> Result<PathBuf> {
        let dir = out.join(format!("step-{}", self.step));
        let (rank, world) = (self.comm.rank(), self.comm.world_size());
        self.build_sharded(b)?;
        if let Optimizer::Whole(_) = self.optimizer {
            // Every rank holds the same state: rank 0 alone writes it.
            if rank != 0 || (self.is_saved_in(out) && checkpoint::is_complete(&dir)) {
                return Ok(dir);
            }
        } else {
            // Every rank writes its piece, so every rank must decide alike (rank 0's view
            // of the directory counts).
            let fresh = self.is_saved_in(out) && (rank != 0 || checkpoint::is_complete(&dir));
            let mut write = [f32::from(u8::from(!fresh))];
            if world > 1 {
                self.comm.all_reduce(&mut write, ReduceOp::Max)?;
            }
            if write[0] == 0.0 {
                return Ok(dir);
            }
        }
        let trainer = self.state_json();
        let (specs, params) = self.model.trained();
        let mut contents = Contents {
            specs,
            params,
            moments: None,
            config: self.model.checkpoint_config(),
            extra: self.model.checkpoint_files()?,
        };
        let dir = match &self.optimizer {
            Optimizer::Sharded(opt) => {
                let (m, v) = opt.values(b)?;
                let shard = MomentShard { stage: self.config.zero, layout: opt.layout(), m: &m, v: &v };
                checkpoint::save_sharded(b, self.comm.as_ref(), out, self.step, contents, &trainer, &shard)?
            }
            Optimizer::Whole(opt) => {
                contents.moments = Some(opt.moments());
                checkpoint::save_contents(b, out, self.step, &contents, &trainer)?
            }
            Optimizer::Pending(_) => return Err(Error::value("Trainer::save", "optimizer state", "built", "pending")),
        };
        self.saved = Some(dir.clone());
        Ok(dir)
    }

    /// Whether the state at the current step is already saved in `out`.
    pub fn is_saved_in(&self, out: &Path) -> bool {
        let dir = out.join(format!("step-{}", self.step));
        self.saved.as_deref().is_some_and(|s| same_path(s, &dir))
    }

    /// Bytes held in tensors: the model's parameters as stored, the adapters, and the
    /// gradients and moments of what is trained; and estimated, those of a micro-batch's
    /// activations (with and without checkpointing) and logits (at `u64::MAX` where the
    /// count overflows).
    pub fn memory(&self) -> MemoryReport {
        let bytes = |s: &ParamSet| s.tensors.iter().map(|t| t.byte_len() as u64).sum::<u64>();
        let net = self.model.net();
        let tokens = self.config.batch.saturating_mul(self.data.max_seq_len(&self.config));
        let activations = |a| activation_bytes(&net.arch, tokens, a).unwrap_or(u64::MAX);
        let (specs, _) = self.model.trained();
        let elems: u64 = specs.iter().map(|s| s.shape.elem_count() as u64).sum();
        let world = self.comm.world_size();
        let piece = match shard_layout(specs, world) {
            Ok(l) if self.config.zero > 0 => l.range(self.comm.rank()).len() as u64,
            _ => elems,
        };
        let gradient_bytes = 4 * elems;
        let moment_bytes = 8 * piece;
        MemoryReport {
            parameter_bytes: bytes(&net.params),
            adapter_bytes: net.lora.as_ref().map_or(0, |a| bytes(&a.params)),
            optimizer_bytes: gradient_bytes + moment_bytes,
            gradient_bytes,
            gradient_bytes_between_steps: if self.config.zero >= 2 { 0 } else { gradient_bytes },
            moment_bytes,
            moment_bytes_whole: 8 * elems,
            activation_bytes: activations(self.config.activations()),
            activation_bytes_saved: activations(Activations::Saved),
            activation_bytes_checkpointed: activations(Activations::Recomputed),
            logit_bytes: (tokens as u64).saturating_mul(net.arch.vocab_size as u64).saturating_mul(8),
        }
    }
}

/// The even ZeRO cut of the trained tensors `specs` over `world` ranks.
fn shard_layout(specs: &[crate::params::ParamSpec], world: usize) -> Result<ShardLayout> {
    let sizes: Vec<usize> = specs.iter().map(|s| s.shape.elem_count()).collect();
    ShardLayout::even(&sizes, world)
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
    use crate::data::addition::{self, Addition};
    use fusebox::CpuBackend;

    fn config() -> TrainConfig {
        TrainConfig {
            steps: 10,
            batch: 2,
            seq_len: 12,
            lr: 1e-3,
            warmup: 2,
            seed: 3,
            eval_every: 0,
            eval_batches: 1,
            ..TrainConfig::default()
        }
    }

    fn model_config() -> ModelConfig {
        ModelConfig { n_layers: 1, d_model: 16, d_ff: 32, ..ModelConfig::tiny(Style::Gpt2, addition::VOCAB, 16) }
    }

    fn scratch() -> Trainer {
        let b = CpuBackend::with_threads(1).unwrap();
        Trainer::scratch(&b, model_config(), config(), Task::Addition(Addition::new(1))).unwrap()
    }

    fn resume(b: &CpuBackend, out: &Path, c: TrainConfig) -> Result<Trainer> {
        let (model, saved) = load_model(b, out)?;
        Trainer::resume(b, model, &saved, c, Task::Addition(Addition::new(1)))
    }

    /// A trainer one step in, saved in a fresh directory `fusebox-train-{name}-{pid}`.
    fn saved_after_a_step(b: &CpuBackend, name: &str) -> (Trainer, PathBuf, PathBuf) {
        let out = std::env::temp_dir().join(format!("fusebox-train-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let mut t = scratch();
        t.train_step(b).unwrap();
        let dir = t.save(b, &out).unwrap();
        (t, out, dir)
    }

    #[test]
    fn resume_refuses_batch_and_accumulation_zero() {
        let b = CpuBackend::with_threads(1).unwrap();
        let (_, out, _) = saved_after_a_step(&b, "zero");
        for c in [TrainConfig { batch: 0, ..config() }, TrainConfig { accumulation: 0, ..config() }] {
            let e = resume(&b, &out, c).unwrap_err();
            assert!(e.to_string().contains("at least 1"), "{e}");
        }
        std::fs::remove_dir_all(&out).unwrap();
    }

    #[test]
    fn data_that_does_not_fit_the_model_is_refused_by_name() {
        let b = CpuBackend::with_threads(1).unwrap();
        let bytes = || Task::Random { vocab_size: 256 };
        let e = Trainer::scratch(&b, model_config(), config(), bytes()).unwrap_err().to_string();
        assert!(e.contains("vocab_size"), "{e}");
        let (wide, long) = (ModelConfig { vocab_size: 256, ..model_config() }, TrainConfig { seq_len: 17, ..config() });
        let e = Trainer::scratch(&b, wide, long, bytes()).unwrap_err().to_string();
        assert!(e.contains("seq_len") && e.contains("max_seq 16"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn the_same_step_is_never_saved_twice() {
        use std::os::unix::fs::MetadataExt;
        let b = CpuBackend::with_threads(1).unwrap();
        let (mut t, out, dir) = saved_after_a_step(&b, "once");
        let inode = |d: &Path| std::fs::metadata(d.join("model.safetensors")).unwrap().ino();
        let first = inode(&dir);
        // A --save-every save at the last step, then the final save: one write.
        assert_eq!(t.save(&b, &out).unwrap(), dir);
        assert_eq!(inode(&dir), first, "the second save rewrote the checkpoint");
        assert!(t.is_saved_in(&out));
        // A resumed trainer does not rewrite the checkpoint it came from.
        let mut r = resume(&b, &out, config()).unwrap();
        assert_eq!(r.save(&b, &out).unwrap(), dir);
        assert_eq!(inode(&dir), first);
        // After a step the next save writes step 2.
        r.train_step(&b).unwrap();
        assert!(!r.is_saved_in(&out));
        assert!(r.save(&b, &out).unwrap().ends_with("step-2"));
        std::fs::remove_dir_all(&out).unwrap();
    }
}
