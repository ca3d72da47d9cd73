//! `fusebox bench generate --model PATH`: prompt processing (one prefill pass of
//! `--prompt-tokens`) and decoding (`--new-tokens` greedy steps, EOS ignored) in tokens
//! per second, the median of `--repeats` runs after a warm-up. `bench/peers/llama_cpp.py`
//! measures llama.cpp on the same file and shapes.
//!
//! Then the decode bandwidth at each of `--bandwidth-contexts` positions of context: a
//! decode step reads every weight once and the K and V rows of every cached position it
//! attends to (at the cache's dtype), so
//!
//! ```text
//!   bytes/token = Σ weights (the embedding: one row, unless it is also the output head)
//!               + Σ_layers min(n, window_l) · 2 · kv_dim · bytes(cache dtype)
//! ```
//!
//! with `n` the positions attended (the context plus the new token). Each timed step is
//! followed by a read of as many bytes (the vectorized sum `bench ops` uses as its read
//! reference) on the same threads; `% of read` is the median over steps of
//! `(bytes/token / t_step) / (bytes / t_read)`. A model smaller than the last-level
//! cache is read from it, and so is that same-size reference; so each step is also
//! followed by a read of a buffer four times the last-level cache (at least 128 MiB),
//! which must come from DRAM, and `% of DRAM read` is the same ratio against it. It also
//! counts the parallel regions
//! (fork-joins of the CPU backend's threads, `CpuBackend::parallel_regions`) one step
//! starts: each ends in a synchronisation of every thread.

use std::time::Instant;

use clap::Args;
use fusebox::{ComputeBackend, DType, Error, Result};
use fusebox_models::pretrained;
use fusebox_models::sampler::argmax;
use fusebox_models::transformer::{Arch, Ffn, Transformer};
use serde_json::json;

use super::measure;
use crate::backends::backend_for;

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
    /// KV cache storage: f16 (default, as `generate`), bf16 or f32; a list
    /// (`f32,f16`) measures the decode bandwidth with each in turn, in this run (the
    /// prompt/decode figures use the first).
    #[arg(long, value_delimiter = ',', default_value = "f16", value_parser = crate::generate::parse_cache_type)]
    cache_type: Vec<DType>,
    /// Contexts (positions already cached) at which the decode bandwidth is measured;
    /// empty (`--bandwidth-contexts=`) skips it.
    #[arg(long, value_delimiter = ',', default_value = "16,1500", value_parser = parse_context)]
    bandwidth_contexts: Vec<Option<usize>>,
    /// Decode steps timed (each beside a read of as many bytes) per context.
    #[arg(long, default_value_t = 32)]
    bandwidth_steps: usize,
    #[command(flatten)]
    pipeline: crate::pipeline::PipelineArgs,
}

/// One entry of `--bandwidth-contexts`: a position count, or nothing (`--bandwidth-contexts=`).
fn parse_context(s: &str) -> std::result::Result<Option<usize>, String> {
    match s.trim() {
        "" => Ok(None),
        n => n.parse().map(Some).map_err(|e| format!("'{n}' is not a context length (a whole number): {e}")),
    }
}

/// Bytes one decode step reads from the weights: every parameter once, except the token
/// (and learned position) embedding tables, of which a step reads one row each, unless
/// the token table is also the output head (then it is read whole, as the head), and a
/// mixture of experts' expert weights, of which a step reads the `top_k` of `experts`
/// it routes to.
fn weight_bytes_per_token(net: &Transformer) -> u128 {
    let params = &net.params.tensors;
    let mut all: u128 = params.iter().map(|t| t.byte_len() as u128).sum();
    for (l, layer) in net.index.layers.iter().enumerate() {
        if let (Ffn::Experts(e), Some(moe)) = (&layer.ffn, net.arch.experts_at(l)) {
            for i in [e.gate, e.up, e.down] {
                let bytes = params.get(i).map_or(0, |t| t.byte_len() as u128);
                all -= bytes - bytes * moe.top_k as u128 / moe.experts as u128;
            }
        }
    }
    let row = |i: usize| params.get(i).map_or(0, |t| t.byte_len() as u128 / t.dims()[0].max(1) as u128);
    let table = |i: usize| params.get(i).map_or(0, |t| t.byte_len() as u128);
    let mut bytes = all + row(net.index.embed);
    if net.index.head.is_some() {
        bytes -= table(net.index.embed);
    }
    if let Some(p) = net.index.pos_embed {
        bytes = bytes - table(p) + row(p);
    }
    bytes
}

