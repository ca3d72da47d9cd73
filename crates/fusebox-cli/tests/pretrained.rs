//! `fusebox generate` on a pretrained (GGUF) model: a tiny Llama written here with the
//! loaders' own test writer, whose header claims a context of 2^32 − 1 positions. The
//! KV cache a `--ctx-size` asks for is refused with its size when it cannot fit, never
//! an allocation abort.

#[path = "../../fusebox-models/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::gguf_writer::GgufWriter;
use common::small_vocab::small_tokenizer_writer;
use fusebox_models::gguf::{GgmlType, Value};

const DIM: u64 = 8;
const FF: u64 = 16;

fn tiny_gguf(context_length: u32) -> PathBuf {
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
    let path = std::env::temp_dir().join(format!("fusebox-cli-tiny-{context_length}-{}.gguf", std::process::id()));
    std::fs::write(&path, w.to_bytes()).unwrap();
    path
}

fn generate(model: &Path, extra: &[&str]) -> Output {
    // `FUSEBOX_BIN` runs the check against another build (see tests/cli.rs).
    Command::new(std::env::var_os("FUSEBOX_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_fusebox").into()))
        .args(["generate", "--model", model.to_str().unwrap(), "--threads", "1", "--max-tokens", "2", "--json"])
        .args(extra)
        .output()
        .unwrap()
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

#[test]
fn a_huge_ctx_size_is_refused_with_the_cache_size_not_an_abort() {
    let model = tiny_gguf(u32::MAX);
    // Happy path: the default context (2048 positions) and a million positions both fit.
    for extra in [&[][..], &["--prompt", "hello"], &["--ctx-size", "1000000", "--prompt", "the"]] {
        let o = generate(&model, extra);
        assert!(o.status.success(), "{extra:?}: {}", text(&o.stderr));
        let v: serde_json::Value = serde_json::from_str(text(&o.stdout).trim()).unwrap();
        assert!(v["generated_tokens"].as_u64().unwrap() <= 2, "{v}");
    }
    // 2^32 − 1 positions of keys and values and rope tables: 192 GiB.
    let avail_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines().find(|l| l.starts_with("MemAvailable:"))?.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map(|kib| kib >> 20);
    if avail_gib.is_some_and(|g| g < 192) {
        let o = generate(&model, &["--ctx-size", "4294967295"]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("--ctx-size") && err.contains("GiB"), "{err}");
    }
    // Beyond the model's context.
    let o = generate(&model, &["--ctx-size", "4294967296"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("context length"), "{err}");
    std::fs::remove_file(&model).unwrap();
}
