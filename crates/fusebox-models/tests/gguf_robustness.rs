//! Deterministic robustness of the GGUF reader: thousands of damaged variants of
//! a valid small file (every truncation, seeded byte flips, overwritten fields).
//! Each must parse or fail with a `gguf:` error — never panic — and every tensor
//! of a file that parses must be readable or fail cleanly. This is the in-repo
//! counterpart of the `cargo fuzz` target in `fuzz/`, runnable on stable.

mod common;

use common::{sample_writer, Rng};
use fusebox::Error;
use fusebox_models::chat::ChatTemplate;
use fusebox_models::gguf::GgufFile;
use fusebox_models::tokenizer::Tokenizer;

/// Parses `bytes` and touches everything a caller could touch.
fn exercise(bytes: Vec<u8>) -> Result<usize, Error> {
    let file = GgufFile::from_bytes(bytes)?;
    let mut touched = 0;
    for (key, value) in file.metadata().iter() {
        touched += key.len() + value.describe().len();
    }
    for info in file.tensors() {
        let _ = info.shape();
        let _ = info.dtype();
        if let Ok(bytes) = file.tensor_bytes(info.name()) {
            touched += bytes.len();
        }
        if let Ok(t) = file.tensor(info.name()) {
            touched += t.dims().len();
        }
    }
    Ok(touched)
}

fn check(bytes: Vec<u8>, label: &str) -> bool {
    match std::panic::catch_unwind(|| exercise(bytes)) {
        Ok(Ok(_)) => true,
        Ok(Err(Error::Io(msg))) => {
            assert!(msg.starts_with("gguf:"), "{label}: error without the gguf: prefix: {msg}");
            false
        }
        Ok(Err(other)) => panic!("{label}: unexpected error kind: {other}"),
        Err(_) => panic!("{label}: the reader panicked"),
    }
}

#[test]
fn every_truncation_fails_cleanly() {
    let full = sample_writer().to_bytes();
    assert!(check(full.clone(), "full file"));
    // A cut may only succeed past the end of the last tensor whose size is known
    // (what follows is padding and the unknown-type tensor's bytes).
    let parsed = GgufFile::from_bytes(full.clone()).unwrap();
    let known_end = parsed
        .tensors()
        .iter()
        .filter_map(|t| t.byte_len().map(|len| parsed.data_offset() + t.offset() + len))
        .max()
        .unwrap() as usize;
    for len in 0..full.len() {
        let ok = check(full[..len].to_vec(), &format!("truncated to {len}"));
        assert_eq!(ok, len >= known_end, "truncated to {len} of {} (known data ends at {known_end})", full.len());
    }
}

#[test]
fn seeded_byte_flips() {
    let full = sample_writer().to_bytes();
    let mut rng = Rng::new(0x5EED_F00D);
    let (mut ok, mut err) = (0, 0);
    for variant in 0..4000 {
        let mut bytes = full.clone();
        let flips = 1 + rng.below(4);
        for _ in 0..flips {
            let at = rng.below(bytes.len());
            bytes[at] = match rng.below(4) {
                0 => bytes[at] ^ (1 << rng.below(8)),
                1 => 0xFF,
                2 => 0,
                _ => rng.next_u64() as u8,
            };
        }
        if rng.below(8) == 0 {
            let len = rng.below(bytes.len());
            bytes.truncate(len);
        }
        if check(bytes, &format!("variant {variant}")) {
            ok += 1;
        } else {
            err += 1;
        }
    }
    // Both outcomes must occur, or the mutations are not reaching the parser.
    assert!(ok > 100 && err > 100, "ok {ok}, err {err}");
}

#[test]
fn overwritten_words_in_the_header_region() {
    // Overwrite each aligned 8-byte word before the data section with extreme values:
    // counts, lengths, dims and offsets all pass through here.
    let full = sample_writer().to_bytes();
    let data_offset = GgufFile::from_bytes(full.clone()).unwrap().data_offset() as usize;
    for at in 0..data_offset.saturating_sub(8) {
        for word in [u64::MAX, 1 << 63, u64::MAX / 2 + 1, 0, 1 << 32, 0xFFFF_FFFF] {
            let mut bytes = full.clone();
            bytes[at..at + 8].copy_from_slice(&word.to_le_bytes());
            check(bytes, &format!("word {word:#x} at {at}"));
        }
    }
}

#[test]
fn mutated_tokenizer_metadata() {
    // Damaged tokenizer GGUFs: building a tokenizer or template fails cleanly or
    // yields one that encodes and decodes without panicking.
    let full = common::small_vocab::small_tokenizer_writer().to_bytes();
    let mut rng = Rng::new(99);
    let mut built = 0;
    for variant in 0..1500 {
        let mut bytes = full.clone();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(bytes.len());
            bytes[at] ^= 1 << rng.below(8);
        }
        let run = std::panic::catch_unwind(|| {
            let Ok(file) = GgufFile::from_bytes(bytes) else { return false };
            if let Ok(Some(source)) = file.metadata().get_str("tokenizer.chat_template") {
                let _ = ChatTemplate::from_jinja(source).map(|t| t.apply(&[("user", "hi")], true));
            }
            let Ok(tok) = Tokenizer::from_gguf(file.metadata()) else { return false };
            let ids = tok.encode("<|im_start|>hello the 12 ünï 😀 <user>", true);
            let _ = tok.decode(&ids);
            true
        });
        match run {
            Ok(ok) => built += usize::from(ok),
            Err(_) => panic!("variant {variant}: panicked"),
        }
    }
    assert!(built > 100, "only {built} variants built a tokenizer");
}

/// The committed seeds of the `cargo fuzz` corpus are exactly what the writers produce
/// today. `FUSEBOX_WRITE_SEEDS=1 cargo test -p fusebox-models --test gguf_robustness`
/// rewrites them after the samples change.
#[test]
fn fuzz_seeds_are_current() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let seeds = [
        ("sample.gguf", sample_writer().to_bytes()),
        ("tokenizer.gguf", common::small_vocab::small_tokenizer_writer().to_bytes()),
    ];
    let rewrite = std::env::var_os("FUSEBOX_WRITE_SEEDS").is_some();
    for (name, bytes) in seeds {
        let path = dir.join(name);
        if rewrite {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        let committed = std::fs::read(&path).unwrap_or_default();
        assert!(committed == bytes, "{} is stale: rerun with FUSEBOX_WRITE_SEEDS=1", path.display());
    }
}
