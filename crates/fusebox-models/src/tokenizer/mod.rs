//! Tokenizers as GGUF files and Hugging Face `tokenizer.json` files describe them,
//! with token ids identical to llama.cpp's (GGUF) and to Hugging Face `tokenizers`'
//! (`tokenizer.json`):
//!
//! * **byte-level BPE** (GGUF `tokenizer.ggml.model = gpt2`; `tokenizer.json` with a
//!   `ByteLevel` pre-tokenizer): special tokens are cut out of the text first, the
//!   rest is pre-tokenized ([`PreTokenizer`]), each piece's UTF-8 bytes are written in
//!   the byte-level alphabet and merged by merge rank;
//! * **SentencePiece-style BPE** (GGUF `tokenizer.ggml.model = llama`: Llama 2,
//!   Mistral, Gemma, Phi-3): spaces become `▁`, a space is prefixed where
//!   `add_space_prefix` says, and the characters are merged by token score
//!   (llama.cpp's SPM algorithm); a character without a token becomes its
//!   `<0xNN>` byte tokens;
//! * **character BPE with byte fallback** (`tokenizer.json` BPE without
//!   `ByteLevel`, with the `Metaspace` pre-tokenizer or `Prepend`/`Replace`
//!   normalizers): characters merged by merge rank, `<0xNN>` for a character
//!   outside the vocabulary.
//!
//! Decoding maps tokens back to bytes; [`StreamDecoder`] does so incrementally
//! without splitting a UTF-8 character.
//!
//! ```no_run
//! use fusebox_models::{gguf::GgufFile, tokenizer::Tokenizer};
//! let file = GgufFile::open("models/SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let tok = Tokenizer::from_gguf(file.metadata())?;
//! let ids = tok.encode("Hello, world!", false);
//! assert_eq!(tok.decode(&ids)?, "Hello, world!");
//! # Ok::<(), fusebox::Error>(())
//! ```

mod bpe;
mod byte_level;
mod from_gguf;
mod from_hf;
mod pretokenize;
mod special;
mod spm;
mod stream;

use std::borrow::Cow;
use std::collections::HashMap;

use fusebox::{Error, Result};

pub(crate) use from_hf::O200K_PATTERN;
pub use pretokenize::PreTokenizer;
pub use stream::StreamDecoder;

use bpe::Merges;
use byte_level::ByteLevel;
use pretokenize::Stage;
use special::{Order, Segment, SpecialMatcher};

/// What a vocabulary entry is (GGUF's `tokenizer.ggml.token_type` codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// 1 (and 0, "undefined"): an ordinary BPE token (byte-level alphabet, or `▁` for a space).
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token (`<|im_start|>`): matched in input only with `parse_special`.
    Control,
    /// 4: a user-defined token: its text is raw, always matched in input.
    UserDefined,
    /// 5: an unused slot.
    Unused,
    /// 6: a byte token `<0xAB>` (SentencePiece byte fallback).
    Byte,
}

impl TokenType {
    /// The type for a GGUF code; unknown codes count as normal.
    pub fn from_code(code: i64) -> TokenType {
        match code {
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Normal,
        }
    }
}

/// Token texts that end a turn or a text when they are control tokens, besides
/// the declared end-of-sequence token (as llama.cpp's end-of-generation list).
const EOG_TEXTS: &[&str] =
    &["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|return|>", "<|call|>"];

/// Drops `<|end|>` from the end-of-generation ids of a harmony vocabulary (gpt-oss's
/// o200k_harmony: `<|return|>` and `<|call|>` end a reply, `<|end|>` only ends one
/// message of it and the model goes on with the next), and of solar-open's
/// (`<|calls|>`, `<|flush|>`), as llama.cpp does. Returns `<|end|>`'s id when it
/// was dropped.
pub(crate) fn drop_harmony_end(eog: &mut Vec<u32>, text_of: impl Fn(u32) -> Option<String>) -> Option<u32> {
    let has = |t: &str| eog.iter().any(|&id| text_of(id).as_deref() == Some(t));
    let call = has("<|call|>") || has("<|calls|>");
    let end = eog.iter().copied().find(|&id| text_of(id).as_deref() == Some("<|end|>"))?;
    if call && (has("<|return|>") || has("<|flush|>")) {
        eog.retain(|&id| id != end);
        Some(end)
    } else {
        None
    }
}