/// Bytes of K and V a decode step attending to `n` positions reads from caches of
/// `dtype`: each layer's last `min(n, window)` positions.
fn kv_bytes_per_token(arch: &Arch, n: usize, dtype: DType) -> u128 {
    let row = 2 * arch.kv_dim() as u128 * dtype.storage_bytes(1) as u128;
    (0..arch.n_layers).map(|l| arch.window(l).map_or(n, |w| n.min(w)) as u128 * row).sum()
}

/// The decode bandwidth at one context: see the module docs.
struct Bandwidth {
    cache_type: DType,
    context: usize,
    tokens_per_s: f64,
    weight_bytes: u128,
    kv_bytes: u128,
    gbps: f64,
    read_gbps: f64,
    pct_of_read: f64,
    /// Bytes of the DRAM reference's buffer, and the last-level cache it was sized by
    /// (`None`: not reported by the system, 32 MiB assumed).
    dram_buffer_bytes: usize,
    llc_bytes: Option<usize>,
    dram_read_gbps: f64,
    pct_of_dram_read: f64,
    /// Parallel regions (fork-joins) the CPU backend started per step (median).
    regions_per_token: u64,
}

/// Fills a fresh session with `context` prompt tokens, then times `steps` greedy decode
/// steps, each followed by a read of as many bytes as the step reads.
fn decode_bandwidth(
    b: &dyn ComputeBackend,
    model: &pretrained::Pretrained,
    cache_type: DType,
    context: usize,
    steps: usize,
) -> Result<Bandwidth> {
    let net = &model.network;
    let cap = context + steps + 1;
    if context == 0 || cap > net.arch.context_length {
        return Err(Error::value(
            "bench generate",
            "--bandwidth-contexts",
            format!("1..={} (the model's context length, less --bandwidth-steps + 1)", net.arch.context_length),
            context,
        ));
    }
    let mut session = model.session_with_cache(b, cap, cache_type)?;
    session.reserve(b, cap)?;
    let mut logits = session.step(b, &bench_prompt(&model.tokenizer, context)?)?;
    let weight_bytes = weight_bytes_per_token(net);
    let kv = |n: usize| kv_bytes_per_token(&net.arch, n, cache_type);
    let per_step = |n: usize| (weight_bytes + kv(n)) as usize;
    let mut read = measure::Bandwidth::read(per_step(context + steps))?;
    read.run(b.cpu())?;
    let llc_bytes = fusebox::cpu::output::last_level_cache_bytes();
    let mut dram = measure::Bandwidth::read((4 * llc_bytes.unwrap_or(32 << 20)).max(128 << 20))?;
    dram.run(b.cpu())?;
    let (mut t_step, mut ratios, mut dram_ratios, mut regions) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..steps.max(1) {
        let n = context + i + 1;
        let regions_before = b.cpu().parallel_regions();
        let t = Instant::now();
        logits = session.step(b, &[argmax(&logits)])?;
        b.synchronize()?;
        let step_s = t.elapsed().as_secs_f64();
        regions.push(b.cpu().parallel_regions() - regions_before);
        let t = Instant::now();
        read.run(b.cpu())?;
        let read_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        dram.run(b.cpu())?;
        let dram_s = t.elapsed().as_secs_f64();
        t_step.push(step_s);
        ratios.push((per_step(n) as f64 / step_s) / (read.bytes() as f64 / read_s));
        dram_ratios.push((per_step(n) as f64 / step_s) / (dram.bytes() as f64 / dram_s));
    }
    let step = median(t_step);
    let n_mid = context + steps.max(1) / 2 + 1;
    let kv_bytes = kv(n_mid);
    let bytes = (weight_bytes + kv_bytes) as f64;
    let pct_of_read = 100.0 * median(ratios);
    let pct_of_dram_read = 100.0 * median(dram_ratios);
    regions.sort_unstable();
    Ok(Bandwidth {
        regions_per_token: regions[regions.len() / 2],
        cache_type,
        context,
        tokens_per_s: 1.0 / step,
        weight_bytes,
        kv_bytes,
        gbps: bytes / step / 1e9,
        read_gbps: bytes / step / 1e9 / (pct_of_read / 100.0),
        pct_of_read,
        dram_buffer_bytes: dram.bytes(),
        llc_bytes,
        dram_read_gbps: bytes / step / 1e9 / (pct_of_dram_read / 100.0),
        pct_of_dram_read,
    })
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
    let Some(&cache_type) = args.cache_type.first() else {
        return Err(Error::value("bench generate", "--cache-type", "f32, f16 or bf16 (or a list)", "nothing"));
    };
    let dist = crate::pipeline::Distributed::from_environment(&args.pipeline)?;
    dist.run(|| measure_generation(args, cache_type, &dist))
}

