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

/// The corpus and then the fixture's own `extra_strings` (the o200k fixtures have some).
fn strings_of(name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(fixtures().join(format!("tokenizers/{name}.json"))).expect("fixture");
    let v: Json = serde_json::from_str(&text).expect("fixture is JSON");
    let mut strings = corpus();
    if let Some(extra) = v["extra_strings"].as_array() {
        strings.extend(extra.iter().map(|s| s.as_str().expect("string").to_owned()));
    }
    strings
}

/// Compares `encode` with the reference on every corpus string, both ways of
/// special parsing; panics listing the first mismatches.
fn check(name: &str, refs: &[(Vec<u32>, Vec<u32>)], encode: impl Fn(&str, bool) -> Vec<u32>) {
    check_on(name, &corpus(), refs, encode)
}

/// [`check`] on `corpus` (the corpus, perhaps with more strings after it).
fn check_on(name: &str, corpus: &[String], refs: &[(Vec<u32>, Vec<u32>)], encode: impl Fn(&str, bool) -> Vec<u32>) {
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

/// The vocabulary of `llama3_style/tokenizer.json` as GGUF metadata with
/// `tokenizer.ggml.pre = pre`, as `scripts/record_tokenizer_fixtures.py` writes it.
fn byte_level_gguf(pre: &str) -> Tokenizer {
    byte_level_gguf_of("llama3_style", pre)
}

/// The vocabulary of `<dir>/tokenizer.json` as GGUF metadata with
/// `tokenizer.ggml.pre = pre` (`gguf_vocab_of` and `write_vocab_gguf` in the script).
fn byte_level_gguf_of(dir: &str, pre: &str) -> Tokenizer {
    Tokenizer::from_gguf(byte_level_gguf_file(dir, pre).metadata()).unwrap()
}

/// [`byte_level_gguf_of`]'s file.
fn byte_level_gguf_file(dir: &str, pre: &str) -> GgufFile {
    use common::gguf_writer::GgufWriter;
    use fusebox_models::gguf::{Array, Value};
    let path = fixtures().join("tokenizers").join(dir).join("tokenizer.json");
    let j: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let vocab = j["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); vocab.len()];
    for (t, i) in vocab {
        tokens[i.as_u64().unwrap() as usize] = t.clone();
    }
    let mut types = vec![1i32; tokens.len()];
    for a in j["added_tokens"].as_array().unwrap() {
        let id = a["id"].as_u64().unwrap() as usize;
        if id == tokens.len() {
            tokens.push(String::new());
            types.push(1);
        }
        tokens[id] = a["content"].as_str().unwrap().to_owned();
        types[id] = if a["special"] == true { 3 } else { 4 };
    }
    let merges: Vec<String> = j["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Json::String(s) => s.clone(),
            other => format!("{} {}", other[0].as_str().unwrap(), other[1].as_str().unwrap()),
        })
        .collect();
    let w = GgufWriter::default()
        .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::String(pre.into()))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
        .kv("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))
        .kv("tokenizer.ggml.merges", Value::Array(Array::String(merges)))
        .kv("tokenizer.ggml.bos_token_id", Value::U32(0));
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

#[test]
fn byte_level_pre_tokenizers_match_llama_cpp() {
    for (pre, named) in [
        ("gpt-2", PreTokenizer::Gpt2),
        ("llama-bpe", PreTokenizer::Llama3),
        ("qwen2", PreTokenizer::Qwen2),
        ("default", PreTokenizer::Default),
        ("smollm", PreTokenizer::Smollm),
    ] {
        let tok = byte_level_gguf(pre);
        assert_eq!(tok.pre_tokenizer(), named);
        // llama.cpp adds BOS by default for the Llama 3 pre-tokenizers only.
        assert_eq!(tok.add_bos_default(), pre == "llama-bpe", "{pre}");
        check(
            &format!("tokenizer.ggml.pre = {pre} (llama.cpp)"),
            &reference(&format!("bpe_pre_{pre}"), "ids", "ids_special"),
            |s, p| tok.tokenize(s, true, p),
        );
        round_trip(pre, &tok, true, |_| true);
    }
}

#[test]
fn o200k_tokenizer_json_matches_hf() {
    let tok = hf("o200k_style");
    assert_eq!(tok.pre_tokenizer(), PreTokenizer::Gpt4o);
    check_on(
        "o200k-style tokenizer.json, gpt-oss's pre-tokenizer (HF tokenizers)",
        &strings_of("o200k_style"),
        &reference("o200k_style", "ids", "ids_special"),
        |s, p| tok.encode_with(s, false, p),
    );
    round_trip("o200k-style", &tok, false, |_| true);
    // A harmony vocabulary: a reply ends at <|return|> or <|call|>, not at <|end|>.
    let id = |t: &str| tok.token_id(t).unwrap();
    assert!(tok.is_eog(id("<|return|>")) && tok.is_eog(id("<|call|>")) && tok.is_eog(id("<|endoftext|>")));
    assert!(!tok.is_eog(id("<|end|>")));
    assert_eq!(tok.token_type(id("<|channel|>")), Some(TokenType::Control));
}

#[test]
fn gpt4o_pre_tokenizer_matches_llama_cpp() {
    let tok = byte_level_gguf_of("o200k_style", "gpt-4o");
    assert_eq!(tok.pre_tokenizer(), PreTokenizer::Gpt4o);
    assert!(!tok.add_bos_default());
    check_on(
        "tokenizer.ggml.pre = gpt-4o (llama.cpp)",
        &strings_of("bpe_pre_gpt-4o"),
        &reference("bpe_pre_gpt-4o", "ids", "ids_special"),
        |s, p| tok.tokenize(s, true, p),
    );
    round_trip("gpt-4o", &tok, true, |_| true);
    // llama.cpp's harmony rules: <|end|> does not end generation and, like the
    // structure tokens, is user-defined (matched and written out without special parsing).
    let id = |t: &str| tok.token_id(t).unwrap();
    assert!(tok.is_eog(id("<|return|>")) && tok.is_eog(id("<|call|>")));
    assert!(!tok.is_eog(id("<|end|>")));
    for t in ["<|end|>", "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        assert_eq!(tok.token_type(id(t)), Some(TokenType::UserDefined), "{t}");
    }
    assert_eq!(tok.token_type(id("<|return|>")), Some(TokenType::Control));
}

#[test]
fn o200k_vocabularies_convert_between_gguf_and_tokenizer_json() {
    use fusebox_models::export::TokenizerInfo;
    // GGUF → tokenizer.json (the conversion checks the ids on a sample itself).
    let file = byte_level_gguf_file("o200k_style", "gpt-4o");
    let (info, _) = TokenizerInfo::from_gguf(file.metadata());
    let (text, config, _) = info.hf_files().unwrap();
    let tok = Tokenizer::from_hf_json(&text, Some(&config.to_string())).unwrap();
    assert_eq!(tok.pre_tokenizer(), PreTokenizer::Gpt4o);
    // tokenizer.json → tokenizer.json keeps the o200k Split.
    let (info, _) = TokenizerInfo::from_hf_dir(&fixtures().join("tokenizers/o200k_style")).unwrap();
    let (text, ..) = info.hf_files().unwrap();
    assert_eq!(Tokenizer::from_hf_json(&text, None).unwrap().pre_tokenizer(), PreTokenizer::Gpt4o);
}

#[test]
fn the_two_o200k_references_differ_where_their_rules_do() {
    // Hugging Face runs the pattern's Unicode classes, llama.cpp an ASCII-case rewrite
    // where combining marks are no letters; llama.cpp also matches harmony's structure
    // tokens in plain text. Each loader follows its own reference (the checks above),
    // so the same vocabulary gives different ids here.
    let hf = hf("o200k_style");
    let gguf = byte_level_gguf_of("o200k_style", "gpt-4o");
    let marks = "e\u{301}cole E\u{301}COLE cafe\u{301}'s";
    assert_ne!(hf.encode_with(marks, false, false), gguf.tokenize(marks, false, false));
    let harmony = "<|start|>user<|message|>Hi<|end|>";
    assert_ne!(hf.encode_with(harmony, false, false), gguf.tokenize(harmony, false, false));
    assert_eq!(hf.encode_with(harmony, false, true), gguf.tokenize(harmony, false, true));
    assert_eq!(hf.encode_with("DON'T we'RE", false, false), gguf.tokenize("DON'T we'RE", false, false));
}

#[test]
fn unknown_model_and_pre_tokenizer_are_errors_naming_them() {
    use common::gguf_writer::GgufWriter;
    use fusebox_models::gguf::{Array, Value};
    let build = |model: &str, pre: &str| {
        let w = GgufWriter::default()
            .kv("tokenizer.ggml.model", Value::String(model.into()))
            .kv("tokenizer.ggml.pre", Value::String(pre.into()))
            .kv("tokenizer.ggml.tokens", Value::Array(Array::String(vec!["a".into(), "b".into()])))
            .kv("tokenizer.ggml.merges", Value::Array(Array::String(vec![])));
        let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
        Tokenizer::from_gguf(file.metadata()).err().map(|e| e.to_string())
    };
    let e = build("gpt2", "tekken-9000").expect("unknown pre-tokenizer");
    assert!(e.contains("'tekken-9000'") && e.contains("llama-bpe"), "{e}");
    let e = build("t5", "default").expect("unknown model");
    assert!(e.contains("'t5'") && e.contains("llama"), "{e}");
    let e = Tokenizer::from_hf_json(r#"{"model": {"type": "Unigram", "vocab": []}}"#, None).err().unwrap().to_string();
    assert!(e.contains("Unigram"), "{e}");
    let j = r#"{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Whitespace"}}"#;
    let e = Tokenizer::from_hf_json(j, None).err().unwrap().to_string();
    assert!(e.contains("Whitespace"), "{e}");
    let j = r#"{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "normalizer": {"type": "BertNormalizer"}}"#;
    let e = Tokenizer::from_hf_json(j, None).err().unwrap().to_string();
    assert!(e.contains("BertNormalizer"), "{e}");
}

/// The hand-written splitters against `fancy-regex` running the patterns they
/// implement, on every corpus string (a `Split` with an unknown pattern uses the
/// regex; Llama 3's and Qwen2's patterns use the splitters).
#[test]
fn hand_written_splitters_equal_the_regexes() {
    let pattern_tokenizer = |pattern: &str, extra_space: bool| {
        // A pattern the loader does not recognise (a trailing `|\s+` that never
        // matches first) runs through fancy-regex; the original runs the splitter.
        let p = if extra_space { format!("{pattern}|\\s+") } else { pattern.to_owned() };
        let path = fixtures().join("tokenizers/llama3_style/tokenizer.json");
        let mut j: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = Json::String(p);
        Tokenizer::from_hf_json(&j.to_string(), None).unwrap()
    };
    for pattern in [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ] {
        let (fast, regex) = (pattern_tokenizer(pattern, false), pattern_tokenizer(pattern, true));
        assert_ne!(fast.pre_tokenizer(), PreTokenizer::TokenizerJson);
        assert_eq!(regex.pre_tokenizer(), PreTokenizer::TokenizerJson);
        for s in strings_of("o200k_style") {
            assert_eq!(fast.encode_with(&s, false, true), regex.encode_with(&s, false, true), "{pattern}: {s:?}");
        }
    }
}

#[test]
fn nfc_normalizer_matches_hf() {
    // Llama-3-style with an NFC normalizer, as Qwen2's tokenizer.json has.
    let path = fixtures().join("tokenizers/llama3_style/tokenizer.json");
    let mut j: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    j["normalizer"] = serde_json::json!({"type": "NFC"});
    let tok = Tokenizer::from_hf_json(&j.to_string(), None).unwrap();
    let refs = reference("llama3_style", "ids_nfc", "ids_nfc_special");
    let plain = reference("llama3_style", "ids", "ids_special");
    assert!(refs.iter().zip(&plain).filter(|(a, b)| a != b).count() >= 5, "the corpus has text NFC changes");
    check("Llama-3-style tokenizer.json + NFC (HF tokenizers)", &refs, |s, p| tok.encode_with(s, false, p));
}

/// `spm_style/tokenizer.json`'s vocabulary as a SentencePiece-style GGUF, as
/// `scripts/record_tokenizer_fixtures.py` (`spm_gguf_parts`) builds it.
fn spm_gguf() -> Tokenizer {
    use common::gguf_writer::GgufWriter;
    use fusebox_models::gguf::{Array, Value};
    let path = fixtures().join("tokenizers/spm_style/tokenizer.json");
    let j: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let vocab = j["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); vocab.len()];
    for (t, i) in vocab {
        tokens[i.as_u64().unwrap() as usize] = t.clone();
    }
    let mut types: Vec<i32> = tokens.iter().map(|t| if t.starts_with("<0x") && t.len() == 6 { 6 } else { 1 }).collect();
    for a in j["added_tokens"].as_array().unwrap() {
        let id = a["id"].as_u64().unwrap() as usize;
        if id == tokens.len() {
            tokens.push(String::new());
            types.push(1);
        }
        tokens[id] = a["content"].as_str().unwrap().to_owned();
        types[id] = if a["special"] == true { 3 } else { 4 };
    }
    types[0] = 2;
    let scores: Vec<f32> = (0..tokens.len()).map(|i| -(i as f32)).collect();
    let w = GgufWriter::default()
        .kv("tokenizer.ggml.model", Value::String("llama".into()))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
        .kv("tokenizer.ggml.scores", Value::Array(Array::F32(scores)))
        .kv("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    Tokenizer::from_gguf(file.metadata()).unwrap()
}

#[test]
fn sentencepiece_gguf_with_space_prefix_matches_llama_cpp() {
    let tok = spm_gguf();
    // llama.cpp's defaults for a SentencePiece vocabulary: BOS 1 added, EOS 2, unknown 0.
    assert!(tok.add_bos_default() && !tok.add_eos_default());
    assert_eq!((tok.bos_id(), tok.eos_id(), tok.unk_id()), (Some(1), Some(2), Some(0)));
    check(
        "SentencePiece-style GGUF, add_space_prefix (llama.cpp)",
        &reference("spm_gguf", "ids", "ids_special"),
        |s, p| tok.tokenize(s, true, p),
    );
    // The prefix space is dropped again; a literal `▁` comes back as a space.
    round_trip("SentencePiece-style GGUF", &tok, true, |s| !s.contains('▁'));
    let ids = tok.tokenize("a<s>b", false, true);
    assert_eq!(tok.decode(&ids).unwrap(), "a<s>b", "{ids:?}: the space after a special token is dropped too");
}
