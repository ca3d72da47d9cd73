//! Training data: the built-in addition task and byte-level text files.

pub mod addition;
pub mod text;
