//! Pretrained models for inference, with their tokenizers and chat templates: GGUF
//! files (F32/F16/BF16 and the block formats, multiplied straight from the blocks) and
//! Hugging Face safetensors directories (sharded too), of every architecture in
//! [`crate::arch`] (GPT-2, Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 3), all run by
//! the one [`Transformer`]. Fine-tuning checkpoints are opened too, one layer up
//! ([`crate::open`]), which is what most callers want. A multi-turn conversation over
//! one KV cache is a [`chat::ChatSession`].
//!
//! ```no_run
//! use fusebox_models::pretrained::{self, Session};
//! use fusebox_models::{open, Sampler, SamplerConfig};
//! let b = fusebox::create_backend("cpu")?;
//! let p = open::load(b.as_ref(), "models/SmolLM2-135M-Instruct.Q4_1.gguf".as_ref())?;
//! let prompt = p.tokenizer.encode("The capital of France is", false);
//! let mut session = p.session(b.as_ref(), 2048)?;
//! let mut sampler = Sampler::new(SamplerConfig::default())?; // greedy
//! let out = pretrained::generate(&mut session, b.as_ref(), &prompt, 16, &mut sampler, &p.stop_ids(false), |_| Ok(()))?;
//! println!("{}", p.tokenizer.decode(&out.tokens)?);
//! # Ok::<(), fusebox::Error>(())
//! ```

pub mod chat;

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use fusebox::{ComputeBackend, Error, Result};

pub use crate::generate::{generate, Generation, Session, StopReason};

use crate::chat::ChatTemplate;
use crate::files;
use crate::gguf::GgufFile;
use crate::pipeline::Pipeline;
use crate::tokenizer::Tokenizer;
use crate::transformer::{Stage, Transformer};
use crate::weights::{self, read_config, Shards};

/// A pretrained model with its tokenizer and chat template.
pub struct Pretrained {
    /// The network (inference only).
    pub network: Transformer,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Its chat template: the file's own, or a fallback with a notice when it has none
    /// ([`ChatTemplate::for_tokenizer`]); `None` when the file's does not parse.
    pub chat_template: Option<ChatTemplate>,
    /// Why the file's chat template could not be used (it does not parse;
    /// `chat_template` is then `None`).
    pub chat_template_error: Option<String>,
    /// Where the model was loaded from.
    pub path: std::path::PathBuf,
    /// What was loaded, for messages (`gguf llama, 30 layers, q4_1`).
    pub description: String,
    /// The other stages, when `network` is the first stage of a pipeline: every
    /// session steps through them.
    pub pipeline: Option<Arc<Pipeline>>,
}

