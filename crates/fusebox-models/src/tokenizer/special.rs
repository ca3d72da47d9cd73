//! Finding special tokens (`<|im_start|>`, `<|endoftext|>`, ...) in input text.
//!
//! Before pre-tokenization the text is cut at every occurrence of a special
//! token's text; each occurrence becomes that token's id and the text between goes
//! through BPE. Control tokens are matched only when the caller asks for it
//! (`parse_special`); user-defined tokens always are, as in llama.cpp and Hugging
//! Face `tokenizers`.
//!
//! Where two tokens' texts overlap the two references differ, and [`Order`] says
//! which one a tokenizer follows: Hugging Face takes the leftmost occurrence (the
//! longest at one position); llama.cpp takes the tokens one at a time, longest
//! first, each cutting every remaining text fragment at all its occurrences.

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

/// The order in which overlapping special-token texts are matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Order {
    /// Leftmost occurrence first, the longest at one position (Hugging Face).
    #[default]
    LeftmostLongest,
    /// Longest token first over the whole text (llama.cpp's `tokenizer_st_partition`).
    LongestFirst,
}

/// Special token texts, longest first, with an index by first byte.
#[derive(Default)]
pub(crate) struct SpecialMatcher {
    /// Longest text first, then lowest id.
    entries: Vec<Entry>,
    /// Indices into `entries` (ascending, so longest first) by the text's first byte.
    by_first_byte: Vec<Vec<u32>>,
    order: Order,
}

impl SpecialMatcher {
    /// An empty matcher following `order`.
    pub fn new(order: Order) -> Self {
        SpecialMatcher { order, ..Default::default() }
    }

    /// Adds a token; empty texts are ignored. Call [`SpecialMatcher::finish`] after the last.
    pub fn add(&mut self, text: &str, id: u32, control: bool) {
        if !text.is_empty() {
            self.entries.push(Entry { text: text.to_owned(), id, control });
        }
    }

    /// Sorts the tokens (longest first, then by id) and indexes them.
    pub fn finish(&mut self) {
        self.entries.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
        self.by_first_byte = vec![Vec::new(); 256];
        for (i, e) in self.entries.iter().enumerate() {
            self.by_first_byte[e.text.as_bytes()[0] as usize].push(i as u32);
        }
    }

    /// Whether no token was added.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The tokens that may match at byte `i` of `bytes`, longest first.
    fn candidates<'s>(&'s self, bytes: &'s [u8], i: usize, parse_special: bool) -> impl Iterator<Item = usize> + 's {
        self.by_first_byte.get(bytes[i] as usize).into_iter().flatten().map(|&k| k as usize).filter(move |&k| {
            let e = &self.entries[k];
            (parse_special || !e.control) && bytes[i..].starts_with(e.text.as_bytes())
        })
    }

    /// Cuts `text` into segments, matching control tokens only when `parse_special`.
    pub fn split<'a>(&self, text: &'a str, parse_special: bool, out: &mut Vec<Segment<'a>>) {
        match self.order {
            Order::LeftmostLongest => self.split_leftmost(text, parse_special, out),
            Order::LongestFirst => self.split_longest_first(text, parse_special, out),
        }
    }

    fn split_longest_first<'a>(&self, text: &'a str, parse_special: bool, out: &mut Vec<Segment<'a>>) {
        // The tokens that occur anywhere in the text, in matching order; the others
        // cannot cut any fragment.
        let bytes = text.as_bytes();
        let mut present: Vec<usize> = (0..bytes.len()).flat_map(|i| self.candidates(bytes, i, parse_special)).collect();
        if present.is_empty() {
            out.push(Segment::Text(text));
            return;
        }
        present.sort_unstable();
        present.dedup();
        let mut segments = vec![Segment::Text(text)];
        let mut next = Vec::new();
        for k in present {
            let e = &self.entries[k];
            next.clear();
            for seg in &segments {
                let Segment::Text(t) = *seg else {
                    next.push(*seg);
                    continue;
                };
                let mut rest = t;
                // A token's text starts with a UTF-8 leading byte, so every match
                // starts and ends on a character boundary.
                while let Some(at) = rest.find(e.text.as_str()) {
                    if at > 0 {
                        next.push(Segment::Text(&rest[..at]));
                    }
                    next.push(Segment::Special(e.id));
                    rest = &rest[at + e.text.len()..];
                }
                if !rest.is_empty() {
                    next.push(Segment::Text(rest));
                }
            }
            std::mem::swap(&mut segments, &mut next);
        }
        out.extend(segments);
    }

    fn split_leftmost<'a>(&self, text: &'a str, parse_special: bool, out: &mut Vec<Segment<'a>>) {
        let bytes = text.as_bytes();
        let mut start = 0;
        let mut i = 0;
        while i < bytes.len() {
            // A candidate's first byte is a UTF-8 leading byte, so a match can only
            // begin on a character boundary and the slices below are valid.
            match self.candidates(bytes, i, parse_special).next().map(|k| &self.entries[k]) {
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
        m.finish();
        let mut out = Vec::new();
        m.split("x<|a|><|b|>y<|a|>é<u>", true, &mut out);
        use Segment::*;
        assert_eq!(out, [Text("x"), Special(2), Text("y"), Special(1), Text("é"), Special(3)]);
        out.clear();
        m.split("<|a|><u>", false, &mut out);
        assert_eq!(out, [Text("<|a|>"), Special(3)]);
    }

    #[test]
    fn longest_first_as_llama_cpp() {
        let mut m = SpecialMatcher::new(Order::LongestFirst);
        m.add("ab", 1, false);
        m.add("bcd", 2, false);
        m.add("<c>", 3, true);
        m.finish();
        let mut out = Vec::new();
        m.split("xabcdab<c>", true, &mut out);
        use Segment::*;
        assert_eq!(out, [Text("xa"), Special(2), Special(1), Special(3)]);
        // Leftmost-longest takes "ab" first instead.
        let mut h = SpecialMatcher::new(Order::LeftmostLongest);
        h.add("ab", 1, false);
        h.add("bcd", 2, false);
        h.finish();
        out.clear();
        h.split("xabcd", true, &mut out);
        assert_eq!(out, [Text("x"), Special(1), Text("cd")]);
    }
}
