//! Fine-tuning a pretrained model (`fusebox train --init MODEL`): a GGUF file or a
//! Hugging Face directory of any architecture the one [`Transformer`] loads, trained
//! in f32 (block formats dequantized at load) with the from-scratch trainer's AdamW,
//! global-norm clipping, warmup + cosine schedule, and crash-safe checkpoints that
//! resume bit-identically, on [`crate::data::sequences`] data in the model's tokens.
//!
//! # The checkpoint (the contract with `fusebox export`)
//!
//! A fine-tuning run's `step-N/` holds what a from-scratch checkpoint holds —
//! `model.safetensors` (every parameter, fusebox's names and `[out, in]` layout, f32),
//! `optimizer.safetensors` (AdamW's `m.*`/`v.*`), `config.json`, `trainer.json` written
//! last — plus:
//!
//! - `arch.json`: the [`crate::transformer::Arch`] (see [`arch_json`]);
//! - `trainer.json` → `"finetune"`: `{"base": absolute path of the base model,
//!   "base_kind": "gguf" | "hf", "method": "full", "stacking": {"qkv", "gate_up"},
//!   "data": description}`;
//! - for an HF base, copies of its `tokenizer.json` (and `tokenizer_config.json`);
//!   for a GGUF base, the base file is the tokenizer's source;
//! - `chat_template.jinja` when the model has a chat template.
//!
//! `config.json` is `{"fusebox_finetune": {"base", "base_kind"}}` (neither a
//! from-scratch `style` nor a Hugging Face `model_type`). Readers call one function,
//! [`load_merged`], which returns the f32 network, where its tokenizer comes from, and
//! the chat template.

pub mod arch_json;

use std::path::{Path, PathBuf};

use fusebox::{AdamWConfig, ComputeBackend, Error, Result, Tensor};
use serde_json::{json, Value};

use crate::chat::ChatTemplate;
use crate::checkpoint::{self, Contents};
use crate::data::sequences::{self, Sequences, IGNORE};
use crate::files;
use crate::gguf::GgufFile;
use crate::params::ParamSet;
use crate::pretrained::Pretrained;
use crate::rng::Rng;
use crate::safetensors::SafeTensors;
use crate::sampler::argmax;
use crate::tokenizer::Tokenizer;
use crate::train::{EvalStats, StepStats, TrainConfig};
use crate::transformer::{layout, Adapters, LoraConfig, Stacking, Transformer};
use crate::weights::{self, Purpose};

/// What a base model file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseKind {
    /// A GGUF file.
    Gguf,
    /// A Hugging Face directory (`config.json`, safetensors, `tokenizer.json`).
    Hf,
}

impl BaseKind {
    /// `"gguf"` or `"hf"`.
    pub fn name(self) -> &'static str {
        match self {
            BaseKind::Gguf => "gguf",
            BaseKind::Hf => "hf",
        }
    }
}

/// The pretrained model a run starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base {
    /// Absolute path of the file or directory.
    pub path: PathBuf,
    /// What it is.
    pub kind: BaseKind,
}

impl Base {
    /// A directory is a Hugging Face model, a file a GGUF file; the path is made absolute.
    pub fn detect(path: &Path) -> Result<Base> {
        let meta = std::fs::metadata(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
        let path = path.canonicalize().map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
        let kind = if meta.is_dir() { BaseKind::Hf } else { BaseKind::Gguf };
        Ok(Base { path, kind })
    }

    fn to_json(&self) -> Value {
        json!({"base": self.path.display().to_string(), "base_kind": self.kind.name()})
    }

    fn from_json(v: &Value, file: &Path) -> Result<Base> {
        let path = v.get("base").and_then(Value::as_str);
        let kind = match v.get("base_kind").and_then(Value::as_str) {
            Some("gguf") => Some(BaseKind::Gguf),
            Some("hf") => Some(BaseKind::Hf),
            _ => None,
        };
        match (path, kind) {
            (Some(p), Some(kind)) => Ok(Base { path: PathBuf::from(p), kind }),
            _ => Err(Error::Io(format!(
                "{}: 'finetune' needs \"base\" (a path) and \"base_kind\" (\"gguf\" or \"hf\")",
                file.display()
            ))),
        }
    }
}

/// Where a model's tokenizer is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenizerSource {
    /// The metadata of this GGUF file.
    Gguf(PathBuf),
    /// `tokenizer.json` (and `tokenizer_config.json`) in this directory.
    Hf(PathBuf),
}

