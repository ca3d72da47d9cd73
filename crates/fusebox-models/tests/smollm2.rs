//! The real SmolLM2-135M-Instruct GGUF: metadata, tensors, token ids against the
//! reference fixture made by `scripts/smollm2_token_fixture.py`, and greedy generation
//! against the plain-loop reference in `reference_llama`.
//!
//! The model file is not in git. It is looked for at `$FUSEBOX_SMOLLM2_GGUF`, then
//! at `models/SmolLM2-135M-Instruct.Q4_1.gguf` in the workspace; when absent each
//! test prints why it is skipped and passes.

mod common;
mod reference_llama;

use std::path::PathBuf;
use std::sync::OnceLock;

use common::Rng;
use fusebox::{CpuBackend, DType};
use fusebox_models::chat::ChatTemplate;
use fusebox_models::gguf::GgufFile;
use fusebox_models::tokenizer::{PreTokenizer, Tokenizer};
use fusebox_models::{open, pretrained};
use serde_json::{json, Value as Json};

fn model_path() -> PathBuf {
    match std::env::var_os("FUSEBOX_SMOLLM2_GGUF") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    }
}

struct Model {
    file: GgufFile,
    tok: Tokenizer,
}

fn model() -> Option<&'static Model> {
    static MODEL: OnceLock<Option<Model>> = OnceLock::new();
    let m = MODEL.get_or_init(|| {
        let path = model_path();
        if !path.exists() {
            return None;
        }
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let tok = Tokenizer::from_gguf(file.metadata()).expect("tokenizer from GGUF");
        Some(Model { file, tok })
    });
    if m.is_none() {
        eprintln!("skipping: SmolLM2 GGUF not found at {} (set FUSEBOX_SMOLLM2_GGUF)", model_path().display());
    }
    m.as_ref()
}

fn fixture() -> Json {
    let text = include_str!("fixtures/smollm2_tokens.json");
    serde_json::from_str(text).expect("fixture is JSON")
}

/// A fixture case: text, reference ids, and the reference decoding of those ids.
struct Case {
    text: String,
    ids: Vec<u32>,
    /// Differs from `text` only where the vocabulary lacks one of its bytes.
    decoded: String,
}

fn cases() -> Vec<Case> {
    fixture()["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let text = c["text"].as_str().unwrap().to_owned();
            Case {
                ids: c["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect(),
                decoded: c["decoded"].as_str().unwrap_or(&text).to_owned(),
                text,
            }
        })
        .collect()
}

