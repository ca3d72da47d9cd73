//! Tokens/s of `fusebox serve` with and without a structured-output constraint.
//!
//! Starts the server in-process on loopback and sends, in alternating rounds, the same
//! streamed completion requests plain and under `response_format: json_schema` (a
//! schema whose long string field, `minLength` 2000, makes the answer run to
//! `max_tokens`, as the plain one does), `clients` at a time over plain HTTP/1.1. Prints
//! each side's decode tokens/s (tokens after the first per second from the first
//! streamed token to the end, summed over the clients; median over the rounds), the
//! overhead, and the model thread's time spent on constraints
//! (`fusebox_constraint_seconds_total`).
//!
//! ```sh
//! cargo run --release -p fusebox-bench --bin structured_overhead -- models/SmolLM2-135M-Instruct.Q4_1.gguf 1 5
//! cargo run --release -p fusebox-bench --bin structured_overhead -- models/SmolLM2-135M-Instruct.Q4_1.gguf 4 5
//! ```
//! Arguments: model, clients (default 1), rounds (default 5), max_tokens (default 128).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use fusebox_serve::{Server, ServerConfig};
use serde_json::{json, Value};

/// One HTTP/1.1 exchange; the response body.
fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("receive");
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

/// One streamed completion: its completion tokens and the seconds from its first
/// streamed token to its end (the decode, without the prompt's prefill).
fn streamed(addr: SocketAddr, body: &str) -> (u64, f64) {
    let mut s = TcpStream::connect(addr).expect("connect");
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("send");
    let (mut all, mut buf, mut first) = (Vec::new(), [0u8; 4096], None);
    loop {
        let n = s.read(&mut buf).expect("receive");
        if n == 0 {
            break;
        }
        all.extend_from_slice(&buf[..n]);
        if first.is_none() && all.windows(6).any(|w| w == b"data: ") {
            first = Some(Instant::now());
        }
    }
    let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
    let text = String::from_utf8_lossy(&all);
    let tokens = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| v["usage"]["completion_tokens"].as_u64())
        .unwrap_or_else(|| panic!("no usage in {text}"));
    (tokens, secs)
}

/// Sends `bodies` at once; returns completion tokens and the summed decode rates
/// (tokens after the first per second of decode, over the clients).
fn round(addr: SocketAddr, bodies: &[Value]) -> (u64, f64) {
    let handles: Vec<_> = bodies
        .iter()
        .map(|b| {
            let b = b.to_string();
            std::thread::spawn(move || streamed(addr, &b))
        })
        .collect();
    let mut tokens = 0;
    let mut rate = 0.0;
    for h in handles {
        let (t, secs) = h.join().expect("client");
        tokens += t;
        rate += t.saturating_sub(1) as f64 / secs.max(1e-9);
    }
    (tokens, rate)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn metric(addr: SocketAddr, name: &str) -> f64 {
    http(addr, "GET", "/metrics", "")
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

fn main() -> fusebox::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let model_path = args.get(1).map(String::as_str).unwrap_or("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let clients: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1);
    let rounds: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(5);
    let max_tokens: usize = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(128);
    let b = fusebox::create_backend("cpu")?;
    let model = fusebox_models::open::load(b.as_ref(), model_path.as_ref())?;
    let config = ServerConfig { port: 0, parallel: clients.max(1), ..Default::default() };
    let server = Server::start(b, model, config)?;
    let addr = server.addr();
    let schema = json!({
        "type": "object",
        "properties": {"title": {"type": "string", "maxLength": 60}, "story": {"type": "string", "minLength": 2000}},
        "required": ["title", "story"], "additionalProperties": false
    });
    let prompts =
        ["A long story about a lighthouse keeper, as JSON:\n", "A long tale of a dragon and a baker, as JSON:\n"];
    let body = |i: usize, constrained: bool| {
        let mut b = json!({"prompt": prompts[i % prompts.len()], "temperature": 0, "max_tokens": max_tokens,
                           "stream": true, "stream_options": {"include_usage": true}});
        if constrained {
            b["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "story", "schema": schema}});
        }
        b
    };
    let plain: Vec<Value> = (0..clients).map(|i| body(i, false)).collect();
    let guided: Vec<Value> = (0..clients).map(|i| body(i, true)).collect();
    // Warm-up: the vocabulary trie is built at the first constrained request.
    round(addr, &plain);
    round(addr, &guided);
    let before = metric(addr, "fusebox_constraint_seconds_total");
    let (mut rate_plain, mut rate_guided) = (Vec::new(), Vec::new());
    let (mut guided_tokens, mut plain_tokens) = (0u64, 0u64);
    let start = Instant::now();
    for _ in 0..rounds {
        let (t, r) = round(addr, &plain);
        rate_plain.push(r);
        plain_tokens += t;
        let (t, r) = round(addr, &guided);
        rate_guided.push(r);
        guided_tokens += t;
    }
    let wall = start.elapsed().as_secs_f64();
    let spent = metric(addr, "fusebox_constraint_seconds_total") - before;
    let (p, g) = (median(rate_plain), median(rate_guided));
    println!("clients {clients}, rounds {rounds}, max_tokens {max_tokens}, model {model_path}");
    println!("plain          {p:8.1} tokens/s decode ({plain_tokens} tokens)");
    println!("json_schema    {g:8.1} tokens/s decode ({guided_tokens} tokens)");
    println!("overhead       {:8.1} % fewer tokens/s", (1.0 - g / p) * 100.0);
    println!(
        "constraint time on the model thread: {:.1} ms over {guided_tokens} tokens ({:.3} ms/token; the run took {wall:.1} s)",
        spent * 1e3,
        spent * 1e3 / guided_tokens.max(1) as f64,
    );
    server.shutdown()
}
