//! Building a tokenizer from a Hugging Face `tokenizer.json` (and optionally its
//! `tokenizer_config.json`, which names BOS/EOS/padding).
//!
//! Read from `tokenizer.json`:
//! * `model`: `type` "BPE", `vocab` (`{token: id}`), `merges` (`"a b"` strings or
//!   `["a", "b"]` pairs, rank = index), `unk_token`, `ignore_merges`,
//!   `byte_fallback`, `fuse_unk`;
//! * `added_tokens`: `[{id, content, special}]`; `special: true` makes a control
//!   token, otherwise a user-defined one; an added token's content replaces the
//!   vocabulary text at its id. Added tokens are matched in the raw text (their
//!   `normalized`, `lstrip`, `rstrip` and `single_word` flags are not read);
//! * `normalizer`: null, `NFC`, `NFD`, `NFKC`, `NFKD`, `Prepend`, `Replace` (a
//!   literal `String` pattern), or a `Sequence` of these;
//! * `pre_tokenizer`: null, `ByteLevel` (GPT-2's regex when `use_regex`; no
//!   prefix space), `Split` (a `String` or `Regex` pattern; every behavior but
//!   inverted `Contiguous`), `Digits`, `Metaspace` (first), or a `Sequence` of
//!   these. With `ByteLevel` (last) the model is byte-level BPE; without it,
//!   character BPE (with `<0xNN>` tokens when `byte_fallback`);
//! * `post_processor`: when `tokenizer_config.json` does not say `add_bos_token`,
//!   a `TemplateProcessing` whose `single` template starts with a special token
//!   means BOS is added (that token being BOS unless the config names one).
//!
//! Ids must be dense (0..n, every one used), as they are in real vocabularies; two
//! vocabulary entries (or two added tokens) with one id are refused.

use std::path::Path;

use fusebox::{Error, Result};
use serde_json::Value as Json;

use crate::files::{read_text, MAX_CONFIG_BYTES, MAX_TOKENIZER_BYTES};

use super::pretokenize::{Behavior, O200kClasses, Stage};
use super::special::Order;
use super::{build_error, Model, Parts, PreTokenizer, PrependScheme, TextOp, TokenType, Tokenizer, UnicodeForm};

fn short(v: &Json) -> String {
    let s = v.to_string();
    if s.len() > 200 {
        format!("{}…", s.chars().take(200).collect::<String>())
    } else {
        s
    }
}

/// GPT-2's pattern as Hugging Face writes it (`ByteLevel`'s own regex).
const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's `Split` pattern.
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's `Split` pattern.
const QWEN2_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The o200k `Split` pattern (gpt-oss, GPT-4o).
pub(crate) const O200K_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// What `normalizer` and `pre_tokenizer` make of the text.
#[derive(Default)]
struct Pipeline {
    text_ops: Vec<TextOp>,
    stages: Vec<Stage>,
    /// A `ByteLevel` pre-tokenizer was seen (it must be the last one).
    byte_level: bool,
}

fn behavior_of(v: &Json) -> Result<Behavior> {
    Ok(match v.as_str() {
        Some("Isolated") => Behavior::Isolated,
        Some("Removed") => Behavior::Removed,
        Some("MergedWithPrevious") => Behavior::MergedWithPrevious,
        Some("MergedWithNext") => Behavior::MergedWithNext,
        Some("Contiguous") => Behavior::Contiguous,
        _ => {
            return Err(build_error(format!(
                "tokenizer.json: Split behavior {} is not one of Isolated, Removed, MergedWithPrevious, \
                 MergedWithNext, Contiguous",
                short(v)
            )))
        }
    })
}

