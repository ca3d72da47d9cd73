//! Token ids against the references on the corpus `fixtures/tokenizer_corpus.json`
//! (≥ 300 strings; `scripts/make_tokenizer_corpus.py`): llama.cpp for the SmolLM2
//! and Gemma 3 GGUF files, Hugging Face `tokenizers` for a Llama-3-style and a
//! SentencePiece-style `tokenizer.json` (`fixtures/tokenizers/`, all recorded by
//! `scripts/record_tokenizer_fixtures.py`). Every string must give the same ids,
//! with and without special-token parsing, and decode back to itself wherever the
//! tokenizer is lossless.
//!
//! The GGUF files are not in git: `$FUSEBOX_SMOLLM2_GGUF` / `$FUSEBOX_GEMMA3_GGUF`,
//! else `models/` in the workspace (`scripts/fetch-smollm2.sh`,
//! `scripts/fetch-gemma3.sh`); a test whose file is absent says so and passes.

mod common;

use std::path::PathBuf;

use common::small_vocab::byte_char;
use fusebox_models::gguf::GgufFile;
use fusebox_models::tokenizer::{PreTokenizer, TokenType, Tokenizer};
use serde_json::Value as Json;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn corpus() -> Vec<String> {
    let text = std::fs::read_to_string(fixtures().join("tokenizer_corpus.json")).expect("corpus");
    let v: Json = serde_json::from_str(&text).expect("corpus is JSON");
    v["strings"].as_array().expect("strings").iter().map(|s| s.as_str().expect("string").to_owned()).collect()
}

fn ids(v: &Json) -> Option<Vec<u32>> {
    v.as_array().map(|a| a.iter().map(|x| x.as_u64().expect("id") as u32).collect())
}

/// The reference ids of each corpus string: (plain, with special tokens parsed).
fn reference(name: &str, plain_key: &str, special_key: &str) -> Vec<(Vec<u32>, Vec<u32>)> {
    let text = std::fs::read_to_string(fixtures().join(format!("tokenizers/{name}.json"))).expect("fixture");
    let v: Json = serde_json::from_str(&text).expect("fixture is JSON");
    v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let plain = ids(&c[plain_key]).or_else(|| ids(&c["ids"])).expect("ids");
            // Absent keys mean "as the Metaspace/plain ids".
            let special =
                ids(&c[special_key]).or_else(|| ids(&c["ids_special"])).or_else(|| ids(&c["ids"])).expect("ids");
            (plain, special)
        })
        .collect()
}

