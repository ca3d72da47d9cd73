//! Pre-tokenizers: how text is cut into pieces before BPE merges run inside each
//! piece. Hand-written scanners that match the regexes exactly, no regex engine.
//!
//! * [`PreTokenizer::Gpt2`] is GPT-2's split:
//!   `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
//! * [`PreTokenizer::Smollm`] first isolates every `\p{N}` character (each digit
//!   is its own piece), then applies the GPT-2 split to the rest. This is
//!   llama.cpp's `smollm` (also `starcoder`, `refact`, `command-r`, `codeshell`,
//!   `exaone`, `minerva`) and Hugging Face's `Sequence[Digits(individual_digits),
//!   ByteLevel(use_regex)]`.
//!
//! Character classes: `\p{L}` is Unicode general category L (Lu, Ll, Lt, Lm, Lo),
//! `\p{N}` is category N (Nd, Nl, No), `\s` is the White_Space property.

use unicode_general_category::{get_general_category, GeneralCategory as G};

/// A pre-tokenizer, named as in GGUF's `tokenizer.ggml.pre`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// GPT-2's regex alone (`gpt2`, `mpt`, `olmo`, `jais`, `trillion`).
    Gpt2,
    /// Each number character isolated, then GPT-2's regex (`smollm`, `starcoder`, ...).
    Smollm,
}

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` value, if it is one of those implemented.
    pub fn from_gguf_name(name: &str) -> Option<PreTokenizer> {
        match name {
            "gpt2" | "mpt" | "olmo" | "jais" | "trillion" => Some(PreTokenizer::Gpt2),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
                Some(PreTokenizer::Smollm)
            }
            _ => None,
        }
    }

    /// Appends the pieces of `text` to `out`, in order; together they cover `text` exactly.
    pub fn split<'a>(self, text: &'a str, out: &mut Vec<&'a str>) {
        match self {
            PreTokenizer::Gpt2 => gpt2_split(text, out),
            PreTokenizer::Smollm => {
                let mut rest_start = 0;
                for (i, c) in text.char_indices() {
                    if is_number(c) {
                        gpt2_split(&text[rest_start..i], out);
                        let end = i + c.len_utf8();
                        out.push(&text[i..end]);
                        rest_start = end;
                    }
                }
                gpt2_split(&text[rest_start..], out);
            }
        }
    }
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
}
