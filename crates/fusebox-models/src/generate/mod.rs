//! Generation: a [`Session`] (a model and the KV caches of one stream), and the loop
//! that runs the prompt in one prefill pass, then one token at a time, sampled, until
//! a stop token, the token limit or a full context; with a [`Drafter`], several tokens
//! a pass where its guesses are the model's own choices ([`speculative`]).

pub mod speculative;

use std::sync::Arc;
use std::time::Instant;

use fusebox::{ComputeBackend, DType, Error, Result};

use crate::pipeline::Pipeline;
use crate::sampler::Sampler;
use crate::transformer::{KvCache, Transformer};

pub use self::speculative::{DraftStats, Drafter};

/// A model together with the caches of one stream.
#[derive(Debug)]
pub struct Session<'m> {
    model: &'m Transformer,
    cache: KvCache,
    /// Ids sampling may choose: `0..sample_vocab`.
    sample_vocab: usize,
    /// The other stages, when `model` is the first stage of a pipeline.
    pipeline: Option<Arc<Pipeline>>,
}

impl<'m> Session<'m> {
    /// A session of `model` whose caches hold `ctx_size` positions (1 ..= the model's
    /// context length), allocated once.
    pub fn new(model: &'m Transformer, b: &dyn ComputeBackend, ctx_size: usize) -> Result<Session<'m>> {
        Session::with_cache_dtype(model, b, ctx_size, DType::F32)
    }

    /// As [`new`](Self::new) with the caches stored in `cache_dtype` (F32, F16 or BF16;
    /// see [`Transformer::new_cache_of`]).
    pub fn with_cache_dtype(
        model: &'m Transformer,
        b: &dyn ComputeBackend,
        ctx_size: usize,
        cache_dtype: DType,
    ) -> Result<Session<'m>> {
        let cache = model.new_cache_of(b, ctx_size, cache_dtype)?;
        Ok(Session { model, cache, sample_vocab: model.arch.vocab_size, pipeline: None })
    }

    /// The KV caches' dtype.
    pub fn cache_dtype(&self) -> DType {
        self.cache.dtype()
    }

    /// Bytes of keys and values per cached position (every layer).
    pub fn cache_bytes_per_position(&self) -> usize {
        self.cache.bytes_per_position()
    }

    /// Restricts sampling to ids below `n` (at most the model's vocabulary): an embedding
    /// table padded past the tokenizer's last token (Phi-3: 32,064 rows, 32,011 tokens)
    /// has rows no text decodes to, so they are never chosen.
    pub fn with_sample_vocab(mut self, n: usize) -> Session<'m> {
        self.sample_vocab = n.clamp(1, self.model.arch.vocab_size);
        self
    }

    /// Runs every step through `pipeline` (this model being its first stage; see
    /// [`crate::pipeline`]).
    pub fn with_pipeline(mut self, pipeline: Option<Arc<Pipeline>>) -> Session<'m> {
        self.pipeline = pipeline;
        self
    }

    /// The logits sampling chooses from: the first [`with_sample_vocab`](Self::with_sample_vocab)
    /// ids of `logits`.
    pub fn sampled<'l>(&self, logits: &'l [f32]) -> &'l [f32] {
        &logits[..self.sample_vocab.min(logits.len())]
    }

    /// Runs `ids` after what the caches hold; returns the last position's logits.
    pub fn step(&mut self, b: &dyn ComputeBackend, ids: &[u32]) -> Result<Vec<f32>> {
        match &self.pipeline {
            Some(p) => p.step(self.model, b, ids, &mut self.cache, false)?.to_vec::<f32>(),
            None => self.model.forward_cached(b, ids, &mut self.cache),
        }
    }

    /// As [`step`](Self::step) but returns the logits of every new position `[T, V]` (host).
    pub fn step_all(&mut self, b: &dyn ComputeBackend, ids: &[u32]) -> Result<fusebox::Tensor> {
        match &self.pipeline {
            Some(p) => p.step(self.model, b, ids, &mut self.cache, true),
            None => self.model.forward_cached_all(b, ids, &mut self.cache),
        }
    }

    /// Positions filled.
    pub fn len(&self) -> usize {
        self.cache.len
    }

    /// Whether nothing has been run yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions the caches hold.
    pub fn capacity(&self) -> usize {
        self.cache.capacity
    }

    /// Vocabulary size of the model.
    pub fn vocab_size(&self) -> usize {
        self.model.arch.vocab_size
    }

    /// Keeps the first `len` positions (see [`KvCache::truncate`]: a model with Gated
    /// DeltaNet layers can keep all or none).
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        self.cache.truncate(len)
    }

    /// Backs `positions` of the caches now (at most their capacity), so that a run
    /// whose length is known does not grow them while it decodes (see
    /// [`KvCache::reserve`]).
    pub fn reserve(&mut self, b: &dyn ComputeBackend, positions: usize) -> Result<()> {
        self.cache.reserve(b, positions.min(self.cache.capacity))
    }

    /// Forgets the cached positions, keeping the allocation.
    pub fn clear(&mut self) {
        self.cache.clear();
    }

    /// The model.
    pub fn model(&self) -> &'m Transformer {
        self.model
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// A stop token (EOS, the chat template's end token) was sampled; it is the last token.
    StopToken,
    /// `max_new` tokens were generated.
    MaxTokens,
    /// The context (`--ctx-size`) is full.
    ContextFull,
}

