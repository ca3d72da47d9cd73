//! `fusebox generate` for pretrained models: a GGUF file or a Hugging Face directory.
//! Tokens are printed as they come (never splitting a UTF-8 character), then the
//! prompt and generation speeds; `--json` prints one object instead.

use std::io::Write;

use fusebox::{DType, Error, Result};
use fusebox_models::generate::generate_with;
use fusebox_models::pretrained;
use fusebox_models::Sampler;
use serde_json::json;

use super::args::GenerateArgs;
use crate::backends::backend_for;
use crate::memory::{available_memory, gib};
use crate::pipeline::Distributed;

/// Default KV-cache size when `--ctx-size` is not given (clamped to the model's context).
const DEFAULT_CTX: usize = 2048;

/// Refuses a KV cache of `ctx` positions stored in `dtype` that does not fit in the
/// memory available.
pub(crate) fn check_cache_memory(model: &pretrained::Pretrained, ctx: usize, dtype: DType) -> Result<()> {
    let a = &model.network.arch;
    let (layers, kv_heads, head_dim) = (a.n_layers, a.n_kv_heads, a.head_dim);
    let rope = a.positions == fusebox_models::transformer::Positions::Rope;
    // Keys and values in the cache's dtype, every layer; Llama's rope tables add cos and
    // sin, head_dim / 2 each (f32).
    let per_position = fusebox_models::transformer::kv_bytes_per_position(a, dtype);
    let per_position = per_position + if rope { 4 * head_dim as u128 } else { 0 };
    let bytes = per_position * (ctx as u128);
    if let Some(avail) = available_memory() {
        if bytes > u128::from(avail) {
            return Err(Error::value(
                "generate",
                "--ctx-size",
                format!("a KV cache that fits in the {} available", gib(avail)),
                format!(
                    "{ctx} positions, which need {} ({layers} layers × {kv_heads} kv heads × {head_dim} × 2 × {dtype})",
                    gib(u64::try_from(bytes).unwrap_or(u64::MAX))
                ),
            ));
        }
    }
    Ok(())
}

/// Generates from the pretrained model (or fine-tuning checkpoint) `--model` names.
/// Under mpirun, this rank's stage; ranks other than 0 only follow.
pub(crate) fn run(args: &GenerateArgs, mut sampler: Sampler, dist: &Distributed) -> Result<()> {
    let b = backend_for(&args.backend, args.threads)?;
    if !dist.is_lead() {
        let ctx = |context: usize| args.ctx_size.unwrap_or_else(|| DEFAULT_CTX.min(context));
        return dist.follow(b.as_ref(), &args.model, args.ctx_size, args.cache_type, 1, ctx);
    }
    let model = dist.load(b.as_ref(), &args.model, args.ctx_size, args.cache_type)?;
    let tok = &model.tokenizer;
    let mut prompt = if args.chat {
        let template = model.chat_template()?;
        if let Some(notice) = template.notice() {
            eprintln!("[{notice}]");
        }
        template.encode(tok, &template.apply(&[("user", args.prompt.as_str())], true)?)
    } else {
        tok.encode(&args.prompt, tok.add_bos_default())
    };
    if prompt.is_empty() {
        // An empty prompt starts from BOS (or EOS, which GPT-2 uses as its document start).
        prompt.extend(tok.bos_id().or(tok.eos_id()));
    }
    if prompt.is_empty() {
        return Err(Error::value("generate", "prompt", "some text (the tokenizer has no BOS to start from)", "\"\""));
    }
    let ctx = args.ctx_size.unwrap_or_else(|| DEFAULT_CTX.min(model.context_length()));
    if ctx > model.context_length() {
        return Err(Error::value(
            "generate",
            "--ctx-size",
            format!("1..={} (the model's context length)", model.context_length()),
            ctx,
        ));
    }
    check_cache_memory(&model, ctx, args.cache_type)?;
    let mut session = model.session_with_cache(b.as_ref(), ctx, args.cache_type)?;
    // The run's length is known: back it once rather than grow while decoding.
    session.reserve(b.as_ref(), prompt.len().saturating_add(args.max_tokens))?;
    let draft_model = super::load_draft_model(b.as_ref(), &args.drafting, &model)?;
    let vocab = model.tokenizer.vocab_size();
    let mut drafter =
        super::drafting::drafter(b.as_ref(), &args.drafting, draft_model.as_ref(), vocab, ctx, args.cache_type)?;
    let stop = model.stop_ids(args.chat);
    let streaming = !args.json;
    let mut stream = tok.stream_decoder(true);
    let mut out = std::io::stdout();
    if streaming {
        if !args.chat {
            print!("{}", args.prompt);
        }
        let _ = out.flush();
    }
    let generation = generate_with(
        &mut session,
        b.as_ref(),
        &prompt,
        args.max_tokens,
        &mut sampler,
        &stop,
        drafter.as_mut(),
        |t| {
            if streaming && !stop.contains(&t) {
                print!("{}", stream.push(t)?);
                let _ = out.flush();
            }
            Ok(())
        },
    )?;
    drop(session);
    let stages = dist.finish(&model)?;
    let shown: Vec<u32> = generation.tokens.iter().copied().filter(|t| !stop.contains(t)).collect();
    if args.json {
        let kind = model.network.arch.name.as_str();
        let v = json!({
            "model": args.model.display().to_string(),
            "network": kind,
            "prompt_ids": prompt,
            "generated_ids": generation.tokens,
            "text": tok.decode_with(&shown, true)?,
            "stop_reason": generation.stop.name(),
            "prompt_tokens": generation.prompt_tokens,
            "generated_tokens": generation.tokens.len(),
            "prefill_seconds": generation.prefill_seconds,
            "decode_seconds": generation.decode_seconds,
            "prefill_tokens_per_s": generation.prefill_tokens_per_s(),
            "decode_tokens_per_s": generation.decode_tokens_per_s(),
            "ctx_size": ctx,
            "cache_type": args.cache_type.to_string(),
            "threads": b.cpu().threads(),
            "pipeline": stages.as_deref().map(crate::pipeline::to_json),
            "draft": super::draft_json(drafter.as_ref(), &generation.drafts),
            "peak_resident_bytes": fusebox_models::pipeline::peak_resident_bytes(),
        });
        println!("{v}");
    } else {
        print!("{}", stream.finish());
        println!();
        eprintln!(
            "[{}] prompt: {} tokens at {:.1} tok/s · generation: {} tokens at {:.1} tok/s ({}, {} threads)",
            model.description,
            generation.prompt_tokens,
            generation.prefill_tokens_per_s(),
            generation.tokens.len(),
            generation.decode_tokens_per_s(),
            generation.stop.name(),
            b.cpu().threads(),
        );
        if let Some(d) = &drafter {
            let s = &generation.drafts;
            eprintln!(
                "speculative ({}, up to {} a pass): {} drafted, {} accepted ({:.0}%) in {} passes",
                d.kind(),
                d.max_draft(),
                s.drafted,
                s.accepted,
                100.0 * s.acceptance_rate(),
                s.passes
            );
        }
        for line in stages.as_deref().map(crate::pipeline::describe).unwrap_or_default() {
            eprintln!("{line}");
        }
    }
    Ok(())
}