/// How the pieces are turned into ids.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Model {
    /// Bytes in GPT-2's byte-level alphabet, merged by rank.
    ByteLevel,
    /// Characters merged by the score of the merged token (llama.cpp's SPM);
    /// `scores[id]` is token `id`'s score.
    Spm { scores: Vec<f32> },
    /// Characters merged by rank (Hugging Face BPE without `ByteLevel`); a character
    /// outside the vocabulary becomes its `<0xNN>` tokens when `byte_fallback`, else
    /// the unknown token (consecutive ones fused when `fuse_unk`).
    CharBpe { byte_fallback: bool, fuse_unk: bool },
}

/// When a segment of text (the text between special tokens) gets a prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrependScheme {
    /// Every segment.
    Always,
    /// The segment at the start of the text only.
    First,
}

/// A Unicode normalization form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnicodeForm {
    Nfc,
    Nfd,
    Nfkc,
    Nfkd,
}

/// One rewrite of a segment of text before it is pre-tokenized.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TextOp {
    /// Hugging Face `Prepend`: the string before a non-empty segment.
    Prepend(String),
    /// Hugging Face `Replace` with a literal pattern.
    Replace(String, String),
    /// Hugging Face `NFC`, `NFD`, `NFKC`, `NFKD`: a Unicode normalization form.
    Unicode(UnicodeForm),
    /// llama.cpp SPM with `add_space_prefix`: a space before a segment that starts
    /// the text or follows a special token.
    SpacePrefix,
    /// Hugging Face `Metaspace`: spaces become `replacement`, which is then
    /// prepended (per `prepend`) unless the segment already starts with it.
    Metaspace { replacement: char, prepend: Option<PrependScheme> },
}

/// The pieces a tokenizer is built from, whatever the source file.
pub(crate) struct Parts {
    pub tokens: Vec<String>,
    pub types: Vec<TokenType>,
    /// Merge pairs by rank (empty for [`Model::Spm`]).
    pub merges: Vec<(String, String)>,
    pub pre: PreTokenizer,
    /// The cutting stages; [`PreTokenizer::stages`] of `pre` unless a `tokenizer.json` gives its own.
    pub stages: Vec<Stage>,
    pub model: Model,
    /// Rewrites of each segment of text, in order.
    pub text_ops: Vec<TextOp>,
    pub ignore_merges: bool,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub pad: Option<u32>,
    pub unk: Option<u32>,
    /// The token for a byte that has no byte token: Hugging Face BPE's
    /// `unk_token`; `None` drops the byte, as llama.cpp does.
    pub missing_byte: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    /// Further end-of-generation ids (e.g. GGUF's `tokenizer.ggml.eot_token_id`).
    pub extra_eog: Vec<u32>,
    /// How overlapping special-token texts are matched.
    pub special_order: Order,
}

/// A tokenizer: byte-level BPE, SentencePiece-style BPE or character BPE (see the module docs).
pub struct Tokenizer {
    tokens: Vec<String>,
    types: Vec<TokenType>,
    token_to_id: HashMap<String, u32>,
    merges: Merges,
    /// The id of each byte's single-character token (byte-level models).
    byte_ids: [Option<u32>; 256],
    /// The id of each byte's `<0xNN>` token (byte fallback).
    byte_fallback_ids: [Option<u32>; 256],
    byte_level: ByteLevel,
    pre: PreTokenizer,
    stages: Vec<Stage>,
    model: Model,
    text_ops: Vec<TextOp>,
    specials: SpecialMatcher,
    ignore_merges: bool,
    bos: Option<u32>,
    eos: Option<u32>,
    pad: Option<u32>,
    unk: Option<u32>,
    missing_byte: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    eog: Vec<u32>,
}

fn build_error(msg: impl std::fmt::Display) -> Error {
    Error::Io(format!("tokenizer: {msg}"))
}

