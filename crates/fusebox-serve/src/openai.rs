//! OpenAI request parsing and error bodies.
//!
//! Requests are parsed from a `serde_json::Value` by hand rather than derived, so that
//! every bad field is reported the way OpenAI does: HTTP 400 with
//! `{"error": {"message", "type", "param", "code"}}` naming the field, what it must be
//! and what came. Fields the server does not use (`user`, `logit_bias: {}`, …) are
//! ignored, as OpenAI-compatible servers do.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use crate::structured::Constraint;

/// An error answered with OpenAI's error body.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message naming the problem.
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `server_error`, …
    pub kind: &'static str,
    /// The request field at fault, if any.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, `model_not_found`, …).
    pub code: Option<&'static str>,
    /// Seconds a client should wait before retrying (503 only).
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// 400 `invalid_request_error` about `param`.
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
            retry_after: None,
        }
    }

    /// The same error with a `code`.
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// 401: the `Authorization: Bearer` key is missing or wrong.
    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "Invalid or missing API key: send `Authorization: Bearer <key>` with the server's --api-key"
                .into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
            retry_after: None,
        }
    }

    /// 503 with `Retry-After`: every slot is busy and the queue is full, or the server
    /// is shutting down.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some("server_overloaded"),
            retry_after: Some(1),
        }
    }

    /// 500: the model failed.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// The JSON body `{"error": {...}}`.
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert("retry-after", HeaderValue::from(s));
        }
        r
    }
}

/// What a completion request asks of the sampler and the stop conditions.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// `model`, when given.
    pub model: Option<String>,
    /// Softmax temperature, 0 = greedy (OpenAI's default 1).
    pub temperature: f32,
    /// Nucleus threshold (default 1 = off).
    pub top_p: f32,
    /// Top-k (default 0 = off; an extension llama-server and vLLM accept).
    pub top_k: usize,
    /// Penalty on tokens already seen, prompt included (`repetition_penalty`, or
    /// llama-server's `repeat_penalty`; default 1 = off; extension).
    pub repetition_penalty: f32,
    /// Min-p (default 0 = off; extension).
    pub min_p: f32,
    /// OpenAI's `presence_penalty`, in [-2, 2] (default 0).
    pub presence_penalty: f32,
    /// OpenAI's `frequency_penalty`, in [-2, 2] (default 0).
    pub frequency_penalty: f32,
    /// Choices to generate (`n`, 1 ..= [`MAX_CHOICES`]).
    pub n: usize,
    /// `Some(k)`: report each token's logprob and the `k` most likely tokens' (chat's
    /// `logprobs: true` with `top_logprobs: k`; completions' `logprobs: k`).
    pub logprobs: Option<usize>,
    /// Most tokens to generate (`max_tokens` or `max_completion_tokens`); `None`: until
    /// a stop or the end of the context.
    pub max_tokens: Option<usize>,
    /// Stop strings (up to 4, not included in the output).
    pub stop: Vec<String>,
    /// Seed of the sampler (default: from the clock).
    pub seed: Option<u64>,
    /// Whether to answer with server-sent events.
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with `usage` and no choices.
    pub include_usage: bool,
    /// What the answer is constrained to, and the field that asked
    /// (`response_format`, `json_schema` or `grammar`).
    pub constraint: Option<(&'static str, Constraint)>,
}

/// Most choices one request may ask for (`n`).
pub const MAX_CHOICES: usize = 8;

/// One message of a chat request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatMessage {
    /// `system` (also for OpenAI's `developer`), `user`, `assistant` or `tool`.
    pub role: String,
    /// The text (text parts joined).
    pub content: String,
    /// An assistant message's reasoning, as a client sends back what it was given
    /// (`reasoning_content`, llama-server's name, or `thinking`, the templates').
    pub reasoning: Option<String>,
    /// An assistant message's calls (`tool_calls`).
    pub tool_calls: Vec<crate::tools::SentCall>,
    /// A `tool` message's `tool_call_id`: the call it answers.
    pub tool_call_id: Option<String>,
    /// A `tool` message's `name` (the function's), when given.
    pub name: Option<String>,
}

