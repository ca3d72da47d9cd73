//! `fusebox train --init MODEL`: fine-tuning a pretrained model (GGUF or Hugging Face)
//! on text, chat JSONL or the addition task as chat turns; `--resume` of such a run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use fusebox::{ComputeBackend, Error, Result};
use fusebox_models::data::sequences::{self, Sequences};
use fusebox_models::finetune::{self, FineTuner, Loaded};
use fusebox_models::train::{resume_info, TrainConfig};
use fusebox_models::transformer::{Adapters, LoraConfig, Target};
use fusebox_models::weights::Purpose;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

use crate::train::{
    backend_for, check_flags, clear_run, eval_line, listing, non_empty, recover_noting, run_dir_of, same_dir,
    schedule_changes, Metrics, TrainArgs,
};

/// `--data` naming the built-in addition task as chat turns.
pub const ADDITION_CHAT: &str = "addition-chat";
/// Training problems of `addition-chat` (drawn once, sampled with replacement).
const ADDITION_TRAIN: usize = 5_000;
/// Held-out problems of `addition-chat` (exact match is measured on these).
const ADDITION_VALID: usize = 200;

/// The settings of a fresh fine-tuning run where no flag says otherwise.
fn default_config() -> TrainConfig {
    TrainConfig {
        steps: 200,
        batch: 8,
        accumulation: 1,
        seq_len: 256,
        lr: 1e-4,
        min_lr_ratio: 0.1,
        warmup: 10,
        weight_decay: 0.0,
        beta1: 0.9,
        beta2: 0.95,
        grad_clip: 1.0,
        seed: 1337,
        eval_every: 50,
        eval_batches: 4,
    }
}

/// The learning rate of a fresh LoRA run where `--lr` does not say otherwise: the
/// adapters start at B = 0 and need larger steps than full fine-tuning's 1e-4.
const LORA_LR: f32 = 1e-3;

/// The LoRA settings the flags ask for (`None`: full fine-tuning); every bad value is
/// refused naming its flag.
fn lora_config(a: &TrainArgs) -> Result<Option<LoraConfig>> {
    let Some(rank) = a.lora_rank else { return Ok(None) };
    let mut c = LoraConfig::new(rank);
    if let Some(alpha) = a.lora_alpha {
        c.alpha = alpha;
    }
    if let Some(t) = &a.lora_targets {
        c.targets = Target::parse_list(t)?;
    }
    if let Some(p) = a.lora_dropout {
        if p != 0.0 {
            return Err(Error::value("train", "--lora-dropout", "0 (adapter dropout is not implemented)", p));
        }
    }
    c.validate()?;
    Ok(Some(c))
}

fn apply_flags(mut c: TrainConfig, a: &TrainArgs) -> TrainConfig {
    c.steps = a.steps.unwrap_or(c.steps);
    c.batch = a.batch.unwrap_or(c.batch);
    c.accumulation = a.accumulation.unwrap_or(c.accumulation);
    c.seq_len = a.seq.unwrap_or(c.seq_len);
    c.lr = a.lr.unwrap_or(c.lr);
    c.warmup = a.warmup.unwrap_or(c.warmup);
    c.weight_decay = a.weight_decay.unwrap_or(c.weight_decay);
    c.grad_clip = a.clip.unwrap_or(c.grad_clip);
    c.seed = a.seed.unwrap_or(c.seed);
    c.eval_every = a.eval_every.unwrap_or(c.eval_every);
    c
}

/// Where the data comes from, as saved in `trainer.json` so a resumed run rebuilds it.
fn data_args(data: &str, skip_bad_lines: bool) -> Value {
    json!({"data": data, "skip_bad_lines": skip_bad_lines})
}

/// The sequences `--data` names, in `model`'s tokens.
fn load_data(model: &Loaded, data: &str, skip_bad_lines: bool, config: &TrainConfig) -> Result<Sequences> {
    let path = Path::new(data);
    if data == ADDITION_CHAT && !path.exists() {
        return sequences::addition_chat(
            &model.tokenizer,
            model.chat_template()?,
            config.seed,
            ADDITION_TRAIN,
            ADDITION_VALID,
        );
    }
    let ext = path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase());
    match ext.as_deref() {
        Some("jsonl") => sequences::chat_jsonl(
            path,
            &model.tokenizer,
            model.chat_template()?,
            config.seq_len,
            skip_bad_lines,
            config.seed,
        ),
        _ => sequences::text_file(path, &model.tokenizer, config.seq_len),
    }
}

