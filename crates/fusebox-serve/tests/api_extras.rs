//! The API beyond plain completions, over real HTTP on loopback, with the tiny random
//! Qwen3.5 of `crates/fusebox-models/tests/fixtures/arch/qwen3_5` (always present, so
//! these never skip): `logprobs` equal the log-softmax of a direct forward's logits,
//! streamed too; `n` choices, reproducible with a seed; the penalties and min-p;
//! `/tokenize`, `/detokenize` and `/v1/embeddings` (against a direct forward's hidden
//! states); the counters in `/metrics`; and a fuzz of malformed new fields, every one
//! answered with a 4xx OpenAI error while the server keeps answering.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fusebox::ComputeBackend;
use fusebox_models::open;
use fusebox_models::pretrained::Pretrained;
use fusebox_serve::{Server, ServerConfig};
use serde_json::{json, Value};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fusebox-models/tests/fixtures/arch/qwen3_5")
}

fn backend() -> Arc<dyn ComputeBackend> {
    fusebox::create_backend("cpu:2").unwrap()
}

fn load() -> (Arc<dyn ComputeBackend>, Pretrained) {
    let b = backend();
    let model = open::load(b.as_ref(), &fixture()).unwrap();
    (b, model)
}

fn start(parallel: usize) -> Server {
    let (b, model) = load();
    let config = ServerConfig { port: 0, parallel, prefill_chunk: 5, queue: 16, ..Default::default() };
    Server::start(b, model, config).unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap()
}

