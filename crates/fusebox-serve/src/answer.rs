//! A completion request's answer from the model thread's events: one JSON body, or
//! server-sent events. A request for `n` choices receives the events of its `n` jobs on
//! one channel, each tagged with its choice's index.

use std::convert::Infallible;

use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::engine::{Event, Finish};
use crate::logprobs::{chat_json, completion_json, Placed};
use crate::openai::ApiError;

/// Which endpoint a job answers: the object names and the choice layout differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Chat,
    Completion,
}

/// What every chunk or body names, and what the request asked for.
#[derive(Debug, Clone)]
pub(crate) struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub kind: Kind,
    /// Choices (`n`).
    pub choices: usize,
    /// Whether choices carry `logprobs`.
    pub logprobs: bool,
    /// Tool call ids of 9 letters and digits (Mistral's templates refuse others)
    /// rather than `call_` and 24.
    pub short_call_ids: bool,
}

/// A receiver of `(choice, event)`.
pub(crate) type Events = mpsc::UnboundedReceiver<(usize, Event)>;

/// OpenAI's `usage`, with `prompt_tokens_details.cached_tokens`.
fn usage(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Value {
    json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens,
           "prompt_tokens_details": {"cached_tokens": cached_tokens}})
}

/// The tokens counted over the choices that ended: the prompt once (the choices share
/// it, as OpenAI counts), the completions summed.
#[derive(Debug, Default)]
struct Counts {
    prompt: usize,
    completion: usize,
    cached: usize,
}

impl Counts {
    fn add(&mut self, prompt: usize, completion: usize, cached: usize) {
        self.prompt = prompt;
        self.completion += completion;
        self.cached = cached;
    }

    fn usage(&self) -> Value {
        usage(self.prompt, self.completion, self.cached)
    }
}

/// A choice's `logprobs` in the endpoint's shape (`null` when not asked for).
fn logprobs_json(meta: &Meta, tokens: &[Placed]) -> Value {
    match (meta.logprobs, meta.kind) {
        (false, _) => Value::Null,
        (true, Kind::Chat) => chat_json(tokens),
        (true, Kind::Completion) => completion_json(tokens),
    }
}

