//! Tool calls over real HTTP on loopback, with SmolLM2-135M-Instruct (skipped when
//! models/SmolLM2-135M-Instruct.Q4_1.gguf is absent; scripts/fetch-smollm2.sh fetches
//! it). Its ChatML template does not render tools, so the server describes them in the
//! system message in Hermes' form; `tool_choice: required` and a named function
//! constrain the reply to one `<tool_call>` whose arguments follow the function's
//! schema. Checked: the whole and the streamed answers carry a parsed call whose
//! arguments validate against the schema (the `jsonschema` crate) with
//! `finish_reason: "tool_calls"`; the call and the tool's result sent back are
//! accepted and answered; bad `tools` and `tool_choice` are 400s naming the field.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fusebox::ComputeBackend;
use fusebox_models::open;
use fusebox_serve::{Server, ServerConfig};
use serde_json::{json, Value};

fn backend() -> Arc<dyn ComputeBackend> {
    fusebox::create_backend("cpu:2").unwrap()
}

fn smollm2() -> Option<Server> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        eprintln!("skipping: {} is missing (scripts/fetch-smollm2.sh fetches it)", path.display());
        return None;
    }
    let b = backend();
    let model = open::load(b.as_ref(), &path).unwrap();
    let config = ServerConfig { port: 0, parallel: 4, ..Default::default() };
    Some(Server::start(b, model, config).unwrap())
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

async fn post(c: &reqwest::Client, base: &str, body: &Value) -> (u16, Value) {
    let r = c.post(format!("{base}/v1/chat/completions")).json(body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// A streamed answer's tool calls, put together from their `delta.tool_calls` pieces
/// as a client does (by index: id and name once, arguments appended), its text and its
/// finish reason.
async fn streamed(c: &reqwest::Client, base: &str, body: &Value) -> (Vec<Value>, String, String) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r = c.post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let (mut calls, mut content, mut finish) = (Vec::<Value>::new(), String::new(), String::new());
    for d in text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]") {
        let v: Value = serde_json::from_str(d).unwrap();
        let Some(ch) = v["choices"].get(0) else { continue };
        content.push_str(ch["delta"]["content"].as_str().unwrap_or(""));
        for piece in ch["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = piece["index"].as_u64().unwrap() as usize;
            if calls.len() <= i {
                calls.resize(i + 1, json!({"function": {"name": "", "arguments": ""}}));
            }
            for key in ["id", "type"] {
                if let Some(x) = piece[key].as_str() {
                    calls[i][key] = json!(x);
                }
            }
            let f = &piece["function"];
            if let Some(n) = f["name"].as_str() {
                calls[i]["function"]["name"] = json!(n);
            }
            let args = format!(
                "{}{}",
                calls[i]["function"]["arguments"].as_str().unwrap(),
                f["arguments"].as_str().unwrap_or("")
            );
            calls[i]["function"]["arguments"] = json!(args);
        }
        if let Some(f) = ch["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (calls, content, finish)
}

fn weather_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
        },
        "required": ["city", "unit"],
        "additionalProperties": false
    })
}

fn time_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"timezone": {"type": "string", "maxLength": 30}},
        "required": ["timezone"],
        "additionalProperties": false
    })
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Gets the current weather in a city.",
                                          "parameters": weather_schema()}},
        {"type": "function", "function": {"name": "get_time", "description": "Tells the time in a timezone.",
                                          "parameters": time_schema()}}
    ])
}

/// The call's name is one of the tools and its arguments validate against that tool's schema.
fn assert_valid_call(call: &Value) -> String {
    assert_eq!(call["type"], "function", "{call}");
    let id = call["id"].as_str().unwrap();
    assert!(id.starts_with("call_") && id.len() > 5, "{id}");
    let name = call["function"]["name"].as_str().unwrap();
    let schema = match name {
        "get_weather" => weather_schema(),
        "get_time" => time_schema(),
        other => panic!("a call to {other}"),
    };
    let text = call["function"]["arguments"].as_str().unwrap();
    let args: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("arguments not JSON ({e}): {text:?}"));
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(&args).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{text} does not validate: {errors:?}");
    name.to_string()
}

