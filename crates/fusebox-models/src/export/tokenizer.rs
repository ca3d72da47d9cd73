//! A model's tokenizer as the source file stores it, and its conversion to the other
//! format: GGUF `tokenizer.ggml.*` metadata ⇄ a Hugging Face `tokenizer.json` with its
//! `tokenizer_config.json`.
//!
//! Conversions cover byte-level BPE (GGUF `tokenizer.ggml.model = gpt2`) with the
//! pre-tokenizers both sides name: `gpt2` (`ByteLevel` with its regex), `smollm`
//! (`Digits` then `ByteLevel`), `llama-bpe` and `qwen2` (a `Split` regex, then
//! `ByteLevel` without one); and GGUF SentencePiece-style BPE (`llama`: scores) to a
//! `tokenizer.json` BPE with byte fallback. Every conversion is checked: the tokenizer
//! built from the converted description must give the ids of the source's on a sample
//! text.

use std::path::Path;

use fusebox::{Error, Result};
use serde_json::{json, Map, Value as Json};

use crate::files::{read_json, read_text, MAX_CONFIG_BYTES, MAX_TOKENIZER_BYTES};
use crate::gguf::{Array, Metadata, Value};
use crate::tokenizer::{PreTokenizer, TokenType, Tokenizer, O200K_PATTERN};

/// Llama 3's `Split` pattern (as `tokenizer.json` writes it).
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's `Split` pattern.
const QWEN2_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Text a converted tokenizer must split into the same ids as its source: words,
/// numbers of every length, punctuation runs, whitespace runs, non-ASCII letters,
/// an emoji and chat-template tokens.
const SAMPLE: &str = "Hello, world! It's 2024: 3.14159 and 1234567 apples.\n\n  Indented\tline — \
                      naïve café, Grüße, 東京, Привет 🙂 <|im_start|>user\nHi<|im_end|>\n's 'LL don't";

/// A model's tokenizer as its source stores it.
#[derive(Debug, Clone)]
pub enum TokenizerInfo {
    /// The `tokenizer.ggml.*` metadata of a GGUF file.
    Gguf(Metadata),
    /// The tokenizer files of a Hugging Face directory.
    Hf {
        /// `tokenizer.json`, as its text.
        tokenizer_json: String,
        /// `tokenizer_config.json`, when present.
        tokenizer_config: Option<Json>,
        /// `generation_config.json`, when present.
        generation_config: Option<Json>,
    },
}

fn err(msg: impl std::fmt::Display) -> Error {
    Error::Io(format!("export: tokenizer: {msg}"))
}

impl TokenizerInfo {
    /// The tokenizer of GGUF metadata, and its chat template (`tokenizer.chat_template`).
    pub fn from_gguf(meta: &Metadata) -> (TokenizerInfo, Option<String>) {
        let template = meta.get_str("tokenizer.chat_template").ok().flatten().map(str::to_string);
        (TokenizerInfo::Gguf(super::tokenizer_entries(meta)), template)
    }

    /// The tokenizer files of a Hugging Face directory, and its chat template
    /// (`tokenizer_config.json`'s `chat_template`, else `chat_template.jinja`).
    pub fn from_hf_dir(dir: &Path) -> Result<(TokenizerInfo, Option<String>)> {
        let tokenizer_json = read_text(&dir.join("tokenizer.json"), "tokenizer.json", MAX_TOKENIZER_BYTES)?;
        let optional = |name: &str| -> Result<Option<Json>> {
            let p = dir.join(name);
            if p.exists() {
                read_json(&p, name, MAX_CONFIG_BYTES).map(Some)
            } else {
                Ok(None)
            }
        };
        let tokenizer_config = optional("tokenizer_config.json")?;
        let generation_config = optional("generation_config.json")?;
        let mut template = match tokenizer_config.as_ref().map(|c| &c["chat_template"]) {
            Some(Json::String(s)) => Some(s.clone()),
            Some(Json::Array(named)) => {
                named.iter().find(|e| e["name"] == "default").and_then(|e| e["template"].as_str()).map(str::to_string)
            }
            _ => None,
        };
        let jinja = dir.join("chat_template.jinja");
        if template.is_none() && jinja.exists() {
            template = Some(read_text(&jinja, "chat_template.jinja", MAX_CONFIG_BYTES)?);
        }
        Ok((TokenizerInfo::Hf { tokenizer_json, tokenizer_config, generation_config }, template))
    }