impl TokenizerSource {
    /// Reads the tokenizer.
    pub fn load(&self) -> Result<Tokenizer> {
        match self {
            TokenizerSource::Gguf(p) => {
                let file = GgufFile::open(p).map_err(|e| Error::Io(format!("{}: {e}", p.display())))?;
                Tokenizer::from_gguf(file.metadata()).map_err(|e| Error::Io(format!("{}: {e}", p.display())))
            }
            TokenizerSource::Hf(d) => Tokenizer::from_hf_dir(d).map_err(|e| Error::Io(format!("{}: {e}", d.display()))),
        }
    }

    /// The chat template source the files carry, if any.
    fn template_source(&self) -> Result<Option<String>> {
        match self {
            TokenizerSource::Gguf(p) => {
                let file = GgufFile::open(p)?;
                Ok(file.metadata().get_str("tokenizer.chat_template")?.map(str::to_owned))
            }
            TokenizerSource::Hf(d) => {
                let path = d.join("tokenizer_config.json");
                if !path.exists() {
                    return Ok(None);
                }
                let v = files::read_json(&path, "tokenizer_config.json", files::MAX_CONFIG_BYTES)?;
                match v.get("chat_template") {
                    None | Some(Value::Null) => Ok(None),
                    Some(Value::String(s)) => Ok(Some(s.clone())),
                    Some(_) => Err(Error::unsupported(
                        "fine-tuning",
                        format!(
                            "{}: chat_template is not a string (named templates are not supported here)",
                            path.display()
                        ),
                    )),
                }
            }
        }
    }
}

/// A network ready to train with its tokenizer, chat template and base.
pub struct Loaded {
    /// The trainable f32 network.
    pub net: Transformer,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Its chat template (the file's, or the fallback [`ChatTemplate::for_tokenizer`]
    /// picks); `None` when the file's does not parse.
    pub template: Option<ChatTemplate>,
    /// Why there is no template, when there is none.
    pub template_error: Option<String>,
    /// The base model.
    pub base: Base,
    /// Where the tokenizer is read from.
    pub tokenizer_source: TokenizerSource,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("arch", &self.net.arch.name)
            .field("base", &self.base)
            .field("vocab", &self.tokenizer.vocab_size())
            .field("template", &self.template.is_some())
            .finish()
    }
}

impl Loaded {
    /// The chat template, or an error saying why there is none.
    pub fn chat_template(&self) -> Result<&ChatTemplate> {
        self.template.as_ref().ok_or_else(|| {
            Error::unsupported(
                "chat data",
                format!(
                    "{} has no usable chat template{}",
                    self.base.path.display(),
                    self.template_error.as_deref().map(|e| format!(": {e}")).unwrap_or_default()
                ),
            )
        })
    }

    /// The input id of padding positions (their targets are ignored): the tokenizer's
    /// pad, else EOS, else 0.
    pub fn pad_id(&self) -> u32 {
        self.tokenizer.pad_id().or(self.tokenizer.eos_id()).unwrap_or(0)
    }
}

fn template_of(source: Option<&str>, tok: &Tokenizer) -> (Option<ChatTemplate>, Option<String>) {
    match ChatTemplate::for_tokenizer(source, tok) {
        Ok(t) => (Some(t), None),
        Err(e) => (None, Some(e.to_string())),
    }
}

fn check_vocab(net: &Transformer, tok: &Tokenizer, origin: &Path) -> Result<()> {
    if tok.vocab_size() > net.arch.vocab_size {
        return Err(Error::Io(format!(
            "{}: the tokenizer has {} tokens but the model's embedding only {} rows",
            origin.display(),
            tok.vocab_size(),
            net.arch.vocab_size
        )));
    }
    Ok(())
}

/// Loads a pretrained model to fine-tune: every parameter f32 (block formats
/// dequantized), with its tokenizer and chat template.
pub fn load_base(b: &dyn ComputeBackend, path: &Path) -> Result<Loaded> {
    load_base_for(b, path, Purpose::Training)
}

