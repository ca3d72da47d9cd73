//! `fusebox serve`: an OpenAI-compatible HTTP server with continuous batching.
//!
//! Routes: `POST /v1/chat/completions` and `POST /v1/completions` (non-streamed, or
//! server-sent events ending with `data: [DONE]`; `n` choices, `logprobs`), `POST
//! /v1/embeddings`, llama-server's `POST /tokenize` and `POST /detokenize`, `GET
//! /v1/models`, `GET /health`, `GET /metrics` (Prometheus text) and the chat page at
//! `GET /`.
//!
//! The HTTP side (axum on tokio) validates and tokenizes a request, then hands it to
//! the model thread ([`engine`]), a plain std thread that owns the KV-cache slots and
//! runs every forward pass; tokens come back on a per-request channel. Nothing on the
//! async runtime ever waits for the model.
//!
//! ```no_run
//! let b = fusebox::create_backend("cpu")?;
//! let model = fusebox_models::open::load(b.as_ref(), "models/SmolLM2-135M-Instruct.Q4_1.gguf".as_ref())?;
//! let config = fusebox_serve::ServerConfig { port: 0, ..Default::default() };
//! let server = fusebox_serve::Server::start(b, model, config)?;
//! println!("listening on http://{}", server.addr());
//! server.shutdown()?;
//! # Ok::<(), fusebox::Error>(())
//! ```

mod answer;
pub mod embed;
pub mod engine;
pub mod logprobs;
pub mod metrics;
pub mod openai;
pub mod prefix;
pub mod reply;
mod routes;
pub mod structured;
pub mod tools;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use fusebox::{ComputeBackend, Error, Result};
use fusebox_models::chat::{OutputFormat, ToolCallFormat, ToolSupport};
use fusebox_models::pretrained::Pretrained;
use fusebox_models::sampler::SamplerExtras;
use fusebox_models::{Sampler, SamplerConfig};
use serde_json::json;
use tokio::sync::mpsc;

use answer::{Kind, Meta};
use engine::{EngineConfig, EventSink, Job, Msg};
use metrics::Metrics;
use openai::{ApiError, Params};

/// The chat page served at `/`.
pub const CHAT_PAGE: &str = include_str!("../assets/chat.html");

/// Largest request body accepted; more is answered 413.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// Server settings (the `fusebox serve` flags).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to bind (default 127.0.0.1: only this machine).
    pub host: String,
    /// Port (0: any free one; [`Server::addr`] says which).
    pub port: u16,
    /// Sequences generated together, each in its own KV-cache slot.
    pub parallel: usize,
    /// Positions of each slot's cache (`None`: min(2048, the model's context)).
    pub ctx_size: Option<usize>,
    /// Requests that may wait for a slot; more are answered 503 with `Retry-After`.
    pub queue: usize,
    /// Most prompt tokens read in one step between decode steps.
    pub prefill_chunk: usize,
    /// When set, `/v1/*`, `/tokenize`, `/detokenize` and `/metrics` need
    /// `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// The model's name in `/v1/models` (default: the file name without `.gguf`).
    pub model_id: Option<String>,
    /// After a shutdown signal, how long running answers may go on before they are
    /// ended with `finish_reason: "length"`.
    pub shutdown_grace: Duration,
    /// Element type of the KV caches: f32, or f16/bf16 (half the memory and the bytes a
    /// decode step reads per position; rounded as written, widened to f32 as read).
    pub cache_type: fusebox::DType,
    /// Bytes the prefix store may hold (`--cache-ram`, given in MiB there): keys and
    /// values (and hybrid models' states) of prompt prefixes reused by later requests.
    /// 0 turns prefix caching off altogether, the reuse of a slot's previous sequence
    /// included; the default here is 0, `fusebox serve`'s is 256 MiB.
    pub cache_ram: usize,
    /// Tokens per block of the prefix store (a prompt's prefix is stored and found in
    /// whole blocks; 256 by default).
    pub cache_block: usize,
    /// Speculative decoding of a lone generating sequence (`--draft-model`,
    /// `--draft-ngram`; `None`, the default: off).
    pub draft: Option<engine::DraftConfig>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            parallel: 4,
            ctx_size: None,
            queue: 64,
            prefill_chunk: 256,
            api_key: None,
            model_id: None,
            shutdown_grace: Duration::from_secs(2),
            cache_type: fusebox::DType::F32,
            cache_ram: 0,
            cache_block: 256,
            draft: None,
        }
    }
}