/// A parsed `/v1/chat/completions` request.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// The messages in order.
    pub messages: Vec<ChatMessage>,
    /// Template variables besides the messages: `chat_template_kwargs` (as llama-server
    /// and vLLM take them), and `reasoning_effort` (`low`, `medium`, `high`: gpt-oss's).
    pub template_kwargs: Map<String, Value>,
    /// The functions offered (`tools`).
    pub tools: Vec<crate::tools::Tool>,
    /// `tool_choice` (`auto` by default).
    pub tool_choice: crate::tools::ToolChoice,
    /// The rest.
    pub params: Params,
}

/// A parsed `/v1/completions` request.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    /// The prompt text.
    pub prompt: String,
    /// The rest.
    pub params: Params,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong_type(param: &str, expected: &str, got: &Value) -> ApiError {
    ApiError::invalid(Some(param), format!("'{param}' must be {expected}, got {}", type_name(got)))
}

/// The body as a JSON object, or 400 saying why not.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(None, format!("The request body is not valid JSON: {e}")).with_code("invalid_json")
    })?;
    match v {
        Value::Object(m) => Ok(m),
        other => {
            Err(ApiError::invalid(None, format!("The request body must be a JSON object, got {}", type_name(&other)))
                .with_code("invalid_json"))
        }
    }
}

/// A present, non-null field.
fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

fn number(obj: &Map<String, Value>, name: &str, lo: f64, hi: f64, default: f64) -> Result<f64, ApiError> {
    match field(obj, name) {
        None => Ok(default),
        Some(v) => {
            let x = v.as_f64().ok_or_else(|| wrong_type(name, "a number", v))?;
            if !(lo..=hi).contains(&x) {
                return Err(ApiError::invalid(Some(name), format!("'{name}' must be in [{lo}, {hi}], got {x}")));
            }
            Ok(x)
        }
    }
}

fn integer(obj: &Map<String, Value>, name: &str, min: u64) -> Result<Option<u64>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => {
            let x = v.as_u64().ok_or_else(|| wrong_type(name, "a non-negative integer", v))?;
            if x < min {
                return Err(ApiError::invalid(Some(name), format!("'{name}' must be at least {min}, got {x}")));
            }
            Ok(Some(x))
        }
    }
}

fn boolean(obj: &Map<String, Value>, name: &str) -> Result<bool, ApiError> {
    match field(obj, name) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(wrong_type(name, "a boolean", v)),
    }
}

/// Which endpoint's fields: `logprobs` differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completion,
}

fn at_most(name: &str, v: Option<u64>, max: usize) -> Result<Option<usize>, ApiError> {
    match v {
        Some(x) if x > max as u64 => {
            Err(ApiError::invalid(Some(name), format!("'{name}' must be at most {max}, got {x}")))
        }
        other => Ok(other.map(|x| x as usize)),
    }
}

/// The `logprobs` request: chat's `logprobs` (boolean) with `top_logprobs` (0..=20,
/// only with `logprobs: true`), or completions' `logprobs` (0..=20 alternatives).
fn logprobs(obj: &Map<String, Value>, endpoint: Endpoint) -> Result<Option<usize>, ApiError> {
    use crate::logprobs::MAX_TOP_LOGPROBS as MAX;
    match endpoint {
        Endpoint::Chat => {
            let on = boolean(obj, "logprobs")?;
            let top = at_most("top_logprobs", integer(obj, "top_logprobs", 0)?, MAX)?;
            match (on, top) {
                (false, Some(_)) => {
                    Err(ApiError::invalid(Some("top_logprobs"), "'top_logprobs' needs 'logprobs': true"))
                }
                (false, None) => Ok(None),
                (true, top) => Ok(Some(top.unwrap_or(0))),
            }
        }
        Endpoint::Completion => match field(obj, "logprobs") {
            // `false` reads as "none", as clients that send chat's form mean it.
            None | Some(Value::Bool(false)) => Ok(None),
            Some(v) => {
                let k = v.as_u64().ok_or_else(|| wrong_type("logprobs", "an integer in [0, 20]", v))?;
                at_most("logprobs", Some(k), MAX)
            }
        },
    }
}

