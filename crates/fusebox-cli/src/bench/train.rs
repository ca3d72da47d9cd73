//! `fusebox bench train`: seconds per full training step.

use std::time::Instant;

use clap::Args;
use fusebox::Result;
use fusebox_models::train::{Task, TrainConfig, Trainer};
use serde_json::json;

use crate::train::{backend_for, preset};

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
        accumulation: 1,
        seq_len: args.seq,
        lr: 1e-4,
        min_lr_ratio: 0.1,
        warmup: 0,
        weight_decay: 0.1,
        beta1: 0.9,
        beta2: 0.95,
        grad_clip: 1.0,
        seed: 1,
        eval_every: 0,
        eval_batches: 0,
    };
    cfg.validate()?;
    config.validate()?;
    let bytes = config.memory_estimate(&cfg, args.seq).map_or(u128::MAX, u128::from);
    super::measure::check_fits("bench train", "--preset, --batch and --seq", bytes)?;
    let mut trainer = Trainer::new(b.as_ref(), cfg.clone(), config, Task::Random { vocab_size: vocab })?;
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
    let s = median(times);
    let tokens = (args.batch * args.seq) as f64;
    if args.json {
        println!(
            "{}",
            json!({"name": format!("train_step/{}", args.preset), "preset": args.preset, "batch": args.batch, "seq": args.seq,
                   "params": trainer.model.net.params.len(), "seconds_per_step": s, "ms": s * 1e3, "tokens_per_s": tokens / s})
        );
    } else {
        println!(
            "train step {} ({:.1}M params), batch {} × seq {} on '{}' ({} threads): {:.3} s/step (median of {}), {:.0} tokens/s",
            args.preset,
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
