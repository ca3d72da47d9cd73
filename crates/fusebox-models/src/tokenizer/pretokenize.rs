//! Pre-tokenizers: how text is cut into pieces before BPE merges run inside each
//! piece.
//!
//! A pre-tokenizer is a list of [`Stage`]s; each stage cuts every piece of the
//! previous one further (matches and the text between them both become pieces,
//! as llama.cpp's `unicode_regex_split` and Hugging Face's `Split(Isolated)` do).
//! The named pre-tokenizers of GGUF's `tokenizer.ggml.pre` use hand-written
//! scanners, ports of llama.cpp's `unicode.cpp` (its custom GPT-2, Llama 3 and
//! Qwen2 splitters, and the single-class regexes it runs through `std::regex`);
//! a `tokenizer.json` `Split` whose pattern is not one of these runs through
//! `fancy-regex`, which has the look-ahead `\s+(?!\S)` these patterns use.
//!
//! | name                                      | stages                                                          |
//! |-------------------------------------------|-----------------------------------------------------------------|
//! | `gpt2` (`gpt-2`, `mpt`, `olmo`, ...)      | GPT-2                                                           |
//! | `smollm` (`starcoder`, `refact`, ...)     | `\p{N}`, GPT-2                                                  |
//! | `llama-bpe` (`llama3`, `falcon3`, ...)    | Llama 3                                                         |
//! | `qwen2` (`deepseek-r1-qwen`)              | Llama 3 with single digits                                      |
//! | `gpt-4o` (`llama4`, `kanana2`, `talkie`)  | o200k (gpt-oss, GPT-4o), llama.cpp's letter classes             |
//! | `default` (and a missing key)             | `[\p{P}$+<=>^~\|]+`, GPT-2, `\p{N}+`, `[0-9][0-9][0-9]`         |
//!
//! * GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
//! * Llama 3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//!   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+` (Qwen2: `\p{N}` for `\p{N}{1,3}`)
//! * o200k: `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//!   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//!   \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`. llama.cpp runs it with other
//!   letter classes (see `O200kClasses`), so a GGUF `gpt-4o` vocabulary and its
//!   `tokenizer.json` cut a few texts (non-ASCII case changes, combining marks) differently,
//!   each as its own reference does.
//!
//! Character classes: `\p{L}` is Unicode general category L (Lu, Ll, Lt, Lm, Lo),
//! `\p{N}` is category N (Nd, Nl, No), `\p{P}` category P, `\s` the White_Space
//! property.

use unicode_general_category::{get_general_category, GeneralCategory as G};

