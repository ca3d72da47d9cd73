//! The run loop of `fusebox train`, one for training from scratch and fine-tuning, on one
//! process or data-parallel: steps with a progress bar, `metrics.csv`, evaluations and
//! checkpoints at their cadence, Ctrl-C/SIGTERM and the time limit (a save and a clean
//! exit, on every rank at the same step), then the final evaluation, checkpoint, plot and
//! summary. Rank 0 alone writes files and prints.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use fusebox::{ComputeBackend, Error, Result};
use fusebox_models::comm::ReduceOp;
use fusebox_models::train::{DataSource, EvalStats, MemoryReport, ParamSource, Trainer};
use fusebox_models::transformer::Precision;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use super::args::TrainArgs;
use super::metrics::Metrics;
use super::plan::{clear_run, recover_noting, Plan};
use crate::memory::{gib, peak_rss};

/// An evaluation in words.
pub(crate) fn eval_line(e: &EvalStats) -> String {
    match e.accuracy {
        Some(a) => format!("eval loss {:.4}, exact match {:.1}%", e.loss, 100.0 * a),
        None => format!("eval loss {:.4}", e.loss),
    }
}

/// The estimated activation memory of one micro-batch, with and without activation
/// checkpointing (the run's choice marked), and its logits.
fn activation_line(mem: &MemoryReport, checkpointed: bool) -> String {
    let (on, off) = if checkpointed { (" (this run)", "") } else { ("", " (this run)") };
    format!(
        "activations per micro-batch (estimated): {} saved{off}, {} with --checkpoint-activations{on}; \
         logits and their gradient {}",
        gib(mem.activation_bytes_saved),
        gib(mem.activation_bytes_checkpointed),
        gib(mem.logit_bytes)
    )
}

/// What this rank holds of the optimizer state: the AdamW moments (its piece under ZeRO,
/// against the whole) and the gradients.
fn optimizer_line(mem: &MemoryReport, zero: u8, world: usize) -> String {
    let moments = if zero > 0 {
        format!(
            "AdamW moments {} per rank (--zero {zero}: 1/{world} of {})",
            gib(mem.moment_bytes),
            gib(mem.moment_bytes_whole)
        )
    } else {
        format!("AdamW moments {} per rank (whole; --zero 1 shards them over the ranks)", gib(mem.moment_bytes))
    };
    let between = if zero >= 2 {
        format!(", {} kept between steps (--zero 2 frees them)", gib(mem.gradient_bytes_between_steps))
    } else {
        String::new()
    };
    format!("optimizer state: {moments}; gradients {} during the backward{between}", gib(mem.gradient_bytes))
}

