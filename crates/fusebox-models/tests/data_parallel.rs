//! Data-parallel training with the embedding gradients reduced as rows (thread ranks:
//! one process, one communicator per thread, the collectives through shared memory,
//! summed in rank order as MPI sums two ranks): 2 ranks with accumulation 1 end with the
//! parameters of 1 process with accumulation 2, within rounding (the rows are added to
//! the averaged dense part rather than summed into it before the average), for a tied
//! table with learned positions (GPT-2) and an untied one (Llama), unsharded and under
//! ZeRO, with the rows exchanged sparsely (vocabulary larger than the batch's tokens) and
//! summed densely (the addition task's 14-token vocabulary). The MPI collectives are
//! exercised by `fusebox-cli/tests/mpi.rs`.

use fusebox::CpuBackend;
use fusebox_models::data::addition::Addition;
use fusebox_models::train::{Task, TrainConfig, Trainer};
use fusebox_models::{ModelConfig, Style};

mod thread_ranks;
use thread_ranks::on_ranks;

/// The parameters after `steps` steps of `world` ranks with `accumulation`, ZeRO `zero`
/// (rank 0's: every rank holds the same).
fn trained(model: &ModelConfig, task: &Task, world: usize, accumulation: usize, zero: u8, steps: u64) -> Vec<f32> {
    let config = TrainConfig {
        steps,
        batch: 2,
        accumulation,
        seq_len: 12,
        lr: 3e-3,
        warmup: 2,
        seed: 42,
        eval_every: 0,
        eval_batches: 1,
        zero,
        ..TrainConfig::default()
    };
    let per_rank = on_ranks(world, |comm| {
        let b = CpuBackend::with_threads(1).unwrap();
        let mut t = Trainer::scratch(&b, model.clone(), config.clone(), task.clone()).unwrap();
        t.join(&b, comm).unwrap();
        for _ in 0..steps {
            t.train_step(&b).unwrap();
        }
        t.model.net.params.to_values(&b).unwrap()
    });
    for p in &per_rank[1..] {
        assert_eq!(p, &per_rank[0], "every rank holds the same parameters");
    }
    per_rank.into_iter().next().unwrap()
}

#[test]
fn two_ranks_with_row_reduced_embeddings_match_one_process_with_accumulation_two() {
    let small = |style: Style, vocab: usize, tied: bool| ModelConfig {
        n_layers: 2,
        d_model: 32,
        n_heads: 4,
        n_kv_heads: 4,
        d_ff: 64,
        tied_embeddings: tied,
        ..ModelConfig::tiny(style, vocab, 16)
    };
    let random = Task::Random { vocab_size: 512 };
    let addition = Task::Addition(Addition::new(42));
    for (what, model, task, zero) in [
        ("gpt2 tied, rows sparse", small(Style::Gpt2, 512, true), &random, 0),
        ("llama untied, rows sparse", small(Style::Llama, 512, false), &random, 0),
        ("gpt2 tied, rows sparse, zero 1", small(Style::Gpt2, 512, true), &random, 1),
        ("gpt2 tied, rows sparse, zero 2", small(Style::Gpt2, 512, true), &random, 2),
        ("gpt2 tied, rows dense", small(Style::Gpt2, 14, true), &addition, 0),
    ] {
        let one = trained(&model, task, 1, 2, zero, 8);
        let two = trained(&model, task, 2, 1, zero, 8);
        let mut worst = 0.0f32;
        for (a, b) in one.iter().zip(&two) {
            worst = worst.max((a - b).abs() / a.abs().max(1e-2));
        }
        // Rounding only: AdamW's step `m/√v` amplifies it in small gradients (summing the
        // rows into the table before the average, as a dense all-reduce does, differs from
        // accumulation by as much here: 3e-4).
        assert!(worst <= 1e-3, "{what}: parameters differ by {worst} (relative, floor 1e-2)");
        assert!(one != trained(&model, task, 1, 2, zero, 7), "{what}: the last step changed the parameters");
    }
}
