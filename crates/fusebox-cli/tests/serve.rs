//! `fusebox serve` as a process: it prints the address it listens on (port 0 picks a
//! free one), its greedy chat reply equals `fusebox generate --chat --temperature 0`,
//! and SIGTERM stops it within seconds with exit status 0, a running stream ending
//! with `data: [DONE]`. Skips, saying why, without
//! models/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch-smollm2.sh fetches it).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fusebox"))
}

fn smollm2() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipping: {} is missing (scripts/fetch-smollm2.sh fetches it)", p.display());
        None
    }
}

/// One HTTP/1.1 request with `Connection: close`; the status and the body.
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

#[test]
fn serve_answers_like_generate_and_stops_on_sigterm() {
    let Some(model) = smollm2() else { return };
    let prompt = "Give me a short tip for learning to cook.";
    let gen = Command::new(bin())
        .arg("generate")
        .arg("--model")
        .arg(&model)
        .args(["--chat", "--temperature", "0", "--max-tokens", "32", "--json", "--threads", "2", "--prompt", prompt])
        .output()
        .unwrap();
    assert!(gen.status.success(), "{}", String::from_utf8_lossy(&gen.stderr));
    let want: Value = serde_json::from_slice(&gen.stdout).unwrap();

    let mut child = Command::new(bin())
        .arg("serve")
        .arg("--model")
        .arg(&model)
        .args(["--port", "0", "--parallel", "2", "--threads", "2"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "serve ended before listening");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    let body = json!({"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 32});
    let (status, text) = http(&addr, "POST", "/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], want["text"], "{v}\nvs generate: {want}");
    assert_eq!(v["usage"]["completion_tokens"], want["generated_tokens"]);

    // A long stream is running when SIGTERM comes: it ends within the grace period
    // (default 2 s) with [DONE], and the process exits 0.
    let long = json!({"messages": [{"role": "user", "content": "Write a very long story."}], "temperature": 0,
                      "max_tokens": 2000, "stream": true});
    let a = addr.clone();
    let reader = std::thread::spawn(move || http(&a, "POST", "/v1/chat/completions", &long.to_string()));
    std::thread::sleep(Duration::from_millis(800));
    let t = Instant::now();
    let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "serve still running 10 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status}");
    let (code, stream) = reader.join().unwrap();
    assert_eq!(code, 200);
    assert!(stream.contains("data: [DONE]"), "{stream}");
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("stopped"), "{rest}");
    // Nothing listens any more.
    assert!(TcpStream::connect(&addr).is_err());
}
