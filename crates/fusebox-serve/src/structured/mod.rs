//! Structured outputs: `response_format` (`json_object`, `json_schema`) and `grammar`
//! (GBNF or Lark), by constrained decoding with llguidance.
//!
//! A request's constraint is compiled on the HTTP side (off the async runtime) into a
//! [`Guide`]: llguidance's matcher over the model's vocabulary ([`vocab`]) and the mask
//! of its first token. A compile error (a malformed schema or grammar, a schema keyword
//! llguidance does not implement) is the request's 400, with llguidance's message. On
//! the model thread ([`guide`]), each step's logits outside the mask become −∞ before
//! the sampler sees them; the sampled token advances the matcher, and the next mask is
//! computed on the guide's own thread while the model runs the next forward.

pub mod gbnf;
pub mod guide;
pub mod vocab;

use std::sync::{Arc, Mutex};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

pub use guide::Guide;

/// What a request constrains its answer to.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against a schema (`response_format: {"type": "json_schema", ...}`,
    /// or llama-server's top-level `json_schema`).
    JsonSchema {
        /// The schema.
        schema: Value,
    },
    /// A grammar (`grammar`): GBNF when a line defines a rule with `::=`, otherwise
    /// llguidance's Lark dialect.
    Grammar(String),
}

impl Constraint {
    /// llguidance's grammar for it. JSON is written as Python's `json.dumps` writes it
    /// (`", "` and `": "`, no other whitespace) unless the schema sets llguidance's own
    /// `x-guidance` options: free whitespace lets a small model pad without end.
    fn grammar(&self) -> Result<TopLevelGrammar, String> {
        let layout = json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
        let with_layout = |mut schema: Value| {
            if let Value::Object(o) = &mut schema {
                o.entry("x-guidance").or_insert(layout.clone());
            }
            schema
        };
        match self {
            Constraint::JsonObject => Ok(TopLevelGrammar::from_json_schema(with_layout(json!({"type": "object"})))),
            Constraint::JsonSchema { schema } => match schema {
                Value::Object(_) => Ok(TopLevelGrammar::from_json_schema(with_layout(schema.clone()))),
                Value::Bool(true) => Ok(TopLevelGrammar::from_json_schema(with_layout(json!({})))),
                Value::Bool(false) => Err("the schema `false` accepts no value".into()),
                _ => Err("the schema must be an object or a boolean".into()),
            },
            Constraint::Grammar(text) if gbnf::looks_like_gbnf(text) => {
                Ok(TopLevelGrammar::from_lark(gbnf::to_lark(text)?))
            }
            Constraint::Grammar(text) => {
                if text.trim().is_empty() {
                    return Err("the grammar is empty".into());
                }
                Ok(TopLevelGrammar::from_lark(text.clone()))
            }
        }
    }
}

/// The compiler of constraints for one model: its vocabulary's trie, built at the first
/// constrained request (a 256k vocabulary takes a moment) and kept.
pub struct Structured {
    model: Arc<fusebox_models::pretrained::Pretrained>,
    vocab: usize,
    factory: Mutex<Option<Arc<ParserFactory>>>,
}

impl Structured {
    /// For `model`, sampling from its first `vocab` ids.
    pub fn new(model: Arc<fusebox_models::pretrained::Pretrained>, vocab: usize) -> Structured {
        Structured { model, vocab, factory: Mutex::new(None) }
    }

    fn factory(&self) -> Result<Arc<ParserFactory>, String> {
        let mut f = self.factory.lock().map_err(|_| "the grammar compiler failed earlier".to_string())?;
        if let Some(f) = f.as_ref() {
            return Ok(f.clone());
        }
        // Every id that may end a reply, chat or not.
        let mut ends = self.model.tokenizer.eos_id().into_iter().collect::<Vec<_>>();
        ends.extend(self.model.stop_ids(true));
        ends.dedup();
        let env = vocab::Vocabulary::new(self.model.clone(), self.vocab, &ends)?.into_env();
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        let factory = Arc::new(factory);
        *f = Some(factory.clone());
        Ok(factory)
    }

    /// Compiles `c` into a guide ready for its first token, or says what is wrong with it
    /// (llguidance's words: the unsupported keyword, the grammar's line and column).
    pub fn compile(&self, c: &Constraint) -> Result<Guide, String> {
        let factory = self.factory()?;
        let grammar = c.grammar()?;
        let parser = factory.create_parser(grammar).map_err(|e| e.to_string())?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        let mask = matcher.compute_mask().map_err(|e| e.to_string())?;
        if mask.is_zero() {
            return Err("the constraint allows no token at the start".into());
        }
        Ok(Guide::new(matcher, mask))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_gets_the_compact_layout_unless_the_schema_sets_its_own() {
        let g = Constraint::JsonSchema { schema: json!({"type": "integer"}) }.grammar().unwrap();
        let s = serde_json::to_value(&g).unwrap();
        assert_eq!(s["grammars"][0]["json_schema"]["x-guidance"]["key_separator"], ": ");
        let own = json!({"type": "integer", "x-guidance": {"whitespace_flexible": true}});
        let g = Constraint::JsonSchema { schema: own.clone() }.grammar().unwrap();
        assert_eq!(serde_json::to_value(&g).unwrap()["grammars"][0]["json_schema"], own);
        assert!(Constraint::JsonSchema { schema: json!(false) }.grammar().is_err());
        assert!(Constraint::JsonSchema { schema: json!(3) }.grammar().is_err());
        assert!(Constraint::Grammar("  ".into()).grammar().is_err());
    }
}
