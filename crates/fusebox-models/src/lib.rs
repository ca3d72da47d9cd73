//! fusebox-models: decoder-only transformers built on the `ComputeBackend` trait alone —
//! GPT-2/Llama training with explicit forward/backward passes, checkpoints, data,
//! sampling and generation through a preallocated KV cache — and what sits between
//! files on disk and the trait: a bounds-checked GGUF reader ([`gguf`]), byte-level BPE
//! tokenizers ([`tokenizer`]) and chat templates ([`chat`]).

#![warn(missing_docs)]

pub mod chat;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod files;
pub mod generate;
pub mod gguf;
pub mod kv_cache;
pub mod llama;
pub mod model;
pub mod params;
pub mod rng;
pub mod safetensors;
pub mod sampler;
pub mod tokenizer;
pub mod train;

pub use config::{ModelConfig, Style};
pub use kv_cache::KvCache;
pub use model::Model;
pub use params::{Init, ParamSet, ParamSpec};
pub use sampler::{Sampler, SamplerConfig};
