//! `fusebox serve` over real HTTP on loopback, with SmolLM2 (skips, saying why, without
//! models/SmolLM2-135M-Instruct.Q4_1.gguf; scripts/fetch-smollm2.sh fetches it).
//!
//! Greedy replies equal the library's generation for the same messages; streamed chunks
//! concatenate to the same text; concurrent requests get their solo answers; every bad
//! input gets its status and an OpenAI error body; a disconnect frees its slot; the
//! queue overflows into 503; the official `openai` Python client works.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fusebox::ComputeBackend;
use fusebox_models::{open, pretrained};
use fusebox_models::{Sampler, SamplerConfig};
use fusebox_serve::{Server, ServerConfig};
use serde_json::{json, Value};

fn model_path() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipping: {} is missing (scripts/fetch-smollm2.sh fetches it)", p.display());
        None
    }
}

fn backend() -> Arc<dyn ComputeBackend> {
    fusebox::create_backend("cpu:2").unwrap()
}

fn start(config: ServerConfig) -> Option<Server> {
    let path = model_path()?;
    let b = backend();
    let model = open::load(b.as_ref(), &path).unwrap();
    Some(Server::start(b, model, ServerConfig { port: 0, ..config }).unwrap())
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// The library's greedy answer to one user message, the way `fusebox generate --chat
/// --temperature 0` computes it.
fn solo_reference(messages: &[(&str, &str)], max_tokens: usize) -> String {
    let path = model_path().unwrap();
    let b = backend();
    let model = open::load(b.as_ref(), &path).unwrap();
    let template = model.chat_template().unwrap();
    let prompt = template.encode(&model.tokenizer, &template.apply(messages, true).unwrap());
    let mut session = model.session(b.as_ref(), 2048).unwrap();
    let stop = model.stop_ids(true);
    let mut sampler = Sampler::new(SamplerConfig::default()).unwrap();
    let g =
        pretrained::generate(&mut session, b.as_ref(), &prompt, max_tokens, &mut sampler, &stop, |_| Ok(())).unwrap();
    let shown: Vec<u32> = g.tokens.iter().copied().filter(|t| !stop.contains(t)).collect();
    model.tokenizer.decode_with(&shown, true).unwrap()
}

async fn chat(c: &reqwest::Client, base: &str, body: Value) -> (u16, Value) {
    let r = c.post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// The `data:` payloads of an SSE body.
fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        .map(str::to_string)
        .collect()
}

/// Streams a chat request; returns the concatenated content, the finish reason and
/// the usage of the last chunk.
async fn chat_stream(c: &reqwest::Client, base: &str, mut body: Value) -> (String, String, Value) {
    body["stream"] = json!(true);
    let r = c.post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let text = r.text().await.unwrap();
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{text}");
    let mut content = String::new();
    let (mut finish, mut usage) = (String::new(), Value::Null);
    for (i, d) in data[..data.len() - 1].iter().enumerate() {
        let v: Value = serde_json::from_str(d).unwrap();
        assert_eq!(v["object"], "chat.completion.chunk", "{d}");
        let choice = &v["choices"][0];
        if i == 0 {
            assert_eq!(choice["delta"]["role"], "assistant");
        }
        if let Some(t) = choice["delta"]["content"].as_str() {
            content.push_str(t);
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
            usage = v["usage"].clone();
        }
    }
    (content, finish, usage)
}

#[test]
fn greedy_reply_equals_generate_and_the_stream_concatenates_to_it() {
    let Some(server) = start(ServerConfig { parallel: 2, ..Default::default() }) else { return };
    let base = format!("http://{}", server.addr());
    let messages = [("user", "What is the capital of France? Answer in one sentence.")];
    let want = solo_reference(&messages, 40);
    assert!(!want.is_empty());
    let body = json!({"model": "SmolLM2-135M-Instruct.Q4_1", "temperature": 0, "max_tokens": 40,
                      "messages": [{"role": "user", "content": messages[0].1}]});
    rt().block_on(async {
        let c = client();
        let (status, v) = chat(&c, &base, body.clone()).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"]["role"], "assistant");
        assert_eq!(v["choices"][0]["message"]["content"], want.as_str());
        let fin = v["choices"][0]["finish_reason"].as_str().unwrap();
        assert!(fin == "stop" || fin == "length", "{v}");
        let u = &v["usage"];
        assert!(u["prompt_tokens"].as_u64().unwrap() > 10);
        assert_eq!(
            u["total_tokens"].as_u64().unwrap(),
            u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
        );

        let (content, finish, usage) = chat_stream(&c, &base, body.clone()).await;
        assert_eq!(content, want);
        assert_eq!(finish, fin);
        assert_eq!(&usage, u);

        // /v1/completions runs the raw prompt.
        let r = c
            .post(format!("{base}/v1/completions"))
            .json(&json!({"prompt": "The capital of France is", "max_tokens": 5, "temperature": 0}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["completion_tokens"], 5);
        assert!(!v["choices"][0]["text"].as_str().unwrap().is_empty());

        // The other routes.
        let v: Value = c.get(format!("{base}/v1/models")).send().await.unwrap().json().await.unwrap();
        assert_eq!(v["object"], "list");
        assert_eq!(v["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");
        let v: Value = c.get(format!("{base}/health")).send().await.unwrap().json().await.unwrap();
        assert_eq!(v["status"], "ok");
        let page = c.get(format!("{base}/")).send().await.unwrap();
        assert!(page.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
        // The model thread updates the slot gauge just after sending a job's end.
        let t = Instant::now();
        let m = loop {
            let m = c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
            if m.contains("fusebox_slots_busy 0") || t.elapsed() > Duration::from_secs(5) {
                break m;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        for name in [
            "fusebox_requests_total 3",
            "fusebox_slots_busy 0",
            "fusebox_queue_depth 0",
            "fusebox_decode_tokens_per_second",
        ] {
            assert!(m.contains(name), "{name} missing from\n{m}");
        }
    });
    server.shutdown().unwrap();
}

#[test]
fn stop_strings_seeds_and_sampling() {
    let Some(server) = start(ServerConfig { parallel: 2, ..Default::default() }) else { return };
    let base = format!("http://{}", server.addr());
    rt().block_on(async {
        let c = client();
        let msg = json!([{"role": "user", "content": "Count from 1 to 20, separated by commas."}]);
        let (_, full) = chat(&c, &base, json!({"messages": msg, "temperature": 0, "max_tokens": 40})).await;
        let full = full["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        assert!(full.contains('5'), "{full}");
        let (_, v) = chat(&c, &base, json!({"messages": msg, "temperature": 0, "max_tokens": 40, "stop": ["5"]})).await;
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), &full[..full.find('5').unwrap()]);
        // Streamed, the stop string is held back too.
        let (s, f, _) =
            chat_stream(&c, &base, json!({"messages": msg, "temperature": 0, "max_tokens": 40, "stop": "5"})).await;
        assert_eq!((s.as_str(), f.as_str()), (&full[..full.find('5').unwrap()], "stop"));
        // A seed makes sampling repeatable.
        let body = json!({"messages": msg, "temperature": 1.0, "top_p": 0.9, "top_k": 40, "seed": 7, "max_tokens": 12});
        let (_, a) = chat(&c, &base, body.clone()).await;
        let (_, b) = chat(&c, &base, body).await;
        assert_eq!(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"]);
    });
    server.shutdown().unwrap();
}

#[test]
fn bad_input_gets_openai_errors() {
    let config = ServerConfig { parallel: 1, ctx_size: Some(64), api_key: Some("sekret".into()), ..Default::default() };
    let Some(server) = start(config) else { return };
    let base = format!("http://{}", server.addr());
    rt().block_on(async {
        let c = client();
        let post = |body: Vec<u8>, key: Option<&str>| {
            let mut r = c.post(format!("{base}/v1/chat/completions")).header("content-type", "application/json").body(body);
            if let Some(k) = key {
                r = r.bearer_auth(k);
            }
            r.send()
        };
        let ok = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
        // 401 without the key, with a wrong one; 200 with it.
        for key in [None, Some("wrong")] {
            let r = post(ok.to_string().into_bytes(), key).await.unwrap();
            assert_eq!(r.status(), 401);
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], "invalid_api_key");
            assert_eq!(v["error"]["type"], "authentication_error");
        }
        assert_eq!(c.get(format!("{base}/v1/models")).send().await.unwrap().status(), 401);
        assert_eq!(c.get(format!("{base}/health")).send().await.unwrap().status(), 200);
        assert_eq!(post(ok.to_string().into_bytes(), Some("sekret")).await.unwrap().status(), 200);

        let cases: Vec<(Vec<u8>, Option<&str>, &str)> = vec![
            (b"{\"messages\": [".to_vec(), None, "not valid JSON"),
            (json!({"messages": "hi"}).to_string().into_bytes(), Some("messages"), "must be an array"),
            (json!({"messages": []}).to_string().into_bytes(), Some("messages"), "at least one message"),
            (json!({"messages": [{"role": "user", "content": "x"}], "temperature": "warm"}).to_string().into_bytes(), Some("temperature"), "a number"),
            (json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}).to_string().into_bytes(), Some("max_tokens"), "non-negative integer"),
            (json!({"messages": [{"role": "user", "content": "x"}], "model": "gpt-4"}).to_string().into_bytes(), Some("model"), "gpt-4"),
            (json!({"messages": [{"role": "user", "content": "word ".repeat(200)}]}).to_string().into_bytes(), Some("messages"), "maximum context length is 64 tokens"),
        ];
        for (body, param, text) in cases {
            let shown = String::from_utf8_lossy(&body).chars().take(80).collect::<String>();
            let r = post(body, Some("sekret")).await.unwrap();
            assert_eq!(r.status(), 400, "{shown}");
            let v: Value = r.json().await.unwrap();
            let e = &v["error"];
            assert_eq!(e["type"], "invalid_request_error", "{v}");
            assert_eq!(e["param"].as_str(), param, "{v}");
            assert!(e["message"].as_str().unwrap().contains(text), "{shown}: {v}");
            assert!(e.get("code").is_some(), "{v}");
        }
        // The context error names both numbers.
        let r = post(json!({"messages": [{"role": "user", "content": "word ".repeat(200)}]}).to_string().into_bytes(), Some("sekret")).await.unwrap();
        let v: Value = r.json().await.unwrap();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("64 tokens") && msg.contains("resulted in 2"), "{msg}");
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        // max_tokens past the context ends with "length" at the context's end.
        let r = post(json!({"messages": [{"role": "user", "content": "Write a long story about a dragon."}], "max_tokens": 5000, "temperature": 0}).to_string().into_bytes(), Some("sekret")).await.unwrap();
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
        let u = &v["usage"];
        assert_eq!(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap(), 65, "{v}");
        // Over 1 MiB: 413.
        let big = format!("{{\"messages\": [{{\"role\": \"user\", \"content\": \"{}\"}}]}}", "a".repeat((1 << 20) + 10));
        // The server may answer 413 and close before the client has written the whole body;
        // the client then sees the connection broken while sending, which is the same refusal.
        match post(big.into_bytes(), Some("sekret")).await {
            Ok(r) => assert_eq!(r.status(), 413),
            Err(e) => assert!(e.is_request(), "expected 413 or a refused body, got {e}"),
        }
    });
    server.shutdown().unwrap();
}

#[test]
fn concurrent_greedy_requests_get_their_solo_answers() {
    let Some(server) = start(ServerConfig { parallel: 8, prefill_chunk: 16, ..Default::default() }) else { return };
    let base = format!("http://{}", server.addr());
    let questions = [
        "What is 2 + 2?",
        "Name a color.",
        "Write a haiku about the sea.",
        "What is the capital of Japan?",
        "Say hello in French.",
        "List three fruits.",
        "Why is the sky blue? Be brief.",
        "Tell me a fun fact about cats.",
    ];
    let body = |i: usize, n: usize| json!({"messages": [{"role": "user", "content": questions[i]}], "temperature": 0, "max_tokens": 24 + 3 * n});
    rt().block_on(async {
        let c = client();
        let mut solo = Vec::new();
        for i in 0..questions.len() {
            let (status, v) = chat(&c, &base, body(i, i)).await;
            assert_eq!(status, 200, "{v}");
            solo.push((v["choices"][0]["message"]["content"].clone(), v["usage"].clone()));
        }
        // All at once (lengths differ, so the batch shrinks as they finish), twice: once
        // in order, once reversed so each lands in another slot beside other neighbours.
        for order in [(0..8).collect::<Vec<_>>(), (0..8).rev().collect()] {
            let tasks: Vec<_> = order
                .iter()
                .map(|&i| {
                    let (c, base, b) = (c.clone(), base.clone(), body(i, i));
                    tokio::spawn(async move { (i, chat(&c, &base, b).await) })
                })
                .collect();
            for t in tasks {
                let (i, (status, v)) = t.await.unwrap();
                assert_eq!(status, 200, "{v}");
                assert_eq!(v["choices"][0]["message"]["content"], solo[i].0, "request {i}");
                assert_eq!(v["usage"], solo[i].1, "request {i}");
            }
        }
    });
    server.shutdown().unwrap();
}

#[test]
fn a_disconnected_client_frees_its_slot_and_a_full_queue_answers_503() {
    let Some(server) = start(ServerConfig { parallel: 1, queue: 1, ..Default::default() }) else { return };
    let base = format!("http://{}", server.addr());
    rt().block_on(async {
        let c = client();
        let long = json!({"messages": [{"role": "user", "content": "Write a very long story."}], "temperature": 0,
                          "max_tokens": 1500, "stream": true});
        let mut a = c.post(format!("{base}/v1/chat/completions")).json(&long).send().await.unwrap();
        assert_eq!(a.status(), 200);
        // Wait for real content: the slot is decoding.
        let mut seen = String::new();
        while !seen.contains("\"content\":\"") || seen.matches("data:").count() < 3 {
            seen.push_str(&String::from_utf8_lossy(&a.chunk().await.unwrap().unwrap()));
        }
        // The slot is busy; one more waits in the queue; the next is refused.
        let b = c.post(format!("{base}/v1/chat/completions")).json(&long).send().await.unwrap();
        assert_eq!(b.status(), 200);
        let r = c.post(format!("{base}/v1/chat/completions")).json(&long).send().await.unwrap();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "1");
        let v: Value = r.json().await.unwrap();
        assert!(v["error"]["message"].as_str().unwrap().contains("busy"), "{v}");
        drop(b);
        // Dropping the stream disconnects; the slot frees within a step.
        drop(a);
        let t = Instant::now();
        loop {
            let m = c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
            if m.contains("fusebox_slots_busy 0") && m.contains("fusebox_requests_cancelled_total 2") {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "slot not freed:\n{m}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (status, _) =
            chat(&c, &base, json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})).await;
        assert_eq!(status, 200);
    });
    server.shutdown().unwrap();
}

