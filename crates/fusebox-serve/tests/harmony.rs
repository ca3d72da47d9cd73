//! `fusebox serve` over real HTTP on loopback with a harmony (gpt-oss-style) model:
//! the answer and the reasoning come apart, `<|end|>` does not end the reply but
//! `<|return|>` does, and no structure token reaches the text, whole or streamed.
//!
//! The model is built here so that its greedy reply is known: one Llama layer whose
//! attention and MLP write nothing (zero output projections), so the last hidden state
//! is the current token's embedding (±1 entries, RMS 1), and an output matrix whose row
//! for token `next(t)` is token `t`'s embedding. Greedy decoding then follows a chain of
//! tokens scripted below, one token after another. Its vocabulary is the o200k-style
//! fixture of fusebox-models (gpt-oss's pre-tokenizer and special tokens) as a GGUF
//! with `tokenizer.ggml.pre = gpt-4o` and no chat template, so the server also falls
//! back to gpt-oss's template and detects the harmony format by itself.
//!
//! A token can have one successor only, so the chain cannot repeat a token, and the
//! second message of a harmony reply repeats `<|channel|>` and `<|message|>`: the
//! scripted reply is an analysis message, `<|end|>`, then text outside any message
//! header, which the parser keeps as the answer (the final channel's own routing is
//! covered by the parser's and the reply stream's unit tests).

#[path = "../../fusebox-models/tests/common/gguf_writer.rs"]
#[allow(dead_code)]
mod gguf_writer;

use std::path::{Path, PathBuf};
use std::time::Duration;

use fusebox_models::chat::ChatTemplate;
use fusebox_models::gguf::{Array, GgmlType, GgufFile, Value};
use fusebox_models::open;
use fusebox_models::tokenizer::Tokenizer;
use fusebox_serve::{Server, ServerConfig};
use gguf_writer::GgufWriter;
use serde_json::{json, Value as Json};

const DIM: usize = 64;
const FF: usize = 128;

const REASONING: &str = "Two and two";
const ANSWER: &str = " make four.";

/// The o200k-style fixture's vocabulary as GGUF tokenizer metadata.
fn vocabulary_writer() -> (GgufWriter, usize) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fusebox-models/tests/fixtures/tokenizers/o200k_style/tokenizer.json");
    let j: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let vocab = j["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); vocab.len()];
    for (t, i) in vocab {
        tokens[i.as_u64().unwrap() as usize] = t.clone();
    }
    let mut types = vec![1i32; tokens.len()];
    for a in j["added_tokens"].as_array().unwrap() {
        let id = a["id"].as_u64().unwrap() as usize;
        if id == tokens.len() {
            tokens.push(String::new());
            types.push(1);
        }
        tokens[id] = a["content"].as_str().unwrap().to_owned();
        types[id] = if a["special"] == true { 3 } else { 4 };
    }
    let merges: Vec<String> = j["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Json::String(s) => s.clone(),
            other => format!("{} {}", other[0].as_str().unwrap(), other[1].as_str().unwrap()),
        })
        .collect();
    let eos = tokens.iter().position(|t| t == "<|return|>").unwrap() as u32;
    let n = tokens.len();
    let w = GgufWriter::default()
        .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::String("gpt-4o".into()))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
        .kv("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))
        .kv("tokenizer.ggml.merges", Value::Array(Array::String(merges)))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(eos));
    (w, n)
}

