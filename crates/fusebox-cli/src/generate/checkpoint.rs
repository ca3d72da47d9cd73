//! `fusebox generate` for a from-scratch checkpoint: the addition task's or byte-level
//! text's tokens, streamed as they come, through the KV cache.

use std::io::Write;
use std::time::Instant;

use fusebox::{Error, Result};
use fusebox_models::checkpoint;
use fusebox_models::data::{addition, text};
use fusebox_models::generate::{generate_with, Drafter, Session};
use fusebox_models::Sampler;
use serde_json::json;

use super::args::GenerateArgs;
use crate::backends::backend_for;

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

/// Generates from the from-scratch checkpoint `--model` names.
pub(crate) fn run(args: &GenerateArgs, mut sampler: Sampler) -> Result<()> {
    if args.drafting.draft_model.is_some() {
        return Err(Error::unsupported(
            "generate",
            "--draft-model with a from-scratch training checkpoint (its tokens are its task's own); --draft-ngram works",
        ));
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
    let mut drafter = args.drafting.draft_ngram.map(|n| Drafter::ngram(n, args.drafting.max_draft())).transpose()?;
    let drafts = drafter.as_mut();
    let out = generate_with(&mut session, b.as_ref(), &prompt, args.max_tokens, &mut sampler, &stop, drafts, |t| {
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
