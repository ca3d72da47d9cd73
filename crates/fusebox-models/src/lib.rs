//! fusebox-models: decoder-only transformers (GPT-2 and Llama style) built on the
//! `ComputeBackend` trait alone — training with explicit forward/backward passes,
//! checkpoints, data, sampling and generation through a preallocated KV cache.

pub mod checkpoint;
pub mod config;
pub mod data;
pub mod generate;
pub mod kv_cache;
pub mod model;
pub mod params;
pub mod rng;
pub mod safetensors;
pub mod sampler;
pub mod train;

pub use config::{ModelConfig, Style};
pub use kv_cache::KvCache;
pub use model::Model;
pub use params::{Init, ParamSet, ParamSpec};
pub use sampler::{Sampler, SamplerConfig};
