//! `fusebox train` from scratch: the built-in addition task by default, or `--data
//! FILE` (byte-level text), on a preset model shape; `--resume` of such a run.

use std::sync::Arc;

use fusebox::{ComputeBackend, Error, Result};
use fusebox_models::comm::Communicator;
use fusebox_models::data::addition::{self, Addition};
use fusebox_models::data::text::{self, TextData};
use fusebox_models::generate::{generate, Session};
use fusebox_models::train::{self, Task, TrainConfig, Trainer};
use fusebox_models::{ModelConfig, Sampler, SamplerConfig, Style};

use super::args::TrainArgs;
use super::plan::plan_ranks;
use super::run_loop;
use crate::backends::backend_for;
use crate::memory::{available_memory, gib};

/// The defaults of a fresh run for the chosen architecture: the presets with QK-norm
/// (qwen3, gemma3) sit on a loss plateau near 0.46 for about 2,000 steps on the addition
/// task before they learn it, so their cosine schedule runs 6,000 steps.
fn defaults(args: &TrainArgs) -> TrainConfig {
    let mut config = TrainConfig::default();
    let style = args.arch.as_deref().and_then(|a| Style::parse(a).ok());
    if style.is_some_and(|s| ModelConfig::tiny(s, 16, 16).arch().qk_norm) {
        config.steps = 6000;
    }
    config
}

/// The architectures `--arch` takes, for messages.
fn style_names() -> String {
    Style::ALL.into_iter().map(Style::name).collect::<Vec<_>>().join(", ")
}

/// The model shape of a preset for a vocabulary and context.
pub fn preset(name: &str, vocab: usize, max_seq: usize) -> Result<ModelConfig> {
    if let Some(style) = name.strip_prefix("tiny-").and_then(|arch| Style::parse(arch).ok()) {
        return Ok(ModelConfig::tiny(style, vocab, max_seq));
    }
    let cfg = match name {
        "small-llama" => ModelConfig {
            n_layers: 4,
            d_model: 256,
            n_heads: 8,
            n_kv_heads: 4,
            d_ff: 704,
            ..ModelConfig::tiny(Style::Llama, vocab, max_seq)
        },
        "small-gpt2" => ModelConfig {
            n_layers: 4,
            d_model: 256,
            n_heads: 8,
            n_kv_heads: 8,
            d_ff: 1024,
            ..ModelConfig::tiny(Style::Gpt2, vocab, max_seq)
        },
        "gpt2-124m" => ModelConfig { vocab_size: vocab, max_seq: max_seq.max(1024), ..ModelConfig::gpt2_124m() },
        other => {
            return Err(Error::value(
                "train",
                "preset",
                format!("tiny-ARCH (ARCH one of {}), small-llama, small-gpt2 or gpt2-124m", style_names()),
                other,
            ))
        }
    };
    Ok(cfg)
}

/// The model shape of a fresh run: the preset (or `--arch`'s tiny preset) with the shape
/// flags on top.
fn model_config(args: &TrainArgs, task: &Task, seq: usize) -> Result<ModelConfig> {
    let name = match (&args.preset, &args.arch) {
        (_, Some(arch)) => {
            let style = Style::parse(arch)
                .map_err(|_| Error::value("train", "--arch", format!("one of {}", style_names()), arch))?;
            format!("tiny-{}", style.name())
        }
        (Some(p), None) => p.clone(),
        (None, None) => "tiny-gpt2".into(),
    };
    let mut cfg = preset(&name, task.vocab_size(), seq.max(16))?;
    cfg.n_layers = args.layers.unwrap_or(cfg.n_layers);
    cfg.d_model = args.d_model.unwrap_or(cfg.d_model);
    cfg.n_heads = args.heads.unwrap_or(cfg.n_heads);
    cfg.n_kv_heads = args.kv_heads.unwrap_or(if cfg.style == Style::Gpt2 { cfg.n_heads } else { cfg.n_kv_heads });
    cfg.validate()?;
    Ok(cfg)
}

