//! [`ChatSession`]: a multi-turn conversation over one KV cache.
//!
//! Each turn renders the whole conversation with the model's template and tokenizes
//! it. When the new ids extend what the cache holds (the previous prompt and the
//! reply's tokens), only the difference is run; when they do not (a template that
//! rewrites earlier turns, a reply that re-tokenizes differently), the cache is started
//! again and the whole conversation is run, and the turn says so. A conversation that
//! does not fit the context is an error, unless context shift is on: then the oldest
//! user/assistant exchanges are dropped (the system message stays) until it fits with
//! room for an answer.

use fusebox::{ComputeBackend, Error, Result};

use super::{Pretrained, Session};
use crate::chat::{ChatTemplate, OutputFormat, Part, ReplyDecoder};
use crate::sampler::Sampler;

/// The messages of a conversation: an optional system message, then the turns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conversation {
    system: Option<String>,
    messages: Vec<(String, String)>,
}

impl Conversation {
    /// An empty conversation with `system` as its first message, if given.
    pub fn new(system: Option<&str>) -> Self {
        Conversation { system: system.map(str::to_owned), messages: Vec::new() }
    }

    /// Appends a message (`role` is `user` or `assistant`).
    pub fn push(&mut self, role: &str, content: &str) {
        self.messages.push((role.to_owned(), content.to_owned()));
    }

    /// Removes the last message (a user message that was not answered).
    pub fn pop(&mut self) -> Option<(String, String)> {
        self.messages.pop()
    }

    /// Forgets every turn; the system message stays.
    pub fn clear(&mut self) {
        self.messages.clear();
    }

    /// Messages after the system message.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// Whether there is no message after the system message.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// Drops the oldest exchange: the first user message and the assistant messages
    /// after it, up to the next user message. Never drops the last message (the one
    /// being answered). Returns whether something was dropped.
    pub fn drop_oldest_turn(&mut self) -> bool {
        let next_user = self.messages.iter().skip(1).position(|(r, _)| r == "user").map(|p| p + 1);
        match next_user {
            Some(end) if end < self.messages.len() => {
                self.messages.drain(..end);
                true
            }
            _ => false,
        }
    }

    /// `(role, content)` pairs, the system message first.
    pub fn pairs(&self) -> Vec<(&str, &str)> {
        let mut out = Vec::with_capacity(self.messages.len() + 1);
        if let Some(s) = &self.system {
            out.push(("system", s.as_str()));
        }
        out.extend(self.messages.iter().map(|(r, c)| (r.as_str(), c.as_str())));
        out
    }
}

/// How a turn's prompt meets the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefill {
    /// The new ids start with every cached id: run `new[reuse..]` after the cache.
    Extend {
        /// Cached positions kept.
        reuse: usize,
    },
    /// The new ids depart from the cache at `common` (or add nothing to it): start the
    /// cache again and run all of them.
    Restart {
        /// Length of the common prefix of the cached and the new ids.
        common: usize,
    },
}

/// Whether `new` extends `cached` (with at least one more id), or the cache must be
/// started again.
pub fn plan_prefill(cached: &[u32], new: &[u32]) -> Prefill {
    if new.len() > cached.len() && new.starts_with(cached) {
        Prefill::Extend { reuse: cached.len() }
    } else {
        Prefill::Restart { common: cached.iter().zip(new).take_while(|(a, b)| a == b).count() }
    }
}

/// Renders and tokenizes `conv` with `encode` until it fits `ctx` positions with
/// `reserve` left for the answer; with `shift`, drops the oldest exchanges to make it
/// fit. Returns the ids and how many exchanges were dropped. Without `shift`, a
/// conversation that leaves no position to answer in is an error saying so.
pub fn fit_conversation(
    conv: &mut Conversation,
    ctx: usize,
    reserve: usize,
    shift: bool,
    mut encode: impl FnMut(&Conversation) -> Result<Vec<u32>>,
) -> Result<(Vec<u32>, usize)> {
    let mut dropped = 0;
    loop {
        let ids = encode(conv)?;
        let fits = if shift { ids.len() + reserve.max(1) <= ctx } else { ids.len() < ctx };
        if fits {
            return Ok((ids, dropped));
        }
        if shift && conv.drop_oldest_turn() {
            dropped += 1;
            continue;
        }
        if ids.len() < ctx {
            // Context shift has nothing left to drop, but the answer has some room.
            return Ok((ids, dropped));
        }
        return Err(Error::value(
            "chat",
            "conversation length",
            format!(
                "fewer than {ctx} tokens (--ctx-size) to leave room for an answer{}",
                if shift { "" } else { "; /reset starts over, --context-shift drops the oldest turns instead" }
            ),
            format!("{} tokens", ids.len()),
        ));
    }
}