#[test]
fn metadata_and_tensors() {
    let Some(m) = model() else { return };
    let meta = m.file.metadata();
    assert_eq!(m.file.version(), 3);
    assert_eq!(meta.require_str("general.architecture").unwrap(), "llama");
    assert_eq!(meta.require_str("tokenizer.ggml.pre").unwrap(), "smollm");
    assert_eq!(meta.require_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(meta.require_u32("llama.block_count").unwrap(), 30);
    assert_eq!(m.file.tensors().len(), 272);
    let embd = m.file.tensor("token_embd.weight").unwrap();
    assert_eq!((embd.dims(), embd.dtype()), (&[49152, 576][..], DType::Q8_0));
    let down = m.file.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!((down.dims(), down.dtype()), (&[576, 1536][..], DType::Q4_1));
    let norm = m.file.tensor("blk.0.attn_norm.weight").unwrap();
    assert_eq!((norm.dims(), norm.dtype()), (&[576][..], DType::F32));
    // Every tensor is readable.
    for info in m.file.tensors() {
        m.file.tensor(info.name()).unwrap_or_else(|e| panic!("{}: {e}", info.name()));
    }
}

#[test]
fn fixture_ids_match_the_reference() {
    let Some(m) = model() else { return };
    assert_eq!(fixture()["pre_tokenizer"], "smollm");
    assert_eq!(m.tok.pre_tokenizer(), PreTokenizer::Smollm);
    let cases = cases();
    assert!(cases.len() >= 15);
    let mut failures = Vec::new();
    for case in &cases {
        let got = m.tok.encode(&case.text, false);
        if got != case.ids {
            failures.push(format!("{:?}\n  want {:?}\n  got  {got:?}", case.text, case.ids));
        }
        assert_eq!(m.tok.decode(&case.ids).unwrap(), case.decoded, "decode of the reference ids");
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn special_ids_and_chat_template() {
    let Some(m) = model() else { return };
    let tok = &m.tok;
    assert_eq!((tok.bos_id(), tok.eos_id(), tok.pad_id()), (Some(1), Some(2), Some(2)));
    assert!(!tok.add_bos_default());
    assert!(tok.is_eog(2) && tok.is_eog(0), "<|im_end|> and <|endoftext|> end generation");
    let source = m.file.metadata().require_str("tokenizer.chat_template").unwrap();
    let template = ChatTemplate::for_tokenizer(Some(source), tok).unwrap();
    let ours = ChatTemplate::smollm2().unwrap();
    for conv in [&[("user", "What is 2+2?")][..], &[("system", "S"), ("user", "Q"), ("assistant", "A")][..]] {
        for gen in [true, false] {
            assert_eq!(template.apply(conv, gen).unwrap(), ours.apply(conv, gen).unwrap());
        }
    }
    assert_eq!(template.end_of_turn(), ["<|im_end|>"]);
    assert_eq!(template.notice(), None);
    let prompt = template.apply(&[("user", "What is 2+2?")], true).unwrap();
    // The fixture's chat case is exactly this prompt.
    let case = cases().into_iter().find(|c| c.text == prompt).expect("chat case in fixture");
    assert_eq!(tok.encode(&prompt, false), case.ids);
    assert_eq!(case.ids[0], 1, "<|im_start|> is one token");
}

#[test]
fn round_trips_and_streaming_on_the_real_vocab() {
    let Some(m) = model() else { return };
    let tok = &m.tok;
    let mut rng = Rng::new(2024);
    let pool: Vec<char> = "aZé ß\t\n\r'0٣½!…你好😀👍🏽\u{301}न्\0\u{a0}\u{3000}<|>_".chars().collect();
    for case in cases() {
        assert_eq!(tok.decode(&tok.encode(&case.text, false)).unwrap(), case.decoded);
    }
    for _ in 0..1000 {
        let s: String = (0..rng.below(40)).map(|_| pool[rng.below(pool.len())]).collect();
        let ids = tok.encode(&s, true);
        assert_eq!(tok.decode(&ids[1..]).unwrap(), s);
        let mut stream = tok.stream_decoder(true);
        let mut out: String = ids.iter().map(|&id| stream.push(id).unwrap()).collect();
        out.push_str(&stream.finish());
        assert_eq!(out, s, "streamed, BOS skipped");
    }
}

#[test]
fn tokenizer_json_loader_matches_on_the_real_vocab() {
    let Some(m) = model() else { return };
    // Write the GGUF vocabulary as a Hugging Face tokenizer.json and load it back.
    let meta = m.file.metadata();
    let tokens = meta.require_strings("tokenizer.ggml.tokens").unwrap();
    let merges = meta.require_strings("tokenizer.ggml.merges").unwrap();
    let vocab: serde_json::Map<String, Json> = tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
    let added: Vec<Json> = (0..tokens.len() as u32)
        .filter(|&i| m.tok.token_type(i) == Some(fusebox_models::tokenizer::TokenType::Control))
        .map(|i| json!({"id": i, "content": tokens[i as usize], "special": true}))
        .collect();
    let json = json!({
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]},
        "model": {"type": "BPE", "vocab": vocab, "merges": merges},
    });
    let config = json!({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"});
    let hf = Tokenizer::from_hf_json(&json.to_string(), Some(&config.to_string())).unwrap();
    assert_eq!((hf.bos_id(), hf.eos_id()), (Some(1), Some(2)));
    for case in cases() {
        assert_eq!(hf.encode(&case.text, false), case.ids, "{:?}", case.text);
    }
}

#[test]
fn greedy_capital_of_france_is_paris() {
    let Some(_) = model() else { return };
    let b = CpuBackend::with_threads(2).unwrap();
    let p = open::load(&b, &model_path()).unwrap();
    let prompt = p.tokenizer.encode("The capital of France is", false);
    let mut session = p.session(&b, 64).unwrap();
    let mut sampler = fusebox_models::Sampler::new(Default::default()).unwrap();
    let out = pretrained::generate(&mut session, &b, &prompt, 4, &mut sampler, &p.stop_ids(false), |_| Ok(())).unwrap();
    let text = p.tokenizer.decode(&out.tokens).unwrap();
    assert!(text.starts_with(" Paris."), "{text:?}");
}

/// Logits of the fast path (f32 activations, quantized blocks) and the f64 reference
/// (dequantized weights) at the last prompt position and at every compared step agree
/// within this.
const LOGIT_TOLERANCE: f64 = 1e-3;

/// The f32-activation decode path (the default, `exact_decode`); the integer path rounds
/// the activations to 8 bits, see `examples/decode_agreement.rs` for its agreement.
#[test]
fn greedy_matches_the_plain_loop_reference() {
    let Some(m) = model() else { return };
    let b = CpuBackend::builder().threads(2).exact_decode(true).build().unwrap();
    let p = open::load(&b, &model_path()).unwrap();
    let reference = reference_llama::RefLlama::from_gguf(&m.file);
    // Five prompts × 24 tokens: `cargo run --release -p fusebox-models --example llama_agreement`.
    for prompt in ["The capital of France is", "Once upon a time, there was a little girl who"] {
        let ids = p.tokenizer.encode(prompt, false);
        let mut session = p.session(&b, ids.len() + 25).unwrap();
        let a = reference_llama::compare_greedy(&reference, |t| session.step(&b, t).unwrap(), &ids, 24, 0.3);
        assert_eq!(a.mismatch_at, None, "{prompt:?}: {a:?}");
        assert!(a.compared >= 1, "{prompt:?}: nothing compared ({a:?})");
        assert!(a.prompt_logit_max_diff < LOGIT_TOLERANCE, "{prompt:?}: {a:?}");
        assert!(a.max_logit_diff < LOGIT_TOLERANCE, "{prompt:?}: {a:?}");
        assert!(a.same_prefix_max_logit_diff < LOGIT_TOLERANCE, "{prompt:?}: {a:?}");
    }
}
