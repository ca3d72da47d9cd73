//! `Transformer::forward_batch` (one decode step over several sequences, each in its
//! own cache) on the tiny random-weight models of every architecture family
//! (`tests/fixtures/arch/`): learned positions (GPT-2), rope (Llama), QK norms (Qwen3),
//! experts (Qwen3-MoE, Mixtral),
//! sliding windows with local and global rope and post-norms (Gemma 3, Mistral), Gated
//! DeltaNet layers whose state each sequence carries (Qwen3.5).
//!
//! Each sequence's logits in a batch agree to 1e-5 relative with the same step run
//! alone through `forward_batch`, whatever the batch's other sequences and their
//! lengths, and with `forward_cached` (the single-sequence path); the caches end in the
//! same state.
//!
//! With block-quantized weights (the real SmolLM2 and Gemma 3 GGUFs, when present:
//! `scripts/fetch-smollm2.sh`, `scripts/fetch-gemma3.sh`) every row of a batch of up to
//! 16 has exactly the bits of its sequence stepped alone by `forward_cached`: a server's
//! greedy answers do not depend on who else is being served.

use std::path::PathBuf;

use fusebox::CpuBackend;
use fusebox_models::transformer::{KvCache, Transformer};
use fusebox_models::weights::{self, Purpose};

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/arch").join(name)
}

fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, &w| m.max(f64::from(w).abs())).max(1e-30);
    got.iter().zip(want).map(|(&g, &w)| (f64::from(g) - f64::from(w)).abs()).fold(0.0, f64::max) / scale
}

/// Caches of `model` prefilled with prompt `s` of length `len` for each `(s, len)`.
fn prefilled(b: &CpuBackend, model: &Transformer, prompts: &[(usize, usize)]) -> Vec<KvCache> {
    let vocab = model.arch.vocab_size as u32;
    prompts
        .iter()
        .map(|&(s, len)| {
            let mut c = model.new_cache(b, 64).unwrap();
            let ids: Vec<u32> = (0..len as u32).map(|i| (i * 7 + 3 * s as u32 + 1) % vocab).collect();
            model.forward_cached(b, &ids, &mut c).unwrap();
            c
        })
        .collect()
}

fn check(name: &str) {
    let b = CpuBackend::with_threads(2).unwrap();
    let model: Transformer = weights::load_hf_for(&b, &dir(name), Purpose::Inference).unwrap();
    let vocab = model.arch.vocab_size as u32;
    // Ragged: a first token after one prompt token, and lengths past Gemma 3's and
    // Mistral's fixture windows.
    let lens = [1usize, 9, 23, 40];
    let ids: Vec<u32> = (0..lens.len() as u32).map(|i| (11 * i + 5) % vocab).collect();
    let mut batch = prefilled(&b, &model, &lens.iter().copied().enumerate().collect::<Vec<_>>());
    let mut refs: Vec<&mut KvCache> = batch.iter_mut().collect();
    let together = model.forward_batch(&b, &ids, &mut refs).unwrap();
    // A second step, so the rows written by the first are read back.
    let next: Vec<u32> = ids.iter().map(|&i| (i + 1) % vocab).collect();
    let together2 = model.forward_batch(&b, &next, &mut refs).unwrap();
    for (s, &len) in lens.iter().enumerate() {
        let mut alone = prefilled(&b, &model, &[(s, len)]);
        let mut one: Vec<&mut KvCache> = alone.iter_mut().collect();
        let solo = model.forward_batch(&b, &ids[s..s + 1], &mut one).unwrap();
        let solo2 = model.forward_batch(&b, &next[s..s + 1], &mut one).unwrap();
        // These weights are dense (bf16 → f32), and gemm's blocking depends on the row
        // count: rows agree closely, not bit for bit (block-quantized weights give the
        // same bits: crates/fusebox-serve/tests/api.rs checks that on SmolLM2).
        let e = rel_err(&together[s], &solo[0]).max(rel_err(&together2[s], &solo2[0]));
        assert!(e < 1e-5, "{name}: sequence {s} in a batch off its solo step by {e:.2e}");
        // The single-sequence path agrees closely.
        let mut single = prefilled(&b, &model, &[(s, len)]).remove(0);
        let l1 = model.forward_cached(&b, &ids[s..s + 1], &mut single).unwrap();
        let l2 = model.forward_cached(&b, &next[s..s + 1], &mut single).unwrap();
        let e = rel_err(&together[s], &l1).max(rel_err(&together2[s], &l2));
        assert!(e < 1e-5, "{name}: sequence {s} off forward_cached by {e:.2e}");
        assert_eq!(batch[s].len, single.len);
    }
}

