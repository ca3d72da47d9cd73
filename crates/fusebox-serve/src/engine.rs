//! The model thread: a scheduler of `--parallel` slots, each a KV cache of up to
//! `--ctx-size` positions (backed in blocks as its sequence fills, given back when a new
//! sequence keeps none of it: see [`KvCache`]), fed by a channel.
//!
//! Each turn of its loop it takes new jobs into free slots (the rest wait in a bounded
//! queue), drops jobs whose client went away, runs one prefill chunk of at most
//! `prefill_chunk` prompt tokens for the oldest slot still reading its prompt, and then
//! one decode step for every slot that is generating: a single batched forward
//! ([`forward_batch`](fusebox_models::transformer::Transformer::forward_batch)) over
//! all of them, each at its own position. Running streams therefore advance every turn
//! while a new prompt is read in chunks.
//!
//! Results go back on each job's own channel; a job whose channel is closed (the HTTP
//! side dropped it: the client disconnected) is cancelled before the next step.
//!
//! **Prefix caching** (`--cache-ram` > 0, one process only). A slot keeps its last
//! sequence's keys and values after the job ends, and remembers the tokens they are of.
//! A new job goes to the free slot whose sequence shares the longest prefix with its
//! prompt (the previous turn of its conversation), keeps those positions and reads only
//! the rest; a slot with nothing in common is taken least recently used first. When its
//! prompt starts to be read, a longer prefix in the [`PrefixStore`] (blocks of earlier
//! prompts) is restored instead; after each chunk its whole blocks are stored, and
//! chunks end on block boundaries so that a hybrid model's state is at hand there. At
//! least the prompt's last token is always run, for the logits of the first answer token.
//!
//! **Speculative decoding** (`--draft-model`, `--draft-ngram`; one process only). When
//! exactly one slot is generating and its answer is not constrained by a grammar, its
//! step runs the drafter's guesses after its last token in one pass and keeps each
//! while the request's sampler chooses it from that pass's logits at its position (see
//! [`fusebox_models::generate::speculative`]: the same tokens as without drafting); the
//! cache is cut back to what was kept. Several generating slots take the plain batched
//! step.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fusebox::ComputeBackend;
use fusebox_models::chat::OutputFormat;
use fusebox_models::generate::Drafter;
use fusebox_models::pretrained::Pretrained;
use fusebox_models::transformer::KvCache;
use fusebox_models::Sampler;
use tokio::sync::mpsc::UnboundedSender;

use crate::embed::EmbedJob;
use crate::logprobs::{token_logprob, Placed};
use crate::metrics::Metrics;
use crate::prefix::{common_prefix, PrefixStore};
use crate::reply::ReplyStream;
use crate::structured::guide::{Commit, Guide};

mod pipelined;

/// Why a generation ended, in OpenAI's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// A stop token or a stop string.
    Stop,
    /// `max_tokens`, the end of the context, or cut short by a shutdown.
    Length,
    /// The reply ended with a tool call (harmony's `<|call|>`).
    ToolCalls,
}

impl Finish {
    /// `"stop"`, `"length"` or `"tool_calls"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ToolCalls => "tool_calls",
        }
    }
}

/// What the model thread sends back for one job.
#[derive(Debug, Clone)]
pub enum Event {
    /// More text of the answer (never splits a character, never part of a stop string),
    /// with the logprobs of the tokens whose text it completes when the request asked
    /// for them (then the text may be empty).
    Text {
        /// The text.
        text: String,
        /// The logprobs of the tokens it completes, in order.
        logprobs: Vec<Placed>,
    },
    /// More text of the model's reasoning (harmony's `analysis` channel; never splits a
    /// character).
    Reasoning(String),
    /// A tool call, whole, sent just before [`Event::Done`].
    ToolCall {
        /// The function's name.
        name: String,
        /// Its arguments as the model wrote them (JSON text, unchecked).
        arguments: String,
    },
    /// The end, with the token counts.
    Done {
        /// Why it ended.
        finish: Finish,
        /// Tokens of the prompt.
        prompt_tokens: usize,
        /// Tokens generated (a stop token included).
        completion_tokens: usize,
        /// Prompt tokens whose keys and values came from a cache (the slot's previous
        /// sequence or the prefix store) rather than a prefill.
        cached_tokens: usize,
    },
    /// The job failed (the model returned an error, or the server is shutting down
    /// before it started).
    Error(crate::openai::ApiError),
}

