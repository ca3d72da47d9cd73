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
    let dist = crate::pipeline::Distributed::from_environment(&args.pipeline)?;
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
