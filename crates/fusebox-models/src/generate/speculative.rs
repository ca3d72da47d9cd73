//! Speculative decoding: a cheap [`Drafter`] guesses the next few tokens, the model runs
//! them after its cache in one pass ([`Session::step_all`](super::Session::step_all)),
//! and each guess is kept while it equals the token the model itself chooses at that
//! position; the first choice that differs (or the one after the last guess) is the
//! model's own next token, and the cache is cut back to what was kept.
//!
//! **Verification rule.** Position `i`'s token is chosen from the verify pass's logits
//! of row `i` by the request's own sampler, exactly as plain decoding would choose it
//! from its one-token step, and the draft `d_{i+1}` is kept iff that choice equals it.
//! Both drafters are deterministic (prompt lookup; a draft model decoding greedily), so
//! the draft distribution is a point mass, for which the standard speculative-sampling
//! rule (keep `d` with probability `min(1, p(d)/q(d)) = p(d)`, else sample from `p`
//! without `d`) is the same as sampling `t ~ p` and keeping `d` iff `t = d`. Each
//! emitted token costs the sampler one choice, in order, so with the same logits the
//! tokens are those of plain decoding for the same seed, greedy or not.
//!
//! **Same logits.** Up to 16 rows after the cache, a pass attends with each query on its
//! own, as the one-token step does, and block-quantized weights (every GGUF format) are
//! multiplied row by row with the one-row kernel (`quantized_matmul`, f32 or `--int8`),
//! so each verify row has the bits of the one-token step at its position: hence at most
//! [`MAX_DRAFT`] drafts. Dense (F32/F16/BF16) weights go through gemm, whose blocking
//! depends on the row count: rows then agree to about 1e-6 relative, and a greedy
//! choice can differ only where the two best logits are that close.
//!
//! **Not speculated.** A model with Gated DeltaNet layers (its recurrent state sums
//! every position and cannot be cut back to the accepted prefix) and a model split over
//! MPI ranks (the other ranks' caches cannot be cut back) are refused with an error.

use fusebox::{ComputeBackend, DType, Error, Result};

use crate::tokenizer::Tokenizer;
use crate::transformer::{KvCache, Transformer};

/// Most drafted tokens one verify pass checks: with the token before them, 16 rows, the
/// most for which a verify row has the one-token step's bits.
pub const MAX_DRAFT: usize = 15;

/// Longest n-gram prompt lookup matches.
pub const MAX_NGRAM: usize = 16;

/// Where drafted tokens come from, and how many at most per verify pass.
#[derive(Debug)]
pub struct Drafter<'m> {
    source: Source<'m>,
    max_draft: usize,
    /// Drafts the next pass asks for: +2 after a pass whose drafts were all kept, −1
    /// (down to 1) after one with a rejection, within `1..=max_draft` (a verify row costs
    /// about as much as a token's step on the CPU, so rejected drafts are not free).
    window: usize,
}

#[derive(Debug)]
enum Source<'m> {
    /// Prompt lookup: the tokens that followed the latest earlier occurrence of the
    /// sequence's last `n` tokens, `n` from `max_ngram` down to 1.
    Ngram { max_ngram: usize },
    /// A smaller model with the same vocabulary, decoding greedily.
    Model(Box<DraftModel<'m>>),
}

/// A draft model and the cache of the one sequence it follows.
#[derive(Debug)]
struct DraftModel<'m> {
    model: &'m Transformer,
    cache: KvCache,
    /// The tokens of the cache's positions.
    held: Vec<u32>,
    /// Ids a draft may be: `0..vocab` (the tokenizer's).
    vocab: usize,
}

fn check_max_draft(max_draft: usize) -> Result<()> {
    if !(1..=MAX_DRAFT).contains(&max_draft) {
        return Err(Error::value("speculative decoding", "--draft-max", format!("1..={MAX_DRAFT}"), max_draft));
    }
    Ok(())
}

