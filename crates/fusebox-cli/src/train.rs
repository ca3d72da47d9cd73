//! `fusebox train`: the built-in addition task by default, or `--data FILE`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use fusebox::{ComputeBackend, Error, Result};
use fusebox_models::checkpoint;
use fusebox_models::comm::{Communicator, ReduceOp};
use fusebox_models::data::addition::{self, Addition};
use fusebox_models::data::text::{self, TextData};
use fusebox_models::generate::{generate, Session};
use fusebox_models::train::{resume_info, EvalStats, Task, TrainConfig, Trainer};
use fusebox_models::{ModelConfig, Sampler, SamplerConfig, Style};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Model shape: tiny-gpt2 (default: learns the addition task to 100% held-out exact
    /// match in 1,500–2,500 steps), tiny-llama, small-llama, small-gpt2, gpt2-124m.
    /// Fresh runs only: a resumed run keeps its checkpoint's shape.
    #[arg(long, conflicts_with = "arch")]
    pub preset: Option<String>,
    /// Architecture of a fresh model: gpt2, llama, qwen3 or gemma3, each sized for the
    /// addition task (the tiny-<arch> preset). Fresh runs only.
    #[arg(long)]
    pub arch: Option<String>,
    /// Override the number of layers (fresh runs only).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Override the model width (fresh runs only).
    #[arg(long)]
    pub d_model: Option<usize>,
    /// Override the query heads (fresh runs only).
    #[arg(long)]
    pub heads: Option<usize>,
    /// Override the key/value heads, Llama style (fresh runs only).
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// Optimizer steps in all [default: 3000, 6000 with --arch qwen3|gemma3; on --resume:
    /// the saved value]. The cosine
    /// schedule ends here, so changing it on --resume changes the learning rates to come.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Sequences per micro-batch [default: 64; on --resume: the saved value].
    #[arg(long)]
    pub batch: Option<usize>,
    /// Micro-batches per step, gradient accumulation [default: 1; on --resume: the saved value].
    #[arg(long)]
    pub accumulation: Option<usize>,
    /// Tokens per sequence for --data, the addition task uses 12 [default: 128; on
    /// --resume: the saved value].
    #[arg(long)]
    pub seq: Option<usize>,
    /// Peak learning rate [default: 0.002; on --resume: the saved value]. 2e-3 learns the
    /// default addition task for each of ten seeds tried; 3e-3 and 5e-3 stalled on some
    /// below 99% in 3,000 steps.
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f32>,
    /// Warmup steps [default: 100; on --resume: the saved value].
    #[arg(long)]
    pub warmup: Option<u64>,
    /// AdamW weight decay, matrices only [default: 0.1; on --resume: the saved value].
    #[arg(long, allow_negative_numbers = true)]
    pub weight_decay: Option<f32>,
    /// Global gradient-norm clip, 0 = off [default: 1.0; on --resume: the saved value].
    #[arg(long, allow_negative_numbers = true)]
    pub clip: Option<f32>,
    /// Random seed, model init and data order [default: 1337; on --resume: the saved value].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Backend: cpu, cpu:N or wgpu.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// CPU threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Train on this UTF-8 text file (byte-level tokens) instead of the addition task. With
    /// --init: FILE.txt, FILE.jsonl (chat) or addition-chat.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Output directory for checkpoints, metrics.csv and loss.png (default: runs/addition
    /// or runs/text for a fresh run; the checkpoint's own directory on --resume). A fresh
    /// run refuses a directory that already holds files unless --overwrite.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace the checkpoints, metrics.csv and loss.png already in --out.
    #[arg(long)]
    pub overwrite: bool,
    /// Continue the run saved in this checkpoint (output dir or step-N dir), writing into
    /// the directory it came from unless --out says otherwise.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Evaluate every N steps, 0: only at the end [default: 500; on --resume: the saved value].
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Save a checkpoint every N steps (0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub save_every: u64,
    /// Stop after this many seconds of training (saving a checkpoint), 0 = no limit.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub time_limit: f64,
    /// Print one final JSON object instead of progress and samples.
    #[arg(long)]
    pub json: bool,
    /// Fine-tune this pretrained model (a GGUF file or a Hugging Face directory) instead
    /// of training one from scratch: every parameter in f32 (block formats dequantized).
    /// --data is then FILE.txt (the model's tokens, --seq windows), FILE.jsonl (chat
    /// conversations, loss on assistant turns) or addition-chat (the built-in task as
    /// chat turns).
    #[arg(long, conflicts_with_all = ["preset", "arch", "layers", "d_model", "heads", "kv_heads"])]
    pub init: Option<PathBuf>,
    /// Fine-tuning: skip malformed JSONL lines (each reported with its line number)
    /// instead of stopping at the first.
    #[arg(long)]
    pub skip_bad_lines: bool,
    /// Fine-tuning: only evaluate the --init model or the --resume checkpoint on the
    /// held-out data (loss, and exact match for chat data), print it and exit.
    #[arg(long)]
    pub eval_only: bool,
    /// Fine-tuning: train LoRA adapters of rank R instead of every parameter; the base
    /// stays frozen (a GGUF base keeps its block format in memory: QLoRA).
    #[arg(long)]
    pub lora_rank: Option<usize>,
    /// LoRA: α; the update B·A is scaled by α / r [default: 2·rank].
    #[arg(long, requires = "lora_rank", allow_negative_numbers = true)]
    pub lora_alpha: Option<f32>,
    /// LoRA: the adapted projections, comma-separated, of q,k,v,o,gate,up,down
    /// [default: all of them].
    #[arg(long, requires = "lora_rank")]
    pub lora_targets: Option<String>,
    /// LoRA: dropout on the adapters' input; only 0 (no dropout) is supported.
    #[arg(long, requires = "lora_rank", allow_negative_numbers = true)]
    pub lora_dropout: Option<f32>,
}

/// The settings of a fresh run where no flag says otherwise.
fn default_config() -> TrainConfig {
    TrainConfig {
        steps: 3000,
        batch: 64,
        accumulation: 1,
        seq_len: 128,
        lr: 2e-3,
        min_lr_ratio: 0.1,
        warmup: 100,
        weight_decay: 0.1,
        beta1: 0.9,
        beta2: 0.95,
        grad_clip: 1.0,
        seed: 1337,
        eval_every: 500,
        eval_batches: 8,
    }
}

/// Checks every numeric flag on its own (finite, in range), naming the flag.
pub(crate) fn check_flags(args: &TrainArgs) -> Result<()> {
    let bad = |flag: &str, expected: &str, got: String| Err(Error::value("train", flag, expected, got));
    for (flag, v) in [
        ("--batch", args.batch),
        ("--accumulation", args.accumulation),
        ("--seq", args.seq),
        ("--threads", args.threads),
        ("--layers", args.layers),
        ("--d-model", args.d_model),
        ("--heads", args.heads),
        ("--kv-heads", args.kv_heads),
    ] {
        if v == Some(0) {
            return bad(flag, "at least 1", "0".into());
        }
    }
    if let Some(lr) = args.lr {
        if !(lr.is_finite() && lr > 0.0) {
            return bad("--lr", "a finite number > 0", lr.to_string());
        }
    }
    for (flag, v) in [("--clip", args.clip), ("--weight-decay", args.weight_decay)] {
        if let Some(v) = v {
            if !(v.is_finite() && v >= 0.0) {
                return bad(flag, "a finite number ≥ 0", v.to_string());
            }
        }
    }
    if args.lora_rank.is_some() && args.init.is_none() {
        let why = if args.resume.is_some() {
            "--init MODEL: a resumed run keeps its checkpoint's method (full fine-tuning or LoRA)"
        } else {
            "--init MODEL (LoRA fine-tunes a pretrained model)"
        };
        return bad("--lora-rank", why, "no --init".into());
    }
    if !(args.time_limit.is_finite() && args.time_limit >= 0.0) {
        return bad("--time-limit", "a finite number of seconds ≥ 0", args.time_limit.to_string());
    }
    if args.resume.is_some() {
        let shape = [
            ("--preset", args.preset.is_some()),
            ("--arch", args.arch.is_some()),
            ("--layers", args.layers.is_some()),
            ("--d-model", args.d_model.is_some()),
            ("--heads", args.heads.is_some()),
            ("--kv-heads", args.kv_heads.is_some()),
        ];
        if let Some((flag, _)) = shape.iter().find(|(_, given)| *given) {
            return bad(flag, "no model-shape flag with --resume (the checkpoint fixes the model)", flag.to_string());
        }
    }
    Ok(())
}

/// The defaults of a fresh run for the chosen architecture: the qwen3 and gemma3 presets
/// (QK-norm) sit on a loss plateau near 0.46 for about 2,000 steps on the addition task
/// before they learn it, so their cosine schedule runs 6,000 steps.
fn default_config_for(args: &TrainArgs) -> TrainConfig {
    let mut config = default_config();
    if matches!(args.arch.as_deref(), Some("qwen3" | "gemma3")) {
        config.steps = 6000;
    }
    config
}

/// `config` with every training flag the user gave applied on top.
fn apply_flags(mut config: TrainConfig, args: &TrainArgs) -> TrainConfig {
    config.steps = args.steps.unwrap_or(config.steps);
    config.batch = args.batch.unwrap_or(config.batch);
    config.accumulation = args.accumulation.unwrap_or(config.accumulation);
    config.seq_len = args.seq.unwrap_or(config.seq_len);
    config.lr = args.lr.unwrap_or(config.lr);
    config.warmup = args.warmup.unwrap_or(config.warmup);
    config.weight_decay = args.weight_decay.unwrap_or(config.weight_decay);
    config.grad_clip = args.clip.unwrap_or(config.grad_clip);
    config.seed = args.seed.unwrap_or(config.seed);
    config.eval_every = args.eval_every.unwrap_or(config.eval_every);
    config
}

/// What a resumed run's settings change against the saved ones, in words (empty: none).
pub(crate) fn schedule_changes(saved: &TrainConfig, now: &TrainConfig) -> Vec<String> {
    let mut v = Vec::new();
    if saved.steps != now.steps {
        v.push(format!(
            "--steps {} (saved {}): the cosine schedule now ends at step {}",
            now.steps, saved.steps, now.steps
        ));
    }
    if saved.lr != now.lr {
        v.push(format!("--lr {} (saved {})", now.lr, saved.lr));
    }
    if saved.warmup != now.warmup {
        v.push(format!("--warmup {} (saved {})", now.warmup, saved.warmup));
    }
    if saved.batch != now.batch || saved.accumulation != now.accumulation {
        v.push(format!(
            "--batch {} × --accumulation {} (saved {} × {})",
            now.batch, now.accumulation, saved.batch, saved.accumulation
        ));
    }
    if saved.seq_len != now.seq_len {
        v.push(format!("--seq {} (saved {})", now.seq_len, saved.seq_len));
    }
    if saved.weight_decay != now.weight_decay || saved.grad_clip != now.grad_clip {
        v.push(format!(
            "--weight-decay {} --clip {} (saved {} and {})",
            now.weight_decay, now.grad_clip, saved.weight_decay, saved.grad_clip
        ));
    }
    v
}

/// Bytes the OS says a new process can still use (Linux `MemAvailable`); `None` where unknown.
pub(crate) fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

pub(crate) fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Refuses a run whose estimated memory exceeds what the machine has available.
fn check_memory(model: &ModelConfig, config: &TrainConfig, seq: usize) -> Result<()> {
    let params = model.param_count();
    let Some(need) = config.memory_estimate(model, seq) else {
        return Err(Error::value(
            "train",
            "memory",
            "a model and batch whose size fits in 64 bits",
            format!("{} layers, d_model {}, batch {} × {seq} tokens", model.n_layers, model.d_model, config.batch),
        ));
    };
    if let Some(avail) = available_memory() {
        if need > avail {
            return Err(Error::value(
                "train",
                "memory",
                format!("at most the {} available (MemAvailable)", gib(avail)),
                format!(
                    "an estimated {} for {} parameters (weights, gradients, AdamW moments) and the activations of \
                     a batch of {} × {seq} tokens; use a smaller model or --batch",
                    gib(need),
                    params.map_or("?".into(), |p| p.to_string()),
                    config.batch
                ),
            ));
        }
    }
    Ok(())
}

/// Whether `dir` exists and holds any entry.
pub(crate) fn non_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}