/// Why an answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEnd {
    /// An end-of-turn or end-of-sequence token.
    StopToken,
    /// The answer reached the token limit.
    MaxTokens,
    /// The context is full.
    ContextFull,
    /// The caller asked to stop (Ctrl-C).
    Interrupted,
}

impl TurnEnd {
    /// `"stop_token"`, `"max_tokens"`, `"context_full"` or `"interrupted"`.
    pub fn name(self) -> &'static str {
        match self {
            TurnEnd::StopToken => "stop_token",
            TurnEnd::MaxTokens => "max_tokens",
            TurnEnd::ContextFull => "context_full",
            TurnEnd::Interrupted => "interrupted",
        }
    }
}

/// What one turn did.
#[derive(Debug, Clone)]
pub struct Turn {
    /// The answer's text (special tokens left out; in the harmony format, the final
    /// channel only).
    pub reply: String,
    /// The reasoning's text (harmony's analysis channel), empty for a plain chat format.
    pub reasoning: String,
    /// The answer's tokens (without the stop token).
    pub tokens: Vec<u32>,
    /// Why the answer ended.
    pub end: TurnEnd,
    /// Tokens of the rendered conversation this turn.
    pub prompt_tokens: usize,
    /// Cached positions reused.
    pub reused: usize,
    /// Tokens run before the answer (the prompt minus what was reused).
    pub prefilled: usize,
    /// The common prefix length when the cache had to be started again, else `None`.
    pub restarted: Option<usize>,
    /// Oldest exchanges dropped by context shift this turn.
    pub dropped_turns: usize,
}

/// Options of a [`ChatSession`].
#[derive(Debug, Clone, Copy)]
pub struct ChatOptions {
    /// Positions the KV cache holds.
    pub ctx_size: usize,
    /// Most tokens in one answer.
    pub max_tokens: usize,
    /// Drop the oldest exchanges when the conversation does not fit.
    pub context_shift: bool,
}

/// A conversation with a model over one KV cache (see the module docs).
pub struct ChatSession<'m> {
    model: &'m Pretrained,
    template: &'m ChatTemplate,
    backend: &'m dyn ComputeBackend,
    session: Session<'m>,
    cached: Vec<u32>,
    conversation: Conversation,
    stop: Vec<u32>,
    format: OutputFormat,
    options: ChatOptions,
}

impl<'m> ChatSession<'m> {
    /// A session for `model` with its chat template, `system` as the system message.
    pub fn new(
        model: &'m Pretrained,
        backend: &'m dyn ComputeBackend,
        system: Option<&str>,
        options: ChatOptions,
    ) -> Result<Self> {
        ChatSession::with_cache_dtype(model, backend, system, options, fusebox::DType::F32)
    }

    /// As [`new`](Self::new) with the KV cache stored in `cache_dtype` (F32, F16 or BF16).
    pub fn with_cache_dtype(
        model: &'m Pretrained,
        backend: &'m dyn ComputeBackend,
        system: Option<&str>,
        options: ChatOptions,
        cache_dtype: fusebox::DType,
    ) -> Result<Self> {
        if options.ctx_size == 0 || options.ctx_size > model.context_length() {
            return Err(Error::value(
                "chat",
                "--ctx-size",
                format!("1..={} (the model's context length)", model.context_length()),
                options.ctx_size,
            ));
        }
        let template = model.chat_template()?;
        let format = OutputFormat::detect(template, &model.tokenizer);
        Ok(ChatSession {
            model,
            template,
            backend,
            session: model.session_with_cache(backend, options.ctx_size, cache_dtype)?,
            cached: Vec::new(),
            conversation: Conversation::new(system),
            stop: format.stop_ids(model.stop_ids(true)),
            format,
            options,
        })
    }

    /// The conversation so far.
    pub fn conversation(&self) -> &Conversation {
        &self.conversation
    }

    /// Positions the cache holds now.
    pub fn cached_tokens(&self) -> usize {
        self.cached.len()
    }