/// Loads a pretrained model for `purpose`: [`Purpose::Training`] (full fine-tuning, f32)
/// or [`Purpose::Frozen`] (a LoRA base: block formats kept).
pub fn load_base_for(b: &dyn ComputeBackend, path: &Path, purpose: Purpose) -> Result<Loaded> {
    let base = Base::detect(path)?;
    let at = |e: Error| Error::Io(format!("{}: {e}", base.path.display()));
    let (net, source) = match base.kind {
        BaseKind::Gguf => {
            let file = GgufFile::open(&base.path).map_err(at)?;
            (weights::load_gguf_for(b, &file, purpose).map_err(at)?, TokenizerSource::Gguf(base.path.clone()))
        }
        BaseKind::Hf => {
            (weights::load_hf_for(b, &base.path, purpose).map_err(at)?, TokenizerSource::Hf(base.path.clone()))
        }
    };
    let tokenizer = source.load()?;
    check_vocab(&net, &tokenizer, &base.path)?;
    let (template, template_error) = template_of(source.template_source()?.as_deref(), &tokenizer);
    Ok(Loaded { net, tokenizer, template, template_error, base, tokenizer_source: source })
}

/// What a fine-tuning checkpoint says besides its network.
#[derive(Debug, Clone)]
pub struct Saved {
    /// The `step-N` directory.
    pub dir: PathBuf,
    /// Completed optimizer steps.
    pub step: u64,
    /// The data sampler's state.
    pub data_rng: u64,
    /// Its `trainer.json`.
    pub trainer: Value,
}

/// Whether the checkpoint `path` names (see [`checkpoint::resolve`]) is a fine-tuning
/// run's.
pub fn is_finetune_checkpoint(path: &Path) -> bool {
    checkpoint::resolve(path)
        .ok()
        .and_then(|d| files::read_json(&d.join("trainer.json"), "trainer.json", 64 << 20).ok())
        .is_some_and(|v| v.get("finetune").is_some())
}

/// Loads a fine-tuning checkpoint (an output directory or a `step-N` directory). A LoRA
/// checkpoint's base is read again (frozen, block formats kept) and its adapters
/// attached, ready to resume.
pub fn load_checkpoint(b: &dyn ComputeBackend, path: &Path) -> Result<(Loaded, Saved)> {
    load_checkpoint_as(b, path, Purpose::Frozen)
}

/// The LoRA settings a checkpoint's `trainer.json` records (`None` for full fine-tuning).
pub fn lora_of(trainer: &Value, file: &Path) -> Result<Option<LoraConfig>> {
    let ft = trainer.get("finetune");
    match ft.and_then(|f| f.get("method")).and_then(Value::as_str) {
        Some("lora") => {
            let cfg = ft
                .and_then(|f| f.get("lora"))
                .ok_or_else(|| Error::Io(format!("{}: a LoRA checkpoint without 'finetune.lora'", file.display())))?;
            LoraConfig::from_json(cfg).map(Some).map_err(|e| Error::Io(format!("{}: {e}", file.display())))
        }
        _ => Ok(None),
    }
}