async fn post(c: &reqwest::Client, base: &str, route: &str, body: &Value) -> (u16, Value) {
    let r = c.post(format!("{base}{route}")).json(body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// The `data:` payloads of an SSE body, `[DONE]` checked and left out.
async fn sse(c: &reqwest::Client, base: &str, route: &str, body: &Value) -> Vec<Value> {
    let r = c.post(format!("{base}{route}")).json(body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let data: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect()
}

/// Log-softmax of `logits` and the ids of the `k` largest (ties by id).
fn reference_step(logits: &[f32], k: usize) -> (Vec<f64>, Vec<usize>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max + logits.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln();
    let logprobs: Vec<f64> = logits.iter().map(|&l| l as f64 - lse).collect();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.truncate(k);
    (logprobs, order)
}

const PROMPT: &str = "To be, or not to be";

#[test]
fn logprobs_are_the_log_softmax_of_a_direct_forward() {
    // The reference: the prompt, then each greedy token, through a plain session.
    let (b, model) = load();
    let tok = &model.tokenizer;
    let vocab = tok.vocab_size().min(model.network.arch.vocab_size);
    let prompt = tok.encode(PROMPT, tok.add_bos_default());
    let mut session = model.session(b.as_ref(), 64).unwrap();
    let mut logits = session.step(b.as_ref(), &prompt).unwrap();
    let mut steps = Vec::new();
    for _ in 0..8 {
        let (lp, top) = reference_step(&logits[..vocab], 5);
        let next = top[0];
        steps.push((next as u32, lp, top));
        logits = session.step(b.as_ref(), &[next as u32]).unwrap();
    }
    let token_text = |id: u32| {
        let mut bytes = Vec::new();
        tok.token_bytes(id, false, &mut bytes).unwrap();
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    };

    let server = start(4);
    let base = format!("http://{}", server.addr());
    rt().block_on(async {
        let c = client();
        // /v1/completions: logprobs = 5.
        let body = json!({"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 5});
        let (status, v) = post(&c, &base, "/v1/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        let lp = &v["choices"][0]["logprobs"];
        let n = lp["tokens"].as_array().unwrap().len();
        // Every generated token has an entry (a stop token would end the list early).
        assert!((1..=8).contains(&n), "{v}");
        let text = v["choices"][0]["text"].as_str().unwrap();
        for (k, (id, ref_lp, top)) in steps.iter().take(n).enumerate() {
            assert_eq!(lp["tokens"][k].as_str().unwrap(), token_text(*id).0, "token {k}");
            let got = lp["token_logprobs"][k].as_f64().unwrap();
            assert!((got - ref_lp[*id as usize]).abs() < 1e-4, "token {k}: {got} vs {}", ref_lp[*id as usize]);
            let alts = lp["top_logprobs"][k].as_object().unwrap();
            // Keyed by text: tokens with the same text (bytes of a character, shown as
            // U+FFFD) share the entry of the first, the most likely.
            for &t in top {
                let (text, _) = token_text(t as u32);
                let first = top.iter().find(|&&u| token_text(u as u32).0 == text).unwrap();
                let got = alts[&text].as_f64().unwrap();
                assert!((got - ref_lp[*first]).abs() < 1e-4, "token {k}, alternative {t}");
            }
            // text_offset counts the characters of the text before the token.
            let offset = lp["text_offset"][k].as_u64().unwrap() as usize;
            assert!(offset <= text.chars().count());
        }
        assert_eq!(lp["text_offset"][0], 0);

        // /v1/chat/completions: logprobs with top_logprobs = 3, whole and streamed.
        let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0,
                          "logprobs": true, "top_logprobs": 3});
        let (status, v) = post(&c, &base, "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
        assert!(!content.is_empty(), "{v}");
        for e in &content {
            let top = e["top_logprobs"].as_array().unwrap();
            assert_eq!(top.len(), 3);
            // The greedy token is the most likely one, and the list is sorted.
            assert_eq!(e["logprob"], top[0]["logprob"], "{e}");
            assert!(top.windows(2).all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()));
            let bytes: Vec<u8> = e["bytes"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u8).collect();
            assert_eq!(String::from_utf8_lossy(&bytes), e["token"].as_str().unwrap());
            assert!(e["logprob"].as_f64().unwrap() <= 0.0);
        }
        // One entry per generated token of the answer (a stop token has none).
        assert!(content.len() as u64 <= v["usage"]["completion_tokens"].as_u64().unwrap());
        let mut body = body.clone();
        body["stream"] = json!(true);
        let chunks = sse(&c, &base, "/v1/chat/completions", &body).await;
        let streamed: Vec<Value> = chunks
            .iter()
            .filter_map(|ch| ch["choices"][0]["logprobs"]["content"].as_array().cloned())
            .flatten()
            .collect();
        assert_eq!(streamed, content);
        // Without logprobs, none.
        let (_, v) = post(&c, &base, "/v1/completions", &json!({"prompt": PROMPT, "max_tokens": 2})).await;
        assert!(v["choices"][0]["logprobs"].is_null());
    });
    server.shutdown().unwrap();
}

#[test]
fn n_choices_seeds_penalties_and_stop_strings() {
    let server = start(4);
    let base = format!("http://{}", server.addr());
    rt().block_on(async {
        let c = client();
        let texts = |v: &Value| -> Vec<String> {
            v["choices"].as_array().unwrap().iter().map(|ch| ch["text"].as_str().unwrap().to_string()).collect()
        };
        // n = 3, sampled with a seed: 3 choices, indexed, the same again with the same seed.
        let body = json!({"prompt": PROMPT, "max_tokens": 10, "temperature": 1.0, "seed": 42, "n": 3});
        let (status, a) = post(&c, &base, "/v1/completions", &body).await;
        assert_eq!(status, 200, "{a}");
        assert_eq!(a["choices"].as_array().unwrap().len(), 3);
        for (i, ch) in a["choices"].as_array().unwrap().iter().enumerate() {
            assert_eq!(ch["index"], i);
            assert!(ch["finish_reason"].is_string());
        }
        let (_, b) = post(&c, &base, "/v1/completions", &body).await;
        assert_eq!(texts(&a), texts(&b));
        // The choices are different draws; the first is the n = 1 answer of that seed.
        let t = texts(&a);
        assert!(t[0] != t[1] || t[1] != t[2], "{t:?}");
        let mut one = body.clone();
        one["n"] = json!(1);
        let (_, single) = post(&c, &base, "/v1/completions", &one).await;
        assert_eq!(texts(&single)[0], t[0]);
        // Completion tokens are summed over the choices, the prompt counted once.
        let per: u64 = 3 * single["usage"]["prompt_tokens"].as_u64().unwrap();
        assert_eq!(a["usage"]["prompt_tokens"].as_u64().unwrap() * 3, per);
        assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        // Greedy: every choice is the same answer. Streamed: chunks of every index.
        let body = json!({"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "n": 3, "stream": true});
        let chunks = sse(&c, &base, "/v1/completions", &body).await;
        let mut got = vec![String::new(); 3];
        for ch in &chunks {
            let choice = &ch["choices"][0];
            got[choice["index"].as_u64().unwrap() as usize].push_str(choice["text"].as_str().unwrap_or(""));
        }
        assert!(got[0] == got[1] && got[1] == got[2], "{got:?}");
        assert_eq!(chunks.iter().filter(|ch| ch["choices"][0]["finish_reason"].is_string()).count(), 3);
        assert!(chunks.last().unwrap()["usage"]["completion_tokens"].as_u64().unwrap() >= 3);

        // Penalties and min-p are accepted (their effect is the sampler's unit tests').
        let greedy = json!({"prompt": PROMPT, "max_tokens": 16, "temperature": 0});
        let (_, plain) = post(&c, &base, "/v1/completions", &greedy).await;
        for extra in [
            json!({"presence_penalty": 2.0}),
            json!({"frequency_penalty": 2.0}),
            json!({"repeat_penalty": 1.5}),
            json!({"min_p": 0.5, "temperature": 1.0, "seed": 3}),
        ] {
            let mut body = greedy.clone();
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            let (status, v) = post(&c, &base, "/v1/completions", &body).await;
            assert_eq!(status, 200, "{extra}: {v}");
            assert!(v["choices"][0]["text"].is_string());
        }

        // A stop string across tokens: the answer ends before it, finish_reason "stop",
        // streamed the same, logprobs only for the tokens before it.
        // (A random model writes arbitrary bytes: the stop string is two ASCII characters
        // of its answer, past the first.)
        let full = plain["choices"][0]["text"].as_str().unwrap().to_string();
        let chars: Vec<char> = full.chars().collect();
        let window = (1..chars.len().saturating_sub(1))
            .find(|&i| chars[i].is_ascii_graphic() && chars[i + 1].is_ascii_graphic());
        if let Some(i) = window {
            let stop: String = chars[i..i + 2].iter().collect();
            let want = &full[..full.find(&stop).unwrap()];
            let body = json!({"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stop": [stop], "logprobs": 1});
            let (_, v) = post(&c, &base, "/v1/completions", &body).await;
            assert_eq!(v["choices"][0]["text"].as_str().unwrap(), want, "stop {stop:?} in {full:?}");
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
            // Logprobs for the tokens before the stop string, not those after it.
            let reported = v["choices"][0]["logprobs"]["tokens"].as_array().unwrap().len() as u64;
            assert!(reported < v["usage"]["completion_tokens"].as_u64().unwrap() || want.is_empty(), "{v}");
            let mut body = body.clone();
            body["stream"] = json!(true);
            let chunks = sse(&c, &base, "/v1/completions", &body).await;
            let streamed: String = chunks.iter().filter_map(|ch| ch["choices"][0]["text"].as_str()).collect();
            assert_eq!(streamed, want);
        }
    });
    server.shutdown().unwrap();
}

#[test]
fn tokenize_detokenize_and_embeddings() {
    let (b, model) = load();
    let tok = &model.tokenizer;
    // The reference embedding: the mean of the final hidden states, normalised.
    let ids = tok.encode(PROMPT, tok.add_bos_default());
    let mut cache = model.network.new_cache(b.as_ref(), 64).unwrap();
    let h = model.network.forward_cached_hidden(b.as_ref(), &ids, &mut cache).unwrap().to_vec::<f32>().unwrap();
    let d = model.network.arch.d_model;
    let mut mean = vec![0f64; d];
    for row in h.chunks_exact(d) {
        mean.iter_mut().zip(row).for_each(|(m, &x)| *m += x as f64);
    }
    let norm = mean.iter().map(|x| x * x).sum::<f64>().sqrt();
    let want: Vec<f64> = mean.iter().map(|x| x / norm).collect();
    let last_row = &h[h.len() - d..];
    let last_norm = last_row.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let want_last: Vec<f64> = last_row.iter().map(|&x| x as f64 / last_norm).collect();
    let vocab = tok.vocab_size();

    let server = start(2);
    let base = format!("http://{}", server.addr());
    rt().block_on(async {
        let c = client();
        let (status, v) = post(&c, &base, "/tokenize", &json!({"content": PROMPT})).await;
        assert_eq!(status, 200, "{v}");
        let got: Vec<u32> = v["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
        assert_eq!(got, tok.tokenize(PROMPT, false, true));
        let (_, v) = post(&c, &base, "/tokenize", &json!({"content": PROMPT, "add_special": true})).await;
        assert_eq!(v["tokens"].as_array().unwrap().len(), tok.tokenize(PROMPT, true, true).len());
        let (_, v) = post(&c, &base, "/tokenize", &json!({"content": "ab", "with_pieces": true})).await;
        let pieces: String = v["tokens"].as_array().unwrap().iter().map(|t| t["piece"].as_str().unwrap()).collect();
        assert_eq!(pieces, "ab");
        let (status, v) = post(&c, &base, "/detokenize", &json!({"tokens": got})).await;
        assert_eq!((status, v["content"].as_str()), (200, Some(PROMPT)));
        let (status, v) = post(&c, &base, "/detokenize", &json!({"tokens": []})).await;
        assert_eq!((status, v["content"].as_str()), (200, Some("")));
        for (route, body, param) in [
            ("/detokenize", json!({"tokens": [1, vocab]}), "tokens[1]"),
            ("/detokenize", json!({"tokens": [-1]}), "tokens[0]"),
            ("/detokenize", json!({"tokens": "12"}), "tokens"),
            ("/detokenize", json!({}), "tokens"),
            ("/tokenize", json!({"content": 5}), "content"),
            ("/tokenize", json!({}), "content"),
            ("/tokenize", json!({"content": "x", "add_special": "yes"}), "add_special"),
        ] {
            let (status, v) = post(&c, &base, route, &body).await;
            assert_eq!(status, 400, "{route} {body}: {v}");
            assert_eq!(v["error"]["param"], param, "{route} {body}: {v}");
        }

        // Embeddings: one string, then a list; float and base64.
        let (status, v) = post(&c, &base, "/v1/embeddings", &json!({"input": PROMPT})).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["object"], "list");
        assert_eq!(v["data"][0]["object"], "embedding");
        let e: Vec<f64> = v["data"][0]["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(e.len(), d);
        for (a, b) in e.iter().zip(&want) {
            assert!((a - b).abs() < 1e-4, "{e:?}\n{want:?}");
        }
        assert_eq!(v["usage"]["prompt_tokens"], ids.len());
        let (_, v) =
            post(&c, &base, "/v1/embeddings", &json!({"input": [PROMPT, "Friends, Romans"], "pooling": "last"})).await;
        assert_eq!(v["data"].as_array().unwrap().len(), 2);
        assert_eq!(v["data"][1]["index"], 1);
        let e: Vec<f64> = v["data"][0]["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        for (a, b) in e.iter().zip(&want_last) {
            assert!((a - b).abs() < 1e-4);
        }
        let (_, v) = post(&c, &base, "/v1/embeddings", &json!({"input": PROMPT, "encoding_format": "base64"})).await;
        let b64 = v["data"][0]["embedding"].as_str().unwrap();
        assert_eq!(b64.len(), (d * 4).div_ceil(3) * 4);
        for (route, body, param) in [
            ("/v1/embeddings", json!({"input": []}), "input"),
            ("/v1/embeddings", json!({"input": ""}), "input"),
            ("/v1/embeddings", json!({"input": 5}), "input"),
            ("/v1/embeddings", json!({"input": [[1, 999999]]}), "input[0][1]"),
            ("/v1/embeddings", json!({"input": "x", "encoding_format": "hex"}), "encoding_format"),
            ("/v1/embeddings", json!({"input": "x", "dimensions": 3}), "dimensions"),
            ("/v1/embeddings", json!({"input": "x", "pooling": "cls"}), "pooling"),
            ("/v1/embeddings", json!({"input": "x ".repeat(100)}), "input"),
        ] {
            let (status, v) = post(&c, &base, route, &body).await;
            assert_eq!(status, 400, "{body}: {v}");
            assert_eq!(v["error"]["param"], param, "{body}: {v}");
        }

        // The counters.
        let m = c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
        for line in [
            "fusebox_tokenize_requests_total 6",
            "fusebox_detokenize_requests_total 6",
            "fusebox_embedding_requests_total 11",
            "fusebox_embedding_inputs_total 4",
            "fusebox_prompt_tokens_cached_total 0",
        ] {
            assert!(m.lines().any(|l| l == line), "{line} missing from\n{m}");
        }
    });
    server.shutdown().unwrap();
}

/// A small deterministic generator for the fuzz (SplitMix64).
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

#[test]
fn malformed_new_fields_are_4xx_errors_and_the_server_keeps_answering() {
    let server = start(2);
    let base = format!("http://{}", server.addr());
    // Each field with values that must be refused.
    let bad: Vec<(&str, Vec<Value>)> = vec![
        ("n", vec![json!(0), json!(9), json!(1000000), json!(-1), json!(2.5), json!("3"), json!([1]), json!(true)]),
        ("top_logprobs", vec![json!(21), json!(-1), json!(1.5), json!("5"), json!({})]),
        ("min_p", vec![json!(-0.01), json!(1.01), json!(1e308), json!("0.1"), json!([])]),
        ("presence_penalty", vec![json!(-2.01), json!(2.5), json!(-1e300), json!("1"), json!(null_obj())]),
        ("frequency_penalty", vec![json!(3), json!(-3), json!(true), json!([0.5])]),
        ("repeat_penalty", vec![json!(0), json!(-1), json!(101), json!("x")]),
        ("repetition_penalty", vec![json!(0), json!(1000)]),
        ("stop", vec![json!(5), json!([""]), json!(["a", "b", "c", "d", "e"]), json!([1, 2]), json!({"a": 1})]),
        ("seed", vec![json!("seven"), json!(1.5), json!([])]),
    ];
    // Completions-only and chat-only bad values of `logprobs`.
    let chat_logprobs = [json!(5), json!("yes"), json!([])];
    let completion_logprobs = [json!(21), json!(-1), json!(true), json!("2"), json!(2.5)];
    let good_extras: Vec<(&str, Value)> = vec![
        ("n", json!(2)),
        ("min_p", json!(0.05)),
        ("presence_penalty", json!(0.5)),
        ("frequency_penalty", json!(-0.5)),
        ("repeat_penalty", json!(1.1)),
        ("seed", json!(9)),
        ("stop", json!(["zz"])),
        ("stream", json!(true)),
    ];
    let mut rng = Mix(20240611);
    rt().block_on(async {
        let c = client();
        let mut refused = 0;
        for round in 0..120 {
            let chat = round % 2 == 0;
            let mut body = if chat {
                json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
            } else {
                json!({"prompt": "Hi", "max_tokens": 2})
            };
            // Some valid fields beside one or two bad ones.
            for _ in 0..(rng.next() % 3) {
                let (k, v) = rng.pick(&good_extras).clone();
                body[k] = v;
            }
            let (field, values) = rng.pick(&bad).clone();
            let value = rng.pick(&values).clone();
            body[field] = value.clone();
            let mut expect_param = vec![field.to_string()];
            if field == "top_logprobs" && rng.next().is_multiple_of(2) {
                body["logprobs"] = json!(true);
            }
            if rng.next().is_multiple_of(4) {
                let v = if chat { rng.pick(&chat_logprobs).clone() } else { rng.pick(&completion_logprobs).clone() };
                body["logprobs"] = v;
                expect_param.push("logprobs".into());
            }
            if field == "repetition_penalty" && body.get("repeat_penalty").is_some() {
                expect_param.push("repeat_penalty".into());
            }
            // top_logprobs without logprobs on completions is not a field there.
            if !chat && field == "top_logprobs" {
                continue;
            }
            let route = if chat { "/v1/chat/completions" } else { "/v1/completions" };
            let r = c.post(format!("{base}{route}")).json(&body).send().await.unwrap();
            let status = r.status().as_u16();
            let v: Value = r.json().await.unwrap_or_else(|e| panic!("{body}: not JSON: {e}"));
            assert!((400..500).contains(&status), "{body} → {status} {v}");
            let e = &v["error"];
            assert_eq!(e["type"], "invalid_request_error", "{body} → {v}");
            let param = e["param"].as_str().unwrap_or_else(|| panic!("{body} → {v}: no param"));
            // The error names the field (or, for a stop list, its field).
            assert!(expect_param.iter().any(|p| param.starts_with(p.as_str())), "{body} → {v}");
            assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
            refused += 1;
        }
        assert!(refused > 80, "{refused}");
        // Malformed bodies for the new routes.
        let raw: [(&str, &[u8]); 7] = [
            ("/tokenize", b"{"),
            ("/tokenize", b"[]"),
            ("/tokenize", b"\"content\""),
            ("/detokenize", b"{\"tokens\": [1, 2"),
            ("/detokenize", b"{\"tokens\": [1e40]}"),
            ("/v1/embeddings", b"null"),
            ("/v1/embeddings", b"{\"input\": [\"a\", [1]]}"),
        ];
        for (route, body) in raw {
            let r = c
                .post(format!("{base}{route}"))
                .header("content-type", "application/json")
                .body(body.to_vec())
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let v: Value = r.json().await.unwrap();
            assert!((400..500).contains(&status), "{route} {:?} → {status}", String::from_utf8_lossy(body));
            assert!(v["error"]["message"].is_string(), "{v}");
        }
        // Still answering, and the model thread still generating.
        let (status, v) = post(&c, &base, "/v1/completions", &json!({"prompt": "Hi", "max_tokens": 3, "n": 2})).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"].as_array().unwrap().len(), 2);
        let health = c.get(format!("{base}/health")).send().await.unwrap();
        assert_eq!(health.status(), 200);
    });
    server.shutdown().unwrap();
}

/// An object where a number is expected.
fn null_obj() -> Value {
    json!({"x": null})
}