/// The names of a few entries of `dir`, for messages.
pub(crate) fn listing(dir: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    let more = names.len().saturating_sub(5);
    names.truncate(5);
    if more > 0 {
        names.push(format!("and {more} more"));
    }
    names.join(", ")
}

/// Removes what a run writes into `out` (checkpoints, `latest`, metrics, plot), for --overwrite.
pub(crate) fn clear_run(out: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(out) else { return Ok(()) };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let ours = name.starts_with("step-")
            || matches!(
                name.as_str(),
                "latest" | "latest.tmp" | "metrics.csv" | "metrics.csv.tmp" | "loss.png" | "loss.tmp.png"
            );
        if !ours {
            continue;
        }
        let r = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        r.map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    }
    Ok(())
}

/// The run directory of a checkpoint path: the path itself when it is an output
/// directory, the parent of a `step-N` directory.
pub(crate) fn run_dir_of(path: &Path) -> PathBuf {
    let step_dir = path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("step-"));
    if step_dir || (path.join("model.safetensors").exists() && !path.join("latest").exists()) {
        if let Some(parent) = path.parent() {
            return if parent.as_os_str().is_empty() { PathBuf::from(".") } else { parent.to_path_buf() };
        }
    }
    path.to_path_buf()
}

/// Whether two paths name the same directory (compared canonically when both exist).
pub(crate) fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// The model shape of a preset for a vocabulary and context.
pub fn preset(name: &str, vocab: usize, max_seq: usize) -> Result<ModelConfig> {
    let cfg = match name {
        "tiny-llama" => ModelConfig::tiny(Style::Llama, vocab, max_seq),
        "tiny-gpt2" => ModelConfig::tiny(Style::Gpt2, vocab, max_seq),
        "tiny-qwen3" => ModelConfig::tiny(Style::Qwen3, vocab, max_seq),
        "tiny-gemma3" => ModelConfig::tiny(Style::Gemma3, vocab, max_seq),
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
                "tiny-llama, tiny-gpt2, tiny-qwen3, tiny-gemma3, small-llama, small-gpt2 or gpt2-124m",
                other,
            ))
        }
    };
    Ok(cfg)
}

