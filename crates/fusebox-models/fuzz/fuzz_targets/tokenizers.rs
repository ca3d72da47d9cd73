//! Fuzz target: the tokenizer loaders from arbitrary bytes, then an encode/decode
//! round through whatever loads.
//!
//! Input layout: the first byte chooses the loader. Even: the rest is a GGUF file
//! whose `tokenizer.ggml.*` metadata builds the tokenizer. Odd: the rest is a
//! `tokenizer.json`, optionally followed by a NUL byte and a `tokenizer_config.json`.
//! Seeds are in `seeds/tokenizers` (written by `scripts/loader_campaign.py --fuzz-seeds`).
//!
//! Building must return `Ok` or an `Err` for any input (no panic, no out-of-bounds
//! index, no allocation beyond what the input implies), and a built tokenizer must
//! encode and decode any text without panicking.

#![no_main]

use fusebox_models::gguf::GgufFile;
use fusebox_models::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fn exercise(tok: &Tokenizer) {
    for text in ["<|im_start|>user\nHi 123 ünï 😀  \t\n<|im_end|>", "", "hello hello", "\u{0}\u{ff}"] {
        let ids = tok.encode(text, true);
        let _ = std::hint::black_box(tok.decode(&ids));
        let _ = std::hint::black_box(tok.decode_with(&ids, true));
        let mut stream = tok.stream_decoder(true);
        for &id in &ids {
            let _ = std::hint::black_box(stream.push(id));
        }
    }
    let n = tok.vocab_size() as u32;
    let _ = std::hint::black_box(tok.decode(&[0, n.saturating_sub(1), n, u32::MAX]));
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    if selector % 2 == 0 {
        let Ok(file) = GgufFile::from_bytes(rest.to_vec()) else { return };
        if let Ok(tok) = Tokenizer::from_gguf(file.metadata()) {
            exercise(&tok);
        }
    } else {
        let (json, config) = match rest.iter().position(|&b| b == 0) {
            Some(at) => (&rest[..at], Some(&rest[at + 1..])),
            None => (rest, None),
        };
        let Ok(json) = std::str::from_utf8(json) else { return };
        let config = match config.map(std::str::from_utf8) {
            Some(Err(_)) => return,
            Some(Ok(c)) => Some(c),
            None => None,
        };
        if let Ok(tok) = Tokenizer::from_hf_json(json, config) {
            exercise(&tok);
        }
    }
});