/// A pre-tokenizer: what [`crate::tokenizer::Tokenizer::pre_tokenizer`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// GPT-2's regex alone (`gpt2`, `gpt-2`, `mpt`, `olmo`, `jais`, `trillion`, `phi-2`).
    Gpt2,
    /// Each number character isolated, then GPT-2's regex (`smollm`, `starcoder`, ...).
    Smollm,
    /// Llama 3's regex: numbers in groups of up to three (`llama-bpe`, `llama3`, ...).
    Llama3,
    /// Qwen2's regex: Llama 3's with every number character alone (`qwen2`).
    Qwen2,
    /// The o200k regex of GPT-4o and gpt-oss, case-aware letter runs and numbers in
    /// groups of up to three (`gpt-4o`, `llama4`, ...).
    Gpt4o,
    /// llama.cpp's `default`: punctuation runs, GPT-2, number runs, digit triples.
    Default,
    /// No cutting: SentencePiece-style tokenizers BPE the whole text between
    /// special tokens (GGUF `tokenizer.ggml.model = llama`).
    SentencePiece,
    /// The pipeline a `tokenizer.json` describes (`Split` with its own pattern,
    /// `Digits`, `Metaspace`, ...); [`PreTokenizer::split`] alone does not know it
    /// and gives the text whole.
    TokenizerJson,
}

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` value, if it is one of those implemented.
    pub fn from_gguf_name(name: &str) -> Option<PreTokenizer> {
        match name {
            "gpt2" | "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "trillion" => Some(PreTokenizer::Gpt2),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
                Some(PreTokenizer::Smollm)
            }
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" => {
                Some(PreTokenizer::Llama3)
            }
            "qwen2" | "deepseek-r1-qwen" => Some(PreTokenizer::Qwen2),
            "gpt-4o" | "llama4" | "kanana2" | "talkie" => Some(PreTokenizer::Gpt4o),
            "default" | "" => Some(PreTokenizer::Default),
            _ => None,
        }
    }

    /// The `tokenizer.ggml.pre` names [`PreTokenizer::from_gguf_name`] knows.
    pub const GGUF_NAMES: &'static [&'static str] = &[
        "default",
        "gpt2",
        "gpt-2",
        "phi-2",
        "mpt",
        "olmo",
        "jais",
        "trillion",
        "smollm",
        "starcoder",
        "refact",
        "command-r",
        "codeshell",
        "exaone",
        "minerva",
        "llama3",
        "llama-v3",
        "llama-bpe",
        "falcon3",
        "falcon-h1",
        "pixtral",
        "midm-2.0",
        "lfm2",
        "qwen2",
        "deepseek-r1-qwen",
        "gpt-4o",
        "llama4",
        "kanana2",
        "talkie",
    ];

    /// The stages of a named pre-tokenizer.
    pub(crate) fn stages(self) -> Vec<Stage> {
        match self {
            PreTokenizer::Gpt2 => vec![Stage::Gpt2],
            PreTokenizer::Smollm => vec![Stage::EachNumber, Stage::Gpt2],
            PreTokenizer::Llama3 => vec![Stage::Llama3 { max_digits: 3, long_s: false }],
            PreTokenizer::Qwen2 => vec![Stage::Llama3 { max_digits: 1, long_s: false }],
            PreTokenizer::Gpt4o => vec![Stage::O200k(O200kClasses::LlamaCpp)],
            PreTokenizer::Default => {
                vec![Stage::DefaultPunctuation, Stage::Gpt2, Stage::NumberRuns, Stage::AsciiDigitTriples]
            }
            PreTokenizer::SentencePiece | PreTokenizer::TokenizerJson => Vec::new(),
        }
    }

    /// Appends the pieces of `text` to `out`, in order; together they cover `text` exactly.
    pub fn split<'a>(self, text: &'a str, out: &mut Vec<&'a str>) {
        split_all(&self.stages(), text, out);
    }
}

/// How a `tokenizer.json` `Split` joins a match to its neighbours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Behavior {
    /// Matches and the text between them are separate pieces.
    Isolated,
    /// Matches are dropped.
    Removed,
    /// A match ends the piece before it.
    MergedWithPrevious,
    /// A match starts the piece after it.
    MergedWithNext,
    /// Adjacent matches form one piece.
    Contiguous,
}

/// One cutting step.
#[derive(Debug)]
pub(crate) enum Stage {
    /// GPT-2's regex (llama.cpp's custom splitter; Hugging Face `ByteLevel(use_regex)`).
    Gpt2,
    /// `\p{N}`: every number character alone (Hugging Face `Digits(individual_digits)`).
    EachNumber,
    /// `\p{N}+` (Hugging Face `Digits` without `individual_digits`).
    NumberRuns,
    /// `[\p{P}\$\+<=>\^~\|]+`: llama.cpp `default`'s first regex.
    DefaultPunctuation,
    /// `[0-9][0-9][0-9]`: llama.cpp `default`'s last regex.
    AsciiDigitTriples,
    /// The Llama 3 regex with `\p{N}{1,max_digits}`; `long_s` also takes `'ſ` (U+017F)
    /// as a contraction, as `(?i:'s)` does under Unicode case folding (Hugging Face),
    /// where llama.cpp's `'[sS]` does not.
    Llama3 { max_digits: usize, long_s: bool },
    /// The o200k regex, with the letter classes of one reference.
    O200k(O200kClasses),
    /// A `tokenizer.json` `Split` with a pattern of its own.
    Regex { regex: Box<fancy_regex::Regex>, behavior: Behavior, invert: bool },
    /// A `tokenizer.json` `Split` on a literal string (Metaspace's `split` too).
    Literal { pattern: String, behavior: Behavior },
}