#[test]
fn forward_batch_is_each_sequence_alone() {
    for name in [
        "gpt2",
        "llama",
        "qwen3",
        "gemma3",
        "mistral",
        "phi3",
        "qwen3_moe",
        "mixtral",
        "olmoe",
        "qwen2_moe",
        "qwen3_5",
        "qwen3_next",
    ] {
        check(name);
    }
}

/// Every row of batches of 2, 5 and 16 ragged sequences (several decode steps) against
/// the same sequence alone through `forward_cached`, bit for bit.
fn check_bits(file: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models").join(file);
    if !path.exists() {
        eprintln!("skipping: {} is missing (scripts/fetch-*.sh fetch it)", path.display());
        return;
    }
    let b = CpuBackend::with_threads(2).unwrap();
    let model = fusebox_models::open::load(&b, &path).unwrap().network;
    let vocab = model.arch.vocab_size as u32;
    for n in [2usize, 5, 16] {
        let lens: Vec<(usize, usize)> = (0..n).map(|s| (s, 1 + (s * 13) % 37)).collect();
        let mut batch = prefilled(&b, &model, &lens);
        let mut alone = prefilled(&b, &model, &lens);
        let mut ids: Vec<u32> = (0..n as u32).map(|i| (977 * i + 31) % vocab).collect();
        for step in 0..3 {
            let mut refs: Vec<&mut KvCache> = batch.iter_mut().collect();
            let together = model.forward_batch(&b, &ids, &mut refs).unwrap();
            for (s, cache) in alone.iter_mut().enumerate() {
                let solo = model.forward_cached(&b, &ids[s..s + 1], cache).unwrap();
                let same = together[s].iter().zip(&solo).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{file}: batch of {n}, step {step}: sequence {s} differs from its solo step (max |Δ| {:.2e})",
                    together[s].iter().zip(&solo).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max)
                );
            }
            ids = together.iter().map(|l| fusebox_models::sampler::argmax(l)).collect();
        }
    }
}

#[test]
fn quantized_batch_rows_have_the_bits_of_each_sequence_alone() {
    check_bits("SmolLM2-135M-Instruct.Q4_1.gguf");
    check_bits("gemma-3-270m-q4_k_m.gguf");
}

#[test]
fn forward_batch_refuses_bad_input() {
    let b = CpuBackend::with_threads(2).unwrap();
    let model: Transformer = weights::load_hf_for(&b, &dir("llama"), Purpose::Inference).unwrap();
    let mut caches = prefilled(&b, &model, &[(0, 3), (1, 4)]);
    let mut refs: Vec<&mut KvCache> = caches.iter_mut().collect();
    let e = model.forward_batch(&b, &[1], &mut refs).unwrap_err().to_string();
    assert!(e.contains("forward_batch") && e.contains("caches"), "{e}");
    let e = model.forward_batch(&b, &[1, u32::MAX], &mut refs).unwrap_err().to_string();
    assert!(e.contains("token id"), "{e}");
    assert!(model.forward_batch(&b, &[], &mut []).is_err());
    let mut full = model.new_cache(&b, 2).unwrap();
    model.forward_cached(&b, &[1, 2], &mut full).unwrap();
    let e = model.forward_batch(&b, &[1], &mut [&mut full]).unwrap_err().to_string();
    assert!(e.contains("room for one more position"), "{e}");
}
