//! Building a tokenizer from GGUF metadata, as llama.cpp's `llama_vocab::load` reads it.
//!
//! Keys read (llama.cpp's names):
//!
//! | key                                  | type            | use                                              |
//! |--------------------------------------|-----------------|--------------------------------------------------|
//! | `tokenizer.ggml.model`               | string          | `gpt2` (byte-level BPE) or `llama` (SentencePiece BPE) |
//! | `tokenizer.ggml.pre`                 | string          | `gpt2` only: pre-tokenizer, see [`PreTokenizer`] (missing: `default`) |
//! | `tokenizer.ggml.tokens`              | array of string | vocabulary, index = id                           |
//! | `tokenizer.ggml.token_type`          | array of int    | [`TokenType`] codes (optional)                   |
//! | `tokenizer.ggml.scores`              | array of f32    | `llama` only: merge priority of each token (optional, 0) |
//! | `tokenizer.ggml.merges`              | array of string | `gpt2` only: `"left right"`, rank = index        |
//! | `tokenizer.ggml.{bos,eos,padding,unknown}_token_id` | int | special ids (optional; `llama` defaults 1, 2, –, 0) |
//! | `tokenizer.ggml.{eot,eom}_token_id`  | int             | more end-of-generation ids (optional)            |
//! | `tokenizer.ggml.add_bos_token`       | bool            | BOS with `add_special` (default: `llama` and Llama 3 yes, else no) |
//! | `tokenizer.ggml.add_eos_token`       | bool            | EOS with `add_special` (default no)              |
//! | `tokenizer.ggml.add_space_prefix`    | bool            | `llama` only: a space before the text and after each special token (default yes) |
//!
//! The weights are not read: a file whose tensors this crate cannot load still
//! gives its tokenizer.

use fusebox::Result;

use super::special::Order;
use super::{build_error, drop_harmony_end, Model, Parts, PreTokenizer, TextOp, TokenType, Tokenizer};
use crate::gguf::{Array, Metadata};

/// The token types, `Normal` for every token when the key is absent.
fn token_types(meta: &Metadata, n: usize) -> Result<Vec<TokenType>> {
    let Some(arr) = meta.get_array("tokenizer.ggml.token_type")? else {
        return Ok(vec![TokenType::Normal; n]);
    };
    if arr.len() != n {
        return Err(build_error(format!("tokenizer.ggml.token_type has {} entries for {n} tokens", arr.len())));
    }
    (0..arr.len())
        .map(|i| {
            arr.get_i64(i).map(TokenType::from_code).ok_or_else(|| {
                build_error(format!(
                    "tokenizer.ggml.token_type is an array of {}, expected integers",
                    arr.element_type()
                ))
            })
        })
        .collect()
}

/// The scores, 0 for every token when the key is absent.
fn scores(meta: &Metadata, n: usize) -> Result<Vec<f32>> {
    let Some(arr) = meta.get_array("tokenizer.ggml.scores")? else {
        return Ok(vec![0.0; n]);
    };
    let v = match arr {
        Array::F32(v) => v.clone(),
        Array::F64(v) => v.iter().map(|&x| x as f32).collect(),
        other => {
            return Err(build_error(format!(
                "tokenizer.ggml.scores is an array of {}, expected f32",
                other.element_type()
            )))
        }
    };
    if v.len() != n {
        return Err(build_error(format!("tokenizer.ggml.scores has {} entries for {n} tokens", v.len())));
    }
    Ok(v)
}

/// Token texts llama.cpp always treats as control (and end-of-generation) tokens,
/// whatever their declared type (`llama_vocab::impl::load`).
const CONTROL_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Harmony's structure tokens, which llama.cpp makes user-defined (always written
/// out when decoding, matched in text even without special parsing) whatever their
/// declared type.
const HARMONY_USER_DEFINED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// The token types, with llama.cpp's overrides: [`CONTROL_TEXTS`] are control tokens
/// (and end generation), [`HARMONY_USER_DEFINED`] are user-defined, and so is
/// `<|end|>` in a harmony vocabulary, where it does not end generation.
fn types_as_llama_cpp(tokens: &[String], mut types: Vec<TokenType>) -> (Vec<TokenType>, Vec<u32>) {
    let mut eog = Vec::new();
    for (i, (t, ty)) in tokens.iter().zip(types.iter_mut()).enumerate() {
        if CONTROL_TEXTS.contains(&t.as_str()) {
            *ty = TokenType::Control;
            eog.push(i as u32);
        } else if HARMONY_USER_DEFINED.contains(&t.as_str()) {
            *ty = TokenType::UserDefined;
        }
    }
    if let Some(end) = drop_harmony_end(&mut eog, |id| tokens.get(id as usize).cloned()) {
        types[end as usize] = TokenType::UserDefined;
    }
    (types, eog)
}