/// Compares `encode` with the reference on every corpus string, both ways of
/// special parsing; panics listing the first mismatches.
fn check(name: &str, refs: &[(Vec<u32>, Vec<u32>)], encode: impl Fn(&str, bool) -> Vec<u32>) {
    let corpus = corpus();
    assert!(corpus.len() >= 300, "the corpus has {} strings", corpus.len());
    assert_eq!(corpus.len(), refs.len(), "{name}: the fixture is for another corpus; re-record it");
    let mut mismatches = Vec::new();
    let mut n_ids = 0;
    for (s, (plain, special)) in corpus.iter().zip(refs) {
        for (parse, want) in [(false, plain), (true, special)] {
            n_ids += want.len();
            let got = encode(s, parse);
            if &got != want {
                mismatches.push(format!("  {s:?} (parse_special {parse}):\n    want {want:?}\n    got  {got:?}"));
            }
        }
    }
    eprintln!("{name}: {} strings, {n_ids} ids, {} mismatches", corpus.len(), mismatches.len());
    assert!(
        mismatches.is_empty(),
        "{name}: {} of {} encodings differ from the reference:\n{}",
        mismatches.len(),
        2 * corpus.len(),
        mismatches.iter().take(12).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// decode(encode(s)) == s for every corpus string `lossless` accepts (parse_special off).
fn round_trip(name: &str, tok: &Tokenizer, add_special: bool, lossless: impl Fn(&str) -> bool) {
    let mut checked = 0;
    for s in corpus().iter().filter(|s| lossless(s)) {
        let mut ids = tok.tokenize(s, add_special, false);
        if add_special && tok.add_bos_default() {
            assert_eq!(ids.first().copied(), tok.bos_id(), "{name}: BOS first");
            ids.remove(0);
        }
        assert_eq!(&tok.decode(&ids).unwrap(), s, "{name}: round trip of {s:?} ({ids:?})");
        checked += 1;
    }
    eprintln!("{name}: {checked} strings round-trip");
    assert!(checked >= 250, "{name}: only {checked} strings checked");
}

fn gguf(var: &str, file: &str) -> Option<GgufFile> {
    let path = match std::env::var_os(var) {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models").join(file),
    };
    if !path.exists() {
        eprintln!("skipping: {} not found (set {var} or run the fetch script)", path.display());
        return None;
    }
    Some(GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

#[test]
fn smollm2_matches_llama_cpp() {
    let Some(file) = gguf("FUSEBOX_SMOLLM2_GGUF", "SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
    check("SmolLM2 (GGUF, llama.cpp)", &reference("smollm2", "ids", "ids_special"), |s, p| tok.tokenize(s, true, p));
    // Bytes without a token (0xF1, 0xF2, 0xF5..=0xFF, some controls) are dropped.
    let lossless = |s: &str| s.bytes().all(|b| tok.token_id(&byte_char(b).to_string()).is_some());
    round_trip("SmolLM2", &tok, true, lossless);
}

#[test]
fn gemma3_matches_llama_cpp() {
    let Some(file) = gguf("FUSEBOX_GEMMA3_GGUF", "gemma-3-270m-q4_k_m.gguf") else { return };
    let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
    assert!(tok.is_sentencepiece());
    assert_eq!(tok.pre_tokenizer(), PreTokenizer::SentencePiece);
    assert!(tok.add_bos_default() && !tok.add_eos_default());
    check("Gemma 3 (GGUF, llama.cpp)", &reference("gemma3", "ids", "ids_special"), |s, p| tok.tokenize(s, true, p));
    // Byte fallback covers every character; only a literal `▁` comes back as a space.
    round_trip("Gemma 3", &tok, true, |s| !s.contains('▁'));
}

fn hf(name: &str) -> Tokenizer {
    let dir = fixtures().join("tokenizers").join(name);
    Tokenizer::from_hf_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

#[test]
fn llama3_style_tokenizer_json_matches_hf() {
    let tok = hf("llama3_style");
    assert!(!tok.is_sentencepiece());
    check("Llama-3-style tokenizer.json (HF tokenizers)", &reference("llama3_style", "ids", "ids_special"), |s, p| {
        tok.encode_with(s, false, p)
    });
    // The post-processor's template adds BOS.
    assert!(tok.add_bos_default());
    assert_eq!(tok.bos_id(), tok.token_id("<|begin_of_text|>"));
    round_trip("Llama-3-style", &tok, true, |_| true);
}

#[test]
fn spm_style_tokenizer_json_matches_hf() {
    let tok = hf("spm_style");
    assert!(tok.is_sentencepiece());
    check(
        "SentencePiece-style tokenizer.json, Metaspace (HF tokenizers)",
        &reference("spm_style", "ids", "ids_special"),
        |s, p| tok.encode_with(s, false, p),
    );
    // Metaspace puts no second `▁` before text that starts with a space, and a
    // literal `▁` comes back as a space.
    round_trip("SentencePiece-style, Metaspace", &tok, false, |s| !s.starts_with(' ') && !s.contains('▁'));
    let byte = tok.token_id("<0xE2>").unwrap();
    assert_eq!(tok.token_type(byte), Some(TokenType::Byte));
}

#[test]
fn spm_style_with_prepend_normalizer_matches_hf() {
    // The same model with Llama 2's older pipeline: Prepend("▁") + Replace(" ", "▁").
    let path = fixtures().join("tokenizers/spm_style/tokenizer.json");
    let mut j: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    j["pre_tokenizer"] = Json::Null;
    j["normalizer"] = serde_json::json!({"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
    ]});
    let tok = Tokenizer::from_hf_json(&j.to_string(), None).unwrap();
    check(
        "SentencePiece-style tokenizer.json, Prepend + Replace (HF tokenizers)",
        &reference("spm_style", "ids_prepend", "ids_prepend_special"),
        |s, p| tok.encode_with(s, false, p),
    );
    round_trip("SentencePiece-style, Prepend", &tok, false, |s| !s.contains('▁'));
}