    /// The tokenizer itself.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        match self {
            TokenizerInfo::Gguf(meta) => Tokenizer::from_gguf(meta),
            TokenizerInfo::Hf { tokenizer_json, tokenizer_config, .. } => {
                let config = tokenizer_config.as_ref().map(Json::to_string);
                Tokenizer::from_hf_json(tokenizer_json, config.as_deref())
            }
        }
    }

    /// The `tokenizer.ggml.*` entries for a GGUF file of a model with `vocab_size`
    /// embedding rows (a shorter vocabulary is padded with unused `[PAD{id}]` tokens,
    /// as llama.cpp's converter does).
    pub(crate) fn gguf_entries(&self, vocab_size: usize) -> Result<Vec<(String, Value)>> {
        let entries = match self {
            TokenizerInfo::Gguf(meta) => meta.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            TokenizerInfo::Hf { tokenizer_json, .. } => hf_to_gguf(&self.tokenizer()?, tokenizer_json, vocab_size)?,
        };
        let mut meta = Metadata::default();
        for (k, v) in &entries {
            meta.insert(k.clone(), v.clone());
        }
        same_ids(&self.tokenizer()?, &Tokenizer::from_gguf(&meta)?, "the GGUF tokenizer metadata")?;
        Ok(entries)
    }

    /// `tokenizer.json` (text), the `tokenizer_config.json` to start from, and the
    /// source's `generation_config.json`, for a Hugging Face directory. A GGUF
    /// tokenizer is converted, and the conversion refused when it tokenizes a sample
    /// text differently from the source.
    pub fn hf_files(&self) -> Result<(String, Json, Option<Json>)> {
        let (text, config, generation) = match self {
            TokenizerInfo::Hf { tokenizer_json, tokenizer_config, generation_config } => (
                tokenizer_json.clone(),
                tokenizer_config.clone().unwrap_or_else(|| json!({})),
                generation_config.clone(),
            ),
            TokenizerInfo::Gguf(meta) => {
                let (text, config) = gguf_to_hf(meta, &self.tokenizer()?)?;
                (text, config, None)
            }
        };
        let rebuilt = Tokenizer::from_hf_json(&text, Some(&config.to_string()))?;
        same_ids(&self.tokenizer()?, &rebuilt, "the tokenizer.json written")?;
        Ok((text, config, generation))
    }
}

/// Refuses a converted tokenizer that differs from its source on [`SAMPLE`].
fn same_ids(source: &Tokenizer, converted: &Tokenizer, what: &str) -> Result<()> {
    for add_special in [false, true] {
        let want = source.tokenize(SAMPLE, add_special, true);
        let got = converted.tokenize(SAMPLE, add_special, true);
        if want != got {
            return Err(err(format!(
                "{what} tokenizes a sample text differently from the source (add_special {add_special}): \
                 {want:?} vs {got:?}"
            )));
        }
    }
    if (source.bos_id(), source.eos_id()) != (converted.bos_id(), converted.eos_id()) {
        return Err(err(format!(
            "{what}: BOS/EOS {:?}/{:?}, the source's {:?}/{:?}",
            converted.bos_id(),
            converted.eos_id(),
            source.bos_id(),
            source.eos_id()
        )));
    }
    Ok(())
}

fn type_code(t: TokenType) -> i32 {
    match t {
        TokenType::Normal => 1,
        TokenType::Unknown => 2,
        TokenType::Control => 3,
        TokenType::UserDefined => 4,
        TokenType::Unused => 5,
        TokenType::Byte => 6,
    }
}

/// The llama.cpp name of a pre-tokenizer this module converts.
fn gguf_pre_name(p: PreTokenizer) -> Option<&'static str> {
    match p {
        PreTokenizer::Gpt2 => Some("gpt2"),
        PreTokenizer::Smollm => Some("smollm"),
        PreTokenizer::Llama3 => Some("llama-bpe"),
        PreTokenizer::Qwen2 => Some("qwen2"),
        PreTokenizer::Gpt4o => Some("gpt-4o"),
        _ => None,
    }
}