/// [`load_checkpoint`] with the base of a LoRA checkpoint loaded for `base_purpose`
/// (`Frozen` to train on, `Training` for f32 weights to merge into).
fn load_checkpoint_as(b: &dyn ComputeBackend, path: &Path, base_purpose: Purpose) -> Result<(Loaded, Saved)> {
    let dir = checkpoint::resolve(path)?;
    let trainer_file = dir.join("trainer.json");
    let trainer = files::read_json(&trainer_file, "trainer.json", 64 << 20)?;
    let ft = trainer.get("finetune").ok_or_else(|| {
        Error::Io(format!("{}: no 'finetune' section: not a fine-tuning checkpoint", trainer_file.display()))
    })?;
    let base = Base::from_json(ft, &trainer_file)?;
    if let Some(cfg) = lora_of(&trainer, &trainer_file)? {
        return load_lora_checkpoint(b, dir, trainer, base, cfg, base_purpose);
    }
    let arch_file = dir.join("arch.json");
    let arch = arch_json::from_json(&files::read_json(&arch_file, "arch.json", 64 << 20)?)
        .map_err(|e| Error::Io(format!("{}: {e}", arch_file.display())))?;
    let flag = |k: &str| ft.get("stacking").and_then(|s| s.get(k)).and_then(Value::as_bool).unwrap_or(false);
    let stacking = Stacking { qkv: flag("qkv"), gate_up: flag("gate_up") };
    let (specs, index) = layout(&arch, |_| stacking);
    let file = dir.join("model.safetensors");
    let st = SafeTensors::read(&file)?;
    let params = checkpoint::load_set(b, &st, &specs, "", &file)?;
    let net = Transformer::trainable_from(arch, specs, index, params)?;
    let source = match base.kind {
        BaseKind::Hf => TokenizerSource::Hf(dir.clone()),
        BaseKind::Gguf => TokenizerSource::Gguf(base.path.clone()),
    };
    let tokenizer = source.load()?;
    check_vocab(&net, &tokenizer, &dir)?;
    let template_file = dir.join("chat_template.jinja");
    let template_src = if template_file.exists() {
        Some(files::read_text(&template_file, "chat_template.jinja", files::MAX_CONFIG_BYTES)?)
    } else {
        None
    };
    let (template, template_error) = match &template_src {
        Some(s) => template_of(Some(s), &tokenizer),
        None => (None, Some(format!("{} has no chat_template.jinja", dir.display()))),
    };
    let field = |name: &str| {
        trainer
            .get(name)
            .and_then(Value::as_u64)
            .ok_or_else(|| Error::Io(format!("{}: no '{name}' (a non-negative integer)", trainer_file.display())))
    };
    let saved = Saved { step: field("step")?, data_rng: field("data_rng")?, dir, trainer: trainer.clone() };
    Ok((Loaded { net, tokenizer, template, template_error, base, tokenizer_source: source }, saved))
}

fn read_template(dir: &Path, tokenizer: &Tokenizer) -> Result<(Option<ChatTemplate>, Option<String>)> {
    let template_file = dir.join("chat_template.jinja");
    Ok(if template_file.exists() {
        template_of(Some(&files::read_text(&template_file, "chat_template.jinja", files::MAX_CONFIG_BYTES)?), tokenizer)
    } else {
        (None, Some(format!("{} has no chat_template.jinja", dir.display())))
    })
}

fn saved_of(dir: PathBuf, trainer: Value) -> Result<Saved> {
    let trainer_file = dir.join("trainer.json");
    let field = |name: &str| {
        trainer
            .get(name)
            .and_then(Value::as_u64)
            .ok_or_else(|| Error::Io(format!("{}: no '{name}' (a non-negative integer)", trainer_file.display())))
    };
    Ok(Saved { step: field("step")?, data_rng: field("data_rng")?, dir, trainer: trainer.clone() })
}

/// A LoRA checkpoint: the base (from its recorded path) with the saved adapters attached.
fn load_lora_checkpoint(
    b: &dyn ComputeBackend,
    dir: PathBuf,
    trainer: Value,
    base: Base,
    cfg: LoraConfig,
    purpose: Purpose,
) -> Result<(Loaded, Saved)> {
    let mut loaded = load_base_for(b, &base.path, purpose).map_err(|e| {
        Error::Io(format!("{}: the LoRA checkpoint's base {}: {e}", dir.display(), base.path.display()))
    })?;
    let arch_file = dir.join("arch.json");
    let arch = arch_json::from_json(&files::read_json(&arch_file, "arch.json", 64 << 20)?)
        .map_err(|e| Error::Io(format!("{}: {e}", arch_file.display())))?;
    if arch_json::to_json(&arch) != arch_json::to_json(&loaded.net.arch) {
        return Err(Error::Io(format!(
            "{}: the base {} is not the model this checkpoint was trained on (its architecture differs)",
            arch_file.display(),
            base.path.display()
        )));
    }
    let specs = Adapters::specs_for(&arch, &cfg)?;
    let file = dir.join("model.safetensors");
    let params = checkpoint::load_set(b, &SafeTensors::read(&file)?, &specs, "", &file)?;
    loaded.net.attach_lora(Adapters::with_params(&arch, cfg, params)?)?;
    if base.kind == BaseKind::Hf {
        loaded.tokenizer_source = TokenizerSource::Hf(dir.clone());
    }
    let (template, template_error) = read_template(&dir, &loaded.tokenizer)?;
    loaded.template = template;
    loaded.template_error = template_error;
    Ok((loaded, saved_of(dir, trainer)?))
}

