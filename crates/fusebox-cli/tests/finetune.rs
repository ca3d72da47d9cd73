//! `fusebox train --init MODEL`: fine-tuning the tiny Hugging Face llama of
//! `fusebox-models/tests/fixtures/arch/` (recorded by `scripts/record_arch_fixtures.py`)
//! end to end — the final JSON object, resume, generation from the checkpoint, and the
//! errors of bad data.

mod fine_tune;

use fine_tune::{last_json, llama, run, text_data, TempDir};

#[test]
fn init_trains_resumes_and_generates() {
    let dir = TempDir::new("ft-run");
    let data = text_data(&dir.0);
    let out = dir.0.join("out").display().to_string();
    let common = ["--threads", "1", "--seq", "16", "--batch", "2", "--lr", "1e-3", "--json"];
    let o =
        run(&[&["train", "--init", &llama(), "--data", &data, "--steps", "4", "--out", &out][..], &common].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = last_json(&o);
    let (initial, last) = (v["initial_eval_loss"].as_f64().unwrap(), v["eval_loss"].as_f64().unwrap());
    assert!(last < initial, "held-out loss {initial} → {last}");
    assert_eq!(v["steps"], 4);
    // --resume continues the same run (its data, its settings) to --steps.
    let o = run(&["train", "--resume", &out, "--steps", "6", "--threads", "1", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(last_json(&o)["steps"], 6);
    // --eval-only reads the checkpoint and trains nothing.
    let o = run(&["train", "--resume", &out, "--eval-only", "--threads", "1", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(last_json(&o)["step"], 6);
    // generate loads the fine-tuned checkpoint.
    let o = run(&["generate", "--model", &out, "--prompt", "the cat", "--max-tokens", "4", "--threads", "1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn bad_data_lines_are_named() {
    let dir = TempDir::new("ft-bad");
    let path = dir.0.join("chat.jsonl");
    let good = r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}"#;
    std::fs::write(&path, format!("{good}\n{good}\n{{oops\n{good}\n")).unwrap();
    let (data, out) = (path.display().to_string(), dir.0.join("out").display().to_string());
    let args =
        ["train", "--init", &llama(), "--data", &data, "--steps", "1", "--out", &out, "--threads", "1", "--json"];
    let o = run(&args);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("chat.jsonl:3:") && err.contains("--skip-bad-lines"), "{err}");
    let o = run(&[&args[..], &["--skip-bad-lines"]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("chat.jsonl:3:"));
    // Fine-tuning flags without --init are refused by name.
    let o = run(&["train", "--eval-only", "--steps", "1"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--eval-only"));
}
