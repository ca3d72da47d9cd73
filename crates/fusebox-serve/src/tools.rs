//! Tool calls on `/v1/chat/completions`: the `tools` and `tool_choice` fields, the
//! messages that carry calls and results, how they reach the model's chat template, and
//! the grammar that makes `tool_choice: required` (or a named function) come out as a
//! call.
//!
//! A template that renders tools itself ([`ToolSupport::native`]: Qwen2.5/3, Llama 3.x,
//! Mistral, gpt-oss) gets `tools` as a template variable, assistant messages with
//! `tool_calls` (arguments parsed from OpenAI's JSON string into an object, as the
//! templates print them with `tojson`) and `tool` messages with `tool_call_id`. One that
//! does not (SmolLM2's ChatML, Gemma 3) gets Hermes' form written into the messages: the
//! tools described in the system message, calls as `<tool_call>` blocks in the
//! assistant's text, results as a user turn of `<tool_response>` blocks.

use fusebox_models::chat::tools::{hermes_call, hermes_tools_prompt, python_json};
use fusebox_models::chat::{OutputFormat, ToolCallFormat, ToolSupport};
use fusebox_models::tokenizer::{TokenType, Tokenizer};
use serde_json::{json, Map, Value};

use crate::openai::{ApiError, ChatMessage};

/// A function the client offers.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// Its name (`[a-zA-Z0-9_-]{1,64}`, as OpenAI allows).
    pub name: String,
    /// The JSON schema of its arguments (`{"type": "object"}` when not given).
    pub parameters: Value,
    /// The tool as sent (`{"type": "function", "function": {...}}`), for the template.
    pub json: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model decides (the default with tools); calls in its reply are parsed.
    #[default]
    Auto,
    /// No calls: the reply is text, not parsed for calls.
    None,
    /// Exactly one call, to one of the tools, constrained by a grammar.
    Required,
    /// Exactly one call to this function, constrained by a grammar.
    Named(String),
}

impl ToolChoice {
    /// Whether the reply is parsed for calls.
    pub fn parses(&self) -> bool {
        !matches!(self, ToolChoice::None)
    }

    /// Whether the reply is constrained to a call.
    pub fn constrains(&self) -> bool {
        matches!(self, ToolChoice::Required | ToolChoice::Named(_))
    }
}

/// A call in an assistant message the client sends back.
#[derive(Debug, Clone, PartialEq)]
pub struct SentCall {
    /// Its id (`tool_call_id` of the result that answers it).
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments: the object OpenAI's JSON string holds, or the string itself when
    /// it is not JSON.
    pub arguments: Value,
}

