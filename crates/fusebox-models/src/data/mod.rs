//! Training data: the built-in addition task, byte-level text files, and fine-tuning
//! sequences in a pretrained model's tokens (text, chat JSONL, addition as chat).

pub mod addition;
pub mod sequences;
pub mod text;
