//! KV caches backed as they fill (`KvCache::reserve`, blocks of `KV_BLOCK` positions):
//! a cache that grows while a stream runs gives the same logits, bit for bit, as one
//! backed for its whole capacity from the start, on the single-sequence path (prompt
//! chunks and one-token steps) and on the batched step, for plain rope (Llama), local
//! and global rope with sliding windows (Gemma 3) and a hybrid model whose linear layers
//! carry a state and no keys (Qwen3.5). The tiny fixtures' 64-position context is raised
//! so that a stream crosses two growths.

use std::path::PathBuf;

use fusebox::{CpuBackend, DType};
use fusebox_models::transformer::{KvCache, Transformer, KV_BLOCK};
use fusebox_models::weights::{self, Purpose};

/// Positions a test cache may hold: room for two growths (256 → 512 → 768).
const CAPACITY: usize = 3 * KV_BLOCK;

fn model(name: &str) -> Transformer {
    let b = CpuBackend::with_threads(2).unwrap();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/arch").join(name);
    let mut m: Transformer = weights::load_hf_for(&b, &dir, Purpose::Inference).unwrap();
    m.arch.context_length = CAPACITY;
    m
}

fn ids(n: usize, seed: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 13 + seed * 7 + 1) % vocab as u32).collect()
}

/// A cache of `dtype` backed for its whole capacity before any pass.
fn fully_backed(b: &CpuBackend, m: &Transformer, dtype: DType) -> KvCache {
    let mut c = m.new_cache_of(b, CAPACITY, dtype).unwrap();
    c.reserve(b, CAPACITY).unwrap();
    assert_eq!(c.backed(), CAPACITY);
    c
}

fn single_stream(name: &str, dtype: DType) {
    let b = CpuBackend::with_threads(2).unwrap();
    let m = model(name);
    let vocab = m.arch.vocab_size;
    let mut grown = m.new_cache_of(&b, CAPACITY, dtype).unwrap();
    assert_eq!(grown.backed(), KV_BLOCK, "a fresh cache is backed for one block");
    let mut full = fully_backed(&b, &m, dtype);
    // A prompt in two chunks, the second crossing the first block's end, then steps
    // across the second growth.
    let prompt = ids(300, 1, vocab);
    for chunk in [&prompt[..200], &prompt[200..]] {
        let want = m.forward_cached(&b, chunk, &mut full).unwrap();
        let got = m.forward_cached(&b, chunk, &mut grown).unwrap();
        assert_eq!(got, want, "{name} {dtype}: prompt chunk at {}", grown.len);
    }
    assert_eq!(grown.backed(), 2 * KV_BLOCK, "{name}: 300 positions take max(300, 1.5 × 256) → 512");
    let mut token = 5u32;
    while grown.len < 2 * KV_BLOCK + 20 {
        let want = m.forward_cached(&b, &[token], &mut full).unwrap();
        let got = m.forward_cached(&b, &[token], &mut grown).unwrap();
        assert_eq!(got, want, "{name} {dtype}: step at {}", grown.len);
        token = (token * 31 + 7) % vocab as u32;
    }
    assert_eq!(grown.backed(), CAPACITY);
    // The copies kept every position: what is read back is the same.
    let (k_grown, v_grown) = grown.read_positions(&b, 0, grown.len).unwrap();
    let (k_full, v_full) = full.read_positions(&b, 0, full.len).unwrap();
    for (g, f) in k_grown.iter().zip(&k_full).chain(v_grown.iter().zip(&v_full)) {
        assert_eq!(g.host_bytes().unwrap(), f.host_bytes().unwrap());
    }
}

fn batched(name: &str) {
    let b = CpuBackend::with_threads(2).unwrap();
    let m = model(name);
    let vocab = m.arch.vocab_size;
    // Two streams just short of a block's end, one far from it.
    let lens = [KV_BLOCK - 1, 40, KV_BLOCK - 2];
    let mut grown: Vec<KvCache> = Vec::new();
    let mut full: Vec<KvCache> = Vec::new();
    for (s, &len) in lens.iter().enumerate() {
        let mut g = m.new_cache_of(&b, CAPACITY, DType::F16).unwrap();
        let mut f = fully_backed(&b, &m, DType::F16);
        let prompt = ids(len, s as u32 + 3, vocab);
        m.forward_cached(&b, &prompt, &mut g).unwrap();
        m.forward_cached(&b, &prompt, &mut f).unwrap();
        grown.push(g);
        full.push(f);
    }
    let mut step: Vec<u32> = (0..lens.len() as u32).map(|i| (17 * i + 2) % vocab as u32).collect();
    for _ in 0..4 {
        let want = m.forward_batch(&b, &step, &mut full.iter_mut().collect::<Vec<_>>()).unwrap();
        let got = m.forward_batch(&b, &step, &mut grown.iter_mut().collect::<Vec<_>>()).unwrap();
        assert_eq!(got, want, "{name}: batched step at {:?}", grown.iter().map(|c| c.len).collect::<Vec<_>>());
        step.iter_mut().for_each(|t| *t = (*t * 29 + 3) % vocab as u32);
    }
    assert_eq!(grown.iter().map(KvCache::backed).collect::<Vec<_>>(), [2 * KV_BLOCK, KV_BLOCK, 2 * KV_BLOCK]);
}

#[test]
fn a_growing_cache_gives_the_fully_backed_caches_logits_bit_for_bit() {
    for name in ["llama", "gemma3", "qwen3_5"] {
        single_stream(name, DType::F16);
    }
    single_stream("llama", DType::F32);
}

#[test]
fn a_batched_step_grows_each_cache_that_needs_it() {
    for name in ["llama", "gemma3", "qwen3_5"] {
        batched(name);
    }
}

#[test]
fn reserving_past_the_capacity_is_refused_and_changes_nothing() {
    let b = CpuBackend::with_threads(1).unwrap();
    let m = model("llama");
    let mut c = m.new_cache_of(&b, 300, DType::F16).unwrap();
    let err = c.reserve(&b, 301).unwrap_err().to_string();
    assert!(err.contains("at most 300") && err.contains("301"), "{err}");
    assert_eq!(c.backed(), KV_BLOCK);
    // The capacity caps the growth: 1.5 × 256 rounds to 512, held to 300.
    c.reserve(&b, 257).unwrap();
    assert_eq!(c.backed(), 300);
    let bytes_per_position = c.bytes_per_position();
    assert_eq!(c.backed_bytes(), 300 * bytes_per_position);
    // Released, it is one block again and runs from position 0 as a fresh cache does.
    c.reserve(&b, 300).unwrap();
    c.release(&b).unwrap();
    assert_eq!((c.len, c.backed(), c.backed_bytes()), (0, KV_BLOCK, KV_BLOCK * bytes_per_position));
    let mut fresh = m.new_cache_of(&b, 300, DType::F16).unwrap();
    let prompt = ids(20, 9, m.arch.vocab_size);
    assert_eq!(m.forward_cached(&b, &prompt, &mut c).unwrap(), m.forward_cached(&b, &prompt, &mut fresh).unwrap());
}