impl<'m> Drafter<'m> {
    /// Prompt-lookup drafting: up to `max_draft` (1 ..= [`MAX_DRAFT`]) tokens that
    /// followed the latest earlier occurrence of the sequence's last `n` tokens, for the
    /// longest `n` ≤ `max_ngram` (1 ..= [`MAX_NGRAM`]) that occurs earlier.
    pub fn ngram(max_ngram: usize, max_draft: usize) -> Result<Drafter<'m>> {
        if !(1..=MAX_NGRAM).contains(&max_ngram) {
            return Err(Error::value("speculative decoding", "--draft-ngram", format!("1..={MAX_NGRAM}"), max_ngram));
        }
        check_max_draft(max_draft)?;
        Ok(Drafter { source: Source::Ngram { max_ngram }, max_draft, window: max_draft })
    }

    /// Drafting with `model`, a smaller model whose tokenizer is `target`'s (see
    /// [`check_same_vocabulary`]), greedily, up to `max_draft` (1 ..= [`MAX_DRAFT`])
    /// tokens a pass, over its own cache of `ctx_size` positions (clamped to its
    /// context) in `cache_dtype`. Draft ids are below `vocab` (the tokenizer's size).
    pub fn model(
        b: &dyn ComputeBackend,
        model: &'m Transformer,
        vocab: usize,
        ctx_size: usize,
        cache_dtype: DType,
        max_draft: usize,
    ) -> Result<Drafter<'m>> {
        check_max_draft(max_draft)?;
        if model.arch.linear_attention.is_some() {
            return Err(Error::unsupported(
                "speculative decoding",
                format!(
                    "the draft model ({}) has Gated DeltaNet layers, whose recurrent state cannot be cut back to \
                     the accepted drafts; use a draft model with attention layers only",
                    model.arch.name
                ),
            ));
        }
        let cache = model.new_cache_of(b, ctx_size.clamp(1, model.arch.context_length), cache_dtype)?;
        let vocab = vocab.clamp(1, model.arch.vocab_size);
        let source = Source::Model(Box::new(DraftModel { model, cache, held: Vec::new(), vocab }));
        Ok(Drafter { source, max_draft, window: max_draft })
    }

    /// Most tokens drafted per pass.
    pub fn max_draft(&self) -> usize {
        self.max_draft
    }

    /// `"ngram"` or `"model"`.
    pub fn kind(&self) -> &'static str {
        match self.source {
            Source::Ngram { .. } => "ngram",
            Source::Model(_) => "model",
        }
    }

    /// Tells the drafter how its last drafts fared: `accepted` of `drafted` kept. The
    /// next pass drafts 2 more after a pass that kept all, 1 fewer after a rejection.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        self.window = if accepted >= drafted { self.window + 2 } else { self.window.saturating_sub(1) };
        self.window = self.window.clamp(1, self.max_draft);
    }

    /// Up to `limit` (and the current window, at most [`max_draft`](Self::max_draft))
    /// guesses of the tokens that follow `seq` (the whole sequence so far, its last
    /// token not yet run by the target). Possibly none.
    pub fn draft(&mut self, b: &dyn ComputeBackend, seq: &[u32], limit: usize) -> Result<Vec<u32>> {
        let k = limit.min(self.window);
        if k == 0 || seq.is_empty() {
            return Ok(Vec::new());
        }
        match &mut self.source {
            Source::Ngram { max_ngram } => Ok(prompt_lookup(seq, *max_ngram, k).to_vec()),
            Source::Model(m) => m.draft(b, seq, k),
        }
    }
}

/// The up to `k` tokens that followed the latest earlier occurrence of `seq`'s last `n`
/// tokens, for the longest `n ≤ max_ngram` that has one (empty when none does).
pub fn prompt_lookup(seq: &[u32], max_ngram: usize, k: usize) -> &[u32] {
    let len = seq.len();
    for n in (1..=max_ngram.min(len.saturating_sub(1))).rev() {
        let pattern = &seq[len - n..];
        // Latest first: an edit of the text copies the part just read.
        if let Some(start) = (0..len - n).rev().find(|&s| &seq[s..s + n] == pattern) {
            let from = start + n;
            return &seq[from..(from + k).min(len)];
        }
    }
    &[]
}

impl DraftModel<'_> {
    fn draft(&mut self, b: &dyn ComputeBackend, seq: &[u32], k: usize) -> Result<Vec<u32>> {
        // The cache holds `seq` and k − 1 drafts at the end.
        let k = k.min((self.cache.capacity + 1).saturating_sub(seq.len()));
        if k == 0 {
            return Ok(Vec::new());
        }
        // Keep what the cache shares with `seq`, short of its last token (run for the logits).
        let common = self.held.iter().zip(seq).take_while(|(a, b)| a == b).count();
        let keep = common.min(seq.len() - 1).min(self.cache.len);
        self.cache.truncate(keep)?;
        self.held.truncate(keep);
        let mut logits = self.model.forward_cached(b, &seq[keep..], &mut self.cache)?;
        self.held.extend_from_slice(&seq[keep..]);
        let mut drafts = Vec::with_capacity(k);
        loop {
            let next = argmax(&logits[..self.vocab.min(logits.len())]);
            drafts.push(next);
            if drafts.len() == k {
                return Ok(drafts);
            }
            logits = self.model.forward_cached(b, &[next], &mut self.cache)?;
            self.held.push(next);
        }
    }
}

