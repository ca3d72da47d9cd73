//! A tiny Llama GGUF (one layer, d_model 8, the small test vocabulary with its ChatML
//! template) written with the loaders' own test writer, for the CLI tests.

use std::path::PathBuf;

use crate::common::gguf_writer::GgufWriter;
use crate::common::small_vocab::small_tokenizer_writer;
use fusebox_models::gguf::{GgmlType, Value};

const DIM: u64 = 8;
const FF: u64 = 16;

/// Writes the model, claiming a context of `context_length` positions, to a temporary file.
pub fn tiny_gguf(context_length: u32) -> PathBuf {
    let w: GgufWriter = small_tokenizer_writer();
    let vocab = 256 + 7 + 3;
    let f32s = |n: u64, v: f32| -> Vec<u8> { (0..n).flat_map(|i| (v + (i % 7) as f32 * 1e-3).to_le_bytes()).collect() };
    let mut w = w
        .kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", Value::U32(1))
        .kv("llama.context_length", Value::U32(context_length))
        .kv("llama.embedding_length", Value::U32(DIM as u32))
        .kv("llama.feed_forward_length", Value::U32(FF as u32))
        .kv("llama.attention.head_count", Value::U32(2))
        .kv("llama.attention.head_count_kv", Value::U32(1))
        .kv("llama.rope.freq_base", Value::F32(10000.0))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    // ggml dims, fastest first: (in, out) for matrices.
    let tensors: [(&str, &[u64]); 11] = [
        ("token_embd.weight", &[DIM, vocab]),
        ("blk.0.attn_norm.weight", &[DIM]),
        ("blk.0.attn_q.weight", &[DIM, DIM]),
        ("blk.0.attn_k.weight", &[DIM, DIM / 2]),
        ("blk.0.attn_v.weight", &[DIM, DIM / 2]),
        ("blk.0.attn_output.weight", &[DIM, DIM]),
        ("blk.0.ffn_norm.weight", &[DIM]),
        ("blk.0.ffn_gate.weight", &[DIM, FF]),
        ("blk.0.ffn_up.weight", &[DIM, FF]),
        ("blk.0.ffn_down.weight", &[FF, DIM]),
        ("output_norm.weight", &[DIM]),
    ];
    for (name, dims) in tensors {
        let n = dims.iter().product();
        let v = if name.contains("norm") { 1.0 } else { 0.02 };
        w = w.tensor(name, dims, GgmlType::F32, f32s(n, v));
    }
    let path = std::env::temp_dir().join(format!(
        "fusebox-cli-tiny-{context_length}-{}-{}.gguf",
        std::process::id(),
        unique()
    ));
    std::fs::write(&path, w.to_bytes()).unwrap();
    path
}

/// A number no other call in this process gets, for file names.
fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