/// `tokenizer.ggml.*` entries for the byte-level BPE of a `tokenizer.json`.
fn hf_to_gguf(tok: &Tokenizer, tokenizer_json: &str, vocab_size: usize) -> Result<Vec<(String, Value)>> {
    if tok.is_sentencepiece() {
        return Err(Error::unsupported(
            "export",
            "a tokenizer.json without ByteLevel (SentencePiece-style BPE) cannot be written as GGUF metadata here: \
             llama.cpp reads those from the scores of a tokenizer.model",
        ));
    }
    let pre = tok.pre_tokenizer();
    let pre_name = gguf_pre_name(pre).ok_or_else(|| {
        Error::unsupported(
            "export",
            format!(
                "tokenizer.json's pre-tokenizer ({pre:?}) has no llama.cpp name here (converted: ByteLevel as gpt2, \
                 Digits + ByteLevel as smollm, the Llama 3, Qwen2 and o200k Split patterns)"
            ),
        )
    })?;
    let n = tok.vocab_size();
    if n > vocab_size {
        return Err(err(format!("{n} tokens, more than the model's {vocab_size} embedding rows")));
    }
    let mut tokens = Vec::with_capacity(vocab_size);
    let mut types = Vec::with_capacity(vocab_size);
    for id in 0..n as u32 {
        tokens.push(tok.token(id).unwrap_or_default().to_string());
        types.push(type_code(tok.token_type(id).unwrap_or(TokenType::Normal)));
    }
    for id in n..vocab_size {
        tokens.push(format!("[PAD{id}]"));
        types.push(type_code(TokenType::Unused));
    }
    let root: Json = serde_json::from_str(tokenizer_json).map_err(|e| err(format!("tokenizer.json: {e}")))?;
    let merges = root["model"]["merges"]
        .as_array()
        .ok_or_else(|| err("tokenizer.json: model.merges is not a list"))?
        .iter()
        .enumerate()
        .map(|(i, m)| match m {
            Json::String(s) => Ok(s.clone()),
            Json::Array(pair) if pair.len() == 2 && pair.iter().all(Json::is_string) => {
                Ok(format!("{} {}", pair[0].as_str().unwrap_or_default(), pair[1].as_str().unwrap_or_default()))
            }
            other => Err(err(format!("tokenizer.json: merge {i} is {other}, expected \"a b\" or [a, b]"))),
        })
        .collect::<Result<Vec<_>>>()?;
    let mut out = vec![
        ("tokenizer.ggml.model".to_string(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".to_string(), Value::String(pre_name.into())),
        ("tokenizer.ggml.tokens".to_string(), Value::Array(Array::String(tokens))),
        ("tokenizer.ggml.token_type".to_string(), Value::Array(Array::I32(types))),
        ("tokenizer.ggml.merges".to_string(), Value::Array(Array::String(merges))),
    ];
    for (key, id) in [
        ("bos_token_id", tok.bos_id()),
        ("eos_token_id", tok.eos_id()),
        ("unknown_token_id", tok.unk_id()),
        ("padding_token_id", tok.pad_id()),
    ] {
        if let Some(id) = id {
            out.push((format!("tokenizer.ggml.{key}"), Value::U32(id)));
        }
    }
    out.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(tok.add_bos_default())));
    out.push(("tokenizer.ggml.add_eos_token".into(), Value::Bool(tok.add_eos_default())));
    Ok(out)
}

/// The `pre_tokenizer` of a `tokenizer.json` for a llama.cpp pre-tokenizer.
fn hf_pre_tokenizer(pre: PreTokenizer) -> Option<Json> {
    let byte_level =
        |regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": regex});
    let split = |pattern: &str| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
            byte_level(false)
        ]})
    };
    match pre {
        PreTokenizer::Gpt2 => Some(byte_level(true)),
        PreTokenizer::Smollm => Some(json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            byte_level(true)
        ]})),
        PreTokenizer::Llama3 => Some(split(LLAMA3_PATTERN)),
        PreTokenizer::Qwen2 => Some(split(QWEN2_PATTERN)),
        PreTokenizer::Gpt4o => Some(split(O200K_PATTERN)),
        _ => None,
    }
}

