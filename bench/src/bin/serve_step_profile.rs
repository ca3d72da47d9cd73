//! Where a decode step of `fusebox serve` spends its time, without HTTP.
//!
//! ```sh
//! cargo run --release -p fusebox-bench --bin serve_step_profile -- \
//!     models/SmolLM2-135M-Instruct.Q4_1.gguf [threads=2] [tokens=128] [rounds=3]
//! ```
//!
//! Each round runs, one after another on one backend (so the figures share the
//! machine's state), greedy from the same chat prompt:
//!
//! 1. `generate`: the decode loop of `fusebox generate` (`forward_cached`, one token at a
//!    time, argmax) — the speed a single stream through the server should reach — also
//!    counted from the prompt on, the peer of the engine's figures;
//! 2. `step`: the server's step for one sequence, split into the batched forward
//!    (`forward_batch`), sampling, and detokenizing (the text of every generated token so
//!    far, as the engine flushes it);
//! 3. `engine 1` and `engine 8`: the model thread itself (`engine::run`) with 1 and with
//!    8 concurrent jobs (different prompts), tokens counted as they arrive on the jobs'
//!    channels, from submission (prompts included): everything of the server but HTTP
//!    and SSE.
//!
//! Prints per round and the medians: tokens/s of each, the split of a step in
//! milliseconds, and the ratios `step / generate`, `engine 1 / generate` and
//! `engine 8 / engine 1`. Figures on a machine shared with other work are indicative.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fusebox::ComputeBackend;
use fusebox_models::open;
use fusebox_models::pretrained::Pretrained;
use fusebox_models::transformer::KvCache;
use fusebox_models::{Sampler, SamplerConfig};
use fusebox_serve::engine::{self, EngineConfig, Event, Job, Msg};
use fusebox_serve::metrics::Metrics;

const PROMPTS: [&str; 8] = [
    "Tell me a long story about a dragon.",
    "Explain how a steam engine works, in detail.",
    "Write a letter to a friend about your garden.",
    "Describe a walk through a busy market.",
    "What makes a good cup of coffee? Explain at length.",
    "Tell me about the history of sailing ships.",
    "Write a poem about the sea and then explain it.",
    "Describe the life of a honey bee.",
];

fn main() -> fusebox::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: serve_step_profile MODEL.gguf [threads=2] [tokens=128] [rounds=3]");
        std::process::exit(2);
    };
    let num = |i: usize, default: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default);
    let (threads, tokens, rounds) = (num(1, 2), num(2, 128), num(3, 3));
    // FUSEBOX_INT8_DECODE=1: the integer decode path, as `fusebox serve --int8`.
    let int8 = std::env::var("FUSEBOX_INT8_DECODE").is_ok_and(|v| v == "1");
    let b: Arc<dyn ComputeBackend> =
        Arc::new(fusebox::CpuBackend::builder().threads(threads).exact_decode(!int8).build()?);
    let model = Arc::new(open::load(b.as_ref(), path.as_ref())?);
    let template = model.chat_template()?;
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| template.apply(&[("user", p)], true).map(|t| template.encode(&model.tokenizer, &t)))
        .collect::<fusebox::Result<_>>()?;
    let ctx = prompts.iter().map(Vec::len).max().unwrap_or(0) + tokens + 1;
    let dtype = fusebox::DType::F16;
    println!(
        "{} · {threads} threads · {tokens} tokens · f16 cache · {} decode · {rounds} rounds",
        model.description,
        if int8 { "int8" } else { "f32" }
    );

    let mut rows: Vec<[f64; 9]> = Vec::new();
    for round in 0..rounds {
        let (gen, gen_all) = generate_speed(&model, b.as_ref(), &prompts[0], tokens, ctx, dtype)?;
        let step = step_split(&model, b.as_ref(), &prompts[0], tokens, ctx, dtype)?;
        let e1 = engine_speed(&model, &b, &prompts[..1], tokens, ctx, dtype)?;
        let e8 = engine_speed(&model, &b, &prompts, tokens, ctx, dtype)?;
        let r = [gen, step.0, step.1, step.2, step.3, e1, e8, e8 / e1, gen_all];
        println!(
            "round {round}: generate {gen:.1} tok/s ({gen_all:.1} with the prompt) · step {:.1} tok/s (forward {:.2} ms, sample {:.3} ms, \
             detokenize {:.3} ms) · engine 1 {e1:.1} tok/s · engine 8 {e8:.1} tok/s ({:.2}×)",
            r[1], r[2], r[3], r[4], r[7]
        );
        rows.push(r);
    }
    let med = |k: usize| {
        let mut v: Vec<f64> = rows.iter().map(|r| r[k]).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "median: generate {:.1} tok/s ({:.1} with the prompt) · step {:.1} tok/s (forward {:.2} ms, sample {:.3} ms, detokenize {:.3} ms) · \
         engine 1 {:.1} tok/s · engine 8 {:.1} tok/s",
        med(0),
        med(8),
        med(1),
        med(2),
        med(3),
        med(4),
        med(5),
        med(6)
    );
    println!(
        "ratios: step / generate {:.3} · engine 1 / generate with the prompt {:.3} · engine 8 / engine 1 {:.2}",
        med(1) / med(0),
        med(5) / med(8),
        med(7)
    );
    Ok(())
}