impl StopReason {
    /// `"stop_token"`, `"max_tokens"` or `"context_full"`.
    pub fn name(self) -> &'static str {
        match self {
            StopReason::StopToken => "stop_token",
            StopReason::MaxTokens => "max_tokens",
            StopReason::ContextFull => "context_full",
        }
    }
}

/// The generated tokens and timings.
#[derive(Debug, Clone)]
pub struct Generation {
    /// The generated tokens (a stop token, when one ended it, is the last).
    pub tokens: Vec<u32>,
    /// Why generation stopped.
    pub stop: StopReason,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Seconds of the prompt pass (to the first logits).
    pub prefill_seconds: f64,
    /// Forward passes after the prompt (a verify pass of drafted tokens counts once).
    pub decode_steps: usize,
    /// Seconds of those passes (sampling and drafting included).
    pub decode_seconds: f64,
    /// Drafted and accepted tokens (all zero without a [`Drafter`]).
    pub drafts: DraftStats,
}

impl Generation {
    /// Prompt tokens per second.
    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_seconds.max(1e-12)
    }

    /// Generated tokens per second after the first (the first comes from the prompt
    /// pass; without drafting each later one takes one forward pass).
    pub fn decode_tokens_per_s(&self) -> f64 {
        if self.decode_steps == 0 {
            0.0
        } else {
            (self.tokens.len().saturating_sub(1)) as f64 / self.decode_seconds.max(1e-12)
        }
    }
}

/// Generates up to `max_new` tokens after `prompt`, continuing from what `session`
/// holds. Stops after a token in `stop` (kept as the last token), at `max_new`, or when
/// the context is full. `on_token` sees each token as it is chosen. A prompt that does
/// not fit the context is an error.
pub fn generate(
    session: &mut Session<'_>,
    b: &dyn ComputeBackend,
    prompt: &[u32],
    max_new: usize,
    sampler: &mut Sampler,
    stop: &[u32],
    on_token: impl FnMut(u32) -> Result<()>,
) -> Result<Generation> {
    generate_with(session, b, prompt, max_new, sampler, stop, None, on_token)
}

