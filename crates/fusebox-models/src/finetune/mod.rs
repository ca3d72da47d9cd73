//! Fine-tuning a pretrained model (`fusebox train --init MODEL`): a GGUF file or a
//! Hugging Face directory of any architecture the one [`Transformer`] loads, as a
//! [`ParamSource`] of the one training engine ([`crate::train::Trainer`]; [`FineTuner`]
//! names it over [`Sequences`]): every parameter trained in f32 (block formats
//! dequantized at load), or LoRA adapters on a frozen base that keeps its block formats.
//!
//! # The checkpoint (the contract with `fusebox export`)
//!
//! A fine-tuning run's `step-N/` is written by the engine's checkpoint writer, as a
//! from-scratch run's is: `model.safetensors` (what is trained: every parameter, fusebox's
//! names and `[out, in]` layout, f32, or the adapters), `optimizer.safetensors` (AdamW's
//! `m.*`/`v.*`), `config.json`, `trainer.json` written last (step, data sampler, settings,
//! `world_size`, `data`, `data_args`) — plus:
//!
//! - `arch.json`: the [`crate::transformer::Arch`] (see [`arch_json`]);
//! - `trainer.json` → `"finetune"`: `{"base": absolute path of the base model,
//!   "base_kind": "gguf" | "hf", "method": "full" | "lora", "lora": settings,
//!   "stacking": {"qkv", "gate_up"}}` (checkpoints before the engine was shared also
//!   hold `"data"` and `"data_args"` here);
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

use fusebox::{ComputeBackend, Error, Result};
use serde_json::{json, Value};

use crate::chat::ChatTemplate;
use crate::checkpoint;
use crate::data::sequences::{self, Sequences};
use crate::files;
use crate::gguf::GgufFile;
use crate::pretrained::Pretrained;
use crate::safetensors::SafeTensors;
use crate::tokenizer::Tokenizer;
use crate::train::{ParamSource, Saved, Trainer};
use crate::transformer::{layout, Adapters, Arch, LoraConfig, Stacking, Transformer};
use crate::weights::{self, Purpose};

/// The training engine over a pretrained model and token sequences.
pub type FineTuner = Trainer<Loaded, Sequences>;

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
        sequences::pad_of(&self.tokenizer)
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

/// What every reader of a fine-tuning checkpoint reads first.
struct Header {
    /// The `step-N` directory.
    dir: PathBuf,
    /// Its `trainer.json`.
    trainer: Value,
    /// The base model it names.
    base: Base,
    /// Its LoRA settings (`None`: full fine-tuning).
    lora: Option<LoraConfig>,
    /// Whether the trained parameters stack q/k/v and gate/up.
    stacking: Stacking,
}

/// The header of the fine-tuning checkpoint `path` names (see [`checkpoint::resolve`]).
fn read_header(path: &Path) -> Result<Header> {
    let dir = checkpoint::resolve(path)?;
    let trainer_file = dir.join("trainer.json");
    let trainer = files::read_json(&trainer_file, "trainer.json", 64 << 20)?;
    let ft = trainer.get("finetune").ok_or_else(|| {
        Error::Io(format!("{}: no 'finetune' section: not a fine-tuning checkpoint", trainer_file.display()))
    })?;
    let base = Base::from_json(ft, &trainer_file)?;
    let lora = lora_of(&trainer, &trainer_file)?;
    let flag = |k: &str| ft.get("stacking").and_then(|s| s.get(k)).and_then(Value::as_bool).unwrap_or(false);
    let stacking = Stacking { qkv: flag("qkv"), gate_up: flag("gate_up") };
    Ok(Header { dir, trainer, base, lora, stacking })
}

/// The architecture a checkpoint directory's `arch.json` describes.
fn read_arch(dir: &Path) -> Result<Arch> {
    let arch_file = dir.join("arch.json");
    arch_json::from_json(&files::read_json(&arch_file, "arch.json", 64 << 20)?)
        .map_err(|e| Error::Io(format!("{}: {e}", arch_file.display())))
}