fn params(obj: &Map<String, Value>, endpoint: Endpoint) -> Result<Params, ApiError> {
    let model = match field(obj, "model") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => return Err(wrong_type("model", "a string", v)),
    };
    let n = at_most("n", integer(obj, "n", 1)?, MAX_CHOICES)?.unwrap_or(1);
    let logprobs = logprobs(obj, endpoint)?;
    // llama-server's name for the same penalty; `repetition_penalty` wins when both come.
    let repetition = if field(obj, "repetition_penalty").is_some() { "repetition_penalty" } else { "repeat_penalty" };
    let max_tokens = match integer(obj, "max_completion_tokens", 1)? {
        Some(n) => Some(n),
        None => integer(obj, "max_tokens", 1)?,
    };
    let stop = match field(obj, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            if a.len() > 4 {
                return Err(ApiError::invalid(
                    Some("stop"),
                    format!("'stop' holds at most 4 strings, got {}", a.len()),
                ));
            }
            a.iter()
                .map(|s| {
                    s.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| wrong_type("stop", "a string or an array of strings", s))
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        Some(v) => return Err(wrong_type("stop", "a string or an array of strings", v)),
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(Some("stop"), "'stop' strings must not be empty"));
    }
    let seed = match field(obj, "seed") {
        None => None,
        Some(v) => Some(
            v.as_u64().or_else(|| v.as_i64().map(|i| i as u64)).ok_or_else(|| wrong_type("seed", "an integer", v))?,
        ),
    };
    let include_usage = match field(obj, "stream_options") {
        None => false,
        Some(Value::Object(o)) => boolean(o, "include_usage").map_err(|mut e| {
            e.param = Some("stream_options.include_usage".into());
            e
        })?,
        Some(v) => return Err(wrong_type("stream_options", "an object", v)),
    };
    Ok(Params {
        model,
        temperature: number(obj, "temperature", 0.0, 2.0, 1.0)? as f32,
        top_p: number(obj, "top_p", 0.0, 1.0, 1.0)? as f32,
        top_k: integer(obj, "top_k", 0)?.map_or(0, |k| k as usize),
        repetition_penalty: number(obj, repetition, f64::MIN_POSITIVE, 100.0, 1.0)? as f32,
        min_p: number(obj, "min_p", 0.0, 1.0, 0.0)? as f32,
        presence_penalty: number(obj, "presence_penalty", -2.0, 2.0, 0.0)? as f32,
        frequency_penalty: number(obj, "frequency_penalty", -2.0, 2.0, 0.0)? as f32,
        n,
        logprobs,
        max_tokens: max_tokens.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        stop,
        seed,
        stream: boolean(obj, "stream")?,
        include_usage,
        constraint: constraint(obj)?,
    })
}