impl PartialEq for Stage {
    fn eq(&self, other: &Stage) -> bool {
        match (self, other) {
            (Stage::Regex { regex: a, behavior: b, invert: i }, Stage::Regex { regex: c, behavior: d, invert: j }) => {
                a.as_str() == c.as_str() && b == d && i == j
            }
            (Stage::Literal { pattern: a, behavior: b }, Stage::Literal { pattern: c, behavior: d }) => {
                a == c && b == d
            }
            // One pattern whichever reference's case folding: `long_s` does not name another pre-tokenizer.
            (Stage::Llama3 { max_digits: a, .. }, Stage::Llama3 { max_digits: c, .. }) => a == c,
            // Likewise: one pattern, each reference's classes.
            (Stage::O200k(_), Stage::O200k(_)) => true,
            _ => std::mem::discriminant(self) == std::mem::discriminant(other),
        }
    }
}

/// Runs `stages` over `text`; the pieces go to `out`.
pub(crate) fn split_all<'a>(stages: &[Stage], text: &'a str, out: &mut Vec<&'a str>) {
    if text.is_empty() {
        return;
    }
    let Some((last, first)) = stages.split_last() else {
        out.push(text);
        return;
    };
    if first.is_empty() {
        last.split(text, out);
        return;
    }
    let mut pieces = vec![text];
    let mut next = Vec::new();
    for stage in first {
        next.clear();
        for p in &pieces {
            stage.split(p, &mut next);
        }
        std::mem::swap(&mut pieces, &mut next);
    }
    for p in &pieces {
        last.split(p, out);
    }
}

impl Stage {
    /// Cuts `text` (one piece of the previous stage) into `out`.
    fn split<'a>(&self, text: &'a str, out: &mut Vec<&'a str>) {
        match self {
            Stage::Gpt2 => gpt2_split(text, out),
            Stage::EachNumber => class_split(text, out, is_number, false),
            Stage::NumberRuns => class_split(text, out, is_number, true),
            Stage::DefaultPunctuation => class_split(text, out, is_default_punctuation, true),
            Stage::AsciiDigitTriples => digit_triples(text, out),
            Stage::Llama3 { max_digits, long_s } => llama3_split(text, *max_digits, *long_s, out),
            Stage::O200k(classes) => o200k_split(text, *classes, out),
            Stage::Regex { regex, behavior, invert } => {
                // A regex that fails at run time (its backtracking limit) leaves the rest uncut.
                let matches: Vec<(usize, usize)> = regex
                    .find_iter(text)
                    .map_while(|m| m.ok())
                    .filter(|m| m.start() < m.end())
                    .map(|m| (m.start(), m.end()))
                    .collect();
                cut(text, &matches, *behavior, *invert, out);
            }
            Stage::Literal { pattern, behavior } => {
                let matches: Vec<(usize, usize)> = if pattern.is_empty() {
                    Vec::new()
                } else {
                    text.match_indices(pattern.as_str()).map(|(i, m)| (i, i + m.len())).collect()
                };
                cut(text, &matches, *behavior, false, out);
            }
        }
    }
}

/// Pieces of `text` from sorted, disjoint, non-empty `matches` (byte ranges), as
/// Hugging Face `NormalizedString::split` forms them.
fn cut<'a>(text: &'a str, matches: &[(usize, usize)], behavior: Behavior, invert: bool, out: &mut Vec<&'a str>) {
    // Every byte range of the text, marked as matched or not.
    let mut spans: Vec<(usize, usize, bool)> = Vec::with_capacity(matches.len() * 2 + 1);
    let mut at = 0;
    for &(s, e) in matches {
        if at < s {
            spans.push((at, s, invert));
        }
        spans.push((s, e, !invert));
        at = e;
    }
    if at < text.len() {
        spans.push((at, text.len(), invert));
    }
    // The folds of `tokenizers`' `split`: a span either extends the last piece or starts one.
    let mut pieces: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
    let mut previous_match = false;
    match behavior {
        Behavior::Isolated => pieces.extend(spans.iter().map(|&(s, e, _)| (s, e))),
        Behavior::Removed => pieces.extend(spans.iter().filter(|&&(_, _, m)| !m).map(|&(s, e, _)| (s, e))),
        Behavior::MergedWithPrevious | Behavior::Contiguous => {
            for &(s, e, m) in &spans {
                let extend = match behavior {
                    Behavior::MergedWithPrevious => m && !previous_match,
                    _ => m == previous_match,
                };
                match pieces.last_mut() {
                    Some(last) if extend => last.1 = e,
                    _ => pieces.push((s, e)),
                }
                previous_match = m;
            }
        }
        Behavior::MergedWithNext => {
            for &(s, e, m) in spans.iter().rev() {
                match pieces.last_mut() {
                    Some(last) if m && !previous_match => last.0 = s,
                    _ => pieces.push((s, e)),
                }
                previous_match = m;
            }
            pieces.reverse();
        }
    }
    out.extend(pieces.into_iter().map(|(s, e)| &text[s..e]));
}

