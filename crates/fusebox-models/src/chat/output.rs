//! Reading a chat model's reply: which generated tokens are the answer, which are
//! reasoning, which are a tool call, and which are structure that is never shown.
//!
//! Each chat format has its [`OutputFormat`]; [`OutputFormat::parser`] gives a
//! [`ReplyParser`] that routes generated ids, one at a time, to a [`Part`] (or
//! nowhere). It works on ids, so a structure token is recognised whatever its text
//! decodes to, and a reply cut anywhere (streaming) routes the same ids as the whole.
//! [`ReplyDecoder`] turns the routed ids into text per part, as it comes.
//!
//! * [`OutputFormat::Plain`]: every token is the answer (ChatML, Llama 3, Gemma, ...).
//! * [`OutputFormat::Harmony`]: gpt-oss's messages,
//!   `<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…<|return|>`:
//!   the `analysis` channel is reasoning, `final` (and a `commentary` preamble) the
//!   answer, and a message with a recipient (`to=functions.get_weather`) a tool call,
//!   which `<|call|>` ends. The reply ends at `<|return|>` or `<|call|>`, not at
//!   `<|end|>` ([`OutputFormat::stop_ids`]).
//!
//! * [`OutputFormat::ToolCalls`]: plain, in a request that offers tools; the calls are
//!   read from the text by [`super::tools::parse_calls`].
//!
//! Qwen3-style `<think>…</think>` reasoning is not split out yet; it would be one
//! more variant whose parser routes the ids between its two tags to
//! [`Part::Reasoning`].

use fusebox::Result;

use super::ChatTemplate;
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Where a generated token's text belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    /// The answer shown to the user (OpenAI's `content`).
    Content,
    /// The model's reasoning (llama-server's `reasoning_content`).
    Reasoning,
    /// The arguments of a tool call (see [`ReplyParser::tool_calls`] for its recipient).
    ToolCall,
}

/// The ids of harmony's structure tokens in one vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HarmonyTokens {
    /// `<|start|>`: opens a message (its header follows).
    pub start: u32,
    /// `<|channel|>`: the channel name follows, in the header.
    pub channel: u32,
    /// `<|message|>`: ends the header; the message's text follows.
    pub message: u32,
    /// `<|end|>`: ends a message, not the reply.
    pub end: u32,
    /// `<|constrain|>`: the arguments' format follows (`json`), in a tool call's header.
    pub constrain: Option<u32>,
    /// `<|return|>`: ends the reply.
    pub return_: Option<u32>,
    /// `<|call|>`: ends a tool call, and the reply.
    pub call: Option<u32>,
}

impl HarmonyTokens {
    /// The harmony tokens of `tok`, when it has the four a reply needs.
    pub fn of(tok: &Tokenizer) -> Option<HarmonyTokens> {
        Some(HarmonyTokens {
            start: tok.token_id("<|start|>")?,
            channel: tok.token_id("<|channel|>")?,
            message: tok.token_id("<|message|>")?,
            end: tok.token_id("<|end|>")?,
            constrain: tok.token_id("<|constrain|>"),
            return_: tok.token_id("<|return|>"),
            call: tok.token_id("<|call|>"),
        })
    }

    fn is_structure(&self, id: u32) -> bool {
        [self.start, self.channel, self.message, self.end].contains(&id)
            || [self.constrain, self.return_, self.call].contains(&Some(id))
    }
}

/// How a chat format lays out a reply (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// Every generated token is the answer.
    Plain,
    /// OpenAI's harmony format (gpt-oss).
    Harmony(HarmonyTokens),
    /// Every generated token is the answer's text, which may hold tool calls in
    /// `calls`' form (a request that offers tools): the parser routes ids as
    /// [`Plain`](Self::Plain) does, and the server reads the calls out of the text
    /// ([`super::tools::parse_calls`]).
    ToolCalls {
        /// The family's form of a call.
        calls: super::ToolCallFormat,
        /// The id of the token that opens the calls (`<tool_call>`, `[TOOL_CALLS]`),
        /// when the vocabulary has it as one token.
        marker: Option<u32>,
    },
}

impl OutputFormat {
    /// The format of replies under `template` with `tok`: harmony when the vocabulary
    /// has harmony's structure tokens and the template writes `<|channel|>`, else plain.
    pub fn detect(template: &ChatTemplate, tok: &Tokenizer) -> OutputFormat {
        match HarmonyTokens::of(tok) {
            Some(h) if template.source().contains("<|channel|>") => OutputFormat::Harmony(h),
            _ => OutputFormat::Plain,
        }
    }

    /// `ids` (a model's stop ids) less those that do not end a reply in this format:
    /// harmony's `<|end|>`, which ends one message of it.
    pub fn stop_ids(&self, mut ids: Vec<u32>) -> Vec<u32> {
        if let OutputFormat::Harmony(h) = self {
            ids.retain(|&id| id != h.end);
        }
        ids
    }