/// Where a job's events go: the request's channel, tagged with the job's choice index
/// (a request for `n` choices runs `n` jobs that share one channel).
#[derive(Debug, Clone)]
pub struct EventSink {
    choice: usize,
    tx: UnboundedSender<(usize, Event)>,
}

impl EventSink {
    /// Events of choice `choice` into `tx`.
    pub fn new(choice: usize, tx: UnboundedSender<(usize, Event)>) -> EventSink {
        EventSink { choice, tx }
    }

    /// Sends `e` (a closed channel drops it: the job is cancelled before its next step).
    pub fn send(&self, e: Event) {
        let _ = self.tx.send((self.choice, e));
    }

    /// Whether the request's client went away.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// One request for the model thread.
#[derive(Debug)]
pub struct Job {
    /// Prompt ids (1 ..= ctx).
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// The request's sampler.
    pub sampler: Sampler,
    /// Ids that end the answer (not shown).
    pub stop_ids: Vec<u32>,
    /// Strings that end the answer (not shown).
    pub stop_strings: Vec<String>,
    /// How the reply's tokens divide into answer, reasoning and tool calls.
    pub format: OutputFormat,
    /// `Some(k)`: report each answer token's logprob and the `k` most likely tokens'.
    pub logprobs: Option<usize>,
    /// The constraint of a structured answer (`response_format`, `grammar`): the tokens
    /// each step may sample.
    pub guide: Option<Box<Guide>>,
    /// Where the events go.
    pub events: EventSink,
}

/// Messages to the model thread.
#[derive(Debug)]
pub enum Msg {
    /// A new job.
    Job(Job),
    /// Embeddings to compute (between two steps of the running jobs).
    Embed(EmbedJob),
    /// Stop: refuse waiting jobs, let running ones go on for `grace`, then end them.
    Shutdown {
        /// How long running answers may continue.
        grace: Duration,
    },
}

/// Scheduler settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Slots (sequences advanced together).
    pub parallel: usize,
    /// Positions each slot's KV cache may hold.
    pub ctx_size: usize,
    /// Most prompt tokens one prefill chunk runs.
    pub prefill_chunk: usize,
    /// Element type of every slot's KV cache.
    pub cache_type: fusebox::DType,
    /// Bytes the prefix store may hold; 0 turns prefix caching off (slot reuse too).
    pub cache_ram: usize,
    /// Tokens per block of the prefix store.
    pub cache_block: usize,
    /// Speculative decoding of a lone generating slot (`None`: off).
    pub draft: Option<DraftConfig>,
}

/// Where a lone generating slot's drafts come from (see the module notes).
#[derive(Clone)]
pub enum DraftSource {
    /// Prompt lookup over the longest n-gram up to this size.
    Ngram(usize),
    /// A smaller model with the same tokenizer, decoding greedily.
    Model(Arc<Pretrained>),
}

impl std::fmt::Debug for DraftSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DraftSource::Ngram(n) => write!(f, "Ngram({n})"),
            DraftSource::Model(m) => write!(f, "Model({})", m.path.display()),
        }
    }
}

/// Speculative decoding's settings.
#[derive(Debug, Clone)]
pub struct DraftConfig {
    /// Where drafts come from.
    pub source: DraftSource,
    /// Most drafts one pass checks (1 ..= 15).
    pub max_draft: usize,
}

enum Phase {
    /// `done` prompt tokens are in the cache.
    Prefill { done: usize },
    /// Generating; `next` is the last sampled token, not yet in the cache.
    Decode { next: u32 },
}

struct Active {
    job: Job,
    /// Arrival order: prompts are read first come, first served.
    arrival: u64,
    phase: Phase,
    /// Generated ids, stop tokens included.
    tokens: Vec<u32>,
    /// The text side: what has been shown of the answer and the reasoning.
    reply: ReplyStream,
    /// Prompt tokens that came from a cache; `None` until the prompt starts to be read
    /// (the prefix store is consulted then).
    cached: Option<usize>,
}

struct Slot {
    cache: KvCache,
    /// The tokens of the cache's positions (`held.len() == cache.len`), kept after the
    /// job ends for the next one to reuse (prefix caching only; else empty).
    held: Vec<u32>,
    /// Arrival number of the last job it took (free slots are reused oldest first).
    last_used: u64,
    active: Option<Active>,
    /// A batch of this slot's is in a pipeline, its logits not back (split models only):
    /// the slot takes no new step, nor a new job.
    in_flight: bool,
}