    /// The dtype the KV cache is stored in (the one given at construction, kept when the
    /// cache starts again).
    pub fn cache_dtype(&self) -> fusebox::DType {
        self.session.cache_dtype()
    }

    /// Forgets the conversation (the system message stays); the cache starts again on
    /// the next turn.
    pub fn reset(&mut self) {
        self.conversation.clear();
        self.cached.clear();
    }

    /// Answers `user`: streams the answer's text to `on_text` as it comes, and stops at
    /// a stop token, `max_tokens`, a full context, or when `interrupted()` turns true
    /// (checked after every token). The answer, however it ended, joins the
    /// conversation. A conversation that does not fit is an error, and `user` is not
    /// kept.
    pub fn answer(
        &mut self,
        user: &str,
        sampler: &mut Sampler,
        interrupted: &dyn Fn() -> bool,
        on_text: &mut dyn FnMut(&str) -> Result<()>,
    ) -> Result<Turn> {
        self.answer_parts(user, sampler, interrupted, &mut |part, text| match part {
            Part::Content => on_text(text),
            Part::Reasoning | Part::ToolCall => Ok(()),
        })
    }

    /// As [`answer`](Self::answer), streaming every part of the reply to `on_part`: the
    /// answer, and in the harmony format the reasoning and tool-call arguments too. Only
    /// the answer joins the conversation (the template drops earlier reasoning anyway).
    pub fn answer_parts(
        &mut self,
        user: &str,
        sampler: &mut Sampler,
        interrupted: &dyn Fn() -> bool,
        on_part: &mut dyn FnMut(Part, &str) -> Result<()>,
    ) -> Result<Turn> {
        let model = self.model;
        let tok = &model.tokenizer;
        let template = self.template;
        self.conversation.push("user", user);
        let reserve = self.options.max_tokens.min(self.options.ctx_size / 2);
        let fitted =
            fit_conversation(&mut self.conversation, self.options.ctx_size, reserve, self.options.context_shift, |c| {
                Ok(template.encode(tok, &template.apply(&c.pairs(), true)?))
            });
        let (ids, dropped_turns) = match fitted {
            Ok(x) => x,
            Err(e) => {
                self.conversation.pop();
                return Err(e);
            }
        };
        let run = self.run_turn(&ids, sampler, interrupted, on_part);
        let (tokens, end, reuse, restarted, routed) = match run {
            Ok(x) => x,
            Err(e) => {
                // The cache no longer matches what it held: the next turn starts it again.
                self.conversation.pop();
                self.cached.clear();
                return Err(e);
            }
        };
        let reply = tok.decode_with(&routed[0], true)?;
        let reasoning = tok.decode_with(&routed[1], true)?;
        self.conversation.push("assistant", &reply);
        Ok(Turn {
            reply,
            reasoning,
            tokens,
            end,
            prompt_tokens: ids.len(),
            reused: reuse,
            prefilled: ids.len() - reuse,
            restarted,
            dropped_turns,
        })
    }

