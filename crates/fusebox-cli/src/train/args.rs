//! The flags of `fusebox train`, checked on their own, and the settings they make.

use std::path::PathBuf;

use clap::Args;
use fusebox::{Error, Result};
use fusebox_models::train::TrainConfig;

#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Model shape: tiny-gpt2 (default: learns the addition task to 100% held-out exact
    /// match in 1,500–2,500 steps), tiny-llama, small-llama, small-gpt2, gpt2-124m.
    /// Fresh runs only: a resumed run keeps its checkpoint's shape.
    #[arg(long, conflicts_with = "arch")]
    pub preset: Option<String>,
    /// Architecture of a fresh model: gpt2, llama, qwen3, qwen3_moe or gemma3, each sized for the
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
    /// Optimizer steps in all [default: 3000, 6000 with --arch qwen3|qwen3_moe|gemma3; on --resume:
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
    /// Activation checkpointing: keep only each block's input in the forward and recompute
    /// the block in the backward, block by block from the last. The same losses and
    /// parameters bit for bit, activation memory of the block inputs plus one block's
    /// (see the memory line it prints), about one more forward per step. Asked again on
    /// --resume (a choice of each invocation, like --threads).
    #[arg(long)]
    pub checkpoint_activations: bool,
    /// ZeRO stage under mpirun: 0 every rank keeps the whole AdamW state; 1 each rank keeps
    /// the moments of its 1/N piece of the trained tensors (gradients reduce-scattered,
    /// parameters all-gathered after the update); 2 also keeps only its piece of the
    /// averaged gradient between steps. The same losses at every stage. Checkpoints are then
    /// written sharded (each rank its piece, into an --out every rank can write) and resume
    /// at any world size and stage. Asked again on --resume.
    #[arg(long, default_value_t = 0)]
    pub zero: u8,
    /// Arithmetic of the linear layers (the head, attention projections, MLPs, LoRA):
    /// f32, or bf16 — mixed precision: BF16 operands with f32 accumulation in every linear
    /// layer's forward and backward (`vdpbf16ps` on CPUs with AVX-512 BF16, the same
    /// rounded products in f32 elsewhere), f32 master weights, gradients, AdamW state,
    /// norms, softmax, attention and loss. BF16 keeps f32's exponent range, so there is
    /// no loss scaling; a non-finite step still stops the run. Asked again on --resume.
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16"])]
    pub precision: String,
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
    if args.zero > 2 {
        return bad("--zero", "a ZeRO stage of 0, 1 or 2", args.zero.to_string());
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

/// `config` with every training flag the user gave applied on top.
pub(crate) fn apply_flags(mut config: TrainConfig, args: &TrainArgs) -> TrainConfig {
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
    config.checkpoint_activations = args.checkpoint_activations;
    config.zero = args.zero;
    // clap admits only the names `Precision` parses (`value_parser` above).
    config.precision = args.precision.parse().unwrap_or_default();
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
