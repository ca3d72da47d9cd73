//! safetensors files: an 8-byte little-endian header length, a JSON header
//! `{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`,
//! then the data. Reading checks every offset and size against the file; writing is
//! atomic (temp file, then rename).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use fusebox::{DType, Error, Result, Tensor};
use serde_json::{json, Map, Value};

/// One tensor's entry in a safetensors file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Byte range inside the data section.
    pub begin: usize,
    /// End of the byte range (exclusive).
    pub end: usize,
}

/// A parsed safetensors file held in memory.
#[derive(Debug)]
pub struct SafeTensors {
    bytes: Vec<u8>,
    data_start: usize,
    /// Entries by tensor name.
    pub tensors: BTreeMap<String, TensorInfo>,
    /// The `__metadata__` strings.
    pub metadata: BTreeMap<String, String>,
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::Io(format!("safetensors: {what}"))
}

fn dtype_from_name(name: &str) -> Option<DType> {
    Some(match name {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "U32" => DType::U32,
        "F8_E4M3" => DType::F8E4M3,
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

impl SafeTensors {
    /// Reads and validates a file.
    pub fn read(path: &Path) -> Result<SafeTensors> {
        let bytes = std::fs::read(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
        Self::parse(bytes).map_err(|e| Error::Io(format!("{}: {e}", path.display())))
    }

    /// Parses and validates file contents.
    pub fn parse(bytes: Vec<u8>) -> Result<SafeTensors> {
        let len_bytes: [u8; 8] = bytes
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| bad(format!("file of {} bytes is too short for the 8-byte header length", bytes.len())))?;
        let header_len = u64::from_le_bytes(len_bytes);
        let data_start = 8u64.checked_add(header_len).filter(|&e| e <= bytes.len() as u64).ok_or_else(|| {
            bad(format!("header length {header_len} runs past the end of the file ({} bytes)", bytes.len()))
        })? as usize;
        let header: Value =
            serde_json::from_slice(&bytes[8..data_start]).map_err(|e| bad(format!("header is not valid JSON: {e}")))?;
        let obj = header.as_object().ok_or_else(|| bad("header is not a JSON object"))?;
        let data_len = bytes.len() - data_start;
        let mut tensors = BTreeMap::new();
        let mut metadata = BTreeMap::new();
        for (name, entry) in obj {
            if name == "__metadata__" {
                if let Some(m) = entry.as_object() {
                    for (k, v) in m {
                        metadata.insert(k.clone(), v.as_str().unwrap_or_default().to_string());
                    }
                }
                continue;
            }
            let field = |f: &str| entry.get(f).ok_or_else(|| bad(format!("tensor '{name}' has no '{f}'")));
            let dtype_s =
                field("dtype")?.as_str().ok_or_else(|| bad(format!("tensor '{name}': dtype is not a string")))?;
            let dtype =
                dtype_from_name(dtype_s).ok_or_else(|| bad(format!("tensor '{name}': unsupported dtype {dtype_s}")))?;
            let shape: Vec<usize> = field("shape")?
                .as_array()
                .ok_or_else(|| bad(format!("tensor '{name}': shape is not an array")))?
                .iter()
                .map(|d| d.as_u64().map(|d| d as usize))
                .collect::<Option<_>>()
                .ok_or_else(|| bad(format!("tensor '{name}': shape has a non-integer dimension")))?;
            let offsets = field("data_offsets")?
                .as_array()
                .filter(|a| a.len() == 2)
                .and_then(|a| Some((a[0].as_u64()? as usize, a[1].as_u64()? as usize)))
                .ok_or_else(|| bad(format!("tensor '{name}': data_offsets is not [begin, end]")))?;
            let elems = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
            let need = elems.and_then(|n| n.checked_mul(dtype.block_bytes()));
            let (begin, end) = offsets;
            if begin > end || end > data_len {
                return Err(bad(format!(
                    "tensor '{name}': bytes {begin}..{end} lie outside the data section ({data_len} bytes)"
                )));
            }
            if need != Some(end - begin) {
                return Err(bad(format!(
                    "tensor '{name}': {dtype_s} {shape:?} needs {} bytes, the file gives {}",
                    need.map_or("too many".into(), |n| n.to_string()),
                    end - begin
                )));
            }
            tensors.insert(name.clone(), TensorInfo { dtype, shape, begin, end });
        }
        Ok(SafeTensors { bytes, data_start, tensors, metadata })
    }

    /// A tensor by name, copied into a host tensor.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let info = self.tensors.get(name).ok_or_else(|| bad(format!("no tensor named '{name}'")))?;
        let data = &self.bytes[self.data_start + info.begin..self.data_start + info.end];
        Tensor::from_bytes(data, info.shape.clone(), info.dtype)
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
}