fn wrong_type(param: &str, expected: &str, got: &Value) -> ApiError {
    let kind = match got {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    ApiError::invalid(Some(param), format!("'{param}' must be {expected}, got {kind}"))
}

fn string_field<'a>(o: &'a Map<String, Value>, key: &str, param: &str) -> Result<&'a str, ApiError> {
    let p = format!("{param}.{key}");
    match o.get(key) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(ApiError::invalid(Some(&p), format!("'{p}' is required"))),
        Some(v) => Err(wrong_type(&p, "a string", v)),
    }
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `tools` and `tool_choice` of a request body (`parallel_tool_calls` is checked to be
/// a boolean and otherwise not used).
pub fn parse_tools(obj: &Map<String, Value>) -> Result<(Vec<Tool>, ToolChoice), ApiError> {
    let mut tools = Vec::new();
    match obj.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for (i, t) in list.iter().enumerate() {
                let param = format!("tools[{i}]");
                let Value::Object(t) = t else { return Err(wrong_type(&param, "an object", t)) };
                let kind = string_field(t, "type", &param)?;
                if kind != "function" {
                    let p = format!("{param}.type");
                    return Err(ApiError::invalid(Some(&p), format!("'{p}' must be 'function', got '{kind}'")));
                }
                let fp = format!("{param}.function");
                let f = match t.get("function") {
                    Some(Value::Object(f)) => f,
                    None | Some(Value::Null) => {
                        return Err(ApiError::invalid(Some(&fp), format!("'{fp}' is required")))
                    }
                    Some(v) => return Err(wrong_type(&fp, "an object", v)),
                };
                let name = string_field(f, "name", &fp)?;
                if !valid_name(name) {
                    let p = format!("{fp}.name");
                    return Err(ApiError::invalid(
                        Some(&p),
                        format!("'{p}' must be 1 to 64 letters, digits, '_' or '-', got '{name}'"),
                    ));
                }
                if tools.iter().any(|x: &Tool| x.name == name) {
                    let p = format!("{fp}.name");
                    return Err(ApiError::invalid(Some(&p), format!("'{p}': the function '{name}' is defined twice")));
                }
                if let Some(d) = f.get("description").filter(|d| !d.is_null() && !d.is_string()) {
                    return Err(wrong_type(&format!("{fp}.description"), "a string", d));
                }
                let parameters = match f.get("parameters") {
                    None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                    Some(p @ Value::Object(_)) => p.clone(),
                    Some(v) => return Err(wrong_type(&format!("{fp}.parameters"), "an object (a JSON schema)", v)),
                };
                tools.push(Tool { name: name.to_owned(), parameters, json: Value::Object(t.clone()) });
            }
        }
        Some(v) => return Err(wrong_type("tools", "an array", v)),
    }
    if let Some(v) = obj.get("parallel_tool_calls").filter(|v| !v.is_null() && !v.is_boolean()) {
        return Err(wrong_type("parallel_tool_calls", "a boolean", v));
    }
    const TC: &str = "tool_choice";
    let choice = match obj.get(TC) {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    Some(TC),
                    format!("'{TC}' must be 'auto', 'none', 'required' or a function, got '{other}'"),
                ))
            }
        },
        Some(Value::Object(o)) => {
            let kind = string_field(o, "type", TC)?;
            if kind != "function" {
                return Err(ApiError::invalid(
                    Some("tool_choice.type"),
                    format!("'tool_choice.type' must be 'function', got '{kind}'"),
                ));
            }
            let f = match o.get("function") {
                Some(Value::Object(f)) => f,
                None | Some(Value::Null) => {
                    return Err(ApiError::invalid(Some("tool_choice.function"), "'tool_choice.function' is required"))
                }
                Some(v) => return Err(wrong_type("tool_choice.function", "an object", v)),
            };
            ToolChoice::Named(string_field(f, "name", "tool_choice.function")?.to_owned())
        }
        Some(v) => return Err(wrong_type(TC, "a string or an object", v)),
    };
    match &choice {
        ToolChoice::Required if tools.is_empty() => {
            return Err(ApiError::invalid(Some(TC), "'tool_choice' is 'required' but no 'tools' are given"))
        }
        ToolChoice::Named(n) if !tools.iter().any(|t| &t.name == n) => {
            let offered: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
            return Err(ApiError::invalid(
                Some("tool_choice.function.name"),
                format!("'tool_choice' names the function '{n}', which is not among 'tools' ({})", offered.join(", ")),
            ));
        }
        _ => {}
    }
    Ok((tools, choice))
}

/// An assistant message's `tool_calls` (message `i`).
pub fn parse_sent_calls(i: usize, v: Option<&Value>, role: &str) -> Result<Vec<SentCall>, ApiError> {
    let param = format!("messages[{i}].tool_calls");
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) if role == "assistant" => a,
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid(
                Some(&param),
                format!("'{param}' is for assistant messages, not '{role}' ones"),
            ))
        }
        Some(v) => return Err(wrong_type(&param, "an array", v)),
    };
    let mut calls = Vec::with_capacity(list.len());
    for (j, c) in list.iter().enumerate() {
        let p = format!("{param}[{j}]");
        let Value::Object(c) = c else { return Err(wrong_type(&p, "an object", c)) };
        let id = string_field(c, "id", &p)?.to_owned();
        if let Some(t) = c.get("type").and_then(Value::as_str).filter(|t| *t != "function") {
            let tp = format!("{p}.type");
            return Err(ApiError::invalid(Some(&tp), format!("'{tp}' must be 'function', got '{t}'")));
        }
        let fp = format!("{p}.function");
        let f = match c.get("function") {
            Some(Value::Object(f)) => f,
            None | Some(Value::Null) => return Err(ApiError::invalid(Some(&fp), format!("'{fp}' is required"))),
            Some(v) => return Err(wrong_type(&fp, "an object", v)),
        };
        let name = string_field(f, "name", &fp)?.to_owned();
        let arguments = match f.get("arguments") {
            None | Some(Value::Null) => json!({}),
            Some(Value::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
            // Some clients send the object itself.
            Some(o @ Value::Object(_)) => o.clone(),
            Some(v) => return Err(wrong_type(&format!("{fp}.arguments"), "a string", v)),
        };
        calls.push(SentCall { id, name, arguments });
    }
    Ok(calls)
}

