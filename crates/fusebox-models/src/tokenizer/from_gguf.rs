//! Building a tokenizer from GGUF metadata.
//!
//! Keys read (llama.cpp's names):
//!
//! | key                                  | type            | use                                   |
//! |--------------------------------------|-----------------|---------------------------------------|
//! | `tokenizer.ggml.model`               | string          | must be `gpt2` (byte-level BPE)       |
//! | `tokenizer.ggml.pre`                 | string          | pre-tokenizer, see [`PreTokenizer`]   |
//! | `tokenizer.ggml.tokens`              | array of string | vocabulary, index = id                |
//! | `tokenizer.ggml.token_type`          | array of int    | [`TokenType`] codes (optional)        |
//! | `tokenizer.ggml.merges`              | array of string | `"left right"`, rank = index          |
//! | `tokenizer.ggml.{bos,eos,padding,unknown}_token_id` | int | special ids (optional)          |
//! | `tokenizer.ggml.{eot,eom}_token_id`  | int             | more end-of-generation ids (optional) |
//! | `tokenizer.ggml.add_bos_token`       | bool            | default for adding BOS (optional)     |

use fusebox::Result;

use super::{build_error, Parts, PreTokenizer, TokenType, Tokenizer};
use crate::gguf::Metadata;

impl Tokenizer {
    /// The tokenizer described by a GGUF file's metadata.
    pub fn from_gguf(meta: &Metadata) -> Result<Tokenizer> {
        let model =
            meta.get_str("tokenizer.ggml.model")?.ok_or_else(|| build_error("tokenizer.ggml.model is missing"))?;
        if model != "gpt2" {
            return Err(build_error(format!(
                "tokenizer.ggml.model is '{model}'; only 'gpt2' (byte-level BPE) is supported"
            )));
        }
        let pre_name =
            meta.get_str("tokenizer.ggml.pre")?.ok_or_else(|| build_error("tokenizer.ggml.pre is missing"))?;
        let pre = PreTokenizer::from_gguf_name(pre_name).ok_or_else(|| {
            build_error(format!(
                "pre-tokenizer '{pre_name}' is not implemented (implemented: smollm, starcoder, refact, \
                 command-r, codeshell, exaone, minerva, gpt2, mpt, olmo, jais, trillion)"
            ))
        })?;
        let tokens = meta.require_strings("tokenizer.ggml.tokens")?.to_vec();
        let types = match meta.get_array("tokenizer.ggml.token_type")? {
            None => vec![TokenType::Normal; tokens.len()],
            Some(arr) => {
                if arr.len() != tokens.len() {
                    return Err(build_error(format!(
                        "tokenizer.ggml.token_type has {} entries for {} tokens",
                        arr.len(),
                        tokens.len()
                    )));
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
                    .collect::<Result<Vec<_>>>()?
            }
        };
        let merges = meta
            .require_strings("tokenizer.ggml.merges")?
            .iter()
            .enumerate()
            .map(|(i, m)| match m.split_once(' ') {
                Some((a, b)) => Ok((a.to_owned(), b.to_owned())),
                None => Err(build_error(format!("merge {i} ({m:?}) has no space between its two tokens"))),
            })
            .collect::<Result<Vec<_>>>()?;
        let id = |key: &str| meta.get_u32(&format!("tokenizer.ggml.{key}"));
        let extra_eog = [id("eot_token_id")?, id("eom_token_id")?].into_iter().flatten().collect();
        Tokenizer::build(Parts {
            tokens,
            types,
            merges,
            pre,
            ignore_merges: false,
            bos: id("bos_token_id")?,
            eos: id("eos_token_id")?,
            pad: id("padding_token_id")?,
            unk: id("unknown_token_id")?,
            missing_byte: None,
            add_bos: meta.get_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false),
            extra_eog,
        })
    }
}
