//! `fusebox tokenize`: ids and pieces from a Hugging Face directory (the models crate's
//! SentencePiece-style fixture, whose reference ids come from HF `tokenizers`) and from
//! the Gemma 3 GGUF when it is in `models/` (reference ids from llama.cpp), its flags
//! and its errors.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn fusebox(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fusebox")).args(args).output().expect("the fusebox binary runs")
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fusebox-models/tests/fixtures")
}

fn json_of(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("one JSON object")
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id")).collect()
}

/// The reference ids of corpus string `text` in fixture `name`: (plain, special parsed).
fn reference(name: &str, text: &str) -> (Vec<u64>, Vec<u64>) {
    let read = |p: PathBuf| -> Value { serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap() };
    let corpus = read(fixtures().join("tokenizer_corpus.json"));
    let i = corpus["strings"].as_array().unwrap().iter().position(|s| s == text).expect("a corpus string");
    let case = &read(fixtures().join(format!("tokenizers/{name}.json")))["cases"][i];
    let plain = ids(&case["ids"]);
    let special = if case["ids_special"].is_null() { plain.clone() } else { ids(&case["ids_special"]) };
    (plain, special)
}

#[test]
fn hf_directory_ids_and_pieces() {
    let dir = fixtures().join("tokenizers/spm_style");
    let dir = dir.to_str().unwrap();
    let text = "<s>Hello</s>";
    let (plain, special) = reference("spm_style", text);
    assert_ne!(plain, special);
    let out = json_of(&fusebox(&["tokenize", "--model", dir, "--text", text, "--json"]));
    assert_eq!(ids(&out["ids"]), plain);
    assert_eq!(out["count"], plain.len());
    let pieces: String = out["pieces"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    assert_eq!(pieces, " <s>Hello</s>", "the pieces spell the text with its prefix space");
    let out = json_of(&fusebox(&["tokenize", "--model", dir, "--text", text, "--json", "--special"]));
    assert_eq!(ids(&out["ids"]), special);
    assert_eq!(out["pieces"][0], "<s>");

    // The text form, one `id -> 'piece'` line per token; --file reads the text from a file.
    let file = std::env::temp_dir().join(format!("fusebox-tokenize-{}.txt", std::process::id()));
    std::fs::write(&file, text).unwrap();
    let o = fusebox(&[
        "tokenize",
        "--model",
        &format!("{dir}/tokenizer.json"),
        "--file",
        file.to_str().unwrap(),
        "--special",
    ]);
    let _ = std::fs::remove_file(&file);
    assert!(o.status.success());
    let lines: Vec<String> = String::from_utf8(o.stdout).unwrap().lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), special.len());
    assert_eq!(lines[0], format!("{:>6} -> '<s>'", special[0]));
}

#[test]
fn gemma3_gguf_ids_match_llama_cpp() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/gemma-3-270m-q4_k_m.gguf");
    if !path.exists() {
        eprintln!("skipping: {} not found (scripts/fetch-gemma3.sh)", path.display());
        return;
    }
    let model = path.to_str().unwrap();
    let text = "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n";
    let (plain, special) = reference("gemma3", text);
    let out = json_of(&fusebox(&["tokenize", "--model", model, "--text", text, "--json", "--special"]));
    assert_eq!(ids(&out["ids"]), special);
    let out = json_of(&fusebox(&["tokenize", "--model", model, "--text", text, "--json"]));
    assert_eq!(ids(&out["ids"]), plain);
    // BOS (id 2) is the model's default; --no-bos leaves it out.
    let out = json_of(&fusebox(&["tokenize", "--model", model, "--text", text, "--json", "--no-bos"]));
    assert_eq!(ids(&out["ids"]), plain[1..]);
}

#[test]
fn errors_are_one_line_and_name_the_problem() {
    let error = |args: &[&str], needle: &str| {
        let o = fusebox(args);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(needle) && !err.contains("panicked"), "expected {needle:?} in {err}");
    };
    let dir = fixtures().join("tokenizers/spm_style");
    error(&["tokenize", "--model", dir.to_str().unwrap()], "--text TEXT or --file FILE");
    error(&["tokenize", "--model", "/nonexistent/m.gguf", "--text", "x"], "/nonexistent/m.gguf");
    error(
        &["tokenize", "--model", dir.to_str().unwrap(), "--file", "/nonexistent/input.txt"],
        "/nonexistent/input.txt",
    );
    // A file that is not GGUF.
    let corpus = fixtures().join("tokenizer_corpus.json");
    error(&["tokenize", "--model", corpus.to_str().unwrap(), "--text", "x"], "tokenizer_corpus.json");
}
