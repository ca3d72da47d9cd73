//! `fusebox bench generate --model PATH`: prompt processing (one prefill pass of
//! `--prompt-tokens`) and decoding (`--new-tokens` greedy steps, EOS ignored) in tokens
//! per second, the median of `--repeats` runs after a warm-up. `bench/peers/llama_cpp.py`
//! measures llama.cpp on the same file and shapes.

use std::time::Instant;

use clap::Args;
use fusebox::{Error, Result};
use fusebox_models::llama;
use fusebox_models::sampler::argmax;
use serde_json::json;

use crate::train::backend_for;

#[derive(Args)]
pub struct GenerateBenchArgs {
    /// A .gguf file or a Hugging Face directory.
    #[arg(long)]
    model: std::path::PathBuf,
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 128)]
    new_tokens: usize,
    /// Measured runs (the median is reported), after one short warm-up.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long, default_value = "cpu")]
    backend: String,
    #[arg(long)]
    threads: Option<usize>,
    #[arg(long)]
    json: bool,
}

/// The benchmark prompt: ordinary English text, repeated to `n` tokens.
pub fn bench_prompt(tok: &fusebox_models::tokenizer::Tokenizer, n: usize) -> Result<Vec<u32>> {
    const TEXT: &str = "The history of the city begins with a small settlement on the river bank. \
        Over the centuries, traders, farmers and craftsmen built houses, markets and bridges, \
        and the town grew into a busy centre of commerce and learning. ";
    let unit = tok.encode(TEXT, false);
    if unit.is_empty() {
        return Err(Error::value("bench generate", "prompt text", "some tokens", 0));
    }
    Ok(unit.iter().copied().cycle().take(n).collect())
}

/// Tokens per second over the fastest tenth of `steps` (seconds per decode step); 0 if none.
fn fastest_tenth_tokens_per_s(mut steps: Vec<f64>) -> f64 {
    if steps.is_empty() {
        return 0.0;
    }
    steps.sort_by(f64::total_cmp);
    let n = steps.len().div_ceil(10);
    n as f64 / steps[..n].iter().sum::<f64>()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(args: &GenerateBenchArgs) -> Result<()> {
    if args.prompt_tokens == 0 {
        return Err(Error::value("bench generate", "--prompt-tokens", "≥ 1", 0));
    }
    let b = backend_for(&args.backend, args.threads)?;
    let model = llama::load(b.as_ref(), &args.model)?;
    let prompt = bench_prompt(&model.tokenizer, args.prompt_tokens)?;
    let ctx = args.prompt_tokens + args.new_tokens + 1;
    let mut session = model.session(b.as_ref(), ctx)?;
    // Warm-up: pages in the weights and starts the thread pool.
    let mut logits = session.step(b.as_ref(), &prompt[..prompt.len().min(32)])?;
    for _ in 0..4 {
        logits = session.step(b.as_ref(), &[argmax(&logits)])?;
    }
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    // Every decode step's seconds, over all runs: on a busy machine the fastest tenth
    // shows what a quiet one would (peers report the same figure).
    let mut steps = Vec::new();
    for _ in 0..args.repeats.max(1) {
        drop(session);
        session = model.session(b.as_ref(), ctx)?;
        let t = Instant::now();
        let mut logits = session.step(b.as_ref(), &prompt)?;
        b.synchronize()?;
        prefill.push(args.prompt_tokens as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        for _ in 0..args.new_tokens {
            let step = Instant::now();
            logits = session.step(b.as_ref(), &[argmax(&logits)])?;
            b.synchronize()?;
            steps.push(step.elapsed().as_secs_f64());
        }
        if args.new_tokens > 0 {
            decode.push(args.new_tokens as f64 / t.elapsed().as_secs_f64());
        }
    }
    let pp = median(prefill);
    let tg = if decode.is_empty() { 0.0 } else { median(decode) };
    let tg_fast = fastest_tenth_tokens_per_s(steps);
    if args.json {
        println!(
            "{}",
            json!({"name": "generate", "model": args.model.display().to_string(), "description": model.description,
                   "backend": b.name(), "threads": b.cpu().threads(), "prompt_tokens": args.prompt_tokens,
                   "new_tokens": args.new_tokens, "repeats": args.repeats.max(1),
                   "prefill_tokens_per_s": pp, "decode_tokens_per_s": tg,
                   "decode_fastest_tenth_tokens_per_s": tg_fast})
        );
    } else {
        println!("{}", model.description);
        println!(
            "'{}' ({} threads): prompt processing {} tokens: {:.1} tok/s · decode {} tokens: {:.1} tok/s (median of {})",
            b.name(),
            b.cpu().threads(),
            args.prompt_tokens,
            pp,
            args.new_tokens,
            tg,
            args.repeats.max(1)
        );
    }
    Ok(())
}
