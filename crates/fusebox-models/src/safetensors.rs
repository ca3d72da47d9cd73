//! safetensors files: an 8-byte little-endian header length, a JSON header
//! `{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`,
//! then the data. Reading memory-maps the file and validates the header with the
//! [`safetensors`] crate: the tensors must tile the data section exactly
//! (no overlap, no gap, no trailing bytes) and each size must match its dtype and shape.
//! Writing is atomic (temp file, then rename).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use ::safetensors::tensor::{Metadata as StMetadata, SafeTensors as StFile};
use ::safetensors::{Dtype as StDtype, SafeTensorError};
use fusebox::{DType, Error, Result, Tensor};
use memmap2::Mmap;
use serde_json::{json, Map, Value};

use crate::files::{open_regular, Bytes};

/// One tensor's entry in a safetensors file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The element type.
    pub dtype: DType,
    /// The row-major shape.
    pub shape: Vec<usize>,
    /// Start of the bytes inside the data section.
    pub begin: usize,
    /// End (exclusive) of the bytes inside the data section.
    pub end: usize,
}

/// A validated safetensors file, memory-mapped (or held in memory); tensors are
/// copied out on request.
#[derive(Debug)]
pub struct SafeTensors {
    bytes: Bytes,
    data_start: usize,
    /// Every tensor by name.
    pub tensors: BTreeMap<String, TensorInfo>,
    /// The string pairs of `__metadata__`.
    pub metadata: BTreeMap<String, String>,
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::Io(format!("safetensors: {what}"))
}

fn dtype_of(d: StDtype) -> Option<DType> {
    Some(match d {
        StDtype::F32 => DType::F32,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        StDtype::U32 => DType::U32,
        StDtype::F8_E4M3 => DType::F8E4M3,
        _ => return None,
    })
}

fn dtype_name(dtype: DType) -> Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "F32",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::U32 => "U32",
        DType::F8E4M3 => "F8_E4M3",
        other => return Err(Error::dtype("safetensors", "tensor", "f32, f16, bf16, u32 or f8e4m3", other)),
    })
}

/// Bytes per element of a dtype name, for the diagnosis of a refused header.
fn elem_bytes(name: &str) -> Option<usize> {
    Some(match name {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" | "F8_E4M3FNUZ" | "F8_E5M2FNUZ" => 1,
        "I16" | "U16" | "F16" | "BF16" => 2,
        "I32" | "U32" | "F32" => 4,
        "F64" | "I64" | "U64" | "C64" => 8,
        _ => return None,
    })
}

/// Why the crate refused a header, told with tensor names: the header is re-read as
/// plain JSON and each rule checked in turn. Falls back to the crate's own message.
fn diagnose(bytes: &[u8], e: &SafeTensorError) -> String {
    let fallback = || format!("{e}");
    let Some(n) = bytes.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(u64::from_le_bytes) else {
        return format!("file of {} bytes is too short for the 8-byte header length", bytes.len());
    };
    let Some(data_start) = n.checked_add(8).filter(|&end| end <= bytes.len() as u64) else {
        return format!("header length {n} runs past the end of the file ({} bytes)", bytes.len());
    };
    let data_len = bytes.len() as u64 - data_start;
    let Ok(Value::Object(header)) = serde_json::from_slice::<Value>(&bytes[8..data_start as usize]) else {
        return fallback();
    };
    let mut spans: Vec<(u64, u64, &str)> = Vec::new();
    for (name, entry) in &header {
        if name == "__metadata__" {
            continue;
        }
        let dtype = entry.get("dtype").and_then(Value::as_str).unwrap_or("?");
        let shape: Option<Vec<u64>> =
            entry.get("shape").and_then(Value::as_array).and_then(|a| a.iter().map(Value::as_u64).collect());
        let offsets = entry.get("data_offsets").and_then(Value::as_array).and_then(|a| match a.as_slice() {
            [b, e] => Some((b.as_u64()?, e.as_u64()?)),
            _ => None,
        });
        let (Some(shape), Some((begin, end))) = (shape, offsets) else {
            return format!("tensor '{name}': expected {{dtype, shape, data_offsets: [begin, end]}}, found {entry}");
        };
        if begin > end || end > data_len {
            return format!("tensor '{name}': bytes {begin}..{end} lie outside the data section ({data_len} bytes)");
        }
        let need = shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .and_then(|elems| elem_bytes(dtype).and_then(|b| elems.checked_mul(b as u64)));
        if need != Some(end - begin) {
            return format!(
                "tensor '{name}': {dtype} {shape:?} needs {} bytes, data_offsets give {}",
                need.map_or("an unrepresentable number of".into(), |n| n.to_string()),
                end - begin
            );
        }
        spans.push((begin, end, name));
    }
    spans.sort_unstable();
    let mut at = (0u64, "the start of the data section");
    for &(begin, end, name) in &spans {
        if begin < at.0 {
            return format!("tensor '{name}': bytes {begin}..{end} overlap tensor '{}' (which ends at {})", at.1, at.0);
        }
        if begin > at.0 {
            return format!("bytes {}..{begin} (before tensor '{name}') belong to no tensor", at.0);
        }
        at = (end, name);
    }
    if at.0 != data_len {
        return format!("{} trailing bytes after tensor '{}' belong to no tensor", data_len - at.0, at.1);
    }
    fallback()
}