    /// Runs the turn's prompt `ids` on the cache and samples the answer; returns its
    /// tokens, why it ended, the positions reused, when the cache started again the
    /// common prefix length, and the ids of the answer and of the reasoning.
    #[allow(clippy::type_complexity)]
    fn run_turn(
        &mut self,
        ids: &[u32],
        sampler: &mut Sampler,
        interrupted: &dyn Fn() -> bool,
        on_part: &mut dyn FnMut(Part, &str) -> Result<()>,
    ) -> Result<(Vec<u32>, TurnEnd, usize, Option<usize>, [Vec<u32>; 2])> {
        let model = self.model;
        let tok = &model.tokenizer;
        let (reuse, restarted) = match plan_prefill(&self.cached, ids) {
            Prefill::Extend { reuse } if reuse == self.session.len() => (reuse, None),
            Prefill::Extend { reuse } => (0, Some(reuse)),
            Prefill::Restart { common } => (0, Some(common)),
        };
        if reuse == 0 && (restarted.is_some() || !self.session.is_empty()) {
            // The new caches keep the dtype chosen at construction: an F32 cache after
            // a restart would change the answers to the same prompt (`--cache-type`).
            let dtype = self.session.cache_dtype();
            self.session = model.session_with_cache(self.backend, self.options.ctx_size, dtype)?;
        }
        let restarted = restarted.filter(|_| !self.cached.is_empty());
        self.cached.truncate(reuse);
        let new = &ids[reuse..];
        let mut logits = self.session.step(self.backend, new)?;
        self.cached.extend_from_slice(new);
        let mut seen = ids.to_vec();
        let mut decoder = ReplyDecoder::new(tok, self.format);
        let mut tokens = Vec::new();
        let end = loop {
            let next = sampler.sample(self.session.sampled(&logits), &seen)?;
            if self.stop.contains(&next) {
                break TurnEnd::StopToken;
            }
            tokens.push(next);
            seen.push(next);
            decoder.push(next, on_part)?;
            if tokens.len() >= self.options.max_tokens {
                break TurnEnd::MaxTokens;
            }
            if interrupted() {
                break TurnEnd::Interrupted;
            }
            if self.session.len() >= self.session.capacity() {
                break TurnEnd::ContextFull;
            }
            logits = self.session.step(self.backend, &[next])?;
            self.cached.push(next);
        };
        decoder.finish(on_part)?;
        let routed = [decoder.ids(Part::Content).to_vec(), decoder.ids(Part::Reasoning).to_vec()];
        Ok((tokens, end, reuse, restarted, routed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_extends_only_a_strict_prefix() {
        assert_eq!(plan_prefill(&[], &[1, 2]), Prefill::Extend { reuse: 0 });
        assert_eq!(plan_prefill(&[1, 2], &[1, 2, 3, 4]), Prefill::Extend { reuse: 2 });
        assert_eq!(plan_prefill(&[1, 2, 3], &[1, 2, 9, 4]), Prefill::Restart { common: 2 });
        // Nothing new to run: the last logits are gone, so the cache starts again.
        assert_eq!(plan_prefill(&[1, 2], &[1, 2]), Prefill::Restart { common: 2 });
        assert_eq!(plan_prefill(&[1, 2, 3], &[1, 2]), Prefill::Restart { common: 2 });
    }

    fn conv(n_exchanges: usize) -> Conversation {
        let mut c = Conversation::new(Some("sys"));
        for i in 0..n_exchanges {
            c.push("user", &format!("u{i}"));
            c.push("assistant", &format!("a{i}"));
        }
        c.push("user", "last");
        c
    }

    /// Ten tokens per message, the system message included.
    fn ten_each(c: &Conversation) -> Result<Vec<u32>> {
        Ok((0..c.pairs().len() * 10).map(|i| i as u32).collect())
    }

    #[test]
    fn drop_oldest_turn_keeps_the_system_message_and_the_last_message() {
        let mut c = conv(2);
        assert!(c.drop_oldest_turn());
        assert_eq!(c.pairs(), vec![("system", "sys"), ("user", "u1"), ("assistant", "a1"), ("user", "last")]);
        assert!(c.drop_oldest_turn());
        assert_eq!(c.pairs(), vec![("system", "sys"), ("user", "last")]);
        assert!(!c.drop_oldest_turn());
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn a_conversation_that_does_not_fit_is_an_error_without_context_shift() {
        // system + 2 exchanges + last = 6 messages = 60 tokens.
        let mut c = conv(2);
        let (ids, dropped) = fit_conversation(&mut c, 61, 20, false, ten_each).unwrap();
        assert_eq!((ids.len(), dropped), (60, 0));
        let e = fit_conversation(&mut c, 60, 20, false, ten_each).unwrap_err().to_string();
        assert!(e.contains("60 tokens") && e.contains("--context-shift") && e.contains("/reset"), "{e}");
        assert_eq!(c.len(), 5, "nothing is dropped without context shift");
    }

    #[test]
    fn context_shift_drops_the_oldest_exchanges_until_the_answer_has_room() {
        let mut c = conv(2);
        // 60 + 20 > 70: one exchange goes (40 + 20 ≤ 70).
        let (ids, dropped) = fit_conversation(&mut c, 70, 20, true, ten_each).unwrap();
        assert_eq!((ids.len(), dropped), (40, 1));
        assert_eq!(c.pairs()[1], ("user", "u1"));
        // Only the system message and the question left: still an answer with less room.
        let mut c = conv(2);
        let (ids, dropped) = fit_conversation(&mut c, 25, 20, true, ten_each).unwrap();
        assert_eq!((ids.len(), dropped), (20, 2));
        // Nothing left to drop and no room at all.
        let mut c = conv(0);
        assert!(fit_conversation(&mut c, 20, 5, true, ten_each).is_err());
    }
}