impl Tokenizer {
    /// The tokenizer described by a GGUF file's metadata (see the module table).
    pub fn from_gguf(meta: &Metadata) -> Result<Tokenizer> {
        let model =
            meta.get_str("tokenizer.ggml.model")?.ok_or_else(|| build_error("tokenizer.ggml.model is missing"))?;
        let tokens = meta.require_strings("tokenizer.ggml.tokens")?.to_vec();
        let n = tokens.len();
        let (types, mut extra_eog) = types_as_llama_cpp(&tokens, token_types(meta, n)?);
        let id = |key: &str| meta.get_u32(&format!("tokenizer.ggml.{key}"));
        let flag = |key: &str| meta.get_bool(&format!("tokenizer.ggml.{key}"));
        extra_eog.extend([id("eot_token_id")?, id("eom_token_id")?].into_iter().flatten());
        let add_eos = flag("add_eos_token")?.unwrap_or(false);
        match model {
            "gpt2" => {
                // llama.cpp warns and uses `default` when the key is missing.
                let pre_name = meta.get_str("tokenizer.ggml.pre")?.unwrap_or("default");
                let pre = PreTokenizer::from_gguf_name(pre_name).ok_or_else(|| {
                    build_error(format!(
                        "tokenizer.ggml.pre is '{pre_name}', a pre-tokenizer not implemented here (implemented: {})",
                        PreTokenizer::GGUF_NAMES.join(", ")
                    ))
                })?;
                let merges = meta
                    .require_strings("tokenizer.ggml.merges")?
                    .iter()
                    .enumerate()
                    .map(|(i, m)| match m.split_once(' ') {
                        Some((a, b)) => Ok((a.to_owned(), b.to_owned())),
                        None => Err(build_error(format!("merge {i} ({m:?}) has no space between its two tokens"))),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let llama3 = pre == PreTokenizer::Llama3;
                Tokenizer::build(Parts {
                    tokens,
                    types,
                    merges,
                    pre,
                    stages: pre.stages(),
                    model: Model::ByteLevel,
                    text_ops: Vec::new(),
                    // llama.cpp sets `ignore_merges` for the Llama 3 pre-tokenizers.
                    ignore_merges: llama3,
                    bos: id("bos_token_id")?,
                    eos: id("eos_token_id")?,
                    pad: id("padding_token_id")?,
                    unk: id("unknown_token_id")?,
                    missing_byte: None,
                    add_bos: flag("add_bos_token")?.unwrap_or(llama3),
                    add_eos,
                    extra_eog,
                    special_order: Order::LongestFirst,
                })
            }
            "llama" => {
                let scores = scores(meta, n)?;
                // llama.cpp's defaults for SentencePiece vocabularies, where they exist.
                let default = |key: &str, fallback: u32| -> Result<Option<u32>> {
                    Ok(id(key)?.or(Some(fallback).filter(|&i| (i as usize) < n)))
                };
                let mut text_ops = Vec::new();
                if flag("add_space_prefix")?.unwrap_or(true) {
                    text_ops.push(TextOp::SpacePrefix);
                }
                text_ops.push(TextOp::Replace(" ".into(), "\u{2581}".into()));
                Tokenizer::build(Parts {
                    tokens,
                    types,
                    merges: Vec::new(),
                    pre: PreTokenizer::SentencePiece,
                    stages: Vec::new(),
                    model: Model::Spm { scores },
                    text_ops,
                    ignore_merges: false,
                    bos: default("bos_token_id", 1)?,
                    eos: default("eos_token_id", 2)?,
                    pad: id("padding_token_id")?,
                    unk: default("unknown_token_id", 0)?,
                    missing_byte: None,
                    add_bos: flag("add_bos_token")?.unwrap_or(true),
                    add_eos,
                    extra_eog,
                    special_order: Order::LongestFirst,
                })
            }
            other => Err(build_error(format!(
                "tokenizer.ggml.model is '{other}'; implemented: 'gpt2' (byte-level BPE) and 'llama' \
                 (SentencePiece-style BPE)"
            ))),
        }
    }
}
