//! Fuzz target: a Hugging Face directory (`config.json`, `tokenizer.json`,
//! `model.safetensors`) from arbitrary bytes, loaded as `fusebox generate` would load
//! it and, when it loads, run for one token.
//!
//! Input layout: three u32 little-endian lengths, then the three files' bytes in that
//! order (a length past the input takes what is left). The seeds in `seeds/hf_dir`
//! are valid tiny models written by `scripts/loader_campaign.py --fuzz-seeds`.
//!
//! The loader must return `Ok` or an `Err` for any input: no panic, no hang, no
//! out-of-bounds read, no allocation larger than the input implies.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use fusebox::CpuBackend;
use fusebox_models::{open, pretrained};
use libfuzzer_sys::fuzz_target;

fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("fusebox-fuzz-hf-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    })
}

fn backend() -> &'static CpuBackend {
    static B: OnceLock<CpuBackend> = OnceLock::new();
    B.get_or_init(|| CpuBackend::with_threads(1).expect("cpu backend"))
}

fn split(data: &[u8]) -> Option<[&[u8]; 3]> {
    let mut lens = [0usize; 3];
    for (i, l) in lens.iter_mut().enumerate() {
        *l = u32::from_le_bytes(data.get(4 * i..4 * i + 4)?.try_into().ok()?) as usize;
    }
    let mut rest = &data[12..];
    let mut out = [&[][..]; 3];
    for (o, l) in out.iter_mut().zip(lens) {
        let (a, b) = rest.split_at(l.min(rest.len()));
        *o = a;
        rest = b;
    }
    Some(out)
}

fuzz_target!(|data: &[u8]| {
    let Some([config, tokenizer, weights]) = split(data) else { return };
    let d = dir();
    for (name, bytes) in [("config.json", config), ("tokenizer.json", tokenizer), ("model.safetensors", weights)] {
        std::fs::write(d.join(name), bytes).expect("write");
    }
    let b = backend();
    let _ = std::hint::black_box(open::is_pretrained(d));
    let Ok(p) = open::load(b, d) else { return };
    let _ = std::hint::black_box(p.chat_template());
    if let Ok(mut s) = p.session(b, 4) {
        let mut sampler = fusebox_models::Sampler::new(Default::default()).expect("greedy sampler");
        let prompt = p.tokenizer.encode("hi", false);
        if !prompt.is_empty() {
            let _ = std::hint::black_box(pretrained::generate(&mut s, b, &prompt, 1, &mut sampler, &[], |_| Ok(())));
        }
    }
});
