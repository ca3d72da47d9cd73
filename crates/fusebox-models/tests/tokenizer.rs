//! Tokenizer behaviour on a small vocabulary built here: BPE merges, special
//! tokens, round trips, streaming decode, and the GGUF and tokenizer.json loaders.

mod common;

use common::gguf_writer::GgufWriter;
use common::small_vocab::{byte_char, hf_tokenizer_json, small_tokenizer_writer, small_vocab};
use common::Rng;
use fusebox_models::gguf::{Array, GgufFile, Value};
use fusebox_models::tokenizer::{PreTokenizer, TokenType, Tokenizer};
use serde_json::json;

fn small_json() -> String {
    let mut j = hf_tokenizer_json(json!({"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": true},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
    ]}));
    // Old string form and new pair form of the merges, mixed.
    let (_, merges) = small_vocab();
    j["model"]["merges"] = merges
        .iter()
        .enumerate()
        .map(|(i, (a, b))| if i % 2 == 0 { json!(format!("{a} {b}")) } else { json!([a, b]) })
        .collect();
    j.to_string()
}

fn small() -> Tokenizer {
    let config = json!({"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "add_bos_token": true});
    Tokenizer::from_hf_json(&small_json(), Some(&config.to_string())).expect("small tokenizer builds")
}

fn small_gguf() -> GgufFile {
    GgufFile::from_bytes(small_tokenizer_writer().to_bytes()).unwrap()
}

#[test]
fn merges_apply_by_rank() {
    let tok = small();
    let id = |t: &str| tok.token_id(t).unwrap();
    assert_eq!(tok.encode(" the", false), [id("Ġthe")]);
    assert_eq!(tok.encode("hello", false), [id("hello")]);
    // " then": "Ġthe" then "n".
    assert_eq!(tok.encode(" then", false), [id("Ġthe"), id("n")]);
    // Digits are isolated, so "12" is two pieces of one byte each.
    assert_eq!(tok.encode("12", false), [id("1"), id("2")]);
    assert_eq!(tok.encode("", false), Vec::<u32>::new());
    assert_eq!(tok.encode("", true), [tok.bos_id().unwrap()]);
}

#[test]
fn special_tokens_and_parse_special() {
    let tok = small();
    let start = tok.token_id("<|im_start|>").unwrap();
    let end = tok.token_id("<|im_end|>").unwrap();
    let user = tok.token_id("<user>").unwrap();
    assert_eq!(tok.token_type(start), Some(TokenType::Control));
    assert_eq!(tok.token_type(user), Some(TokenType::UserDefined));
    let ids = tok.encode("<|im_start|>hello<|im_end|><user>", false);
    assert_eq!(ids, [start, tok.token_id("hello").unwrap(), end, user]);
    assert_eq!(tok.decode(&ids).unwrap(), "<|im_start|>hello<|im_end|><user>");
    assert_eq!(tok.decode_with(&ids, true).unwrap(), "hello<user>");
    // Ordinary encoding spells control tokens out; user-defined ones still match.
    let plain = tok.encode_ordinary("<|im_start|><user>", false);
    assert!(!plain.contains(&start) && plain.ends_with(&[user]));
    assert_eq!(tok.decode(&plain).unwrap(), "<|im_start|><user>");
    assert_eq!(tok.eos_id(), Some(end));
    assert!(tok.is_eog(end) && !tok.is_eog(start));
    assert!(tok.add_bos_default());
    assert!(tok.decode(&[9999]).unwrap_err().to_string().contains("token id"));
}

/// Random text over a pool of awkward characters.
fn random_text(rng: &mut Rng) -> String {
    const POOL: &[&str] = &[
        "a",
        "Z",
        "é",
        "ß",
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "\u{a0}",
        "\u{3000}",
        "'",
        "'s",
        "'ll",
        "0",
        "7",
        "٣",
        "½",
        "!",
        "?!",
        "…",
        "你",
        "好",
        "😀",
        "👍🏽",
        "\u{301}",
        "न",
        "्",
        "\0",
        "\u{7f}",
        "<|im_start|>",
        "<user>",
        "<|im_",
    ];
    let n = rng.below(24);
    (0..n).map(|_| POOL[rng.below(POOL.len())]).collect()
}

#[test]
fn round_trips_and_streaming() {
    let tok = small();
    let mut rng = Rng::new(42);
    for _ in 0..2000 {
        let s = random_text(&mut rng);
        let ids = tok.encode(&s, false);
        assert_eq!(tok.decode(&ids).unwrap(), s);
        let mut stream = tok.stream_decoder(false);
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(&stream.push(id).unwrap());
        }
        assert_eq!(stream.pending_bytes(), 0, "{s:?}");
        streamed.push_str(&stream.finish());
        assert_eq!(streamed, s);
    }
}

#[test]
fn stream_decoder_holds_partial_characters() {
    let tok = small();
    // "😀" is four bytes and, with no merges for it, four tokens.
    let ids = tok.encode("😀!", false);
    assert_eq!(ids.len(), 5);
    let mut stream = tok.stream_decoder(false);
    let outs: Vec<String> = ids.iter().map(|&id| stream.push(id).unwrap()).collect();
    assert_eq!(outs, ["", "", "", "😀", "!"]);
    // A cut character is U+FFFD at the end, and invalid bytes are replaced at once.
    let mut stream = tok.stream_decoder(false);
    assert_eq!(stream.push(ids[0]).unwrap(), "");
    assert_eq!(stream.finish(), "\u{FFFD}");
    let lone_continuation = tok.token_id(&byte_char(0x80).to_string()).unwrap();
    assert_eq!(tok.stream_decoder(false).push(lone_continuation).unwrap(), "\u{FFFD}");
}

#[test]
fn gguf_and_json_loaders_agree() {
    let from_json = small();
    let from_gguf = Tokenizer::from_gguf(small_gguf().metadata()).unwrap();
    assert_eq!(from_gguf.pre_tokenizer(), PreTokenizer::Smollm);
    assert_eq!(from_gguf.vocab_size(), from_json.vocab_size());
    assert_eq!((from_gguf.bos_id(), from_gguf.eos_id()), (from_json.bos_id(), from_json.eos_id()));
    let mut rng = Rng::new(7);
    for _ in 0..500 {
        let s = random_text(&mut rng);
        assert_eq!(from_gguf.encode(&s, true), from_json.encode(&s, true), "{s:?}");
    }
}

#[test]
fn loader_errors_name_the_problem() {
    let err = |json: serde_json::Value| Tokenizer::from_hf_json(&json.to_string(), None).err().unwrap().to_string();
    let mut j: serde_json::Value = serde_json::from_str(&small_json()).unwrap();
    j["pre_tokenizer"] = json!({"type": "WhitespaceSplit"});
    assert!(err(j.clone()).contains("pre_tokenizer {\"type\":\"WhitespaceSplit\"} is not implemented"));
    j = serde_json::from_str(&small_json()).unwrap();
    j["model"]["vocab"]["gap"] = json!(100000);
    assert!(err(j.clone()).contains("not dense"));
    j = serde_json::from_str(&small_json()).unwrap();
    j["model"]["merges"] = json!(["q zz"]);
    assert!(err(j.clone()).contains("'zz'"));
    j = serde_json::from_str(&small_json()).unwrap();
    j["model"]["type"] = json!("Unigram");
    assert!(err(j).contains("not BPE"));
    assert!(Tokenizer::from_hf_json("{", None).err().unwrap().to_string().contains("not valid JSON"));

    let unigram = GgufWriter::default()
        .kv("tokenizer.ggml.model", Value::String("t5".into()))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(vec!["a".into()])));
    let file = GgufFile::from_bytes(unigram.to_bytes()).unwrap();
    assert!(Tokenizer::from_gguf(file.metadata()).err().unwrap().to_string().contains("is 't5'; implemented: 'gpt2'"));
    let other_pre = GgufWriter::default()
        .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::String("tekken".into()))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(vec!["a".into()])));
    let file = GgufFile::from_bytes(other_pre.to_bytes()).unwrap();
    assert!(Tokenizer::from_gguf(file.metadata())
        .err()
        .unwrap()
        .to_string()
        .contains("tokenizer.ggml.pre is 'tekken', a pre-tokenizer not implemented"));
}