/// Refuses a run whose estimated memory (of one rank of `world`) exceeds what the machine
/// has available.
fn check_memory(model: &ModelConfig, config: &TrainConfig, seq: usize, world: usize) -> Result<()> {
    let params = model.param_count();
    let parts = config.memory_breakdown_per_rank(model, seq, world);
    let Some((need, parts)) = parts.and_then(|p| Some((p.total()?, p))) else {
        return Err(Error::value(
            "train",
            "memory",
            "a model and batch whose size fits in 64 bits",
            format!("{} layers, d_model {}, batch {} × {seq} tokens", model.n_layers, model.d_model, config.batch),
        ));
    };
    crate::memory::cache_step_buffers(parts.per_step().unwrap_or(need));
    if let Some(avail) = available_memory() {
        if need > avail {
            return Err(Error::value(
                "train",
                "memory",
                format!("at most the {} available (MemAvailable)", gib(avail)),
                format!(
                    "an estimated {} for {} parameters (weights, gradients, AdamW moments: {}) and a batch of {} × \
                     {seq} tokens (activations {}{}, logits {}); use a smaller model or --batch{}",
                    gib(need),
                    params.map_or("?".into(), |p| p.to_string()),
                    gib(parts.state),
                    config.batch,
                    gib(parts.activations),
                    if config.checkpoint_activations { ", checkpointed" } else { "" },
                    gib(parts.logits),
                    if config.checkpoint_activations {
                        String::new()
                    } else {
                        format!(" or --checkpoint-activations (activations {})", gib(parts.activations_checkpointed))
                    }
                ),
            ));
        }
    }
    Ok(())
}

/// One rank's part of a from-scratch `fusebox train` (all of it in a world of one).
pub(crate) fn run(args: &TrainArgs, comm: &Arc<dyn Communicator>) -> Result<()> {
    let default_out = if args.data.is_some() { "runs/text" } else { "runs/addition" };
    let plan = plan_ranks(args, defaults(args), default_out, comm)?;
    let config = plan.config.clone();
    config.validate()?;
    let task = match &args.data {
        Some(path) => Task::Text(TextData::load(path, config.seq_len)?),
        None => Task::Addition(Addition::new(config.seed)),
    };
    let seq = task.seq_len(&config);
    let b = backend_for(&args.backend, args.threads)?;
    let b = b.as_ref();
    let mut trainer = match &plan.resume {
        Some(info) => {
            // The shape is read and checked against the memory before the weights load.
            let path = info.dir.join("config.json");
            let json = fusebox_models::files::read_json(&path, "config.json", fusebox_models::files::MAX_CONFIG_BYTES)?;
            let shape = ModelConfig::from_json(&json).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
            check_memory(&shape, &config, seq, comm.world_size())?;
            let (model, saved) = train::load_model(b, &info.dir)?;
            Trainer::resume(b, model, &saved, config, task)?
        }
        None => {
            let model_config = model_config(args, &task, seq)?;
            check_memory(&model_config, &config, seq, comm.world_size())?;
            Trainer::scratch(b, model_config, config, task)?
        }
    };
    trainer.join(b, comm.clone())?;
    let cfg = &trainer.model.config;
    let shape = format!(
        "{} layers, d_model {}, {} heads / {} kv heads",
        cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads
    );
    let millions = trainer.model.net.params.len() as f64 / 1e6;
    let intro = format!("training {} ({shape}, {millions:.2}M parameters)", cfg.style.name());
    run_loop::train(b, args, &plan, &mut trainer, &intro, None, |t| samples(t, b))
}

/// A few held-out problems (addition) or a text sample, generated through the KV cache.
fn samples(trainer: &Trainer, b: &dyn ComputeBackend) -> Result<Vec<String>> {
    let mut sampler = Sampler::new(SamplerConfig::default())?;
    let net = &trainer.model.net;
    let max_seq = trainer.model.config.max_seq;
    let lines: Vec<String> = match &trainer.data {
        Task::Addition(task) => task
            .eval
            .iter()
            .take(5)
            .map(|&(x, y)| {
                let prompt = addition::prompt_tokens(x, y);
                let mut session = Session::new(net, b, (prompt.len() + 5).min(max_seq))?;
                let out = generate(&mut session, b, &prompt, 5, &mut sampler, &[addition::END], |_| Ok(()))?.tokens;
                let got = addition::read_answer(&out);
                let mark = if got == Some(x + y) { "✓" } else { "✗" };
                Ok(format!(
                    "  {x}+{y}={} (reversed: {}) → {} {mark}",
                    addition::render(&out),
                    got.map_or("?".into(), |v| v.to_string()),
                    x + y
                ))
            })
            .collect::<Result<_>>()?,
        Task::Random { .. } => return Ok(Vec::new()),
        Task::Text(_) => {
            let mut sampler =
                Sampler::new(SamplerConfig { temperature: 0.8, top_k: 40, seed: 1, ..Default::default() })?;
            let prompt: Vec<u32> = "\n".bytes().map(u32::from).collect();
            let n = 300.min(max_seq - 1);
            let mut session = Session::new(net, b, n + prompt.len())?;
            let out = generate(&mut session, b, &prompt, n, &mut sampler, &[], |_| Ok(()))?.tokens;
            vec![format!("  {}", text::decode(&out))]
        }
    };
    Ok(std::iter::once("samples (greedy, through the KV cache):".to_string()).chain(lines).collect())
}