/// Most CPU threads a backend may be asked for: beyond any machine's cores, and few enough
/// that spawning them cannot exhaust the process's thread limit.
const MAX_THREADS: usize = 4096;

/// The backend `name` (`cpu`, `cpu:N`, `wgpu`) with `threads` CPU threads when given.
pub fn backend_for(name: &str, threads: Option<usize>) -> Result<Arc<dyn ComputeBackend>> {
    let named = name.trim().strip_prefix("cpu:").and_then(|n| n.parse::<usize>().ok());
    for (what, n) in [("--threads", threads), ("the N of --backend cpu:N", named)] {
        match n {
            Some(0) => return Err(Error::value("backend", what, "at least 1", 0)),
            Some(n) if n > MAX_THREADS => {
                return Err(Error::value("backend", what, format!("at most {MAX_THREADS}"), n));
            }
            _ => {}
        }
    }
    match (name, threads) {
        ("cpu", Some(n)) => crate::backends::create(&format!("cpu:{n}")),
        _ => crate::backends::create(name),
    }
}

pub(crate) struct Metrics {
    file: std::fs::File,
    pub(crate) train: Vec<(u64, f32)>,
    pub(crate) eval: Vec<(u64, f32)>,
}

const METRICS_HEADER: &str = "step,loss,lr,grad_norm,tokens_per_s,eval_loss,accuracy";