/// An OpenAI `tool_calls` entry; `index` is its place in the choice's calls. Its id is
/// letters and digits drawn from the request's id, the choice and the index.
fn tool_call_json(meta: &Meta, choice: usize, index: usize, name: &str, arguments: &str) -> Value {
    use std::hash::{Hash, Hasher};
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let (prefix, len) = if meta.short_call_ids { ("", 9) } else { ("call_", 24) };
    let mut id = String::from(prefix);
    let mut round = 0u64;
    while id.len() < prefix.len() + len {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&meta.id, choice, index, round).hash(&mut h);
        let mut x = h.finish();
        // Ten base-62 digits of each 64-bit hash.
        for _ in 0..10 {
            if id.len() < prefix.len() + len {
                id.push(ALPHABET[(x % 62) as usize] as char);
            }
            x /= 62;
        }
        round += 1;
    }
    json!({"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
}

/// A reply that made calls and then ended on its own ends with `tool_calls`.
fn finish_with_calls(finish: Finish, calls: usize) -> Finish {
    if calls > 0 && finish == Finish::Stop {
        Finish::ToolCalls
    } else {
        finish
    }
}

/// One choice of the whole answer, as its events add up.
#[derive(Debug, Default)]
struct Choice {
    text: String,
    reasoning: String,
    calls: Vec<Value>,
    logprobs: Vec<Placed>,
    finish: Option<Finish>,
}

impl Choice {
    fn json(&mut self, meta: &Meta, index: usize) -> Value {
        let finish = self.finish.map(Finish::as_str);
        let logprobs = logprobs_json(meta, &self.logprobs);
        match meta.kind {
            Kind::Chat => {
                let mut message = json!({"role": "assistant", "content": self.text});
                if !self.reasoning.is_empty() {
                    message["reasoning_content"] = json!(self.reasoning);
                }
                if !self.calls.is_empty() {
                    if self.text.is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = Value::Array(std::mem::take(&mut self.calls));
                }
                json!({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish})
            }
            Kind::Completion => {
                json!({"index": index, "text": self.text, "logprobs": logprobs, "finish_reason": finish})
            }
        }
    }
}

/// The non-streamed answer: waits for every choice's end (dropping the future, as a
/// disconnect does, closes the channel and cancels the jobs).
pub(crate) async fn whole(meta: Meta, mut rx: Events) -> Result<Response, ApiError> {
    let mut choices: Vec<Choice> = (0..meta.choices).map(|_| Choice::default()).collect();
    let mut counts = Counts::default();
    let mut open = meta.choices;
    while open > 0 {
        let Some((i, ev)) = rx.recv().await else {
            return Err(ApiError::internal("the model thread ended the request without an answer"));
        };
        let Some(c) = choices.get_mut(i) else { continue };
        match ev {
            Event::Text { text, logprobs } => {
                c.text.push_str(&text);
                c.logprobs.extend(logprobs);
            }
            Event::Reasoning(t) => c.reasoning.push_str(&t),
            Event::ToolCall { name, arguments } => {
                let call = tool_call_json(&meta, i, c.calls.len(), &name, &arguments);
                c.calls.push(call);
            }
            Event::Error(e) => return Err(e),
            Event::Done { finish, prompt_tokens, completion_tokens, cached_tokens } => {
                if c.finish.is_none() {
                    open -= 1;
                }
                c.finish = Some(finish_with_calls(finish, c.calls.len()));
                counts.add(prompt_tokens, completion_tokens, cached_tokens);
            }
        }
    }
    let choices: Vec<Value> = choices.iter_mut().enumerate().map(|(i, c)| c.json(&meta, i)).collect();
    let object = if meta.kind == Kind::Chat { "chat.completion" } else { "text_completion" };
    Ok(Json(json!({
        "id": meta.id, "object": object, "created": meta.created, "model": meta.model,
        "choices": choices, "usage": counts.usage(), "system_fingerprint": "fusebox",
    }))
    .into_response())
}

fn chunk(meta: &Meta, index: usize, delta: Value, logprobs: Value, finish: Option<Finish>) -> Value {
    let finish = finish.map(Finish::as_str);
    let choice = match meta.kind {
        Kind::Chat => json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}),
        Kind::Completion => json!({"index": index, "text": delta.get("content").cloned().unwrap_or(json!("")),
                                   "logprobs": logprobs, "finish_reason": finish}),
    };
    let object = if meta.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
    json!({"id": meta.id, "object": object, "created": meta.created, "model": meta.model,
           "system_fingerprint": "fusebox", "choices": [choice]})
}

/// The streamed answer: `data: {chunk}` events (each about one choice), a chunk with
/// `finish_reason` as each choice ends, the last of which carries `usage`, then
/// `data: [DONE]`. A relay task forwards the model's events; when the client goes away
/// the response stream is dropped, the relay ends and the jobs' channel closes, which
/// cancels them on the model thread.
pub(crate) fn stream(meta: Meta, mut rx: Events, include_usage: bool) -> Response {
    let (out, out_rx) = mpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(async move {
        let data = |v: Value| Ok(SseEvent::default().data(v.to_string()));
        if meta.kind == Kind::Chat {
            for i in 0..meta.choices {
                let first = chunk(&meta, i, json!({"role": "assistant", "content": ""}), Value::Null, None);
                if out.send(data(first)).await.is_err() {
                    return;
                }
            }
        }
        let mut calls = vec![0usize; meta.choices];
        let mut done = vec![false; meta.choices];
        let mut counts = Counts::default();
        loop {
            let ev = tokio::select! {
                ev = rx.recv() => ev,
                _ = out.closed() => return,
            };
            let Some((i, ev)) = ev else {
                let e = ApiError::internal("the model thread ended the request without an answer");
                let _ = out.send(data(e.body())).await;
                return;
            };
            if i >= meta.choices {
                continue;
            }
            let sent = match ev {
                Event::Text { text, logprobs } => {
                    let lp = logprobs_json(&meta, &logprobs);
                    out.send(data(chunk(&meta, i, json!({"content": text}), lp, None))).await
                }
                Event::Reasoning(t) => {
                    out.send(data(chunk(&meta, i, json!({"reasoning_content": t}), Value::Null, None))).await
                }
                Event::ToolCall { name, arguments } => {
                    let call = tool_call_json(&meta, i, calls[i], &name, &arguments);
                    calls[i] += 1;
                    out.send(data(chunk(&meta, i, json!({"tool_calls": [call]}), Value::Null, None))).await
                }
                Event::Error(e) => {
                    let _ = out.send(data(e.body())).await;
                    return;
                }
                Event::Done { finish, prompt_tokens, completion_tokens, cached_tokens } => {
                    let finish = finish_with_calls(finish, calls[i]);
                    done[i] = true;
                    counts.add(prompt_tokens, completion_tokens, cached_tokens);
                    let mut last = chunk(&meta, i, json!({}), Value::Null, Some(finish));
                    if done.iter().all(|&d| d) {
                        let u = counts.usage();
                        last["usage"] = u.clone();
                        let _ = out.send(data(last)).await;
                        if include_usage {
                            let mut c = chunk(&meta, 0, json!({}), Value::Null, None);
                            c["choices"] = json!([]);
                            c["usage"] = u;
                            let _ = out.send(data(c)).await;
                        }
                        let _ = out.send(Ok(SseEvent::default().data("[DONE]"))).await;
                        return;
                    }
                    out.send(data(last)).await
                }
            };
            if sent.is_err() {
                return;
            }
        }
    });
    let mut r = Sse::new(tokio_stream::wrappers::ReceiverStream::new(out_rx)).into_response();
    r.headers_mut().insert("cache-control", axum::http::HeaderValue::from_static("no-cache"));
    r
}