/// The messages and extra template variables for a template with `support`: the
/// native fields when it renders tools itself, Hermes' text written into the messages
/// when it does not (see the module docs). `harmony`: an assistant's reasoning also
/// goes in as `thinking` (gpt-oss's template reads that name).
pub fn template_messages(
    messages: &[ChatMessage],
    tools: &[Tool],
    support: ToolSupport,
    harmony: bool,
) -> (Vec<Value>, Map<String, Value>) {
    let mut extra = Map::new();
    if support.native {
        if !tools.is_empty() {
            extra.insert("tools".into(), Value::Array(tools.iter().map(|t| t.json.clone()).collect()));
        }
        let msgs = messages
            .iter()
            .map(|m| {
                let mut v = base_message(m, harmony);
                if !m.tool_calls.is_empty() {
                    let calls: Vec<Value> = m
                        .tool_calls
                        .iter()
                        .map(|c| {
                            json!({"id": c.id, "type": "function",
                                   "function": {"name": c.name, "arguments": c.arguments}})
                        })
                        .collect();
                    v["tool_calls"] = Value::Array(calls);
                }
                if let Some(id) = &m.tool_call_id {
                    v["tool_call_id"] = json!(id);
                }
                if let Some(n) = &m.name {
                    v["name"] = json!(n);
                }
                v
            })
            .collect();
        return (msgs, extra);
    }
    let mut out: Vec<Value> = Vec::with_capacity(messages.len() + 1);
    if !tools.is_empty() {
        let prompt = hermes_tools_prompt(&tools.iter().map(|t| t.json.clone()).collect::<Vec<_>>());
        match messages.first() {
            Some(m) if m.role == "system" => {}
            _ => out.push(json!({"role": "system", "content": prompt})),
        }
    }
    for (i, m) in messages.iter().enumerate() {
        let mut v = base_message(m, harmony);
        if i == 0 && m.role == "system" && !tools.is_empty() {
            let prompt = hermes_tools_prompt(&tools.iter().map(|t| t.json.clone()).collect::<Vec<_>>());
            v["content"] = json!(format!("{}\n\n{prompt}", m.content));
        }
        if !m.tool_calls.is_empty() {
            let mut text = m.content.clone();
            for c in &m.tool_calls {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(&hermes_call(&c.name, &c.arguments));
            }
            v["content"] = json!(text);
        }
        if m.role == "tool" {
            let block = format!("<tool_response>\n{}\n</tool_response>", m.content);
            // Results that follow one another share one user turn.
            if let Some(prev) = out.last_mut().filter(|p| p["role"] == "user" && p["tool_results"] == true) {
                let joined = format!("{}\n{block}", prev["content"].as_str().unwrap_or(""));
                prev["content"] = json!(joined);
                continue;
            }
            out.push(json!({"role": "user", "content": block, "tool_results": true}));
            continue;
        }
        out.push(v);
    }
    for v in &mut out {
        if let Value::Object(o) = v {
            o.remove("tool_results");
        }
    }
    (out, extra)
}

/// A message's `role` and `content`, and an assistant's reasoning as
/// `reasoning_content` (Qwen3's templates, llama-server's field) and, in the harmony
/// format, as `thinking`.
fn base_message(m: &ChatMessage, harmony: bool) -> Value {
    let mut v = json!({"role": m.role, "content": m.content});
    if let Some(r) = &m.reasoning {
        v["reasoning_content"] = json!(r);
        if harmony {
            v["thinking"] = json!(r);
        }
    }
    v
}

/// The reply format of a request that offers tools to a plain-text model whose calls
/// take `calls`' form: the marker's token id, when `tok` has the marker as one token
/// (Llama 3's is `<|python_tag|>`, which may open its JSON call).
pub fn reply_format(calls: ToolCallFormat, tok: &Tokenizer) -> OutputFormat {
    let marker = match calls {
        ToolCallFormat::Llama3Json => tok.token_id("<|python_tag|>"),
        other => other.marker().and_then(|m| tok.token_id(m)),
    };
    OutputFormat::ToolCalls { calls, marker }
}