impl Metrics {
    /// Opens `out/metrics.csv` for appending. `keep_until`: the step a resumed run
    /// continues from: rows of later steps (written after that checkpoint by a run that
    /// was then killed, and about to be redone) are dropped first; `None` starts afresh.
    pub(crate) fn open(out: &Path, keep_until: Option<u64>) -> Result<Metrics> {
        let path = out.join("metrics.csv");
        let io = |e: std::io::Error| Error::Io(format!("{}: {e}", path.display()));
        let (mut train, mut eval) = (Vec::new(), Vec::new());
        let mut kept = vec![METRICS_HEADER.to_string()];
        if let (Some(until), Ok(text)) = (keep_until, std::fs::read_to_string(&path)) {
            for line in text.lines().skip(1) {
                let cols: Vec<&str> = line.split(',').collect();
                let Some(step) = cols.first().and_then(|c| c.parse::<u64>().ok()) else { continue };
                if step > until {
                    continue;
                }
                let num = |i: usize| cols.get(i).and_then(|c| c.parse::<f32>().ok());
                if let (Some(loss), Some(_lr)) = (num(1), num(2)) {
                    train.push((step, loss));
                }
                if let Some(e) = num(5) {
                    eval.push((step, e));
                }
                kept.push(line.to_string());
            }
        }
        // Rewritten whole by write-then-rename, so a kill leaves the old or the new file.
        let tmp = out.join("metrics.csv.tmp");
        std::fs::write(&tmp, kept.join("\n") + "\n").map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)?;
        let file = std::fs::OpenOptions::new().append(true).open(&path).map_err(io)?;
        Ok(Metrics { file, train, eval })
    }
    pub(crate) fn line(&mut self, s: &str) -> Result<()> {
        writeln!(self.file, "{s}").map_err(|e| Error::Io(format!("metrics.csv: {e}")))
    }
}

