//! Building a tokenizer from a Hugging Face `tokenizer.json` (and optionally its
//! `tokenizer_config.json`, which names BOS/EOS/padding).
//!
//! Read from `tokenizer.json`:
//! * `model`: `type` "BPE", `vocab` (`{token: id}`), `merges` (`"a b"` strings or
//!   `["a", "b"]` pairs, rank = index), `unk_token`, `ignore_merges`;
//! * `added_tokens`: `[{id, content, special}]`; `special: true` makes a control
//!   token, otherwise a user-defined one; an added token's content replaces the
//!   vocabulary text at its id;
//! * `pre_tokenizer`: `ByteLevel` (GPT-2 regex) or
//!   `Sequence[Digits(individual_digits), ByteLevel]` (see [`PreTokenizer`]);
//! * `normalizer` must be null.
//!
//! Ids must be dense (0..n, every one used), as they are in real vocabularies.

use std::path::Path;

use fusebox::{Error, Result};
use serde_json::Value as Json;

use super::{build_error, Parts, PreTokenizer, TokenType, Tokenizer};

fn short(v: &Json) -> String {
    let s = v.to_string();
    if s.len() > 200 {
        format!("{}…", s.chars().take(200).collect::<String>())
    } else {
        s
    }
}

/// The pre-tokenizer a `pre_tokenizer` object describes, if it is one implemented here.
fn pre_tokenizer_of(v: &Json) -> Result<PreTokenizer> {
    let is_byte_level = |p: &Json| {
        p["type"] == "ByteLevel"
            && p.get("use_regex").and_then(Json::as_bool).unwrap_or(true)
            && !p.get("add_prefix_space").and_then(Json::as_bool).unwrap_or(false)
    };
    if is_byte_level(v) {
        return Ok(PreTokenizer::Gpt2);
    }
    if v["type"] == "Sequence" {
        if let Some([digits, byte_level]) = v["pretokenizers"].as_array().map(Vec::as_slice) {
            if digits["type"] == "Digits" && digits["individual_digits"] == true && is_byte_level(byte_level) {
                return Ok(PreTokenizer::Smollm);
            }
        }
    }
    Err(build_error(format!(
        "tokenizer.json: pre_tokenizer {} is not implemented (implemented: ByteLevel without prefix space, \
         Sequence[Digits(individual_digits), ByteLevel])",
        short(v)
    )))
}

/// A token named in `tokenizer_config.json`: a string or `{"content": ...}`.
fn config_token(v: &Json) -> Option<&str> {
    v.as_str().or_else(|| v["content"].as_str())
}

fn json_error(what: &str, e: serde_json::Error) -> Error {
    build_error(format!("{what} is not valid JSON: {e}"))
}

impl Tokenizer {
    /// The tokenizer of a Hugging Face `tokenizer.json` (text), with BOS/EOS/padding
    /// and `add_bos_token` from `tokenizer_config.json` when given.
    pub fn from_hf_json(tokenizer_json: &str, config_json: Option<&str>) -> Result<Tokenizer> {
        let root: Json = serde_json::from_str(tokenizer_json).map_err(|e| json_error("tokenizer.json", e))?;
        let config: Json = match config_json {
            Some(text) => serde_json::from_str(text).map_err(|e| json_error("tokenizer_config.json", e))?,
            None => Json::Null,
        };
        let model = &root["model"];
        if model["type"] != "BPE" && !(model["type"].is_null() && model["merges"].is_array()) {
            return Err(build_error(format!("tokenizer.json: model type {} is not BPE", short(&model["type"]))));
        }
        if !root["normalizer"].is_null() {
            return Err(build_error(format!(
                "tokenizer.json: normalizer {} is not supported",
                short(&root["normalizer"])
            )));
        }
        for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
            if model[key].as_str().is_some_and(|s| !s.is_empty()) {
                return Err(build_error(format!("tokenizer.json: model.{key} is not supported")));
            }
        }
        if model["byte_fallback"] == true {
            return Err(build_error("tokenizer.json: model.byte_fallback is not supported"));
        }
        let pre = pre_tokenizer_of(&root["pre_tokenizer"])?;

