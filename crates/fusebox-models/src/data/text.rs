//! `--data FILE`: any UTF-8 text, tokenized byte by byte (vocab 256), split 90/10 into
//! training and validation, sampled as random windows.

use fusebox::{Error, Result};

use crate::rng::Rng;

/// Byte-level vocabulary size.
pub const VOCAB: usize = 256;

/// A text corpus as bytes, split into training and validation parts.
#[derive(Debug, Clone)]
pub struct TextData {
    /// The training bytes.
    pub train: Vec<u8>,
    /// The validation bytes.
    pub valid: Vec<u8>,
}

impl TextData {
    /// Reads and splits a UTF-8 file. Errors: missing, empty, not UTF-8 (with the byte
    /// offset), or too short for the sequence length.
    pub fn load(path: &std::path::Path, seq_len: usize) -> Result<TextData> {
        let bytes = std::fs::read(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
        Self::from_bytes(bytes, seq_len).map_err(|e| match e {
            Error::Io(msg) => Error::Io(format!("{}: {msg}", path.display())),
            other => other,
        })
    }

    /// Splits bytes of text (see [`TextData::load`]).
    pub fn from_bytes(bytes: Vec<u8>, seq_len: usize) -> Result<TextData> {
        if bytes.is_empty() {
            return Err(Error::Io("the data file is empty".into()));
        }
        if let Err(e) = std::str::from_utf8(&bytes) {
            return Err(Error::Io(format!(
                "the data file is not UTF-8 text (invalid byte at offset {})",
                e.valid_up_to()
            )));
        }
        let split = bytes.len() * 9 / 10;
        let (train, valid) = (bytes[..split].to_vec(), bytes[split..].to_vec());
        let window = seq_len.saturating_add(1);
        if train.len() <= window || valid.len() <= window {
            return Err(Error::Io(format!(
                "the data file has {} bytes: too short for sequences of {seq_len} (needs more than {})",
                bytes.len(),
                (seq_len as u128 + 2) * 10
            )));
        }
        Ok(TextData { train, valid })
    }

    /// `batch` random windows of `seq_len + 1` bytes: inputs and next-byte targets.
    pub fn batch(part: &[u8], rng: &mut Rng, batch: usize, seq_len: usize) -> (Vec<u32>, Vec<u32>) {
        let mut ids = Vec::with_capacity(batch * seq_len);
        let mut targets = Vec::with_capacity(batch * seq_len);
        for _ in 0..batch {
            let start = rng.below(part.len() - seq_len);
            ids.extend(part[start..start + seq_len].iter().map(|&b| b as u32));
            targets.extend(part[start + 1..start + seq_len + 1].iter().map(|&b| b as u32));
        }
        (ids, targets)
    }
}

/// Text of byte tokens, lossy where generation split a character.
pub fn decode(tokens: &[u32]) -> String {
    let bytes: Vec<u8> = tokens.iter().map(|&t| t.min(255) as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_files_are_clear_errors() {
        assert!(TextData::from_bytes(vec![], 8).unwrap_err().to_string().contains("empty"));
        let e = TextData::from_bytes(b"some text".repeat(10), usize::MAX).unwrap_err();
        assert!(e.to_string().contains("too short"), "{e}");
        let mut bad = b"hello world, this is text".repeat(10);
        bad[40] = 0xFF;
        assert!(TextData::from_bytes(bad, 8).unwrap_err().to_string().contains("offset 40"));
        assert!(TextData::from_bytes(b"tiny".to_vec(), 8).unwrap_err().to_string().contains("too short"));
    }

    #[test]
    fn windows_are_shifted_by_one() {
        let data = TextData::from_bytes("abcdefghijklmnopqrstuvwxyz".repeat(10).into_bytes(), 8).unwrap();
        let (ids, targets) = TextData::batch(&data.train, &mut Rng::new(1), 2, 8);
        assert_eq!(ids.len(), 16);
        for i in 0..7 {
            assert_eq!(ids[i + 1], targets[i]);
        }
    }
}