/// Bytes of keys and values the slots' caches are backed for.
fn kv_bytes(slots: &[Slot]) -> usize {
    slots.iter().map(|s| s.cache.backed_bytes()).sum()
}

/// Runs the scheduler until a shutdown has ended every job; `ready` hears once the
/// caches are allocated (or why they could not be). Errors of the model end
/// the job they happened in (its client gets a 500 or an error chunk), not the server.
pub fn run(
    backend: Arc<dyn ComputeBackend>,
    model: Arc<Pretrained>,
    config: EngineConfig,
    rx: Receiver<Msg>,
    metrics: Arc<Metrics>,
    ready: std::sync::mpsc::Sender<fusebox::Result<()>>,
) -> fusebox::Result<()> {
    let b = backend.as_ref();
    let net = &model.network;
    let sample_vocab = model.tokenizer.vocab_size().clamp(1, net.arch.vocab_size);
    let mut drafter = match drafter_for(b, &model, &config, sample_vocab) {
        Ok(d) => d,
        Err(e) => {
            let _ = ready.send(Err(e));
            return Ok(());
        }
    };
    let mut slots = Vec::with_capacity(config.parallel);
    for _ in 0..config.parallel {
        match net.new_cache_of(b, config.ctx_size, config.cache_type) {
            Ok(cache) => slots.push(Slot { cache, held: Vec::new(), last_used: 0, active: None, in_flight: false }),
            Err(e) => {
                let _ = ready.send(Err(e));
                return Ok(());
            }
        }
    }
    metrics.kv_cache_bytes.store(kv_bytes(&slots), Ordering::Relaxed);
    let _ = ready.send(Ok(()));
    // Under mpirun the other ranks hold their own caches of each slot, and a rank only
    // starts a slot's sequence over at position 0 or continues it where it stands
    // (`Pipeline`'s followers): rank 0 can neither cut theirs back nor restore blocks
    // into them, so a split model reads every prompt whole.
    let caching = config.cache_ram > 0 && model.pipeline.is_none();
    let mut store = caching.then(|| PrefixStore::new(config.cache_block, config.cache_ram));
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut embeds: VecDeque<EmbedJob> = VecDeque::new();
    // The sequence embeddings are computed in, allocated at the first request.
    let mut embed_cache: Option<KvCache> = None;
    let mut shutdown_at: Option<Instant> = None;
    let mut open = true;
    let mut arrivals = 0u64;
    // A split model's batches in flight (see `pipelined`).
    let mut flight = pipelined::Flight::new();
    loop {
        // Take in what came; sleep on the channel only when there is nothing to do.
        let idle =
            waiting.is_empty() && embeds.is_empty() && slots.iter().all(|s| s.active.is_none()) && flight.is_empty();
        if idle && !open {
            return Ok(());
        }
        let mut first = None;
        if idle {
            first = match rx.recv_timeout(Duration::from_millis(500)) {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            };
        }
        for msg in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match msg {
                Msg::Job(job) if open => waiting.push_back(job),
                Msg::Job(job) => {
                    metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
                    job.events.send(Event::Error(crate::openai::ApiError::unavailable("the server is shutting down")));
                }
                Msg::Embed(e) if open => embeds.push_back(e),
                Msg::Embed(e) => {
                    let _ = e.reply.send(Err(crate::openai::ApiError::unavailable("the server is shutting down")));
                }
                Msg::Shutdown { grace } => {
                    open = false;
                    shutdown_at = Some(Instant::now() + grace);
                    for job in waiting.drain(..) {
                        metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
                        job.events
                            .send(Event::Error(crate::openai::ApiError::unavailable("the server is shutting down")));
                    }
                    for e in embeds.drain(..) {
                        let _ = e.reply.send(Err(crate::openai::ApiError::unavailable("the server is shutting down")));
                    }
                }
            }
        }
        // Jobs whose client went away free their slot (or their place in the queue).
        waiting.retain(|j| {
            let keep = !j.events.is_closed();
            if !keep {
                metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            keep
        });
        for s in slots.iter_mut() {
            if s.active.as_ref().is_some_and(|a| a.job.events.is_closed()) {
                s.active = None;
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
        }
        if shutdown_at.is_some_and(|t| Instant::now() >= t) {
            for s in slots.iter_mut() {
                if let Some(mut a) = s.active.take() {
                    a.reply.finish(&model.tokenizer, &a.job.events);
                    finish(&a, Finish::Length, &metrics);
                }
            }
        }
        while let Some(i) = free_slot_for(&slots, waiting.front(), caching) {
            let Some(job) = waiting.pop_front() else { break };
            metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
            let s = &mut slots[i];
            let keep = if caching { reusable(s, &job.prompt) } else { 0 };
            // A sequence that keeps nothing gives back what its predecessor grew.
            if keep == 0 || s.cache.truncate(keep).is_err() {
                if let Err(e) = s.cache.release(b) {
                    s.cache.clear();
                    eprintln!("fusebox serve: a slot's KV cache kept its backing ({e})");
                }
            }
            s.held.truncate(s.cache.len);
            arrivals += 1;
            s.last_used = arrivals;
            let reply = ReplyStream::new(job.format, job.stop_strings.clone());
            let phase = Phase::Prefill { done: s.cache.len };
            let cached = (!caching).then_some(0);
            s.active = Some(Active { job, arrival: arrivals, phase, tokens: Vec::new(), reply, cached });
        }
        metrics.slots_busy.store(slots.iter().filter(|s| s.active.is_some()).count(), Ordering::Relaxed);
        metrics.kv_cache_bytes.store(kv_bytes(&slots), Ordering::Relaxed);

        // One embedding request, whole (its inputs are read in prefill-sized chunks).
        if let Some(e) = embeds.pop_front() {
            crate::embed::run(&model, b, &config, &mut embed_cache, e, &metrics);
        }

        if let Some(p) = model.pipeline.as_deref() {
            let turn = flight.turn(p, &model, b, &mut slots, config.prefill_chunk, sample_vocab, &metrics);
            if let Err(e) = turn {
                // The ranks' state is unknown: end every job, then the server.
                let why = format!("the pipeline over MPI ranks failed: {e}");
                for job in waiting.drain(..) {
                    job.events.send(Event::Error(crate::openai::ApiError::internal(why.clone())));
                }
                for a in slots.iter_mut().filter_map(|s| s.active.take()) {
                    a.job.events.send(Event::Error(crate::openai::ApiError::internal(why.clone())));
                }
                return Err(e);
            }
            metrics.slots_busy.store(slots.iter().filter(|s| s.active.is_some()).count(), Ordering::Relaxed);
            continue;
        }

        // One prefill chunk, for the earliest arrival still reading its prompt.
        let reading = slots
            .iter_mut()
            .filter_map(|s| match &s.active {
                Some(a @ Active { phase: Phase::Prefill { .. }, .. }) => Some((a.arrival, s)),
                _ => None,
            })
            .min_by_key(|(arrival, _)| *arrival);
        if let Some((_, s)) = reading {
            prefill_chunk(&model, b, s, store.as_mut(), config.prefill_chunk, sample_vocab, &metrics);
        }

        // One decode step for every generating slot, in one batched forward.
        let mut rows: Vec<(usize, u32)> = Vec::new();
        for (i, s) in slots.iter().enumerate() {
            if let Some(Active { phase: Phase::Decode { next }, .. }) = &s.active {
                rows.push((i, *next));
            }
        }
        let lone = match (&rows[..], drafter.as_mut()) {
            ([(i, next)], Some(d)) if slots[*i].active.as_ref().is_some_and(|a| a.job.guide.is_none()) => {
                Some((*i, *next, d))
            }
            _ => None,
        };
        let speculated = match lone {
            Some((i, next, d)) => speculative_step(&model, b, &mut slots[i], next, d, sample_vocab, caching, &metrics),
            None => false,
        };
        if !rows.is_empty() && !speculated {
            decode_step(&model, b, &mut slots, &rows, sample_vocab, caching, &metrics);
        }
        metrics.slots_busy.store(slots.iter().filter(|s| s.active.is_some()).count(), Ordering::Relaxed);
    }
}

/// The free slot the next waiting job should take: with prefix caching, the one whose
/// sequence it can reuse most of, else (and on ties) the one used least recently.
fn free_slot_for(slots: &[Slot], job: Option<&Job>, caching: bool) -> Option<usize> {
    let job = job?;
    slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.active.is_none() && !s.in_flight)
        .max_by_key(|(_, s)| (if caching { reusable(s, &job.prompt) } else { 0 }, std::cmp::Reverse(s.last_used)))
        .map(|(i, _)| i)
}