        // (id, text, type) of every vocabulary entry and added token.
        let vocab =
            model["vocab"].as_object().ok_or_else(|| build_error("tokenizer.json: model.vocab is not an object"))?;
        let mut entries: Vec<(u64, String, TokenType)> = Vec::with_capacity(vocab.len());
        for (text, id) in vocab {
            let id = id.as_u64().ok_or_else(|| build_error(format!("tokenizer.json: vocab id of {text:?} is {id}")))?;
            entries.push((id, text.clone(), TokenType::Normal));
        }
        for added in root["added_tokens"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let (Some(id), Some(text)) = (added["id"].as_u64(), added["content"].as_str()) else {
                return Err(build_error(format!("tokenizer.json: added token {} lacks id or content", short(added))));
            };
            let ty = if added["special"] == true { TokenType::Control } else { TokenType::UserDefined };
            entries.push((id, text.to_owned(), ty));
        }
        // Later entries (added tokens) replace vocabulary entries at the same id.
        let n = entries.iter().map(|e| e.0).max().map_or(0, |m| m + 1);
        if n > entries.len() as u64 {
            return Err(build_error(format!(
                "tokenizer.json: token ids are not dense: highest id {} with {} entries",
                n - 1,
                entries.len()
            )));
        }
        let mut slots: Vec<Option<(String, TokenType)>> = vec![None; n as usize];
        for (id, text, ty) in entries {
            slots[id as usize] = Some((text, ty));
        }
        let mut tokens = Vec::with_capacity(slots.len());
        let mut types = Vec::with_capacity(slots.len());
        for (id, slot) in slots.into_iter().enumerate() {
            let (text, ty) = slot.ok_or_else(|| build_error(format!("tokenizer.json: no token has id {id}")))?;
            tokens.push(text);
            types.push(ty);
        }

        let merges = model["merges"]
            .as_array()
            .ok_or_else(|| build_error("tokenizer.json: model.merges is not an array"))?
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let pair = match m {
                    Json::String(s) => s.split_once(' ').map(|(a, b)| (a.to_owned(), b.to_owned())),
                    Json::Array(p) => match p.as_slice() {
                        [Json::String(a), Json::String(b)] => Some((a.clone(), b.clone())),
                        _ => None,
                    },
                    _ => None,
                };
                pair.ok_or_else(|| build_error(format!("tokenizer.json: merge {i} ({}) is not a pair", short(m))))
            })
            .collect::<Result<Vec<_>>>()?;

        let find = |text: Option<&str>| -> Result<Option<u32>> {
            match text {
                None => Ok(None),
                Some(t) => match tokens.iter().rposition(|x| x == t) {
                    Some(i) => Ok(Some(i as u32)),
                    None => Err(build_error(format!("special token {t:?} is not in the vocabulary"))),
                },
            }
        };
        let unk = find(model["unk_token"].as_str())?;
        let bos = find(config_token(&config["bos_token"]))?;
        let eos = find(config_token(&config["eos_token"]))?;
        let pad = find(config_token(&config["pad_token"]))?;
        let add_bos = config["add_bos_token"].as_bool().unwrap_or(false);
        Tokenizer::build(Parts {
            tokens,
            types,
            merges,
            pre,
            ignore_merges: model["ignore_merges"] == true,
            bos,
            eos,
            pad,
            unk,
            missing_byte: unk,
            add_bos,
            extra_eog: Vec::new(),
        })
    }

    /// [`Tokenizer::from_hf_json`] from files: `dir/tokenizer.json` and, when
    /// present, `dir/tokenizer_config.json`.
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Tokenizer> {
        let dir = dir.as_ref();
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|e| build_error(format!("cannot read '{}': {e}", path.display())))
        };
        let tokenizer = read("tokenizer.json")?;
        let config =
            if dir.join("tokenizer_config.json").exists() { Some(read("tokenizer_config.json")?) } else { None };
        Tokenizer::from_hf_json(&tokenizer, config.as_deref())
    }
}
