//! Pretrained Llama-family models for inference: GGUF files (F32/F16/BF16 and the block
//! formats Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, multiplied straight from the blocks) and
//! Hugging Face safetensors directories (Llama/Mistral, and GPT-2 mapped onto the
//! trainable [`Model`]), with their tokenizers and chat templates.
//!
//! ```no_run
//! use fusebox_models::llama::{self, Session};
//! use fusebox_models::{Sampler, SamplerConfig};
//! let b = fusebox::create_backend("cpu")?;
//! let p = llama::load(b.as_ref(), "models/SmolLM2-135M-Instruct.Q4_1.gguf".as_ref())?;
//! let prompt = p.tokenizer.encode("The capital of France is", false);
//! let mut session = p.session(b.as_ref(), 2048)?;
//! let mut sampler = Sampler::new(SamplerConfig::default())?; // greedy
//! let out = llama::generate(&mut session, b.as_ref(), &prompt, 16, &mut sampler, &p.stop_ids(false), |_| Ok(()))?;
//! println!("{}", p.tokenizer.decode(&out.tokens)?);
//! # Ok::<(), fusebox::Error>(())
//! ```

pub mod config;
pub mod generate;
pub mod load_gguf;
pub mod load_hf;
pub mod model;
pub mod weights;

use std::io::Read;
use std::path::Path;

use fusebox::{ComputeBackend, Error, Result};

pub use config::{LlamaConfig, RopeScaling};
pub use generate::{generate, Generation, Session, StopReason};
pub use load_gguf::load_gguf;
pub use load_hf::{load_hf_gpt2, load_hf_llama};
pub use model::{LlamaLayer, LlamaModel, LlamaState};
pub use weights::{Embedding, Linear, Projections};

use crate::chat::ChatTemplate;
use crate::files;
use crate::gguf::GgufFile;
use crate::model::Model;
use crate::tokenizer::Tokenizer;

/// The network of a pretrained checkpoint.
#[derive(Debug)]
pub enum Network {
    /// A Llama-family decoder (GGUF, or a Hugging Face Llama/Mistral directory).
    Llama(LlamaModel),
    /// A GPT-2 checkpoint from a Hugging Face directory, on the trainable model.
    Gpt2(Model),
}

/// A pretrained model with its tokenizer and chat template.
pub struct Pretrained {
    /// The network.
    pub network: Network,
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
}