/// Positions of `s`'s cache a job with `prompt` can keep: the common prefix, short of
/// the prompt's last token (which must run for the logits). A linear-attention state
/// holds only after the cache's last position, so a hybrid model keeps all or nothing.
fn reusable(s: &Slot, prompt: &[u32]) -> usize {
    let common = common_prefix(&s.held, prompt).min(s.cache.len);
    let most = prompt.len().saturating_sub(1);
    if s.cache.has_linear_state() {
        if common == s.cache.len && common <= most {
            common
        } else {
            0
        }
    } else {
        common.min(most)
    }
}

/// Runs the next chunk of a slot's prompt; after the last chunk, samples the first token.
/// With a prefix `store`, the first chunk starts after the longest prefix it can
/// restore, chunks end on its block boundaries, and each chunk's whole blocks go into it.
fn prefill_chunk(
    model: &Pretrained,
    b: &dyn ComputeBackend,
    s: &mut Slot,
    mut store: Option<&mut PrefixStore>,
    chunk: usize,
    vocab: usize,
    m: &Metrics,
) {
    let Some(a) = s.active.as_mut() else { return };
    let Phase::Prefill { mut done } = a.phase else { return };
    let prompt = &a.job.prompt;
    if a.cached.is_none() {
        if let Some(store) = store.as_deref_mut() {
            match store.restore(b, prompt, prompt.len() - 1, done, &mut s.cache) {
                Ok(n) => done = n,
                Err(e) => {
                    // The cache may be half written: start it over.
                    s.cache.clear();
                    s.held.clear();
                    let e = crate::openai::ApiError::internal(format!("restoring a cached prefix failed: {e}"));
                    a.job.events.send(Event::Error(e));
                    s.active = None;
                    return;
                }
            }
            s.held.clear();
            s.held.extend_from_slice(&prompt[..done]);
        }
        a.cached = Some(done);
        if done > 0 {
            m.prefix_hits.fetch_add(1, Ordering::Relaxed);
            m.cached_prompt_tokens.fetch_add(done as u64, Ordering::Relaxed);
        }
    }
    let mut end = (done + chunk.max(1)).min(prompt.len());
    if let Some(store) = store.as_deref() {
        end = end.min((done / store.block() + 1) * store.block());
    }
    let start = Instant::now();
    let result = model.network.forward_cached(b, &prompt[done..end], &mut s.cache);
    m.add_prefill(end - done, start.elapsed());
    if let (Ok(_), Some(store)) = (&result, store) {
        s.held.extend_from_slice(&prompt[done..end]);
        // A block that cannot be copied is only not stored; the answer goes on.
        let _ = store.insert(b, prompt, &s.cache, m);
    }
    match result {
        Err(e) => {
            s.cache.clear();
            s.held.clear();
            a.job.events.send(Event::Error(crate::openai::ApiError::internal(format!("prefill failed: {e}"))));
            s.active = None;
        }
        Ok(_) if end < a.job.prompt.len() => a.phase = Phase::Prefill { done: end },
        Ok(logits) => {
            if !accept(model, a, &logits[..vocab.min(logits.len())], s.cache.len, s.cache.capacity, m) {
                s.active = None;
            }
        }
    }
}