/// A Lark string literal of `s`.
fn lit(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// The Lark grammar (llguidance's dialect) of one call in `format` to one of `tools`
/// (to `only` when named), its arguments JSON valid against the function's
/// `parameters` schema, written compactly as `json.dumps` writes it. `tok` says
/// whether the family's marker is one control token (then the grammar names it by id,
/// since grammar text never matches a control token).
pub fn call_grammar(format: ToolCallFormat, tools: &[Tool], only: Option<&str>, tok: &Tokenizer) -> String {
    let layout = json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
    let key = format.arguments_key();
    let mut rules = Vec::new();
    let mut alternatives = Vec::new();
    for (k, t) in tools.iter().enumerate().filter(|(_, t)| only.is_none_or(|n| n == t.name)) {
        let mut schema = t.parameters.clone();
        if let Value::Object(o) = &mut schema {
            o.entry("x-guidance").or_insert(layout.clone());
        }
        // `{"name": "f", "arguments": ` (or Llama 3's "parameters"), written as the templates do.
        let head = format!("{{\"name\": {}, \"{key}\": ", python_json(&Value::String(t.name.clone())));
        rules.push(format!("call_{k}: {} args_{k} \"}}\"", lit(&head)));
        rules.push(format!("args_{k}: %json {schema}"));
        alternatives.push(format!("call_{k}"));
    }
    let marker = |text: &str| match tok.token_id(text) {
        Some(id) if tok.token_type(id) == Some(TokenType::Control) => format!("<[{id}]>"),
        _ => lit(text),
    };
    let start = match format {
        ToolCallFormat::Hermes => format!("{} {} call {}", marker("<tool_call>"), lit("\n"), lit("\n</tool_call>")),
        ToolCallFormat::Llama3Json => "call".to_owned(),
        ToolCallFormat::Mistral => format!("{} {} call {}", marker("[TOOL_CALLS]"), lit(" ["), lit("]")),
    };
    let mut g = format!("start: {start}\ncall: {}\n", alternatives.join(" | "));
    for r in rules {
        g.push_str(&r);
        g.push('\n');
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(s: &str) -> Map<String, Value> {
        serde_json::from_str(s).unwrap()
    }

    const WEATHER: &str = r#"{"type": "function", "function": {"name": "get_weather", "description": "d",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}"#;

    #[test]
    fn tools_and_choices_are_read() {
        let (tools, choice) =
            parse_tools(&body(&format!(r#"{{"tools": [{WEATHER}], "tool_choice": "required"}}"#))).unwrap();
        assert_eq!((tools.len(), tools[0].name.as_str(), choice), (1, "get_weather", ToolChoice::Required));
        assert_eq!(tools[0].parameters["required"], json!(["city"]));
        let (_, choice) = parse_tools(&body(&format!(
            r#"{{"tools": [{WEATHER}], "tool_choice": {{"type": "function", "function": {{"name": "get_weather"}}}}}}"#
        )))
        .unwrap();
        assert_eq!(choice, ToolChoice::Named("get_weather".into()));
        assert_eq!(parse_tools(&body("{}")).unwrap(), (Vec::new(), ToolChoice::Auto));
        assert_eq!(parse_tools(&body(r#"{"tool_choice": "none"}"#)).unwrap().1, ToolChoice::None);
        // No parameters: any object.
        let (t, _) = parse_tools(&body(r#"{"tools": [{"type": "function", "function": {"name": "now"}}]}"#)).unwrap();
        assert_eq!(t[0].parameters["type"], "object");
    }

    #[test]
    fn bad_tools_are_named() {
        let cases: &[(String, &str, &str)] = &[
            (r#"{"tools": {}}"#.into(), "tools", "an array"),
            (r#"{"tools": [3]}"#.into(), "tools[0]", "an object"),
            (r#"{"tools": [{"type": "retrieval"}]}"#.into(), "tools[0].type", "'function'"),
            (r#"{"tools": [{"type": "function"}]}"#.into(), "tools[0].function", "required"),
            (r#"{"tools": [{"type": "function", "function": {}}]}"#.into(), "tools[0].function.name", "required"),
            (
                r#"{"tools": [{"type": "function", "function": {"name": "a b"}}]}"#.into(),
                "tools[0].function.name",
                "letters",
            ),
            (
                r#"{"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}"#.into(),
                "tools[0].function.parameters",
                "JSON schema",
            ),
            (
                r#"{"tools": [{"type": "function", "function": {"name": "f", "description": 1}}]}"#.into(),
                "tools[0].function.description",
                "a string",
            ),
            (format!(r#"{{"tools": [{WEATHER}, {WEATHER}]}}"#), "tools[1].function.name", "twice"),
            (r#"{"tool_choice": "required"}"#.into(), "tool_choice", "no 'tools'"),
            (r#"{"tool_choice": "always"}"#.into(), "tool_choice", "'always'"),
            (r#"{"tool_choice": 1}"#.into(), "tool_choice", "a string or an object"),
            (
                format!(
                    r#"{{"tools": [{WEATHER}], "tool_choice": {{"type": "function", "function": {{"name": "nope"}}}}}}"#
                ),
                "tool_choice.function.name",
                "'nope'",
            ),
            (r#"{"tool_choice": {"type": "function"}}"#.into(), "tool_choice.function", "required"),
            (r#"{"parallel_tool_calls": "yes"}"#.into(), "parallel_tool_calls", "a boolean"),
        ];
        for (b, param, text) in cases {
            let e = parse_tools(&body(b)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(*param), "{b}");
            assert!(e.message.contains(text), "{b}: {}", e.message);
        }
        let e =
            parse_sent_calls(1, Some(&json!([{"id": "x", "function": {"name": "f", "arguments": 3}}])), "assistant")
                .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[1].tool_calls[0].function.arguments"));
        let e = parse_sent_calls(1, Some(&json!([{"function": {"name": "f"}}])), "assistant").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[1].tool_calls[0].id"));
        let e = parse_sent_calls(0, Some(&json!([])), "user").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].tool_calls"));
    }

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into(), ..Default::default() }
    }

    #[test]
    fn templates_without_tools_get_hermes_text() {
        let tools = parse_tools(&body(&format!(r#"{{"tools": [{WEATHER}]}}"#))).unwrap().0;
        let call = SentCall { id: "c1".into(), name: "get_weather".into(), arguments: json!({"city": "Paris"}) };
        let messages = vec![
            msg("user", "Weather?"),
            ChatMessage { tool_calls: vec![call], ..msg("assistant", "") },
            ChatMessage { tool_call_id: Some("c1".into()), ..msg("tool", "21 C") },
            ChatMessage { tool_call_id: Some("c2".into()), ..msg("tool", "sunny") },
        ];
        let fallback = ToolSupport { format: ToolCallFormat::Hermes, native: false };
        let (out, extra) = template_messages(&messages, &tools, fallback, false);
        assert!(extra.is_empty());
        let roles: Vec<&str> = out.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert!(out[0]["content"].as_str().unwrap().contains("<tools>\n{"));
        assert_eq!(
            out[2]["content"],
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        );
        assert_eq!(
            out[3],
            json!({"role": "user", "content":
            "<tool_response>\n21 C\n</tool_response>\n<tool_response>\nsunny\n</tool_response>"})
        );
        // A system message of the client's own keeps its text first.
        let (out, _) = template_messages(&[msg("system", "Be brief."), msg("user", "Q")], &tools, fallback, false);
        assert!(out[0]["content"].as_str().unwrap().starts_with("Be brief.\n\n# Tools"));
        assert_eq!(out.len(), 2);
        // Native templates get the fields themselves.
        let native = ToolSupport { format: ToolCallFormat::Hermes, native: true };
        let (out, extra) = template_messages(&messages, &tools, native, false);
        assert_eq!(extra["tools"][0]["function"]["name"], "get_weather");
        assert_eq!(out[1]["tool_calls"][0]["function"]["arguments"], json!({"city": "Paris"}));
        assert_eq!(out[2]["tool_call_id"], "c1");
        assert!(out[0].get("tool_calls").is_none(), "no tool_calls key where there are none (Llama 3 tests `in`)");
    }

    #[test]
    fn call_grammars_compile_per_family() {
        let tools = parse_tools(&body(&format!(
            r#"{{"tools": [{WEATHER}, {{"type": "function", "function": {{"name": "now"}}}}]}}"#
        )))
        .unwrap()
        .0;
        let tok = Tokenizer::from_hf_json(
            include_str!("../../fusebox-models/tests/fixtures/tokenizers/o200k_style/tokenizer.json"),
            None,
        )
        .unwrap();
        for format in [ToolCallFormat::Hermes, ToolCallFormat::Llama3Json, ToolCallFormat::Mistral] {
            for only in [None, Some("now")] {
                let g = call_grammar(format, &tools, only, &tok);
                let grammar = llguidance::api::TopLevelGrammar::from_lark(g.clone());
                let v = serde_json::to_value(&grammar).unwrap();
                assert!(v["grammars"][0]["lark_grammar"].is_string(), "{g}");
                assert_eq!(g.contains("get_weather"), only.is_none(), "{g}");
            }
        }
        let g = call_grammar(ToolCallFormat::Llama3Json, &tools, Some("get_weather"), &tok);
        assert!(g.contains(r#""{\"name\": \"get_weather\", \"parameters\": ""#), "{g}");
    }
}