/// The model of a fine-tuning checkpoint for export and inference: the f32 network (a
/// LoRA checkpoint's adapters merged, `W' = W + (α/r)·B·A`, into its dequantized base),
/// where its tokenizer is read from ([`TokenizerSource::load`]), and the chat template's
/// Jinja source.
pub fn load_merged(
    b: &dyn ComputeBackend,
    checkpoint: &Path,
) -> Result<(Transformer, TokenizerSource, Option<String>)> {
    let (loaded, _) = load_merged_checkpoint(b, checkpoint)?;
    let template = loaded.template.as_ref().map(|t| t.source().to_string());
    Ok((loaded.net, loaded.tokenizer_source, template))
}

/// A fine-tuning checkpoint as a [`Pretrained`] model for `fusebox generate`/`chat`
/// (the f32 network as trained, run through the KV cache).
pub fn load_pretrained(b: &dyn ComputeBackend, checkpoint: &Path) -> Result<Pretrained> {
    let (loaded, saved) = load_merged_checkpoint(b, checkpoint)?;
    let a = &loaded.net.arch;
    let description = format!(
        "fine-tuned {} ({} layers, d_model {}, vocab {}; f32, step {} of {})",
        a.name,
        a.n_layers,
        a.d_model,
        a.vocab_size,
        saved.step,
        loaded.base.path.display()
    );
    Ok(Pretrained {
        network: loaded.net,
        tokenizer: loaded.tokenizer,
        chat_template: loaded.template,
        chat_template_error: loaded.template_error,
        path: saved.dir,
        description,
    })
}

/// The LoRA adapters of a checkpoint without its base: the architecture, the adapters
/// and the base they were trained on (for `fusebox export --format peft`). An error
/// when the checkpoint is a full fine-tuning one.
pub fn load_adapters(b: &dyn ComputeBackend, checkpoint: &Path) -> Result<(crate::transformer::Arch, Adapters, Base)> {
    let dir = checkpoint::resolve(checkpoint)?;
    let trainer_file = dir.join("trainer.json");
    let trainer = files::read_json(&trainer_file, "trainer.json", 64 << 20)?;
    let ft = trainer.get("finetune").ok_or_else(|| {
        Error::Io(format!("{}: no 'finetune' section: not a fine-tuning checkpoint", trainer_file.display()))
    })?;
    let base = Base::from_json(ft, &trainer_file)?;
    let cfg = lora_of(&trainer, &trainer_file)?.ok_or_else(|| {
        Error::unsupported(
            "export --format peft",
            format!("{} is a full fine-tuning checkpoint (no LoRA adapters)", dir.display()),
        )
    })?;
    let arch_file = dir.join("arch.json");
    let arch = arch_json::from_json(&files::read_json(&arch_file, "arch.json", 64 << 20)?)
        .map_err(|e| Error::Io(format!("{}: {e}", arch_file.display())))?;
    let specs = Adapters::specs_for(&arch, &cfg)?;
    let file = dir.join("model.safetensors");
    let params = checkpoint::load_set(b, &SafeTensors::read(&file)?, &specs, "", &file)?;
    let adapters = Adapters::with_params(&arch, cfg, params)?;
    Ok((arch, adapters, base))
}

/// A checkpoint with LoRA adapters merged into an f32 base.
fn load_merged_checkpoint(b: &dyn ComputeBackend, checkpoint: &Path) -> Result<(Loaded, Saved)> {
    let (mut loaded, saved) = load_checkpoint_as(b, checkpoint, Purpose::Training)?;
    loaded.net.merge_lora(b)?;
    Ok((loaded, saved))
}