/// Default per-slot context when `ctx_size` is not given.
const DEFAULT_CTX: usize = 2048;

struct AppState {
    model: Arc<Pretrained>,
    /// How the chat template's replies divide into answer, reasoning and tool calls.
    format: OutputFormat,
    model_id: String,
    ctx_size: usize,
    queue: usize,
    api_key: Option<String>,
    to_engine: Mutex<Sender<Msg>>,
    metrics: Arc<Metrics>,
    created: u64,
    /// Compiles `response_format` and `grammar` constraints.
    structured: structured::Structured,
}

/// A running server: its address, and the handle that stops it.
pub struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Server {
    /// Loads nothing: takes a loaded model, starts the model thread and the HTTP server
    /// on its own runtime thread, and returns once it listens.
    pub fn start(backend: Arc<dyn ComputeBackend>, model: Pretrained, config: ServerConfig) -> Result<Server> {
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        Server::start_with(backend, model, config, async move {
            let _ = stop_rx.await;
        })
        .map(|mut s| {
            s.stop = Some(stop_tx);
            s
        })
    }

    /// As [`start`](Self::start), stopping when `signal` completes (as well as on
    /// [`shutdown`](Self::shutdown)).
    pub fn start_with(
        backend: Arc<dyn ComputeBackend>,
        model: Pretrained,
        config: ServerConfig,
        signal: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<Server> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name("fusebox-http")
            .build()
            .map_err(|e| Error::Io(format!("serve: starting the async runtime: {e}")))?;
        let (app, to_engine, engine, engine_ended) = build(backend, model, &config)?;
        let listener = rt
            .block_on(tokio::net::TcpListener::bind((config.host.as_str(), config.port)))
            .map_err(|e| Error::Io(format!("serve: binding {}:{}: {e}", config.host, config.port)))?;
        let addr = listener.local_addr().map_err(|e| Error::Io(format!("serve: local address: {e}")))?;
        let grace = config.shutdown_grace;
        let thread = std::thread::Builder::new()
            .name("fusebox-serve".into())
            .spawn(move || -> Result<()> {
                rt.block_on(async move {
                    let stopping = async move {
                        // The signal, or the model thread's end (an error it could not
                        // recover from: a split model's rank failed).
                        tokio::select! {
                            _ = signal => {}
                            _ = engine_ended => {}
                        }
                        // Refuse what waits, end what runs after the grace period.
                        let _ = to_engine.send(Msg::Shutdown { grace });
                    };
                    let served = axum::serve(listener, app).with_graceful_shutdown(stopping);
                    // Streams end within `grace` once the engine ends them; the margin
                    // covers clients that stop reading.
                    served.await.map_err(|e| Error::Io(format!("serve: {e}")))
                })?;
                rt.shutdown_timeout(Duration::from_secs(1));
                engine.join().map_err(|_| Error::Io("serve: the model thread panicked".into()))?
            })
            .map_err(|e| Error::Io(format!("serve: starting the server thread: {e}")))?;
        Ok(Server { addr, stop: None, thread: Some(thread) })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets running answers finish within the grace period, and
    /// waits for the server to end.
    pub fn shutdown(mut self) -> Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.wait()
    }

    /// Waits until the server ends (after its signal).
    pub fn wait(mut self) -> Result<()> {
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| Error::Io("serve: the server thread panicked".into()))?,
            None => Ok(()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

type Built = (Router, Sender<Msg>, std::thread::JoinHandle<Result<()>>, tokio::sync::oneshot::Receiver<()>);

/// The router and the model thread.
fn build(backend: Arc<dyn ComputeBackend>, model: Pretrained, config: &ServerConfig) -> Result<Built> {
    const OP: &str = "serve";
    if config.parallel == 0 {
        return Err(Error::value(OP, "--parallel", "at least 1", 0));
    }
    if config.prefill_chunk == 0 {
        return Err(Error::value(OP, "--prefill-chunk", "at least 1", 0));
    }
    if config.cache_block == 0 {
        return Err(Error::value(OP, "cache block", "at least 1 token", 0));
    }
    let ctx_size = config.ctx_size.unwrap_or_else(|| DEFAULT_CTX.min(model.context_length()));
    if ctx_size == 0 || ctx_size > model.context_length() {
        return Err(Error::value(
            OP,
            "--ctx-size",
            format!("1..={} (the model's context length)", model.context_length()),
            ctx_size,
        ));
    }
    // The chat endpoint needs a template; refuse at start rather than on every request.
    let format = OutputFormat::detect(model.chat_template()?, &model.tokenizer);
    let model_id = config.model_id.clone().unwrap_or_else(|| {
        let name = model.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
        name.strip_suffix(".gguf").map(str::to_string).unwrap_or(name)
    });
    let model = Arc::new(model);
    let sample_vocab = model.tokenizer.vocab_size().clamp(1, model.network.arch.vocab_size);
    let structured = structured::Structured::new(model.clone(), sample_vocab);
    let metrics = Arc::new(Metrics::default());
    metrics.slots_total.store(config.parallel, Ordering::Relaxed);
    let (tx, rx) = std::sync::mpsc::channel();
    let engine_config = EngineConfig {
        parallel: config.parallel,
        ctx_size,
        prefill_chunk: config.prefill_chunk,
        cache_type: config.cache_type,
        cache_ram: config.cache_ram,
        cache_block: config.cache_block,
        draft: config.draft.clone(),
    };
    // The caches are allocated on the model thread; report a failure before listening.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
    let (m, mm) = (model.clone(), metrics.clone());
    let (ended_tx, ended_rx) = tokio::sync::oneshot::channel::<()>();
    let engine = std::thread::Builder::new()
        .name("fusebox-model".into())
        .spawn(move || {
            let result = engine::run(backend, m, engine_config, rx, mm, ready_tx);
            let _ = ended_tx.send(());
            result
        })
        .map_err(|e| Error::Io(format!("serve: starting the model thread: {e}")))?;
    match ready_rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            return Err(engine
                .join()
                .ok()
                .and_then(|r| r.err())
                .unwrap_or_else(|| Error::Io("serve: the model thread ended".into())))
        }
    }
    let state = Arc::new(AppState {
        model,
        format,
        model_id,
        ctx_size,
        queue: config.queue,
        api_key: config.api_key.clone(),
        to_engine: Mutex::new(tx.clone()),
        metrics,
        created: now(),
        structured,
    });
    let app = Router::new()
        .route("/", get(|| async { Html(CHAT_PAGE) }))
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/metrics", get(metrics_route))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(routes::embeddings))
        .route("/tokenize", post(routes::tokenize))
        .route("/detokenize", post(routes::detokenize))
        .fallback(|| async { ApiError { status: StatusCode::NOT_FOUND, ..ApiError::invalid(None, "no such route") } })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(MAX_BODY_BYTES))
        .with_state(state);
    Ok((app, tx, engine, ended_rx))
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn authorize(state: &AppState, headers: &HeaderMap) -> std::result::Result<(), ApiError> {
    let Some(key) = &state.api_key else { return Ok(()) };
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .unwrap_or("");
    // Compared in time independent of where the first difference is.
    let same = given.len() == key.len() && given.bytes().zip(key.bytes()).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0;
    if same {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}

async fn metrics_route(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&state, &headers) {
        return e.into_response();
    }
    ([("content-type", "text/plain; version=0.0.4")], state.metrics.render()).into_response()
}