#[cfg(test)]
mod tests {
    //! The answer's assembly from scripted model events (no model): reasoning, tool
    //! calls, several choices and logprobs, in the whole answer and in the stream.

    use super::*;
    use crate::logprobs::{Candidate, TokenLogprob};

    fn meta() -> Meta {
        Meta {
            id: "chatcmpl-test".into(),
            created: 1,
            model: "m".into(),
            kind: Kind::Chat,
            choices: 1,
            logprobs: false,
            short_call_ids: false,
        }
    }

    fn scripted(events: Vec<(usize, Event)>) -> Events {
        let (tx, rx) = mpsc::unbounded_channel();
        for e in events {
            tx.send(e).unwrap();
        }
        rx
    }

    fn text(t: &str) -> Event {
        Event::Text { text: t.into(), logprobs: Vec::new() }
    }

    fn done(finish: Finish) -> Event {
        Event::Done { finish, prompt_tokens: 3, completion_tokens: 7, cached_tokens: 0 }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
    }

    async fn body(r: Response) -> String {
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    fn whole_json(meta: Meta, events: Vec<Event>) -> Value {
        let events = events.into_iter().map(|e| (0, e)).collect();
        block_on(async { serde_json::from_str(&body(whole(meta, scripted(events)).await.unwrap()).await).unwrap() })
    }

    fn stream_chunks(meta: Meta, events: Vec<(usize, Event)>) -> (Vec<Value>, String) {
        let text = block_on(async { body(stream(meta, scripted(events), false)).await });
        let chunks = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        (chunks, text)
    }

    #[test]
    fn the_whole_answer_has_content_reasoning_and_tool_calls() {
        let events = vec![
            Event::Reasoning("Think".into()),
            Event::Reasoning(" more.".into()),
            text("Four."),
            done(Finish::Stop),
        ];
        let v = whole_json(meta(), events);
        let m = &v["choices"][0]["message"];
        assert_eq!((m["content"].as_str(), m["reasoning_content"].as_str()), (Some("Four."), Some("Think more.")));
        assert!(m.get("tool_calls").is_none());
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(
            v["usage"],
            json!({"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10,
                   "prompt_tokens_details": {"cached_tokens": 0}})
        );

        let events = vec![
            Event::Reasoning("Need it.".into()),
            Event::ToolCall { name: "get_weather".into(), arguments: "{\"city\": \"Paris\"}".into() },
            done(Finish::ToolCalls),
        ];
        let v = whole_json(meta(), events);
        let m = &v["choices"][0]["message"];
        assert!(m["content"].is_null());
        assert_eq!(
            m["tool_calls"][0]["function"],
            json!({"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"})
        );
        assert_eq!(m["tool_calls"][0]["type"], "function");
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
        // A plain answer has no reasoning field at all.
        let v = whole_json(meta(), vec![text("Hi"), done(Finish::Length)]);
        assert_eq!(v["choices"][0]["message"], json!({"role": "assistant", "content": "Hi"}));
        assert!(v["choices"][0]["logprobs"].is_null());
    }

    #[test]
    fn the_stream_sends_reasoning_and_content_deltas() {
        let events = vec![
            Event::Reasoning("Think.".into()),
            text("Fo"),
            text("ur."),
            Event::ToolCall { name: "f".into(), arguments: "{}".into() },
            done(Finish::ToolCalls),
        ];
        let (chunks, text) = stream_chunks(meta(), events.into_iter().map(|e| (0, e)).collect());
        let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
        assert_eq!(deltas[0], &json!({"role": "assistant", "content": ""}));
        assert_eq!(deltas[1], &json!({"reasoning_content": "Think."}));
        assert_eq!((deltas[2], deltas[3]), (&json!({"content": "Fo"}), &json!({"content": "ur."})));
        assert_eq!(deltas[4]["tool_calls"][0]["function"], json!({"name": "f", "arguments": "{}"}));
        assert_eq!(chunks[5]["choices"][0]["finish_reason"], "tool_calls");
        assert!(text.trim_end().ends_with("data: [DONE]"));
    }

    fn placed(id: u32, text: &str, logprob: f32, offset: usize) -> Placed {
        let c = Candidate { id, text: text.into(), bytes: text.as_bytes().to_vec(), logprob };
        Placed { logprob: TokenLogprob { chosen: c.clone(), top: vec![c] }, text_offset: offset }
    }

    #[test]
    fn several_choices_and_their_logprobs() {
        let m = Meta { choices: 2, logprobs: true, ..meta() };
        let events = vec![
            (1, Event::Text { text: "B".into(), logprobs: vec![placed(5, "B", -0.5, 0)] }),
            (0, Event::Text { text: "A".into(), logprobs: vec![placed(4, "A", -0.25, 0)] }),
            (1, Event::Done { finish: Finish::Length, prompt_tokens: 3, completion_tokens: 1, cached_tokens: 0 }),
            (0, Event::Text { text: "a".into(), logprobs: vec![placed(6, "a", -1.0, 1)] }),
            (0, Event::Done { finish: Finish::Stop, prompt_tokens: 3, completion_tokens: 2, cached_tokens: 0 }),
        ];
        let v = block_on(async {
            serde_json::from_str::<Value>(&body(whole(m.clone(), scripted(events.clone())).await.unwrap()).await)
                .unwrap()
        });
        let c = &v["choices"];
        assert_eq!((c[0]["message"]["content"].as_str(), c[1]["message"]["content"].as_str()), (Some("Aa"), Some("B")));
        assert_eq!((c[0]["index"].as_u64(), c[1]["index"].as_u64()), (Some(0), Some(1)));
        assert_eq!((c[0]["finish_reason"].as_str(), c[1]["finish_reason"].as_str()), (Some("stop"), Some("length")));
        let lp = &c[0]["logprobs"]["content"];
        assert_eq!((lp[0]["token"].as_str(), lp[1]["logprob"].as_f64()), (Some("A"), Some(-1.0)));
        assert_eq!(lp[0]["bytes"], json!([65]));
        assert_eq!(v["usage"]["completion_tokens"], 3);
        assert_eq!(v["usage"]["prompt_tokens"], 3);

        // Streamed: a role chunk per choice, then each event in its choice; usage on the last end.
        let (chunks, _) = stream_chunks(m.clone(), events.clone());
        let at = |k: usize| (chunks[k]["choices"][0]["index"].as_u64().unwrap(), &chunks[k]["choices"][0]);
        assert_eq!((at(0).0, at(1).0), (0, 1));
        assert_eq!((at(2).0, at(2).1["delta"]["content"].as_str()), (1, Some("B")));
        assert_eq!(at(2).1["logprobs"]["content"][0]["logprob"], -0.5);
        assert_eq!((at(4).0, at(4).1["finish_reason"].as_str()), (1, Some("length")));
        assert!(chunks[4].get("usage").is_none());
        assert_eq!(chunks[6]["usage"]["completion_tokens"], 3);

        // Completions' shape.
        let m = Meta { kind: Kind::Completion, ..m };
        let (chunks, _) = stream_chunks(m.clone(), events.clone());
        assert_eq!(chunks[0]["choices"][0]["logprobs"]["token_logprobs"], json!([-0.5]));
        let v = block_on(async {
            serde_json::from_str::<Value>(&body(whole(m, scripted(events)).await.unwrap()).await).unwrap()
        });
        let lp = &v["choices"][0]["logprobs"];
        assert_eq!(lp["tokens"], json!(["A", "a"]));
        assert_eq!(lp["text_offset"], json!([0, 1]));
        assert_eq!(lp["top_logprobs"][1], json!({"a": -1.0}));
    }
}