/// The first index of the largest value (0 for an empty slice).
fn argmax(xs: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best as u32
}

/// An error unless `draft` (the draft model's tokenizer) has `target`'s vocabulary:
/// the same number of tokens and the same token at every id.
pub fn check_same_vocabulary(target: &Tokenizer, draft: &Tokenizer) -> Result<()> {
    const OP: &str = "--draft-model";
    let (n, m) = (target.vocab_size(), draft.vocab_size());
    if n != m {
        return Err(Error::value(
            OP,
            "vocabulary",
            format!("the model's vocabulary of {n} tokens (a draft model must share its tokenizer)"),
            format!("a vocabulary of {m} tokens"),
        ));
    }
    if let Some(id) = (0..n as u32).find(|&id| target.token(id) != draft.token(id)) {
        return Err(Error::value(
            OP,
            "vocabulary",
            format!("the model's tokens (id {id} is {:?})", target.token(id).unwrap_or("")),
            format!("id {id} = {:?} (a different tokenizer of the same size)", draft.token(id).unwrap_or("")),
        ));
    }
    Ok(())
}

/// An error unless the cache can be cut back after a verify pass: no Gated DeltaNet
/// state (see the module notes).
pub(super) fn check_target(cache: &KvCache, model: &Transformer, split: bool) -> Result<()> {
    if cache.has_linear_state() {
        return Err(Error::unsupported(
            "speculative decoding",
            format!(
                "{} has Gated DeltaNet layers, whose recurrent state sums every position and cannot be cut back to \
                 the accepted drafts; generate without --draft-model/--draft-ngram",
                model.arch.name
            ),
        ));
    }
    if split {
        return Err(Error::unsupported(
            "speculative decoding",
            "a model split over MPI ranks (the other ranks' caches cannot be cut back to the accepted drafts)",
        ));
    }
    Ok(())
}

/// Drafted and accepted token counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Tokens drafted (run in verify passes).
    pub drafted: usize,
    /// Of them, tokens the model chose too (kept).
    pub accepted: usize,
    /// Verify passes that checked at least one draft.
    pub passes: usize,
}

impl DraftStats {
    /// `accepted / drafted` (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_takes_the_latest_longest_match() {
        // "1 2 3 9 … 1 2 3 7 8 … 2 3": the 2-gram "2 3" last occurred before "7 8".
        let seq = [1, 2, 3, 9, 5, 1, 2, 3, 7, 8, 6, 2, 3];
        assert_eq!(prompt_lookup(&seq, 2, 3), &[7, 8, 6]);
        assert_eq!(prompt_lookup(&seq, 2, 1), &[7]);
        // The continuation stops at the end of the sequence.
        assert_eq!(prompt_lookup(&[4, 5, 4], 3, 5), &[5, 4]);
        // Nothing earlier matches.
        assert!(prompt_lookup(&[1, 2, 3], 3, 4).is_empty());
        assert!(prompt_lookup(&[7], 3, 4).is_empty());
    }

    #[test]
    fn longer_ngrams_win_over_later_short_ones() {
        // 3-gram "1 2 3" → 4; the 1-gram "3" occurred later, before 5.
        let seq = [1, 2, 3, 4, 0, 3, 5, 1, 2, 3];
        assert_eq!(prompt_lookup(&seq, 3, 1), &[4]);
        assert_eq!(prompt_lookup(&seq, 1, 1), &[5]);
    }

    #[test]
    fn bad_settings_are_errors() {
        assert!(Drafter::ngram(0, 4).unwrap_err().to_string().contains("--draft-ngram"));
        assert!(Drafter::ngram(3, 0).unwrap_err().to_string().contains("--draft-max"));
        assert!(Drafter::ngram(3, MAX_DRAFT + 1).unwrap_err().to_string().contains("--draft-max"));
        assert_eq!(Drafter::ngram(3, 4).unwrap().max_draft(), 4);
    }

    #[test]
    fn the_window_follows_acceptance() {
        let b = fusebox::CpuBackend::with_threads(1).unwrap();
        let seq = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1];
        let mut d = Drafter::ngram(1, 6).unwrap();
        assert_eq!(d.draft(&b, &seq, 10).unwrap().len(), 6);
        d.record(6, 2);
        d.record(5, 0);
        assert_eq!(d.draft(&b, &seq, 10).unwrap(), [2, 3, 4, 5]);
        d.record(4, 4);
        assert_eq!(d.draft(&b, &seq, 10).unwrap().len(), 6);
        for _ in 0..10 {
            d.record(3, 0);
        }
        assert_eq!(d.draft(&b, &seq, 10).unwrap().len(), 1);
    }
}