async fn models(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&state, &headers) {
        return e.into_response();
    }
    Json(json!({
        "object": "list",
        "data": [{"id": state.model_id, "object": "model", "created": state.created, "owned_by": "fusebox",
                  "meta": {"n_ctx": state.ctx_size, "n_vocab": state.model.tokenizer.vocab_size()}}],
    }))
    .into_response()
}

async fn chat_completions(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    state.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let r = async {
        authorize(&state, &headers)?;
        let req = openai::chat_request(&body)?;
        // Rendering and tokenizing up to a megabyte of text is CPU work: off the runtime.
        let (st, messages, mut kwargs, offered) = (state.clone(), req.messages, req.template_kwargs, req.tools.clone());
        let (prompt, support) = tokio::task::spawn_blocking(move || {
            let template = st.model.chat_template().map_err(|e| ApiError::internal(e.to_string()))?;
            let harmony = matches!(st.format, OutputFormat::Harmony(_));
            let support = ToolSupport::detect(template);
            let (msgs, tool_vars) = tools::template_messages(&messages, &offered, support, harmony);
            kwargs.extend(tool_vars);
            let text = template.render(&msgs, true, &kwargs).map_err(|e| {
                ApiError::invalid(Some("messages"), format!("the model's chat template refused them: {e}"))
            })?;
            Ok::<_, ApiError>((template.encode(&st.model.tokenizer, &text), support))
        })
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))??;
        let (format, mut params) = (state.format, req.params);
        let format = match format {
            OutputFormat::Plain if !req.tools.is_empty() && req.tool_choice.parses() => {
                tools::reply_format(support.format, &state.model.tokenizer)
            }
            other => other,
        };
        if req.tool_choice.constrains() {
            let only = match &req.tool_choice {
                tools::ToolChoice::Named(n) => Some(n.as_str()),
                _ => None,
            };
            let lark = tools::call_grammar(support.format, &req.tools, only, &state.model.tokenizer);
            params.constraint = Some(("tool_choice", structured::Constraint::Grammar(lark)));
        }
        submit(&state, Kind::Chat, prompt, params, "messages", format).await
    }
    .await;
    r.unwrap_or_else(|e| {
        state.metrics.rejected.fetch_add(1, Ordering::Relaxed);
        e.into_response()
    })
}

