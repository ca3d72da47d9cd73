//! Counters for `GET /metrics`, in Prometheus' text format.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Counters shared by the HTTP side and the model thread.
#[derive(Debug, Default)]
pub struct Metrics {
    /// HTTP requests to the completion endpoints, accepted or not.
    pub requests: AtomicU64,
    /// Requests answered with an error status.
    pub rejected: AtomicU64,
    /// Jobs that ended (stop or length).
    pub finished: AtomicU64,
    /// Jobs dropped because their client disconnected.
    pub cancelled: AtomicU64,
    /// Prompt tokens of accepted requests.
    pub prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub completion_tokens: AtomicU64,
    /// Jobs waiting for a slot.
    pub queue_depth: AtomicUsize,
    /// Slots holding a job.
    pub slots_busy: AtomicUsize,
    /// Slots in all.
    pub slots_total: AtomicUsize,
    /// Accepted completion requests that asked for logprobs.
    pub logprobs_requests: AtomicU64,
    /// Accepted completion requests with `n` > 1.
    pub multi_choice_requests: AtomicU64,
    /// Choices (sequences) started for accepted completion requests.
    pub choices: AtomicU64,
    /// Accepted completion requests with stop strings.
    pub stop_string_requests: AtomicU64,
    /// Accepted completion requests with min-p or a presence, frequency or
    /// repetition penalty.
    pub penalty_requests: AtomicU64,
    /// Prompt tokens taken from a prefix cache instead of a prefill.
    pub cached_prompt_tokens: AtomicU64,
    /// `POST /tokenize` requests, accepted or not.
    pub tokenize_requests: AtomicU64,
    /// `POST /detokenize` requests, accepted or not.
    pub detokenize_requests: AtomicU64,
    /// `POST /v1/embeddings` requests, accepted or not.
    pub embedding_requests: AtomicU64,
    /// Inputs embedded.
    pub embedding_inputs: AtomicU64,
    /// Accepted completion requests with a `response_format`, `json_schema` or `grammar`
    /// constraint.
    pub structured_requests: AtomicU64,
    /// Nanoseconds the model thread spent applying constraints: waiting for masks not yet
    /// computed, masking the logits and advancing the matchers.
    pub constraint_nanos: AtomicU64,
    /// Requests whose prompt started from cached keys and values (a slot's previous
    /// sequence or the prefix store).
    pub prefix_hits: AtomicU64,
    /// Blocks evicted from the prefix store.
    pub prefix_evictions: AtomicU64,
    /// Bytes the prefix store holds.
    pub prefix_bytes: AtomicUsize,
    /// Blocks the prefix store holds.
    pub prefix_blocks: AtomicUsize,
    /// Bytes of keys and values the slots' caches are backed for.
    pub kv_cache_bytes: AtomicUsize,
    /// Tokens drafted for speculative decoding (run in verify passes).
    pub draft_tokens: AtomicU64,
    /// Drafted tokens the model chose too (kept).
    pub draft_accepted_tokens: AtomicU64,
    prefill_tokens: AtomicU64,
    prefill_nanos: AtomicU64,
    decode_tokens: AtomicU64,
    decode_nanos: AtomicU64,
}