impl SafeTensors {
    /// Memory-maps and validates the regular file at `path`.
    ///
    /// The file must not be modified while the `SafeTensors` is alive (the map would
    /// change under it); checkpoints are replaced by renaming, which keeps the mapped
    /// file intact.
    pub fn read(path: &Path) -> Result<SafeTensors> {
        let (file, _) = open_regular(path, "safetensors file")?;
        // SAFETY: the map is read-only and every access is bounds-checked against its
        // length; the documented contract is that the file is not modified while open.
        let map = unsafe { Mmap::map(&file) }
            .map_err(|e| Error::Io(format!("{}: cannot memory-map: {e}", path.display())))?;
        Self::from_bytes(Bytes::Mapped(map)).map_err(|e| match e {
            Error::Io(msg) => Error::Io(format!("{}: {msg}", path.display())),
            other => other,
        })
    }

    /// Parses and validates file contents held in memory.
    pub fn parse(bytes: Vec<u8>) -> Result<SafeTensors> {
        Self::from_bytes(Bytes::Owned(bytes))
    }

    fn from_bytes(bytes: Bytes) -> Result<SafeTensors> {
        let (header_len, meta): (usize, StMetadata) =
            StFile::read_metadata(&bytes).map_err(|e| bad(diagnose(&bytes, &e)))?;
        let data_start = 8 + header_len;
        let mut tensors = BTreeMap::new();
        for (name, info) in meta.tensors() {
            let dtype = dtype_of(info.dtype).ok_or_else(|| {
                bad(format!("tensor '{name}': dtype {:?} is not supported (F32, F16, BF16, U32, F8_E4M3)", info.dtype))
            })?;
            let (begin, end) = info.data_offsets;
            tensors.insert(name, TensorInfo { dtype, shape: info.shape.clone(), begin, end });
        }
        let metadata = meta.metadata().iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
        Ok(SafeTensors { bytes, data_start, tensors, metadata })
    }

    /// A tensor by name, copied into a host tensor.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let info = self.tensors.get(name).ok_or_else(|| bad(format!("no tensor named '{name}'")))?;
        // In range: the crate checked every tensor against the data section.
        let data = self
            .bytes
            .get(self.data_start + info.begin..self.data_start + info.end)
            .ok_or_else(|| bad(format!("tensor '{name}': bytes {}..{} out of range", info.begin, info.end)))?;
        Tensor::from_bytes(data, info.shape.clone(), info.dtype)
    }

    /// Tensor `name` as [`tensor`](Self::tensor) gives it, giving back this process's
    /// mapped pages of each piece once copied (see `Bytes::copy_releasing`): for a loader.
    pub fn take_tensor(&self, name: &str) -> Result<Tensor> {
        let info = self.tensors.get(name).ok_or_else(|| bad(format!("no tensor named '{name}'")))?;
        self.take_bytes(name, info, info.shape.clone(), 0..info.end - info.begin)
    }

    /// Rows `rows` (first axis) of tensor `name`, read as [`take_tensor`](Self::take_tensor)
    /// reads: only their bytes are copied (a pipeline stage's share of a split head).
    pub fn take_tensor_rows(&self, name: &str, rows: std::ops::Range<usize>) -> Result<Tensor> {
        let info = self.tensors.get(name).ok_or_else(|| bad(format!("no tensor named '{name}'")))?;
        let within = crate::weights::row_bytes(name, &info.shape, info.dtype, &rows)?;
        let dims: Vec<usize> = std::iter::once(rows.len()).chain(info.shape.iter().skip(1).copied()).collect();
        self.take_bytes(name, info, dims, within)
    }

    /// A host tensor of `dims` (tensor `name`'s dtype, `info` its entry) holding bytes
    /// `within` of its data, copied from the map with its pages given back (see
    /// [`take_tensor`](Self::take_tensor)).
    fn take_bytes(
        &self,
        name: &str,
        info: &TensorInfo,
        dims: Vec<usize>,
        within: std::ops::Range<usize>,
    ) -> Result<Tensor> {
        if self.data_start + info.end > self.bytes.len() || info.begin + within.end > info.end {
            return Err(bad(format!("tensor '{name}': bytes {}..{} out of range", info.begin, info.end)));
        }
        let mut t = Tensor::zeros(dims, info.dtype)?;
        let dst = t.host_bytes_mut()?;
        if dst.len() != within.len() {
            return Err(bad(format!(
                "tensor '{name}': {} bytes in the file, its shape and dtype take {}",
                within.len(),
                dst.len()
            )));
        }
        let start = self.data_start + info.begin;
        self.bytes.copy_releasing(start + within.start..start + within.end, dst);
        Ok(t)
    }
}

