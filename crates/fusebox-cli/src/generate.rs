//! `fusebox generate --model PATH --prompt TEXT`: text from a trained checkpoint, a
//! GGUF file or a Hugging Face directory (see `generate_pretrained`), streamed as it
//! comes, through the KV cache.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use fusebox::{DType, Error, Result};
use fusebox_models::checkpoint;
use fusebox_models::data::{addition, text};
use fusebox_models::generate::{generate, Session};
use fusebox_models::{Sampler, SamplerConfig};
use serde_json::json;

use crate::train::backend_for;

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

/// Tokens of a prompt for the checkpoint's task, and how to show tokens.
fn tokenize(task: &str, prompt: &str) -> Result<Vec<u32>> {
    match task {
        "addition" => prompt
            .chars()
            .filter(|c| !c.is_whitespace())
            .map(|c| match c {
                '0'..='9' => Ok(c as u32 - '0' as u32),
                '+' => Ok(addition::PLUS),
                '=' => Ok(addition::EQUALS),
                other => Err(Error::value("generate", "prompt character for the addition model", "0-9, + or =", other)),
            })
            .collect(),
        _ => Ok(prompt.bytes().map(u32::from).collect()),
    }
}

fn render(task: &str, tokens: &[u32]) -> String {
    match task {
        "addition" => addition::render(tokens),
        _ => text::decode(tokens),
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

pub fn run(args: &GenerateArgs) -> Result<()> {
    let mut sampler = sampler(args)?;
    if fusebox_models::open::is_pretrained(&args.model) {
        return crate::generate_pretrained::run(args, sampler);
    }
    let b = backend_for(&args.backend, args.threads)?;
    let (model, ckpt) = checkpoint::load_model(b.as_ref(), &args.model)?;
    let task = ckpt.trainer.get("task").and_then(|t| t.as_str()).unwrap_or("text").to_string();
    let mut prompt = tokenize(&task, &args.prompt)?;
    if prompt.is_empty() {
        if task == "addition" {
            return Err(Error::value("generate", "--prompt", "a sum for the addition model, such as 12+34=", "\"\""));
        }
        prompt = tokenize(&task, "\n")?;
    }
    let stop = if task == "addition" { vec![addition::END] } else { vec![] };
    let start = Instant::now();
    let mut first_token: Option<f64> = None;
    let mut pending: Vec<u32> = Vec::new();
    let streaming = !args.json;
    if streaming {
        print!("{}", args.prompt);
    }
    let max_seq = model.config.max_seq;
    if prompt.len() > max_seq {
        return Err(Error::value("generate", "prompt length", format!("≤ context {max_seq}"), prompt.len()));
    }
    let ctx = (prompt.len() + args.max_tokens).min(max_seq);
    let mut session = Session::with_cache_dtype(&model.net, b.as_ref(), ctx, args.cache_type)?;
    let out = generate(&mut session, b.as_ref(), &prompt, args.max_tokens, &mut sampler, &stop, |t| {
        first_token.get_or_insert_with(|| start.elapsed().as_secs_f64());
        if streaming {
            // Byte tokens may split a UTF-8 character: print only complete characters.
            pending.push(t);
            let bytes: Vec<u8> = pending.iter().map(|&t| t.min(255) as u8).collect();
            let shown = if task == "addition" {
                render(&task, &pending)
            } else {
                match std::str::from_utf8(&bytes) {
                    Ok(s) => s.to_string(),
                    Err(e) if e.error_len().is_none() => return Ok(()),
                    Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
                }
            };
            print!("{shown}");
            let _ = std::io::stdout().flush();
            pending.clear();
        }
        Ok(())
    })?
    .tokens;
    let total = start.elapsed().as_secs_f64();
    let prefill = first_token.unwrap_or(total);
    let decode_tps = (out.len().saturating_sub(1)) as f64 / (total - prefill).max(1e-9);
    let prefill_tps = prompt.len() as f64 / prefill.max(1e-9);
    if args.json {
        let v = json!({
            "prompt_ids": prompt,
            "generated_ids": out,
            "text": render(&task, &out),
            "prefill_tokens_per_s": prefill_tps,
            "decode_tokens_per_s": decode_tps,
        });
        println!("{v}");
    } else {
        println!();
        eprintln!(
            "prompt: {} tokens at {:.1} tok/s · generation: {} tokens at {:.1} tok/s",
            prompt.len(),
            prefill_tps,
            out.len(),
            decode_tps
        );
        let stopped_early = out.len() < args.max_tokens && out.last().is_none_or(|t| !stop.contains(t));
        if stopped_early {
            eprintln!("stopped at the model's context of {} tokens (prompt + generation)", model.config.max_seq);
        }
    }
    Ok(())
}