impl Metrics {
    /// Counts a prefill chunk of `tokens` that took `d`.
    pub fn add_prefill(&self, tokens: usize, d: Duration) {
        self.prefill_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
        self.prefill_nanos.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Counts a decode step over `rows` sequences that took `d`.
    pub fn add_decode(&self, rows: usize, d: Duration) {
        self.decode_tokens.fetch_add(rows as u64, Ordering::Relaxed);
        self.decode_nanos.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Counts a verify pass of `drafted` tokens of which `accepted` were kept.
    pub fn add_drafts(&self, drafted: usize, accepted: usize) {
        self.draft_tokens.fetch_add(drafted as u64, Ordering::Relaxed);
        self.draft_accepted_tokens.fetch_add(accepted as u64, Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let rate = |tokens: u64, nanos: u64| if nanos == 0 { 0.0 } else { tokens as f64 / (nanos as f64 * 1e-9) };
        let mut out = String::new();
        let mut put = |name: &str, kind: &str, help: &str, value: String| {
            out.push_str(&format!(
                "# HELP fusebox_{name} {help}\n# TYPE fusebox_{name} {kind}\nfusebox_{name} {value}\n"
            ));
        };
        put("requests_total", "counter", "Completion requests received.", g(&self.requests).to_string());
        put("requests_rejected_total", "counter", "Requests answered with an error.", g(&self.rejected).to_string());
        put(
            "requests_finished_total",
            "counter",
            "Generations that ended (stop or length).",
            g(&self.finished).to_string(),
        );
        put(
            "requests_cancelled_total",
            "counter",
            "Generations dropped by a disconnected client.",
            g(&self.cancelled).to_string(),
        );
        put(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens of accepted requests.",
            g(&self.prompt_tokens).to_string(),
        );
        put("completion_tokens_total", "counter", "Tokens generated.", g(&self.completion_tokens).to_string());
        for (name, help, v) in [
            ("requests_logprobs_total", "Completion requests that asked for logprobs.", &self.logprobs_requests),
            ("requests_multiple_choices_total", "Completion requests with n > 1.", &self.multi_choice_requests),
            ("choices_total", "Choices (sequences) started for completion requests.", &self.choices),
            ("requests_stop_strings_total", "Completion requests with stop strings.", &self.stop_string_requests),
            (
                "requests_penalties_total",
                "Completion requests with min_p or a presence, frequency or repetition penalty.",
                &self.penalty_requests,
            ),
            (
                "prompt_tokens_cached_total",
                "Prompt tokens taken from a prefix cache instead of a prefill.",
                &self.cached_prompt_tokens,
            ),
            (
                "prefix_cache_hits_total",
                "Requests whose prompt started from cached keys and values.",
                &self.prefix_hits,
            ),
            ("prefix_cache_evictions_total", "Blocks evicted from the prefix store.", &self.prefix_evictions),
            ("tokenize_requests_total", "POST /tokenize requests.", &self.tokenize_requests),
            ("detokenize_requests_total", "POST /detokenize requests.", &self.detokenize_requests),
            ("embedding_requests_total", "POST /v1/embeddings requests.", &self.embedding_requests),
            ("embedding_inputs_total", "Inputs embedded.", &self.embedding_inputs),
            (
                "requests_structured_total",
                "Completion requests constrained by response_format, json_schema or grammar.",
                &self.structured_requests,
            ),
            ("draft_tokens_total", "Tokens drafted for speculative decoding.", &self.draft_tokens),
            ("draft_tokens_accepted_total", "Drafted tokens the model chose too (kept).", &self.draft_accepted_tokens),
        ] {
            put(name, "counter", help, g(v).to_string());
        }
        let (drafted, accepted) = (g(&self.draft_tokens), g(&self.draft_accepted_tokens));
        put(
            "draft_acceptance_rate",
            "gauge",
            "Drafted tokens kept / drafted (0 before any drafting).",
            format!("{:.4}", if drafted == 0 { 0.0 } else { accepted as f64 / drafted as f64 }),
        );
        put(
            "prefill_tokens_total",
            "counter",
            "Prompt tokens run through the model.",
            g(&self.prefill_tokens).to_string(),
        );
        put(
            "decode_tokens_total",
            "counter",
            "Tokens decoded (one per sequence per step).",
            g(&self.decode_tokens).to_string(),
        );
        put(
            "constraint_seconds_total",
            "counter",
            "Model-thread time spent on constraints: waiting for token masks, masking, advancing matchers.",
            format!("{:.6}", g(&self.constraint_nanos) as f64 * 1e-9),
        );
        put(
            "queue_depth",
            "gauge",
            "Requests waiting for a slot.",
            self.queue_depth.load(Ordering::Relaxed).to_string(),
        );
        put(
            "prefix_cache_bytes",
            "gauge",
            "Bytes of keys, values and states the prefix store holds (--cache-ram).",
            self.prefix_bytes.load(Ordering::Relaxed).to_string(),
        );
        put(
            "prefix_cache_blocks",
            "gauge",
            "Blocks the prefix store holds.",
            self.prefix_blocks.load(Ordering::Relaxed).to_string(),
        );
        put(
            "kv_cache_bytes",
            "gauge",
            "Bytes of keys and values the slots' KV caches are backed for (they grow as sequences fill).",
            self.kv_cache_bytes.load(Ordering::Relaxed).to_string(),
        );
        put("slots_busy", "gauge", "Slots holding a request.", self.slots_busy.load(Ordering::Relaxed).to_string());
        put("slots_total", "gauge", "Slots (--parallel).", self.slots_total.load(Ordering::Relaxed).to_string());
        put(
            "prefill_tokens_per_second",
            "gauge",
            "Prompt tokens per second of prefill time.",
            format!("{:.3}", rate(g(&self.prefill_tokens), g(&self.prefill_nanos))),
        );
        put(
            "decode_tokens_per_second",
            "gauge",
            "Tokens decoded per second of decode time (all sequences of a step together).",
            format!("{:.3}", rate(g(&self.decode_tokens), g(&self.decode_nanos))),
        );
        out
    }
}
