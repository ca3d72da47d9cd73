//! The chat page (`assets/chat.html`, served at `/`) in a real headless chromium,
//! driven through chromedriver (WebDriver) by `fantoccini`: the model's name from
//! `/v1/models`, Shift+Enter a new line and Enter sends, a streamed answer that grows
//! over time and ends, a long answer stopped (the stream is cancelled, the page stays
//! usable and the server answers the next request), markup in a reply shown as text
//! (never run), the server's errors shown, the API key asked for after a 401 and then
//! sent, and no horizontal overflow on a phone-sized window. Screenshots are kept in
//! `target/test-artifacts/chat-page.png` (wide) and `chat-page-narrow.png`.
//!
//! The server: `fusebox serve --model SmolLM2 --port PORT`, the binary from
//! `FUSEBOX_BIN` or beside the test executable (`target/<profile>/fusebox`), the model
//! from `FUSEBOX_MODEL` (default `models/SmolLM2-135M-Instruct.Q4_1.gguf`).
//! `FUSEBOX_SERVE_CMD` replaces the whole command (`{port}` is substituted), which is
//! how `scripts/chat_page_browser_test.sh --peer llama-cpp` runs this test against
//! llama-cpp-python's server. The browser: `CHROME` (default the first of `chromium`,
//! `chromium-browser`, `google-chrome` on the PATH) and `CHROMEDRIVER` (default
//! `chromedriver`). Without the browser, its driver or the model the test skips,
//! printing why (`apt-get install -y chromium chromium-driver`,
//! `scripts/fetch-smollm2.sh`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