/// The slots at `rows` (increasing indices), each borrowed once.
fn picked(slots: &mut [Slot], rows: impl IntoIterator<Item = usize>) -> Vec<&mut Slot> {
    let mut want = rows.into_iter().peekable();
    let mut out = Vec::new();
    for (i, s) in slots.iter_mut().enumerate() {
        if want.peek() == Some(&i) {
            want.next();
            out.push(s);
        }
    }
    out
}

/// One forward over the last token of every generating slot, then a sample each.
fn decode_step(
    model: &Pretrained,
    b: &dyn ComputeBackend,
    slots: &mut [Slot],
    rows: &[(usize, u32)],
    vocab: usize,
    caching: bool,
    m: &Metrics,
) {
    let start = Instant::now();
    let ids: Vec<u32> = rows.iter().map(|r| r.1).collect();
    let result = {
        let mut caches: Vec<&mut KvCache> =
            picked(slots, rows.iter().map(|r| r.0)).into_iter().map(|s| &mut s.cache).collect();
        model.network.forward_batch(b, &ids, &mut caches)
    };
    m.add_decode(rows.len(), start.elapsed());
    match result {
        Err(e) => {
            for &(i, _) in rows {
                slots[i].cache.clear();
                slots[i].held.clear();
                if let Some(a) = slots[i].active.take() {
                    a.job.events.send(Event::Error(crate::openai::ApiError::internal(format!("decode failed: {e}"))));
                }
            }
        }
        Ok(logits) => {
            for (row, &(i, next)) in rows.iter().enumerate() {
                let s = &mut slots[i];
                if caching {
                    s.held.push(next);
                }
                let Some(a) = s.active.as_mut() else { continue };
                let l = &logits[row];
                if !accept(model, a, &l[..vocab.min(l.len())], s.cache.len, s.cache.capacity, m) {
                    s.active = None;
                }
            }
        }
    }
}