/// Tokens/s of `fusebox generate`'s loop producing `tokens` tokens: decoding alone (after
/// the first token), and from the prompt on (the prompt's pass included, as the engine's
/// figure is).
fn generate_speed(
    model: &Pretrained,
    b: &dyn ComputeBackend,
    prompt: &[u32],
    tokens: usize,
    ctx: usize,
    dtype: fusebox::DType,
) -> fusebox::Result<(f64, f64)> {
    let net = &model.network;
    let mut cache = net.new_cache_of(b, ctx, dtype)?;
    let start = Instant::now();
    let mut logits = net.forward_cached(b, prompt, &mut cache)?;
    let decode = Instant::now();
    for _ in 1..tokens {
        let next = fusebox_models::sampler::argmax(&logits);
        logits = net.forward_cached(b, &[next], &mut cache)?;
    }
    Ok(((tokens - 1) as f64 / decode.elapsed().as_secs_f64(), tokens as f64 / start.elapsed().as_secs_f64()))
}

/// The server's step for one sequence: tokens/s, and milliseconds per step of the
/// forward, the sampling and the detokenizing.
fn step_split(
    model: &Pretrained,
    b: &dyn ComputeBackend,
    prompt: &[u32],
    tokens: usize,
    ctx: usize,
    dtype: fusebox::DType,
) -> fusebox::Result<(f64, f64, f64, f64)> {
    let net = &model.network;
    let mut cache: KvCache = net.new_cache_of(b, ctx, dtype)?;
    let mut logits = vec![net.forward_cached(b, prompt, &mut cache)?];
    let mut sampler = Sampler::new(SamplerConfig::default())?;
    let vocab = model.tokenizer.vocab_size().clamp(1, net.arch.vocab_size);
    let (mut fwd, mut smp, mut detok) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut shown = Vec::new();
    let start = Instant::now();
    for _ in 0..tokens {
        let t = Instant::now();
        let next = sampler.sample(&logits[0][..vocab], &[])?;
        smp += t.elapsed();
        let t = Instant::now();
        shown.push(next);
        let text = model.tokenizer.decode_with(&shown, true)?;
        std::hint::black_box(text);
        detok += t.elapsed();
        let t = Instant::now();
        logits = net.forward_batch(b, &[next], &mut [&mut cache])?;
        fwd += t.elapsed();
    }
    let per = |d: Duration| d.as_secs_f64() * 1e3 / tokens as f64;
    Ok((tokens as f64 / start.elapsed().as_secs_f64(), per(fwd), per(smp), per(detok)))
}

/// Aggregate tokens/s of the model thread running one job per prompt (each `tokens`
/// long, greedy, no stop token), from the first job's submission to the last token.
fn engine_speed(
    model: &Arc<Pretrained>,
    b: &Arc<dyn ComputeBackend>,
    prompts: &[Vec<u32>],
    tokens: usize,
    ctx: usize,
    dtype: fusebox::DType,
) -> fusebox::Result<f64> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let metrics = Arc::new(Metrics::default());
    let config = EngineConfig {
        parallel: prompts.len(),
        ctx_size: ctx,
        prefill_chunk: 256,
        cache_type: dtype,
        cache_ram: 0,
        cache_block: 256,
        draft: None,
    };
    let (m, bb, mm) = (model.clone(), b.clone(), metrics.clone());
    let thread = std::thread::spawn(move || engine::run(bb, m, config, rx, mm, ready_tx));
    ready_rx.recv().map_err(|_| fusebox::Error::Io("the model thread ended".into()))??;
    let mut receivers = Vec::new();
    let start = Instant::now();
    for p in prompts {
        let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
        let job = Job {
            prompt: p.clone(),
            max_tokens: tokens,
            sampler: Sampler::new(SamplerConfig::default())?,
            stop_ids: Vec::new(),
            stop_strings: Vec::new(),
            format: fusebox_models::chat::OutputFormat::Plain,
            logprobs: None,
            guide: None,
            events: engine::EventSink::new(0, etx),
        };
        metrics.queue_depth.fetch_add(1, Ordering::Relaxed);
        tx.send(Msg::Job(job)).map_err(|_| fusebox::Error::Io("the model thread ended".into()))?;
        receivers.push(erx);
    }
    let mut generated = 0;
    for mut erx in receivers {
        while let Some((_, e)) = erx.blocking_recv() {
            match e {
                Event::Text { .. } | Event::Reasoning(_) | Event::ToolCall { .. } => {}
                Event::Done { completion_tokens, .. } => {
                    generated += completion_tokens;
                    break;
                }
                Event::Error(e) => return Err(fusebox::Error::Io(format!("job failed: {}", e.message))),
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let _ = tx.send(Msg::Shutdown { grace: Duration::ZERO });
    drop(tx);
    thread.join().map_err(|_| fusebox::Error::Io("the model thread panicked".into()))??;
    Ok(generated as f64 / secs)
}