impl Pretrained {
    /// Caches for one stream of `ctx_size` positions.
    pub fn session(&self, b: &dyn ComputeBackend, ctx_size: usize) -> Result<Session<'_>> {
        match &self.network {
            Network::Llama(m) => Ok(Session::Llama(m, m.new_state(b, ctx_size)?)),
            Network::Gpt2(m) => Ok(Session::Gpt2(m, m.new_cache(b, ctx_size)?)),
        }
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
        match &self.network {
            Network::Llama(m) => m.config.context_length,
            Network::Gpt2(m) => m.config.max_seq,
        }
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

/// Whether `path` is something [`load`] reads: a regular file that starts with the
/// GGUF magic (whatever its name), a `.gguf` path, or a directory whose `config.json`
/// is not one of fusebox's own training checkpoints (those name a `style`; a Hugging
/// Face one has a `model_type`, and one with neither is reported by [`load`]), or
/// whose `config.json` is not a regular file (which [`load`] refuses).
pub fn is_pretrained(path: &Path) -> bool {
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        return true;
    }
    if files::is_regular(path) {
        let mut magic = [0u8; 4];
        return std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok()
            && magic == crate::gguf::MAGIC;
    }
    match load_hf::read_config(path) {
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
pub fn load(b: &dyn ComputeBackend, path: &Path) -> Result<Pretrained> {
    let meta = std::fs::metadata(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    if meta.is_dir() {
        return load_hf_dir(b, path);
    }
    if !meta.is_file() {
        return Err(files::not_regular(path, "a model (a GGUF file, or a Hugging Face directory)", meta.file_type()));
    }
    load_gguf_file(b, path).map_err(|e| with_path(e, path))
}

fn load_gguf_file(b: &dyn ComputeBackend, path: &Path) -> Result<Pretrained> {
    let file = GgufFile::open(path)?;
    let tokenizer = Tokenizer::from_gguf(file.metadata())?;
    let source = file.metadata().get_str("tokenizer.chat_template")?;
    let (chat_template, chat_template_error) = match ChatTemplate::for_tokenizer(source, &tokenizer) {
        Ok(t) => (Some(t), None),
        Err(e) => (None, Some(format!("tokenizer.chat_template: {e}"))),
    };
    let model = load_gguf(b, &file)?;
    if model.config.vocab_size != tokenizer.vocab_size() {
        return Err(Error::Io(format!(
            "gguf: the model's vocabulary has {} tokens (token_embd.weight), the tokenizer {} \
             (tokenizer.ggml.tokens)",
            model.config.vocab_size,
            tokenizer.vocab_size()
        )));
    }
    let formats = weight_formats(&model);
    let description = format!(
        "gguf {} ({} layers, d_model {}, {} heads / {} kv, vocab {}; weights {formats})",
        model.config.architecture,
        model.config.n_layers,
        model.config.d_model,
        model.config.n_heads,
        model.config.n_kv_heads,
        model.config.vocab_size
    );
    Ok(Pretrained {
        network: Network::Llama(model),
        tokenizer,
        chat_template,
        chat_template_error,
        path: path.to_path_buf(),
        description,
    })
}

fn load_hf_dir(b: &dyn ComputeBackend, dir: &Path) -> Result<Pretrained> {
    let config = load_hf::read_config(dir)?;
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
    let model_type = match config.get("model_type") {
        Some(serde_json::Value::String(t)) => t.clone(),
        other => {
            return Err(Error::Io(format!(
                "{}: expected a string 'model_type' (llama, mistral or gpt2), found {}",
                dir.join("config.json").display(),
                other.map_or("none".to_string(), |v| v.to_string())
            )))
        }
    };
    let (network, description) = match model_type.as_str() {
        "gpt2" => {
            let m = load_hf_gpt2(b, dir, &config).map_err(|e| with_path(e, dir))?;
            let d = format!(
                "hf gpt2 ({} layers, d_model {}, vocab {})",
                m.config.n_layers, m.config.d_model, m.config.vocab_size
            );
            (Network::Gpt2(m), d)
        }
        _ => {
            let m = load_hf_llama(b, dir, &config).map_err(|e| with_path(e, dir))?;
            let d = format!(
                "hf {} ({} layers, d_model {}, {} heads / {} kv, vocab {}; weights {})",
                m.config.architecture,
                m.config.n_layers,
                m.config.d_model,
                m.config.n_heads,
                m.config.n_kv_heads,
                m.config.vocab_size,
                weight_formats(&m)
            );
            (Network::Llama(m), d)
        }
    };
    let model_vocab = match &network {
        Network::Llama(m) => m.config.vocab_size,
        Network::Gpt2(m) => m.config.vocab_size,
    };
    if tokenizer.vocab_size() > model_vocab {
        return Err(Error::Io(format!(
            "{}: the tokenizer has {} tokens but the model's vocab_size is {model_vocab}: \
             its ids past the embedding table could not be run",
            tok_path.display(),
            tokenizer.vocab_size()
        )));
    }
    Ok(Pretrained { network, tokenizer, chat_template, chat_template_error, path: dir.to_path_buf(), description })
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

/// The storage formats of a model's matrices, e.g. `q4_1, q8_0`.
fn weight_formats(m: &LlamaModel) -> String {
    let mut names: Vec<&str> =
        m.layers.iter().flat_map(LlamaLayer::matrices).chain([&m.head]).map(|w| w.weight().dtype().name()).collect();
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
