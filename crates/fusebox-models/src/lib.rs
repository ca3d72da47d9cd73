//! fusebox-models: decoder-only transformers built on the `ComputeBackend` trait alone.
//! One [`transformer::Transformer`] — configured by an [`transformer::Arch`] that the
//! files in [`arch`] read from Hugging Face configs and GGUF metadata — trains (explicit
//! forward and backward passes) and generates through a preallocated KV cache for every
//! architecture; around it: weight loading ([`weights`], [`gguf`], [`safetensors`];
//! [`open`] opens any model by its path, [`pretrained`] GGUF files and Hugging Face
//! directories),
//! byte-level BPE tokenizers ([`tokenizer`]), chat templates ([`chat`]), export to Hugging Face and GGUF ([`export`]), training
//! ([`train`], [`checkpoint`], [`data`]) and generation ([`mod@generate`], [`sampler`]).

#![warn(missing_docs)]

pub mod arch;
pub mod chat;
pub mod checkpoint;
pub mod comm;
pub mod config;
pub mod data;
pub mod data_parallel;
pub mod export;
pub mod files;
pub mod finetune;
pub mod generate;
pub mod gguf;
pub mod model;
pub mod open;
pub mod params;
pub mod pipeline;
pub mod pretrained;
pub mod rng;
pub mod safetensors;
pub mod sampler;
pub mod tokenizer;
pub mod train;
pub mod transformer;
pub mod weights;

pub use config::{ModelConfig, Style};
pub use generate::{generate, Generation, Session, StopReason};
pub use model::Model;
pub use params::{Init, ParamSet, ParamSpec};
pub use sampler::{Sampler, SamplerConfig};
pub use transformer::{Arch, KvCache, Transformer};