pub(crate) fn eval_line(e: &EvalStats) -> String {
    match e.accuracy {
        Some(a) => format!("eval loss {:.4}, exact match {:.1}%", e.loss, 100.0 * a),
        None => format!("eval loss {:.4}", e.loss),
    }
}

/// A few held-out problems (addition) or a text sample, generated through the KV cache.
fn samples(trainer: &Trainer, b: &dyn ComputeBackend) -> Result<Vec<String>> {
    let mut sampler = Sampler::new(SamplerConfig::default())?;
    match &trainer.task {
        Task::Addition(task) => task
            .eval
            .iter()
            .take(5)
            .map(|&(x, y)| {
                let prompt = addition::prompt_tokens(x, y);
                let ctx = (prompt.len() + 5).min(trainer.model.config.max_seq);
                let mut session = Session::new(&trainer.model.net, b, ctx)?;
                let out = generate(&mut session, b, &prompt, 5, &mut sampler, &[addition::END], |_| Ok(()))?.tokens;
                let got = addition::read_answer(&out);
                let mark = if got == Some(x + y) { "✓" } else { "✗" };
                Ok(format!(
                    "{x}+{y}={} (reversed: {}) → {} {mark}",
                    addition::render(&out),
                    got.map_or("?".into(), |v| v.to_string()),
                    x + y
                ))
            })
            .collect(),
        Task::Random { .. } => Ok(Vec::new()),
        Task::Text(_) => {
            let mut sampler =
                Sampler::new(SamplerConfig { temperature: 0.8, top_k: 40, seed: 1, ..Default::default() })?;
            let prompt: Vec<u32> = "\n".bytes().map(u32::from).collect();
            let n = 300.min(trainer.model.config.max_seq - 1);
            let mut session = Session::new(&trainer.model.net, b, n + prompt.len())?;
            let out = generate(&mut session, b, &prompt, n, &mut sampler, &[], |_| Ok(()))?.tokens;
            Ok(vec![text::decode(&out)])
        }
    }
}

/// Where a run writes and what it starts from.
struct Plan {
    out: PathBuf,
    config: TrainConfig,
    /// The checkpoint to resume and its step.
    resume: Option<(PathBuf, u64)>,
    /// Whether `out` is the directory the resumed checkpoint came from.
    continues: bool,
    /// Whether --overwrite asked to clear what another run left in `out`.
    clear: bool,
}

/// Prints repairs of an interrupted save (stderr: they are no result).
pub(crate) fn recover_noting(dir: &Path) -> Result<()> {
    for note in checkpoint::recover(dir)? {
        eprintln!("note: {}: {note}", dir.display());
    }
    Ok(())
}

