//! `fusebox serve --model M`: an OpenAI-compatible HTTP server (see `fusebox_serve`).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use fusebox::Result;

use crate::backends::backend_for;

#[derive(Args)]
pub struct ServeArgs {
    /// A GGUF file or a Hugging Face directory with a chat model.
    #[arg(long)]
    model: PathBuf,
    /// Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests generated together, each in its own KV-cache slot.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Positions of each slot's KV cache (default min(2048, the model's context)).
    #[arg(long)]
    ctx_size: Option<usize>,
    /// Requests that may wait for a slot; beyond, 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Most prompt tokens read between two decode steps.
    #[arg(long, default_value_t = 256)]
    prefill_chunk: usize,
    /// Require `Authorization: Bearer KEY` on /v1/* and /metrics.
    #[arg(long)]
    api_key: Option<String>,
    /// The model's name in /v1/models (default: the file name without .gguf).
    #[arg(long)]
    alias: Option<String>,
    /// Seconds running answers may go on after SIGTERM/Ctrl-C before they are cut.
    #[arg(long, default_value_t = 2.0)]
    shutdown_grace: f64,
    /// KV-cache element type of every slot: f32, f16 or bf16 (as `generate`).
    #[arg(long, default_value = "f16", value_parser = crate::generate::parse_cache_type)]
    cache_type: fusebox::DType,
    /// MiB of prompt-prefix keys and values kept for reuse by later requests (0: no
    /// prefix caching; see docs/serve.md).
    #[arg(long, default_value_t = 256)]
    cache_ram: usize,
    /// Compute backend: cpu or wgpu.
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// CPU threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Speculative decoding of a lone generating request (see docs/serve.md).
    #[command(flatten)]
    drafting: crate::generate::DraftArgs,
    #[command(flatten)]
    pipeline: crate::pipeline::PipelineArgs,
}

pub fn run(args: &ServeArgs) -> Result<()> {
    if !(args.shutdown_grace.is_finite() && args.shutdown_grace >= 0.0) {
        return Err(fusebox::Error::value("serve", "--shutdown-grace", "seconds ≥ 0", args.shutdown_grace));
    }
    args.drafting.check("serve")?;
    let dist = crate::pipeline::Distributed::from_environment(&args.pipeline)?;
    if args.drafting.enabled() && dist.is_split() {
        return Err(fusebox::Error::unsupported(
            "serve",
            "speculative decoding (--draft-model, --draft-ngram) of a model split over MPI ranks: the other ranks' \
             caches cannot be cut back to the accepted drafts",
        ));
    }
    dist.run(|| serve(args, &dist))
}

/// The server on rank 0 (or the only process); under mpirun the other ranks follow its
/// batches through their stages, one cache per slot.
fn serve(args: &ServeArgs, dist: &crate::pipeline::Distributed) -> Result<()> {
    let b = backend_for(&args.backend, args.threads)?;
    // Every slot's cache counts in the balance of the stages.
    let positions = args.ctx_size.unwrap_or(2048).saturating_mul(args.parallel.max(1));
    if !dist.is_lead() {
        // mpirun hands SIGTERM and Ctrl-C to every rank: rank 0 ends the server and then
        // this loop (Pipeline::finish), so a follower outlives the signal.
        ctrlc::set_handler(|| {}).map_err(|e| fusebox::Error::Io(format!("serve: handling signals: {e}")))?;
        let ctx = |context: usize| args.ctx_size.unwrap_or_else(|| 2048.min(context));
        return dist.follow(b.as_ref(), &args.model, Some(positions), args.cache_type, args.parallel, ctx);
    }
    let model = dist.load(b.as_ref(), &args.model, Some(positions), args.cache_type)?;
    let ctx = args.ctx_size.unwrap_or_else(|| 2048.min(model.context_length()));
    let description = model.description.clone();
    // Every slot holds a cache of `ctx` positions.
    crate::generate::check_cache_memory(&model, ctx.saturating_mul(args.parallel.max(1)), args.cache_type)?;
    let draft = crate::generate::load_draft_model(b.as_ref(), &args.drafting, &model)?;
    let draft = match (draft, args.drafting.draft_ngram) {
        (Some(m), _) => Some(fusebox_serve::engine::DraftSource::Model(std::sync::Arc::new(m))),
        (None, Some(n)) => Some(fusebox_serve::engine::DraftSource::Ngram(n)),
        (None, None) => None,
    };
    let draft = draft.map(|source| fusebox_serve::engine::DraftConfig { source, max_draft: args.drafting.max_draft() });
    let config = fusebox_serve::ServerConfig {
        host: args.host.clone(),
        port: args.port,
        parallel: args.parallel,
        ctx_size: args.ctx_size,
        queue: args.queue,
        prefill_chunk: args.prefill_chunk,
        api_key: args.api_key.clone(),
        model_id: args.alias.clone(),
        shutdown_grace: Duration::from_secs_f64(args.shutdown_grace),
        cache_type: args.cache_type,
        cache_ram: args
            .cache_ram
            .checked_mul(1 << 20)
            .ok_or_else(|| fusebox::Error::value("serve", "--cache-ram", "MiB that fit in memory", args.cache_ram))?,
        draft,
        ..Default::default()
    };
    let threads = b.cpu().threads();
    let pipeline = model.pipeline.clone();
    let server = match fusebox_serve::Server::start_with(b, model, config, fusebox_serve::termination()) {
        Ok(s) => s,
        // The other ranks wait for batches: end them before reporting.
        Err(e) => {
            if let Some(p) = &pipeline {
                let _ = p.finish();
            }
            return Err(e);
        }
    };
    eprintln!(
        "[{description}] listening on http://{} ({} slots × {ctx} positions, {threads} threads); SIGTERM or Ctrl-C stops",
        server.addr(),
        args.parallel
    );
    server.wait()?;
    if let Some(p) = pipeline {
        for line in crate::pipeline::describe_ranks(&p.finish()?) {
            eprintln!("{line}");
        }
    }
    eprintln!("stopped");
    Ok(())
}