#[test]
fn smollm2_required_and_named_calls_validate_and_the_result_is_answered() {
    let Some(server) = smollm2() else { return };
    let base = format!("http://{}", server.addr());
    rt().block_on(async {
        let c = reqwest::Client::builder().timeout(Duration::from_secs(300)).build().unwrap();
        let question = json!([{"role": "user", "content": "What is the weather like in Paris today?"}]);
        // Required: one call, whole.
        let body = json!({"messages": question, "tools": tools(), "tool_choice": "required",
                          "temperature": 0, "max_tokens": 200});
        let (status, v) = post(&c, &base, &body).await;
        assert_eq!(status, 200, "{v}");
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
        assert!(choice["message"]["content"].is_null(), "{v}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{v}");
        assert_valid_call(&calls[0]);
        let first_call = calls[0].clone();

        // Required, sampled, streamed.
        let mut sampled = body.clone();
        sampled["temperature"] = json!(0.8);
        sampled["seed"] = json!(7);
        let (calls, content, finish) = streamed(&c, &base, &sampled).await;
        assert_eq!((finish.as_str(), content.as_str()), ("tool_calls", ""));
        assert_eq!(calls.len(), 1);
        assert_valid_call(&calls[0]);

        // Named: only that function, whole and streamed.
        let named = json!({"messages": question, "tools": tools(), "temperature": 0, "max_tokens": 200,
                           "tool_choice": {"type": "function", "function": {"name": "get_time"}}});
        let (status, v) = post(&c, &base, &named).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(assert_valid_call(&v["choices"][0]["message"]["tool_calls"][0]), "get_time");
        let (calls, _, finish) = streamed(&c, &base, &named).await;
        assert_eq!((finish.as_str(), assert_valid_call(&calls[0]).as_str()), ("tool_calls", "get_time"));

        // The call and its result sent back: answered with text.
        let mut messages = question.as_array().unwrap().clone();
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [first_call.clone()]}));
        messages.push(json!({"role": "tool", "tool_call_id": first_call["id"], "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}));
        let follow = json!({"messages": messages, "tools": tools(), "tool_choice": "none",
                            "temperature": 0, "max_tokens": 40});
        let (status, v) = post(&c, &base, &follow).await;
        assert_eq!(status, 200, "{v}");
        let m = &v["choices"][0]["message"];
        assert!(m["content"].is_string() && m.get("tool_calls").is_none(), "{v}");
        assert!(["stop", "length"].contains(&v["choices"][0]["finish_reason"].as_str().unwrap()), "{v}");
        // With `auto` too (whatever the model then says, it is a well-formed answer).
        let mut auto = follow.clone();
        auto["tool_choice"] = json!("auto");
        let (status, v) = post(&c, &base, &auto).await;
        assert_eq!(status, 200, "{v}");
        let (_, _, finish) = streamed(&c, &base, &auto).await;
        assert!(["stop", "length", "tool_calls"].contains(&finish.as_str()), "{finish}");

        // A schema llguidance cannot use, under `required`: a 400 naming `tools`.
        let bad_schema = json!({"messages": question, "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "f",
                "parameters": {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": true}}}}}]});
        let (status, v) = post(&c, &base, &bad_schema).await;
        assert_eq!((status, v["error"]["param"].as_str()), (400, Some("tools")), "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("uniqueItems"), "{v}");
        // Bad fields, each a 400 that names it; the server answers afterwards.
        for (body, param) in [
            (json!({"messages": question, "tools": tools(),
                    "tool_choice": {"type": "function", "function": {"name": "get_stock_price"}}}),
             "tool_choice.function.name"),
            (json!({"messages": question, "tools": [{"type": "function", "function": {"name": "bad name"}}]}),
             "tools[0].function.name"),
            (json!({"messages": question, "tools": "get_weather"}), "tools"),
            (json!({"messages": question, "tool_choice": "required"}), "tool_choice"),
            (json!({"messages": question, "tools": tools(), "tool_choice": "required",
                    "response_format": {"type": "json_object"}}), "response_format"),
            (json!({"messages": [{"role": "tool", "content": "21"}]}), "messages[0].tool_call_id"),
            (json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"type": "function"}]}]}),
             "messages[0].tool_calls[0].id"),
        ] {
            let (status, v) = post(&c, &base, &body).await;
            assert_eq!((status, v["error"]["param"].as_str()), (400, Some(param)), "{body}: {v}");
        }
        let (status, _) = post(&c, &base, &body).await;
        assert_eq!(status, 200);
    });
    server.shutdown().unwrap();
}
