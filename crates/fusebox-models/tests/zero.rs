//! ZeRO-sharded AdamW on thread ranks (one process, one communicator per thread, the
//! collectives through shared memory, summed in rank order as MPI sums two ranks): `--zero 1`
//! and `--zero 2` train with the losses of `--zero 0` within 1e-6 relative over 50 steps
//! (from scratch on dense and mixture-of-experts models, and LoRA adapters); a sharded
//! checkpoint saved by 2 ranks resumes on 1 and on 3 ranks, sharded or whole, with the
//! losses of the uninterrupted run; a whole checkpoint resumes sharded. The MPI
//! implementations of the same collectives are exercised by `fusebox-cli/tests/mpi.rs`.

use std::path::{Path, PathBuf};

use fusebox::CpuBackend;
use fusebox_models::data::addition::Addition;
use fusebox_models::model::Model;
use fusebox_models::train::{self, Task, TrainConfig, Trainer};
use fusebox_models::transformer::{Adapters, LoraConfig};
use fusebox_models::{ModelConfig, Style};

mod thread_ranks;
use thread_ranks::on_ranks;

fn train_config(steps: u64, zero: u8, accumulation: usize) -> TrainConfig {
    TrainConfig {
        steps,
        batch: 8,
        accumulation,
        seq_len: 12,
        lr: 3e-3,
        warmup: 5,
        // Low enough that clipping acts in the first steps: the global norm matters.
        grad_clip: 0.5,
        seed: 42,
        eval_every: 0,
        eval_batches: 1,
        zero,
        ..TrainConfig::default()
    }
}

fn model_config(style: Style) -> ModelConfig {
    let n_kv_heads = if style == Style::Gpt2 { 4 } else { 2 };
    ModelConfig { n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads, d_ff: 64, ..ModelConfig::tiny(style, 14, 16) }
}

fn task() -> Task {
    Task::Addition(Addition::new(42))
}

fn backend() -> CpuBackend {
    CpuBackend::with_threads(1).unwrap()
}

/// What kind of model a run trains.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Dense(Style),
    /// LoRA adapters of rank 4 on a frozen llama.
    Lora,
}

fn fresh(b: &CpuBackend, kind: Kind, config: TrainConfig) -> Trainer {
    match kind {
        Kind::Dense(style) => Trainer::scratch(b, model_config(style), config, task()).unwrap(),
        Kind::Lora => {
            let mut model = Model::new(b, model_config(Style::Llama), 5).unwrap();
            let adapters = Adapters::init(b, &model.net.arch, LoraConfig::new(4), 7).unwrap();
            model.net.attach_lora(adapters).unwrap();
            Trainer::new(b, model, config, task()).unwrap()
        }
    }
}

/// The losses of `steps` steps on each rank of `world` (rank 0's: every rank reports the
/// same averaged loss) and rank 0's moment bytes.
fn losses(kind: Kind, world: usize, zero: u8, steps: u64) -> (Vec<f32>, u64) {
    let per_rank = on_ranks(world, |comm| {
        let b = backend();
        let mut t = fresh(&b, kind, train_config(steps, zero, 1));
        t.join(&b, comm).unwrap();
        let l: Vec<f32> = (0..steps).map(|_| t.train_step(&b).unwrap().loss).collect();
        (l, t.memory().moment_bytes, t.memory().moment_bytes_whole)
    });
    for (l, _, _) in &per_rank[1..] {
        assert_eq!(l, &per_rank[0].0, "every rank reports the same loss");
    }
    let (l, bytes, whole) = per_rank.into_iter().next().unwrap();
    if zero > 0 {
        // 1/world of the moments, to the element (8 bytes: m and v).
        assert!((bytes * world as u64).abs_diff(whole) <= 8 * world as u64, "{bytes} × {world} vs {whole}");
    } else {
        assert_eq!(bytes, whole);
    }
    (l, bytes)
}

fn assert_close(what: &str, got: &[f32], want: &[f32], rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rel * w.abs(),
            "{what}: step {}: {g} vs {w} (relative {})",
            i + 1,
            (g - w).abs() / w.abs()
        );
    }
}