/// The answer's constraint: OpenAI's `response_format` (`text`, `json_object`, or
/// `json_schema` with `json_schema: {name, schema, strict}`; llama-server's
/// `json_object` with a `schema` too), or llama-server's top-level `json_schema` or
/// `grammar` (GBNF, or Lark); at most one of them.
fn constraint(obj: &Map<String, Value>) -> Result<Option<(&'static str, Constraint)>, ApiError> {
    const RF: &str = "response_format";
    let mut found: Vec<(&'static str, Constraint)> = Vec::new();
    match field(obj, RF) {
        None => {}
        Some(Value::Object(rf)) => {
            let kind = match field(rf, "type") {
                Some(Value::String(t)) => t.as_str(),
                None => {
                    return Err(ApiError::invalid(Some("response_format.type"), "'response_format.type' is required"))
                }
                Some(v) => return Err(wrong_type("response_format.type", "a string", v)),
            };
            match kind {
                "text" => {}
                "json_object" => match field(rf, "schema") {
                    None => found.push((RF, Constraint::JsonObject)),
                    Some(schema) => found.push((RF, Constraint::JsonSchema { schema: schema.clone() })),
                },
                "json_schema" => {
                    const P: &str = "response_format.json_schema";
                    let js = match field(rf, "json_schema") {
                        Some(Value::Object(js)) => js,
                        None => {
                            return Err(ApiError::invalid(
                                Some(P),
                                format!("'{P}' is required with type 'json_schema'"),
                            ))
                        }
                        Some(v) => return Err(wrong_type(P, "an object", v)),
                    };
                    match field(js, "name") {
                        None | Some(Value::String(_)) => {}
                        Some(v) => return Err(wrong_type("response_format.json_schema.name", "a string", v)),
                    }
                    match field(js, "strict") {
                        None | Some(Value::Bool(_)) => {}
                        Some(v) => return Err(wrong_type("response_format.json_schema.strict", "a boolean", v)),
                    }
                    let schema = match field(js, "schema") {
                        Some(s @ (Value::Object(_) | Value::Bool(_))) => s.clone(),
                        // OpenAI's default: any JSON value.
                        None => json!({}),
                        Some(v) => return Err(wrong_type("response_format.json_schema.schema", "an object", v)),
                    };
                    found.push((RF, Constraint::JsonSchema { schema }));
                }
                other => {
                    return Err(ApiError::invalid(
                        Some("response_format.type"),
                        format!("'response_format.type' must be one of text, json_object, json_schema; got '{other}'"),
                    ))
                }
            }
        }
        Some(v) => return Err(wrong_type(RF, "an object", v)),
    }
    match field(obj, "json_schema") {
        None => {}
        Some(s @ (Value::Object(_) | Value::Bool(_))) => {
            found.push(("json_schema", Constraint::JsonSchema { schema: s.clone() }))
        }
        Some(v) => return Err(wrong_type("json_schema", "an object", v)),
    }
    match field(obj, "grammar") {
        None => {}
        Some(Value::String(g)) => found.push(("grammar", Constraint::Grammar(g.clone()))),
        Some(v) => return Err(wrong_type("grammar", "a string", v)),
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|f| f.0).collect();
        return Err(ApiError::invalid(
            Some(found[1].0),
            format!(
                "only one of response_format, json_schema and grammar may constrain the answer, got {}",
                names.join(" and ")
            ),
        ));
    }
    Ok(found.pop())
}

fn message_content(i: usize, v: Option<&Value>, role: &str) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        // An assistant turn that called tools has no content.
        None | Some(Value::Null) if role == "assistant" => Ok(String::new()),
        None | Some(Value::Null) => Err(ApiError::invalid(Some(&param), format!("'{param}' is required"))),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                let part = format!("{param}[{j}]");
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (Some(other), _) if other != "text" => {
                        return Err(ApiError::invalid(
                            Some(&part),
                            format!("'{part}' is of type '{other}': only text parts are supported"),
                        ))
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            Some(&part),
                            format!("'{part}' must be {{\"type\": \"text\", \"text\": \"...\"}}"),
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(v) => Err(wrong_type(&param, "a string or an array of text parts", v)),
    }
}

