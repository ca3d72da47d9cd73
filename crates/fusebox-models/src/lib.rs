//! fusebox-models: what sits between files on disk and the fusebox compute trait.
//!
//! * [`gguf`]: a bounds-checked, memory-mapped GGUF reader;
//! * [`tokenizer`]: byte-level BPE tokenizers from GGUF metadata or a Hugging Face
//!   `tokenizer.json`, with a streaming decoder;
//! * [`chat`]: chat templates (ChatML, as SmolLM2-Instruct uses).

pub mod chat;
pub mod gguf;
pub mod tokenizer;