#[test]
fn zero_1_and_2_train_like_zero_0_for_50_steps() {
    for (kind, world) in [
        (Kind::Dense(Style::Gpt2), 2),
        (Kind::Dense(Style::Llama), 3),
        (Kind::Dense(Style::parse("qwen3_moe").unwrap()), 2),
        (Kind::Lora, 2),
    ] {
        let (plain, whole) = losses(kind, world, 0, 50);
        assert!(plain[49] < plain[0], "{kind:?}: it learns");
        for zero in [1, 2] {
            let (sharded, piece) = losses(kind, world, zero, 50);
            assert_close(&format!("{kind:?} on {world} ranks, --zero {zero}"), &sharded, &plain, 1e-6);
            assert!(piece < whole, "{kind:?}: {piece} vs {whole}");
        }
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fusebox-zero-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Trains `world` ranks (ZeRO stage `zero`, `accumulation`) for `save_at` steps, saves
/// into `out`, and trains on to `steps`; returns the losses after the save.
fn train_and_save(out: &Path, world: usize, zero: u8, accumulation: usize, save_at: u64, steps: u64) -> Vec<f32> {
    on_ranks(world, |comm| {
        let b = backend();
        let mut t = fresh(&b, Kind::Dense(Style::Llama), train_config(steps, zero, accumulation));
        t.join(&b, comm).unwrap();
        for _ in 0..save_at {
            t.train_step(&b).unwrap();
        }
        t.save(&b, out).unwrap();
        (save_at..steps).map(|_| t.train_step(&b).unwrap().loss).collect::<Vec<f32>>()
    })
    .swap_remove(0)
}

/// Resumes `out`'s latest checkpoint on `world` ranks and trains to `steps`.
fn resume(out: &Path, world: usize, zero: u8, accumulation: usize, steps: u64) -> Vec<f32> {
    on_ranks(world, |comm| {
        let b = backend();
        let (model, saved) = train::load_model(&b, out).unwrap();
        let mut t = Trainer::resume(&b, model, &saved, train_config(steps, zero, accumulation), task()).unwrap();
        t.join(&b, comm).unwrap();
        (saved.step..steps).map(|_| t.train_step(&b).unwrap().loss).collect::<Vec<f32>>()
    })
    .swap_remove(0)
}

#[test]
fn a_sharded_checkpoint_resumes_at_another_world_size() {
    // Global batch 6 micro-batches: 2 ranks × 3, 1 × 6, 3 × 2.
    let out = temp_dir("resume");
    let straight = train_and_save(&out, 2, 1, 3, 5, 12);
    let dir = out.join("step-5");
    for f in ["optimizer-shards.json", "optimizer-shard-0-of-2.safetensors", "optimizer-shard-1-of-2.safetensors"] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    assert!(!dir.join("optimizer.safetensors").exists(), "sharded: no whole moments");
    let manifest = std::fs::read_to_string(dir.join("optimizer-shards.json")).unwrap();
    assert!(manifest.contains("\"world_size\": 2") && manifest.contains("\"stage\": 1"), "{manifest}");
    // Accumulating 6 micro-batches in one process sums in another order than 2 × 3.
    for (world, zero, accumulation) in [(1, 0, 6), (1, 1, 6), (3, 1, 2), (3, 2, 2), (2, 0, 3)] {
        let resumed = resume(&out, world, zero, accumulation, 12);
        assert_close(&format!("resumed on {world} rank(s), --zero {zero}"), &resumed, &straight, 1e-5);
    }
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn a_whole_checkpoint_resumes_sharded_and_a_sharded_one_saves_again() {
    let out = temp_dir("whole");
    let straight = train_and_save(&out, 1, 0, 2, 4, 10);
    assert!(out.join("step-4/optimizer.safetensors").is_file());
    let resumed = resume(&out, 2, 1, 1, 10);
    assert_close("a whole checkpoint resumed on 2 ranks, --zero 1", &resumed, &straight, 1e-5);
    // Saved again sharded at 3 ranks, then read back whole.
    let again = temp_dir("again");
    let tail = train_and_save(&again, 3, 2, 1, 3, 6);
    let resumed = resume(&again, 1, 0, 3, 6);
    assert_close("a 3-rank --zero 2 checkpoint resumed whole", &resumed, &tail, 1e-5);
    std::fs::remove_dir_all(&out).unwrap();
    std::fs::remove_dir_all(&again).unwrap();
}