/// Parses a `/v1/chat/completions` body.
pub fn chat_request(body: &[u8]) -> Result<ChatRequest, ApiError> {
    let obj = parse_object(body)?;
    let list = match field(&obj, "messages") {
        None => return Err(ApiError::invalid(Some("messages"), "'messages' is required")),
        Some(Value::Array(a)) => a,
        Some(v) => return Err(wrong_type("messages", "an array", v)),
    };
    if list.is_empty() {
        return Err(ApiError::invalid(Some("messages"), "'messages' must hold at least one message, got []"));
    }
    let mut messages = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let Value::Object(m) = m else {
            return Err(wrong_type(&format!("messages[{i}]"), "an object", m));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) => r.clone(),
            None => {
                return Err(ApiError::invalid(
                    Some(&format!("messages[{i}].role")),
                    format!("'messages[{i}].role' is required"),
                ))
            }
            Some(v) => return Err(wrong_type(&format!("messages[{i}].role"), "a string", v)),
        };
        if !["system", "developer", "user", "assistant", "tool"].contains(&role.as_str()) {
            return Err(ApiError::invalid(
                Some(&format!("messages[{i}].role")),
                format!("'messages[{i}].role' must be one of system, developer, user, assistant, tool; got '{role}'"),
            ));
        }
        let content = message_content(i, m.get("content"), &role)?;
        let mut reasoning = None;
        for key in ["reasoning_content", "thinking"] {
            match field(m, key) {
                None => {}
                Some(Value::String(r)) if role == "assistant" => reasoning = reasoning.or(Some(r.clone())),
                Some(Value::String(_)) => {
                    let param = format!("messages[{i}].{key}");
                    return Err(ApiError::invalid(
                        Some(&param),
                        format!("'{param}' is for assistant messages, not '{role}' ones"),
                    ));
                }
                Some(v) => return Err(wrong_type(&format!("messages[{i}].{key}"), "a string", v)),
            }
        }
        let tool_calls = crate::tools::parse_sent_calls(i, m.get("tool_calls"), &role)?;
        let tool_call_id = match (field(m, "tool_call_id"), role.as_str()) {
            (Some(Value::String(id)), "tool") => Some(id.clone()),
            (None, "tool") => {
                let param = format!("messages[{i}].tool_call_id");
                return Err(ApiError::invalid(Some(&param), format!("'{param}' is required in a tool message")));
            }
            (None, _) => None,
            (Some(Value::String(_)), _) => {
                let param = format!("messages[{i}].tool_call_id");
                return Err(ApiError::invalid(
                    Some(&param),
                    format!("'{param}' is for tool messages, not '{role}' ones"),
                ));
            }
            (Some(v), _) => return Err(wrong_type(&format!("messages[{i}].tool_call_id"), "a string", v)),
        };
        let name = match field(m, "name") {
            None => None,
            Some(Value::String(n)) => Some(n.clone()),
            Some(v) => return Err(wrong_type(&format!("messages[{i}].name"), "a string", v)),
        };
        // OpenAI's `developer` role is the newer name of `system`; templates know `system`.
        let role = if role == "developer" { "system".to_string() } else { role };
        messages.push(ChatMessage { role, content, reasoning, tool_calls, tool_call_id, name });
    }
    let mut template_kwargs = match field(&obj, "chat_template_kwargs") {
        None => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(v) => return Err(wrong_type("chat_template_kwargs", "an object", v)),
    };
    match field(&obj, "reasoning_effort") {
        None => {}
        Some(Value::String(e)) if ["low", "medium", "high"].contains(&e.as_str()) => {
            template_kwargs.insert("reasoning_effort".into(), Value::String(e.clone()));
        }
        Some(Value::String(e)) => {
            return Err(ApiError::invalid(
                Some("reasoning_effort"),
                format!("'reasoning_effort' must be one of low, medium, high; got '{e}'"),
            ))
        }
        Some(v) => return Err(wrong_type("reasoning_effort", "a string", v)),
    }
    for reserved in ["messages", "add_generation_prompt"] {
        if template_kwargs.contains_key(reserved) {
            return Err(ApiError::invalid(
                Some("chat_template_kwargs"),
                format!("'chat_template_kwargs' may not set '{reserved}'"),
            ));
        }
    }
    let (tools, tool_choice) = crate::tools::parse_tools(&obj)?;
    let params = params(&obj, Endpoint::Chat)?;
    if let (true, Some((param, _))) = (tool_choice.constrains(), &params.constraint) {
        return Err(ApiError::invalid(
            Some(param),
            format!(
                "'{param}' cannot be combined with 'tool_choice' {}: both constrain the answer",
                match &tool_choice {
                    crate::tools::ToolChoice::Named(n) => format!("naming '{n}'"),
                    _ => "'required'".to_string(),
                }
            ),
        ));
    }
    Ok(ChatRequest { messages, template_kwargs, tools, tool_choice, params })
}

