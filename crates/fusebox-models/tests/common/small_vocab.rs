//! A small byte-level BPE vocabulary (256 byte tokens, a few merges, three added
//! tokens) and a GGUF holding it, for tokenizer tests and the fuzz seed.

use fusebox_models::gguf::{Array, Value};

use super::gguf_writer::GgufWriter;

/// A ChatML template in the shape of SmolLM2's, with a short default system prompt.
const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}\
{{ '<|im_start|>system\nBe brief.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + \
message['content'] + '<|im_end|>' + '\n'}}{% endfor %}";

/// GPT-2's byte-level character for byte `b` (written out independently of the crate).
pub fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return b as char;
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap()
}

/// 256 byte tokens, then merged tokens, then three added tokens.
pub fn small_vocab() -> (Vec<String>, Vec<(&'static str, &'static str)>) {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let merges = vec![("Ġ", "t"), ("l", "l"), ("e", "ll"), ("h", "ell"), ("hell", "o"), ("h", "e"), ("Ġt", "he")];
    for (a, b) in &merges {
        tokens.push(format!("{a}{b}"));
    }
    (tokens, merges)
}

/// Added tokens after the vocabulary: (text, control?); the others are user-defined.
pub const ADDED: [(&str, bool); 3] = [("<|im_start|>", true), ("<|im_end|>", true), ("<user>", false)];

/// A GGUF with the small vocabulary as `tokenizer.ggml.*` metadata (pre `smollm`),
/// BOS `<|im_start|>`, EOS `<|im_end|>`, and a ChatML `tokenizer.chat_template`.
pub fn small_tokenizer_writer() -> GgufWriter {
    let (mut tokens, merges) = small_vocab();
    let mut types = vec![1i32; tokens.len()];
    for (t, special) in ADDED {
        tokens.push(t.to_owned());
        types.push(if special { 3 } else { 4 });
    }
    let n = tokens.len() as u32;
    GgufWriter::default()
        .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::String("smollm".into()))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
        .kv("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))
        .kv(
            "tokenizer.ggml.merges",
            Value::Array(Array::String(merges.iter().map(|(a, b)| format!("{a} {b}")).collect())),
        )
        .kv("tokenizer.ggml.bos_token_id", Value::U32(n - 3))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(n - 2))
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(true))
        .kv("tokenizer.chat_template", Value::String(CHATML.into()))
}

/// The small vocabulary as a Hugging Face `tokenizer.json` value: byte-level BPE with
/// [`ADDED`] after the vocabulary, merges in the string form, and `pre_tokenizer`.
pub fn hf_tokenizer_json(pre_tokenizer: serde_json::Value) -> serde_json::Value {
    let (tokens, merges) = small_vocab();
    let vocab: serde_json::Map<String, serde_json::Value> =
        tokens.iter().enumerate().map(|(i, t)| (t.clone(), serde_json::json!(i))).collect();
    let n = tokens.len();
    let added: Vec<_> = ADDED
        .iter()
        .enumerate()
        .map(|(i, (t, special))| serde_json::json!({"id": n + i, "content": t, "special": special}))
        .collect();
    serde_json::json!({
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "model": {"type": "BPE", "vocab": vocab, "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>()}
    })
}