impl Pipeline {
    fn normalizer(&mut self, v: &Json) -> Result<()> {
        match v["type"].as_str() {
            _ if v.is_null() => {}
            Some("Sequence") => {
                for n in v["normalizers"].as_array().map(Vec::as_slice).unwrap_or_default() {
                    self.normalizer(n)?;
                }
            }
            Some("Prepend") => {
                let p = v["prepend"].as_str().ok_or_else(|| {
                    build_error(format!("tokenizer.json: normalizer Prepend without a prepend string: {}", short(v)))
                })?;
                self.text_ops.push(TextOp::Prepend(p.to_owned()));
            }
            Some(form @ ("NFC" | "NFD" | "NFKC" | "NFKD")) => self.text_ops.push(TextOp::Unicode(match form {
                "NFC" => UnicodeForm::Nfc,
                "NFD" => UnicodeForm::Nfd,
                "NFKC" => UnicodeForm::Nfkc,
                _ => UnicodeForm::Nfkd,
            })),
            Some("Replace") => match (v["pattern"]["String"].as_str(), v["content"].as_str()) {
                (Some(from), Some(to)) => self.text_ops.push(TextOp::Replace(from.to_owned(), to.to_owned())),
                _ => {
                    return Err(build_error(format!(
                        "tokenizer.json: normalizer Replace {} is not implemented (only a String pattern is)",
                        short(v)
                    )))
                }
            },
            _ => {
                return Err(build_error(format!(
                    "tokenizer.json: normalizer {} is not implemented (implemented: NFC, NFD, NFKC, NFKD, Prepend, \
                     Replace, Sequence)",
                    short(v)
                )))
            }
        }
        Ok(())
    }

    fn pre_tokenizer(&mut self, v: &Json) -> Result<()> {
        if v.is_null() {
            return Ok(());
        }
        if self.byte_level {
            return Err(build_error(format!(
                "tokenizer.json: pre_tokenizer {} comes after ByteLevel, which must be the last",
                short(v)
            )));
        }
        match v["type"].as_str() {
            Some("Sequence") => {
                for p in v["pretokenizers"].as_array().map(Vec::as_slice).unwrap_or_default() {
                    self.pre_tokenizer(p)?;
                }
            }
            Some("ByteLevel") => {
                if v.get("add_prefix_space").and_then(Json::as_bool).unwrap_or(false) {
                    return Err(build_error("tokenizer.json: ByteLevel with add_prefix_space is not implemented"));
                }
                if v.get("use_regex").and_then(Json::as_bool).unwrap_or(true) {
                    self.stages.push(Stage::Gpt2);
                }
                self.byte_level = true;
            }
            Some("Digits") => {
                self.stages.push(if v["individual_digits"] == true { Stage::EachNumber } else { Stage::NumberRuns })
            }
            Some("Split") => {
                let behavior = behavior_of(&v["behavior"])?;
                let invert = v["invert"] == true;
                if let Some(pattern) = v["pattern"]["String"].as_str() {
                    if invert {
                        return Err(build_error("tokenizer.json: an inverted Split on a String is not implemented"));
                    }
                    self.stages.push(Stage::Literal { pattern: pattern.to_owned(), behavior });
                } else if let Some(pattern) = v["pattern"]["Regex"].as_str() {
                    let plain = behavior == Behavior::Isolated && !invert;
                    self.stages.push(match pattern {
                        GPT2_PATTERN if plain => Stage::Gpt2,
                        LLAMA3_PATTERN if plain => Stage::Llama3 { max_digits: 3, long_s: true },
                        QWEN2_PATTERN if plain => Stage::Llama3 { max_digits: 1, long_s: true },
                        O200K_PATTERN if plain => Stage::O200k(O200kClasses::Unicode),
                        _ => {
                            let regex = fancy_regex::Regex::new(pattern).map_err(|e| {
                                build_error(format!("tokenizer.json: Split pattern {pattern:?} does not compile: {e}"))
                            })?;
                            Stage::Regex { regex: Box::new(regex), behavior, invert }
                        }
                    });
                } else {
                    return Err(build_error(format!(
                        "tokenizer.json: Split pattern {} is neither {{\"String\": ...}} nor {{\"Regex\": ...}}",
                        short(&v["pattern"])
                    )));
                }
            }
            Some("Metaspace") => {
                if !self.stages.is_empty() {
                    return Err(build_error(
                        "tokenizer.json: Metaspace after another pre-tokenizer is not implemented",
                    ));
                }
                let replacement = match v["replacement"].as_str() {
                    None => '\u{2581}',
                    Some(r) => {
                        let mut chars = r.chars();
                        match (chars.next(), chars.next()) {
                            (Some(c), None) => c,
                            _ => {
                                return Err(build_error(format!(
                                    "tokenizer.json: Metaspace replacement {r:?} is not one character"
                                )))
                            }
                        }
                    }
                };
                let prepend = match v["prepend_scheme"].as_str() {
                    Some("always") => Some(PrependScheme::Always),
                    Some("first") => Some(PrependScheme::First),
                    Some("never") => None,
                    // Files older than `prepend_scheme` say `add_prefix_space`.
                    None if v["add_prefix_space"] == false => None,
                    None => Some(PrependScheme::Always),
                    Some(other) => {
                        return Err(build_error(format!(
                            "tokenizer.json: Metaspace prepend_scheme {other:?} is not always, first or never"
                        )))
                    }
                };
                self.text_ops.push(TextOp::Metaspace { replacement, prepend });
                if v.get("split").and_then(Json::as_bool).unwrap_or(true) {
                    self.stages
                        .push(Stage::Literal { pattern: replacement.to_string(), behavior: Behavior::MergedWithNext });
                }
            }
            _ => {
                return Err(build_error(format!(
                    "tokenizer.json: pre_tokenizer {} is not implemented (implemented: ByteLevel, Split, Digits, \
                     Metaspace, Sequence)",
                    short(v)
                )))
            }
        }
        Ok(())
    }