/// A fine-tuning run: the network, its optimizer state and its data position.
#[derive(Debug)]
pub struct FineTuner {
    /// The model being trained, with its tokenizer and base.
    pub model: Loaded,
    /// The training settings.
    pub config: TrainConfig,
    /// The data.
    pub data: Sequences,
    /// Completed optimizer steps.
    pub step: u64,
    /// Where the data came from (saved in `trainer.json` → `finetune.data_args`, so a
    /// resumed run rebuilds the same sequences).
    pub data_args: Value,
    m: ParamSet,
    v: ParamSet,
    grads: ParamSet,
    data_rng: Rng,
    saved: Option<PathBuf>,
}

/// The specs of what a run trains: the adapters under LoRA, else every parameter.
fn trained_specs(net: &Transformer) -> &[crate::params::ParamSpec] {
    match &net.lora {
        Some(ad) => &ad.specs,
        None => &net.specs,
    }
}

/// Bytes a fine-tuning run holds in tensors (see [`FineTuner::memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryReport {
    /// The model's parameters as stored (block formats at their block size).
    pub parameter_bytes: u64,
    /// The LoRA adapters (0 for full fine-tuning).
    pub adapter_bytes: u64,
    /// Gradients and AdamW's two moments of what is trained.
    pub optimizer_bytes: u64,
}

fn upload_u32(b: &dyn ComputeBackend, v: Vec<u32>, rows: usize, cols: usize) -> Result<Tensor> {
    b.upload(&Tensor::from_vec(v, [rows, cols])?)
}

impl FineTuner {
    /// A fresh run from a loaded base.
    pub fn new(b: &dyn ComputeBackend, model: Loaded, config: TrainConfig, data: Sequences) -> Result<FineTuner> {
        config.validate()?;
        Self::check_data(&model, &data)?;
        let specs = trained_specs(&model.net);
        let (m, v, grads) = (ParamSet::zeros(b, specs)?, ParamSet::zeros(b, specs)?, ParamSet::zeros(b, specs)?);
        let data_rng = Rng::new(config.seed.wrapping_add(1));
        Ok(FineTuner { model, config, data, step: 0, data_args: Value::Null, m, v, grads, data_rng, saved: None })
    }

    /// Continues a saved run (see [`load_checkpoint`]) for `config.steps` steps in all.
    pub fn resume(
        b: &dyn ComputeBackend,
        model: Loaded,
        saved: &Saved,
        config: TrainConfig,
        data: Sequences,
    ) -> Result<FineTuner> {
        config.validate()?;
        Self::check_data(&model, &data)?;
        let specs = trained_specs(&model.net);
        let (m, v) = checkpoint::load_moments(b, &saved.dir, specs)?;
        let grads = ParamSet::zeros(b, specs)?;
        Ok(FineTuner {
            model,
            config,
            data,
            step: saved.step,
            data_args: saved.trainer.get("finetune").and_then(|f| f.get("data_args")).cloned().unwrap_or(Value::Null),
            m,
            v,
            grads,
            data_rng: Rng { state: saved.data_rng },
            saved: Some(saved.dir.clone()),
        })
    }

    fn check_data(model: &Loaded, data: &Sequences) -> Result<()> {
        let (vocab, ctx) = (model.net.arch.vocab_size, model.net.arch.context_length);
        for s in data.train.iter().chain(&data.valid) {
            if s.ids.len() > ctx {
                return Err(Error::value(
                    "fine-tuning data",
                    "sequence length",
                    format!("≤ the model's context length {ctx}"),
                    s.ids.len(),
                ));
            }
            if let Some(&bad) =
                s.ids.iter().chain(s.targets.iter().filter(|&&t| t != IGNORE)).find(|&&t| t as usize >= vocab)
            {
                return Err(Error::value("fine-tuning data", "token id", format!("< vocab size {vocab}"), bad));
            }
        }
        if data.train.is_empty() || data.valid.is_empty() {
            return Err(Error::value(
                "fine-tuning data",
                "sequences",
                "at least one for training and one held out",
                format!("{} and {}", data.train.len(), data.valid.len()),
            ));
        }
        Ok(())
    }