/// Token `t`'s embedding: ±1 in each dimension, from a hash.
fn embedding(t: usize) -> Vec<f32> {
    (0..DIM)
        .map(|j| {
            let mut h = (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (j as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
            h ^= h >> 29;
            h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            h ^= h >> 32;
            if h & 1 == 0 {
                1.0
            } else {
                -1.0
            }
        })
        .collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Writes the scripted model; returns its path and the reply's ids (stop token last).
fn scripted_model() -> (PathBuf, Vec<u32>) {
    let (w, vocab) = vocabulary_writer();
    let tok = Tokenizer::from_gguf(GgufFile::from_bytes(w.to_bytes()).unwrap().metadata()).unwrap();
    // The prompt's last token starts the chain: gpt-oss's template ends it with `<|start|>assistant`.
    let template = ChatTemplate::for_tokenizer(None, &tok).unwrap();
    let prompt = template.encode(&tok, &template.apply(&[("user", "Hi")], true).unwrap());
    let id = |t: &str| tok.token_id(t).unwrap();
    let mut reply = vec![id("<|channel|>")];
    reply.extend(tok.encode("analysis", false));
    reply.push(id("<|message|>"));
    reply.extend(tok.encode(REASONING, false));
    reply.push(id("<|end|>"));
    reply.extend(tok.encode(ANSWER, false));
    reply.push(id("<|return|>"));
    let chain: Vec<u32> = std::iter::once(*prompt.last().unwrap()).chain(reply.iter().copied()).collect();
    let mut seen = std::collections::HashSet::new();
    assert!(chain.iter().all(|t| seen.insert(*t)), "the chain repeats a token: {chain:?}");

    let mut embd = Vec::with_capacity(vocab * DIM);
    for t in 0..vocab {
        embd.extend(embedding(t));
    }
    let mut output = vec![0.0f32; vocab * DIM];
    for pair in chain.windows(2) {
        let (from, to) = (pair[0] as usize, pair[1] as usize);
        output[to * DIM..(to + 1) * DIM].copy_from_slice(&embedding(from));
    }
    let (d, f, v) = (DIM as u64, FF as u64, vocab as u64);
    let fill = |n: u64, x: f32| bytes(&vec![x; n as usize]);
    let w = w
        .kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", Value::U32(1))
        .kv("llama.context_length", Value::U32(512))
        .kv("llama.embedding_length", Value::U32(DIM as u32))
        .kv("llama.feed_forward_length", Value::U32(FF as u32))
        .kv("llama.attention.head_count", Value::U32(4))
        .kv("llama.attention.head_count_kv", Value::U32(4))
        .kv("llama.rope.freq_base", Value::F32(10000.0))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-6))
        // ggml dims, fastest first: (in, out) for matrices.
        .tensor("token_embd.weight", &[d, v], GgmlType::F32, bytes(&embd))
        .tensor("blk.0.attn_norm.weight", &[d], GgmlType::F32, fill(d, 1.0))
        .tensor("blk.0.attn_q.weight", &[d, d], GgmlType::F32, fill(d * d, 0.02))
        .tensor("blk.0.attn_k.weight", &[d, d], GgmlType::F32, fill(d * d, 0.02))
        .tensor("blk.0.attn_v.weight", &[d, d], GgmlType::F32, fill(d * d, 0.02))
        .tensor("blk.0.attn_output.weight", &[d, d], GgmlType::F32, fill(d * d, 0.0))
        .tensor("blk.0.ffn_norm.weight", &[d], GgmlType::F32, fill(d, 1.0))
        .tensor("blk.0.ffn_gate.weight", &[d, f], GgmlType::F32, fill(d * f, 0.02))
        .tensor("blk.0.ffn_up.weight", &[d, f], GgmlType::F32, fill(d * f, 0.02))
        .tensor("blk.0.ffn_down.weight", &[f, d], GgmlType::F32, fill(f * d, 0.0))
        .tensor("output_norm.weight", &[d], GgmlType::F32, fill(d, 1.0))
        .tensor("output.weight", &[d, v], GgmlType::F32, bytes(&output));
    let path = std::env::temp_dir().join(format!("fusebox-serve-harmony-{}.gguf", std::process::id()));
    std::fs::write(&path, w.to_bytes()).unwrap();
    (path, reply)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[test]
fn harmony_replies_split_into_content_and_reasoning_over_http() {
    let (path, reply) = scripted_model();
    let b = fusebox::create_backend("cpu:2").unwrap();
    let model = open::load(b.as_ref(), &path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let config = ServerConfig { port: 0, parallel: 2, ctx_size: Some(256), ..Default::default() };
    let server = Server::start(b, model, config).unwrap();
    let base = format!("http://{}", server.addr());
    let c = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 40});
    rt().block_on(async {
        // Whole: the analysis is the reasoning, the rest the answer; `<|end|>` did not stop it.
        let r = c.post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let v: Json = r.json().await.unwrap();
        let m = &v["choices"][0]["message"];
        assert_eq!(m["content"], ANSWER, "{v}");
        assert_eq!(m["reasoning_content"], REASONING, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(v["usage"]["completion_tokens"], reply.len(), "every scripted token, <|return|> last");

        // Streamed: the deltas add up to the same, and none carries structure text.
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let text = c.post(format!("{base}/v1/chat/completions")).json(&streamed).send().await.unwrap();
        let text = text.text().await.unwrap();
        let (mut content, mut reasoning, mut finish) = (String::new(), String::new(), Json::Null);
        for data in text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]") {
            assert!(!data.contains("<|"), "structure text in {data}");
            let chunk: Json = serde_json::from_str(data).unwrap();
            let choice = &chunk["choices"][0];
            content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            reasoning.push_str(choice["delta"]["reasoning_content"].as_str().unwrap_or(""));
            if !choice["finish_reason"].is_null() {
                finish = choice["finish_reason"].clone();
            }
        }
        assert_eq!((content.as_str(), reasoning.as_str(), finish), (ANSWER, REASONING, json!("stop")));

        // The reasoning of an earlier turn goes back through the template, which drops
        // it; the reply is the same.
        let multi = json!({"messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."},
            {"role": "user", "content": "Hi"}],
            "temperature": 0, "max_tokens": 40, "reasoning_effort": "low"});
        let v: Json =
            c.post(format!("{base}/v1/chat/completions")).json(&multi).send().await.unwrap().json().await.unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], ANSWER, "{v}");
    });
    server.shutdown().unwrap();
}