/// Runs a fine-tuning invocation (see the module docs).
pub fn run(args: &TrainArgs) -> Result<()> {
    check_flags(args)?;
    let b = backend_for(&args.backend, args.threads)?;
    let b = b.as_ref();
    // Fresh run or resume: the model, the settings, the data source, the output directory.
    let (model, saved, config, data_src, skip_bad, out, continues) = match (&args.init, &args.resume) {
        (Some(_), Some(_)) => {
            return Err(Error::value("train", "--init", "either --init MODEL or --resume CHECKPOINT", "both"))
        }
        (Some(init), None) => {
            let data = args.data.as_ref().ok_or_else(|| {
                Error::value(
                    "train",
                    "--data",
                    format!("FILE.txt, FILE.jsonl or {ADDITION_CHAT} with --init"),
                    "nothing",
                )
            })?;
            let out = args.out.clone().unwrap_or_else(|| PathBuf::from("runs/finetune"));
            if non_empty(&out) && !args.overwrite && !args.eval_only {
                return Err(Error::value(
                    "train",
                    "--out",
                    "an empty or new directory for a fresh run (--resume DIR continues a run; --overwrite replaces it)",
                    format!("{}, which holds {}", out.display(), listing(&out)),
                ));
            }
            let lora = lora_config(args)?;
            let mut defaults = default_config();
            if lora.is_some() {
                defaults.lr = LORA_LR;
            }
            let config = apply_flags(defaults, args);
            config.validate()?;
            let model = match lora {
                Some(cfg) => {
                    let mut m = finetune::load_base_for(b, init, Purpose::Frozen)?;
                    let adapters = Adapters::init(b, &m.net.arch, cfg, config.seed)?;
                    m.net.attach_lora(adapters)?;
                    m
                }
                None => finetune::load_base(b, init)?,
            };
            (model, None, config, data.display().to_string(), args.skip_bad_lines, out, false)
        }
        (None, Some(src)) => {
            let run_dir = run_dir_of(src);
            recover_noting(&run_dir)?;
            let info = resume_info(src)?;
            let out = args.out.clone().unwrap_or_else(|| run_dir.clone());
            let continues = same_dir(&out, &run_dir);
            if !continues && non_empty(&out) && !args.overwrite && !args.eval_only {
                return Err(Error::value(
                    "train",
                    "--out",
                    format!("an empty or new directory for a run forked from {} (or --overwrite)", run_dir.display()),
                    format!("{}, which holds {}", out.display(), listing(&out)),
                ));
            }
            let saved_cfg = info.config.clone().unwrap_or_else(default_config);
            let config = apply_flags(saved_cfg.clone(), args);
            config.validate()?;
            let changes = schedule_changes(&saved_cfg, &config);
            if !args.json && !args.eval_only {
                if changes.is_empty() {
                    println!(
                        "resuming {} at step {} of {}: keeping the saved settings",
                        info.dir.display(),
                        info.step,
                        config.steps
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
            let (model, saved) = finetune::load_checkpoint(b, &info.dir)?;
            let da = saved.trainer.get("finetune").and_then(|f| f.get("data_args")).cloned().unwrap_or(Value::Null);
            let data = match (&args.data, da.get("data").and_then(Value::as_str)) {
                (Some(d), _) => d.display().to_string(),
                (None, Some(d)) => d.to_string(),
                (None, None) => {
                    return Err(Error::Io(format!(
                        "{}: the checkpoint does not say where its data came from; pass --data",
                        info.dir.display()
                    )))
                }
            };
            let skip = args.skip_bad_lines || da.get("skip_bad_lines").and_then(Value::as_bool).unwrap_or(false);
            (model, Some(saved), config, data, skip, out, continues)
        }
        (None, None) => return Err(Error::value("train", "--init", "a model to fine-tune", "nothing")),
    };
    let data = load_data(&model, &data_src, skip_bad, &config)?;
    for note in &data.skipped {
        eprintln!("skipped: {note}");
    }
    let mut tuner = match &saved {
        Some(s) => FineTuner::resume(b, model, s, config.clone(), data)?,
        None => FineTuner::new(b, model, config.clone(), data)?,
    };
    tuner.data_args = data_args(&data_src, skip_bad);

    let initial = tuner.evaluate(b)?;
    if args.eval_only {
        let v = json!({
            "step": tuner.step,
            "eval_loss": initial.loss,
            "accuracy": initial.accuracy,
            "held_out": tuner.data.valid.len(),
            "data": tuner.data.description,
        });
        if args.json {
            println!("{v}");
        } else {
            println!(
                "{} at step {}: {} ({} held-out sequences)",
                tuner.model.base.path.display(),
                tuner.step,
                eval_line(&initial),
                tuner.data.valid.len()
            );
        }
        return Ok(());
    }
    train_loop(b, args, tuner, &out, continues, saved.is_some(), initial)
}

#[allow(clippy::too_many_arguments)]
fn train_loop(
    b: &dyn ComputeBackend,
    args: &TrainArgs,
    mut tuner: FineTuner,
    out: &Path,
    continues: bool,
    resumed: bool,
    initial: fusebox_models::train::EvalStats,
) -> Result<()> {
    let config = tuner.config.clone();
    let steps = config.steps;
    if tuner.step >= steps {
        let msg = format!("nothing to train: the checkpoint is at step {}, and --steps is {steps}", tuner.step);
        if args.json {
            println!("{}", json!({"steps": tuner.step, "trained_steps": 0}));
        } else {
            println!("{msg}; pass a larger --steps to continue");
        }
        return Ok(());
    }
    if !continues && args.overwrite {
        clear_run(out)?;
    }
    std::fs::create_dir_all(out).map_err(|e| Error::Io(format!("{}: {e}", out.display())))?;
    recover_noting(out)?;
    let mut metrics = Metrics::open(out, (continues && resumed).then_some(tuner.step))?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .map_err(|e| Error::Io(format!("train: cannot install the Ctrl-C/SIGTERM handler: {e}")))?;
    }
    let arch = &tuner.model.net.arch;
    if !args.json {
        let what = match &tuner.model.net.lora {
            Some(ad) => format!(
                "frozen; LoRA rank {}, alpha {}, on {}: {:.2}M adapter parameters trained",
                ad.config.rank,
                ad.config.alpha,
                ad.config.targets.iter().map(|t| t.name()).collect::<Vec<_>>().join(","),
                ad.len() as f64 / 1e6
            ),
            None => "all trained in f32".to_string(),
        };
        println!(
            "fine-tuning {} ({}: {} layers, d_model {}, {:.1}M parameters, {what}) on '{}' with {} threads",
            tuner.model.base.path.display(),
            arch.name,
            arch.n_layers,
            arch.d_model,
            tuner.model.net.params.len() as f64 / 1e6,
            b.name(),
            b.cpu().threads()
        );
        println!("data: {}", tuner.data.description);
        println!("before training: {}", eval_line(&initial));
    }
    let bar = if args.json { ProgressBar::hidden() } else { ProgressBar::new(steps) };
    bar.set_style(
        ProgressStyle::with_template("{bar:30.cyan/blue} {pos}/{len} {msg} [{elapsed_precise} < {eta_precise}]")
            .map_err(|e| Error::Io(e.to_string()))?,
    );
    bar.set_position(tuner.step);
    let start = Instant::now();
    let (mut tokens, mut last_loss) = (0usize, f32::NAN);
    let mut interrupted = false;
    while tuner.step < steps {
        let t0 = Instant::now();
        let stats = tuner.train_step(b).map_err(|e| {
            Error::Io(format!(
                "training stopped at step {}: {e}; the last good checkpoint (if any) in {} is kept",
                tuner.step + 1,
                out.display()
            ))
        })?;
        tokens += stats.tokens;
        last_loss = stats.loss;
        let tps = stats.tokens as f64 / t0.elapsed().as_secs_f64();
        let mut eval_cols = ",".to_string();
        if config.eval_every > 0 && stats.step % config.eval_every == 0 && stats.step < steps {
            let e = tuner.evaluate(b)?;
            eval_cols = format!("{},{}", e.loss, e.accuracy.map_or(String::new(), |a| a.to_string()));
            metrics.eval.push((stats.step, e.loss));
            if !args.json {
                bar.suspend(|| println!("step {:>5}: train loss {:.4}, {}", stats.step, stats.loss, eval_line(&e)));
            }
        }
        metrics
            .line(&format!("{},{},{},{},{:.0},{eval_cols}", stats.step, stats.loss, stats.lr, stats.grad_norm, tps))?;
        metrics.train.push((stats.step, stats.loss));
        bar.set_message(format!("loss {:.4} · {:.0} tok/s", stats.loss, tps));
        bar.set_position(stats.step);
        if args.save_every > 0 && stats.step % args.save_every == 0 {
            tuner.save(b, out)?;
        }
        interrupted = stop.load(Ordering::SeqCst);
        let out_of_time = args.time_limit > 0.0 && start.elapsed().as_secs_f64() >= args.time_limit;
        if interrupted || out_of_time {
            break;
        }
    }
    bar.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    if interrupted {
        // Saved at once, without the final evaluation: a stop asks for a quick exit.
        let dir = tuner.save(b, out)?;
        if args.json {
            let v = json!({"steps": tuner.step, "train_loss": last_loss, "interrupted": true,
                           "checkpoint": dir.display().to_string()});
            println!("{v}");
        } else {
            println!("interrupted: checkpoint saved to {} (resume with --resume {})", dir.display(), out.display());
        }
        return Ok(());
    }
    let eval = tuner.evaluate(b)?;
    metrics.eval.push((tuner.step, eval.loss));
    metrics.line(&format!(
        "{},{},,,,{},{}",
        tuner.step,
        last_loss,
        eval.loss,
        eval.accuracy.map_or(String::new(), |a| a.to_string())
    ))?;
    let dir = tuner.save(b, out)?;
    if let Err(e) = crate::plot::loss_plot(&out.join("loss.png"), &metrics.train, &metrics.eval) {
        eprintln!("warning: could not draw loss.png: {e}");
    }
    let mem = tuner.memory();
    if args.json {
        let v = json!({
            "steps": tuner.step,
            "train_loss": last_loss,
            "initial_eval_loss": initial.loss,
            "initial_accuracy": initial.accuracy,
            "eval_loss": eval.loss,
            "accuracy": eval.accuracy,
            "tokens_per_s": tokens as f64 / seconds,
            "seconds": seconds,
            "peak_rss_bytes": peak_rss(),
            "method": if tuner.model.net.lora.is_some() { "lora" } else { "full" },
            "parameter_bytes": mem.parameter_bytes,
            "adapter_bytes": mem.adapter_bytes,
            "optimizer_bytes": mem.optimizer_bytes,
            "interrupted": false,
            "checkpoint": dir.display().to_string(),
        });
        println!("{v}");
        return Ok(());
    }
    println!(
        "done: {} steps in {:.1}s ({:.0} tokens/s); final train loss {:.4}",
        tuner.step,
        seconds,
        tokens as f64 / seconds,
        last_loss
    );
    println!("before: {}", eval_line(&initial));
    println!("after:  {}", eval_line(&eval));
    println!(
        "memory: parameters {}, adapters {}, gradients + AdamW moments {}",
        crate::train::gib(mem.parameter_bytes),
        crate::train::gib(mem.adapter_bytes),
        crate::train::gib(mem.optimizer_bytes)
    );
    if let Some(rss) = peak_rss() {
        println!("peak memory (RSS): {}", crate::train::gib(rss));
    }
    println!("checkpoint: {}  ·  metrics: {}", dir.display(), out.join("metrics.csv").display());
    Ok(())
}

/// The process's peak resident memory (Linux `VmHWM`); `None` where unknown.
pub(crate) fn peak_rss() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