    /// A parser for one reply, which starts right after the generation prompt.
    pub fn parser(&self) -> ReplyParser {
        ReplyParser { format: *self, state: State::Header(Vec::new()), tool_calls: Vec::new(), structured: false }
    }
}

/// A tool call's header: whom it is for and in what format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallHeader {
    /// The recipient as the model wrote it (`functions.get_weather`).
    pub recipient: String,
    /// The `<|constrain|>` format, or the word after the channel (`json`), if any.
    pub format: Option<String>,
}

impl ToolCallHeader {
    /// The function's name: the recipient without a `functions.` namespace.
    pub fn name(&self) -> &str {
        self.recipient.strip_prefix("functions.").unwrap_or(&self.recipient)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Reading a message header: its ids so far (structure tokens included).
    Header(Vec<u32>),
    /// In a message's text, which goes to this part.
    Body(Part),
    /// After `<|end|>`, before the next `<|start|>`.
    Between,
}

/// Routes one reply's generated ids to [`Part`]s (see the module docs).
#[derive(Debug, Clone)]
pub struct ReplyParser {
    format: OutputFormat,
    state: State,
    tool_calls: Vec<ToolCallHeader>,
    /// A structure token has been seen: the reply is in the format.
    structured: bool,
}

impl ReplyParser {
    /// Adds generated token `id` (not a stop token); appends to `out` the ids it lets
    /// go, each with its part (a header's ids wait for its `<|message|>`).
    pub fn push(&mut self, tok: &Tokenizer, id: u32, out: &mut Vec<(Part, u32)>) {
        let h = match self.format {
            OutputFormat::Plain | OutputFormat::ToolCalls { .. } => {
                out.push((Part::Content, id));
                return;
            }
            OutputFormat::Harmony(h) => h,
        };
        self.structured |= h.is_structure(id);
        if id == h.start {
            self.state = State::Header(Vec::new());
            return;
        }
        if id == h.end || Some(id) == h.return_ || Some(id) == h.call {
            self.state = State::Between;
            return;
        }
        if id == h.message && matches!(self.state, State::Header(_)) {
            let part = self.header_part(tok, &h);
            self.state = State::Body(part);
            return;
        }
        match &mut self.state {
            State::Header(ids) => ids.push(id),
            // Structure tokens inside a message's text are dropped, never shown.
            _ if h.is_structure(id) => {}
            State::Body(part) => out.push((*part, id)),
            // Text outside any message: the model left the format; keep it as the answer.
            State::Between => out.push((Part::Content, id)),
        }
    }

    /// Ends the reply: a reply without a single structure token (the model ignored the
    /// format) is the answer; an unfinished header is dropped.
    pub fn finish(&mut self, out: &mut Vec<(Part, u32)>) {
        if let (OutputFormat::Harmony(_), State::Header(ids)) = (self.format, &self.state) {
            if !self.structured {
                out.extend(ids.iter().map(|&id| (Part::Content, id)));
            }
        }
        self.state = State::Between;
    }

    /// The tool calls begun so far, in order; [`Part::ToolCall`] ids belong to the last.
    pub fn tool_calls(&self) -> &[ToolCallHeader] {
        &self.tool_calls
    }

    /// The part a message's text goes to, from its header's ids
    /// (`assistant<|channel|>final`, `<|channel|>commentary to=functions.f <|constrain|>json`).
    fn header_part(&mut self, tok: &Tokenizer, h: &HarmonyTokens) -> Part {
        let State::Header(ids) = &self.state else { return Part::Content };
        // The header's text in segments: before `<|channel|>`, the channel's, the constraint's.
        let (mut before, mut channel, mut constrain) = (Vec::new(), Vec::new(), Vec::new());
        let mut seg = &mut before;
        for &id in ids {
            if id == h.channel {
                seg = &mut channel;
            } else if Some(id) == h.constrain {
                seg = &mut constrain;
            } else {
                seg.push(id);
            }
        }
        let text = |ids: &[u32]| tok.decode_with(ids, true).unwrap_or_default();
        let (before, channel, constrain) = (text(&before), text(&channel), text(&constrain));
        let mut channel_words = channel.split_whitespace();
        let name = channel_words.next().unwrap_or("");
        let recipient = [before.as_str(), channel.as_str()]
            .iter()
            .flat_map(|s| s.split_whitespace())
            .find_map(|w| w.strip_prefix("to="))
            .filter(|r| !r.is_empty());
        if let Some(recipient) = recipient {
            let format = constrain
                .split_whitespace()
                .next()
                .or_else(|| channel_words.find(|w| !w.starts_with("to=")))
                .map(str::to_owned);
            self.tool_calls.push(ToolCallHeader { recipient: recipient.to_owned(), format });
            return Part::ToolCall;
        }
        match name {
            "analysis" => Part::Reasoning,
            _ => Part::Content,
        }
    }
}

/// The text of each part of a reply as generated: a [`ReplyParser`] and a
/// [`StreamDecoder`] per part (special tokens left out, characters never split).
pub struct ReplyDecoder<'t> {
    tok: &'t Tokenizer,
    parser: ReplyParser,
    content: StreamDecoder<'t>,
    reasoning: StreamDecoder<'t>,
    tool_call: StreamDecoder<'t>,
    routed: Vec<(Part, u32)>,
    /// The ids routed to each part so far: content, reasoning, tool call.
    ids: [Vec<u32>; 3],
}

