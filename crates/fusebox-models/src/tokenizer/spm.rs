//! SentencePiece-style BPE by token score, as llama.cpp's `llm_tokenizer_spm`
//! runs it (GGUF `tokenizer.ggml.model = llama`).
//!
//! The text (spaces already `▁`) starts as one symbol per character. Every pair of
//! adjacent symbols whose concatenation is a token is a candidate; the candidate
//! whose token has the highest score is merged first, the leftmost on ties, and
//! the merged symbol's new pairs become candidates, until none is left. Each final
//! symbol is its token, or — a character that is no token — its UTF-8 bytes as
//! `<0xNN>` byte tokens. A heap of candidates keeps this O(n log n); a candidate
//! is stale once either symbol has changed (its combined length no longer matches).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// A symbol: a byte range of the text, in a doubly linked list over a vector.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    /// Length in bytes; 0 once merged into its left neighbour.
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A merge candidate: the symbols at `left` and its right neighbour `right`.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Byte length of the merged text when the candidate was made.
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Bigram) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Bigram) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Greatest first out of the heap: the highest score, then the leftmost.
    fn cmp(&self, other: &Bigram) -> Ordering {
        self.score.total_cmp(&other.score).then(other.left.cmp(&self.left))
    }
}

/// Appends the ids of `text` to `out`.
///
/// `vocab` maps every token's text (control, user-defined and byte tokens too, as
/// llama.cpp's `text_to_token` does) to its id; `scores[id]` is its score;
/// `byte_tokens[b]` is the `<0xNN>` token of byte `b`. A byte without one becomes
/// `unk` (llama.cpp would throw), or is dropped without an unknown token.
pub(crate) fn encode(
    text: &str,
    vocab: &HashMap<String, u32>,
    scores: &[f32],
    byte_tokens: &[Option<u32>; 256],
    unk: Option<u32>,
    out: &mut Vec<u32>,
) {
    if text.is_empty() {
        return;
    }
    let mut syms: Vec<Symbol> = Vec::with_capacity(text.len());
    for (i, c) in text.char_indices() {
        let k = syms.len();
        syms.push(Symbol { start: i, len: c.len_utf8(), prev: k.checked_sub(1), next: Some(k + 1) });
    }
    if let Some(last) = syms.last_mut() {
        last.next = None;
    }

    let mut heap = BinaryHeap::new();
    let try_add = |heap: &mut BinaryHeap<Bigram>, syms: &[Symbol], left: Option<usize>, right: Option<usize>| {
        let (Some(left), Some(right)) = (left, right) else { return };
        let (l, r) = (syms[left], syms[right]);
        let merged = &text[l.start..r.start + r.len];
        if let Some(&id) = vocab.get(merged) {
            let score = scores.get(id as usize).copied().unwrap_or(0.0);
            heap.push(Bigram { score, left, right, len: merged.len() });
        }
    };
    for i in 1..syms.len() {
        try_add(&mut heap, &syms, Some(i - 1), Some(i));
    }

    while let Some(b) = heap.pop() {
        let (l, r) = (syms[b.left], syms[b.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != b.len {
            continue;
        }
        syms[b.left].len += r.len;
        syms[b.right].len = 0;
        syms[b.left].next = r.next;
        if let Some(n) = r.next {
            syms[n].prev = Some(b.left);
        }
        try_add(&mut heap, &syms, syms[b.left].prev, Some(b.left));
        try_add(&mut heap, &syms, Some(b.left), syms[b.left].next);
    }

    let mut cur = Some(0);
    while let Some(i) = cur {
        let s = syms[i];
        let piece = &text[s.start..s.start + s.len];
        match vocab.get(piece) {
            Some(&id) => out.push(id),
            None => out.extend(piece.bytes().filter_map(|b| byte_tokens[b as usize].or(unk))),
        }
        cur = s.next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_by_score_then_leftmost_with_byte_fallback() {
        let toks = ["a", "b", "c", "ab", "bc", "bcb", "<0xC3>", "<0xA9>"];
        let vocab: HashMap<String, u32> = toks.iter().enumerate().map(|(i, t)| (t.to_string(), i as u32)).collect();
        let mut bytes = [None; 256];
        bytes[0xC3] = Some(6);
        bytes[0xA9] = Some(7);
        let run = |text: &str, scores: &[f32]| {
            let mut out = Vec::new();
            encode(text, &vocab, scores, &bytes, None, &mut out);
            out
        };
        // "bc" scores higher than "ab": b+c first, then a+bc is no token.
        assert_eq!(run("abc", &[0., 0., 0., -2., -1., -3., 0., 0.]), [0, 4]);
        // "ab" higher: a+b, then ab+c is no token.
        assert_eq!(run("abc", &[0., 0., 0., -1., -2., -3., 0., 0.]), [3, 2]);
        // A merged symbol merges again: b+c, then bc+b.
        assert_eq!(run("bcb", &[0., 0., 0., -1., -2., -3., 0., 0.]), [5]);
        // Equal scores: the leftmost pair first.
        assert_eq!(run("abab", &[0., 0., 0., -1., -1., -3., 0., 0.]), [3, 3]);
        // A character with no token becomes its bytes.
        assert_eq!(run("aé", &[0.; 8]), [0, 6, 7]);
        assert_eq!(run("", &[0.; 8]), Vec::<u32>::new());
    }
}