/// The measurement on rank 0 (or the only process); under mpirun the other ranks follow
/// through their stages, and the pipeline's hops are reported instead of the bandwidth.
fn measure_generation(args: &GenerateBenchArgs, cache_type: DType, dist: &crate::pipeline::Distributed) -> Result<()> {
    let b = backend_for(&args.backend, args.threads)?;
    // Room for the warm-up's four decode steps when fewer new tokens are asked for.
    let ctx = args.prompt_tokens + args.new_tokens.max(4) + 1;
    if !dist.is_lead() {
        return dist.follow(b.as_ref(), &args.model, Some(ctx), cache_type, 1, |_| ctx);
    }
    let model = dist.load(b.as_ref(), &args.model, Some(ctx), cache_type)?;
    let prompt = bench_prompt(&model.tokenizer, args.prompt_tokens)?;
    let wall = Instant::now();
    let mut session = model.session_with_cache(b.as_ref(), ctx, cache_type)?;
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
        session = model.session_with_cache(b.as_ref(), ctx, cache_type)?;
        // Backed for the whole run before the clock starts, as llama.cpp's context is.
        session.reserve(b.as_ref(), ctx)?;
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
    drop(session);
    let wall = wall.elapsed().as_secs_f64();
    let stages = dist.finish(&model)?;
    let mut bandwidth = Vec::new();
    // Under a pipeline each rank reads only its stage: one process's bandwidth figure
    // does not apply.
    let contexts = if stages.is_some() { &[][..] } else { &args.bandwidth_contexts[..] };
    for &c in contexts.iter().flatten() {
        for &t in &args.cache_type {
            bandwidth.push(decode_bandwidth(b.as_ref(), &model, t, c, args.bandwidth_steps)?);
        }
    }
    if args.json {
        let bw: Vec<_> = bandwidth
            .iter()
            .map(|w| {
                json!({"cache_type": w.cache_type.to_string(), "context": w.context, "decode_tokens_per_s": measure::round(w.tokens_per_s),
                       "weight_bytes_per_token": w.weight_bytes as u64, "kv_bytes_per_token": w.kv_bytes as u64,
                       "bytes_per_token": (w.weight_bytes + w.kv_bytes) as u64, "gbps": measure::round(w.gbps),
                       "read_gbps": measure::round(w.read_gbps), "pct_of_read": measure::round(w.pct_of_read),
                       "dram_read_gbps": measure::round(w.dram_read_gbps), "pct_of_dram_read": measure::round(w.pct_of_dram_read),
                       "dram_buffer_bytes": w.dram_buffer_bytes, "llc_bytes": w.llc_bytes,
                       "parallel_regions_per_token": w.regions_per_token})
            })
            .collect();
        println!(
            "{}",
            json!({"name": "generate", "model": args.model.display().to_string(), "description": model.description,
                   "backend": b.name(), "threads": b.cpu().threads(), "prompt_tokens": args.prompt_tokens,
                   "new_tokens": args.new_tokens, "repeats": args.repeats.max(1),
                   "cache_type": cache_type.to_string(), "activations": crate::backends::activations(b.as_ref()),
                   "prefill_tokens_per_s": pp, "decode_tokens_per_s": tg,
                   "decode_fastest_tenth_tokens_per_s": tg_fast, "decode_bandwidth": bw,
                   "pipeline": stages.as_deref().map(|s| pipeline_json(s, wall))})
        );
    } else {
        println!(
            "{} · {} KV cache · {} activations",
            model.description,
            cache_type,
            crate::backends::activations(b.as_ref())
        );
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
        for w in &bandwidth {
            let mb = |x: u128| x as f64 / 1e6;
            println!(
                "decode at context {} ({} cache): {:.1} tok/s × {:.1} MB/token (weights {:.1} + KV {:.1}) = {:.2} GB/s, \
                 {:.0}% of the read bandwidth of as many bytes ({:.2} GB/s), {:.0}% of the DRAM read bandwidth \
                 ({:.2} GB/s, a {} MiB buffer: 4 × the {} last-level cache, at least 128 MiB); {} parallel regions per token",
                w.context,
                w.cache_type,
                w.tokens_per_s,
                mb(w.weight_bytes + w.kv_bytes),
                mb(w.weight_bytes),
                mb(w.kv_bytes),
                w.gbps,
                w.pct_of_read,
                w.read_gbps,
                w.pct_of_dram_read,
                w.dram_read_gbps,
                w.dram_buffer_bytes >> 20,
                w.llc_bytes.map_or("32 MiB assumed".to_string(), |b| format!("{} MiB", b >> 20)),
                w.regions_per_token
            );
        }
        for line in stages.as_deref().map(crate::pipeline::describe).unwrap_or_default() {
            println!("{line}");
        }
        if let Some(s) = stages.as_deref() {
            println!("[pipeline] bubble: {:.0}% of the ranks' time idle", 100.0 * bubble(s, wall));
        }
        // Each cache type against the f32 cache at the same context, when both ran.
        for w in &bandwidth {
            let f32_run = bandwidth.iter().find(|x| x.context == w.context && x.cache_type == DType::F32);
            if let Some(base) = f32_run.filter(|_| w.cache_type != DType::F32) {
                println!(
                    "decode at context {}: {} cache {:.2}× the f32 cache's tokens/s",
                    w.context,
                    w.cache_type,
                    w.tokens_per_s / base.tokens_per_s
                );
            }
        }
    }
    Ok(())
}

/// The fraction of the ranks' time spent waiting over `wall` seconds: `1 − Σ compute /
/// (N · wall)`. A single stream keeps one stage busy at a time, so at best `(N − 1)/N`.
fn bubble(stages: &[fusebox_models::pipeline::StageStats], wall: f64) -> f64 {
    let busy: f64 = stages.iter().map(|s| s.compute_seconds).sum();
    (1.0 - busy / (stages.len() as f64 * wall.max(1e-12))).clamp(0.0, 1.0)
}

fn pipeline_json(stages: &[fusebox_models::pipeline::StageStats], wall: f64) -> serde_json::Value {
    let mut v = crate::pipeline::to_json(stages);
    v["bubble_fraction"] = json!(bubble(stages, wall));
    v["seconds"] = json!(wall);
    v
}
