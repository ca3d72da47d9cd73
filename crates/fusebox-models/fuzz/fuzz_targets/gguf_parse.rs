//! Fuzz target: parse arbitrary bytes as GGUF and touch everything a caller can,
//! including building a tokenizer and a chat template from the metadata.
//!
//! The reader must return `Ok` or an `Err` for any input: no panic, no
//! out-of-bounds read (the sanitizer would catch one), no huge allocation (libFuzzer's
//! `-rss_limit_mb` and `-malloc_limit_mb` catch those).

#![no_main]

use fusebox_models::chat::ChatTemplate;
use fusebox_models::gguf::GgufFile;
use fusebox_models::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else { return };
    for (key, value) in file.metadata().iter() {
        std::hint::black_box((key, value.describe()));
    }
    for info in file.tensors() {
        let _ = std::hint::black_box(info.shape());
        let _ = std::hint::black_box(info.dtype());
        if let Ok(bytes) = file.tensor_bytes(info.name()) {
            std::hint::black_box(bytes.iter().fold(0u8, |a, &b| a ^ b));
        }
        let _ = std::hint::black_box(file.tensor(info.name()));
    }
    if let Ok(tok) = Tokenizer::from_gguf(file.metadata()) {
        let ids = tok.encode("<|im_start|>user\nHi 123 ünï 😀  \t\n<|im_end|>", true);
        let _ = std::hint::black_box(tok.decode(&ids));
    }
    if let Ok(Some(source)) = file.metadata().get_str("tokenizer.chat_template") {
        if let Ok(t) = ChatTemplate::from_jinja(source) {
            let _ = std::hint::black_box(t.apply(&[("user", "hi")], true));
        }
    }
});
