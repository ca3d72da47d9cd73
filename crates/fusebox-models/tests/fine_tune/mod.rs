//! What the fine-tuning tests share: the tiny Hugging Face models of `tests/fixtures/arch/`
//! (recorded by `scripts/record_arch_fixtures.py`), a text to train on, the settings of a
//! short run, and temporary directories.

#![allow(dead_code)] // not every test binary uses every helper

use std::path::{Path, PathBuf};

use fusebox_models::train::TrainConfig;

/// The fixture directory of architecture `name`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/arch").join(name)
}

/// A temporary directory `fusebox-{name}-{pid}`, removed when dropped (also when a test
/// fails).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("fusebox-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A short run: `steps` steps of 2 micro-batches of 3 sequences of ≤ 16 tokens, peak
/// learning rate `lr` after 2 warmup steps, seed 7.
pub fn config(steps: u64, lr: f32, weight_decay: f32) -> TrainConfig {
    TrainConfig {
        steps,
        batch: 3,
        accumulation: 2,
        seq_len: 16,
        lr,
        warmup: 2,
        weight_decay,
        seed: 7,
        eval_every: 0,
        eval_batches: 2,
        ..TrainConfig::default()
    }
}

/// `dir/data.txt`: 400 words drawn from eleven by a fixed generator.
pub fn text_file(dir: &Path) -> PathBuf {
    let words = ["the", "cat", "sat", "on", "a", "mat", "and", "ran", "to", "red", "door"];
    let mut state = 12345u64;
    let mut text = String::new();
    for _ in 0..400 {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        text.push_str(words[(state >> 33) as usize % words.len()]);
        text.push(' ');
    }
    let path = dir.join("data.txt");
    std::fs::write(&path, text).unwrap();
    path
}
