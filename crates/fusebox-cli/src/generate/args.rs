//! The flags of `fusebox generate` and the sampler they describe.

use std::path::PathBuf;

use clap::Args;
use fusebox::{DType, Error, Result};
use fusebox_models::{Sampler, SamplerConfig};

/// `fusebox generate`'s flags.
#[derive(Args)]
pub struct GenerateArgs {
    /// A checkpoint directory (a training output dir or one of its step-N dirs), a .gguf
    /// file, or a Hugging Face directory (config.json + *.safetensors + tokenizer.json).
    #[arg(long)]
    pub(crate) model: PathBuf,
    /// The prompt text.
    #[arg(long, default_value = "")]
    pub(crate) prompt: String,
    /// Most new tokens.
    #[arg(long, default_value_t = 200)]
    pub(crate) max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub(crate) temperature: f32,
    /// Keep the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 40)]
    pub(crate) top_k: usize,
    /// Nucleus sampling threshold (1 = off).
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
    pub(crate) top_p: f32,
    /// Penalty on tokens already in the prompt or the output (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub(crate) repetition_penalty: f32,
    /// Seed of the sampler's random numbers.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Compute backend: cpu or wgpu.
    #[arg(long, default_value = "cpu")]
    pub(crate) backend: String,
    /// CPU threads (default: every core).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Print one JSON object (no streaming).
    #[arg(long)]
    pub(crate) json: bool,
    /// Wrap the prompt in the model's chat template as a user turn (pretrained models).
    #[arg(long)]
    pub(crate) chat: bool,
    /// Positions the KV cache holds (pretrained models; default min(2048, the model's
    /// context)); a prompt longer than this is an error.
    #[arg(long)]
    pub(crate) ctx_size: Option<usize>,
    /// KV cache storage: f16 (default), bf16 or f32. A 16-bit cache takes half the memory
    /// and half the bytes read per position of context; keys and values are rounded to it
    /// as they are written, and attention accumulates in f32.
    #[arg(long, default_value = "f16", value_parser = parse_cache_type)]
    pub(crate) cache_type: DType,
    #[command(flatten)]
    pub(crate) drafting: DraftArgs,
    #[command(flatten)]
    pub(crate) pipeline: crate::pipeline::PipelineArgs,
}

/// Speculative decoding's flags (`fusebox generate`, `fusebox serve`, `fusebox bench
/// generate`): where drafts come from and how many a pass checks.
#[derive(Args, Clone, Debug, Default)]
pub struct DraftArgs {
    /// Speculative decoding with this draft model: a smaller GGUF or Hugging Face model
    /// with the same tokenizer, decoding greedily; its guesses are kept while the model
    /// chooses the same tokens, so the output is unchanged.
    #[arg(long, conflicts_with = "draft_ngram")]
    pub(crate) draft_model: Option<PathBuf>,
    /// Speculative decoding by prompt lookup: the tokens that followed the latest earlier
    /// occurrence of the last N tokens (N down to 1) are the drafts (1..=16; 3 suits
    /// text that copies its input, such as a code edit).
    #[arg(long, value_name = "N")]
    pub(crate) draft_ngram: Option<usize>,
    /// Most drafted tokens one pass checks (1..=15; needs --draft-model or --draft-ngram).
    #[arg(long, value_name = "K")]
    pub(crate) draft_max: Option<usize>,
}

/// `--draft-max`'s default.
pub(crate) const DEFAULT_DRAFT_MAX: usize = 8;

impl DraftArgs {
    /// Whether drafting was asked for.
    pub(crate) fn enabled(&self) -> bool {
        self.draft_model.is_some() || self.draft_ngram.is_some()
    }

    /// The most drafts a pass checks.
    pub(crate) fn max_draft(&self) -> usize {
        self.draft_max.unwrap_or(DEFAULT_DRAFT_MAX)
    }

    /// Checks the values before any model is loaded (`op` names the command).
    pub(crate) fn check(&self, op: &'static str) -> Result<()> {
        if self.draft_max.is_some() && !self.enabled() {
            return Err(Error::value(op, "--draft-max", "--draft-model or --draft-ngram beside it", "neither"));
        }
        if let Some(n) = self.draft_ngram {
            fusebox_models::generate::Drafter::ngram(n, self.max_draft())?;
        } else if self.enabled() {
            fusebox_models::generate::Drafter::ngram(1, self.max_draft())?;
        }
        Ok(())
    }
}

/// A `--cache-type` value: f32, f16 or bf16.
pub(crate) fn parse_cache_type(s: &str) -> Result<DType> {
    match s.trim().to_ascii_lowercase().as_str() {
        "f32" => Ok(DType::F32),
        "f16" => Ok(DType::F16),
        "bf16" => Ok(DType::BF16),
        _ => Err(Error::value("generate", "--cache-type", "f32, f16 or bf16", s)),
    }
}

/// The sampler the flags describe; built before any model is loaded, so a bad flag is
/// reported at once.
pub(crate) fn sampler(args: &GenerateArgs) -> Result<Sampler> {
    if args.ctx_size == Some(0) {
        return Err(Error::value("generate", "--ctx-size", "at least 1", 0));
    }
    if args.threads == Some(0) {
        return Err(Error::value("generate", "--threads", "at least 1", 0));
    }
    args.drafting.check("generate")?;
    Sampler::new(SamplerConfig {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        repetition_penalty: args.repetition_penalty,
        seed: args.seed,
    })
    .map_err(|e| match e {
        Error::Value { what, expected, got, .. } => {
            Error::value("generate", format!("--{}", what.replace('_', "-")), expected, got)
        }
        other => other,
    })
}