/// The drafter `config` asks for, checked against the model: refused for a model split
/// over MPI ranks or with Gated DeltaNet layers (neither can cut its state back).
fn drafter_for<'m>(
    b: &dyn ComputeBackend,
    model: &'m Pretrained,
    config: &'m EngineConfig,
    vocab: usize,
) -> fusebox::Result<Option<Drafter<'m>>> {
    const OP: &str = "speculative decoding";
    let Some(d) = &config.draft else { return Ok(None) };
    if model.pipeline.is_some() {
        return Err(fusebox::Error::unsupported(
            OP,
            "a model split over MPI ranks (the other ranks' caches cannot be cut back to the accepted drafts)",
        ));
    }
    if model.network.arch.linear_attention.is_some() {
        return Err(fusebox::Error::unsupported(
            OP,
            format!(
                "{} has Gated DeltaNet layers, whose recurrent state cannot be cut back to the accepted drafts",
                model.network.arch.name
            ),
        ));
    }
    match &d.source {
        DraftSource::Ngram(n) => Drafter::ngram(*n, d.max_draft).map(Some),
        DraftSource::Model(m) => {
            fusebox_models::generate::speculative::check_same_vocabulary(&model.tokenizer, &m.tokenizer)?;
            Drafter::model(b, &m.network, vocab, config.ctx_size, config.cache_type, d.max_draft).map(Some)
        }
    }
}

/// The step of the one generating slot `s` with drafting: its last token `next` and the
/// drafter's guesses in one pass, each guess kept while the sampler chooses it from the
/// pass's logits at its position; the cache then cut back to what was kept. False when
/// nothing was drafted (the plain step is to run instead).
#[allow(clippy::too_many_arguments)]
fn speculative_step(
    model: &Pretrained,
    b: &dyn ComputeBackend,
    s: &mut Slot,
    next: u32,
    drafter: &mut Drafter<'_>,
    vocab: usize,
    caching: bool,
    m: &Metrics,
) -> bool {
    let Some(a) = s.active.as_mut() else { return false };
    let start = Instant::now();
    // Every draft may be emitted, and the pass must fit the cache.
    let base = s.cache.len;
    let limit = a.job.max_tokens.saturating_sub(a.tokens.len()).min(s.cache.capacity.saturating_sub(base + 1));
    let seq: Vec<u32> = a.job.prompt.iter().chain(&a.tokens).copied().collect();
    let drafts = match drafter.draft(b, &seq, limit) {
        Ok(d) if d.is_empty() => return false,
        Ok(d) => d,
        Err(e) => {
            a.job.events.send(Event::Error(crate::openai::ApiError::internal(format!("drafting failed: {e}"))));
            s.active = None;
            return true;
        }
    };
    let ids: Vec<u32> = std::iter::once(next).chain(drafts.iter().copied()).collect();
    let result = model.network.forward_cached_all(b, &ids, &mut s.cache).and_then(|t| t.to_vec::<f32>());
    let logits = match result {
        Ok(l) => l,
        Err(e) => {
            s.cache.clear();
            s.held.clear();
            a.job.events.send(Event::Error(crate::openai::ApiError::internal(format!("decode failed: {e}"))));
            s.active = None;
            return true;
        }
    };
    // Counted before the rows are accepted: the answer's end is sent from among them.
    m.add_drafts(drafts.len(), 0);
    let width = logits.len() / ids.len();
    let (mut kept, mut accepted, mut ended) = (0, 0, false);
    for (i, row) in logits.chunks_exact(width.max(1)).enumerate() {
        kept = i + 1;
        if caching {
            s.held.push(ids[i]);
        }
        if !accept(model, a, &row[..vocab.min(row.len())], base + i + 1, s.cache.capacity, m) {
            ended = true;
            break;
        }
        if a.tokens.last() != drafts.get(i) {
            break;
        }
        m.add_drafts(0, 1);
        accepted += 1;
    }
    drafter.record(drafts.len(), accepted);
    if ended {
        s.active = None;
    }
    // As the plain steps would leave it: every position before the last chosen token.
    if s.cache.truncate(base + kept).is_err() {
        s.cache.clear();
        s.held.clear();
    }
    m.add_decode(kept, start.elapsed());
    true
}