    /// The named pre-tokenizer these stages are, if any.
    fn name(&self) -> PreTokenizer {
        if !self.byte_level && self.stages.is_empty() {
            return PreTokenizer::SentencePiece;
        }
        let named =
            [PreTokenizer::Gpt2, PreTokenizer::Smollm, PreTokenizer::Llama3, PreTokenizer::Qwen2, PreTokenizer::Gpt4o];
        named.into_iter().find(|p| p.stages() == self.stages).unwrap_or(PreTokenizer::TokenizerJson)
    }
}

/// The first special token of a `TemplateProcessing` `single` template, if it starts with one.
fn template_first_special(post: &Json) -> Option<&str> {
    match post["type"].as_str()? {
        "Sequence" => post["processors"].as_array()?.iter().find_map(template_first_special),
        "TemplateProcessing" => post["single"].as_array()?.first()?["SpecialToken"]["id"].as_str(),
        _ => None,
    }
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
        for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
            if model[key].as_str().is_some_and(|s| !s.is_empty()) {
                return Err(build_error(format!("tokenizer.json: model.{key} is not supported")));
            }
        }
        let mut pipeline = Pipeline::default();
        pipeline.normalizer(&root["normalizer"])?;
        pipeline.pre_tokenizer(&root["pre_tokenizer"])?;
        let pre = pipeline.name();

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
        let template_bos = template_first_special(&root["post_processor"]);
        let (add_bos, bos) = match config["add_bos_token"].as_bool() {
            Some(add) => (add, bos),
            None => match template_bos {
                Some(t) => (true, bos.or(find(Some(t))?)),
                None => (false, bos),
            },
        };
        // With byte fallback the `<0xNN>` vocabulary entries stand for bytes.
        if model["byte_fallback"] == true && !pipeline.byte_level {
            for (t, ty) in tokens.iter().zip(types.iter_mut()) {
                if *ty == TokenType::Normal && super::parse_byte_token(t).is_some() {
                    *ty = TokenType::Byte;
                }
            }
        }
        let model_kind = if pipeline.byte_level {
            Model::ByteLevel
        } else {
            Model::CharBpe { byte_fallback: model["byte_fallback"] == true, fuse_unk: model["fuse_unk"] == true }
        };
        Tokenizer::build(Parts {
            tokens,
            types,
            merges,
            pre,
            stages: pipeline.stages,
            model: model_kind,
            text_ops: pipeline.text_ops,
            ignore_merges: model["ignore_merges"] == true,
            bos,
            eos,
            pad,
            unk,
            missing_byte: unk,
            add_bos,
            add_eos: config["add_eos_token"].as_bool().unwrap_or(false),
            extra_eog: Vec::new(),
            special_order: Order::LeftmostLongest,
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
