//! `fusebox chat` over a pipe (one message per line, `--json` answers), and in a real
//! terminal through scripts/chat_tmux_test.sh. The SmolLM2 checks skip, saying why,
//! without models/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch-smollm2.sh fetches it);
//! the terminal check also without tmux.

#[path = "../../fusebox-models/tests/common/mod.rs"]
mod common;
mod tiny_model;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn bin() -> PathBuf {
    std::env::var_os("FUSEBOX_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_fusebox")), PathBuf::from)
}

fn chat(model: &Path, input: &str, extra: &[&str]) -> Output {
    let mut child = Command::new(bin())
        .args(["chat", "--model", model.to_str().unwrap(), "--json", "--temperature", "0", "--threads", "2"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

fn turns(o: &Output) -> Vec<Value> {
    assert!(o.status.success(), "{}", text(&o.stderr));
    text(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn smollm2() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipping: {} not found (scripts/fetch-smollm2.sh fetches it)", p.display());
        None
    }
}

#[test]
fn turns_reuse_the_cache_reset_starts_over_and_a_full_context_is_reported() {
    let model = tiny_model::tiny_gguf(4096);
    let t = turns(&chat(&model, "hello\nthe hell\n/reset\nhello\n/exit\nnot read\n", &["--max-tokens", "3"]));
    assert_eq!(t.len(), 3, "{t:?}");
    for turn in &t {
        let n = |k: &str| turn[k].as_u64().unwrap();
        assert_eq!(n("reused_tokens") + n("prefilled_tokens"), n("prompt_tokens"), "{turn}");
        assert!(turn["reply_ids"].as_array().unwrap().len() <= 3, "{turn}");
    }
    assert_eq!(t[0]["reused_tokens"], 0);
    // The second turn runs after the first one's prompt and answer, unless the
    // answer re-tokenized differently (then the turn says it started again).
    let first_len = t[0]["prompt_tokens"].as_u64().unwrap();
    assert!(t[1]["restarted"].as_bool().unwrap() || t[1]["reused_tokens"].as_u64().unwrap() >= first_len, "{}", t[1]);
    // After /reset, the same message gives the same answer from an empty cache.
    assert_eq!(t[2]["reused_tokens"], 0);
    assert_eq!((&t[2]["prompt_tokens"], &t[2]["reply_ids"]), (&t[0]["prompt_tokens"], &t[0]["reply_ids"]));

    // A conversation that outgrows the context: an error for that message, the session goes on.
    let long = "hello ".repeat(20);
    let o = chat(&model, &format!("{long}\nhello\n"), &["--max-tokens", "2", "--ctx-size", "40"]);
    let t = turns(&o);
    let err = text(&o.stderr);
    assert_eq!(t.len(), 1, "{t:?}\n{err}");
    assert!(err.contains("conversation length") && err.contains("--context-shift"), "{err}");
    // With --context-shift the oldest exchange is dropped instead.
    let o = chat(
        &model,
        "hello hello hello\nthe the the\nhello\n",
        &["--max-tokens", "2", "--ctx-size", "40", "--context-shift"],
    );
    let t = turns(&o);
    assert_eq!(t.len(), 3, "{}", text(&o.stderr));
    assert!(t.iter().any(|turn| turn["dropped_turns"].as_u64().unwrap() > 0), "{t:?}");
    std::fs::remove_file(&model).unwrap();
}

#[test]
fn smollm2_greedy_replies_equal_generate_chat() {
    let Some(model) = smollm2() else { return };
    let questions = ["What is the capital of France?", "Name three colors."];
    let t = turns(&chat(&model, &format!("{}\n/reset\n{}\n", questions[0], questions[1]), &["--max-tokens", "24"]));
    assert_eq!(t.len(), 2);
    for (turn, q) in t.iter().zip(questions) {
        let o = Command::new(bin())
            .args(["generate", "--model", model.to_str().unwrap(), "--chat", "--json", "--temperature", "0"])
            .args(["--max-tokens", "24", "--threads", "2", "--prompt", q])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
        let g: Value = serde_json::from_str(text(&o.stdout).trim()).unwrap();
        assert_eq!(turn["reply"], g["text"], "{q}");
        assert_eq!(turn["prompt_tokens"], g["prompt_tokens"], "{q}");
    }
    // The default decode path rounds activations to 8 bits, as llama.cpp does, and answers
    // as llama.cpp does (a near-tie at the first token, docs/decode.md); f32 activations
    // (`--exact`) name Paris.
    assert!(t[0]["reply"].as_str().unwrap().starts_with("L'Étoile"), "{}", t[0]);
    let exact = turns(&chat(&model, &format!("{}\n", questions[0]), &["--max-tokens", "24", "--exact"]));
    assert!(exact[0]["reply"].as_str().unwrap().contains("Paris"), "{}", exact[0]);

    // Two turns without /reset: the second runs only its new tokens after the cache.
    let t = turns(&chat(&model, "What is the capital of France?\nAnd of Germany?\n", &["--max-tokens", "24"]));
    assert_eq!(t[1]["restarted"], false, "{}", t[1]);
    let reused = t[1]["reused_tokens"].as_u64().unwrap();
    assert!(reused >= t[0]["prompt_tokens"].as_u64().unwrap(), "{}", t[1]);
    assert!(t[1]["prefilled_tokens"].as_u64().unwrap() < 20, "{}", t[1]);
}

#[test]
fn in_a_real_terminal() {
    let Some(model) = smollm2() else { return };
    if Command::new("tmux").arg("-V").output().map_or(true, |o| !o.status.success()) {
        eprintln!("skipping: tmux is not installed");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/chat_tmux_test.sh");
    let o = Command::new("bash").arg(script).arg(bin()).arg(&model).output().unwrap();
    assert!(o.status.success(), "{}\n{}", text(&o.stdout), text(&o.stderr));
}