/// How long the server may take to load the model and answer `/v1/models`.
const SERVER_START: Duration = Duration::from_secs(180);
/// How long one streamed answer may take on a loaded CI machine.
const ANSWER: Duration = Duration::from_secs(180);

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The first of `names` found as an executable on the PATH (or a path given as is).
fn which(names: &[&str]) -> Option<PathBuf> {
    for name in names {
        let p = Path::new(name);
        if p.components().count() > 1 {
            if p.is_file() {
                return Some(p.to_path_buf());
            }
            continue;
        }
        let path = std::env::var_os("PATH")?;
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// A child process killed (and reaped) when the test ends, however it ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The status code of a plain HTTP/1.1 GET, or None when nothing answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").ok()?;
    let mut head = [0u8; 64];
    let n = stream.read(&mut head).ok()?;
    let line = String::from_utf8_lossy(&head[..n]);
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Waits until `port` answers `path` with 200, failing with the server's log if the
/// process exits or the time runs out.
fn wait_ready(child: &mut Reaped, port: u16, path: &str, limit: Duration, log: &Path) {
    let start = Instant::now();
    loop {
        if http_status(port, path) == Some(200) {
            return;
        }
        if let Ok(Some(status)) = child.0.try_wait() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            panic!("the server exited ({status}) before answering {path}; its log:\n{text}");
        }
        if start.elapsed() > limit {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            panic!("no 200 from 127.0.0.1:{port}{path} within {limit:?}; the log:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The server command line, or why the test cannot run.
fn server_command(port: u16) -> Result<Vec<String>, String> {
    if let Ok(cmd) = std::env::var("FUSEBOX_SERVE_CMD") {
        let words: Vec<String> = cmd.split_whitespace().map(|w| w.replace("{port}", &port.to_string())).collect();
        if words.is_empty() {
            return Err("FUSEBOX_SERVE_CMD is empty".into());
        }
        return Ok(words);
    }
    let model = std::env::var("FUSEBOX_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    if !model.is_file() {
        return Err(format!("{} not found (scripts/fetch-smollm2.sh fetches it)", model.display()));
    }
    let bin = match std::env::var("FUSEBOX_BIN") {
        Ok(b) => PathBuf::from(b),
        Err(_) => {
            let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
            // target/<profile>/deps/browser-HASH → target/<profile>/fusebox
            let dir = exe.parent().and_then(Path::parent).ok_or("no target directory")?;
            dir.join(format!("fusebox{}", std::env::consts::EXE_SUFFIX))
        }
    };
    if !bin.is_file() {
        return Err(format!(
            "{} not found (cargo build --profile test -p fusebox-cli, or set FUSEBOX_BIN)",
            bin.display()
        ));
    }
    Ok(vec![
        bin.display().to_string(),
        "serve".into(),
        "--model".into(),
        model.display().to_string(),
        "--port".into(),
        port.to_string(),
        "--threads".into(),
        "2".into(),
    ])
}

/// Runs a script in the page and returns its value.
async fn js(c: &Client, script: &str) -> Value {
    c.execute(script, vec![]).await.unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
}

async fn js_str(c: &Client, script: &str) -> String {
    match js(c, script).await {
        Value::String(s) => s,
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Polls `script` (a JS expression returning a boolean) until it is true.
async fn wait_for(c: &Client, what: &str, script: &str, limit: Duration) {
    let start = Instant::now();
    while js(c, &format!("return !!({script});")).await != Value::Bool(true) {
        if start.elapsed() > limit {
            let status = js_str(c, "return document.getElementById('status').textContent").await;
            panic!("timed out after {limit:?} waiting for {what} ({script}); status line: {status:?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn set_field(c: &Client, id: &str, value: &str) {
    c.execute("document.getElementById(arguments[0]).value = arguments[1];", vec![json!(id), json!(value)])
        .await
        .expect("set a settings field");
}

/// Types `text` into the prompt and presses Enter; returns when the page has finished
/// the reply (success, stop or error).
async fn send(c: &Client, text: &str) -> u64 {
    let before = js(c, "return Number(document.body.dataset.replies || 0);").await;
    let before = before.as_u64().unwrap_or(0);
    let prompt = c.find(Locator::Id("prompt")).await.expect("#prompt");
    prompt.send_keys(&format!("{text}{}", char::from(Key::Enter))).await.expect("type the prompt");
    before
}

async fn wait_reply(c: &Client, before: u64) {
    wait_for(c, "the reply to end", &format!("Number(document.body.dataset.replies || 0) > {before}"), ANSWER).await;
}

async fn save_screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("screenshot");
    let dir = workspace_root().join("target/test-artifacts");
    std::fs::create_dir_all(&dir).expect("create target/test-artifacts");
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, png).expect("write the screenshot");
    std::fs::rename(&tmp, &path).expect("rename the screenshot into place");
    println!("screenshot: {}", path.display());
}

/// Replaces `fetch` in the page for `v1/chat/completions` only: `spec.status` and
/// `spec.body` answer with an error, `spec.events` streams those SSE data strings (CRLF
/// line ends, a ping comment between, chunks cut mid-line), and with `spec.hang` the
/// stream stays open after them until the request is aborted (as `fetch` does, the
/// body then fails with an AbortError). The request's Authorization header is kept in
/// `window.__lastAuth`.
const STUB_FETCH: &str = r#"
const spec = arguments[0];
if (!window.__realFetch) window.__realFetch = window.fetch;
window.fetch = async function (url, init) {
  if (!String(url).includes("chat/completions")) return window.__realFetch(url, init);
  window.__lastAuth = (init && init.headers && init.headers["Authorization"]) || null;
  if (spec.status) {
    return new Response(spec.body, { status: spec.status, headers: { "Content-Type": "application/json" } });
  }
  let wire = ": ping\r\n\r\n";
  for (const d of spec.events) wire += "data: " + d + "\r\n\r\n";
  const bytes = new TextEncoder().encode(wire);
  const stream = new ReadableStream({
    start(ctl) {
      for (let i = 0; i < bytes.length; i += 7) ctl.enqueue(bytes.slice(i, i + 7));
      if (!spec.hang) { ctl.close(); return; }
      init.signal.addEventListener("abort", () => ctl.error(new DOMException("aborted", "AbortError")));
    }
  });
  return new Response(stream, { status: 200, headers: { "Content-Type": "text/event-stream" } });
};
"#;

fn chunk(content: &str, finish: Option<&str>) -> String {
    json!({
        "id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": "stub",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]
    })
    .to_string()
}

async fn assistant_text(c: &Client) -> String {
    js_str(
        c,
        "const m = document.querySelectorAll('#messages .msg.assistant .content');
         return m.length ? m[m.length - 1].textContent : '';",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_page_in_headless_chromium() {
    let Some(chrome) = which(
        &std::env::var("CHROME")
            .ok()
            .map(|s| vec![s])
            .unwrap_or_else(|| vec!["chromium".into(), "chromium-browser".into(), "google-chrome".into()])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    ) else {
        println!("skipping: no chromium (apt-get install -y chromium chromium-driver, or set CHROME)");
        return;
    };
    let driver_name = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
    let Some(driver) = which(&[driver_name.as_str()]) else {
        println!("skipping: no chromedriver (apt-get install -y chromium-driver, or set CHROMEDRIVER)");
        return;
    };
    let port = free_port();
    let cmd = match server_command(port) {
        Ok(cmd) => cmd,
        Err(why) => {
            println!("skipping: {why}");
            return;
        }
    };

    let artifacts = workspace_root().join("target/test-artifacts");
    std::fs::create_dir_all(&artifacts).expect("create target/test-artifacts");
    let server_log = artifacts.join("chat-page-server.log");
    let log = std::fs::File::create(&server_log).expect("server log");
    println!("server: {}", cmd.join(" "));
    let mut server = Reaped(
        Command::new(&cmd[0])
            .args(&cmd[1..])
            .current_dir(workspace_root())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", cmd[0])),
    );
    wait_ready(&mut server, port, "/v1/models", SERVER_START, &server_log);
    assert_eq!(http_status(port, "/"), Some(200), "GET / must serve the chat page");

    let driver_port = free_port();
    let driver_log = artifacts.join("chat-page-chromedriver.log");
    let mut chromedriver = Reaped(
        Command::new(&driver)
            .arg(format!("--port={driver_port}"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&driver_log).expect("driver log"))
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", driver.display())),
    );
    wait_ready(&mut chromedriver, driver_port, "/status", Duration::from_secs(30), &driver_log);

    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chrome.display().to_string(),
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1000,800", "--no-first-run", "--disable-extensions"]
        }),
    );
    let c = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{driver_port}"))
        .await
        .expect("a WebDriver session in headless chromium");

    let result = exercise_page(&c, port).await;
    if result.is_err() {
        save_screenshot(&c, "chat-page-failure.png").await;
    }
    let _ = c.close().await;
    drop(chromedriver);
    drop(server);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// Every check; a panic inside is caught so that the browser is closed and a screenshot
/// of the failure kept.
async fn exercise_page(c: &Client, port: u16) -> Result<(), Box<dyn std::any::Any + Send>> {
    use futures_like::CatchUnwind;
    CatchUnwind(Box::pin(checks(c, port))).await
}

async fn checks(c: &Client, port: u16) {
    c.goto(&format!("http://127.0.0.1:{port}/")).await.expect("open the chat page");

    // The model's name comes from /v1/models.
    wait_for(
        c,
        "the model name",
        "!['connecting…', ''].includes(document.getElementById('model-name').textContent)",
        Duration::from_secs(60),
    )
    .await;
    let model = js_str(c, "return document.getElementById('model-name').textContent").await;
    assert!(
        !["server unreachable", "model unknown", "no model listed", "API key needed"].contains(&model.as_str()),
        "the page could not read the model's name: {model:?}"
    );
    println!("model shown: {model}");

    // The labels name every field (accessibility).
    for id in ["prompt", "system", "temperature", "max-tokens", "api-key"] {
        let labelled = js(c, &format!("return document.querySelector('label[for=\"{id}\"]') !== null;")).await;
        assert_eq!(labelled, Value::Bool(true), "#{id} has no label");
    }

    // Shift+Enter is a new line, not a send.
    let prompt = c.find(Locator::Id("prompt")).await.expect("#prompt");
    prompt
        .send_keys(&format!(
            "line one{}{}{}line two",
            char::from(Key::Shift),
            char::from(Key::Enter),
            char::from(Key::Null)
        ))
        .await
        .expect("type two lines");
    let value = js_str(c, "return document.getElementById('prompt').value").await;
    assert_eq!(value, "line one\nline two", "Shift+Enter must insert a newline");
    let sent = js(c, "return document.querySelectorAll('#messages .msg').length;").await;
    assert_eq!(sent, json!(0), "Shift+Enter must not send");
    prompt.clear().await.expect("clear the prompt");

    // A streamed answer: record the reply's length at every change of its text.
    set_field(c, "temperature", "0").await;
    set_field(c, "max-tokens", "48").await;
    js(
        c,
        "window.__growth = [];
         new MutationObserver(() => {
           const m = document.querySelectorAll('#messages .msg.assistant .content');
           if (m.length) window.__growth.push([performance.now(), m[m.length - 1].textContent.length]);
         }).observe(document.getElementById('messages'), {subtree: true, characterData: true, childList: true});
         return null;",
    )
    .await;
    let before = send(c, "Write three sentences about the sea.").await;
    wait_for(
        c,
        "the streaming state",
        "document.body.dataset.state === 'streaming' || Number(document.body.dataset.replies || 0) > 0",
        Duration::from_secs(10),
    )
    .await;
    wait_reply(c, before).await;
    let answer = assistant_text(c).await;
    let growth = js(c, "return window.__growth;").await;
    let lengths: Vec<u64> = growth
        .as_array()
        .map(|a| a.iter().filter_map(|p| p.get(1).and_then(Value::as_u64)).collect())
        .unwrap_or_default();
    let distinct: std::collections::BTreeSet<u64> = lengths.iter().copied().filter(|&l| l > 0).collect();
    println!("answer ({} updates, {} distinct lengths): {answer:?}", lengths.len(), distinct.len());
    assert!(!answer.trim().is_empty(), "no answer text");
    assert!(distinct.len() >= 3, "the answer must appear piece by piece (lengths seen: {lengths:?})");
    assert!(lengths.windows(2).all(|w| w[0] <= w[1]), "the text only grows: {lengths:?}");
    let status = js_str(c, "return document.getElementById('status').textContent").await;
    assert!(status.starts_with("Done"), "status after the answer: {status:?}");
    assert_eq!(js_str(c, "return document.body.dataset.state").await, "idle");
    save_screenshot(c, "chat-page.png").await;

    // Stop a long answer: the text stops growing and the page stays usable.
    set_field(c, "max-tokens", "2000").await;
    let before = send(c, "Tell me a very long story about a dragon, a knight and a lost city.").await;
    wait_for(
        c,
        "the long answer to start",
        "(() => { const m = document.querySelectorAll('#messages .msg.assistant .content'); return m.length >= 2 && m[m.length - 1].textContent.length > 40; })()",
        ANSWER,
    )
    .await;
    let stop = c.find(Locator::Id("stop")).await.expect("#stop");
    stop.click().await.expect("click Stop");
    let clicked = Instant::now();
    wait_reply(c, before).await;
    assert!(clicked.elapsed() < Duration::from_secs(5), "Stop took {:?}", clicked.elapsed());
    let stopped_at = assistant_text(c).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(assistant_text(c).await, stopped_at, "the text must stop growing after Stop");
    let status = js_str(c, "return document.getElementById('status').textContent").await;
    assert_eq!(status, "Stopped.");
    let notes = js_str(
        c,
        "return Array.from(document.querySelectorAll('.msg.assistant .note')).map(n => n.textContent).join('|')",
    )
    .await;
    assert!(notes.contains("stopped"), "the stopped reply is marked: {notes:?}");
    assert_eq!(js(c, "return document.getElementById('send').disabled;").await, json!(false));
    assert_eq!(js(c, "return document.activeElement.id;").await, json!("prompt"));
    println!("stopped after {} characters", stopped_at.len());

    // The page and the server answer the next request (the stopped stream freed its slot).
    set_field(c, "max-tokens", "16").await;
    let asked = Instant::now();
    let before = send(c, "Say hello.").await;
    wait_reply(c, before).await;
    let status = js_str(c, "return document.getElementById('status').textContent").await;
    assert!(status.starts_with("Done"), "after Stop, the next request: {status:?}");
    assert!(!assistant_text(c).await.is_empty());
    println!("next answer after Stop in {:?}", asked.elapsed());

    // Markup in a reply (and in the user's own text) is shown as text, never run.
    let pieces = [
        "Here: <b>bo",
        "ld</b> <img src=x onerror=\"window.__pwned=1\">",
        " <script>window.__pwned=2</script>",
        " &amp; done",
    ];
    let mut events: Vec<String> = pieces.iter().map(|p| chunk(p, None)).collect();
    events.push(chunk("", Some("stop")));
    events.push("[DONE]".into());
    c.execute(STUB_FETCH, vec![json!({ "events": events })]).await.expect("stub fetch");
    let before = send(c, "<i>show me markup</i>").await;
    wait_reply(c, before).await;
    assert_eq!(assistant_text(c).await, pieces.concat(), "the reply is shown verbatim");
    let user = js_str(
        c,
        "const m = document.querySelectorAll('#messages .msg.user .content'); return m[m.length - 1].textContent;",
    )
    .await;
    assert_eq!(user, "<i>show me markup</i>");
    let injected =
        js(c, "return document.querySelectorAll('#messages b, #messages i, #messages img, #messages script').length;")
            .await;
    assert_eq!(injected, json!(0), "no element may come from message text");
    assert_eq!(js(c, "return window.__pwned === undefined;").await, json!(true), "message text ran as script");

    // Escape stops a reply too.
    c.execute(STUB_FETCH, vec![json!({ "events": [chunk("never", None), chunk(" ending", None)], "hang": true })])
        .await
        .expect("stub fetch");
    let before = send(c, "a reply that never ends").await;
    wait_for(c, "the endless reply", "document.body.dataset.state === 'streaming'", Duration::from_secs(10)).await;
    wait_for(
        c,
        "the endless reply's text",
        "(() => { const m = document.querySelectorAll('#messages .msg.assistant .content'); return m.length > 0 && m[m.length - 1].textContent === 'never ending'; })()",
        Duration::from_secs(10),
    )
    .await;
    c.find(Locator::Id("prompt"))
        .await
        .expect("#prompt")
        .send_keys(&char::from(Key::Escape).to_string())
        .await
        .expect("press Escape");
    wait_reply(c, before).await;
    assert_eq!(js_str(c, "return document.getElementById('status').textContent").await, "Stopped.");
    assert_eq!(js(c, "return document.getElementById('send').disabled;").await, json!(false));

    // The server's error message is shown.
    let error = "prompt is 9000 tokens, the context is 2048";
    let body = json!({"error": {"message": error, "type": "invalid_request_error", "param": "messages", "code": null}})
        .to_string();
    c.execute(STUB_FETCH, vec![json!({ "status": 400, "body": body })]).await.expect("stub fetch");
    let before = send(c, "too long").await;
    wait_reply(c, before).await;
    let shown = js_str(c, "const m = document.querySelectorAll('#messages .msg.error .content'); return m.length ? m[m.length - 1].textContent : '';").await;
    assert_eq!(shown, error);

    // A 401 reveals the API-key field and gives the text back; the key is then sent.
    assert_eq!(js(c, "return document.getElementById('api-key-field').hidden;").await, json!(true));
    let body = json!({"error": {"message": "invalid API key", "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}).to_string();
    c.execute(STUB_FETCH, vec![json!({ "status": 401, "body": body })]).await.expect("stub fetch");
    let before = send(c, "needs a key").await;
    wait_reply(c, before).await;
    assert_eq!(js(c, "return window.__lastAuth;").await, Value::Null, "no key before a 401");
    assert_eq!(js(c, "return document.getElementById('api-key-field').hidden;").await, json!(false));
    assert_eq!(js_str(c, "return document.getElementById('prompt').value").await, "needs a key");
    assert_eq!(js(c, "return document.activeElement.id;").await, json!("api-key"));
    c.find(Locator::Id("api-key")).await.expect("#api-key").send_keys("sekrit").await.expect("type the key");
    c.execute(STUB_FETCH, vec![json!({ "events": [chunk("ok", Some("stop")), "[DONE]"] })]).await.expect("stub fetch");
    let before = js(c, "return Number(document.body.dataset.replies || 0);").await.as_u64().unwrap_or(0);
    c.find(Locator::Id("send")).await.expect("#send").click().await.expect("click Send");
    wait_reply(c, before).await;
    assert_eq!(js(c, "return window.__lastAuth;").await, json!("Bearer sekrit"));
    assert_eq!(assistant_text(c).await, "ok");

    // A phone-sized window: nothing wider than the screen.
    js(c, "document.getElementById('settings').open = false; return null;").await;
    c.set_window_size(380, 740).await.expect("resize the window");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let overflow = js(c, "return document.documentElement.scrollWidth - document.documentElement.clientWidth;").await;
    assert!(overflow.as_i64().unwrap_or(1) <= 0, "horizontal overflow on a narrow window: {overflow}");
    save_screenshot(c, "chat-page-narrow.png").await;
}

/// `catch_unwind` for a future, without a dependency on `futures`.
mod futures_like {
    use std::any::Any;
    use std::future::Future;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::pin::Pin;
    use std::task::{Context, Poll};

    pub struct CatchUnwind<'a>(pub Pin<Box<dyn Future<Output = ()> + Send + 'a>>);

    impl Future for CatchUnwind<'_> {
        type Output = Result<(), Box<dyn Any + Send>>;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            match catch_unwind(AssertUnwindSafe(|| self.0.as_mut().poll(cx))) {
                Ok(Poll::Pending) => Poll::Pending,
                Ok(Poll::Ready(())) => Poll::Ready(Ok(())),
                Err(e) => Poll::Ready(Err(e)),
            }
        }
    }
}