/// Parses a `/v1/completions` body: `prompt` is a string (or an array of one string).
pub fn completion_request(body: &[u8]) -> Result<CompletionRequest, ApiError> {
    let obj = parse_object(body)?;
    let prompt = match field(&obj, "prompt") {
        None => return Err(ApiError::invalid(Some("prompt"), "'prompt' is required")),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => a[0].as_str().unwrap_or_default().to_string(),
        Some(Value::Array(a)) => {
            return Err(ApiError::invalid(
                Some("prompt"),
                format!("'prompt' must be a string or an array of one string, got an array of {}", a.len()),
            ))
        }
        Some(v) => return Err(wrong_type("prompt", "a string", v)),
    };
    Ok(CompletionRequest { prompt, params: params(&obj, Endpoint::Completion)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_request() {
        let r = chat_request(
            br#"{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":[{"type":"text","text":"Hi"}]}],
                 "temperature":0,"max_tokens":5,"stop":"x","seed":3,"stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        let pairs: Vec<(&str, &str)> = r.messages.iter().map(|m| (m.role.as_str(), m.content.as_str())).collect();
        assert_eq!(pairs, [("system", "S"), ("user", "Hi")]);
        assert!(r.messages.iter().all(|m| m.reasoning.is_none()) && r.template_kwargs.is_empty());
        assert_eq!(r.params.temperature, 0.0);
        assert_eq!(r.params.max_tokens, Some(5));
        assert_eq!(r.params.stop, vec!["x".to_string()]);
        assert_eq!(r.params.seed, Some(3));
        assert!(r.params.stream && r.params.include_usage);
    }

    #[test]
    fn reasoning_and_template_kwargs_are_read() {
        let r = chat_request(
            br#"{"messages":[{"role":"user","content":"Q"},{"role":"assistant","content":"A","reasoning_content":"R"},
                 {"role":"assistant","content":"B","thinking":"T"}],
                 "reasoning_effort":"high","chat_template_kwargs":{"model_identity":"M"}}"#,
        )
        .unwrap();
        let reasoning: Vec<Option<&str>> = r.messages.iter().map(|m| m.reasoning.as_deref()).collect();
        assert_eq!(reasoning, [None, Some("R"), Some("T")]);
        assert_eq!(Value::Object(r.template_kwargs), json!({"model_identity": "M", "reasoning_effort": "high"}));
    }

    #[test]
    fn bad_fields_are_named() {
        let cases: &[(&[u8], Option<&str>, &str)] = &[
            (b"{", None, "not valid JSON"),
            (b"[]", None, "must be a JSON object"),
            (br#"{"messages":[]}"#, Some("messages"), "at least one"),
            (br#"{}"#, Some("messages"), "required"),
            (br#"{"messages":"hi"}"#, Some("messages"), "must be an array, got a string"),
            (br#"{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#, Some("temperature"), "a number"),
            (br#"{"messages":[{"role":"user","content":"x"}],"temperature":3}"#, Some("temperature"), "[0, 2]"),
            (br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#, Some("max_tokens"), "at least 1"),
            (br#"{"messages":[{"role":"user","content":"x"}],"n":9}"#, Some("n"), "at most 8"),
            (br#"{"messages":[{"role":"user","content":"x"}],"n":0}"#, Some("n"), "at least 1"),
            (br#"{"messages":[{"role":"user","content":"x"}],"n":1.5}"#, Some("n"), "integer"),
            (br#"{"messages":[{"role":"user","content":"x"}],"logprobs":1}"#, Some("logprobs"), "a boolean"),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}"#,
                Some("top_logprobs"),
                "at most 20",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#,
                Some("top_logprobs"),
                "needs 'logprobs': true",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":-1}"#,
                Some("top_logprobs"),
                "non-negative integer",
            ),
            (br#"{"messages":[{"role":"user","content":"x"}],"min_p":1.5}"#, Some("min_p"), "[0, 1]"),
            (br#"{"messages":[{"role":"user","content":"x"}],"min_p":"a"}"#, Some("min_p"), "a number"),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"presence_penalty":-2.5}"#,
                Some("presence_penalty"),
                "[-2, 2]",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"frequency_penalty":3}"#,
                Some("frequency_penalty"),
                "[-2, 2]",
            ),
            (br#"{"messages":[{"role":"user","content":"x"}],"repeat_penalty":0}"#, Some("repeat_penalty"), "got 0"),
            (br#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#, Some("stream"), "a boolean"),
            (br#"{"messages":[{"role":"wizard","content":"x"}]}"#, Some("messages[0].role"), "wizard"),
            (br#"{"messages":[{"role":"user","content":5}]}"#, Some("messages[0].content"), "got a number"),
            (br#"{"messages":[{"role":"user"}]}"#, Some("messages[0].content"), "required"),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]}"#,
                Some("stop"),
                "at most 4",
            ),
        ];
        for (body, param, text) in cases {
            let e = chat_request(body).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert_eq!(e.param.as_deref(), *param, "{}", String::from_utf8_lossy(body));
            assert!(e.message.contains(text), "{} → {}", String::from_utf8_lossy(body), e.message);
        }
        let reasoning: &[(&[u8], &str, &str)] = &[
            (
                br#"{"messages":[{"role":"user","content":"x","reasoning_content":"r"}]}"#,
                "messages[0].reasoning_content",
                "assistant messages",
            ),
            (br#"{"messages":[{"role":"assistant","content":"x","thinking":5}]}"#, "messages[0].thinking", "a string"),
            (br#"{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"max"}"#, "reasoning_effort", "max"),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[]}"#,
                "chat_template_kwargs",
                "an object",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"messages":[]}}"#,
                "chat_template_kwargs",
                "may not set",
            ),
        ];
        for (body, param, text) in reasoning {
            let e = chat_request(body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(*param), "{}", String::from_utf8_lossy(body));
            assert!(e.message.contains(text), "{} → {}", String::from_utf8_lossy(body), e.message);
        }
        let e = completion_request(br#"{"prompt":3}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
        for (body, text) in [
            (&br#"{"prompt":"x","logprobs":21}"#[..], "at most 20"),
            (br#"{"prompt":"x","logprobs":true}"#, "an integer"),
            (br#"{"prompt":"x","logprobs":-3}"#, "an integer"),
        ] {
            let e = completion_request(body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("logprobs"), "{}", String::from_utf8_lossy(body));
            assert!(e.message.contains(text), "{}", e.message);
        }
    }

    #[test]
    fn the_new_fields_are_read() {
        let r = chat_request(
            br#"{"messages":[{"role":"user","content":"x"}],"n":3,"logprobs":true,"top_logprobs":5,"min_p":0.1,
                 "presence_penalty":-0.5,"frequency_penalty":1.5,"repeat_penalty":1.3}"#,
        )
        .unwrap();
        let p = r.params;
        assert_eq!((p.n, p.logprobs, p.min_p), (3, Some(5), 0.1));
        assert_eq!((p.presence_penalty, p.frequency_penalty, p.repetition_penalty), (-0.5, 1.5, 1.3));
        let p = chat_request(br#"{"messages":[{"role":"user","content":"x"}],"logprobs":true}"#).unwrap().params;
        assert_eq!((p.n, p.logprobs), (1, Some(0)));
        let p = chat_request(br#"{"messages":[{"role":"user","content":"x"}],"logprobs":false}"#).unwrap().params;
        assert_eq!(p.logprobs, None);
        let p = completion_request(br#"{"prompt":"x","logprobs":2,"repetition_penalty":1.1,"repeat_penalty":1.9}"#)
            .unwrap()
            .params;
        assert_eq!((p.logprobs, p.repetition_penalty), (Some(2), 1.1));
        assert_eq!(completion_request(br#"{"prompt":"x","logprobs":0}"#).unwrap().params.logprobs, Some(0));
    }
}