impl<'t> ReplyDecoder<'t> {
    /// A decoder for one reply in `format`.
    pub fn new(tok: &'t Tokenizer, format: OutputFormat) -> Self {
        ReplyDecoder {
            tok,
            parser: format.parser(),
            content: tok.stream_decoder(true),
            reasoning: tok.stream_decoder(true),
            tool_call: tok.stream_decoder(true),
            routed: Vec::new(),
            ids: Default::default(),
        }
    }

    /// The ids routed to `part` so far (decode them whole for text that, unlike the
    /// streamed pieces, drops a SentencePiece-style leading space).
    pub fn ids(&self, part: Part) -> &[u32] {
        &self.ids[part as usize]
    }

    /// Adds generated token `id`; calls `emit` with the text it completes, per part
    /// (once for each id the parser lets go, with empty text where a token ends inside
    /// a character, so a failing `emit` is noticed at once).
    pub fn push(&mut self, id: u32, emit: &mut dyn FnMut(Part, &str) -> Result<()>) -> Result<()> {
        self.routed.clear();
        self.parser.push(self.tok, id, &mut self.routed);
        self.drain(emit)
    }

    /// Ends the reply: the text still held back, per part (the answer's always, if
    /// empty).
    pub fn finish(&mut self, emit: &mut dyn FnMut(Part, &str) -> Result<()>) -> Result<()> {
        self.routed.clear();
        self.parser.finish(&mut self.routed);
        self.drain(emit)?;
        for (part, d) in [
            (Part::Content, &mut self.content),
            (Part::Reasoning, &mut self.reasoning),
            (Part::ToolCall, &mut self.tool_call),
        ] {
            let rest = d.finish();
            if !rest.is_empty() || part == Part::Content {
                emit(part, &rest)?;
            }
        }
        Ok(())
    }

    /// The tool calls begun so far.
    pub fn tool_calls(&self) -> &[ToolCallHeader] {
        self.parser.tool_calls()
    }