/// Decides the output directory and the settings, refusing to write over another run.
/// `lead`: whether this process checks and repairs the output directory (rank 0; the
/// other ranks of a data-parallel run read the plan after it did); `world`: the ranks.
fn plan(args: &TrainArgs, default_out: PathBuf, lead: bool, world: usize) -> Result<Plan> {
    let Some(src) = &args.resume else {
        let out = args.out.clone().unwrap_or(default_out);
        if lead && non_empty(&out) && !args.overwrite {
            return Err(Error::value(
                "train",
                "--out",
                "an empty or new directory for a fresh run (--resume DIR continues a run; --overwrite replaces it)",
                format!("{}, which holds {}", out.display(), listing(&out)),
            ));
        }
        let clear = args.overwrite;
        return Ok(Plan {
            out,
            config: apply_flags(default_config_for(args), args),
            resume: None,
            continues: false,
            clear,
        });
    };
    let run_dir = run_dir_of(src);
    if lead {
        recover_noting(&run_dir)?;
    }
    let info = resume_info(src)?;
    let out = args.out.clone().unwrap_or_else(|| run_dir.clone());
    let continues = same_dir(&out, &run_dir);
    if lead && !continues && non_empty(&out) && !args.overwrite {
        return Err(Error::value(
            "train",
            "--out",
            format!("an empty or new directory for a run forked from {} (or --overwrite)", run_dir.display()),
            format!("{}, which holds {}", out.display(), listing(&out)),
        ));
    }
    let clear = !continues && args.overwrite;
    let saved = info.config.clone();
    let mut config = apply_flags(saved.clone().unwrap_or_else(default_config), args);
    // The global batch (batch × accumulation × ranks) is kept across world sizes unless
    // --accumulation says otherwise, so the run continues on the same data.
    let saved_world = saved_world_size(&info.dir);
    if let (None, Some(saved), Some(w0)) = (args.accumulation, &saved, saved_world) {
        let global = saved.accumulation * w0;
        if w0 != world && global % world == 0 {
            config.accumulation = global / world;
            if lead && !args.json {
                println!(
                    "the checkpoint was trained on {w0} rank(s) × accumulation {}: {world} rank(s) continue with \
                     accumulation {} (the same global batch)",
                    saved.accumulation, config.accumulation
                );
            }
        }
    }
    if lead && !args.json {
        match &saved {
            Some(saved) => {
                let changes = schedule_changes(saved, &config);
                if changes.is_empty() {
                    println!(
                        "resuming {} at step {} of {}: keeping the saved settings (lr {}, warmup {}, batch {} × {})",
                        info.dir.display(),
                        info.step,
                        config.steps,
                        config.lr,
                        config.warmup,
                        config.batch,
                        config.accumulation
                    );
                } else {
                    println!(
                        "resuming {} at step {}: overriding the saved settings: {}",
                        info.dir.display(),
                        info.step,
                        changes.join("; ")
                    );
                }
            }
            None => println!(
                "resuming {} at step {}: it holds no saved settings; using the flags and defaults",
                info.dir.display(),
                info.step
            ),
        }
    }
    Ok(Plan { out, config, resume: Some((info.dir, info.step)), continues, clear })
}