/// [`load_checkpoint`] with the base of a LoRA checkpoint loaded for `base_purpose`
/// (`Frozen` to train on, `Training` for f32 weights to merge into).
fn load_checkpoint_as(b: &dyn ComputeBackend, path: &Path, base_purpose: Purpose) -> Result<(Loaded, Saved)> {
    let Header { dir, trainer, base, lora, stacking } = read_header(path)?;
    if let Some(cfg) = lora {
        return load_lora_checkpoint(b, dir, trainer, base, cfg, base_purpose);
    }
    let arch = read_arch(&dir)?;
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
    let (template, template_error) = read_template(&dir, &tokenizer)?;
    let saved = Saved::new(dir, trainer)?;
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
    let arch = read_arch(&dir)?;
    if arch_json::to_json(&arch) != arch_json::to_json(&loaded.net.arch) {
        return Err(Error::Io(format!(
            "{}: the base {} is not the model this checkpoint was trained on (its architecture differs)",
            dir.join("arch.json").display(),
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
    Ok((loaded, Saved::new(dir, trainer)?))
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
        pipeline: None,
    })
}

/// The LoRA adapters of a checkpoint without its base: the architecture, the adapters
/// and the base they were trained on (for `fusebox export --format peft`). An error
/// when the checkpoint is a full fine-tuning one.
pub fn load_adapters(b: &dyn ComputeBackend, checkpoint: &Path) -> Result<(Arch, Adapters, Base)> {
    let Header { dir, base, lora, .. } = read_header(checkpoint)?;
    let cfg = lora.ok_or_else(|| {
        Error::unsupported(
            "export --format peft",
            format!("{} is a full fine-tuning checkpoint (no LoRA adapters)", dir.display()),
        )
    })?;
    let arch = read_arch(&dir)?;
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

/// A pretrained model as the engine trains it: its checkpoints hold `arch.json`, the
/// tokenizer files of an HF base and the chat template, and name the base and the method
/// in `trainer.json` → `"finetune"` (see the module docs).
impl ParamSource for Loaded {
    fn checkpoint_config(&self) -> Value {
        json!({"fusebox_finetune": self.base.to_json()})
    }

    fn checkpoint_files(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let to_bytes = |v: &Value| serde_json::to_vec_pretty(v).map_err(|e| Error::Io(e.to_string()));
        let mut files = vec![("arch.json".to_string(), to_bytes(&arch_json::to_json(&self.net.arch))?)];
        if let TokenizerSource::Hf(src) = &self.tokenizer_source {
            for name in ["tokenizer.json", "tokenizer_config.json"] {
                let p = src.join(name);
                if p.exists() {
                    let bytes = std::fs::read(&p).map_err(|e| Error::Io(format!("{}: {e}", p.display())))?;
                    files.push((name.to_string(), bytes));
                }
            }
        }
        if let Some(t) = &self.template {
            files.push(("chat_template.jinja".to_string(), t.source().as_bytes().to_vec()));
        }
        Ok(files)
    }

    fn checkpoint_state(&self) -> Vec<(String, Value)> {
        let stacked = |part: &str| self.net.specs.iter().any(|s| s.name.contains(part));
        let mut ft = self.base.to_json();
        match &self.net.lora {
            Some(ad) => {
                ft["method"] = json!("lora");
                ft["lora"] = ad.config.to_json();
            }
            None => ft["method"] = json!("full"),
        }
        ft["stacking"] = json!({"qkv": stacked(".attn.qkv."), "gate_up": stacked(".mlp.gate_up.")});
        vec![("finetune".to_string(), ft)]
    }

    fn net(&self) -> &Transformer {
        &self.net
    }

    fn net_mut(&mut self) -> &mut Transformer {
        &mut self.net
    }
}
