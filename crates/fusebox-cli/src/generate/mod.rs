//! `fusebox generate --model PATH --prompt TEXT`: text from a trained checkpoint, a
//! GGUF file or a Hugging Face directory, streamed as it comes, through the KV cache.

mod args;
mod checkpoint;
mod drafting;
mod pretrained;

use fusebox::Result;

pub(crate) use self::args::parse_cache_type;
pub use self::args::{DraftArgs, GenerateArgs};
pub(crate) use self::drafting::{draft_json, load_draft_model};
pub(crate) use self::pretrained::check_cache_memory;

/// Runs `fusebox generate`: a pretrained model (or a fine-tuning checkpoint) or a
/// from-scratch checkpoint, with the sampler the flags describe (checked first, so a bad
/// flag is reported before any model is loaded).
pub fn run(args: &GenerateArgs) -> Result<()> {
    let sampler = args::sampler(args)?;
    let dist = crate::pipeline::Distributed::from_environment(&args.pipeline)?;
    if args.drafting.enabled() && dist.is_split() {
        return Err(fusebox::Error::unsupported(
            "generate",
            "speculative decoding (--draft-model, --draft-ngram) of a model split over MPI ranks: the other ranks' \
             caches cannot be cut back to the accepted drafts",
        ));
    }
    if fusebox_models::open::is_pretrained(&args.model) {
        dist.run(|| pretrained::run(args, sampler, &dist))
    } else if dist.is_split() {
        Err(fusebox::Error::unsupported(
            "generate",
            format!(
                "{} is a from-scratch training checkpoint; a model split over MPI ranks is read from a GGUF file or \
                 a Hugging Face directory",
                args.model.display()
            ),
        ))
    } else {
        checkpoint::run(args, sampler)
    }
}
