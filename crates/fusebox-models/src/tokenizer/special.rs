//! Finding special tokens (`<|im_start|>`, `<|endoftext|>`, ...) in input text.
//!
//! Before pre-tokenization the text is cut at every occurrence of a special
//! token's text, leftmost first and longest first at one position; each occurrence
//! becomes that token's id and the text between goes through BPE. Control tokens
//! are matched only when the caller asks for it (`parse_special`); user-defined
//! tokens always are, as in llama.cpp and Hugging Face `tokenizers`.

use std::collections::HashMap;

/// A piece of input: plain text for BPE, or a special token already resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Segment<'a> {
    Text(&'a str),
    Special(u32),
}

struct Entry {
    text: String,
    id: u32,
    control: bool,
}

/// Special token texts indexed by their first byte, longest first.
#[derive(Default)]
pub(crate) struct SpecialMatcher {
    by_first_byte: HashMap<u8, Vec<Entry>>,
}

impl SpecialMatcher {
    /// Adds a token; empty texts are ignored.
    pub fn add(&mut self, text: &str, id: u32, control: bool) {
        let Some(&first) = text.as_bytes().first() else { return };
        let list = self.by_first_byte.entry(first).or_default();
        list.push(Entry { text: text.to_owned(), id, control });
        list.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
    }

    /// Whether no token was added.
    pub fn is_empty(&self) -> bool {
        self.by_first_byte.is_empty()
    }

    /// Cuts `text` into segments, matching control tokens only when `parse_special`.
    pub fn split<'a>(&self, text: &'a str, parse_special: bool, out: &mut Vec<Segment<'a>>) {
        let bytes = text.as_bytes();
        let mut start = 0;
        let mut i = 0;
        while i < bytes.len() {
            // A candidate's first byte is a UTF-8 leading byte, so a match can only
            // begin on a character boundary and the slices below are valid.
            let found = self.by_first_byte.get(&bytes[i]).and_then(|list| {
                list.iter().find(|e| (parse_special || !e.control) && bytes[i..].starts_with(e.text.as_bytes()))
            });
            match found {
                Some(e) => {
                    if start < i {
                        out.push(Segment::Text(&text[start..i]));
                    }
                    out.push(Segment::Special(e.id));
                    i += e.text.len();
                    start = i;
                }
                None => i += 1,
            }
        }
        if start < bytes.len() {
            out.push(Segment::Text(&text[start..]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftmost_longest() {
        let mut m = SpecialMatcher::default();
        m.add("<|a|>", 1, true);
        m.add("<|a|><|b|>", 2, true);
        m.add("<u>", 3, false);
        let mut out = Vec::new();
        m.split("x<|a|><|b|>y<|a|>é<u>", true, &mut out);
        use Segment::*;
        assert_eq!(out, [Text("x"), Special(2), Text("y"), Special(1), Text("é"), Special(3)]);
        out.clear();
        m.split("<|a|><u>", false, &mut out);
        assert_eq!(out, [Text("<|a|>"), Special(3)]);
    }
}
