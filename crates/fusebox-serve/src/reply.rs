//! The text side of one job: generated ids in, [`Event`]s out.
//!
//! Each id goes through the chat format's [`ReplyParser`] (plain text, or harmony's
//! channels) to the answer, the reasoning or a tool call; structure tokens go nowhere.
//! The answer's text is sent as soon as it can no longer change (no trailing partial
//! character) and cannot be the start of a stop string; the reasoning's as soon as its
//! characters are whole. A tool call is sent whole at the end. Nothing here touches
//! the model, so the stream is tested on scripted ids.
//!
//! In a request that offers tools ([`OutputFormat::ToolCalls`]) the answer is watched
//! for the family's marker (`<tool_call>`, `[TOOL_CALLS]`, as text or as its token; for
//! Llama 3's JSON calls, a reply that starts with `{`): text that could be the start of
//! the marker is held back as a stop string's start is, the text before it is the
//! answer, and from the marker on the reply is kept until it ends. Then it is read as
//! calls ([`parse_calls`]), each sent as an [`Event::ToolCall`]; a tail that is not
//! well-formed calls is sent as the answer's text after all.
//!
//! When the request asks for logprobs, each answer token's [`TokenLogprob`] travels with
//! the text event that completes its text (a token whose text is held back waits with
//! it); at a stop string, the tokens whose text starts before it are the last ones
//! reported.

use std::collections::VecDeque;

use fusebox_models::chat::tools::parse_calls;
use fusebox_models::chat::{OutputFormat, Part, ReplyParser, ToolCallFormat};
use fusebox_models::tokenizer::Tokenizer;

use crate::engine::{Event, EventSink};
use crate::logprobs::{Placed, TokenLogprob};

/// An answer token's logprobs, waiting for its text to be sent.
#[derive(Debug)]
struct Pending {
    logprob: TokenLogprob,
    /// Bytes and characters of the decoded answer before this token.
    start: usize,
    start_chars: usize,
    /// Bytes of the decoded answer once this token was added (set by the next flush).
    end: Option<usize>,
}

/// Decoded ids of one part and how many bytes of their text have been sent.
#[derive(Debug, Default)]
struct Shown {
    ids: Vec<u32>,
    sent: usize,
    /// Length of the last decoded text, in bytes and characters.
    decoded: usize,
    decoded_chars: usize,
    /// Logprobs of tokens whose text has not all been sent, in order.
    pending: VecDeque<Pending>,
}

/// Where the tool calls of a reply begin in its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallsFrom {
    /// At this byte of the answer's text (the marker written as text, or Llama 3's `{`).
    Text(usize),
    /// At this index of the answer's ids (the marker's own token).
    Id(usize),
}

/// The watch for tool calls in the answer of a request that offers tools.
#[derive(Debug)]
struct CallWatch {
    calls: ToolCallFormat,
    marker: Option<u32>,
    from: Option<CallsFrom>,
}

/// One reply's output state (see the module docs).
#[derive(Debug)]
pub struct ReplyStream {
    parser: ReplyParser,
    stop_strings: Vec<String>,
    content: Shown,
    reasoning: Shown,
    tool_call: Vec<u32>,
    routed: Vec<(Part, u32)>,
    /// Logprobs of pushed ids not yet routed (a harmony header's ids wait), in order.
    unrouted: VecDeque<(u32, TokenLogprob)>,
    /// Tool calls in the answer's text, when the request offers tools.
    watch: Option<CallWatch>,
}

impl ReplyStream {
    /// The stream of a reply in `format`, ending its answer at the first of `stop_strings`.
    pub fn new(format: OutputFormat, stop_strings: Vec<String>) -> ReplyStream {
        ReplyStream {
            parser: format.parser(),
            stop_strings,
            content: Shown::default(),
            reasoning: Shown::default(),
            tool_call: Vec::new(),
            routed: Vec::new(),
            unrouted: VecDeque::new(),
            watch: match format {
                OutputFormat::ToolCalls { calls, marker } => Some(CallWatch { calls, marker, from: None }),
                _ => None,
            },
        }
    }

