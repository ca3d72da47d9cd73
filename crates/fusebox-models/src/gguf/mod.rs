//! GGUF reader (format versions 2 and 3): metadata, tensor infos and tensor data.
//!
//! ```no_run
//! use fusebox_models::gguf::GgufFile;
//! let file = GgufFile::open("models/SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let arch = file.metadata().require_str("general.architecture")?;
//! let embedding = file.tensor("token_embd.weight")?; // shape [vocab, dim]
//! # Ok::<(), fusebox::Error>(())
//! ```
//!
//! Every malformed or truncated file yields a [`fusebox::Error::Io`] whose message
//! starts with `gguf:` and names what is wrong; the reader never panics on file
//! contents, never reads out of bounds and never allocates more than a small
//! multiple of the file's size.

mod cursor;
mod file;
mod ggml_type;
mod metadata;
mod value;

pub use file::{GgufFile, TensorInfo, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
pub use ggml_type::GgmlType;
pub use metadata::Metadata;
pub use value::{Array, Value, ValueType, MAX_ARRAY_DEPTH};
