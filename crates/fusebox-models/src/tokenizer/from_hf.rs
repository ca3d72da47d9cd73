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
//! Ids must be dense (0..n, every one used), as they are in real vocabularies; two
//! vocabulary entries (or two added tokens) with one id are refused.

use std::path::Path;

use fusebox::{Error, Result};
use serde_json::Value as Json;

use crate::files::{read_text, MAX_CONFIG_BYTES, MAX_TOKENIZER_BYTES};

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
            Some(text) => match serde_json::from_str(text).map_err(|e| json_error("tokenizer_config.json", e))? {
                Json::Object(o) => Json::Object(o),
                other => {
                    return Err(build_error(format!(
                        "tokenizer_config.json: expected a JSON object, found {}",
                        short(&other)
                    )))
                }
            },
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

        // Ids are dense, so the number of entries bounds every id; an id past it is
        // refused before anything is indexed or allocated.
        let vocab =
            model["vocab"].as_object().ok_or_else(|| build_error("tokenizer.json: model.vocab is not an object"))?;
        let added = match &root["added_tokens"] {
            Json::Null => &[][..],
            Json::Array(a) => a.as_slice(),
            other => {
                return Err(build_error(format!(
                    "tokenizer.json: added_tokens: expected an array, found {}",
                    short(other)
                )))
            }
        };
        let bound = vocab.len() + added.len();
        let id_of = |what: &str, id: &Json| {
            id.as_u64().and_then(|i| usize::try_from(i).ok()).filter(|&i| i < bound).ok_or_else(|| {
                build_error(format!(
                    "tokenizer.json: {what} has id {}, expected an integer below {bound}: token ids are \
                     not dense otherwise (there are {bound} vocabulary entries and added tokens)",
                    short(id)
                ))
            })
        };
        let mut slots: Vec<Option<(String, TokenType)>> = vec![None; bound];
        for (text, id_json) in vocab {
            let id = id_of(&format!("vocab entry {text:?}"), id_json)?;
            if let Some((other, _)) = &slots[id] {
                return Err(build_error(format!(
                    "tokenizer.json: vocab entries {other:?} and {text:?} share the id {id}"
                )));
            }
            slots[id] = Some((text.clone(), TokenType::Normal));
        }
        // An added token takes a new id or the place of a vocabulary entry (as real
        // files do for special tokens already in the vocabulary), but one id is never
        // given to two added tokens.
        let mut added_ids = std::collections::HashSet::new();
        for entry in added {
            let (Some(id_json), Some(text)) = (entry.get("id"), entry["content"].as_str()) else {
                return Err(build_error(format!("tokenizer.json: added token {} lacks id or content", short(entry))));
            };
            let id = id_of(&format!("added token {text:?}"), id_json)?;
            if !added_ids.insert(id) {
                return Err(build_error(format!("tokenizer.json: two added tokens have the id {id}")));
            }
            let ty = if entry["special"] == true { TokenType::Control } else { TokenType::UserDefined };
            slots[id] = Some((text.to_owned(), ty));
        }
        while slots.last().is_some_and(Option::is_none) {
            slots.pop();
        }
        let mut tokens = Vec::with_capacity(slots.len());
        let mut types = Vec::with_capacity(slots.len());
        for (id, slot) in slots.into_iter().enumerate() {
            let (text, ty) = slot
                .ok_or_else(|| build_error(format!("tokenizer.json: no token has id {id}: token ids are not dense")))?;
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
        let tokenizer = read_text(&dir.join("tokenizer.json"), "tokenizer.json", MAX_TOKENIZER_BYTES)?;
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.exists() {
            Some(read_text(&config_path, "tokenizer_config.json", MAX_CONFIG_BYTES)?)
        } else {
            None
        };
        Tokenizer::from_hf_json(&tokenizer, config.as_deref())
    }
}