/// Trains `trainer` to `--steps` as `plan` says (see the module docs). `intro`: what
/// is trained, the start of the first line; `initial`: the evaluation before training,
/// reported beside the final one; `closing`: lines the caller adds to the summary of a
/// finished run (samples, say).
pub(crate) fn train<S: ParamSource, D: DataSource>(
    b: &dyn ComputeBackend,
    args: &TrainArgs,
    plan: &Plan,
    trainer: &mut Trainer<S, D>,
    intro: &str,
    initial: Option<EvalStats>,
    closing: impl FnOnce(&Trainer<S, D>) -> Result<Vec<String>>,
) -> Result<()> {
    let comm = trainer.communicator().clone();
    let (lead, world) = (comm.rank() == 0, comm.world_size());
    let json_out = args.json || !lead;
    let (out, steps) = (&plan.out, trainer.config.steps);
    if trainer.step >= steps {
        if !lead {
            return Ok(());
        }
        let dir = plan.resume.as_ref().map_or_else(|| out.clone(), |r| r.dir.clone());
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
        if plan.clear {
            clear_run(out)?;
        }
        std::fs::create_dir_all(out).map_err(|e| Error::Io(format!("{}: {e}", out.display())))?;
        recover_noting(out)?;
        metrics = Some(Metrics::open(out, plan.continues.then_some(trainer.step))?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        // SIGINT and SIGTERM (the `termination` feature) both ask for a save and a clean
        // exit; a second signal while saving is ignored and the save finishes.
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .map_err(|e| Error::Io(format!("train: cannot install the Ctrl-C/SIGTERM handler: {e}")))?;
    }
    let config = trainer.config.clone();
    if !json_out {
        let ranks = if world > 1 { format!("{world} ranks × ") } else { String::new() };
        println!("{intro} on '{}' with {ranks}{} threads", b.name(), b.cpu().threads());
        if world > 1 {
            println!(
                "data-parallel: global batch {} × accumulation {} × {world} ranks",
                config.batch, config.accumulation
            );
        }
        println!("data: {}", trainer.data.description());
        if config.precision == Precision::Bf16 {
            println!(
                "precision: bf16 linear layers (BF16 operands, f32 accumulation; {} kernel), f32 weights, \
                 gradients, AdamW state, norms, attention and loss",
                fusebox::cpu::bf16_gemm::Kernel::for_isa(b.cpu().isa()).name()
            );
        }
        println!("{}", activation_line(&trainer.memory(), config.checkpoint_activations));
        println!("{}", optimizer_line(&trainer.memory(), config.zero, world));
        if let Some(i) = &initial {
            println!("before training: {}", eval_line(i));
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
        let stats = trainer.train_step(b).map_err(|e| {
            bar.abandon();
            Error::Io(format!(
                "training stopped at step {}: {e}; the last good checkpoint (if any) in {} is kept",
                trainer.step + 1,
                out.display()
            ))
        })?;
        tokens += stats.tokens;
        last_loss = stats.loss;
        let tps = stats.tokens as f64 / t0.elapsed().as_secs_f64();
        if let Some(metrics) = &mut metrics {
            let mut eval_cols = ",".to_string();
            if config.eval_every > 0 && stats.step % config.eval_every == 0 && stats.step < steps {
                let e = trainer.evaluate(b)?;
                eval_cols = format!("{},{}", e.loss, e.accuracy.map_or(String::new(), |a| a.to_string()));
                metrics.eval.push((stats.step, e.loss));
                if !json_out {
                    // Printed above the bar (plain print when stderr is no terminal and the bar is hidden).
                    bar.suspend(|| println!("step {:>5}: train loss {:.4}, {}", stats.step, stats.loss, eval_line(&e)));
                }
            }
            let line = format!("{},{},{},{},{:.0},{eval_cols}", stats.step, stats.loss, stats.lr, stats.grad_norm, tps);
            metrics.line(&line)?;
            metrics.train.push((stats.step, stats.loss));
        }
        // Every rank saves: rank 0 alone writes whole moments, each rank its piece under ZeRO.
        if args.save_every > 0 && stats.step % args.save_every == 0 {
            trainer.save(b, out)?;
        }
        bar.set_message(format!("loss {:.4} · {:.0} tok/s", stats.loss, tps));
        bar.set_position(stats.step);
        // Every rank stops at the same step: a signal or the time limit on any rank counts.
        let mut flags = [
            f32::from(u8::from(stop.load(Ordering::SeqCst))),
            f32::from(u8::from(args.time_limit > 0.0 && start.elapsed().as_secs_f64() >= args.time_limit)),
        ];
        comm.all_reduce(&mut flags, ReduceOp::Max)?;
        let (interrupted, out_of_time) = (flags[0] > 0.0, flags[1] > 0.0);
        // Saved at once, without the final evaluation: a signal asks for a quick exit (and a
        // step just saved by --save-every is not written again).
        let saved = if interrupted { Some(trainer.save(b, out)?) } else { None };
        if let (Some(dir), true) = (saved, lead) {
            bar.abandon_with_message(format!("stopped at step {}; saved {}", trainer.step, dir.display()));
            if json_out {
                let v = json!({"steps": trainer.step, "train_loss": last_loss, "interrupted": true,
                               "checkpoint": dir.display().to_string()});
                println!("{v}");
            } else {
                println!("interrupted: checkpoint saved to {} (resume with --resume {})", dir.display(), out.display());
            }
        }
        if interrupted {
            return Ok(());
        }
        if out_of_time {
            break;
        }
    }
    bar.finish();
    let seconds = start.elapsed().as_secs_f64();
    let Some(mut metrics) = metrics else {
        // The other ranks take part in the final save (their pieces under ZeRO).
        trainer.save(b, out)?;
        return Ok(());
    };
    let eval = trainer.evaluate(b)?;
    metrics.eval.push((trainer.step, eval.loss));
    let accuracy = eval.accuracy.map_or(String::new(), |a| a.to_string());
    metrics.line(&format!("{},{},,,,{},{accuracy}", trainer.step, last_loss, eval.loss))?;
    let dir = trainer.save(b, out)?;
    if let Err(e) = crate::plot::loss_plot(&out.join("loss.png"), &metrics.train, &metrics.eval) {
        eprintln!("warning: could not draw loss.png: {e}");
    }
    let mem = trainer.memory();
    let method = if trainer.model.net().lora.is_some() { "lora" } else { "full" };
    let tokens_per_s = tokens as f64 / seconds;
    if json_out {
        let mut v = json!({
            "steps": trainer.step,
            "train_loss": last_loss,
            "eval_loss": eval.loss,
            "accuracy": eval.accuracy,
            "tokens_per_s": tokens_per_s,
            "seconds": seconds,
            "peak_rss_bytes": peak_rss(),
            "method": method,
            "parameter_bytes": mem.parameter_bytes,
            "adapter_bytes": mem.adapter_bytes,
            "optimizer_bytes": mem.optimizer_bytes,
            "zero": config.zero,
            "gradient_bytes": mem.gradient_bytes,
            "moment_bytes": mem.moment_bytes,
            "moment_bytes_whole": mem.moment_bytes_whole,
            "checkpoint_activations": config.checkpoint_activations,
            "precision": config.precision.name(),
            "activation_bytes": mem.activation_bytes,
            "activation_bytes_saved": mem.activation_bytes_saved,
            "activation_bytes_checkpointed": mem.activation_bytes_checkpointed,
            "logit_bytes": mem.logit_bytes,
            "interrupted": false,
            "checkpoint": dir.display().to_string(),
        });
        if let Some(i) = initial {
            v["initial_eval_loss"] = json!(i.loss);
            v["initial_accuracy"] = json!(i.accuracy);
        }
        println!("{v}");
        return Ok(());
    }
    println!(
        "done: {} steps in {seconds:.1}s ({tokens_per_s:.0} tokens/s); final train loss {last_loss:.4}",
        trainer.step
    );
    match initial {
        Some(i) => println!("before: {}\nafter:  {}", eval_line(&i), eval_line(&eval)),
        None => println!("{}", eval_line(&eval)),
    }
    println!(
        "memory: parameters {}, adapters {}, gradients + AdamW moments {} (this rank's), activations {} \
         (estimated{})",
        gib(mem.parameter_bytes),
        gib(mem.adapter_bytes),
        gib(mem.optimizer_bytes),
        gib(mem.activation_bytes),
        if config.checkpoint_activations { ", checkpointed" } else { "" }
    );
    if let Some(rss) = peak_rss() {
        println!("peak memory (RSS): {}", gib(rss));
    }
    for line in closing(trainer)? {
        println!("{line}");
    }
    println!(
        "checkpoint: {}  ·  metrics: {}  ·  plot: {}",
        dir.display(),
        out.join("metrics.csv").display(),
        out.join("loss.png").display()
    );
    Ok(())
}
