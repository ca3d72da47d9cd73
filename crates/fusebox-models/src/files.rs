//! Opening model files safely: only regular files are read (a FIFO would block
//! forever, `/dev/zero` would be read until memory runs out), and small text files
//! (JSON configs, tokenizers) are read only up to a size cap.

use std::fs::File;
use std::io::Read;
use std::ops::Deref;
use std::path::Path;

use fusebox::{Error, Result};
use memmap2::Mmap;

/// Most bytes read from a `config.json`, `tokenizer_config.json` or
/// `model.safetensors.index.json` (real ones are a few KiB to a few MiB).
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;
/// Most bytes read from a `tokenizer.json` (large vocabularies are tens of MiB).
pub const MAX_TOKENIZER_BYTES: u64 = 512 << 20;

/// The error for a path that exists but is not a regular file.
pub(crate) fn not_regular(path: &Path, what: &str, kind: std::fs::FileType) -> Error {
    let kind = if kind.is_dir() {
        "a directory"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        }
    };
    Error::Io(format!("{}: {what} must be a regular file, found {kind}", path.display()))
}

/// Opens `path` for reading after checking (following symlinks) that it is a
/// regular file; returns the file and its length. `what` names the file's role in
/// errors (`config.json`, `the GGUF model`).
pub fn open_regular(path: &Path, what: &str) -> Result<(File, u64)> {
    let meta =
        std::fs::metadata(path).map_err(|e| Error::Io(format!("{}: cannot open {what}: {e}", path.display())))?;
    if !meta.file_type().is_file() {
        return Err(not_regular(path, what, meta.file_type()));
    }
    let file = File::open(path).map_err(|e| Error::Io(format!("{}: cannot open {what}: {e}", path.display())))?;
    // Checked again on the open file: the path may have been replaced in between.
    let meta = file.metadata().map_err(|e| Error::Io(format!("{}: cannot read {what}: {e}", path.display())))?;
    if !meta.file_type().is_file() {
        return Err(not_regular(path, what, meta.file_type()));
    }
    Ok((file, meta.len()))
}

/// Whether `path` names a regular file (following symlinks).
pub fn is_regular(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_file())
}

/// A model file's bytes: memory-mapped from disk, or owned (tests, fuzzing).
#[derive(Debug)]
pub(crate) enum Bytes {
    /// The file mapped read-only.
    Mapped(Mmap),
    /// Bytes held in memory.
    Owned(Vec<u8>),
}

impl Bytes {
    /// Gives back this process's pages of `range` (whole pages inside it) where the bytes
    /// are mapped: a loader that copied them will not read them again. They stay in the
    /// page cache; a later read faults them in again from the file, unchanged.
    pub(crate) fn release(&self, range: std::ops::Range<usize>) {
        #[cfg(unix)]
        if let Bytes::Mapped(m) = self {
            const PAGE: usize = 4096;
            let start = range.start.div_ceil(PAGE) * PAGE;
            let end = (range.end.min(m.len()) / PAGE) * PAGE;
            if start < end {
                // SAFETY: the map is read-only and never written through, so dropping its
                // pages loses nothing: each is re-read from the file on its next access
                // (the hazard MADV_DONTNEED has is for written private pages).
                let _ = unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
            }
        }
        #[cfg(not(unix))]
        let _ = range;
    }
}

/// Bytes copied per step by [`Bytes::copy_releasing`] (whole pages).
const COPY_STEP: usize = 4 << 20;

impl Bytes {
    /// Copies `range` into `dst` (of its length), giving back each mapped piece's pages
    /// once copied (see [`release`](Self::release)): the copy and the pages it came from
    /// are never both resident beyond one step, so a loader's peak memory is its weights,
    /// not its weights and the largest tensor's pages again.
    pub(crate) fn copy_releasing(&self, range: std::ops::Range<usize>, dst: &mut [u8]) {
        let mut at = range.start;
        while at < range.end {
            // Steps end on multiples of COPY_STEP, so each releases whole pages.
            let end = ((at / COPY_STEP + 1) * COPY_STEP).min(range.end);
            dst[at - range.start..end - range.start].copy_from_slice(&self[at..end]);
            self.release(at..end);
            at = end;
        }
    }
}

impl AsRef<[u8]> for Bytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// Reads a regular text file of at most `cap` bytes as UTF-8.
pub fn read_text(path: &Path, what: &str, cap: u64) -> Result<String> {
    let (file, len) = open_regular(path, what)?;
    if len > cap {
        return Err(Error::Io(format!("{}: {what} is {len} bytes, more than the {cap} bytes allowed", path.display())));
    }
    let mut bytes = Vec::new();
    // One byte past the cap tells a file that grew after the size check.
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::Io(format!("{}: cannot read {what}: {e}", path.display())))?;
    if bytes.len() as u64 > cap {
        return Err(Error::Io(format!("{}: {what} is more than the {cap} bytes allowed", path.display())));
    }
    String::from_utf8(bytes).map_err(|e| {
        Error::Io(format!(
            "{}: {what} is not UTF-8 text (bad byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        ))
    })
}

/// Reads and parses a regular JSON file of at most `cap` bytes.
pub fn read_json(path: &Path, what: &str, cap: u64) -> Result<serde_json::Value> {
    let text = read_text(path, what, cap)?;
    serde_json::from_str(&text).map_err(|e| Error::Io(format!("{}: {what} is not valid JSON: {e}", path.display())))
}

/// Reads `T` from JSON `v`; an error names `what` (the file) and the field's path:
/// `arch.json: 'rope.scaling.factor': invalid type: string "big", expected f64`.
pub fn from_json_value<T: serde::de::DeserializeOwned>(v: &serde_json::Value, what: &str) -> Result<T> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        // serde quotes names with backticks; the rest of fusebox's messages use '…'.
        let msg = e.inner().to_string().replace('`', "'");
        Error::Io(if path == "." { format!("{what}: {msg}") } else { format!("{what}: '{path}': {msg}") })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_devices_fifos_and_oversized_files() {
        let dir = std::env::temp_dir().join(format!("fusebox-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let zero = dir.join("zero.json");
        let _ = std::fs::remove_file(&zero);
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let e = read_text(&zero, "config.json", MAX_CONFIG_BYTES).unwrap_err().to_string();
        assert!(e.contains("character device") && e.contains("zero.json"), "{e}");

        let fifo = dir.join("fifo");
        let _ = std::fs::remove_file(&fifo);
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let e = open_regular(&fifo, "model.safetensors").unwrap_err().to_string();
        assert!(e.contains("FIFO"), "{e}");

        let big = dir.join("big.json");
        std::fs::write(&big, vec![b' '; 100]).unwrap();
        let e = read_text(&big, "config.json", 10).unwrap_err().to_string();
        assert!(e.contains("100 bytes") && e.contains("10 bytes"), "{e}");
        assert_eq!(read_text(&big, "config.json", 100).unwrap().len(), 100);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
