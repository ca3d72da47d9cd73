//! Structured outputs over real HTTP on loopback: `response_format` (`json_object`,
//! `json_schema`), llama-server's `json_schema` and `grammar` (GBNF and Lark).
//!
//! With the tiny random Qwen3.5 fixture (always present), whose free text is noise:
//! sampled answers under a schema whose language is finite all end by themselves and
//! validate (checked with the `jsonschema` crate), whole and streamed, `n` choices too;
//! a GBNF `"yes" | "no"` grammar yields exactly one of them; a Lark grammar its digits;
//! constrained and unconstrained requests run together in one batch, the unconstrained
//! answers equal to their solo runs token for token; bad schemas and grammars are 400s
//! naming the problem. With SmolLM2-135M-Instruct (skipped when
//! models/SmolLM2-135M-Instruct.Q4_1.gguf is absent): `json_object` answers to
//! several prompts parse, `json_schema` answers validate, and the official `openai`
//! client's structured-output call validates with Python's `jsonschema` when a Python
//! with both is found (`FUSEBOX_PYTHON`, /tmp/openai-venv, python3).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fusebox::ComputeBackend;
use fusebox_models::open;
use fusebox_serve::{Server, ServerConfig};
use serde_json::{json, Value};

fn backend() -> Arc<dyn ComputeBackend> {
    fusebox::create_backend("cpu:2").unwrap()
}

fn tiny() -> Server {
    let b = backend();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fusebox-models/tests/fixtures/arch/qwen3_5");
    let model = open::load(b.as_ref(), &path).unwrap();
    let config = ServerConfig { port: 0, parallel: 4, prefill_chunk: 8, queue: 32, ..Default::default() };
    Server::start(b, model, config).unwrap()
}

fn smollm2_path() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipping: {} is missing (scripts/fetch-smollm2.sh fetches it)", p.display());
        None
    }
}

fn smollm2() -> Option<Server> {
    let path = smollm2_path()?;
    let b = backend();
    let model = open::load(b.as_ref(), &path).unwrap();
    let config = ServerConfig { port: 0, parallel: 4, ..Default::default() };
    Some(Server::start(b, model, config).unwrap())
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(300)).build().unwrap()
}

async fn post(c: &reqwest::Client, base: &str, route: &str, body: &Value) -> (u16, Value) {
    let r = c.post(format!("{base}{route}")).json(body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// The streamed text of choice 0 and its finish reason.
async fn streamed(c: &reqwest::Client, base: &str, route: &str, body: &Value) -> (String, String) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r = c.post(format!("{base}{route}")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let (mut out, mut finish) = (String::new(), String::new());
    for d in text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]") {
        let v: Value = serde_json::from_str(d).unwrap();
        let Some(ch) = v["choices"].get(0) else { continue };
        out.push_str(ch["delta"]["content"].as_str().or(ch["text"].as_str()).unwrap_or(""));
        if let Some(f) = ch["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (out, finish)
}

fn content(v: &Value, i: usize) -> String {
    let ch = &v["choices"][i];
    ch["message"]["content"].as_str().or(ch["text"].as_str()).unwrap().to_string()
}

/// Parses `text` and checks it against `schema`.
fn assert_valid(schema: &Value, text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    let validator = jsonschema::validator_for(schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{text} does not validate: {errors:?}");
}

/// A schema whose language is finite and short (the tiny model's context is 64 bytes):
/// every answer under it ends by itself.
fn finite_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "c": {"enum": ["red", "blue"]},
            "n": {"type": "integer", "minimum": 1, "maximum": 9}
        },
        "required": ["ok", "c", "n"],
        "additionalProperties": false
    })
}

fn schema_format(schema: &Value) -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": true}})
}