/// `tokenizer.json` (text) and `tokenizer_config.json` for GGUF tokenizer metadata:
/// byte-level BPE (`gpt2`) or SentencePiece-style BPE (`llama`).
fn gguf_to_hf(meta: &Metadata, tok: &Tokenizer) -> Result<(String, Json)> {
    let model = meta.get_str("tokenizer.ggml.model")?.unwrap_or("");
    match model {
        "gpt2" if !tok.is_sentencepiece() => gguf_byte_level_to_hf(meta, tok),
        "llama" => gguf_sentencepiece_to_hf(meta, tok),
        _ => Err(Error::unsupported(
            "export",
            format!(
                "a GGUF tokenizer of model '{model}' cannot be written as tokenizer.json here (converted: byte-level \
                 BPE, tokenizer.ggml.model = gpt2, and SentencePiece-style BPE, llama)"
            ),
        )),
    }
}

/// The vocabulary, and the `added_tokens` entries of the control, unknown and
/// user-defined tokens. Their types are the file's own, or with `as_llama_cpp` the
/// tokenizer's, which is llama.cpp's view (texts such as `</s>` or `<end_of_turn>` are
/// control tokens, matched in text only when special tokens are parsed, whatever the
/// file says).
fn gguf_vocab(meta: &Metadata, tok: &Tokenizer, as_llama_cpp: bool) -> Result<(Map<String, Json>, Vec<Json>)> {
    let tokens = meta.require_strings("tokenizer.ggml.tokens")?;
    let raw_types: Vec<i64> = if as_llama_cpp {
        (0..tokens.len() as u32).map(|id| tok.token_type(id).map_or(1, |t| type_code(t).into())).collect()
    } else {
        match meta.get_array("tokenizer.ggml.token_type")? {
            Some(a) => (0..a.len()).map(|i| a.get_i64(i).unwrap_or(1)).collect(),
            None => vec![1; tokens.len()],
        }
    };
    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (id, t) in tokens.iter().enumerate() {
        if vocab.insert(t.clone(), json!(id)).is_some() {
            return Err(err(format!("token {id} ({t:?}) appears twice in tokenizer.ggml.tokens")));
        }
        let ty = raw_types.get(id).copied().unwrap_or(1);
        if matches!(ty, 2..=4) {
            added.push(json!({"id": id, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                              "normalized": false, "special": ty != 4}));
        }
    }
    Ok((vocab, added))
}

/// The post-processor that puts BOS before a text when the tokenizer adds it.
fn bos_post_processor(tok: &Tokenizer) -> Option<Json> {
    let bos = tok.bos_id().filter(|_| tok.add_bos_default())?;
    let text = tok.token(bos).unwrap_or_default();
    Some(json!({"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": text, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": text, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": text, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {text: {"id": text, "ids": [bos], "tokens": [text]}}}))
}

/// `tokenizer_config.json` for a converted tokenizer.
fn hf_tokenizer_config(tok: &Tokenizer) -> Json {
    let name = |id: Option<u32>| id.and_then(|i| tok.token(i)).map(|s| json!(s)).unwrap_or(Json::Null);
    json!({
        "add_bos_token": tok.add_bos_default(),
        "add_eos_token": tok.add_eos_default(),
        "bos_token": name(tok.bos_id()),
        "eos_token": name(tok.eos_id()),
        "pad_token": name(tok.pad_id()),
        "unk_token": name(tok.unk_id()),
        "clean_up_tokenization_spaces": false,
        "tokenizer_class": "PreTrainedTokenizerFast",
    })
}

