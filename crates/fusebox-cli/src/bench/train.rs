//! `fusebox bench train`: seconds per full training step. Under `mpirun -np N` the ranks
//! train data-parallel (each its own micro-batch, gradients averaged): the step is timed
//! with the gradient all-reduce and, in the same run, without it (every rank still
//! computing at once), so the difference is the communication the backward did not hide.

use std::time::Instant;

use clap::Args;
use fusebox::Result;
use fusebox_models::comm::SingleProcess;
use fusebox_models::train::{Task, TrainConfig, Trainer};
use serde_json::json;

use crate::backends::backend_for;
use crate::train::preset;

#[derive(Args)]
pub struct TrainBenchArgs {
    /// Model shape (see `fusebox train --help`).
    #[arg(long, default_value = "gpt2-124m")]
    preset: String,
    #[arg(long, default_value_t = 4)]
    batch: usize,
    #[arg(long, default_value_t = 64)]
    seq: usize,
    /// Measured steps (after 2 warm-up steps).
    #[arg(long, default_value_t = 5)]
    steps: usize,
    #[arg(long, default_value = "cpu")]
    backend: String,
    #[arg(long)]
    threads: Option<usize>,
    #[arg(long)]
    json: bool,
    /// Activation checkpointing (see `fusebox train --help`).
    #[arg(long)]
    checkpoint_activations: bool,
    /// Linear layers' arithmetic: f32 or bf16 (see `fusebox train --help`).
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16"])]
    precision: String,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(args: &TrainBenchArgs) -> Result<()> {
    let b = backend_for(&args.backend, args.threads)?;
    let vocab = if args.preset == "gpt2-124m" { 50257 } else { 256 };
    let cfg = preset(&args.preset, vocab, args.seq)?;
    let config = TrainConfig {
        steps: u64::MAX,
        batch: args.batch,
        seq_len: args.seq,
        lr: 1e-4,
        warmup: 0,
        seed: 1,
        eval_every: 0,
        eval_batches: 0,
        checkpoint_activations: args.checkpoint_activations,
        precision: args.precision.parse()?,
        ..TrainConfig::default()
    };
    cfg.validate()?;
    config.validate()?;
    let bytes = config.memory_estimate(&cfg, args.seq).map_or(u128::MAX, u128::from);
    super::measure::check_fits("bench train", "--preset, --batch and --seq", bytes)?;
    if let Some(step) = config.memory_breakdown(&cfg, args.seq).and_then(|p| p.per_step()) {
        crate::memory::cache_step_buffers(step);
    }
    let comm = crate::comm::from_environment()?;
    let ranks = comm.world_size();
    let mut trainer = Trainer::scratch(b.as_ref(), cfg.clone(), config, Task::Random { vocab_size: vocab })?;
    trainer.join(b.as_ref(), comm.clone())?;
    let time_steps = |trainer: &mut Trainer| -> Result<f64> {
        for _ in 0..2 {
            trainer.train_step(b.as_ref())?;
        }
        let mut times = Vec::with_capacity(args.steps);
        for _ in 0..args.steps.max(1) {
            let t = Instant::now();
            trainer.train_step(b.as_ref())?;
            b.synchronize()?;
            times.push(t.elapsed().as_secs_f64());
        }
        Ok(median(times))
    };
    let s = time_steps(&mut trainer)?;
    // The same steps with every rank computing alone: no gradient all-reduce.
    let alone = if ranks > 1 {
        trainer.join(b.as_ref(), std::sync::Arc::new(SingleProcess))?;
        let t = time_steps(&mut trainer)?;
        comm.barrier()?;
        Some(t)
    } else {
        None
    };
    if comm.rank() != 0 {
        return Ok(());
    }
    let tokens = (args.batch * args.seq * ranks) as f64;
    let bf16_kernel = fusebox::cpu::bf16_gemm::Kernel::for_isa(b.cpu().isa());
    if args.json {
        println!(
            "{}",
            json!({"name": format!("train_step/{}", args.preset), "preset": args.preset, "batch": args.batch, "seq": args.seq,
                   "ranks": ranks, "params": trainer.model.net.params.len(), "seconds_per_step": s, "ms": s * 1e3,
                   "checkpoint_activations": args.checkpoint_activations, "precision": args.precision,
                   "bf16_kernel": (args.precision == "bf16").then(|| bf16_kernel.name()),
                   "seconds_per_step_no_comm": alone, "tokens_per_s": tokens / s})
        );
    } else {
        if let Some(a) = alone {
            println!(
                "{ranks} ranks: {s:.3} s/step with the gradient all-reduce, {a:.3} s/step without it \
                 (exposed communication {:.3} s/step)",
                s - a
            );
        }
        println!(
            "train step {}{}{} ({:.1}M params), batch {} × seq {} on '{}' ({} threads): {:.3} s/step (median of {}), {:.0} tokens/s",
            args.preset,
            if args.checkpoint_activations { " with activation checkpointing" } else { "" },
            if args.precision == "bf16" { format!(", bf16 matmuls ({})", bf16_kernel.name()) } else { String::new() },
            trainer.model.net.params.len() as f64 / 1e6,
            args.batch,
            args.seq,
            b.name(),
            b.cpu().threads(),
            s,
            args.steps,
            tokens / s
        );
    }
    Ok(())
}
