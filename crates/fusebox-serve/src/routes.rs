//! The routes beside the completions: llama-server's `POST /tokenize` and
//! `POST /detokenize`, and OpenAI's `POST /v1/embeddings`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use crate::embed::{EmbedJob, Pooling};
use crate::engine::Msg;
use crate::openai::{parse_object, ApiError};
use crate::{authorize, check_model, AppState};

/// Most inputs of one embeddings request (OpenAI's limit).
pub const MAX_EMBEDDING_INPUTS: usize = 2048;

fn wrong_type(param: &str, expected: &str) -> ApiError {
    ApiError::invalid(Some(param), format!("'{param}' must be {expected}"))
}

fn flag(obj: &Map<String, Value>, name: &str, default: bool) -> Result<bool, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(wrong_type(name, "a boolean")),
    }
}

/// Answers `r`, counting an error as rejected.
fn answer(state: &AppState, r: Result<Value, ApiError>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => {
            state.metrics.rejected.fetch_add(1, Ordering::Relaxed);
            e.into_response()
        }
    }
}

/// `POST /tokenize` `{"content": "...", "add_special": false, "parse_special": true,
/// "with_pieces": false}` → `{"tokens": [ids]}`, or with pieces
/// `{"tokens": [{"id", "piece"}]}` (a piece that is not whole UTF-8 as its bytes).
pub(crate) async fn tokenize(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    state.metrics.tokenize_requests.fetch_add(1, Ordering::Relaxed);
    let r = async {
        authorize(&state, &headers)?;
        let obj = parse_object(&body)?;
        let content = match obj.get("content") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) => return Err(ApiError::invalid(Some("content"), "'content' is required")),
            Some(_) => return Err(wrong_type("content", "a string")),
        };
        let add_special = flag(&obj, "add_special", false)?;
        let parse_special = flag(&obj, "parse_special", true)?;
        let with_pieces = flag(&obj, "with_pieces", false)?;
        let st = state.clone();
        tokio::task::spawn_blocking(move || {
            let tok = &st.model.tokenizer;
            let ids = tok.tokenize(&content, add_special, parse_special);
            let tokens: Vec<Value> = if with_pieces {
                ids.iter()
                    .map(|&id| {
                        let mut bytes = Vec::new();
                        let _ = tok.token_bytes(id, false, &mut bytes);
                        let piece = match String::from_utf8(bytes) {
                            Ok(s) => json!(s),
                            Err(e) => json!(e.into_bytes()),
                        };
                        json!({"id": id, "piece": piece})
                    })
                    .collect()
            } else {
                ids.iter().map(|&id| json!(id)).collect()
            };
            json!({"tokens": tokens})
        })
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))
    }
    .await;
    answer(&state, r)
}

/// Token ids from `v`, each below `vocab`; errors name `param[i]`.
fn token_ids(v: Option<&Value>, param: &str, vocab: usize) -> Result<Vec<u32>, ApiError> {
    let list = match v {
        Some(Value::Array(a)) => a,
        None | Some(Value::Null) => return Err(ApiError::invalid(Some(param), format!("'{param}' is required"))),
        Some(_) => return Err(wrong_type(param, "an array of token ids")),
    };
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            let at = format!("{param}[{i}]");
            match t.as_u64() {
                Some(id) if (id as usize) < vocab && id <= u64::from(u32::MAX) => Ok(id as u32),
                Some(id) => Err(ApiError::invalid(
                    Some(&at),
                    format!("'{at}' must be a token id below the vocabulary size {vocab}, got {id}"),
                )),
                None => Err(ApiError::invalid(Some(&at), format!("'{at}' must be a non-negative integer, got {t}"))),
            }
        })
        .collect()
}

/// `POST /detokenize` `{"tokens": [ids]}` → `{"content": "..."}` (special tokens
/// written out).
pub(crate) async fn detokenize(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    state.metrics.detokenize_requests.fetch_add(1, Ordering::Relaxed);
    let r = async {
        authorize(&state, &headers)?;
        let obj = parse_object(&body)?;
        let vocab = state.model.tokenizer.vocab_size();
        let ids = token_ids(obj.get("tokens"), "tokens", vocab)?;
        let st = state.clone();
        let content = tokio::task::spawn_blocking(move || st.model.tokenizer.decode(&ids))
            .await
            .map_err(|e| ApiError::internal(format!("detokenizing failed: {e}")))?
            .map_err(|e| ApiError::invalid(Some("tokens"), e.to_string()))?;
        Ok(json!({"content": content}))
    }
    .await;
    answer(&state, r)
}

/// The inputs of an embeddings request: a string, a list of strings, a list of ids or
/// a list of lists of ids.
enum Inputs {
    Texts(Vec<String>),
    Ids(Vec<Vec<u32>>),
}

