//! Tool calls in a chat model's reply: how each template family writes them, and
//! reading them back out of the generated text.
//!
//! | family | a call as the model writes it |
//! |---|---|
//! | [`ToolCallFormat::Hermes`] (Qwen2.5, Qwen3, Hermes, and the fallback) | `<tool_call>\n{"name": "f", "arguments": {…}}\n</tool_call>`, one block per call |
//! | [`ToolCallFormat::Llama3Json`] (Llama 3.1–3.3) | the whole reply is `{"name": "f", "parameters": {…}}` |
//! | [`ToolCallFormat::Mistral`] (Mistral v0.3, Nemo) | `[TOOL_CALLS] [{"name": "f", "arguments": {…}}, …]` |
//!
//! gpt-oss's harmony messages carry their calls in the message header instead (see
//! [`super::output`]). A reply that does not hold well-formed calls in its family's
//! form is text: [`parse_calls`] answers `None` and the caller shows it as the answer.

use serde_json::Value;

use super::ChatTemplate;

/// How a template family writes a tool call (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// `<tool_call>{json}</tool_call>` blocks (Qwen, Hermes).
    Hermes,
    /// The reply is one JSON object `{"name", "parameters"}` (Llama 3.x).
    Llama3Json,
    /// `[TOOL_CALLS]` and a JSON array of `{"name", "arguments"}` (Mistral).
    Mistral,
}

/// What a chat template does with tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolSupport {
    /// The form calls take in a reply.
    pub format: ToolCallFormat,
    /// Whether the template itself renders `tools`, assistant `tool_calls` and `tool`
    /// messages. When it does not (SmolLM2's ChatML, Gemma 3), the caller describes the
    /// tools in the system message and writes calls and results in [`Hermes`] form
    /// ([`ToolCallFormat::Hermes`]).
    ///
    /// [`Hermes`]: ToolCallFormat::Hermes
    pub native: bool,
}

impl ToolSupport {
    /// The tool support of `template`, read from its source: `[TOOL_CALLS]` is
    /// Mistral's, `<tool_call>` Hermes', a template that offers tools through
    /// Llama 3's `ipython` role Llama 3's JSON; any other template that reads `tools`
    /// renders them itself in a form of its own that is read as Hermes'; one that does
    /// not read `tools` at all is not native.
    pub fn detect(template: &ChatTemplate) -> ToolSupport {
        let src = template.source();
        let reads_tools = src.contains("tools");
        let format = if src.contains("[TOOL_CALLS]") {
            ToolCallFormat::Mistral
        } else if src.contains("<tool_call>") {
            ToolCallFormat::Hermes
        } else if reads_tools && src.contains("ipython") && src.contains("\"parameters\"") {
            ToolCallFormat::Llama3Json
        } else {
            ToolCallFormat::Hermes
        };
        ToolSupport { format, native: reads_tools }
    }
}

impl ToolCallFormat {
    /// The text that opens the calls (`<tool_call>`, `[TOOL_CALLS]`); Llama 3's calls
    /// have none (the reply starts with `{`).
    pub fn marker(self) -> Option<&'static str> {
        match self {
            ToolCallFormat::Hermes => Some("<tool_call>"),
            ToolCallFormat::Mistral => Some("[TOOL_CALLS]"),
            ToolCallFormat::Llama3Json => None,
        }
    }

    /// The key that holds a call's arguments in this format.
    pub fn arguments_key(self) -> &'static str {
        match self {
            ToolCallFormat::Llama3Json => "parameters",
            _ => "arguments",
        }
    }
}

/// One call read from a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function's name.
    pub name: String,
    /// Its arguments as compact JSON text (an object; `{}` when the model gave none).
    pub arguments: String,
}