    /// One optimizer step: `accumulation` micro-batches of `batch` random training
    /// sequences, global-norm clipping, AdamW on every parameter (the from-scratch
    /// trainer's step). A non-finite loss or gradient is an error and leaves the
    /// parameters untouched.
    pub fn train_step(&mut self, b: &dyn ComputeBackend) -> Result<StepStats> {
        let step = self.step + 1;
        let accum = self.config.accumulation;
        let pad = self.model.pad_id();
        self.grads.fill_zero(b)?;
        let (mut loss_sum, mut tokens) = (0.0f64, 0usize);
        for _ in 0..accum {
            let picks: Vec<&sequences::Sequence> =
                (0..self.config.batch).map(|_| &self.data.train[self.data_rng.below(self.data.train.len())]).collect();
            let (ids, targets, t) = sequences::batch(&picks, pad);
            tokens += picks.iter().map(|s| s.ids.len()).sum::<usize>();
            let ids = upload_u32(b, ids, picks.len(), t)?;
            let targets = upload_u32(b, targets, picks.len(), t)?;
            let net = &self.model.net;
            let scale = 1.0 / accum as f32;
            loss_sum += if net.lora.is_some() {
                net.lora_loss_and_grads(b, &ids, &targets, Some(IGNORE), scale, &mut self.grads)?
            } else {
                net.loss_and_grads(b, &ids, &targets, Some(IGNORE), scale, &mut self.grads)?
            } as f64;
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
        let net = &mut self.model.net;
        let (specs, params) = match &mut net.lora {
            Some(ad) => (&ad.specs, &mut ad.params),
            None => (&net.specs, &mut net.params),
        };
        for (i, spec) in specs.iter().enumerate() {
            let hyper = AdamWConfig {
                lr,
                beta1: self.config.beta1,
                beta2: self.config.beta2,
                eps: 1e-8,
                weight_decay: if spec.decay { self.config.weight_decay } else { 0.0 },
                grad_scale: clip,
            };
            b.adamw_update(
                &mut params.tensors[i],
                &self.grads.tensors[i],
                &mut self.m.tensors[i],
                &mut self.v.tensors[i],
                &hyper,
                step,
            )?;
        }
        self.step = step;
        self.saved = None;
        Ok(StepStats { step, loss, grad_norm, lr, tokens })
    }

    /// Held-out loss (mean over counted tokens) and, for chat data, greedy exact match
    /// (see [`evaluate`]).
    pub fn evaluate(&self, b: &dyn ComputeBackend) -> Result<EvalStats> {
        let limit = if self.data.answers { usize::MAX } else { self.config.eval_batches.max(1) * self.config.batch };
        evaluate(b, &self.model.net, &self.data, self.model.pad_id(), self.config.batch, limit)
    }

    /// The trainer state written beside a checkpoint.
    pub fn state_json(&self) -> Value {
        let specs = &self.model.net.specs;
        let stacked = |part: &str| specs.iter().any(|s| s.name.contains(part));
        let mut ft = self.model.base.to_json();
        match &self.model.net.lora {
            Some(ad) => {
                ft["method"] = json!("lora");
                ft["lora"] = ad.config.to_json();
            }
            None => ft["method"] = json!("full"),
        }
        ft["stacking"] = json!({"qkv": stacked(".attn.qkv."), "gate_up": stacked(".mlp.gate_up.")});
        ft["data"] = json!(self.data.description);
        ft["data_args"] = self.data_args.clone();
        json!({
            "step": self.step,
            "data_rng": self.data_rng.state,
            "task": "finetune",
            "train": self.config.to_json(),
            "finetune": ft,
        })
    }

    /// Saves a checkpoint `out/step-N` (see the module docs); the same step is never
    /// written twice.
    pub fn save(&mut self, b: &dyn ComputeBackend, out: &Path) -> Result<PathBuf> {
        let dir = out.join(format!("step-{}", self.step));
        if self.is_saved_in(out) && checkpoint::is_complete(&dir) {
            return Ok(dir);
        }
        let to_bytes = |v: &Value| serde_json::to_vec_pretty(v).map_err(|e| Error::Io(e.to_string()));
        let mut extra = vec![("arch.json".to_string(), to_bytes(&arch_json::to_json(&self.model.net.arch))?)];
        if let TokenizerSource::Hf(src) = &self.model.tokenizer_source {
            for name in ["tokenizer.json", "tokenizer_config.json"] {
                let p = src.join(name);
                if p.exists() {
                    let bytes = std::fs::read(&p).map_err(|e| Error::Io(format!("{}: {e}", p.display())))?;
                    extra.push((name.to_string(), bytes));
                }
            }
        }
        if let Some(t) = &self.model.template {
            extra.push(("chat_template.jinja".to_string(), t.source().as_bytes().to_vec()));
        }
        let net = &self.model.net;
        let (specs, params) = match &net.lora {
            Some(ad) => (&ad.specs[..], &ad.params),
            None => (&net.specs[..], &net.params),
        };
        let contents = Contents {
            specs,
            params,
            moments: Some((&self.m, &self.v)),
            config: json!({"fusebox_finetune": self.model.base.to_json()}),
            extra,
        };
        let dir = checkpoint::save_contents(b, out, self.step, &contents, &self.state_json())?;
        self.saved = Some(dir.clone());
        Ok(dir)
    }

    /// Bytes held in tensors: the model's parameters as stored, the adapters, and the
    /// gradients and moments of what is trained.
    pub fn memory(&self) -> MemoryReport {
        let bytes = |s: &ParamSet| s.tensors.iter().map(|t| t.byte_len() as u64).sum::<u64>();
        MemoryReport {
            parameter_bytes: bytes(&self.model.net.params),
            adapter_bytes: self.model.net.lora.as_ref().map_or(0, |a| bytes(&a.params)),
            optimizer_bytes: bytes(&self.grads) + bytes(&self.m) + bytes(&self.v),
        }
    }

    /// Whether the state at the current step is already saved in `out`.
    pub fn is_saved_in(&self, out: &Path) -> bool {
        let dir = out.join(format!("step-{}", self.step));
        self.saved.as_ref().is_some_and(|s| match (s.canonicalize(), dir.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => *s == dir,
        })
    }
}

/// Held-out loss of `net` on up to `limit` of `data.valid` (mean over counted
/// tokens), in batches of `batch`; with `data.answers`, exact match too: the share of
/// sequences whose every counted target is the arg-max of its logits. That is greedy
/// decoding's exact match: greedy reproduces the answer iff at every answer position the
/// arg-max given the correct prefix is the correct token.
pub fn evaluate(
    b: &dyn ComputeBackend,
    net: &Transformer,
    data: &Sequences,
    pad: u32,
    batch: usize,
    limit: usize,
) -> Result<EvalStats> {
    let valid: Vec<&sequences::Sequence> = data.valid.iter().take(limit).collect();
    let (mut loss_sum, mut counted, mut correct) = (0.0f64, 0usize, 0usize);
    let v = net.arch.vocab_size;
    for chunk in valid.chunks(batch.max(1)) {
        let (ids, targets, t) = sequences::batch(chunk, pad);
        let ids_t = upload_u32(b, ids, chunk.len(), t)?;
        let (logits, _) = net.forward(b, &ids_t)?;
        let n_counted: usize = chunk.iter().map(|s| s.counted()).sum();
        if n_counted == 0 {
            continue;
        }
        let targets_t = b.upload(&Tensor::from_vec(targets.clone(), [chunk.len() * t])?)?;
        let ce = b.cross_entropy(&logits, &targets_t, Some(IGNORE))?;
        loss_sum += b.to_host(&ce.loss)?.to_vec::<f32>()?[0] as f64 * n_counted as f64;
        counted += n_counted;
        if data.answers {
            let logits = b.to_host(&logits)?.to_vec::<f32>()?;
            for p in 0..chunk.len() {
                let all_right = (0..t).filter(|&s| targets[p * t + s] != IGNORE).all(|s| {
                    let row = &logits[(p * t + s) * v..(p * t + s + 1) * v];
                    argmax(row) == targets[p * t + s]
                });
                correct += all_right as usize;
            }
        }
    }
    if counted == 0 {
        return Err(Error::value("evaluate", "held-out targets", "at least one counted token", 0));
    }
    Ok(EvalStats {
        loss: (loss_sum / counted as f64) as f32,
        accuracy: data.answers.then(|| correct as f64 / valid.len() as f64),
    })
}