/// SentencePiece-style BPE (GGUF `llama`: token scores) as a Hugging Face BPE
/// `tokenizer.json`, the form `transformers` ships for Llama 2, Mistral and Gemma.
///
/// llama.cpp merges, anywhere in the text, the adjacent pair whose concatenation is the
/// token of highest score. A BPE model does the same when its merge list holds, for
/// every token, each split of it into two tokens, ranked by the merged token's score
/// (highest first; then by the merged token's id and the halves' ids) — the list
/// `transformers`' `SentencePieceExtractor` derives from a `tokenizer.model`. Spaces
/// become `▁` in the normalizer (after a `▁` prefix when `add_space_prefix`), and
/// characters outside the vocabulary fall back to their `<0xNN>` byte tokens.
fn gguf_sentencepiece_to_hf(meta: &Metadata, tok: &Tokenizer) -> Result<(String, Json)> {
    let tokens = meta.require_strings("tokenizer.ggml.tokens")?;
    // The tokenizer compares scores as f32, as llama.cpp does.
    let scores: Vec<f32> = match meta.get_array("tokenizer.ggml.scores")? {
        Some(Array::F32(v)) => v.clone(),
        Some(Array::F64(v)) => v.iter().map(|&x| x as f32).collect(),
        Some(other) => return Err(err(format!("tokenizer.ggml.scores is an array of {}", other.element_type()))),
        None => vec![0.0; tokens.len()],
    };
    if scores.len() != tokens.len() {
        return Err(err(format!("tokenizer.ggml.scores has {} entries for {} tokens", scores.len(), tokens.len())));
    }
    let (vocab, added) = gguf_vocab(meta, tok, true)?;
    let id_of = |t: &str| vocab.get(t).and_then(Json::as_u64);
    // (merged id, left id, right id) for every split of every token into two tokens.
    let mut merges: Vec<(u64, u64, u64)> = Vec::new();
    for (id, t) in tokens.iter().enumerate() {
        for (cut, _) in t.char_indices().skip(1) {
            if let (Some(l), Some(r)) = (id_of(&t[..cut]), id_of(&t[cut..])) {
                merges.push((id as u64, l, r));
            }
        }
    }
    merges.sort_by(|a, b| scores[b.0 as usize].total_cmp(&scores[a.0 as usize]).then(a.cmp(b)));
    let merges: Vec<Json> = merges.iter().map(|&(_, l, r)| json!([tokens[l as usize], tokens[r as usize]])).collect();
    let space_prefix = meta.get_bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
    let replace_space = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
    let normalizer = if space_prefix {
        json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u{2581}"}, replace_space]})
    } else {
        replace_space
    };
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let unk = tok.unk_id().and_then(|i| tok.token(i)).map(|s| json!(s)).unwrap_or(Json::Null);
    let root = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": null,
        "post_processor": bos_post_processor(tok),
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
            "ignore_merges": false, "vocab": vocab, "merges": merges
        }
    });
    let text = serde_json::to_string(&root).map_err(|e| err(e.to_string()))?;
    Ok((text, hf_tokenizer_config(tok)))
}

/// `tokenizer.json` (text) and `tokenizer_config.json` for GGUF byte-level BPE metadata.
fn gguf_byte_level_to_hf(meta: &Metadata, tok: &Tokenizer) -> Result<(String, Json)> {
    let pre = tok.pre_tokenizer();
    let pre_tokenizer = hf_pre_tokenizer(pre).ok_or_else(|| {
        Error::unsupported(
            "export",
            format!(
                "the GGUF pre-tokenizer '{}' has no tokenizer.json form here (converted: gpt2, smollm, llama-bpe, qwen2)",
                meta.get_str("tokenizer.ggml.pre").ok().flatten().unwrap_or("default")
            ),
        )
    })?;
    // The file's own types, as llama.cpp's converter read them from the source.
    let (vocab, added) = gguf_vocab(meta, tok, false)?;
    let merges: Vec<Json> = meta
        .require_strings("tokenizer.ggml.merges")?
        .iter()
        .map(|m| match m.split_once(' ') {
            Some((a, b)) => Ok(json!([a, b])),
            None => Err(err(format!("merge {m:?} has no space"))),
        })
        .collect::<Result<_>>()?;
    let post_processor = bos_post_processor(tok).unwrap_or_else(
        || json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true}),
    );
    let root = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": pre == PreTokenizer::Llama3, "vocab": vocab, "merges": merges
        }
    });
    let text = serde_json::to_string(&root).map_err(|e| err(e.to_string()))?;
    Ok((text, hf_tokenizer_config(tok)))
}
