//! `fusebox bench ...`: timings printed with throughput and % of the machine's peak
//! measured in the same run, as a table or one JSON object per case (`--json`).
//!
//! Conventions (shared with `bench/peers/` so results compare as ratios):
//! - f32 everywhere; the median of repeated calls after a warm-up, at least 0.3 s or
//!   3 calls (see [`measure::Budget`]).
//! - Causal attention forward counts `2·B·Hq·T²·D` FLOPs (the causal half of
//!   `4·B·Hq·T²·D`); forward + backward counts 3.5× that (backward = 2.5× forward).
//! - "% of peak" is against the best sgemm GFLOP/s measured in the same run (the
//!   backend's own `matmul` at 1024³, its fastest call); memory-bound ops report GB/s
//!   (minimal bytes read + written) against a read or copy bandwidth (fastest call)
//!   measured over the same working-set size on the same threads.

mod allreduce;
mod attention;
mod generate;
mod matmul;
pub mod measure;
mod ops;
mod train;

use clap::{Args, Subcommand};
use fusebox::Result;

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchCommand,
}

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Seconds per full training step (forward, backward, AdamW) on random tokens.
    Train(train::TrainBenchArgs),
    /// Fused causal attention (forward, forward + backward) or decode attention.
    Attention(attention::AttentionBenchArgs),
    /// sgemm through the backend's `matmul`: GFLOP/s.
    Matmul(matmul::MatmulBenchArgs),
    /// Memory-bound ops (norms, activations, softmax, loss, AdamW) and their
    /// backwards: GB/s against measured copy bandwidth, and the N-thread speedup.
    Ops(ops::OpsBenchArgs),
    /// Prompt processing and decode tokens/s of a pretrained model (.gguf or HF dir).
    Generate(generate::GenerateBenchArgs),
    /// The communicator's f32 all-reduce, 4 KiB – 256 MiB, under `mpirun -np N`: time,
    /// algorithm and bus bandwidth (NCCL-tests' definitions).
    Allreduce(allreduce::AllReduceBenchArgs),
}

pub fn run(args: &BenchArgs) -> Result<()> {
    match &args.what {
        BenchCommand::Train(a) => train::run(a),
        BenchCommand::Attention(a) => attention::run(a),
        BenchCommand::Matmul(a) => matmul::run(a),
        BenchCommand::Ops(a) => ops::run(a),
        BenchCommand::Generate(a) => generate::run(a),
        BenchCommand::Allreduce(a) => allreduce::run(a),
    }
}