#[test]
fn shutdown_cuts_running_streams_within_the_grace_period() {
    let Some(server) =
        start(ServerConfig { parallel: 1, shutdown_grace: Duration::from_millis(300), ..Default::default() })
    else {
        return;
    };
    let base = format!("http://{}", server.addr());
    let runtime = rt();
    let c = client();
    let long = json!({"messages": [{"role": "user", "content": "Write a very long story."}], "temperature": 0,
                      "max_tokens": 1500, "stream": true});
    let r = runtime.block_on(async { c.post(format!("{base}/v1/chat/completions")).json(&long).send().await.unwrap() });
    let reader = runtime.spawn(async move { r.text().await.unwrap() });
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    server.shutdown().unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "shutdown took {:?}", t.elapsed());
    let body = runtime.block_on(reader).unwrap();
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    assert!(body.contains("\"finish_reason\":\"length\""), "{body}");
}

/// The interpreter for the `openai` client check: `$FUSEBOX_PYTHON`, the shared venv,
/// or `python3`, whichever imports `openai`.
fn python_with_openai() -> Option<String> {
    let candidates =
        [std::env::var("FUSEBOX_PYTHON").ok(), Some("/tmp/venv-py/bin/python".into()), Some("python3".into())];
    for p in candidates.into_iter().flatten() {
        let ok =
            std::process::Command::new(&p).args(["-c", "import openai"]).output().is_ok_and(|o| o.status.success());
        if ok {
            return Some(p);
        }
    }
    None
}

