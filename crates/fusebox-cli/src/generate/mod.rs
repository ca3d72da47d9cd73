//! `fusebox generate --model PATH --prompt TEXT`: text from a trained checkpoint, a
//! GGUF file or a Hugging Face directory, streamed as it comes, through the KV cache.

mod args;
mod checkpoint;
mod pretrained;

use fusebox::Result;

pub(crate) use self::args::parse_cache_type;
pub use self::args::GenerateArgs;
pub(crate) use self::pretrained::check_cache_memory;

/// Runs `fusebox generate`: a pretrained model (or a fine-tuning checkpoint) or a
/// from-scratch checkpoint, with the sampler the flags describe (checked first, so a bad
/// flag is reported before any model is loaded).
pub fn run(args: &GenerateArgs) -> Result<()> {
    let sampler = args::sampler(args)?;
    if fusebox_models::open::is_pretrained(&args.model) {
        pretrained::run(args, sampler)
    } else {
        checkpoint::run(args, sampler)
    }
}
