//! `fusebox generate` on a pretrained (GGUF) model: a tiny Llama written here with the
//! loaders' own test writer, whose header claims a context of 2^32 − 1 positions. The
//! KV cache a `--ctx-size` asks for is refused with its size when it cannot fit, never
//! an allocation abort.

#[path = "../../fusebox-models/tests/common/mod.rs"]
mod common;

mod tiny_model;

use std::path::Path;
use std::process::{Command, Output};

use tiny_model::tiny_gguf;

/// The `fusebox` command; `FUSEBOX_BIN` runs the checks against another build (see
/// tests/cli.rs).
fn fusebox() -> Command {
    Command::new(std::env::var_os("FUSEBOX_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_fusebox").into()))
}

fn generate(model: &Path, extra: &[&str]) -> Output {
    fusebox()
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

#[test]
fn bench_generate_measures_the_bandwidth_at_the_contexts_asked_and_none_when_empty() {
    let model = tiny_gguf(4096);
    let bench = |extra: &[&str]| -> Output {
        fusebox()
            .args(["bench", "generate", "--model", model.to_str().unwrap(), "--threads", "1", "--json"])
            .args(["--prompt-tokens", "4", "--new-tokens", "2", "--repeats", "1", "--bandwidth-steps", "2"])
            .args(extra)
            .output()
            .unwrap()
    };
    for (extra, contexts) in [(&["--bandwidth-contexts="][..], vec![]), (&["--bandwidth-contexts", "3,5"], vec![3, 5])]
    {
        let o = bench(extra);
        assert!(o.status.success(), "{extra:?}: {}", text(&o.stderr));
        let v: serde_json::Value = serde_json::from_str(text(&o.stdout).trim()).unwrap();
        let measured: Vec<u64> =
            v["decode_bandwidth"].as_array().unwrap().iter().map(|b| b["context"].as_u64().unwrap()).collect();
        assert_eq!(measured, contexts, "{v}");
    }
    let o = bench(&["--bandwidth-contexts", "16,x"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("'x' is not a context length"), "{}", text(&o.stderr));
    std::fs::remove_file(&model).unwrap();
}