impl Tokenizer {
    pub(crate) fn build(p: Parts) -> Result<Tokenizer> {
        let n = p.tokens.len();
        if n == 0 {
            return Err(build_error("the vocabulary is empty"));
        }
        if u32::try_from(n).is_err() {
            return Err(build_error(format!("{n} tokens do not fit u32 ids")));
        }
        if p.types.len() != n {
            return Err(build_error(format!("{} token types for {n} tokens", p.types.len())));
        }
        let named = [("bos", p.bos), ("eos", p.eos), ("padding", p.pad), ("unknown", p.unk)];
        for (what, id) in named {
            if let Some(id) = id.filter(|&id| id as usize >= n) {
                return Err(build_error(format!("{what} token id {id} is past the vocabulary ({n} tokens)")));
            }
        }
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, t) in p.tokens.iter().enumerate() {
            // A repeated text maps to its last id, as llama.cpp does.
            token_to_id.insert(t.clone(), i as u32);
        }
        let lookup = |s: &str, line: usize| {
            token_to_id
                .get(s)
                .copied()
                .ok_or_else(|| build_error(format!("merge {line} uses '{s}', which is not in the vocabulary")))
        };
        let mut merges = Merges::with_capacity(p.merges.len());
        for (rank, (a, b)) in p.merges.iter().enumerate() {
            let (ia, ib) = (lookup(a, rank)?, lookup(b, rank)?);
            let merged = lookup(&format!("{a}{b}"), rank)?;
            // A repeated pair keeps its last rank, as Hugging Face `tokenizers` does.
            merges.insert((ia, ib), (rank as u32, merged));
        }
        let byte_level = ByteLevel::new();
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = token_to_id.get(byte_level.char_of(b as u8).to_string().as_str()).copied();
        }
        let mut byte_fallback_ids = [None; 256];
        for (b, slot) in byte_fallback_ids.iter_mut().enumerate() {
            *slot = token_to_id.get(&format!("<0x{b:02X}>")).copied();
        }
        let mut specials = SpecialMatcher::new(p.special_order);
        let mut eog: Vec<u32> =
            p.eos.into_iter().chain(p.extra_eog.iter().copied().filter(|&id| (id as usize) < n)).collect();
        for (i, (t, ty)) in p.tokens.iter().zip(&p.types).enumerate() {
            match ty {
                TokenType::Control => specials.add(t, i as u32, true),
                TokenType::UserDefined => specials.add(t, i as u32, false),
                // llama.cpp parses the unknown token's text like a control token's.
                TokenType::Unknown if p.special_order == Order::LongestFirst => specials.add(t, i as u32, true),
                _ => {}
            }
            if *ty == TokenType::Control && EOG_TEXTS.contains(&t.as_str()) {
                eog.push(i as u32);
            }
        }
        specials.finish();
        eog.sort_unstable();
        eog.dedup();
        drop_harmony_end(&mut eog, |id| p.tokens.get(id as usize).cloned());
        Ok(Tokenizer {
            tokens: p.tokens,
            types: p.types,
            token_to_id,
            merges,
            byte_ids,
            byte_fallback_ids,
            byte_level,
            pre: p.pre,
            stages: p.stages,
            model: p.model,
            text_ops: p.text_ops,
            specials,
            ignore_merges: p.ignore_merges,
            bos: p.bos,
            eos: p.eos,
            pad: p.pad,
            unk: p.unk,
            missing_byte: p.missing_byte,
            add_bos: p.add_bos,
            add_eos: p.add_eos,
            eog,
        })
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }
    /// The stored text of token `id` (byte-level alphabet for normal tokens).
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }
    /// The id of the token whose stored text is `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }
    /// The type of token `id`.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }
    /// The pre-tokenizer in use.
    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }
    /// Beginning-of-sequence id.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }
    /// End-of-sequence id.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }
    /// Padding id.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }
    /// Unknown-token id.
    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }
    /// Whether the model expects a BOS token at the start (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos_default(&self) -> bool {
        self.add_bos
    }
    /// Whether the model expects an EOS token at the end (`tokenizer.ggml.add_eos_token`).
    pub fn add_eos_default(&self) -> bool {
        self.add_eos
    }
    /// Whether this is a SentencePiece-style tokenizer (`▁` for spaces, `<0xNN>` byte tokens).
    pub fn is_sentencepiece(&self) -> bool {
        !matches!(self.model, Model::ByteLevel)
    }
    /// Ids that end generation: EOS and control tokens such as `<|im_end|>`.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }
    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Token ids of `text`, matching special tokens (`<|im_start|>`) as whole
    /// tokens; BOS first when `add_bos` and the vocabulary has one.
    pub fn encode(&self, text: &str, add_bos: bool) -> Vec<u32> {
        self.encode_with(text, add_bos, true)
    }

    /// Token ids of `text`, treating control-token texts as plain text (for
    /// untrusted input that must not open or close a chat turn).
    pub fn encode_ordinary(&self, text: &str, add_bos: bool) -> Vec<u32> {
        self.encode_with(text, add_bos, false)
    }

    /// Token ids of `text`; control tokens are matched only when `parse_special`.
    pub fn encode_with(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            out.extend(self.bos);
        }
        self.encode_into(text, parse_special, &mut out);
        out
    }

    /// Token ids of `text` as llama.cpp's `llama_tokenize(text, add_special,
    /// parse_special)` gives them: with `add_special`, BOS first when the model
    /// asks for it ([`Tokenizer::add_bos_default`]) and EOS last when it asks for
    /// that ([`Tokenizer::add_eos_default`]).
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = self.encode_with(text, add_special && self.add_bos, parse_special);
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Appends the ids of `text` (no BOS/EOS) to `out`.
    fn encode_into(&self, text: &str, parse_special: bool, out: &mut Vec<u32>) {
        let mut segments = Vec::new();
        if self.specials.is_empty() {
            segments.push(Segment::Text(text));
        } else {
            self.specials.split(text, parse_special, &mut segments);
        }
        let mut symbols = Vec::new();
        let mut after_special = true;
        for seg in segments {
            match seg {
                Segment::Special(id) => {
                    out.push(id);
                    after_special = true;
                }
                // An empty text has no fragment (llama.cpp) and nothing to prefix.
                Segment::Text("") => {}
                Segment::Text(t) => {
                    // The segment's byte offset in `text` (it is a subslice of it).
                    let at_start = t.as_ptr() == text.as_ptr();
                    let prepared = self.prepare(t, at_start, after_special);
                    let mut pieces = Vec::new();
                    pretokenize::split_all(&self.stages, &prepared, &mut pieces);
                    for piece in &pieces {
                        self.encode_piece(piece, &mut symbols, out);
                    }
                    after_special = false;
                }
            }
        }
    }

    /// The text of one segment after the [`TextOp`]s.
    fn prepare<'a>(&self, t: &'a str, at_start: bool, after_special: bool) -> Cow<'a, str> {
        let mut s = Cow::Borrowed(t);
        for op in &self.text_ops {
            match op {
                TextOp::Prepend(p) => {
                    if !s.is_empty() {
                        s = Cow::Owned(format!("{p}{s}"));
                    }
                }
                TextOp::Replace(from, to) => {
                    if !from.is_empty() && s.contains(from.as_str()) {
                        s = Cow::Owned(s.replace(from.as_str(), to));
                    }
                }
                TextOp::Unicode(form) => {
                    use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};
                    let normalized: String = match form {
                        UnicodeForm::Nfc if is_nfc_quick(s.chars()) == IsNormalized::Yes => continue,
                        UnicodeForm::Nfc => s.nfc().collect(),
                        UnicodeForm::Nfd => s.nfd().collect(),
                        UnicodeForm::Nfkc => s.nfkc().collect(),
                        UnicodeForm::Nfkd => s.nfkd().collect(),
                    };
                    if normalized != *s {
                        s = Cow::Owned(normalized);
                    }
                }
                TextOp::SpacePrefix => {
                    if after_special {
                        s = Cow::Owned(format!(" {s}"));
                    }
                }
                TextOp::Metaspace { replacement, prepend } => {
                    if s.contains(' ') {
                        s = Cow::Owned(s.replace(' ', replacement.encode_utf8(&mut [0; 4])));
                    }
                    let wanted = match prepend {
                        Some(PrependScheme::Always) => true,
                        Some(PrependScheme::First) => at_start,
                        None => false,
                    };
                    if wanted && !s.is_empty() && !s.starts_with(*replacement) {
                        s = Cow::Owned(format!("{replacement}{s}"));
                    }
                }
            }
        }
        s
    }

    /// The ids of one pre-tokenized piece.
    fn encode_piece(&self, piece: &str, symbols: &mut Vec<u32>, out: &mut Vec<u32>) {
        match &self.model {
            Model::ByteLevel => self.encode_piece_byte_level(piece, symbols, out),
            Model::Spm { scores } => {
                spm::encode(piece, &self.token_to_id, scores, &self.byte_fallback_ids, self.unk, out)
            }
            Model::CharBpe { byte_fallback, fuse_unk } => {
                if self.ignore_merges {
                    if let Some(&id) = self.token_to_id.get(piece) {
                        out.push(id);
                        return;
                    }
                }
                symbols.clear();
                let mut unk_run = false;
                let mut buf = [0u8; 4];
                for c in piece.chars() {
                    let s = c.encode_utf8(&mut buf);
                    if let Some(&id) = self.token_to_id.get(&*s) {
                        symbols.push(id);
                        unk_run = false;
                        continue;
                    }
                    if *byte_fallback {
                        let bytes: Option<Vec<u32>> = s.bytes().map(|b| self.byte_fallback_ids[b as usize]).collect();
                        if let Some(bytes) = bytes {
                            symbols.extend(bytes);
                            unk_run = false;
                            continue;
                        }
                    }
                    if let Some(unk) = self.unk {
                        if !(*fuse_unk && unk_run) {
                            symbols.push(unk);
                        }
                        unk_run = true;
                    }
                }
                bpe::merge_into(symbols, &self.merges, out);
            }
        }
    }

    /// Byte-level BPE of one piece.
    fn encode_piece_byte_level(&self, piece: &str, symbols: &mut Vec<u32>, out: &mut Vec<u32>) {
        if self.ignore_merges {
            let mut s = String::with_capacity(piece.len() * 2);
            self.byte_level.encode_into(piece.as_bytes(), &mut s);
            if let Some(&id) = self.token_to_id.get(&s) {
                out.push(id);
                return;
            }
        }
        symbols.clear();
        // A byte without a token (SmolLM2 has none for 0xF1, 0xF2, 0xF5..=0xFF and a
        // few controls) is dropped, as llama.cpp and Hugging Face do without an
        // unk_token; so such text does not round-trip.
        symbols.extend(piece.bytes().filter_map(|b| self.byte_ids[b as usize].or(self.missing_byte)));
        bpe::merge_into(symbols, &self.merges, out);
    }

    /// The bytes token `id` stands for. Control tokens give their text unless
    /// `skip_special`, in which case they give nothing.
    pub fn token_bytes(&self, id: u32, skip_special: bool, out: &mut Vec<u8>) -> Result<()> {
        let (Some(text), Some(ty)) = (self.tokens.get(id as usize), self.types.get(id as usize)) else {
            return Err(Error::value(
                "Tokenizer::decode",
                "token id",
                format!("below the vocabulary size {}", self.tokens.len()),
                id,
            ));
        };
        match ty {
            TokenType::Control if skip_special => {}
            TokenType::Control | TokenType::UserDefined => out.extend_from_slice(text.as_bytes()),
            TokenType::Byte => match parse_byte_token(text) {
                Some(b) => out.push(b),
                None => out.extend_from_slice(text.as_bytes()),
            },
            TokenType::Normal | TokenType::Unknown | TokenType::Unused => match self.model {
                Model::ByteLevel => self.byte_level.decode_into(text, out),
                _ => {
                    let replacement = self.space_replacement();
                    for c in text.chars() {
                        let c = if c == replacement { ' ' } else { c };
                        out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                    }
                }
            },
        }
        Ok(())
    }

    /// The character that stands for a space in token texts (`▁` unless a
    /// `Metaspace` names another).
    fn space_replacement(&self) -> char {
        self.text_ops
            .iter()
            .find_map(|op| match op {
                TextOp::Metaspace { replacement, .. } => Some(*replacement),
                _ => None,
            })
            .unwrap_or('▁')
    }

    /// Which decoded segments lose their first space: the one the encoder put there.
    fn prefix_rule(&self) -> Option<PrependScheme> {
        self.text_ops.iter().rev().find_map(|op| match op {
            TextOp::SpacePrefix => Some(PrependScheme::Always),
            TextOp::Prepend(p) if p == " " || p.chars().eq([self.space_replacement()]) => Some(PrependScheme::Always),
            TextOp::Metaspace { prepend, .. } => *prepend,
            _ => None,
        })
    }

    /// The text of `ids`, special tokens written out; invalid UTF-8 (from a
    /// sequence cut inside a character) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.decode_with(ids, false)
    }

    /// The text of `ids`, leaving out control tokens when `skip_special`.
    ///
    /// A tokenizer that prefixes a space to the text (SentencePiece's
    /// `add_space_prefix`, `Metaspace`, `Prepend("▁")`) loses that space again:
    /// at the start (after a leading BOS) and, where the encoder adds it after
    /// every special token, after each special token.
    pub fn decode_with(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        let rule = self.prefix_rule();
        let mut strip_next = rule.is_some();
        for (i, &id) in ids.iter().enumerate() {
            let start = bytes.len();
            self.token_bytes(id, skip_special, &mut bytes)?;
            match self.types.get(id as usize) {
                Some(TokenType::Control | TokenType::UserDefined) => {
                    // A leading BOS keeps the first segment first.
                    let leading_bos = i == 0 && Some(id) == self.bos;
                    strip_next = match rule {
                        Some(PrependScheme::Always) => true,
                        Some(PrependScheme::First) => strip_next && leading_bos,
                        None => false,
                    };
                }
                _ => {
                    if strip_next && bytes.get(start) == Some(&b' ') {
                        bytes.remove(start);
                    }
                    strip_next = false;
                }
            }
        }
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// A decoder that turns ids into text one at a time.
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special)
    }
}

/// The byte of a `<0xAB>` token.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
