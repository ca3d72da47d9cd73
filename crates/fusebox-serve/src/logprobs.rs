//! Token log-probabilities for the `logprobs` fields, and their OpenAI JSON shapes.
//!
//! A logprob is the log-softmax of the model's raw logits at that step,
//! `l_i − log Σ_j exp(l_j)`, over the vocabulary the sampler draws from: before the
//! temperature, the penalties, top-k/top-p/min-p (what OpenAI and vLLM report by default).

use fusebox_models::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

/// Most alternatives a request may ask for per token (`top_logprobs`, completions'
/// `logprobs`), as OpenAI allows.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// What stands in for −∞ (a token the model rules out): JSON has no infinity, and
/// OpenAI reports such tokens as −9999.
const FLOOR: f32 = -9999.0;

/// One token with its log-probability.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The token's id.
    pub id: u32,
    /// Its text (invalid UTF-8 of a token inside a character shown as U+FFFD).
    pub text: String,
    /// Its exact bytes.
    pub bytes: Vec<u8>,
    /// `log p`, at least −9999.
    pub logprob: f32,
}

/// The chosen token of one step and the step's most likely tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token generated.
    pub chosen: Candidate,
    /// The `top` most likely tokens, most likely first (ties by id).
    pub top: Vec<Candidate>,
}

fn candidate(tok: &Tokenizer, id: u32, logprob: f32) -> Candidate {
    let mut bytes = Vec::new();
    // Special tokens show their text (`<|im_end|>`), as OpenAI-compatible servers do.
    let _ = tok.token_bytes(id, false, &mut bytes);
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let logprob = if logprob.is_nan() { FLOOR } else { logprob.max(FLOOR) };
    Candidate { id, text, bytes, logprob }
}

/// The logprob of `chosen` and of the `top` most likely tokens under `logits`.
pub fn token_logprob(tok: &Tokenizer, logits: &[f32], chosen: u32, top: usize) -> TokenLogprob {
    // log-softmax: l − (max + log Σ exp(l − max)); NaN logits count as −∞.
    let max = logits.iter().copied().filter(|l| !l.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().filter(|l| !l.is_nan()).map(|&l| f64::from(l - max).exp()).sum();
    let lse = f64::from(max) + sum.ln();
    let logprob = |id: usize| logits.get(id).map_or(f32::NEG_INFINITY, |&l| (f64::from(l) - lse) as f32);
    let top = top.min(logits.len());
    let mut order: Vec<usize> = (0..logits.len()).collect();
    if top > 0 {
        let by_logit = |&a: &usize, &b: &usize| {
            let key = |i: usize| if logits[i].is_nan() { f32::NEG_INFINITY } else { logits[i] };
            key(b).total_cmp(&key(a)).then(a.cmp(&b))
        };
        if top < order.len() {
            order.select_nth_unstable_by(top - 1, by_logit);
        }
        order.truncate(top);
        order.sort_unstable_by(by_logit);
    } else {
        order.clear();
    }
    TokenLogprob {
        chosen: candidate(tok, chosen, logprob(chosen as usize)),
        top: order.into_iter().map(|i| candidate(tok, i as u32, logprob(i))).collect(),
    }
}

/// A token of the answer with its logprobs, and where its text starts in the answer
/// (in characters, as OpenAI's `text_offset` counts).
#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    /// The logprobs.
    pub logprob: TokenLogprob,
    /// Characters of the answer before this token's text.
    pub text_offset: usize,
}

/// Chat's `choices[i].logprobs`: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
pub fn chat_json(tokens: &[Placed]) -> Value {
    let entry = |c: &Candidate| json!({"token": c.text, "logprob": c.logprob, "bytes": c.bytes});
    let content: Vec<Value> = tokens
        .iter()
        .map(|p| {
            let mut e = entry(&p.logprob.chosen);
            e["top_logprobs"] = Value::Array(p.logprob.top.iter().map(entry).collect());
            e
        })
        .collect();
    json!({"content": content})
}

/// Completions' `choices[i].logprobs`: `{tokens, token_logprobs, top_logprobs,
/// text_offset}`; each `top_logprobs` entry maps the token texts of the most likely
/// tokens, and the chosen one's, to their logprobs.
pub fn completion_json(tokens: &[Placed]) -> Value {
    let top = |p: &Placed| {
        let mut m = Map::new();
        for c in p.logprob.top.iter().chain(std::iter::once(&p.logprob.chosen)) {
            m.entry(c.text.clone()).or_insert(json!(c.logprob));
        }
        Value::Object(m)
    };
    json!({
        "tokens": tokens.iter().map(|p| p.logprob.chosen.text.clone()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|p| p.logprob.chosen.logprob).collect::<Vec<_>>(),
        "top_logprobs": tokens.iter().map(top).collect::<Vec<_>>(),
        "text_offset": tokens.iter().map(|p| p.text_offset).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        let json = include_str!("../../fusebox-models/tests/fixtures/tokenizers/o200k_style/tokenizer.json");
        Tokenizer::from_hf_json(json, None).unwrap()
    }

    #[test]
    fn logprobs_are_the_log_softmax_of_the_logits() {
        let tok = tokenizer();
        let logits = [1.0f32, 3.0, -2.0, 3.0, 0.5];
        let lse = logits.iter().map(|&l| f64::from(l).exp()).sum::<f64>().ln();
        let t = token_logprob(&tok, &logits, 4, 3);
        assert!((f64::from(t.chosen.logprob) - (0.5 - lse)).abs() < 1e-6);
        // Ties by id: 1 before 3, then 0.
        assert_eq!(t.top.iter().map(|c| c.id).collect::<Vec<_>>(), [1, 3, 0]);
        for c in &t.top {
            assert!((f64::from(c.logprob) - (f64::from(logits[c.id as usize]) - lse)).abs() < 1e-6);
            let mut b = Vec::new();
            tok.token_bytes(c.id, false, &mut b).unwrap();
            assert_eq!(c.bytes, b);
        }
        // −∞ and NaN logits are ruled out, reported as −9999.
        let t = token_logprob(&tok, &[f32::NEG_INFINITY, 0.0, f32::NAN], 0, 3);
        assert_eq!((t.chosen.logprob, t.top[0].id, t.top[0].logprob), (FLOOR, 1, 0.0));
        assert!(t.top[1..].iter().all(|c| c.logprob == FLOOR));
        assert!(token_logprob(&tok, &logits, 1, 0).top.is_empty());
    }

    #[test]
    fn the_json_shapes_are_openais() {
        let tok = tokenizer();
        let placed = |chosen: u32, offset: usize| Placed {
            logprob: token_logprob(&tok, &[0.0, 1.0, 2.0], chosen, 2),
            text_offset: offset,
        };
        let tokens = [placed(2, 0), placed(0, 3)];
        let chat = chat_json(&tokens);
        let c = &chat["content"];
        assert_eq!(c.as_array().unwrap().len(), 2);
        assert_eq!(c[1]["token"], json!(tokens[1].logprob.chosen.text));
        assert_eq!(c[1]["top_logprobs"].as_array().unwrap().len(), 2);
        assert!(c[0]["bytes"].is_array() && c[0]["logprob"].is_number());
        let comp = completion_json(&tokens);
        assert_eq!(comp["text_offset"], json!([0, 3]));
        assert_eq!(comp["tokens"].as_array().unwrap().len(), 2);
        // The chosen token joins the top ones when it is not among them.
        assert_eq!(comp["top_logprobs"][1].as_object().unwrap().len(), 3);
        assert_eq!(comp["top_logprobs"][0].as_object().unwrap().len(), 2);
    }
}