/// Samples the next token from `logits`, sends the text it completes, and says
/// whether the job goes on (false: it ended, its end has been sent).
fn accept(model: &Pretrained, a: &mut Active, logits: &[f32], len: usize, capacity: usize, m: &Metrics) -> bool {
    let seen: Vec<u32> = if a.job.sampler.config.repetition_penalty != 1.0 {
        a.job.prompt.iter().chain(&a.tokens).copied().collect()
    } else {
        Vec::new()
    };
    // A constrained answer samples from its mask's tokens only; an unconstrained one
    // from the logits as they came.
    let constrained_start = Instant::now();
    let masked_logits;
    let sample_from = match a.job.guide.as_mut() {
        None => logits,
        Some(g) => match g.mask() {
            Ok(mask) => {
                masked_logits = crate::structured::guide::masked(logits, mask);
                &masked_logits[..]
            }
            Err(e) => {
                let e = crate::openai::ApiError::internal(format!("the constraint failed: {e}"));
                a.job.events.send(Event::Error(e));
                return false;
            }
        },
    };
    let mut constrained_time = constrained_start.elapsed();
    let next = match a.job.sampler.sample_with(sample_from, &seen, &a.tokens) {
        Ok(t) => t,
        Err(e) => {
            a.job.events.send(Event::Error(crate::openai::ApiError::internal(format!("sampling failed: {e}"))));
            return false;
        }
    };
    a.tokens.push(next);
    m.completion_tokens.fetch_add(1, Ordering::Relaxed);
    let tok = &model.tokenizer;
    // Under a constraint, the vocabulary's end ids end the answer where the grammar is
    // complete (the mask allows them nowhere else).
    let grammar_end = a.job.guide.as_ref().is_some_and(|g| g.is_end(next));
    let mut grammar_done = false;
    if let (Some(g), false) = (a.job.guide.as_mut(), grammar_end || a.job.stop_ids.contains(&next)) {
        let start = Instant::now();
        let committed = g.commit(next);
        constrained_time += start.elapsed();
        match committed {
            Ok(c) => grammar_done = c == Commit::Finished,
            Err(e) => {
                let e = crate::openai::ApiError::internal(format!("the constraint failed: {e}"));
                a.job.events.send(Event::Error(e));
                return false;
            }
        }
    }
    if a.job.guide.is_some() {
        m.constraint_nanos.fetch_add(constrained_time.as_nanos() as u64, Ordering::Relaxed);
    }
    if a.job.stop_ids.contains(&next) || grammar_end {
        let called = a.reply.finish(tok, &a.job.events);
        finish(a, if called { Finish::ToolCalls } else { Finish::Stop }, m);
        return false;
    }
    // Of the raw logits: before the penalties and the temperature.
    let logprob = a.job.logprobs.map(|top| token_logprob(tok, logits, next, top));
    if a.reply.push(tok, next, logprob, &a.job.events) {
        finish(a, Finish::Stop, m);
        return false;
    }
    if grammar_done {
        // The grammar allows nothing more: the answer is complete without an end token.
        a.reply.finish(tok, &a.job.events);
        finish(a, Finish::Stop, m);
        return false;
    }
    if a.tokens.len() >= a.job.max_tokens || len >= capacity {
        a.reply.finish(tok, &a.job.events);
        finish(a, Finish::Length, m);
        return false;
    }
    a.phase = Phase::Decode { next };
    true
}

fn finish(a: &Active, finish: Finish, m: &Metrics) {
    m.finished.fetch_add(1, Ordering::Relaxed);
    a.job.events.send(Event::Done {
        finish,
        prompt_tokens: a.job.prompt.len(),
        completion_tokens: a.tokens.len(),
        cached_tokens: a.cached.unwrap_or(0),
    });
}