/// `\p{L}`: general category Letter.
pub(crate) fn is_letter(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphabetic();
    }
    matches!(
        get_general_category(c),
        G::UppercaseLetter | G::LowercaseLetter | G::TitlecaseLetter | G::ModifierLetter | G::OtherLetter
    )
}

/// `\p{N}`: general category Number.
pub(crate) fn is_number(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_digit();
    }
    matches!(get_general_category(c), G::DecimalNumber | G::LetterNumber | G::OtherNumber)
}

/// `\s`: the White_Space property.
pub(crate) fn is_space(c: char) -> bool {
    c.is_whitespace()
}

/// `[\p{P}\$\+<=>\^~\|]`.
fn is_default_punctuation(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_punctuation() && c != '`';
    }
    matches!(
        get_general_category(c),
        G::ConnectorPunctuation
            | G::DashPunctuation
            | G::OpenPunctuation
            | G::ClosePunctuation
            | G::InitialPunctuation
            | G::FinalPunctuation
            | G::OtherPunctuation
    )
}

/// Cuts out each character of class `pred` (runs of them when `runs`); the text
/// between stays whole.
fn class_split<'a>(text: &'a str, out: &mut Vec<&'a str>, pred: fn(char) -> bool, runs: bool) {
    let mut gap = 0; // start of the text not yet emitted
    let mut it = text.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        if !pred(c) {
            continue;
        }
        let mut end = i + c.len_utf8();
        if runs {
            while let Some(&(j, d)) = it.peek() {
                if !pred(d) {
                    break;
                }
                end = j + d.len_utf8();
                it.next();
            }
        }
        if gap < i {
            out.push(&text[gap..i]);
        }
        out.push(&text[i..end]);
        gap = end;
    }
    if gap < text.len() {
        out.push(&text[gap..]);
    }
}

/// `[0-9][0-9][0-9]`, leftmost first: each run of ASCII digits gives triples from
/// its start, and its last one or two digits join the text that follows.
fn digit_triples<'a>(text: &'a str, out: &mut Vec<&'a str>) {
    let b = text.as_bytes();
    let mut gap = 0;
    let mut i = 0;
    while i + 3 <= b.len() {
        if b[i..i + 3].iter().all(u8::is_ascii_digit) {
            if gap < i {
                out.push(&text[gap..i]);
            }
            out.push(&text[i..i + 3]);
            i += 3;
            gap = i;
        } else {
            i += 1;
        }
    }
    if gap < text.len() {
        out.push(&text[gap..]);
    }
}

/// Length in chars of a contraction (`'s 't 're 've 'm 'll 'd`, lower case only)
/// starting at `chars[i]`, or 0.
fn contraction_len(chars: &[(usize, char)], i: usize) -> usize {
    let at = |k: usize| chars.get(i + k).map(|&(_, c)| c);
    if at(0) != Some('\'') {
        return 0;
    }
    match (at(1), at(2)) {
        (Some('s' | 't' | 'm' | 'd'), _) => 2,
        (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l')) => 3,
        _ => 0,
    }
}

/// GPT-2's split of `text` into `out`.
///
/// The regex's alternatives are tried in order at each position, as a
/// backtracking engine would, and the first that matches wins:
/// 1. a contraction;
/// 2. an optional single space (U+0020) then a run of letters, or of numbers, or
///    of characters that are none of letter, number, whitespace;
/// 3. `\s+(?!\S)`: a whitespace run up to the end of the text, or that run less
///    its last character when a non-space follows (the last one then joins the
///    next piece through the optional space of rule 2, or stands alone);
/// 4. `\s+`: a single whitespace character followed by a non-space.
fn gpt2_split<'a>(text: &'a str, out: &mut Vec<&'a str>) {
    if text.is_empty() {
        return;
    }
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let n = chars.len();
    let byte = |i: usize| if i < n { chars[i].0 } else { text.len() };
    let run = |mut k: usize, pred: &dyn Fn(char) -> bool| {
        while k < n && pred(chars[k].1) {
            k += 1;
        }
        k
    };
    let other = |c: char| !is_space(c) && !is_letter(c) && !is_number(c);

    let mut i = 0;
    while i < n {
        let contraction = contraction_len(&chars, i);
        if contraction > 0 {
            out.push(&text[byte(i)..byte(i + contraction)]);
            i += contraction;
            continue;
        }
        let c = chars[i].1;
        let j = if c == ' ' && i + 1 < n && !is_space(chars[i + 1].1) { i + 1 } else { i };
        let cj = chars[j].1;
        let end = if is_letter(cj) {
            run(j, &is_letter)
        } else if is_number(cj) {
            run(j, &is_number)
        } else if !is_space(cj) {
            run(j, &other)
        } else {
            // Here j == i and chars[i] is whitespace.
            let k = run(i, &is_space);
            if k == n {
                k
            } else if k - i >= 2 {
                k - 1
            } else {
                i + 1
            }
        };
        out.push(&text[byte(i)..byte(end)]);
        i = end;
    }
}

