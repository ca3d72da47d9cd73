//! `ModelConfig` and `Style`: a model trained from scratch, as its checkpoints record
//! it. They live with the architectures ([`crate::arch::preset`]), whose presets build
//! the block; this path is kept for the code that names them here.

pub use crate::arch::preset::{ModelConfig, Style};