async fn completions(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    state.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let r = async {
        authorize(&state, &headers)?;
        let req = openai::completion_request(&body)?;
        let (st, text) = (state.clone(), req.prompt);
        let mut prompt = tokio::task::spawn_blocking(move || {
            let tok = &st.model.tokenizer;
            tok.encode(&text, tok.add_bos_default())
        })
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))?;
        if prompt.is_empty() {
            // An empty prompt starts from BOS (or EOS, GPT-2's document start).
            let tok = &state.model.tokenizer;
            prompt.extend(tok.bos_id().or(tok.eos_id()));
        }
        if prompt.is_empty() {
            return Err(ApiError::invalid(
                Some("prompt"),
                "'prompt' is empty and the tokenizer has no BOS to start from",
            ));
        }
        submit(&state, Kind::Completion, prompt, req.params, "prompt", OutputFormat::Plain).await
    }
    .await;
    r.unwrap_or_else(|e| {
        state.metrics.rejected.fetch_add(1, Ordering::Relaxed);
        e.into_response()
    })
}

/// Checks the model and the prompt's length, queues a job per choice and answers them.
async fn submit(
    state: &Arc<AppState>,
    kind: Kind,
    prompt: Vec<u32>,
    p: Params,
    prompt_param: &str,
    format: OutputFormat,
) -> std::result::Result<Response, ApiError> {
    check_model(state, &p.model)?;
    if prompt.len() > state.ctx_size {
        return Err(ApiError::invalid(
            Some(prompt_param),
            format!(
                "This model's maximum context length is {} tokens (--ctx-size). However, your {} resulted in {} tokens.",
                state.ctx_size,
                if kind == Kind::Chat { "messages" } else { "prompt" },
                prompt.len()
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let seed =
        p.seed.unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64));
    let extras =
        SamplerExtras { min_p: p.min_p, presence_penalty: p.presence_penalty, frequency_penalty: p.frequency_penalty };
    let guide = match &p.constraint {
        None => None,
        Some((param, _)) if kind == Kind::Chat && matches!(state.format, OutputFormat::Harmony(_)) => {
            return Err(ApiError::invalid(
                Some(param),
                format!("'{param}' is not supported with this model's harmony reply format (its channels are outside any schema)"),
            ));
        }
        Some((param, c)) => {
            let (st, c) = (state.clone(), c.clone());
            let param = *param;
            // Compiling a schema or grammar is CPU work: off the runtime.
            let compiled = tokio::task::spawn_blocking(move || st.structured.compile(&c))
                .await
                .map_err(|e| ApiError::internal(format!("compiling the constraint failed: {e}")))?;
            let what = match param {
                "grammar" => "grammar",
                // The call grammar is ours; what can be wrong is a function's schema.
                "tool_choice" => "tools' parameter schemas",
                _ => "JSON schema",
            };
            let param = if param == "tool_choice" { "tools" } else { param };
            Some(compiled.map_err(|e| {
                ApiError::invalid(Some(param), format!("The {what} cannot be used: {e}"))
                    .with_code(if param == "grammar" { "invalid_grammar" } else { "invalid_json_schema" })
            })?)
        }
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let mut jobs = Vec::with_capacity(p.n);
    for choice in 0..p.n {
        let config = SamplerConfig {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            repetition_penalty: p.repetition_penalty,
            seed: choice_seed(seed, choice),
        };
        let sampler =
            Sampler::with_extras(config, extras.clone()).map_err(|e| ApiError::invalid(None, e.to_string()))?;
        jobs.push(Job {
            prompt: prompt.clone(),
            max_tokens: p.max_tokens.unwrap_or(usize::MAX),
            sampler,
            stop_ids: match kind {
                Kind::Chat => state.format.stop_ids(state.model.stop_ids(true)),
                Kind::Completion => state.model.stop_ids(false),
            },
            stop_strings: p.stop.clone(),
            format,
            logprobs: p.logprobs,
            guide: None,
            events: EventSink::new(choice, tx.clone()),
        });
    }
    drop(tx);
    // The last choice takes the compiled guide itself, the others a fork each.
    if let Some(g) = guide {
        let n = jobs.len();
        for job in &mut jobs[..n - 1] {
            job.guide = Some(Box::new(g.fork().ok_or_else(|| ApiError::internal("copying the constraint failed"))?));
        }
        jobs[n - 1].guide = Some(Box::new(g));
    }
    // Bounded queue: count first, give back on refusal.
    let n = jobs.len();
    let m = &state.metrics;
    let depth = m.queue_depth.fetch_add(n, Ordering::Relaxed);
    let busy = m.slots_busy.load(Ordering::Relaxed);
    let slots = m.slots_total.load(Ordering::Relaxed);
    if depth + busy + n > slots + state.queue {
        m.queue_depth.fetch_sub(n, Ordering::Relaxed);
        return Err(ApiError::unavailable(format!(
            "All {slots} slots are busy and {depth} requests are waiting (the queue's limit): retry later",
        )));
    }
    let mut sent = 0;
    if let Ok(t) = state.to_engine.lock() {
        for job in jobs {
            if t.send(Msg::Job(job)).is_err() {
                break;
            }
            sent += 1;
        }
    }
    if sent < n {
        // The model thread counts down the ones it got (it is stopping).
        m.queue_depth.fetch_sub(n - sent, Ordering::Relaxed);
        return Err(ApiError::unavailable("the model thread has stopped"));
    }
    m.prompt_tokens.fetch_add(prompt.len() as u64, Ordering::Relaxed);
    m.choices.fetch_add(n as u64, Ordering::Relaxed);
    let count = |c: &std::sync::atomic::AtomicU64, on: bool| {
        if on {
            c.fetch_add(1, Ordering::Relaxed);
        }
    };
    count(&m.logprobs_requests, p.logprobs.is_some());
    count(&m.multi_choice_requests, n > 1);
    count(&m.stop_string_requests, !p.stop.is_empty());
    count(&m.structured_requests, p.constraint.is_some());
    let penalized =
        p.min_p != 0.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 || p.repetition_penalty != 1.0;
    count(&m.penalty_requests, penalized);
    let id = format!("{}-{:x}", if kind == Kind::Chat { "chatcmpl" } else { "cmpl" }, rand_id());
    // Mistral's template takes back only ids of 9 letters and digits.
    let short_call_ids = matches!(format, OutputFormat::ToolCalls { calls: ToolCallFormat::Mistral, .. });
    let meta = Meta {
        id,
        created: now(),
        model: state.model_id.clone(),
        kind,
        choices: n,
        logprobs: p.logprobs.is_some(),
        short_call_ids,
    };
    if p.stream {
        Ok(answer::stream(meta, rx, p.include_usage))
    } else {
        answer::whole(meta, rx).await
    }
}

/// A request's `model`, when given, must name the model served (its alias or file name).
fn check_model(state: &AppState, model: &Option<String>) -> std::result::Result<(), ApiError> {
    let Some(m) = model else { return Ok(()) };
    let file = state.model.path.file_name().map(|n| n.to_string_lossy().into_owned());
    if *m != state.model_id && Some(m) != file.as_ref() {
        return Err(ApiError::invalid(
            Some("model"),
            format!("The model '{m}' does not exist: this server serves '{}'", state.model_id),
        )
        .with_code("model_not_found"));
    }
    Ok(())
}

/// The seed of choice `choice`: the request's own for the first (so `n = 1` samples as
/// it always did), a SplitMix64 finalizer of it and the index for the others (seeds one
/// apart would give the same stream one step apart).
fn choice_seed(seed: u64, choice: usize) -> u64 {
    if choice == 0 {
        return seed;
    }
    let mut z = seed ^ (choice as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(now());
    h.finish()
}

/// Completes on SIGTERM or SIGINT (Ctrl-C): the signal for [`Server::start_with`].
pub async fn termination() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            // Without signal handlers the server runs until the process is killed.
            _ => std::future::pending::<()>().await,
        }
    }
    #[cfg(not(unix))]
    {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