/// The Llama 3 / Qwen2 split of `text` into `out`, a port of llama.cpp's
/// `unicode_regex_split_custom_llama3` (numbers in groups of `max_digits`).
///
/// At each position, in the regex's order:
/// 1. `(?i:'s|'t|'re|'ve|'m|'ll|'d)`;
/// 2. `[^\r\n\p{L}\p{N}]?\p{L}+`: letters, with one leading character that is none
///    of CR, LF, letter, number;
/// 3. `\p{N}{1,max_digits}`;
/// 4. ` ?[^\s\p{L}\p{N}]+[\r\n]*`;
/// 5. `\s*[\r\n]+`: whitespace up to its last CR or LF;
/// 6. `\s+(?!\S)`: a whitespace run less its last character when text follows;
/// 7. `\s+`.
fn llama3_split<'a>(text: &'a str, max_digits: usize, long_s: bool, out: &mut Vec<&'a str>) {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let n = chars.len();
    let byte = |i: usize| if i < n { chars[i].0 } else { text.len() };
    let at = |i: usize| chars.get(i).map(|&(_, c)| c);
    let letter = |i: usize| at(i).is_some_and(is_letter);
    let number = |i: usize| at(i).is_some_and(is_number);
    let space = |i: usize| at(i).is_some_and(is_space);
    let lower = |i: usize| {
        at(i).map(|c| match c {
            'ſ' if long_s => 's',
            c => c.to_ascii_lowercase(),
        })
    };
    let mut start = 0;
    let mut pos = 0;
    let emit = |end: usize, start: &mut usize, out: &mut Vec<&'a str>| {
        if *start < end {
            out.push(&text[byte(*start)..byte(end)]);
        }
        *start = end;
    };
    while pos < n {
        let c = chars[pos].1;
        // 1. contractions
        if c == '\'' && pos + 1 < n {
            let next = lower(pos + 1);
            if matches!(next, Some('s' | 't' | 'm' | 'd')) {
                pos += 2;
                emit(pos, &mut start, out);
                continue;
            }
            if pos + 2 < n {
                let pair = (next, lower(pos + 2));
                if matches!(pair, (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))) {
                    pos += 3;
                    emit(pos, &mut start, out);
                    continue;
                }
            }
        }
        // 2. letters, with one optional leading non-letter
        if !(c == '\r' || c == '\n' || is_number(c)) && (is_letter(c) || letter(pos + 1)) {
            pos += 1;
            while letter(pos) {
                pos += 1;
            }
            emit(pos, &mut start, out);
            continue;
        }
        // 3. numbers in groups
        if is_number(c) {
            let mut ini = pos;
            while number(pos) {
                pos += 1;
                if pos - ini >= max_digits {
                    emit(pos, &mut start, out);
                    ini = pos;
                }
            }
            emit(pos, &mut start, out);
            continue;
        }
        // 4. ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let other = |i: usize| at(i).is_some_and(|d| !is_space(d) && !is_letter(d) && !is_number(d));
        let first = if c == ' ' { pos + 1 } else { pos };
        if c == ' ' && pos + 1 >= n || other(first) {
            pos = first;
            while other(pos) {
                pos += 1;
            }
            while matches!(at(pos), Some('\r' | '\n')) {
                pos += 1;
            }
            emit(pos, &mut start, out);
            continue;
        }
        // 5-7. whitespace
        let mut ws = 0;
        let mut last_crlf_end = 0;
        while space(pos + ws) {
            if matches!(at(pos + ws), Some('\r' | '\n')) {
                last_crlf_end = pos + ws + 1;
            }
            ws += 1;
        }
        if last_crlf_end > 0 {
            pos = last_crlf_end;
        } else if ws > 1 && pos + ws < n {
            pos += ws - 1;
        } else if ws > 0 {
            pos += ws;
        } else {
            pos += 1;
        }
        emit(pos, &mut start, out);
    }
}

