//! A bounds-checked little-endian reader over the bytes of a GGUF file.
//!
//! Every read checks that the bytes are there first, so a truncated or malformed
//! file produces a [`ParseError`] naming the offset and what was being read,
//! never a panic or an out-of-bounds access.

/// A parse failure: a message without the `gguf:` prefix, which the public API adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParseError(pub String);

impl ParseError {
    /// Prefixes the message with the context in which it happened.
    pub fn context(self, what: impl std::fmt::Display) -> Self {
        ParseError(format!("{what}: {}", self.0))
    }
}

impl From<ParseError> for fusebox::Error {
    fn from(e: ParseError) -> Self {
        fusebox::Error::Io(format!("gguf: {}", e.0))
    }
}

/// Result of the internal parsing functions.
pub(crate) type PResult<T> = Result<T, ParseError>;

/// Adds context to the error of a [`PResult`] lazily.
pub(crate) trait Context<T> {
    fn context_with<D: std::fmt::Display>(self, f: impl FnOnce() -> D) -> PResult<T>;
}

impl<T> Context<T> for PResult<T> {
    fn context_with<D: std::fmt::Display>(self, f: impl FnOnce() -> D) -> PResult<T> {
        self.map_err(|e| e.context(f()))
    }
}

/// A position in a byte slice; reads advance it.
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, pos: 0 }
    }

    /// The current offset from the start of the file.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left after the current offset.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The next `n` bytes, or an error naming `what` when the file ends first.
    pub fn take(&mut self, n: usize, what: &str) -> PResult<&'a [u8]> {
        if n > self.remaining() {
            return Err(ParseError(format!(
                "truncated: {what} needs {n} bytes at offset {}, only {} left (file is {} bytes)",
                self.pos,
                self.remaining(),
                self.bytes.len()
            )));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self, what: &str) -> PResult<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    pub fn u8(&mut self, what: &str) -> PResult<u8> {
        Ok(self.array::<1>(what)?[0])
    }
    pub fn u32(&mut self, what: &str) -> PResult<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub fn u64(&mut self, what: &str) -> PResult<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items that each take at least `min_item_bytes` in the file.
    ///
    /// The count is refused when the remaining bytes could not hold that many
    /// items, so a bogus count never leads to a huge allocation.
    pub fn count(&mut self, min_item_bytes: usize, what: &str) -> PResult<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let fits = self.remaining() / min_item_bytes.max(1);
        match usize::try_from(n) {
            Ok(n) if n <= fits => Ok(n),
            _ => Err(ParseError(format!(
                "{what} is {n} (at offset {at}), but the {} bytes left hold at most {fits} items of {} bytes",
                self.remaining(),
                min_item_bytes.max(1)
            ))),
        }
    }

    /// A GGUF string: a u64 byte length, then that many bytes of UTF-8 (no terminator).
    pub fn string(&mut self, what: &str) -> PResult<String> {
        self.str(what).map(str::to_owned)
    }

    /// A GGUF string as [`string`](Self::string) reads it, borrowed from the bytes.
    pub fn str(&mut self, what: &str) -> PResult<&'a str> {
        let at = self.pos;
        let len = self.count(1, &format!("{what} length"))?;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s),
            Err(e) => Err(ParseError(format!(
                "{what} (at offset {at}) is not valid UTF-8 (bad byte at string position {})",
                e.valid_up_to()
            ))),
        }
    }
}