#[test]
fn the_openai_python_client_works() {
    let Some(python) = python_with_openai() else {
        eprintln!("skipping: no Python with the `openai` package (set FUSEBOX_PYTHON, or pip install openai)");
        return;
    };
    let Some(server) = start(ServerConfig { parallel: 2, api_key: Some("k-123".into()), ..Default::default() }) else {
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/serve_openai_client.py");
    let out = std::process::Command::new(&python)
        .arg(&script)
        .args(["--base-url", &format!("http://{}/v1", server.addr()), "--api-key", "k-123"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert!(v["chunks"].as_u64().unwrap() >= 2, "{v}");
    assert_eq!(v["streamed"], v["whole"], "{v}");
    assert!(!v["whole"].as_str().unwrap().is_empty());
    assert!(v["finish_reason"] == "stop" || v["finish_reason"] == "length", "{v}");
    assert!(v["usage_total"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["choices_n3"], 3, "{v}");
    assert!(v["embedding_width"].as_u64().unwrap() > 0, "{v}");
    // The greedy answer's logprobs are the log-softmax of the model's logits, step by step.
    let got: Vec<f64> = v["logprobs"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    let want = greedy_logprobs(&[("system", "You are concise."), ("user", "Name three planets.")], got.len());
    assert_eq!(got.len(), want.len(), "{v}");
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() < 1e-4, "token {k}: {g} from the server, {w} from the model's logits");
    }
    server.shutdown().unwrap();
}

/// The log-probabilities (log-softmax of the logits) of the first `n` tokens of the
/// library's greedy answer to `messages`.
fn greedy_logprobs(messages: &[(&str, &str)], n: usize) -> Vec<f64> {
    let path = model_path().unwrap();
    let b = backend();
    let model = open::load(b.as_ref(), &path).unwrap();
    let template = model.chat_template().unwrap();
    let prompt = template.encode(&model.tokenizer, &template.apply(messages, true).unwrap());
    let mut session = model.session(b.as_ref(), 2048).unwrap();
    let mut logits = session.step(b.as_ref(), &prompt).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let l = &logits[..model.tokenizer.vocab_size().min(logits.len())];
        let next = fusebox_models::sampler::argmax(l);
        let max = l[next as usize] as f64;
        let lse = max + l.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
        out.push(l[next as usize] as f64 - lse);
        logits = session.step(b.as_ref(), &[next]).unwrap();
    }
    out
}