/// Writes `tensors` (host or device; brought to the host by the caller) to `path`
/// atomically: a temp file beside it, flushed and synced, then renamed.
pub fn write(path: &Path, tensors: &[(String, Tensor)], metadata: &BTreeMap<String, String>) -> Result<()> {
    let mut header = Map::new();
    if !metadata.is_empty() {
        header.insert("__metadata__".into(), json!(metadata));
    }
    let mut offset = 0usize;
    for (name, t) in tensors {
        let n = t.byte_len();
        header.insert(
            name.clone(),
            json!({"dtype": dtype_name(t.dtype())?, "shape": t.dims(), "data_offsets": [offset, offset + n]}),
        );
        offset += n;
    }
    let mut header_bytes = serde_json::to_vec(&Value::Object(header)).map_err(|e| Error::Io(e.to_string()))?;
    // Pad the header with spaces so the data section starts 8-byte aligned.
    while (8 + header_bytes.len()) % 8 != 0 {
        header_bytes.push(b' ');
    }
    let tmp = path.with_extension("safetensors.tmp");
    let io = |e: std::io::Error| Error::Io(format!("{}: {e}", tmp.display()));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    f.write_all(&(header_bytes.len() as u64).to_le_bytes()).map_err(io)?;
    f.write_all(&header_bytes).map_err(io)?;
    for (_, t) in tensors {
        f.write_all(t.host_bytes()?).map_err(io)?;
    }
    let f = f.into_inner().map_err(|e| Error::Io(format!("{}: {e}", tmp.display())))?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| Error::Io(format!("rename {} → {}: {e}", tmp.display(), path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let dir = std::env::temp_dir().join(format!("fusebox-st-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.safetensors");
        let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]).unwrap();
        let b = Tensor::from_vec(vec![7u32, 8], [2]).unwrap();
        let meta = BTreeMap::from([("step".to_string(), "3".to_string())]);
        write(&path, &[("a".into(), a.clone()), ("b".into(), b)], &meta).unwrap();
        let st = SafeTensors::read(&path).unwrap();
        assert_eq!(st.tensor("a").unwrap().to_vec::<f32>().unwrap(), a.to_vec::<f32>().unwrap());
        assert_eq!(st.tensor("b").unwrap().to_vec::<u32>().unwrap(), vec![7, 8]);
        assert_eq!(st.metadata["step"], "3");
        assert!(st.tensor("c").is_err());

        let bytes = std::fs::read(&path).unwrap();
        for cut in [0, 5, 8, 20, bytes.len() - 1] {
            assert!(SafeTensors::parse(bytes[..cut].to_vec()).is_err(), "truncated at {cut}");
        }
        let mut huge = bytes.clone();
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(SafeTensors::parse(huge).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A file from a header JSON and a data section.
    fn file(header: &str, data_len: usize) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend(std::iter::repeat_n(0u8, data_len));
        out
    }

    fn err(bytes: Vec<u8>) -> String {
        SafeTensors::parse(bytes).unwrap_err().to_string()
    }

    #[test]
    fn overlap_gaps_trailing_bytes_and_sizes_are_refused_by_name() {
        let two = |a: (u64, u64), b: (u64, u64)| {
            format!(
                r#"{{"a":{{"dtype":"F32","shape":[2],"data_offsets":[{},{}]}},"b":{{"dtype":"F32","shape":[2],"data_offsets":[{},{}]}}}}"#,
                a.0, a.1, b.0, b.1
            )
        };
        assert!(SafeTensors::parse(file(&two((0, 8), (8, 16)), 16)).is_ok());
        let e = err(file(&two((0, 8), (4, 12)), 12));
        assert!(e.contains("'b'") && e.contains("overlap") && e.contains("'a'"), "{e}");
        let e = err(file(&two((0, 8), (0, 8)), 8));
        assert!(e.contains("overlap"), "{e}");
        let e = err(file(&two((0, 8), (8, 16)), 20));
        assert!(e.contains("4 trailing bytes") && e.contains("'b'"), "{e}");
        let e = err(file(&two((0, 8), (12, 20)), 20));
        assert!(e.contains("bytes 8..12") && e.contains("'b'"), "{e}");
        let e = err(file(&two((0, 8), (8, 12)), 12));
        assert!(e.contains("'b'") && e.contains("needs 8 bytes"), "{e}");
        let e = err(file(&two((0, 8), (8, 16)), 12));
        assert!(e.contains("'b'") && e.contains("outside the data section"), "{e}");
        let i64s = r#"{"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}"#;
        let e = err(file(i64s, 8));
        assert!(e.contains("'a'") && e.contains("I64"), "{e}");
    }
}
