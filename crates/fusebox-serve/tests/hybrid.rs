//! `fusebox serve` over real HTTP on loopback with a hybrid model: the tiny random
//! Qwen3.5 of `crates/fusebox-models/tests/fixtures/arch/qwen3_5` (Gated DeltaNet layers
//! beside full attention, a byte-level tokenizer). Its linear-attention layers carry a
//! state per sequence instead of keys and values: prompts read in chunks continue it,
//! and a batch of 8 concurrent requests steps each sequence's own. Every request gets
//! the answer it gets alone.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fusebox::ComputeBackend;
use fusebox_models::open;
use fusebox_serve::{Server, ServerConfig};
use serde_json::{json, Value};

fn start() -> Server {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fusebox-models/tests/fixtures/arch/qwen3_5");
    let b: Arc<dyn ComputeBackend> = fusebox::create_backend("cpu:2").unwrap();
    let model = open::load(b.as_ref(), &dir).unwrap();
    // Prompt chunks of 5: every prompt longer than that continues the state it left.
    let config = ServerConfig { port: 0, parallel: 8, prefill_chunk: 5, ..Default::default() };
    Server::start(b, model, config).unwrap()
}

async fn complete(c: &reqwest::Client, base: &str, prompt: &str, max_tokens: usize) -> (String, Value) {
    let body = json!({"prompt": prompt, "temperature": 0, "max_tokens": max_tokens});
    let r = c.post(format!("{base}/v1/completions")).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    assert_eq!(status, 200, "{v}");
    (v["choices"][0]["text"].as_str().unwrap().to_string(), v["usage"].clone())
}

#[test]
fn concurrent_requests_to_a_hybrid_model_get_their_solo_answers() {
    let server = start();
    let base = format!("http://{}", server.addr());
    let prompts = [
        "To be, or not to be",
        "Now is the winter of our discontent",
        "All the world's a stage",
        "If music be the food of love, play on",
        "Friends, Romans, countrymen",
        "Shall I compare thee to a summer's day?",
        "The quality of mercy is not strained",
        "Once more unto the breach",
    ];
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let c = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
        let mut solo = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            solo.push(complete(&c, &base, p, 6 + 2 * i).await);
        }
        // All at once (the batch shrinks as the shorter ones finish), in order and reversed.
        for order in [(0..8).collect::<Vec<usize>>(), (0..8).rev().collect()] {
            let tasks: Vec<_> = order
                .iter()
                .map(|&i| {
                    let (c, base, p) = (c.clone(), base.clone(), prompts[i]);
                    tokio::spawn(async move { (i, complete(&c, &base, p, 6 + 2 * i).await) })
                })
                .collect();
            for t in tasks {
                let (i, got) = t.await.unwrap();
                assert_eq!(got, solo[i], "request {i}");
            }
        }
    });
    server.shutdown().unwrap();
}