/// Whose letter classes the o200k scanner uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum O200kClasses {
    /// The pattern as written, as Hugging Face `tokenizers` (Oniguruma) runs it:
    /// "upper" is `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`, "lower" `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`,
    /// and `(?i:'s)` also takes `'ſ` (U+017F folds to `s`).
    Unicode,
    /// llama.cpp's rewrite for `std::regex` (`LLAMA_VOCAB_PRE_TYPE_GPT4O`), run on text
    /// where every non-ASCII character stands for its category: "upper" is a letter
    /// other than `a-z`, "lower" a letter other than `A-Z` (so every non-ASCII letter
    /// is both, and combining marks are neither), and contractions are ASCII
    /// `'[sS]`, `'[tT]`, ...
    LlamaCpp,
}

impl O200kClasses {
    /// The pattern's "upper" class.
    fn upper(self, c: char) -> bool {
        match self {
            O200kClasses::Unicode => is_o200k_upper(c),
            O200kClasses::LlamaCpp => is_letter(c) && !c.is_ascii_lowercase(),
        }
    }

    /// The pattern's "lower" class.
    fn lower(self, c: char) -> bool {
        match self {
            O200kClasses::Unicode => is_o200k_lower(c),
            O200kClasses::LlamaCpp => is_letter(c) && !c.is_ascii_uppercase(),
        }
    }
}

/// The o200k split of `text` into `out` (GPT-4o's and gpt-oss's pattern).
///
/// At each position the pattern's alternatives are tried in order, as a
/// backtracking engine does, with P = `[^\r\n\p{L}\p{N}]` (an optional leading
/// character), U the "upper" class and W the "lower" class (see [`O200kClasses`];
/// the two overlap), C an optional contraction:
/// 1. `P? U* W+ C?`: with P if one is there, else without. The greedy `U*` gives back
///    characters only until `W+` can start: so it is the whole U run when a W-only
///    character follows it, else the run up to its last character that is also W,
///    which is then `W+` alone;
/// 2. `P? U+ W* C?`: the U run (non-empty), then the W run;
/// 3. `\p{N}{1,3}`;
/// 4. ` ?[^\s\p{L}\p{N}]+[\r\n/]*`;
/// 5. `\s*[\r\n]+`: whitespace up to its last CR or LF;
/// 6. `\s+(?!\S)`: a whitespace run less its last character when text follows;
/// 7. `\s+`.
fn o200k_split<'a>(text: &'a str, classes: O200kClasses, out: &mut Vec<&'a str>) {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let n = chars.len();
    let byte = |i: usize| if i < n { chars[i].0 } else { text.len() };
    let at = |i: usize| chars.get(i).map(|&(_, c)| c);
    let is_upper = |i: usize| at(i).is_some_and(|c| classes.upper(c));
    let is_lower = |i: usize| at(i).is_some_and(|c| classes.lower(c));
    let run = |mut i: usize, pred: &dyn Fn(usize) -> bool| {
        while pred(i) {
            i += 1;
        }
        i
    };
    // `P`: the optional leading character of the letter alternatives.
    let lead = |c: char| c != '\r' && c != '\n' && !is_letter(c) && !is_number(c);
    // The contraction at `i` (its length in chars), or 0.
    let contraction = |i: usize| -> usize {
        if at(i) != Some('\'') {
            return 0;
        }
        let fold = |k: usize| {
            at(i + k).map(|c| match c {
                'ſ' if classes == O200kClasses::Unicode => 's',
                c => c.to_ascii_lowercase(),
            })
        };
        match (fold(1), fold(2)) {
            (Some('s' | 't' | 'm' | 'd'), _) => 2,
            (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l')) => 3,
            _ => 0,
        }
    };
    // Alternative 1 from `s` (after the optional P): its end, before the contraction.
    let upper_then_lower = |s: usize| -> Option<usize> {
        let b = run(s, &is_upper);
        if is_lower(b) {
            return Some(run(b, &is_lower));
        }
        (s..b).rev().find(|&k| is_lower(k)).map(|k| k + 1)
    };
    // Alternative 2 from `s`.
    let upper_run = |s: usize| -> Option<usize> {
        let b = run(s, &is_upper);
        (b > s).then(|| run(b, &is_lower))
    };
    let other = |i: usize| at(i).is_some_and(|d| !is_space(d) && !is_letter(d) && !is_number(d));

    let mut pos = 0;
    while pos < n {
        let c = chars[pos].1;
        let with_lead = lead(c);
        let letters = [
            with_lead.then(|| upper_then_lower(pos + 1)).flatten(),
            upper_then_lower(pos),
            with_lead.then(|| upper_run(pos + 1)).flatten(),
            upper_run(pos),
        ];
        let end = if let Some(e) = letters.into_iter().flatten().next() {
            e + contraction(e)
        } else if is_number(c) {
            let mut e = pos + 1;
            while e < pos + 3 && at(e).is_some_and(is_number) {
                e += 1;
            }
            e
        } else if other(pos) || (c == ' ' && other(pos + 1)) {
            let first = if c == ' ' { pos + 1 } else { pos };
            let e = run(first, &other);
            run(e, &|i| matches!(at(i), Some('\r' | '\n' | '/')))
        } else {
            // Whitespace (every character is a letter, a number, whitespace or "other").
            let w = run(pos, &|i| at(i).is_some_and(is_space));
            match (pos..w).rev().find(|&i| matches!(at(i), Some('\r' | '\n'))) {
                Some(last_crlf) => last_crlf + 1,
                None if w - pos > 1 && w < n => w - 1,
                None => w,
            }
        };
        out.push(&text[byte(pos)..byte(end)]);
        pos = end;
    }
}

/// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`.
fn is_o200k_upper(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_uppercase();
    }
    matches!(
        get_general_category(c),
        G::UppercaseLetter
            | G::TitlecaseLetter
            | G::ModifierLetter
            | G::OtherLetter
            | G::NonspacingMark
            | G::SpacingMark
            | G::EnclosingMark
    )
}

/// `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`.
fn is_o200k_lower(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_lowercase();
    }
    matches!(
        get_general_category(c),
        G::LowercaseLetter | G::ModifierLetter | G::OtherLetter | G::NonspacingMark | G::SpacingMark | G::EnclosingMark
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(pre: PreTokenizer, s: &str) -> Vec<&str> {
        let mut out = Vec::new();
        pre.split(s, &mut out);
        assert_eq!(out.concat(), s, "pieces must cover the text");
        out
    }

    #[test]
    fn gpt2_examples() {
        use PreTokenizer::Gpt2;
        assert_eq!(pieces(Gpt2, "Hello world"), ["Hello", " world"]);
        assert_eq!(pieces(Gpt2, "I'm here, they'll"), ["I", "'m", " here", ",", " they", "'ll"]);
        assert_eq!(pieces(Gpt2, "a   b"), ["a", "  ", " b"]);
        assert_eq!(pieces(Gpt2, "a\n\nb"), ["a", "\n", "\n", "b"]);
        assert_eq!(pieces(Gpt2, "end  "), ["end", "  "]);
        assert_eq!(pieces(Gpt2, " 's"), [" '", "s"]);
        assert_eq!(pieces(Gpt2, "x 123!?"), ["x", " 123", "!?"]);
        assert_eq!(pieces(Gpt2, ""), Vec::<&str>::new());
    }

    #[test]
    fn smollm_isolates_digits() {
        use PreTokenizer::Smollm;
        assert_eq!(pieces(Smollm, "x 123!?"), ["x", " ", "1", "2", "3", "!?"]);
        assert_eq!(pieces(Smollm, "v2.0"), ["v", "2", ".", "0"]);
    }

    #[test]
    fn llama3_and_qwen2_examples() {
        use PreTokenizer::{Llama3, Qwen2};
        assert_eq!(pieces(Llama3, "Hello world"), ["Hello", " world"]);
        assert_eq!(pieces(Llama3, "I'M 1234567"), ["I", "'M", " ", "123", "456", "7"]);
        assert_eq!(pieces(Qwen2, "x 123"), ["x", " ", "1", "2", "3"]);
        assert_eq!(pieces(Llama3, "a  \n\n b"), ["a", "  \n\n", " b"]);
        assert_eq!(pieces(Llama3, "(x) !!\n\ny"), ["(x", ")", " !!\n\n", "y"]);
        assert_eq!(pieces(Llama3, "a   b "), ["a", "  ", " b", " "]);
        assert_eq!(pieces(Llama3, "\"quoted\""), ["\"quoted", "\""]);
    }

    fn o200k(classes: O200kClasses, s: &str) -> Vec<&str> {
        let mut out = Vec::new();
        o200k_split(s, classes, &mut out);
        assert_eq!(out.concat(), s, "pieces must cover the text");
        out
    }

    #[test]
    fn o200k_examples() {
        use O200kClasses::{LlamaCpp, Unicode};
        for c in [Unicode, LlamaCpp] {
            assert_eq!(o200k(c, "Hello world"), ["Hello", " world"]);
            // Case changes cut words; a contraction joins the word before it, any case.
            assert_eq!(o200k(c, "camelCase HTTPServer"), ["camel", "Case", " HTTPServer"]);
            assert_eq!(o200k(c, "DON'T we'RE"), ["DON'T", " we'RE"]);
            assert_eq!(o200k(c, "1234567"), ["123", "456", "7"]);
            // `/` and CR/LF after punctuation join it; whitespace up to the last newline.
            assert_eq!(o200k(c, "end.\r\n/x"), ["end", ".\r\n/", "x"]);
            assert_eq!(o200k(c, "a  \n\n b"), ["a", "  \n\n", " b"]);
            assert_eq!(o200k(c, "a   b "), ["a", "  ", " b", " "]);
            assert_eq!(o200k(c, "(x) !!y"), ["(x", ")", " !!", "y"]);
        }
        // Unicode classes: a lower-case letter after an upper-case one starts no new
        // piece, and combining marks belong to their letters.
        assert_eq!(o200k(Unicode, "éÉé"), ["é", "Éé"]);
        assert_eq!(o200k(Unicode, " e\u{301}cole"), [" e\u{301}cole"]);
        // `U*` gives back up to its last character that is also "lower" (the mark).
        assert_eq!(o200k(Unicode, "E\u{301}COLE"), ["E\u{301}", "COLE"]);
        // A leading mark is a word of its own when an upper-case letter follows.
        assert_eq!(o200k(Unicode, "\u{301}A"), ["\u{301}", "A"]);
        assert_eq!(o200k(Unicode, "'ſ x'ſ"), ["'ſ", " x'ſ"]);
        // llama.cpp: a non-ASCII letter is upper and lower at once; marks are neither.
        assert_eq!(o200k(LlamaCpp, "éÉé"), ["éÉé"]);
        assert_eq!(o200k(LlamaCpp, "e\u{301}cole"), ["e", "\u{301}cole"]);
        assert_eq!(o200k(LlamaCpp, "x'ſ"), ["x", "'ſ"]);
    }

    #[test]
    fn default_cuts_punctuation_numbers_and_triples() {
        use PreTokenizer::Default;
        assert_eq!(pieces(Default, "a, b12345!"), ["a", ",", " b", "123", "45", "!"]);
        assert_eq!(pieces(Default, "x `y`"), ["x", " `", "y", "`"]);
    }

    #[test]
    fn split_behaviors() {
        let run = |b: Behavior, invert: bool| {
            let mut out = Vec::new();
            cut("a--b-", &[(1, 2), (2, 3), (4, 5)], b, invert, &mut out);
            out
        };
        assert_eq!(run(Behavior::Isolated, false), ["a", "-", "-", "b", "-"]);
        assert_eq!(run(Behavior::Removed, false), ["a", "b"]);
        assert_eq!(run(Behavior::MergedWithPrevious, false), ["a-", "-", "b-"]);
        assert_eq!(run(Behavior::MergedWithNext, false), ["a", "-", "-b", "-"]);
        assert_eq!(run(Behavior::Contiguous, false), ["a", "--", "b", "-"]);
    }
}