impl Pretrained {
    /// Caches for one stream of `ctx_size` positions; sampling chooses only ids the
    /// tokenizer has (see [`Session::with_sample_vocab`]).
    pub fn session(&self, b: &dyn ComputeBackend, ctx_size: usize) -> Result<Session<'_>> {
        self.session_with_cache(b, ctx_size, fusebox::DType::F32)
    }

    /// As [`session`](Self::session) with the caches stored in `cache_dtype` (F32, F16
    /// or BF16).
    pub fn session_with_cache(
        &self,
        b: &dyn ComputeBackend,
        ctx_size: usize,
        cache_dtype: fusebox::DType,
    ) -> Result<Session<'_>> {
        let session = Session::with_cache_dtype(&self.network, b, ctx_size, cache_dtype)?;
        Ok(session.with_sample_vocab(self.tokenizer.vocab_size()).with_pipeline(self.pipeline.clone()))
    }

    /// The chat template, or an error saying why there is none: the file has no
    /// template, or one that is not supported (with the reason).
    pub fn chat_template(&self) -> Result<&ChatTemplate> {
        if let Some(t) = &self.chat_template {
            return Ok(t);
        }
        Err(Error::unsupported(
            "chat template",
            match &self.chat_template_error {
                Some(why) => format!("{}: the chat template cannot be used: {why}", self.path.display()),
                None => format!("{} has no chat template", self.path.display()),
            },
        ))
    }

    /// Longest context the model supports.
    pub fn context_length(&self) -> usize {
        self.network.arch.context_length
    }

    /// Tokens that end generation: the tokenizer's end-of-generation ids (EOS and the
    /// like), plus the chat template's end-of-turn tokens (`<|im_end|>`,
    /// `<end_of_turn>`, `<|eot_id|>`, …, see [`ChatTemplate::end_of_turn`]) when `chat`.
    pub fn stop_ids(&self, chat: bool) -> Vec<u32> {
        let mut ids: Vec<u32> = self.tokenizer.eog_ids().to_vec();
        ids.extend(self.tokenizer.eos_id());
        if chat {
            let template_ends = self.chat_template.as_ref().map(ChatTemplate::end_of_turn).unwrap_or_default();
            ids.extend(template_ends.iter().filter_map(|t| self.tokenizer.token_id(t)));
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// Whether `path` is something [`load_gguf_or_hf`] reads: a regular file that starts
/// with the GGUF magic (whatever its name), a `.gguf` path, or a directory whose
/// `config.json` is not one of fusebox's own training checkpoints (those name a
/// `style`; a Hugging Face one has a `model_type`, and one with neither is reported by
/// [`load_gguf_or_hf`]), or whose `config.json` is not a regular file (which
/// [`load_gguf_or_hf`] refuses).
pub fn is_gguf_or_hf(path: &Path) -> bool {
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        return true;
    }
    if files::is_regular(path) {
        let mut magic = [0u8; 4];
        return std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok()
            && magic == crate::gguf::MAGIC;
    }
    match read_config(path) {
        Ok(v) => v.get("model_type").is_some() || v.get("style").is_none(),
        // A `config.json` that is there but no regular file (a FIFO, a link to a device)
        // is for `load` to refuse: no reader should open it.
        Err(_) => {
            let config = path.join("config.json");
            config.symlink_metadata().is_ok() && !files::is_regular(&config)
        }
    }
}

/// Loads a GGUF file or a Hugging Face directory (see the module docs).
///
/// Every error names the file; sizes, tensors and vocabularies are checked against
/// each other before anything large is allocated.
pub fn load_gguf_or_hf(b: &dyn ComputeBackend, path: &Path) -> Result<Pretrained> {
    load_gguf_or_hf_stage(b, path, &|sizes| Ok(Stage::whole(sizes.layers.len())))
}

/// As [`load_gguf_or_hf`], the network holding only the blocks of the pipeline stage
/// `choose` picks from the parameters' stored sizes (see [`weights::load_stage_for`]):
/// only that stage's tensors are read.
pub fn load_gguf_or_hf_stage(b: &dyn ComputeBackend, path: &Path, choose: &ChooseStage<'_>) -> Result<Pretrained> {
    let meta = std::fs::metadata(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    if meta.is_dir() {
        return load_hf_dir(b, path, choose);
    }
    if !meta.is_file() {
        return Err(files::not_regular(path, "a model (a GGUF file, or a Hugging Face directory)", meta.file_type()));
    }
    load_gguf_file(b, path, choose).map_err(|e| with_path(e, path))
}

/// Only the network of the stage `choose` picks from the model at `path` (a GGUF file or
/// a Hugging Face directory): no tokenizer, no chat template — what a pipeline rank
/// other than 0 runs, which never sees text.
pub fn load_stage_network(b: &dyn ComputeBackend, path: &Path, choose: &ChooseStage<'_>) -> Result<Transformer> {
    let meta = std::fs::metadata(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    if meta.is_dir() {
        let config = read_config(path)?;
        let shards = Shards::open(path)?;
        let plan = weights::hf_plan(&config, &shards).map_err(|e| with_path(e, &path.join("config.json")))?;
        return weights::load_hf_stage(b, &shards, plan, weights::Purpose::Inference, choose)
            .map_err(|e| with_path(e, path));
    }
    if !meta.is_file() {
        return Err(files::not_regular(path, "a model (a GGUF file, or a Hugging Face directory)", meta.file_type()));
    }
    // This process never tokenizes: the vocabulary's arrays are not kept.
    let file = GgufFile::open_without_vocabulary(path)?;
    weights::load_gguf_stage(b, &file, choose).map_err(|e| with_path(e, path))
}

/// Picks a pipeline stage from a model's stored sizes.
pub type ChooseStage<'a> = dyn Fn(&weights::StageSizes) -> Result<Stage> + 'a;

fn load_gguf_file(b: &dyn ComputeBackend, path: &Path, choose: &ChooseStage<'_>) -> Result<Pretrained> {
    let file = GgufFile::open(path)?;
    let tokenizer = Tokenizer::from_gguf(file.metadata())?;
    let source = file.metadata().get_str("tokenizer.chat_template")?;
    let (chat_template, chat_template_error) = match ChatTemplate::for_tokenizer(source, &tokenizer) {
        Ok(t) => (Some(t), None),
        Err(e) => (None, Some(format!("tokenizer.chat_template: {e}"))),
    };
    let model = weights::load_gguf_stage(b, &file, choose)?;
    if model.arch.vocab_size != tokenizer.vocab_size() {
        return Err(Error::Io(format!(
            "gguf: the model's vocabulary has {} tokens (token_embd.weight), the tokenizer {} \
             (tokenizer.ggml.tokens)",
            model.arch.vocab_size,
            tokenizer.vocab_size()
        )));
    }
    let description = format!("gguf {}", describe(&model));
    Ok(Pretrained {
        network: model,
        tokenizer,
        chat_template,
        chat_template_error,
        path: path.to_path_buf(),
        description,
        pipeline: None,
    })
}

fn load_hf_dir(b: &dyn ComputeBackend, dir: &Path, choose: &ChooseStage<'_>) -> Result<Pretrained> {
    let config = read_config(dir)?;
    let tok_path = dir.join("tokenizer.json");
    let tok_text =
        files::read_text(&tok_path, "tokenizer.json (the tokenizer of an HF checkpoint)", files::MAX_TOKENIZER_BYTES)?;
    let tok_config_path = dir.join("tokenizer_config.json");
    let tok_config = if tok_config_path.exists() {
        Some(files::read_text(&tok_config_path, "tokenizer_config.json", files::MAX_CONFIG_BYTES)?)
    } else {
        None
    };
    let tokenizer = Tokenizer::from_hf_json(&tok_text, tok_config.as_deref()).map_err(|e| with_path(e, &tok_path))?;
    let template_source = match tok_config.as_deref().map(serde_json::from_str::<serde_json::Value>) {
        None => None,
        Some(Ok(v)) => match v.get("chat_template") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) => Some(Ok(s.clone())),
            Some(serde_json::Value::Array(named)) => Some(default_named_template(named)),
            Some(_) => Some(Err(
                "tokenizer_config.json: chat_template: expected a string or a list of {name, template}, found \
                 another JSON value"
                    .to_string(),
            )),
        },
        Some(Err(e)) => {
            return Err(Error::Io(format!("{}: not valid JSON: {e}", tok_config_path.display())));
        }
    };
    let (chat_template, chat_template_error) = match template_source {
        Some(Err(why)) => (None, Some(why)),
        Some(Ok(src)) => match ChatTemplate::for_tokenizer(Some(&src), &tokenizer) {
            Ok(t) => (Some(t), None),
            Err(e) => (None, Some(format!("tokenizer_config.json: chat_template: {e}"))),
        },
        None => match ChatTemplate::for_tokenizer(None, &tokenizer) {
            Ok(t) => (Some(t), None),
            Err(e) => (None, Some(e.to_string())),
        },
    };
    let shards = Shards::open(dir)?;
    let plan = weights::hf_plan(&config, &shards).map_err(|e| with_path(e, &dir.join("config.json")))?;
    // A multimodal wrapper is run text only: the description says what was left out.
    let skipped = plan.wrapper.and_then(|w| w.skipped_notice(Shards::names(&shards)));
    let network =
        weights::load_hf_stage(b, &shards, plan, weights::Purpose::Inference, choose).map_err(|e| with_path(e, dir))?;
    let description = format!("hf {}{}", describe(&network), skipped.map(|s| format!("; {s}")).unwrap_or_default());
    let model_vocab = network.arch.vocab_size;
    if tokenizer.vocab_size() > model_vocab {
        return Err(Error::Io(format!(
            "{}: the tokenizer has {} tokens but the model's vocab_size is {model_vocab}: \
             its ids past the embedding table could not be run",
            tok_path.display(),
            tokenizer.vocab_size()
        )));
    }
    Ok(Pretrained {
        network,
        tokenizer,
        chat_template,
        chat_template_error,
        path: dir.to_path_buf(),
        description,
        pipeline: None,
    })
}

/// The `default` entry of `tokenizer_config.json`'s list of named chat templates
/// (`[{"name": "default", "template": "…"}, {"name": "tool_use", …}]`), as transformers
/// picks it.
fn default_named_template(named: &[serde_json::Value]) -> std::result::Result<String, String> {
    let mut names = Vec::new();
    for entry in named {
        let name = entry.get("name").and_then(serde_json::Value::as_str);
        let template = entry.get("template").and_then(serde_json::Value::as_str);
        match (name, template) {
            (Some("default"), Some(t)) => return Ok(t.to_string()),
            (Some(n), Some(_)) => names.push(n.to_string()),
            _ => {
                return Err("tokenizer_config.json: chat_template: expected a list of {\"name\": string, \
                            \"template\": string}, found an entry without them"
                    .to_string())
            }
        }
    }
    Err(format!(
        "tokenizer_config.json: chat_template: the list of named templates has no 'default' (it has {})",
        if names.is_empty() { "none".to_string() } else { names.join(", ") }
    ))
}

/// What was loaded, for messages: `llama (30 layers, d_model 576, 9 heads / 3 kv, vocab
/// 49152; weights q4_1, q8_0)`.
fn describe(m: &Transformer) -> String {
    let a = &m.arch;
    format!(
        "{} ({} layers, d_model {}, {} heads / {} kv, vocab {}; weights {})",
        a.name,
        a.n_layers,
        a.d_model,
        a.n_heads,
        a.n_kv_heads,
        a.vocab_size,
        weight_formats(m)
    )
}

/// The storage formats of a model's matrices, e.g. `q4_1, q8_0`.
fn weight_formats(m: &Transformer) -> String {
    let mut names: Vec<&str> = m
        .specs
        .iter()
        .zip(&m.params.tensors)
        .filter(|(s, t)| s.shape.rank() == 2 && t.elem_count() > 0)
        .map(|(_, t)| t.dtype().name())
        .collect();
    names.sort_unstable();
    names.dedup();
    names.join(", ")
}

/// `e` with `path` in its message, unless it names it already.
fn with_path(e: Error, path: &Path) -> Error {
    let p = path.display().to_string();
    let prefix = |s: String| if s.contains(&p) { s } else { format!("{p}: {s}") };
    match e {
        Error::Io(msg) => Error::Io(prefix(msg)),
        Error::Value { op, what, expected, got } => Error::Value { op, what: prefix(what), expected, got },
        Error::Shape { op, what, expected, got } => Error::Shape { op, what: prefix(what), expected, got },
        Error::DType { op, what, expected, got } => Error::DType { op, what: prefix(what), expected, got },
        Error::Unsupported { op, reason } => Error::Unsupported { op, reason: prefix(reason) },
        other => other,
    }
}
