//! Incremental decoding for generation: one token in, the text it completes out.
//!
//! A byte-level token can end in the middle of a UTF-8 character (an emoji is
//! often two or three tokens). The decoder keeps such an incomplete tail until
//! the next tokens complete it, so every string it returns is whole characters.
//! Bytes that can never form a character become U+FFFD at once.

use fusebox::Result;

use super::Tokenizer;

/// Decodes token ids one at a time; see the module docs.
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    skip_special: bool,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder for `tokenizer`; control tokens are left out when `skip_special`.
    pub fn new(tokenizer: &'a Tokenizer, skip_special: bool) -> Self {
        StreamDecoder { tokenizer, skip_special, pending: Vec::new() }
    }

    /// Adds token `id`; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.tokenizer.token_bytes(id, self.skip_special, &mut self.pending)?;
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    // Valid up to `valid` by the error's own report.
                    out.push_str(std::str::from_utf8(&self.pending[start..valid]).unwrap_or_default());
                    match e.error_len() {
                        // An invalid sequence: replace it and go on.
                        Some(len) => {
                            out.push('\u{FFFD}');
                            start = valid + len;
                        }
                        // A character cut at the end: keep it for the next token.
                        None => {
                            start = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        Ok(out)
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    /// Ends the stream: whatever is held back, as U+FFFD if incomplete.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}
