//! The model's vocabulary as llguidance sees it: a token trie of each id's bytes.
//!
//! Ordinary and byte tokens are their decoded bytes (`▁` as a space, byte-level BPE's
//! alphabet undone); control tokens are their text behind llguidance's 0xFF marker, so
//! that grammar text never matches them; unknown and unused slots are empty, so no
//! mask ever allows them. The end-of-sequence set is every id that ends a reply.

use std::sync::Arc;

use fusebox_models::pretrained::Pretrained;
use fusebox_models::tokenizer::TokenType;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// A tokenizer environment over a fusebox tokenizer.
pub struct Vocabulary {
    trie: TokTrie,
    model: Arc<Pretrained>,
}

impl Vocabulary {
    /// The trie of `model`'s first `vocab` ids (the logits a step samples from), ending
    /// at `end_ids`. Without an end id in the vocabulary, one past it stands in: no step
    /// samples it, so such an answer ends where its grammar allows nothing more (or at
    /// `max_tokens`).
    pub fn new(model: Arc<Pretrained>, vocab: usize, end_ids: &[u32]) -> Result<Vocabulary, String> {
        let tok = &model.tokenizer;
        let mut words = Vec::with_capacity(vocab + 1);
        for id in 0..vocab as u32 {
            let mut bytes = Vec::new();
            match tok.token_type(id) {
                Some(TokenType::Control) => {
                    bytes.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    tok.token_bytes(id, false, &mut bytes).map_err(|e| e.to_string())?;
                }
                Some(TokenType::Normal | TokenType::Byte | TokenType::UserDefined) => {
                    tok.token_bytes(id, false, &mut bytes).map_err(|e| e.to_string())?;
                }
                Some(TokenType::Unknown | TokenType::Unused) | None => {}
            }
            words.push(bytes);
        }
        let mut ends: Vec<TokenId> = end_ids.iter().copied().filter(|&e| (e as usize) < vocab).collect();
        if ends.is_empty() {
            ends.push(vocab as u32);
            words.push(Vec::new());
        }
        let mut info = TokRxInfo::new(words.len() as u32, ends[0]);
        info.tok_bos = tok.bos_id().filter(|&b| (b as usize) < vocab);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&ends);
        Ok(Vocabulary { trie, model })
    }

    /// As a shared environment for llguidance.
    pub fn into_env(self) -> TokEnv {
        Arc::new(self)
    }
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The tokenizer's own ids for text; bytes that are not UTF-8, and SentencePiece
    /// vocabularies (whose encoder adds a leading space), go greedily through the trie.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let tok = &self.model.tokenizer;
        match std::str::from_utf8(s) {
            Ok(text) if !tok.is_sentencepiece() => tok.encode_ordinary(text, false),
            _ => self.trie.greedy_tokenize(s),
        }
    }

    fn tokenize_is_canonical(&self) -> bool {
        !self.model.tokenizer.is_sentencepiece()
    }
}
