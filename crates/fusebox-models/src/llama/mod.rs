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

use std::path::Path;

use fusebox::{ComputeBackend, Error, Result};

pub use config::{LlamaConfig, RopeScaling};
pub use generate::{generate, Generation, Session, StopReason};
pub use load_gguf::load_gguf;
pub use load_hf::{load_hf_gpt2, load_hf_llama};
pub use model::{LlamaLayer, LlamaModel, LlamaState};
pub use weights::{Embedding, Linear, Projections};

use crate::chat::ChatTemplate;
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
    /// Its chat template, when the file has one that parses.
    pub chat_template: Option<ChatTemplate>,
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

    /// Longest context the model supports.
    pub fn context_length(&self) -> usize {
        match &self.network {
            Network::Llama(m) => m.config.context_length,
            Network::Gpt2(m) => m.config.max_seq,
        }
    }

    /// Tokens that end generation: the tokenizer's end-of-generation ids (EOS and the
    /// like), plus the chat template's end-of-turn token (`<|im_end|>`) when `chat`.
    pub fn stop_ids(&self, chat: bool) -> Vec<u32> {
        let mut ids: Vec<u32> = self.tokenizer.eog_ids().to_vec();
        ids.extend(self.tokenizer.eos_id());
        if chat {
            ids.extend(self.tokenizer.token_id("<|im_end|>"));
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// Whether `path` is something [`load`] reads: a `.gguf` path, or a directory whose
/// `config.json` has a `model_type` (a Hugging Face checkpoint; fusebox's own training
/// checkpoints have none).
pub fn is_pretrained(path: &Path) -> bool {
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        return true;
    }
    load_hf::read_config(path).is_ok_and(|v| v.get("model_type").is_some())
}

/// Loads a GGUF file or a Hugging Face directory (see the module docs).
pub fn load(b: &dyn ComputeBackend, path: &Path) -> Result<Pretrained> {
    if path.is_file() {
        return load_gguf_file(b, path);
    }
    if !path.is_dir() {
        return Err(Error::Io(format!("{}: no such file or directory", path.display())));
    }
    load_hf_dir(b, path)
}

fn load_gguf_file(b: &dyn ComputeBackend, path: &Path) -> Result<Pretrained> {
    let file = GgufFile::open(path)?;
    let tokenizer = Tokenizer::from_gguf(file.metadata())?;
    let chat_template = match file.metadata().get_str("tokenizer.chat_template")? {
        Some(src) => ChatTemplate::from_jinja(src).ok(),
        None => None,
    };
    let model = load_gguf(b, &file).map_err(|e| with_path(e, path))?;
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
    Ok(Pretrained { network: Network::Llama(model), tokenizer, chat_template, description })
}

fn load_hf_dir(b: &dyn ComputeBackend, dir: &Path) -> Result<Pretrained> {
    let config = load_hf::read_config(dir)?;
    let tok_path = dir.join("tokenizer.json");
    let tok_text = std::fs::read_to_string(&tok_path)
        .map_err(|e| Error::Io(format!("{}: {e} (the tokenizer of an HF checkpoint)", tok_path.display())))?;
    let tok_config = std::fs::read_to_string(dir.join("tokenizer_config.json")).ok();
    let tokenizer = Tokenizer::from_hf_json(&tok_text, tok_config.as_deref())?;
    let chat_template = tok_config
        .as_deref()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
        .and_then(|v| v.get("chat_template").and_then(|s| s.as_str()).map(str::to_owned))
        .and_then(|src| ChatTemplate::from_jinja(&src).ok());
    let model_type = config.get("model_type").and_then(|v| v.as_str()).unwrap_or("").to_string();
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
    Ok(Pretrained { network, tokenizer, chat_template, description })
}

/// The storage formats of a model's matrices, e.g. `q4_1, q8_0`.
fn weight_formats(m: &LlamaModel) -> String {
    let mut names: Vec<&str> =
        m.layers.iter().flat_map(LlamaLayer::matrices).chain([&m.head]).map(|w| w.weight().dtype().name()).collect();
    names.sort_unstable();
    names.dedup();
    names.join(", ")
}

fn with_path(e: Error, path: &Path) -> Error {
    match e {
        Error::Io(msg) if !msg.contains(&path.display().to_string()) => Error::Io(format!("{}: {msg}", path.display())),
        other => other,
    }
}
