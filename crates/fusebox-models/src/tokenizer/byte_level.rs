//! GPT-2's byte-level alphabet: each of the 256 byte values stands for one
//! printable Unicode character, so a vocabulary of strings can hold any bytes.
//!
//! Bytes that are printable Latin-1 (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`) stand for
//! themselves; the other 68 bytes (controls, space, 0x7F–0xA0, 0xAD) map in
//! ascending order to U+0100, U+0101, ... So a space is `Ġ` (U+0120) and a
//! newline is `Ċ` (U+010A).

/// The byte ↔ character tables.
pub(crate) struct ByteLevel {
    to_char: [char; 256],
    /// Indexed by code point (below [`CODES`]): the byte it stands for.
    from_code: [Option<u8>; CODES],
}

/// One past the highest code point of the alphabet (U+0100 + 68 − 1 = U+0143).
const CODES: usize = 256 + 68;

fn printable(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

impl ByteLevel {
    pub fn new() -> Self {
        let mut to_char = ['\0'; 256];
        let mut from_code = [None; CODES];
        let mut next = 256u32;
        for b in 0..=255u8 {
            let code = if printable(b) {
                u32::from(b)
            } else {
                next += 1;
                next - 1
            };
            // Every code is below CODES (U+0143), so both conversions succeed.
            to_char[b as usize] = char::from_u32(code).unwrap_or('\u{FFFD}');
            from_code[code as usize] = Some(b);
        }
        ByteLevel { to_char, from_code }
    }

    /// The character standing for byte `b`.
    pub fn char_of(&self, b: u8) -> char {
        self.to_char[b as usize]
    }

    /// The byte a character stands for, if it is one of the 256.
    pub fn byte_of(&self, c: char) -> Option<u8> {
        self.from_code.get(c as usize).copied().flatten()
    }

    /// Appends the byte-level string of `bytes` to `out`.
    pub fn encode_into(&self, bytes: &[u8], out: &mut String) {
        out.extend(bytes.iter().map(|&b| self.char_of(b)));
    }

    /// The bytes of a byte-level string; a character outside the alphabet
    /// (never in a well-formed vocabulary) is kept as its own UTF-8 bytes.
    pub fn decode_into(&self, s: &str, out: &mut Vec<u8>) {
        let mut buf = [0u8; 4];
        for c in s.chars() {
            match self.byte_of(c) {
                Some(b) => out.push(b),
                None => out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_byte() {
        let bl = ByteLevel::new();
        for b in 0..=255u8 {
            assert_eq!(bl.byte_of(bl.char_of(b)), Some(b));
        }
        assert_eq!(bl.char_of(b' '), 'Ġ');
        assert_eq!(bl.char_of(b'\n'), 'Ċ');
        assert_eq!(bl.char_of(b'a'), 'a');
    }
}