/// As [`generate`], with a `drafter` when given: after each chosen token, its guesses of
/// the next ones run with it in one pass, and each is kept while it equals the token
/// the sampler chooses from that pass's logits at its position (see [`speculative`]:
/// the same tokens as without drafting where those logits have the one-token step's
/// bits, which they do for block-quantized weights). The cache ends as plain decoding
/// leaves it. A drafter's model sees only `prompt` and what follows, not what the
/// session held before. Refused for a model with Gated DeltaNet layers or split over
/// MPI ranks.
#[allow(clippy::too_many_arguments)]
pub fn generate_with(
    session: &mut Session<'_>,
    b: &dyn ComputeBackend,
    prompt: &[u32],
    max_new: usize,
    sampler: &mut Sampler,
    stop: &[u32],
    mut drafter: Option<&mut Drafter<'_>>,
    mut on_token: impl FnMut(u32) -> Result<()>,
) -> Result<Generation> {
    if prompt.is_empty() {
        return Err(Error::value("generate", "prompt", "at least one token", 0));
    }
    let room = session.capacity() - session.len();
    if prompt.len() > room {
        return Err(Error::value(
            "generate",
            "prompt length",
            format!("≤ {room} tokens (the context size, --ctx-size, is {})", session.capacity()),
            prompt.len(),
        ));
    }
    if drafter.is_some() {
        speculative::check_target(&session.cache, session.model, session.pipeline.is_some())?;
    }
    let start = Instant::now();
    // Logits to choose from, one row per position, in order; `drafts[i]` was run after
    // row `i` (so there is one row more than drafts).
    let first = session.step(b, prompt)?;
    let vocab = first.len();
    let mut rows = first;
    let mut drafts: Vec<u32> = Vec::new();
    let prefill_seconds = start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    let mut seen = prompt.to_vec();
    let mut tokens = Vec::new();
    let mut decode_steps = 0;
    let mut stats = DraftStats::default();
    let reason = loop {
        if tokens.len() >= max_new {
            break StopReason::MaxTokens;
        }
        // The position of row 0's input: row i's token follows position `base + i`.
        let base = session.len() - (drafts.len() + 1);
        let (mut ended, mut used, mut kept) = (None, 0, 0);
        for (i, row) in rows.chunks_exact(vocab.max(1)).enumerate() {
            used = i + 1;
            let next = sampler.sample(session.sampled(row), &seen)?;
            tokens.push(next);
            seen.push(next);
            on_token(next)?;
            if stop.contains(&next) {
                ended = Some(StopReason::StopToken);
            } else if tokens.len() >= max_new {
                ended = Some(StopReason::MaxTokens);
            }
            if ended.is_some() || drafts.get(i) != Some(&next) {
                break;
            }
            kept += 1;
        }
        stats.accepted += kept;
        if let (Some(d), false) = (drafter.as_deref_mut(), drafts.is_empty()) {
            d.record(drafts.len(), kept);
        }
        // As plain decoding leaves it: every position before the last chosen token.
        if session.len() != base + used {
            session.truncate(base + used)?;
        }
        if let Some(reason) = ended {
            break reason;
        }
        if session.len() >= session.capacity() {
            break StopReason::ContextFull;
        }
        let last = *tokens.last().ok_or_else(|| Error::value("generate", "tokens", "one chosen", "none"))?;
        drafts = match drafter.as_deref_mut() {
            // Every draft may be emitted, and the pass must fit the cache.
            Some(d) => {
                let limit = (max_new - tokens.len()).min(session.capacity() - session.len() - 1);
                d.draft(b, &seen, limit)?
            }
            None => Vec::new(),
        };
        rows = if drafts.is_empty() {
            session.step(b, &[last])?
        } else {
            stats.drafted += drafts.len();
            stats.passes += 1;
            let ids: Vec<u32> = std::iter::once(last).chain(drafts.iter().copied()).collect();
            session.step_all(b, &ids)?.to_vec::<f32>()?
        };
        decode_steps += 1;
    };
    Ok(Generation {
        tokens,
        stop: reason,
        prompt_tokens: prompt.len(),
        prefill_seconds,
        decode_steps,
        decode_seconds: decode_start.elapsed().as_secs_f64(),
        drafts: stats,
    })
}
