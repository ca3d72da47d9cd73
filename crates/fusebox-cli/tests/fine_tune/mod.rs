//! What the fine-tuning tests of the command line share: the binary, the tiny Hugging Face
//! llama of `fusebox-models/tests/fixtures/arch/` (recorded by
//! `scripts/record_arch_fixtures.py`), data files, and reading the final JSON line.

#![allow(dead_code)] // not every test binary uses every helper

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The `fusebox` binary (`FUSEBOX_BIN` overrides the one cargo built).
pub fn fusebox() -> Command {
    Command::new(std::env::var_os("FUSEBOX_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_fusebox").into()))
}

/// Runs `fusebox ARGS` to the end.
pub fn run(args: &[&str]) -> Output {
    fusebox().args(args).output().expect("the fusebox binary runs")
}

/// What the process wrote to stderr.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The tiny Hugging Face llama to fine-tune.
pub fn llama() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fusebox-models/tests/fixtures/arch/llama").display().to_string()
}

/// A temporary directory `fusebox-cli-{name}-{pid}`, removed when dropped (also when a
/// test fails).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("fusebox-cli-{name}-{}", std::process::id()));
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

/// The last line of stdout as JSON (the final object of `--json`).
pub fn last_json(o: &Output) -> Value {
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().last().unwrap_or_else(|| panic!("no output; stderr: {}", stderr(o)));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// `dir/data.txt`: one short sentence again and again.
pub fn text_data(dir: &Path) -> String {
    let path = dir.join("data.txt");
    std::fs::write(&path, "the cat sat on the mat. ".repeat(60)).unwrap();
    path.display().to_string()
}