    /// Adds generated id `id` (not a stop token), with its logprobs when the request
    /// asks for them, and sends the text it lets go. Returns true when a stop string
    /// appeared in the answer (the text before it is sent; the reply is over).
    pub fn push(&mut self, tok: &Tokenizer, id: u32, logprob: Option<TokenLogprob>, events: &EventSink) -> bool {
        if let Some(l) = logprob {
            self.unrouted.push_back((id, l));
        }
        self.routed.clear();
        self.parser.push(tok, id, &mut self.routed);
        self.route(tok, events, false)
    }

    /// Ends the reply: sends all the text still held back and the tool call, if one was
    /// made. Returns whether there was a tool call.
    pub fn finish(&mut self, tok: &Tokenizer, events: &EventSink) -> bool {
        self.routed.clear();
        self.parser.finish(&mut self.routed);
        self.route(tok, events, true);
        if let Some(w) = &mut self.watch {
            let Some(from) = w.from.take() else { return false };
            let tail = match from {
                CallsFrom::Text(at) => {
                    tok.decode_with(&self.content.ids, true).ok().and_then(|t| t.get(at..).map(str::to_owned))
                }
                // The marker and any later ones are control tokens: keep their text.
                CallsFrom::Id(k) => tok.decode_with(&self.content.ids[k..], false).ok(),
            };
            if let Some(calls) = tail.and_then(|t| parse_calls(w.calls, &t)) {
                self.content.pending.clear();
                for c in calls {
                    events.send(Event::ToolCall { name: c.name, arguments: c.arguments });
                }
                return true;
            }
            // Not calls after all: the rest is the answer's text.
            let stops = &self.stop_strings;
            flush(tok, &mut self.content, stops, true, &mut |text, logprobs| {
                events.send(Event::Text { text, logprobs })
            });
            return false;
        }
        let Some(call) = self.parser.tool_calls().last() else { return false };
        let arguments = tok.decode_with(&self.tool_call, true).unwrap_or_default();
        events.send(Event::ToolCall { name: call.name().to_owned(), arguments });
        true
    }

    /// Files the routed ids and flushes what changed; true on a stop string.
    fn route(&mut self, tok: &Tokenizer, events: &EventSink, last: bool) -> bool {
        let (mut content, mut reasoning) = (last, last);
        for &(part, id) in &self.routed {
            // The routed ids come in the order they were pushed; ids never routed
            // (structure tokens, a header) have their logprobs dropped here.
            let mut logprob = None;
            while let Some((first, l)) = self.unrouted.pop_front() {
                if first == id {
                    logprob = Some(l);
                    break;
                }
            }
            match part {
                Part::Content => {
                    if let Some(w) = self.watch.as_mut().filter(|w| w.from.is_none() && w.marker == Some(id)) {
                        // The answer so far is final: send it (a stop string in it ends the reply).
                        let stopped = flush(tok, &mut self.content, &self.stop_strings, true, &mut |text, logprobs| {
                            events.send(Event::Text { text, logprobs })
                        })
                        .is_some();
                        if stopped {
                            return true;
                        }
                        w.from = Some(CallsFrom::Id(self.content.ids.len()));
                    }
                    self.content.ids.push(id);
                    if let Some(logprob) = logprob {
                        let (start, start_chars) = (self.content.decoded, self.content.decoded_chars);
                        self.content.pending.push_back(Pending { logprob, start, start_chars, end: None });
                    }
                    content = true;
                }
                Part::Reasoning => {
                    self.reasoning.ids.push(id);
                    reasoning = true;
                }
                Part::ToolCall => self.tool_call.push(id),
            }
        }
        if reasoning {
            flush(tok, &mut self.reasoning, &[], last, &mut |t, _| events.send(Event::Reasoning(t)));
        }
        if !content {
            return false;
        }
        let mut stops = std::borrow::Cow::Borrowed(&self.stop_strings[..]);
        if let Some(w) = &mut self.watch {
            if w.from.is_some() {
                // Inside the calls: kept whole until the reply ends.
                return false;
            }
            if w.calls == ToolCallFormat::Llama3Json && self.content.sent == 0 {
                // Llama 3 calls are the whole reply: one that starts with `{` is kept.
                let text = tok.decode_with(&self.content.ids, true).unwrap_or_default();
                let body = text.trim_start();
                if body.starts_with('{') {
                    w.from = Some(CallsFrom::Text(text.len() - body.len()));
                    return false;
                }
                if body.is_empty() {
                    return false;
                }
            }
            if let Some(marker) = w.calls.marker() {
                stops.to_mut().push(marker.to_owned());
            }
        }
        let hit = flush(tok, &mut self.content, &stops, last, &mut |text, logprobs| {
            events.send(Event::Text { text, logprobs })
        });
        match (hit, self.watch.as_mut()) {
            // The marker: the calls begin where the answer's text was cut.
            (Some(i), Some(w)) if i == self.stop_strings.len() => {
                w.from = Some(CallsFrom::Text(self.content.sent));
                false
            }
            (hit, _) => hit.is_some(),
        }
    }
}