    fn drain(&mut self, emit: &mut dyn FnMut(Part, &str) -> Result<()>) -> Result<()> {
        for &(part, id) in &self.routed {
            self.ids[part as usize].push(id);
            let d = match part {
                Part::Content => &mut self.content,
                Part::Reasoning => &mut self.reasoning,
                Part::ToolCall => &mut self.tool_call,
            };
            emit(part, &d.push(id)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level vocabulary with gpt-oss's pre-tokenizer and harmony's special tokens.
    fn harmony_tokenizer() -> Tokenizer {
        Tokenizer::from_hf_json(include_str!("../../tests/fixtures/tokenizers/o200k_style/tokenizer.json"), None)
            .unwrap()
    }

    fn harmony(tok: &Tokenizer) -> OutputFormat {
        OutputFormat::Harmony(HarmonyTokens::of(tok).unwrap())
    }

    /// A reply's ids as the model would generate them, without the stop token.
    fn reply(tok: &Tokenizer, text: &str) -> Vec<u32> {
        tok.encode(text, false)
    }

    /// The text of each part, fed one id at a time; every piece is checked to hold no
    /// structure token's text.
    fn decode(tok: &Tokenizer, format: OutputFormat, ids: &[u32]) -> (String, String, String, Vec<ToolCallHeader>) {
        let mut d = ReplyDecoder::new(tok, format);
        let (mut content, mut reasoning, mut call) = (String::new(), String::new(), String::new());
        let mut emit = |part: Part, text: &str| {
            assert!(!text.contains("<|"), "{part:?} got structure text {text:?}");
            match part {
                Part::Content => content.push_str(text),
                Part::Reasoning => reasoning.push_str(text),
                Part::ToolCall => call.push_str(text),
            }
            Ok(())
        };
        for &id in ids {
            d.push(id, &mut emit).unwrap();
        }
        d.finish(&mut emit).unwrap();
        let calls = d.tool_calls().to_vec();
        (content, reasoning, call, calls)
    }

    #[test]
    fn harmony_splits_analysis_from_the_final_answer() {
        let tok = harmony_tokenizer();
        let ids = reply(
            &tok,
            "<|channel|>analysis<|message|>User asks 2+2. Easy: 4 😀.<|end|>\
             <|start|>assistant<|channel|>final<|message|>The answer is **4** 😀.",
        );
        let (content, reasoning, call, calls) = decode(&tok, harmony(&tok), &ids);
        assert_eq!(content, "The answer is **4** 😀.");
        assert_eq!(reasoning, "User asks 2+2. Easy: 4 😀.");
        assert!(call.is_empty() && calls.is_empty());
        // The same ids in the plain format are all answer (structure tokens left out).
        let (content, reasoning, ..) = decode(&tok, OutputFormat::Plain, &ids);
        assert!(content.starts_with("analysis") && reasoning.is_empty(), "{content:?}");
    }

    #[test]
    fn harmony_routes_every_prefix_as_the_whole() {
        // A reply cut after any token (a stream, or max_tokens) routes a prefix of what
        // the whole reply routes, part by part: nothing is sent and later taken back.
        let tok = harmony_tokenizer();
        let ids = reply(
            &tok,
            "<|channel|>analysis<|message|>Think.\nMore.<|end|><|start|>assistant<|channel|>commentary<|message|>\
             Checking.<|end|><|start|>assistant<|channel|>final<|message|>Done: DON'T panic.",
        );
        let route = |ids: &[u32], finish: bool| {
            let mut p = harmony(&tok).parser();
            let mut out = Vec::new();
            for &id in ids {
                p.push(&tok, id, &mut out);
            }
            if finish {
                p.finish(&mut out);
            }
            out
        };
        let whole = route(&ids, true);
        for cut in 0..=ids.len() {
            let part = route(&ids[..cut], false);
            assert_eq!(part, whole[..part.len()], "cut after {cut} tokens");
            // Finishing early adds nothing once a channel has been named.
            assert_eq!(route(&ids[..cut], true).len(), part.len(), "cut after {cut} tokens");
        }
        let text = |p: Part| tok.decode(&whole.iter().filter(|r| r.0 == p).map(|r| r.1).collect::<Vec<_>>()).unwrap();
        assert_eq!(text(Part::Reasoning), "Think.\nMore.");
        assert_eq!(text(Part::Content), "Checking.Done: DON'T panic.");
    }

    #[test]
    fn harmony_tool_calls_name_their_recipient() {
        let tok = harmony_tokenizer();
        // The recipient in the channel, with <|constrain|> (gpt-oss's usual form) ...
        let ids = reply(
            &tok,
            "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary \
             to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
        );
        let (content, reasoning, call, calls) = decode(&tok, harmony(&tok), &ids);
        assert_eq!((content.as_str(), reasoning.as_str()), ("", "Need the weather."));
        assert_eq!(call, "{\"city\": \"Paris\"}");
        assert_eq!(calls.len(), 1);
        assert_eq!((calls[0].name(), calls[0].format.as_deref()), ("get_weather", Some("json")));
        // ... and before it, as the template renders earlier calls.
        let ids = reply(&tok, " to=functions.now<|channel|>commentary json<|message|>{}");
        let (_, _, call, calls) = decode(&tok, harmony(&tok), &ids);
        assert_eq!(
            (call.as_str(), calls[0].recipient.as_str(), calls[0].format.as_deref()),
            ("{}", "functions.now", Some("json"))
        );
    }

    #[test]
    fn text_without_harmony_structure_is_the_answer() {
        let tok = harmony_tokenizer();
        let (content, reasoning, ..) = decode(&tok, harmony(&tok), &reply(&tok, "Just text, no channels."));
        assert_eq!((content.as_str(), reasoning.as_str()), ("Just text, no channels.", ""));
        // An unfinished header is dropped; stray structure tokens in a message too.
        let (content, ..) = decode(&tok, harmony(&tok), &reply(&tok, "<|channel|>final<|message|>A<|constrain|>B"));
        assert_eq!(content, "AB");
        let (content, reasoning, ..) = decode(&tok, harmony(&tok), &reply(&tok, "<|channel|>anal"));
        assert_eq!((content.as_str(), reasoning.as_str()), ("", ""));
    }

    #[test]
    fn plain_output_is_all_answer() {
        let tok = harmony_tokenizer();
        let ids = reply(&tok, "Hello 😀 world");
        let (content, reasoning, ..) = decode(&tok, OutputFormat::Plain, &ids);
        assert_eq!((content.as_str(), reasoning.as_str()), ("Hello 😀 world", ""));
        assert_eq!(OutputFormat::Plain.stop_ids(vec![3, 1]), [3, 1]);
    }
}