/// A call object `{"name": "...", "arguments" | "parameters": {...}}`: arguments as an
/// object, or as a string holding one (some models write OpenAI's form).
fn call_of(v: &Value) -> Option<ParsedCall> {
    let o = v.as_object()?;
    let name = o.get("name")?.as_str()?.to_owned();
    if name.is_empty() {
        return None;
    }
    let arguments = match o.get("arguments").or_else(|| o.get("parameters")) {
        None => Value::Object(Default::default()),
        Some(Value::String(s)) => serde_json::from_str::<Value>(s).ok().filter(Value::is_object)?,
        Some(a @ Value::Object(_)) => a.clone(),
        Some(_) => return None,
    };
    Some(ParsedCall { name, arguments: arguments.to_string() })
}

/// The JSON value at the start of `text` and the rest after it.
fn leading_json(text: &str) -> Option<(Value, &str)> {
    let mut it = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let v = it.next()?.ok()?;
    Some((v, &text[it.byte_offset()..]))
}

/// The calls in `tail`, the reply from where its calls begin (from the marker on, or
/// the whole reply for Llama 3's JSON), or `None` when it is not well-formed calls and
/// nothing else (then it is text). A last `</tool_call>` may be missing (the model may
/// stop right after the JSON).
pub fn parse_calls(format: ToolCallFormat, tail: &str) -> Option<Vec<ParsedCall>> {
    match format {
        ToolCallFormat::Hermes => {
            let mut rest = tail.trim();
            let mut calls = Vec::new();
            while !rest.is_empty() {
                rest = rest.strip_prefix("<tool_call>")?.trim_start();
                let (v, after) = leading_json(rest)?;
                calls.push(call_of(&v)?);
                let after = after.trim_start();
                rest = match after.strip_prefix("</tool_call>") {
                    Some(r) => r.trim_start(),
                    None if after.is_empty() => after,
                    None => return None,
                };
            }
            (!calls.is_empty()).then_some(calls)
        }
        ToolCallFormat::Llama3Json => {
            let body = tail.trim();
            let body = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim();
            let (v, after) = leading_json(body)?;
            if !after.trim().is_empty() {
                return None;
            }
            // Llama 3 names its arguments `parameters`; accept either key.
            Some(vec![call_of(&v)?])
        }
        ToolCallFormat::Mistral => {
            let body = tail.trim_start().strip_prefix("[TOOL_CALLS]")?.trim();
            let (v, after) = leading_json(body)?;
            if !after.trim().is_empty() {
                return None;
            }
            match v {
                Value::Array(items) if !items.is_empty() => items.iter().map(call_of).collect(),
                // A single object without the array, as some conversions write it.
                obj @ Value::Object(_) => Some(vec![call_of(&obj)?]),
                _ => None,
            }
        }
    }
}

/// Hermes' description of `tools` for a system message, for templates that do not
/// render tools themselves (the wording of Qwen2.5's template). `tools` are OpenAI's
/// `{"type": "function", "function": {...}}` objects.
pub fn hermes_tools_prompt(tools: &[Value]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in tools {
        s.push('\n');
        s.push_str(&python_json(t));
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n\
         </tool_call>",
    );
    s
}

/// A call in Hermes' form, as a template that renders calls writes it.
pub fn hermes_call(name: &str, arguments: &Value) -> String {
    format!(
        "<tool_call>\n{{\"name\": {}, \"arguments\": {}}}\n</tool_call>",
        python_json(&Value::String(name.to_owned())),
        python_json(arguments)
    )
}

