//! Opening any model fusebox runs by its path: a GGUF file or a Hugging Face directory
//! ([`crate::pretrained`]), or a fine-tuning checkpoint ([`crate::finetune`]). This sits
//! above both, so neither knows of the other's files: `finetune` builds on
//! `pretrained`, and only this module dispatches between them.

use std::path::Path;

use fusebox::{ComputeBackend, Result};

use crate::finetune;
use crate::pretrained::{self, Pretrained};

/// Whether `path` is something [`load`] reads: a fine-tuning checkpoint, or what
/// [`pretrained::is_gguf_or_hf`] accepts.
pub fn is_pretrained(path: &Path) -> bool {
    finetune::is_finetune_checkpoint(path) || pretrained::is_gguf_or_hf(path)
}

/// Loads a GGUF file, a Hugging Face directory, or a fine-tuning checkpoint (its f32
/// network, the base's tokenizer, the saved chat template).
///
/// Every error names the file; sizes, tensors and vocabularies are checked against
/// each other before anything large is allocated.
pub fn load(b: &dyn ComputeBackend, path: &Path) -> Result<Pretrained> {
    if finetune::is_finetune_checkpoint(path) {
        return finetune::load_pretrained(b, path);
    }
    pretrained::load_gguf_or_hf(b, path)
}
