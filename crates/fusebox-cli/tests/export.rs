//! `fusebox export`: a tiny Qwen3 (the random-weight HF fixture of the models crate)
//! exported as HF and as GGUF (f32 and q8_0); `fusebox generate` and `fusebox chat` load
//! each export, and greedy generation from the f32 exports gives the source's tokens.
//! Bad requests end with an error that says what is wrong.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn fusebox() -> Command {
    // `FUSEBOX_BIN` runs the check against another build (see tests/cli.rs).
    Command::new(std::env::var_os("FUSEBOX_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_fusebox").into()))
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fusebox-models/tests/fixtures/arch/qwen3")
}

fn export(model: &Path, out: &Path, extra: &[&str]) -> Output {
    fusebox()
        .args(["export", "--model", model.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap()
}

fn generate(model: &Path) -> serde_json::Value {
    let o = fusebox()
        .args(["generate", "--model", model.to_str().unwrap(), "--threads", "1", "--max-tokens", "8", "--json"])
        .args(["--prompt", "hello world", "--temperature", "0"])
        .output()
        .unwrap();
    assert!(o.status.success(), "generate {}: {}", model.display(), text(&o.stderr));
    serde_json::from_str(text(&o.stdout).trim()).unwrap()
}

#[test]
fn exports_load_in_generate_and_chat() {
    let dir = std::env::temp_dir().join(format!("fusebox-cli-export-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let src = fixture();
    let want = generate(&src);
    let hf = dir.join("hf");
    let gguf = dir.join("model.gguf");
    let q8 = dir.join("q8_0.gguf");
    for (out, extra) in [
        (&hf, &["--format", "hf"][..]),
        (&gguf, &["--format", "gguf"][..]),
        (&q8, &["--format", "gguf", "--quant", "q8_0", "--dtype", "f16"][..]),
    ] {
        let o = export(&src, out, extra);
        assert!(o.status.success(), "export {extra:?}: {}", text(&o.stderr));
    }
    for model in [&hf, &gguf] {
        let got = generate(model);
        assert_eq!(got["generated_ids"], want["generated_ids"], "{}", model.display());
        assert_eq!(got["prompt_ids"], want["prompt_ids"], "{}", model.display());
    }
    let q = generate(&q8);
    assert_eq!(q["prompt_ids"], want["prompt_ids"]);
    // chat reads one message per line from a pipe.
    for model in [&hf, &q8] {
        let mut child = fusebox()
            .args(["chat", "--model", model.to_str().unwrap(), "--threads", "1", "--max-tokens", "4"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(b"hi\n").unwrap();
        }
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "chat {}: {}", model.display(), text(&o.stderr));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_export_requests_say_what_is_wrong() {
    let dir = std::env::temp_dir().join(format!("fusebox-cli-export-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let src = fixture();
    let cases: [(&[&str], &str); 3] = [
        (&["--format", "hf", "--quant", "q8_0"], "--quant is for --format gguf"),
        (&["--format", "gguf", "--quant", "q7"], "q8_0"),
        (&["--format", "gguf", "--dtype", "f8"], "f32, f16 or bf16"),
    ];
    for (extra, says) in cases {
        let o = export(&src, &dir.join("out"), extra);
        assert!(!o.status.success(), "{extra:?} succeeded");
        assert!(text(&o.stderr).contains(says), "{extra:?}: {}", text(&o.stderr));
    }
    // A fusebox training checkpoint directory (no model_type) is named as such.
    let ckpt = dir.join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    std::fs::write(ckpt.join("config.json"), r#"{"style": "gpt"}"#).unwrap();
    let o = export(&ckpt, &dir.join("out.gguf"), &["--format", "gguf"]);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("checkpoint"), "{}", text(&o.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}