/// JSON as Python's `json.dumps` writes it (`", "` and `": "`, non-ASCII kept), the
/// layout templates show tools and arguments in.
pub fn python_json(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("[{}]", a.iter().map(python_json).collect::<Vec<_>>().join(", ")),
        Value::Object(o) => format!(
            "{{{}}}",
            o.iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), python_json(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> ParsedCall {
        ParsedCall { name: name.into(), arguments: arguments.into() }
    }

    #[test]
    fn hermes_calls_are_read() {
        let one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        assert_eq!(parse_calls(ToolCallFormat::Hermes, one), Some(vec![call("get_weather", "{\"city\":\"Paris\"}")]));
        // Two blocks; the last without its closing tag; arguments as a JSON string.
        let two = "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>\n\
                   <tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": [1, 2]}\"}";
        assert_eq!(parse_calls(ToolCallFormat::Hermes, two), Some(vec![call("now", "{}"), call("f", "{\"x\":[1,2]}")]));
        // No arguments at all: an empty object.
        assert_eq!(
            parse_calls(ToolCallFormat::Hermes, "<tool_call>{\"name\": \"now\"}"),
            Some(vec![call("now", "{}")])
        );
    }

    #[test]
    fn malformed_hermes_output_is_text() {
        for bad in [
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": 3}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": \"not json\"}</tool_call>",
            "<tool_call>{\"name\": \"f\"}</tool_call> and then some words",
            "<tool_call>not json at all</tool_call>",
            "<tool_call>",
            "",
        ] {
            assert_eq!(parse_calls(ToolCallFormat::Hermes, bad), None, "{bad:?}");
        }
    }

    #[test]
    fn llama3_json_calls_are_read() {
        let r = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
        assert_eq!(parse_calls(ToolCallFormat::Llama3Json, r), Some(vec![call("get_weather", "{\"city\":\"Paris\"}")]));
        let tagged = " <|python_tag|>{\"name\": \"now\", \"parameters\": {}} ";
        assert_eq!(parse_calls(ToolCallFormat::Llama3Json, tagged), Some(vec![call("now", "{}")]));
        for bad in ["{\"name\": \"f\"} extra", "{\"city\": \"Paris\"}", "Sure! {\"name\": \"f\"}", "{\"name\": \"f\""] {
            assert_eq!(parse_calls(ToolCallFormat::Llama3Json, bad), None, "{bad:?}");
        }
    }

    #[test]
    fn mistral_calls_are_read() {
        let r = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, \
                 {\"name\": \"now\", \"arguments\": {}}]";
        assert_eq!(
            parse_calls(ToolCallFormat::Mistral, r),
            Some(vec![call("get_weather", "{\"city\":\"Paris\"}"), call("now", "{}")])
        );
        assert_eq!(
            parse_calls(ToolCallFormat::Mistral, "[TOOL_CALLS]{\"name\": \"now\", \"arguments\": {}}"),
            Some(vec![call("now", "{}")])
        );
        for bad in ["[TOOL_CALLS] []", "[TOOL_CALLS] [{\"name\": \"f\"", "[{\"name\": \"f\"}]", "[TOOL_CALLS] [1]"] {
            assert_eq!(parse_calls(ToolCallFormat::Mistral, bad), None, "{bad:?}");
        }
    }

    #[test]
    fn families_are_told_apart_by_their_templates() {
        let detect = |src: &str| ToolSupport::detect(&ChatTemplate::from_jinja(src).unwrap());
        let fixture = |name: &str| {
            std::fs::read_to_string(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates").join(name),
            )
            .unwrap()
        };
        let native = |format| ToolSupport { format, native: true };
        assert_eq!(detect(&fixture("qwen2.5.jinja")), native(ToolCallFormat::Hermes));
        assert_eq!(detect(&fixture("qwen3.jinja")), native(ToolCallFormat::Hermes));
        assert_eq!(detect(&fixture("llama3.1.jinja")), native(ToolCallFormat::Llama3Json));
        assert_eq!(detect(&fixture("mistral-v0.3.jinja")), native(ToolCallFormat::Mistral));
        let fallback = ToolSupport { format: ToolCallFormat::Hermes, native: false };
        assert_eq!(detect(&fixture("smollm2.jinja")), fallback);
        assert_eq!(detect(&fixture("gemma3.jinja")), fallback);
    }

    #[test]
    fn hermes_text_is_written_as_python_writes_json() {
        let args = serde_json::json!({"city": "Zürich", "days": [1, 2]});
        assert_eq!(
            hermes_call("get_weather", &args),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": [1, 2]}}\n</tool_call>"
        );
        let p = hermes_tools_prompt(&[serde_json::json!({"function": {"name": "now"}, "type": "function"})]);
        assert!(p.contains("<tools>\n{\"function\": {\"name\": \"now\"}, \"type\": \"function\"}\n</tools>"), "{p}");
    }
}