#[test]
fn sampled_answers_follow_their_schema_and_grammar_on_the_tiny_model() {
    let server = tiny();
    let base = format!("http://{}", server.addr());
    rt().block_on(async {
        let c = client();
        let schema = finite_schema();
        for seed in 0..6 {
            // Sampled at temperature 1 from a random model: only the mask keeps it in line.
            let body = json!({"prompt": "Q:", "temperature": 1.0, "seed": seed, "max_tokens": 58,
                              "response_format": schema_format(&schema)});
            let (status, v) = post(&c, &base, "/v1/completions", &body).await;
            assert_eq!(status, 200, "{v}");
            assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
            assert_valid(&schema, &content(&v, 0));
            // Streamed: the same answer, delta by delta.
            let (text, finish) = streamed(&c, &base, "/v1/completions", &body).await;
            assert_eq!((text.as_str(), finish.as_str()), (content(&v, 0).as_str(), "stop"));
        }
        // /v1/completions with llama-server's top-level `json_schema`, three choices.
        let body = json!({"prompt": "JSON:", "temperature": 0.8, "seed": 7, "n": 3, "max_tokens": 58,
                          "json_schema": schema});
        let (status, v) = post(&c, &base, "/v1/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        for i in 0..3 {
            assert_eq!(v["choices"][i]["finish_reason"], "stop", "{v}");
            assert_valid(&schema, &content(&v, i));
        }
        // GBNF: exactly "yes" or "no", greedy and sampled.
        let yes_no = "root ::= answer\nanswer ::= \"yes\" | \"no\"  # one word\n";
        for (seed, temperature) in [(0, 0.0), (1, 1.0), (2, 1.0), (3, 1.0)] {
            let body = json!({"prompt": "Is it?", "grammar": yes_no, "temperature": temperature, "seed": seed,
                              "max_tokens": 20});
            let (status, v) = post(&c, &base, "/v1/completions", &body).await;
            assert_eq!(status, 200, "{v}");
            let text = content(&v, 0);
            assert!(text == "yes" || text == "no", "{text:?}");
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
        }
        // Lark (llguidance's dialect): three digits, then a letter.
        let body = json!({"prompt": "Code?", "temperature": 1.0, "seed": 5,
                          "grammar": "start: /[0-9]{3}/ LETTER\nLETTER: /[a-z]/", "max_tokens": 20});
        let (status, v) = post(&c, &base, "/v1/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        let text = content(&v, 0);
        assert!(text.len() == 4 && text[..3].bytes().all(|b| b.is_ascii_digit()), "{text:?}");
        assert!(text.as_bytes()[3].is_ascii_lowercase(), "{text:?}");
        // `json_object` (unbounded): what ends by itself is JSON; what runs out of tokens
        // is cut short with "length".
        for seed in 0..3 {
            let body = json!({"prompt": "{", "temperature": 1.0, "seed": seed, "max_tokens": 50,
                              "response_format": {"type": "json_object"}});
            let (status, v) = post(&c, &base, "/v1/completions", &body).await;
            assert_eq!(status, 200, "{v}");
            let text = content(&v, 0);
            assert!(text.starts_with('{'), "{text:?}");
            if v["choices"][0]["finish_reason"] == "stop" {
                assert!(serde_json::from_str::<Value>(&text).unwrap().is_object(), "{text:?}");
            } else {
                assert_eq!(v["choices"][0]["finish_reason"], "length");
            }
        }
        // `text` is no constraint at all.
        let body = json!({"prompt": "Hi", "temperature": 0, "max_tokens": 5, "response_format": {"type": "text"}});
        let (_, with) = post(&c, &base, "/v1/completions", &body).await;
        let (_, without) =
            post(&c, &base, "/v1/completions", &json!({"prompt": "Hi", "temperature": 0, "max_tokens": 5})).await;
        assert_eq!(content(&with, 0), content(&without, 0));
        let metrics = c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
        assert!(metrics.contains("fusebox_requests_structured_total 21"), "{metrics}");
        assert!(metrics.contains("fusebox_constraint_seconds_total"), "{metrics}");
    });
    server.shutdown().unwrap();
}

#[test]
fn constrained_and_unconstrained_requests_share_a_batch() {
    let server = tiny();
    let base = format!("http://{}", server.addr());
    let plain = |i: usize| json!({"prompt": format!("Story {i}:"), "temperature": 0, "max_tokens": 24 + 4 * i});
    // Prompts of 8 bytes leave 56 positions.
    let schema = finite_schema();
    let constrained = |i: usize| {
        json!({"prompt": format!("Thing {i}:"), "temperature": 1.0, "seed": i, "max_tokens": 50,
               "response_format": schema_format(&schema)})
    };
    rt().block_on(async {
        let c = client();
        let mut solo = Vec::new();
        for i in 0..2 {
            let (status, v) = post(&c, &base, "/v1/completions", &plain(i)).await;
            assert_eq!(status, 200, "{v}");
            solo.push(v);
        }
        // Two plain and two constrained at once, twice over (the slots change hands).
        for _ in 0..2 {
            let mut tasks = Vec::new();
            for i in 0..2 {
                for body in [plain(i), constrained(i)] {
                    let (c, base) = (c.clone(), base.clone());
                    tasks.push(tokio::spawn(
                        async move { (body.clone(), post(&c, &base, "/v1/completions", &body).await) },
                    ));
                }
            }
            for t in tasks {
                let (body, (status, v)) = t.await.unwrap();
                assert_eq!(status, 200, "{v}");
                if body.get("response_format").is_some() {
                    assert_valid(&schema, &content(&v, 0));
                } else {
                    let i = (body["max_tokens"].as_u64().unwrap() as usize - 24) / 4;
                    assert_eq!(
                        content(&v, 0),
                        content(&solo[i], 0),
                        "plain request {i} changed beside constrained ones"
                    );
                    assert_eq!(v["usage"], solo[i]["usage"]);
                }
            }
        }
    });
    server.shutdown().unwrap();
}

#[test]
fn bad_schemas_and_grammars_are_400s_that_name_the_problem() {
    let server = tiny();
    let base = format!("http://{}", server.addr());
    let chat = |extra: Value| {
        let mut b = json!({"prompt": "x", "max_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let cases = [
        // An unsupported keyword is named.
        (schema_format(&json!({"type": "array", "uniqueItems": true})), "response_format", "uniqueItems"),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}),
            "response_format",
            "strnig",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": false}}),
            "response_format",
            "accepts no value",
        ),
        (json!({"type": "json_schema"}), "response_format.json_schema", "is required"),
        (
            json!({"type": "json_schema", "json_schema": {"schema": 3}}),
            "response_format.json_schema.schema",
            "an object",
        ),
        (json!({"type": "xml"}), "response_format.type", "must be one of text, json_object, json_schema"),
        (json!("json_object"), "response_format", "must be an object"),
        (json!({}), "response_format.type", "is required"),
    ];
    rt().block_on(async {
        let c = client();
        for (rf, param, says) in cases {
            let (status, v) = post(&c, &base, "/v1/completions", &chat(json!({"response_format": rf}))).await;
            assert_eq!(status, 400, "{rf}: {v}");
            assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
            assert_eq!(v["error"]["param"], param, "{v}");
            assert!(v["error"]["message"].as_str().unwrap().contains(says), "{rf}: {v}");
        }
        for (grammar, says) in [
            (json!("root ::= \"a\" missing"), "rule 'missing' is used but not defined"),
            (json!("root ::= [a-"), "line 1"),
            (json!("start: \"a\" | undefined_rule"), "undefined_rule"),
            (json!("start: /[/"), "start"),
            (json!(""), "empty"),
            (json!(7), "must be a string"),
        ] {
            let (status, v) = post(&c, &base, "/v1/completions", &json!({"prompt": "x", "grammar": grammar})).await;
            assert_eq!(status, 400, "{grammar}: {v}");
            assert_eq!(v["error"]["param"], "grammar", "{v}");
            assert!(v["error"]["message"].as_str().unwrap().contains(says), "{grammar}: {v}");
        }
        let both = json!({"prompt": "x", "grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}});
        let (status, v) = post(&c, &base, "/v1/completions", &both).await;
        assert_eq!(status, 400, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("only one of"), "{v}");
        // The server still answers, constrained and not.
        let (status, v) =
            post(&c, &base, "/v1/completions", &json!({"prompt": "x", "grammar": "root ::= \"ok\"", "max_tokens": 5}))
                .await;
        assert_eq!((status, content(&v, 0).as_str()), (200, "ok"), "{v}");
        let (status, _) = post(&c, &base, "/v1/completions", &json!({"prompt": "x", "max_tokens": 2})).await;
        assert_eq!(status, 200);
    });
    server.shutdown().unwrap();
}

#[test]
fn smollm2_answers_parse_and_validate() {
    let Some(server) = smollm2() else { return };
    let base = format!("http://{}", server.addr());
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "languages": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}
        },
        "required": ["name", "age", "languages"],
        "additionalProperties": false
    });
    rt().block_on(async {
        let c = client();
        for prompt in [
            "What is the capital of France? Answer as a JSON object with the key \"capital\".",
            "Give the boiling point of water in Celsius as a JSON object.",
            "Return a JSON object with the name and colour of one fruit.",
        ] {
            let body = json!({"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 256,
                              "response_format": {"type": "json_object"}});
            let (status, v) = post(&c, &base, "/v1/chat/completions", &body).await;
            assert_eq!(status, 200, "{v}");
            let text = content(&v, 0);
            assert_eq!(v["choices"][0]["finish_reason"], "stop", "{text}");
            assert!(serde_json::from_str::<Value>(&text).unwrap().is_object(), "{text}");
        }
        for prompt in ["Describe a software engineer named Ada.", "Invent a person who speaks three languages."] {
            let body = json!({"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 256,
                              "response_format": schema_format(&schema)});
            let (status, v) = post(&c, &base, "/v1/chat/completions", &body).await;
            assert_eq!(status, 200, "{v}");
            assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
            assert_valid(&schema, &content(&v, 0));
        }
    });
    if let Some(python) = python_with("import openai, jsonschema") {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/serve_structured_client.py");
        let out = std::process::Command::new(&python)
            .arg(&script)
            .args(["--base-url", &format!("http://{}/v1", server.addr())])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        assert_eq!(v["validated"], true, "{v}");
        assert_eq!(v["bad_schema_status"], 400, "{v}");
    } else {
        eprintln!("skipping the openai-client check: no Python with `openai` and `jsonschema` (set FUSEBOX_PYTHON)");
    }
    server.shutdown().unwrap();
}

/// An interpreter that runs `check`: `$FUSEBOX_PYTHON`, /tmp/openai-venv, or python3.
fn python_with(check: &str) -> Option<String> {
    let candidates =
        [std::env::var("FUSEBOX_PYTHON").ok(), Some("/tmp/openai-venv/bin/python".into()), Some("python3".into())];
    candidates
        .into_iter()
        .flatten()
        .find(|p| std::process::Command::new(p).args(["-c", check]).output().is_ok_and(|o| o.status.success()))
}
