//! `fusebox serve` with speculative decoding, over real HTTP on loopback, with SmolLM2
//! (skips, saying why, without models/SmolLM2-135M-Instruct.Q4_1.gguf;
//! scripts/fetch-smollm2.sh fetches it).
//!
//! A lone request's greedy answer with prompt-lookup or draft-model drafting equals the
//! library's plain generation, drafted tokens are counted in /metrics, concurrent
//! requests (the plain batched step) get the same answers, and a draft model with
//! another vocabulary or a bad setting stops the server from starting.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fusebox::ComputeBackend;
use fusebox_models::{open, pretrained};
use fusebox_models::{Sampler, SamplerConfig};
use fusebox_serve::engine::{DraftConfig, DraftSource};
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

const EDIT: &str = "Rename the function `add` to `plus` in this code and print the whole code again:\n\n\
def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n    return a + b\n\n\
def twice(x):\n    return add(x, x)\n\nprint(twice(21))\n";

/// The library's plain greedy answer (f16 cache, as the server's default here).
fn solo_reference(text: &str, max_tokens: usize) -> String {
    let b = backend();
    let model = open::load(b.as_ref(), &model_path().unwrap()).unwrap();
    let template = model.chat_template().unwrap();
    let prompt = template.encode(&model.tokenizer, &template.apply(&[("user", text)], true).unwrap());
    let mut session = model.session_with_cache(b.as_ref(), 2048, fusebox::DType::F16).unwrap();
    let stop = model.stop_ids(true);
    let mut sampler = Sampler::new(SamplerConfig::default()).unwrap();
    let g =
        pretrained::generate(&mut session, b.as_ref(), &prompt, max_tokens, &mut sampler, &stop, |_| Ok(())).unwrap();
    let shown: Vec<u32> = g.tokens.iter().copied().filter(|t| !stop.contains(t)).collect();
    model.tokenizer.decode_with(&shown, true).unwrap()
}

fn start(parallel: usize, source: DraftSource) -> fusebox::Result<Server> {
    let b = backend();
    let model = open::load(b.as_ref(), &model_path().unwrap()).unwrap();
    let config = ServerConfig {
        port: 0,
        parallel,
        cache_type: fusebox::DType::F16,
        draft: Some(DraftConfig { source, max_draft: 8 }),
        ..Default::default()
    };
    Server::start(b, model, config)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

async fn answer(c: &reqwest::Client, base: &str, text: &str, max_tokens: usize) -> String {
    let body = json!({"temperature": 0, "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}]});
    let r = c.post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.unwrap();
    v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

async fn metric(c: &reqwest::Client, base: &str, name: &str) -> f64 {
    let text = c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let line = text.lines().find(|l| l.starts_with(&format!("fusebox_{name} "))).unwrap_or_else(|| panic!("{name}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

fn check(source: DraftSource, min_accepted: f64) {
    let want = solo_reference(EDIT, 48);
    let server = start(2, source).unwrap();
    let base = format!("http://{}", server.addr());
    rt().block_on(async {
        let c = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
        assert_eq!(answer(&c, &base, EDIT, 48).await, want, "a lone request, drafted");
        let drafted = metric(&c, &base, "draft_tokens_total").await;
        let accepted = metric(&c, &base, "draft_tokens_accepted_total").await;
        assert!(accepted >= min_accepted && accepted <= drafted, "{accepted} of {drafted} drafts kept");
        let rate = metric(&c, &base, "draft_acceptance_rate").await;
        assert!((rate - accepted / drafted).abs() < 1e-3, "{rate}");
        // Two at once: the plain batched step (drafting resumes when one is left).
        let (a, b) = tokio::join!(answer(&c, &base, EDIT, 48), answer(&c, &base, EDIT, 48));
        assert_eq!((a.as_str(), b.as_str()), (want.as_str(), want.as_str()));
    });
}

#[test]
fn prompt_lookup_answers_equal_plain_generation() {
    if model_path().is_none() {
        return;
    }
    check(DraftSource::Ngram(3), 10.0);
}

#[test]
fn draft_model_answers_equal_plain_generation() {
    let Some(path) = model_path() else { return };
    // The model drafting for itself: most drafts are kept.
    let draft = open::load(backend().as_ref(), &path).unwrap();
    check(DraftSource::Model(Arc::new(draft)), 20.0);
}

#[test]
fn bad_drafting_stops_the_start() {
    let Some(_) = model_path() else { return };
    let e = start(1, DraftSource::Ngram(0)).err().unwrap().to_string();
    assert!(e.contains("--draft-ngram"), "{e}");
    let gemma = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/gemma-3-270m-q4_k_m.gguf");
    if !gemma.exists() {
        eprintln!("skipping the vocabulary check: {} is missing", gemma.display());
        return;
    }
    let other = open::load(backend().as_ref(), &gemma).unwrap();
    let e = start(1, DraftSource::Model(Arc::new(other))).err().unwrap().to_string();
    assert!(e.contains("vocabulary") && e.contains("49152"), "{e}");
}