/// Sends the decoded text of `shown` not sent yet: all of it at the end (`last`), else
/// what cannot still change (no trailing partial character) and cannot be the start of
/// a stop string, with the logprobs of the tokens whose text it completes. Returns the
/// index in `stop_strings` of the one that appeared first, if one did (the text before
/// it is sent, with the logprobs of the tokens that start before it).
fn flush(
    tok: &Tokenizer,
    shown: &mut Shown,
    stop_strings: &[String],
    last: bool,
    out: &mut dyn FnMut(String, Vec<Placed>),
) -> Option<usize> {
    let Ok(text) = tok.decode_with(&shown.ids, true) else { return None };
    for p in shown.pending.iter_mut().filter(|p| p.end.is_none()) {
        p.end = Some(text.len());
    }
    shown.decoded = text.len();
    shown.decoded_chars = text.chars().count();
    if shown.sent > text.len() || !text.is_char_boundary(shown.sent) {
        return None;
    }
    // Sends text[from..to] with the logprobs of the tokens `take` lets go (the pending
    // ones are in order, so they leave as a prefix).
    let mut emit = |from: usize, to: usize, pending: &mut VecDeque<Pending>, take: &dyn Fn(&Pending) -> bool| {
        let n = pending.iter().rposition(take).map_or(0, |i| i + 1);
        let placed: Vec<Placed> =
            pending.drain(..n).map(|p| Placed { logprob: p.logprob, text_offset: p.start_chars }).collect();
        if to > from || !placed.is_empty() {
            out(text[from..to.max(from)].to_string(), placed);
        }
    };
    // A stop string may straddle what was sent and what is new: search from the
    // earliest byte it could start at.
    let longest = stop_strings.iter().map(String::len).max().unwrap_or(0);
    let mut from = shown.sent.saturating_sub(longest.saturating_sub(1));
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    let hit =
        stop_strings.iter().enumerate().filter_map(|(i, s)| text[from..].find(s.as_str()).map(|p| (from + p, i))).min();
    if let Some((at, which)) = hit {
        let at = at.max(shown.sent);
        emit(shown.sent, at, &mut shown.pending, &|p| p.start < at);
        shown.pending.clear();
        shown.sent = at;
        return Some(which);
    }
    let mut end = text.len();
    if !last {
        if text[shown.sent..].ends_with('\u{FFFD}') {
            // The last token may end inside a character.
            end -= '\u{FFFD}'.len_utf8();
        }
        // Hold back a tail that a stop string starts with.
        let held = stop_strings
            .iter()
            .flat_map(|s| (1..s.len()).filter(|&k| s.is_char_boundary(k)).map(move |k| &s[..k]))
            .filter(|p| text[..end].ends_with(p))
            .map(|p| p.len())
            .max()
            .unwrap_or(0);
        end = end.saturating_sub(held).max(shown.sent);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
    }
    let sent_to = shown.sent.max(end);
    emit(shown.sent, end, &mut shown.pending, &|p| last || p.end.is_some_and(|e| e <= sent_to));
    shown.sent = sent_to;
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_models::chat::output::HarmonyTokens;
    use tokio::sync::mpsc::unbounded_channel;

    /// gpt-oss's pre-tokenizer and harmony tokens over a small trained vocabulary
    /// (fusebox-models' tokenizer fixture).
    fn harmony_tokenizer() -> Tokenizer {
        let json = include_str!("../../fusebox-models/tests/fixtures/tokenizers/o200k_style/tokenizer.json");
        Tokenizer::from_hf_json(json, None).unwrap()
    }

    fn harmony(tok: &Tokenizer) -> OutputFormat {
        OutputFormat::Harmony(HarmonyTokens::of(tok).unwrap())
    }

    /// What the events of a reply add up to.
    #[derive(Debug, Default, PartialEq)]
    struct Seen {
        text: String,
        reasoning: String,
        calls: Vec<(String, String)>,
        /// Ids whose logprobs came, each with its text offset.
        tokens: Vec<(u32, usize)>,
    }

    /// Feeds `ids` one at a time (the whole reply when `end`, else a cut stream) and
    /// returns what was sent, whether a stop string ended it, and whether a tool call did.
    /// Every id carries a logprob entry: each entry must come with or after its text.
    fn run(tok: &Tokenizer, format: OutputFormat, stops: &[&str], ids: &[u32], end: bool) -> (Seen, bool, bool) {
        let (tx, mut rx) = unbounded_channel();
        let sink = EventSink::new(0, tx);
        let mut r = ReplyStream::new(format, stops.iter().map(|s| s.to_string()).collect());
        let mut stopped = false;
        for &id in ids {
            let lp = crate::logprobs::token_logprob(tok, &[0.0; 4], id, 0);
            if r.push(tok, id, Some(lp), &sink) {
                stopped = true;
                break;
            }
        }
        let called = end && !stopped && r.finish(tok, &sink);
        let mut seen = Seen::default();
        while let Ok((choice, e)) = rx.try_recv() {
            assert_eq!(choice, 0);
            match e {
                Event::Text { text: t, logprobs } => {
                    assert!(!t.contains("<|"), "answer text {t:?}");
                    assert!(!t.is_empty() || !logprobs.is_empty());
                    seen.text.push_str(&t);
                    for p in logprobs {
                        // Its text starts within what has been sent.
                        assert!(p.text_offset <= seen.text.chars().count(), "{p:?} after {:?}", seen.text);
                        seen.tokens.push((p.logprob.chosen.id, p.text_offset));
                    }
                }
                Event::Reasoning(t) => {
                    assert!(!t.is_empty() && !t.contains("<|"), "reasoning text {t:?}");
                    seen.reasoning.push_str(&t);
                }
                Event::ToolCall { name, arguments } => seen.calls.push((name, arguments)),
                other => panic!("unexpected event {other:?}"),
            }
        }
        (seen, stopped, called)
    }

    /// The ids and text offsets a plain answer of `ids` reports logprobs for.
    fn placed(tok: &Tokenizer, ids: &[u32]) -> Vec<(u32, usize)> {
        ids.iter().enumerate().map(|(k, &id)| (id, tok.decode_with(&ids[..k], true).unwrap().chars().count())).collect()
    }

    const REPLY: &str = "<|channel|>analysis<|message|>The user wants 2+2 😀. Answer: 4.<|end|>\
                         <|start|>assistant<|channel|>final<|message|>2 + 2 = **4** 😀, DON'T worry.";

    #[test]
    fn harmony_sends_analysis_as_reasoning_and_final_as_the_answer() {
        let tok = harmony_tokenizer();
        let ids = tok.encode(REPLY, false);
        let (whole, stopped, called) = run(&tok, harmony(&tok), &[], &ids, true);
        assert!(!stopped && !called);
        assert_eq!(whole.text, "2 + 2 = **4** 😀, DON'T worry.");
        // Logprobs for the final channel's tokens only, each at its place in the answer.
        let answer = tok.encode("2 + 2 = **4** 😀, DON'T worry.", false);
        assert_eq!(whole.tokens, placed(&tok, &answer));
        assert_eq!(whole.reasoning, "The user wants 2+2 😀. Answer: 4.");
        // A stream cut after any token has sent a prefix of each part, never more.
        for cut in 0..=ids.len() {
            let (part, ..) = run(&tok, harmony(&tok), &[], &ids[..cut], false);
            assert!(whole.text.starts_with(&part.text), "cut {cut}: {:?}", part.text);
            assert!(whole.reasoning.starts_with(&part.reasoning), "cut {cut}: {:?}", part.reasoning);
            assert!(whole.tokens.starts_with(&part.tokens), "cut {cut}: {:?}", part.tokens);
            // Cut and ended there (max_tokens): still prefixes, nothing leaked.
            let (ended, ..) = run(&tok, harmony(&tok), &[], &ids[..cut], true);
            assert!(whole.text.starts_with(&ended.text) && whole.reasoning.starts_with(&ended.reasoning));
        }
    }

    #[test]
    fn stop_strings_end_the_answer_not_the_reasoning() {
        let tok = harmony_tokenizer();
        let ids = tok.encode(REPLY, false);
        // "Answer" is in the reasoning and "worry" in the answer: only the answer stops.
        let (seen, stopped, _) = run(&tok, harmony(&tok), &["Answer", "worry"], &ids, true);
        assert!(stopped);
        assert_eq!(seen.text, "2 + 2 = **4** 😀, DON'T ");
        assert_eq!(seen.reasoning, "The user wants 2+2 😀. Answer: 4.");
    }

    #[test]
    fn a_harmony_tool_call_is_sent_whole_at_the_end() {
        let tok = harmony_tokenizer();
        let ids = tok.encode(
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary \
             to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
            false,
        );
        let (seen, stopped, called) = run(&tok, harmony(&tok), &[], &ids, true);
        assert!(called && !stopped);
        assert_eq!(seen.text, "");
        assert_eq!(seen.reasoning, "Need weather.");
        assert_eq!(seen.calls, [("get_weather".to_string(), "{\"city\": \"Paris\"}".to_string())]);
    }

    #[test]
    fn plain_replies_are_all_answer() {
        let tok = harmony_tokenizer();
        let ids = tok.encode("Hello 😀 world, STOP here", false);
        let (seen, stopped, called) = run(&tok, OutputFormat::Plain, &["STOP"], &ids, true);
        assert!(stopped && !called);
        assert_eq!(seen.text, "Hello 😀 world, ");
        // The tokens whose text starts before the stop string: those of the shown text.
        let before = tok.encode("Hello 😀 world, ", false);
        assert_eq!(seen.tokens, placed(&tok, &ids[..before.len()]));
        assert!(seen.reasoning.is_empty() && seen.calls.is_empty());
    }

    /// The harmony fixture's vocabulary with Mistral's `[TOOL_CALLS]` added as a control token.
    fn tokenizer_with_tool_calls_token() -> (Tokenizer, u32) {
        let json = include_str!("../../fusebox-models/tests/fixtures/tokenizers/o200k_style/tokenizer.json");
        let mut v: serde_json::Value = serde_json::from_str(json).unwrap();
        let id = v["added_tokens"].as_array().unwrap().iter().map(|t| t["id"].as_u64().unwrap()).max().unwrap() + 1;
        v["added_tokens"].as_array_mut().unwrap().push(serde_json::json!({"id": id, "content": "[TOOL_CALLS]",
            "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}));
        let tok = Tokenizer::from_hf_json(&v.to_string(), None).unwrap();
        assert_eq!(tok.token_id("[TOOL_CALLS]"), Some(id as u32));
        (tok, id as u32)
    }

    #[test]
    fn hermes_calls_in_text_become_tool_calls_and_malformed_ones_stay_text() {
        let tok = harmony_tokenizer();
        let format = OutputFormat::ToolCalls { calls: ToolCallFormat::Hermes, marker: None };
        let reply = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let ids = tok.encode(reply, false);
        let (whole, stopped, called) = run(&tok, format, &[], &ids, true);
        assert!(called && !stopped);
        assert_eq!(whole.text, "Let me check.\n");
        assert_eq!(whole.calls, [("get_weather".to_string(), "{\"city\":\"Paris\"}".to_string())]);
        // Cut anywhere, the stream has sent a prefix of the answer and never any of the call.
        for cut in 0..ids.len() {
            let (part, ..) = run(&tok, format, &[], &ids[..cut], false);
            assert!(whole.text.starts_with(&part.text), "cut {cut}: {:?}", part.text);
            assert!(part.calls.is_empty());
        }
        // Malformed (cut JSON, or text after the call): all of it is the answer.
        for bad in [
            "Sure <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"ci",
            "<tool_call>{\"name\": \"f\"}</tool_call> and more words",
        ] {
            let ids = tok.encode(bad, false);
            let (seen, stopped, called) = run(&tok, format, &[], &ids, true);
            assert!(!called && !stopped, "{bad}");
            assert_eq!(seen.text, bad);
            assert!(seen.calls.is_empty());
        }
        // Plain text with a `<` that is not the marker is sent as it comes.
        let (seen, _, called) = run(&tok, format, &[], &tok.encode("a < b, <tool and more", false), true);
        assert_eq!((seen.text.as_str(), called), ("a < b, <tool and more", false));
    }

    #[test]
    fn llama3_json_and_mistral_calls() {
        let tok = harmony_tokenizer();
        let format = OutputFormat::ToolCalls { calls: ToolCallFormat::Llama3Json, marker: None };
        let ids = tok.encode("  {\"name\": \"now\", \"parameters\": {}}", false);
        let (seen, _, called) = run(&tok, format, &[], &ids, true);
        assert!(called && seen.text.trim().is_empty(), "{seen:?}");
        assert_eq!(seen.calls, [("now".to_string(), "{}".to_string())]);
        // JSON that is not a call is the answer.
        let ids = tok.encode("{\"answer\": 4}", false);
        let (seen, _, called) = run(&tok, format, &[], &ids, true);
        assert_eq!((seen.text.as_str(), called), ("{\"answer\": 4}", false));

        // Mistral's marker is a control token: recognised by its id.
        let (tok, marker) = tokenizer_with_tool_calls_token();
        let format = OutputFormat::ToolCalls { calls: ToolCallFormat::Mistral, marker: Some(marker) };
        let mut ids = tok.encode("Calling.", false);
        ids.push(marker);
        ids.extend(tok.encode(" [{\"name\": \"now\", \"arguments\": {}}]", false));
        let (seen, _, called) = run(&tok, format, &[], &ids, true);
        assert!(called);
        assert_eq!((seen.text.as_str(), &seen.calls[..]), ("Calling.", &[("now".to_string(), "{}".to_string())][..]));
        // Broken after the marker: the text after it is the answer.
        let mut ids = vec![marker];
        ids.extend(tok.encode(" [{\"name\": ", false));
        let (seen, _, called) = run(&tok, format, &[], &ids, true);
        assert_eq!((seen.text.as_str(), called), (" [{\"name\": ", false));
    }

    #[test]
    fn stop_strings_across_tokens_are_held_back_and_never_shown() {
        let tok = harmony_tokenizer();
        let text = "alpha beta gamma delta, the END OF TEXT marker, then more words after it";
        let ids = tok.encode(text, false);
        for stop in ["END OF TEXT", "a, the E", "ta gam", "more words after it", "x"] {
            let (whole, stopped, _) = run(&tok, OutputFormat::Plain, &[stop, "zzz"], &ids, true);
            let want = text.find(stop).map_or(text, |at| &text[..at]);
            assert_eq!((whole.text.as_str(), stopped), (want, text.contains(stop)), "{stop}");
            // Cut anywhere: the text so far is a prefix of the answer (the start of the
            // stop string is held back until it cannot be one), its logprobs a prefix
            // of the answer's.
            for cut in 0..ids.len() {
                let (part, ..) = run(&tok, OutputFormat::Plain, &[stop, "zzz"], &ids[..cut], false);
                assert!(want.starts_with(&part.text), "{stop} cut {cut}: {:?}", part.text);
                assert!(whole.tokens.starts_with(&part.tokens), "{stop} cut {cut}");
            }
        }
    }
}
