//! Fuzz target: parse arbitrary bytes as GGUF and touch everything a caller can.
//!
//! The reader must return `Ok` or an `Err` for any input: no panic, no
//! out-of-bounds read (the sanitizer would catch one), no huge allocation (libFuzzer's
//! `-rss_limit_mb` and `-malloc_limit_mb` catch those).

#![no_main]

use fusebox_models::gguf::GgufFile;
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
});