/// The ranks that trained the checkpoint in `dir` (`world_size` in trainer.json; absent
/// in checkpoints older than the field or unreadable: `None`).
fn saved_world_size(dir: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(dir.join("trainer.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("world_size")?.as_u64().and_then(|n| usize::try_from(n).ok()).filter(|&n| n > 0)
}

pub fn run(args: &TrainArgs) -> Result<()> {
    if args.init.is_some() || args.resume.as_deref().is_some_and(fusebox_models::finetune::is_finetune_checkpoint) {
        return crate::train_init::run(args);
    }
    if args.eval_only || args.skip_bad_lines {
        return Err(Error::value(
            "train",
            if args.eval_only { "--eval-only" } else { "--skip-bad-lines" },
            "--init MODEL or --resume of a fine-tuning run (flags of fine-tuning)",
            "a from-scratch run",
        ));
    }
    check_flags(args)?;
    let comm = crate::comm::from_environment()?;
    if comm.world_size() == 1 {
        return run_rank(args, &comm);
    }
    // An error on one rank ends every rank (MPI_Abort): the others would wait in their next
    // collective for ever. Rank 0 writes every file; its last checkpoint stays whole (saves
    // are atomic).
    if let Err(e) = run_rank(args, &comm) {
        comm.abort(1, &format!("error: {e}"));
    }
    Ok(())
}

/// One rank's part of `fusebox train` (all of it in a world of one).
fn run_rank(args: &TrainArgs, comm: &Arc<dyn Communicator>) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let lead = rank == 0;
    let default_out = if args.data.is_some() { "runs/text" } else { "runs/addition" };
    // Rank 0 checks and repairs the output directory before the others read from it.
    let plan = if lead {
        let p = plan(args, PathBuf::from(default_out), true, world)?;
        comm.barrier()?;
        p
    } else {
        comm.barrier()?;
        plan(args, PathBuf::from(default_out), false, world)?
    };
    let json_out = args.json || !lead;
    let (out, config) = (plan.out.clone(), plan.config.clone());
    config.validate()?;
    let task = match &args.data {
        Some(path) => Task::Text(TextData::load(path, config.seq_len)?),
        None => Task::Addition(Addition::new(config.seed)),
    };
    let seq = task.seq_len(&config);
    let model_cfg = match &plan.resume {
        Some((dir, _)) => {
            let path = dir.join("config.json");
            let text = std::fs::read_to_string(&path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
            let v = serde_json::from_str(&text)
                .map_err(|e| Error::Io(format!("{}: not valid JSON: {e}", path.display())))?;
            ModelConfig::from_json(&v).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?
        }
        None => {
            let name = match (&args.preset, &args.arch) {
                (_, Some(arch)) => {
                    let style = Style::parse(arch)
                        .map_err(|_| Error::value("train", "--arch", "gpt2, llama, qwen3 or gemma3", arch))?;
                    format!("tiny-{}", style.name())
                }
                (Some(p), None) => p.clone(),
                (None, None) => "tiny-gpt2".into(),
            };
            let mut cfg = preset(&name, task.vocab_size(), seq.max(16))?;
            cfg.n_layers = args.layers.unwrap_or(cfg.n_layers);
            cfg.d_model = args.d_model.unwrap_or(cfg.d_model);
            cfg.n_heads = args.heads.unwrap_or(cfg.n_heads);
            cfg.n_kv_heads =
                args.kv_heads.unwrap_or(if cfg.style == Style::Gpt2 { cfg.n_heads } else { cfg.n_kv_heads });
            cfg.validate()?;
            cfg
        }
    };
    check_memory(&model_cfg, &config, seq)?;
    if plan.clear && lead {
        clear_run(&out)?;
    }
    let b = backend_for(&args.backend, args.threads)?;
    let mut trainer = match &plan.resume {
        Some((dir, _)) => Trainer::resume(b.as_ref(), dir, config.clone(), task)?,
        None => Trainer::new(b.as_ref(), model_cfg, config.clone(), task)?,
    };
    trainer.join(b.as_ref(), comm.clone())?;
    let steps = config.steps;
    if trainer.step >= steps {
        if !lead {
            return Ok(());
        }
        let dir = plan.resume.as_ref().map_or_else(|| out.clone(), |(d, _)| d.clone());
        if json_out {
            println!("{}", json!({"steps": trainer.step, "trained_steps": 0, "checkpoint": dir.display().to_string()}));
        } else {
            println!(
                "nothing to train: {} is at step {}, and --steps is {steps}; pass a larger --steps to continue",
                dir.display(),
                trainer.step
            );
        }
        return Ok(());
    }
    // Rank 0 alone writes: checkpoints, metrics, the plot.
    let mut metrics = None;
    if lead {
        std::fs::create_dir_all(&out).map_err(|e| Error::Io(format!("{}: {e}", out.display())))?;
        recover_noting(&out)?;
        let keep_until = plan.continues.then_some(trainer.step);
        metrics = Some(Metrics::open(&out, keep_until)?);
    }

    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        // SIGINT and SIGTERM (the `termination` feature) both ask for a save and a clean
        // exit; a second signal while saving is ignored and the save finishes.
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .map_err(|e| Error::Io(format!("train: cannot install the Ctrl-C/SIGTERM handler: {e}")))?;
    }

    let cfg = &trainer.model.config;
    let n_params = trainer.model.net.params.len();
    if !json_out {
        let ranks = if world > 1 { format!("{world} ranks × ") } else { String::new() };
        println!(
            "training {} ({} layers, d_model {}, {} heads / {} kv heads, {:.2}M parameters) on '{}' with {ranks}{} threads",
            cfg.style.name(),
            cfg.n_layers,
            cfg.d_model,
            cfg.n_heads,
            cfg.n_kv_heads,
            n_params as f64 / 1e6,
            b.name(),
            b.cpu().threads()
        );
        if world > 1 {
            println!(
                "data-parallel: global batch {} × accumulation {} × {world} ranks",
                config.batch, config.accumulation
            );
        }
        match &trainer.task {
            Task::Addition(_) => println!("task: 3-digit addition, answers reversed; 1000 held-out problems (and their b+a twins) never trained on"),
            Task::Text(t) => println!("task: byte-level text, {} train / {} validation bytes", t.train.len(), t.valid.len()),
            Task::Random { .. } => {}
        }
    }
    let bar = if json_out { ProgressBar::hidden() } else { ProgressBar::new(steps) };
    bar.set_style(
        ProgressStyle::with_template("{bar:30.cyan/blue} {pos}/{len} {msg} [{elapsed_precise} < {eta_precise}]")
            .map_err(|e| Error::Io(e.to_string()))?,
    );
    bar.set_position(trainer.step);

    let start = Instant::now();
    let (mut tokens, mut last_loss) = (0usize, f32::NAN);
    while trainer.step < steps {
        let t0 = Instant::now();
        let stats = match trainer.train_step(b.as_ref()) {
            Ok(s) => s,
            Err(e) => {
                bar.abandon();
                return Err(Error::Io(format!(
                    "training stopped at step {}: {e}; the last good checkpoint (if any) in {} is kept",
                    trainer.step + 1,
                    out.display()
                )));
            }
        };
        tokens += stats.tokens;
        last_loss = stats.loss;
        let tps = stats.tokens as f64 / t0.elapsed().as_secs_f64();
        let mut eval_cols = ",".to_string();
        let eval_now = config.eval_every > 0 && stats.step % config.eval_every == 0 && stats.step < steps;
        if let (true, Some(metrics)) = (eval_now, &mut metrics) {
            let e = trainer.evaluate(b.as_ref())?;
            eval_cols = format!("{},{}", e.loss, e.accuracy.map_or(String::new(), |a| a.to_string()));
            metrics.eval.push((stats.step, e.loss));
            let line = format!("step {:>5}: train loss {:.4}, {}", stats.step, stats.loss, eval_line(&e));
            if !json_out {
                // Printed above the bar (plain print when stderr is no terminal and the bar is hidden).
                bar.suspend(|| println!("{line}"));
            }
        }
        if let Some(metrics) = &mut metrics {
            let line = format!("{},{},{},{},{:.0},{eval_cols}", stats.step, stats.loss, stats.lr, stats.grad_norm, tps);
            metrics.line(&line)?;
            metrics.train.push((stats.step, stats.loss));
        }
        bar.set_message(format!("loss {:.4} · {:.0} tok/s", stats.loss, tps));
        bar.set_position(stats.step);
        if lead && args.save_every > 0 && stats.step % args.save_every == 0 {
            trainer.save(b.as_ref(), &out)?;
        }
        // Every rank stops at the same step: a signal or the time limit on any rank counts.
        let mut flags = [
            f32::from(u8::from(stop.load(Ordering::SeqCst))),
            f32::from(u8::from(args.time_limit > 0.0 && start.elapsed().as_secs_f64() >= args.time_limit)),
        ];
        comm.all_reduce(&mut flags, ReduceOp::Max)?;
        let (interrupted, out_of_time) = (flags[0] > 0.0, flags[1] > 0.0);
        if (interrupted || out_of_time) && !lead {
            return Ok(());
        }
        if interrupted || out_of_time {
            // Saved once: a step that was just saved by --save-every is not written again.
            let dir = trainer.save(b.as_ref(), &out)?;
            bar.abandon_with_message(format!("stopped at step {}; saved {}", trainer.step, dir.display()));
            if interrupted {
                if json_out {
                    let v = json!({
                        "steps": trainer.step,
                        "train_loss": last_loss,
                        "interrupted": true,
                        "checkpoint": dir.display().to_string(),
                    });
                    println!("{v}");
                } else {
                    println!(
                        "interrupted: checkpoint saved to {} (resume with --resume {})",
                        dir.display(),
                        out.display()
                    );
                }
                return Ok(());
            }
            break;
        }
    }
    bar.finish();
    let seconds = start.elapsed().as_secs_f64();
    let Some(mut metrics) = metrics else { return Ok(()) };
    let eval = trainer.evaluate(b.as_ref())?;
    metrics.eval.push((trainer.step, eval.loss));
    metrics.line(&format!(
        "{},{},,,,{},{}",
        trainer.step,
        last_loss,
        eval.loss,
        eval.accuracy.map_or(String::new(), |a| a.to_string())
    ))?;
    let dir = trainer.save(b.as_ref(), &out)?;
    if let Err(e) = crate::plot::loss_plot(&out.join("loss.png"), &metrics.train, &metrics.eval) {
        eprintln!("warning: could not draw loss.png: {e}");
    }
    let tokens_per_s = tokens as f64 / seconds;
    if json_out {
        let v = json!({
            "steps": trainer.step,
            "train_loss": last_loss,
            "eval_loss": eval.loss,
            "accuracy": eval.accuracy,
            "tokens_per_s": tokens_per_s,
            "seconds": seconds,
            "interrupted": false,
            "checkpoint": dir.display().to_string(),
        });
        println!("{v}");
        return Ok(());
    }
    println!(
        "done: {} steps in {:.1}s ({:.0} tokens/s); final train loss {:.4}",
        trainer.step, seconds, tokens_per_s, last_loss
    );
    println!("{}", eval_line(&eval));
    println!("samples (greedy, through the KV cache):");
    for s in samples(&trainer, b.as_ref())? {
        println!("  {s}");
    }
    println!(
        "checkpoint: {}  ·  metrics: {}  ·  plot: {}",
        dir.display(),
        out.join("metrics.csv").display(),
        out.join("loss.png").display()
    );
    Ok(())
}