fn inputs(v: Option<&Value>, vocab: usize) -> Result<Inputs, ApiError> {
    const P: &str = "input";
    let expected = "a string, an array of strings, an array of token ids or an array of arrays of token ids";
    let list = match v {
        None | Some(Value::Null) => return Err(ApiError::invalid(Some(P), "'input' is required")),
        Some(Value::String(s)) => return Ok(Inputs::Texts(vec![s.clone()])),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(wrong_type(P, expected)),
    };
    if list.is_empty() {
        return Err(ApiError::invalid(Some(P), "'input' must hold at least one input, got []"));
    }
    if list.len() > MAX_EMBEDDING_INPUTS {
        return Err(ApiError::invalid(
            Some(P),
            format!("'input' holds at most {MAX_EMBEDDING_INPUTS} inputs, got {}", list.len()),
        ));
    }
    if list.iter().all(Value::is_string) {
        return Ok(Inputs::Texts(list.iter().map(|s| s.as_str().unwrap_or_default().to_string()).collect()));
    }
    if list.iter().all(Value::is_number) {
        return Ok(Inputs::Ids(vec![token_ids(v, P, vocab)?]));
    }
    if list.iter().all(Value::is_array) {
        let ids = list
            .iter()
            .enumerate()
            .map(|(i, l)| token_ids(Some(l), &format!("{P}[{i}]"), vocab))
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Inputs::Ids(ids));
    }
    Err(wrong_type(P, expected))
}

/// Standard base64 (with padding) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n =
            (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                out.push(A[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `POST /v1/embeddings`: OpenAI's request (`input`, `model`, `encoding_format`
/// `float` or `base64`, `dimensions` only as the model's width) plus `pooling`
/// (`mean`, the default, or `last`); each input's vector is its pooled final hidden
/// state, L2-normalised.
pub(crate) async fn embeddings(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    state.metrics.embedding_requests.fetch_add(1, Ordering::Relaxed);
    let r = async {
        authorize(&state, &headers)?;
        let obj = parse_object(&body)?;
        let model = match obj.get("model") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(wrong_type("model", "a string")),
        };
        check_model(&state, &model)?;
        let base64_out = match obj.get("encoding_format") {
            None | Some(Value::Null) => false,
            Some(Value::String(f)) if f == "float" => false,
            Some(Value::String(f)) if f == "base64" => true,
            Some(v) => {
                return Err(ApiError::invalid(
                    Some("encoding_format"),
                    format!("'encoding_format' must be 'float' or 'base64', got {v}"),
                ))
            }
        };
        let width = state.model.network.arch.d_model;
        match obj.get("dimensions") {
            None | Some(Value::Null) => {}
            Some(v) if v.as_u64() == Some(width as u64) => {}
            Some(v) => {
                return Err(ApiError::invalid(
                    Some("dimensions"),
                    format!("'dimensions' can only be the model's width {width} (no truncation), got {v}"),
                ))
            }
        }
        let pooling = match obj.get("pooling") {
            None | Some(Value::Null) => Pooling::Mean,
            Some(Value::String(p)) if p == "mean" => Pooling::Mean,
            Some(Value::String(p)) if p == "last" => Pooling::Last,
            Some(v) => {
                return Err(ApiError::invalid(Some("pooling"), format!("'pooling' must be 'mean' or 'last', got {v}")))
            }
        };
        let vocab = state.model.network.arch.vocab_size.min(state.model.tokenizer.vocab_size());
        let ids = match inputs(obj.get("input"), vocab)? {
            Inputs::Ids(ids) => ids,
            Inputs::Texts(texts) => {
                let st = state.clone();
                tokio::task::spawn_blocking(move || {
                    let tok = &st.model.tokenizer;
                    texts.iter().map(|t| tok.encode(t, tok.add_bos_default())).collect::<Vec<_>>()
                })
                .await
                .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))?
            }
        };
        for (i, input) in ids.iter().enumerate() {
            if input.is_empty() {
                return Err(ApiError::invalid(Some("input"), format!("input {i} is empty")));
            }
            if input.len() > state.ctx_size {
                return Err(ApiError::invalid(
                    Some("input"),
                    format!(
                        "This model's maximum context length is {} tokens (--ctx-size). However, input {i} resulted in {} tokens.",
                        state.ctx_size,
                        input.len()
                    ),
                )
                .with_code("context_length_exceeded"));
            }
        }
        let tokens: usize = ids.iter().map(Vec::len).sum();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job = EmbedJob { inputs: ids, pooling, reply: tx };
        let sent = state.to_engine.lock().map(|t| t.send(Msg::Embed(job)).is_ok()).unwrap_or(false);
        if !sent {
            return Err(ApiError::unavailable("the model thread has stopped"));
        }
        let vectors = rx.await.map_err(|_| ApiError::internal("the model thread ended the request"))??;
        let data: Vec<Value> = vectors
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                let embedding = if base64_out {
                    json!(base64(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()))
                } else {
                    json!(v)
                };
                json!({"object": "embedding", "index": i, "embedding": embedding})
            })
            .collect();
        Ok(json!({"object": "list", "data": data, "model": state.model_id,
                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}))
    }
    .await;
    answer(&state, r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_the_standard_alphabet_with_padding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xff, 0xfe, 0x00, 0x80]), "//4AgA==");
    }

    #[test]
    fn bad_token_lists_name_the_entry() {
        let e = token_ids(Some(&json!([1, 2, 99])), "tokens", 50).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tokens[2]"));
        assert!(e.message.contains("below the vocabulary size 50"), "{}", e.message);
        let e = token_ids(Some(&json!([1, -2])), "tokens", 50).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tokens[1]"));
        let e = token_ids(Some(&json!("1 2")), "tokens", 50).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tokens"));
        assert_eq!(token_ids(Some(&json!([0, 49])), "tokens", 50).unwrap(), [0, 49]);
        assert!(matches!(inputs(Some(&json!([[1, 2], [3]])), 50), Ok(Inputs::Ids(v)) if v.len() == 2));
        assert!(inputs(Some(&json!(["a", 1])), 50).is_err());
        assert!(inputs(Some(&json!([])), 50).is_err());
    }
}
