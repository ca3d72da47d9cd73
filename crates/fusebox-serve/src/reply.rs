//! The text side of one job: generated ids in, [`Event`]s out.
//!
//! Each id goes through the chat format's [`ReplyParser`] (plain text, or harmony's
//! channels) to the answer, the reasoning or a tool call; structure tokens go nowhere.
//! The answer's text is sent as soon as it can no longer change (no trailing partial
//! character) and cannot be the start of a stop string; the reasoning's as soon as its
//! characters are whole. A tool call is sent whole at the end. Nothing here touches
//! the model, so the stream is tested on scripted ids.

use fusebox_models::chat::{OutputFormat, Part, ReplyParser};
use fusebox_models::tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::engine::Event;

/// Decoded ids of one part and how many bytes of their text have been sent.
#[derive(Debug, Default)]
struct Shown {
    ids: Vec<u32>,
    sent: usize,
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
        }
    }

    /// Adds generated id `id` (not a stop token) and sends the text it lets go.
    /// Returns true when a stop string appeared in the answer (the text before it is
    /// sent; the reply is over).
    pub fn push(&mut self, tok: &Tokenizer, id: u32, events: &UnboundedSender<Event>) -> bool {
        self.routed.clear();
        self.parser.push(tok, id, &mut self.routed);
        self.route(tok, events, false)
    }

    /// Ends the reply: sends all the text still held back and the tool call, if one was
    /// made. Returns whether there was a tool call.
    pub fn finish(&mut self, tok: &Tokenizer, events: &UnboundedSender<Event>) -> bool {
        self.routed.clear();
        self.parser.finish(&mut self.routed);
        self.route(tok, events, true);
        let Some(call) = self.parser.tool_calls().last() else { return false };
        let arguments = tok.decode_with(&self.tool_call, true).unwrap_or_default();
        let _ = events.send(Event::ToolCall { name: call.name().to_owned(), arguments });
        true
    }

    /// Files the routed ids and flushes what changed; true on a stop string.
    fn route(&mut self, tok: &Tokenizer, events: &UnboundedSender<Event>, last: bool) -> bool {
        let (mut content, mut reasoning) = (last, last);
        for &(part, id) in &self.routed {
            match part {
                Part::Content => {
                    self.content.ids.push(id);
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
            flush(tok, &mut self.reasoning, &[], last, &mut |t| send(events, Event::Reasoning(t)));
        }
        content && flush(tok, &mut self.content, &self.stop_strings, last, &mut |t| send(events, Event::Text(t)))
    }
}

fn send(events: &UnboundedSender<Event>, e: Event) {
    let _ = events.send(e);
}

/// Sends the decoded text of `shown` not sent yet: all of it at the end (`last`), else
/// what cannot still change (no trailing partial character) and cannot be the start of
/// a stop string. Returns true when a stop string appeared (the text before it is sent).
fn flush(tok: &Tokenizer, shown: &mut Shown, stop_strings: &[String], last: bool, out: &mut dyn FnMut(String)) -> bool {
    let Ok(text) = tok.decode_with(&shown.ids, true) else { return false };
    if shown.sent > text.len() || !text.is_char_boundary(shown.sent) {
        return false;
    }
    let mut emit = |from: usize, to: usize| {
        if to > from {
            out(text[from..to].to_string());
        }
    };
    // A stop string may straddle what was sent and what is new: search from the
    // earliest byte it could start at.
    let longest = stop_strings.iter().map(String::len).max().unwrap_or(0);
    let mut from = shown.sent.saturating_sub(longest.saturating_sub(1));
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    let hit = stop_strings.iter().filter_map(|s| text[from..].find(s.as_str()).map(|p| from + p)).min();
    if let Some(at) = hit {
        let at = at.max(shown.sent);
        emit(shown.sent, at);
        shown.sent = at;
        return true;
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
    emit(shown.sent, end);
    shown.sent = shown.sent.max(end);
    false
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
    }

    /// Feeds `ids` one at a time (the whole reply when `end`, else a cut stream) and
    /// returns what was sent, whether a stop string ended it, and whether a tool call did.
    fn run(tok: &Tokenizer, format: OutputFormat, stops: &[&str], ids: &[u32], end: bool) -> (Seen, bool, bool) {
        let (tx, mut rx) = unbounded_channel();
        let mut r = ReplyStream::new(format, stops.iter().map(|s| s.to_string()).collect());
        let mut stopped = false;
        for &id in ids {
            if r.push(tok, id, &tx) {
                stopped = true;
                break;
            }
        }
        let called = end && !stopped && r.finish(tok, &tx);
        let mut seen = Seen::default();
        while let Ok(e) = rx.try_recv() {
            match e {
                Event::Text(t) => {
                    assert!(!t.is_empty() && !t.contains("<|"), "answer text {t:?}");
                    seen.text.push_str(&t);
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

    const REPLY: &str = "<|channel|>analysis<|message|>The user wants 2+2 😀. Answer: 4.<|end|>\
                         <|start|>assistant<|channel|>final<|message|>2 + 2 = **4** 😀, DON'T worry.";

    #[test]
    fn harmony_sends_analysis_as_reasoning_and_final_as_the_answer() {
        let tok = harmony_tokenizer();
        let ids = tok.encode(REPLY, false);
        let (whole, stopped, called) = run(&tok, harmony(&tok), &[], &ids, true);
        assert!(!stopped && !called);
        assert_eq!(whole.text, "2 + 2 = **4** 😀, DON'T worry.");
        assert_eq!(whole.reasoning, "The user wants 2+2 😀. Answer: 4.");
        // A stream cut after any token has sent a prefix of each part, never more.
        for cut in 0..=ids.len() {
            let (part, ..) = run(&tok, harmony(&tok), &[], &ids[..cut], false);
            assert!(whole.text.starts_with(&part.text), "cut {cut}: {:?}", part.text);
            assert!(whole.reasoning.starts_with(&part.reasoning), "cut {cut}: {:?}", part.reasoning);
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
        assert_eq!(seen, Seen { text: "Hello 😀 world, ".into(), ..Seen::default() });
    }
}
