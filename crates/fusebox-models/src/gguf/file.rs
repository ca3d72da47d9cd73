//! Opening a GGUF file: the header, metadata, tensor infos and data section.

use std::collections::HashMap;
use std::path::Path;

use fusebox::{DType, Error, Result, Tensor};
use std::sync::Arc;

use memmap2::Mmap;

use crate::files::{open_regular, Bytes};

use super::cursor::{Context, Cursor, PResult, ParseError};
use super::ggml_type::GgmlType;
use super::metadata::Metadata;
use super::value::{read_value, skip_value, Value};

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of every tensor's offset when
/// `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a ggml tensor has (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// Smallest tensor info in the file: name length (8) + n_dims (4) + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: usize = 24;
/// Smallest metadata entry: key length (8) + value type (4) + a 1-byte value.
const MIN_KV_BYTES: usize = 13;

/// One tensor's entry in the file: name, dimensions, type and where its data is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    offset: u64,
    byte_len: Option<u64>,
}

impl TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The dimensions as stored: fastest-varying first (`[ne0, ne1, ...]`).
    pub fn ggml_dims(&self) -> &[u64] {
        &self.dims
    }

    /// The row-major shape: the stored dimensions reversed, so a weight stored
    /// as `[ne0 = in, ne1 = out]` has shape `[out, in]`.
    pub fn shape(&self) -> Result<Vec<usize>> {
        self.dims
            .iter()
            .rev()
            .map(|&d| {
                usize::try_from(d).map_err(|_| {
                    Error::Io(format!("gguf: tensor '{}': dimension {d} does not fit this platform", self.name))
                })
            })
            .collect()
    }

    /// Number of elements (the product of the dimensions; 1 for a scalar).
    pub fn elem_count(&self) -> u64 {
        // Checked when the file was opened.
        self.dims.iter().product()
    }

    /// The ggml type tag.
    pub fn ggml_type(&self) -> GgmlType {
        self.ggml_type
    }

    /// Offset of the data from the start of the data section.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Size of the data in bytes, when the type's layout is known.
    pub fn byte_len(&self) -> Option<u64> {
        self.byte_len
    }

    /// The fusebox dtype of the data, or an error naming the type when fusebox has none.
    pub fn dtype(&self) -> Result<DType> {
        self.ggml_type.dtype().ok_or_else(|| {
            Error::Io(format!(
                "gguf: tensor '{}' has {}, which fusebox has no dtype for \
                 (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, \
                 Q4_K, Q5_K, Q6_K, IQ4_XS)",
                self.name,
                describe_type(self.ggml_type)
            ))
        })
    }
}

fn describe_type(t: GgmlType) -> String {
    match t.name() {
        Some(name) => format!("ggml type {name} ({})", t.0),
        None => format!("unknown ggml type {}", t.0),
    }
}

/// A parsed GGUF file (versions 2 and 3, little-endian).
///
/// Layout, all integers little-endian:
///
/// ```text
/// magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
/// kv_count ×     { string key | u32 value type | value }
/// tensor_count × { string name | u32 n_dims | n_dims × u64 dim (fastest first)
///                  | u32 ggml type | u64 offset into the data section }
/// padding to `general.alignment` (default 32)
/// data section: each tensor at its offset, offsets multiples of the alignment
/// ```
///
/// A string is a u64 byte length followed by UTF-8 bytes without terminator.
/// Version 1 used u32 counts and lengths and is not read.
///
/// Opening checks every count, offset and size against the file, so later
/// accessors never read out of bounds. Tensors of an unknown ggml type are kept;
/// asking for their data is what fails.
pub struct GgufFile {
    bytes: Arc<Bytes>,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
    vocabulary_len: Option<usize>,
}

/// The tokenizer's per-token arrays, which a process that never tokenizes need not keep
/// ([`GgufFile::open_without_vocabulary`]): for a 262,144-token vocabulary, tens of MiB.
const VOCABULARY_KEYS: [&str; 4] =
    ["tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"];

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    ///
    /// The file must not be modified while the `GgufFile` is alive (the map would
    /// change under it); model files are only ever read.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        Self::open_keeping(path.as_ref(), false)
    }

    /// As [`open`](Self::open), but the tokenizer's vocabulary arrays
    /// (`tokenizer.ggml.tokens`, `.scores`, `.token_type`, `.merges`) are checked and
    /// skipped, not kept: for a process that never tokenizes (a pipeline rank other than
    /// 0). [`vocabulary_len`](Self::vocabulary_len) still counts the tokens.
    pub fn open_without_vocabulary(path: impl AsRef<Path>) -> Result<GgufFile> {
        Self::open_keeping(path.as_ref(), true)
    }

    fn open_keeping(path: &Path, skip_vocabulary: bool) -> Result<GgufFile> {
        let (file, _) =
            open_regular(path, "the GGUF file").map_err(|e| Error::Io(format!("gguf: {}", error_text(e))))?;
        // SAFETY: the map is read-only; the documented contract is that model files
        // are not modified while open. Every access is bounds-checked against its length.
        let map = unsafe { Mmap::map(&file) }
            .map_err(|e| Error::Io(format!("gguf: cannot memory-map '{}': {e}", path.display())))?;
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::HugePage);
        Self::parse(Bytes::Mapped(map), skip_vocabulary)
            .map_err(|e| Error::Io(format!("{} (in '{}')", error_text(e), path.display())))
    }

    /// Parses a GGUF file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::parse(Bytes::Owned(bytes), false)
    }

    fn parse(bytes: Bytes, skip_vocabulary: bool) -> Result<GgufFile> {
        let header = parse_header(&bytes, skip_vocabulary)?;
        Ok(GgufFile {
            bytes: Arc::new(bytes),
            version: header.version,
            metadata: header.metadata,
            tensor_index: header.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect(),
            tensors: header.tensors,
            alignment: header.alignment,
            data_offset: header.data_offset,
            vocabulary_len: header.vocabulary_len,
        })
    }

    /// The number of tokens in `tokenizer.ggml.tokens`, kept or skipped; `None` without it.
    pub fn vocabulary_len(&self) -> Option<usize> {
        self.vocabulary_len
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The alignment of the data section and tensor offsets.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Where the data section starts, from the start of the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The file size in bytes.
    pub fn file_len(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// The tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The info of tensor `name`, if the file has it.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    fn require_info(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor_info(name).ok_or_else(|| Error::Io(format!("gguf: no tensor named '{name}'")))
    }

    /// The raw bytes of tensor `name`, borrowed from the file.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        let info = self.require_info(name)?;
        let Some(len) = info.byte_len else {
            return Err(Error::Io(format!(
                "gguf: tensor '{name}' has {}, whose size is not known here",
                describe_type(info.ggml_type)
            )));
        };
        // Checked at open; checked again so this accessor stands on its own.
        let range = data_range(self.data_offset, info, len, self.bytes.len())?;
        Ok(&self.bytes[range])
    }

    /// Tensor `name` as [`tensor`](Self::tensor) gives it, copied a few MiB at a time and
    /// giving back this process's mapped pages of each piece once copied: for a loader,
    /// which will not read them again (see `Bytes::copy_releasing`).
    pub fn take_tensor(&self, name: &str) -> Result<Tensor> {
        let info = self.require_info(name)?;
        let bytes = self.tensor_bytes(name)?;
        self.take_bytes(name, bytes, info.shape()?, info.dtype()?, 0..bytes.len())
    }

    /// Rows `rows` (first axis of the row-major shape) of tensor `name`, read as
    /// [`take_tensor`](Self::take_tensor) reads: only their bytes are copied (a pipeline
    /// stage's share of a split head).
    pub fn take_tensor_rows(&self, name: &str, rows: std::ops::Range<usize>) -> Result<Tensor> {
        let info = self.require_info(name)?;
        let (dtype, shape) = (info.dtype()?, info.shape()?);
        let within = crate::weights::row_bytes(name, &shape, dtype, &rows)?;
        let dims: Vec<usize> = std::iter::once(rows.len()).chain(shape.iter().skip(1).copied()).collect();
        self.take_bytes(name, self.tensor_bytes(name)?, dims, dtype, within)
    }

    /// A host tensor of `dims` and `dtype` holding bytes `within` of tensor `name`'s data
    /// `bytes` (a slice of the map), copied with its pages given back (see
    /// [`take_tensor`](Self::take_tensor)).
    fn take_bytes(
        &self,
        name: &str,
        bytes: &[u8],
        dims: Vec<usize>,
        dtype: DType,
        within: std::ops::Range<usize>,
    ) -> Result<Tensor> {
        if within.end > bytes.len() {
            return Err(Error::Io(format!(
                "gguf: tensor '{name}': {} bytes in the file, bytes {}..{} asked for",
                bytes.len(),
                within.start,
                within.end
            )));
        }
        let start = bytes.as_ptr() as usize - self.bytes.as_ptr() as usize;
        let mut t = Tensor::zeros(dims, dtype)
            .map_err(|e| Error::Io(format!("gguf: tensor '{name}': cannot build the tensor: {e}")))?;
        let dst = t.host_bytes_mut()?;
        if dst.len() != within.len() {
            return Err(Error::Io(format!(
                "gguf: tensor '{name}': {} bytes in the file, its shape and type take {}",
                within.len(),
                dst.len()
            )));
        }
        self.bytes.copy_releasing(start + within.start..start + within.end, dst);
        Ok(t)
    }

    /// Tensor `name` as [`tensor`](Self::tensor) gives it, over the file's own bytes (the
    /// memory map), not copied: read-only, and it keeps the map alive. What a model
    /// serves its experts from.
    pub fn tensor_mapped(&self, name: &str) -> Result<Tensor> {
        let info = self.require_info(name)?;
        let (dtype, shape) = (info.dtype()?, info.shape()?);
        let bytes = self.tensor_bytes(name)?;
        let start = bytes.as_ptr() as usize - self.bytes.as_ptr() as usize;
        Tensor::from_shared_bytes(Arc::clone(&self.bytes), start, shape, dtype)
            .map_err(|e| Error::Io(format!("gguf: tensor '{name}': cannot build the tensor: {e}")))
    }

    /// Tensor `name` as a host [`Tensor`] with its row-major shape (GGUF's
    /// `[ne0, ne1, ...]` reversed) and dtype; the bytes are copied.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let info = self.require_info(name)?;
        let dtype = info.dtype()?;
        let shape = info.shape()?;
        let bytes = self.tensor_bytes(name)?;
        Tensor::from_bytes(bytes, shape, dtype)
            .map_err(|e| Error::Io(format!("gguf: tensor '{name}': cannot build the tensor: {e}")))
    }
}

fn error_text(e: Error) -> String {
    match e {
        Error::Io(msg) => msg,
        other => other.to_string(),
    }
}

/// The byte range of a tensor's data in the file, or an error when it does not fit.
fn data_range(data_offset: u64, info: &TensorInfo, len: u64, file_len: usize) -> PResult<std::ops::Range<usize>> {
    let past_end = || {
        ParseError(format!(
            "tensor '{}' data [offset {}, {len} bytes] extends past end of file ({file_len} bytes)",
            info.name,
            data_offset.saturating_add(info.offset)
        ))
    };
    let start = data_offset.checked_add(info.offset).ok_or_else(past_end)?;
    let end = start.checked_add(len).ok_or_else(past_end)?;
    if end > file_len as u64 {
        return Err(past_end());
    }
    // Both fit in usize: they are at most `file_len`.
    Ok(start as usize..end as usize)
}

/// Everything before the data section.
struct Header {
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: u64,
    vocabulary_len: Option<usize>,
}

/// Parses everything before the data section; the tokenizer's vocabulary arrays are
/// walked over, not kept, when `skip_vocabulary`.
fn parse_header(bytes: &[u8], skip_vocabulary: bool) -> PResult<Header> {
    let mut c = Cursor::new(bytes);
    let magic = c.take(4, "magic").context_with(|| "not a GGUF file")?;
    if magic != MAGIC {
        return Err(ParseError(format!(
            "not a GGUF file: starts with {:?} ({magic:02x?}), expected \"GGUF\"",
            String::from_utf8_lossy(magic)
        )));
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => {}
        1 => return Err(ParseError("version 1 is not supported (only versions 2 and 3)".into())),
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(ParseError(format!(
                "version {v} reads as {} byte-swapped: a big-endian GGUF, which is not supported",
                v.swap_bytes()
            )))
        }
        v => return Err(ParseError(format!("version {v} is not supported (only versions 2 and 3)"))),
    }
    let tensor_count = c.count(MIN_TENSOR_INFO_BYTES, "tensor count")?;
    let kv_count = c.count(MIN_KV_BYTES, "metadata count")?;

    let mut metadata = Metadata::default();
    let mut skipped = std::collections::HashMap::new();
    for i in 0..kv_count {
        let key = c.string("metadata key").context_with(|| format!("metadata entry {i}"))?;
        if skip_vocabulary && VOCABULARY_KEYS.contains(&key.as_str()) {
            let n = skip_value(&mut c).context_with(|| format!("metadata '{key}'"))?;
            if skipped.insert(key.clone(), n).is_some() {
                return Err(ParseError(format!("metadata key '{key}' appears twice")));
            }
            continue;
        }
        let value = read_value(&mut c).context_with(|| format!("metadata '{key}'"))?;
        if !metadata.insert(key.clone(), value) {
            return Err(ParseError(format!("metadata key '{key}' appears twice")));
        }
    }
    let vocabulary_len = match skipped.get(VOCABULARY_KEYS[0]) {
        Some(&n) => Some(n),
        None => metadata.get_strings(VOCABULARY_KEYS[0]).ok().flatten().map(<[String]>::len),
    };
    let alignment = alignment_of(&metadata)?;

    let mut tensors = Vec::with_capacity(tensor_count);
    let mut seen = std::collections::HashSet::with_capacity(tensor_count);
    for i in 0..tensor_count {
        let info = read_tensor_info(&mut c, alignment).context_with(|| format!("tensor info {i}"))?;
        if !seen.insert(info.name.clone()) {
            return Err(ParseError(format!("tensor name '{}' appears twice", info.name)));
        }
        tensors.push(info);
    }

    let end_of_infos = c.pos() as u64;
    let data_offset = end_of_infos
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| ParseError(format!("data section offset overflows (alignment {alignment})")))?;
    for info in &tensors {
        if let Some(len) = info.byte_len {
            data_range(data_offset, info, len, bytes.len())?;
        }
    }
    check_padding(bytes, end_of_infos, data_offset, alignment)?;
    let data = bytes.get(data_offset as usize..).unwrap_or_default();
    check_layout(&tensors, alignment, data)?;
    Ok(Header { version, metadata, tensors, alignment, data_offset, vocabulary_len })
}

/// The bytes between the tensor infos and the data section are the padding writers
/// fill with zeros; anything else means `general.alignment` places the data section
/// elsewhere than the writer did.
fn check_padding(bytes: &[u8], end_of_infos: u64, data_offset: u64, alignment: u64) -> PResult<()> {
    let end = data_offset.min(bytes.len() as u64) as usize;
    let padding = &bytes[(end_of_infos as usize).min(end)..end];
    match padding.iter().position(|&b| b != 0) {
        None => Ok(()),
        Some(i) => Err(ParseError(format!(
            "byte {} of the padding before the data section (offsets {end_of_infos}..{data_offset}, \
             general.alignment {alignment}) is {:#04x}, expected 0: the alignment contradicts where the data starts",
            end_of_infos + i as u64,
            padding[i]
        ))),
    }
}

/// The tensors must tile the data section as llama.cpp's `gguf.cpp` requires: in
/// file order, each tensor's offset is the end of the one before padded to the
/// alignment (so no two overlap and no bytes are unexplained), and the data section
/// ends with the last tensor (plus at most its padding).
///
/// The padding after each tensor must be zeros, as writers leave it: bytes there are
/// what a tensor whose type was made smaller leaves behind.
///
/// A tensor of unknown type has no known size; when the file has one, only overlaps
/// between the tensors of known size are checked.
fn check_layout(tensors: &[TensorInfo], alignment: u64, data: &[u8]) -> PResult<()> {
    let data_len = data.len() as u64;
    if tensors.iter().any(|t| t.byte_len.is_none()) {
        let mut spans: Vec<(u64, u64, &str)> = tensors
            .iter()
            .filter_map(|t| t.byte_len.map(|len| (t.offset, t.offset.saturating_add(len), t.name.as_str())))
            .collect();
        spans.sort_unstable();
        for w in spans.windows(2) {
            let ((_, end_a, a), (start_b, end_b, b)) = (w[0], w[1]);
            if start_b < end_a && end_b > start_b {
                return Err(ParseError(format!(
                    "tensor '{b}' data [{start_b}, {end_b}) overlaps tensor '{a}' (which ends at {end_a})"
                )));
            }
        }
        return Ok(());
    }
    let mut expected = 0u64;
    let mut previous: Option<&str> = None;
    for t in tensors {
        let len = t.byte_len.unwrap_or(0);
        if t.offset != expected {
            let after = previous.map_or("the start of the data section".to_string(), |p| format!("tensor '{p}'"));
            let why = if t.offset < expected { "overlapping" } else { "leaving unexplained bytes after" };
            return Err(ParseError(format!(
                "tensor '{}' has data offset {}, expected {expected} (right after {after}, padded to the \
                 alignment {alignment}): its data would start {why} it",
                t.name, t.offset
            )));
        }
        let end =
            t.offset.checked_add(len).ok_or_else(|| ParseError(format!("tensor '{}': data end overflows", t.name)))?;
        expected = end
            .checked_next_multiple_of(alignment)
            .ok_or_else(|| ParseError(format!("tensor '{}': data end overflows", t.name)))?;
        // In range: `data_range` checked the tensor ends inside the file.
        let padding = data.get(end as usize..expected.min(data_len) as usize).unwrap_or_default();
        if let Some(i) = padding.iter().position(|&b| b != 0) {
            return Err(ParseError(format!(
                "the padding after tensor '{}' (data bytes {end}..{expected}) has {:#04x} at {}, expected zeros: \
                 the tensor's type or dimensions are smaller than the data written for it",
                t.name,
                padding[i],
                end + i as u64
            )));
        }
        previous = Some(&t.name);
    }
    if data_len > expected.max(alignment) {
        let last = previous.map_or("the tensor infos".to_string(), |p| format!("tensor '{p}'"));
        return Err(ParseError(format!(
            "the data section is {data_len} bytes but the tensors fill {expected}: {} bytes after {last} \
             belong to no tensor (does general.alignment match the file?)",
            data_len - expected
        )));
    }
    Ok(())
}

/// `general.alignment`: a u32 power of two, 32 when absent.
fn alignment_of(metadata: &Metadata) -> PResult<u64> {
    match metadata.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(Value::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some(Value::U32(a)) => Err(ParseError(format!("general.alignment is {a}, expected a power of two"))),
        Some(v) => Err(ParseError(format!("general.alignment: expected a u32, got {}", v.describe()))),
    }
}

fn read_tensor_info(c: &mut Cursor<'_>, alignment: u64) -> PResult<TensorInfo> {
    let name = c.string("tensor name")?;
    read_tensor_info_body(c, alignment, name.clone()).context_with(|| format!("tensor '{name}'"))
}

fn read_tensor_info_body(c: &mut Cursor<'_>, alignment: u64, name: String) -> PResult<TensorInfo> {
    let n_dims = c.u32("dimension count")?;
    if n_dims as usize > MAX_DIMS {
        return Err(ParseError(format!("has {n_dims} dimensions, at most {MAX_DIMS} are allowed")));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64("dimension")?);
    }
    // The product of the non-zero dimensions must fit an i64 (ggml's `int64_t ne`):
    // that bounds every partial product in any order, so a shape like [0, 2^40, 2^40]
    // (zero elements) cannot overflow when the dimensions are multiplied later.
    dims.iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d.max(1)))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| ParseError(format!("dimensions {dims:?} overflow the element count")))?;
    let elems: u64 = dims.iter().product();
    let ggml_type = GgmlType(c.u32("ggml type")?);
    let offset = c.u64("data offset")?;
    if offset % alignment != 0 {
        return Err(ParseError(format!("data offset {offset} is not a multiple of the alignment {alignment}")));
    }
    let byte_len = match ggml_type.block_layout() {
        None => None,
        Some((block_elems, block_bytes)) => {
            let ne0 = dims.first().copied().unwrap_or(1);
            if ne0 % block_elems != 0 {
                return Err(ParseError(format!(
                    "first dimension {ne0} is not a multiple of the {ggml_type} block size {block_elems}"
                )));
            }
            let len = (elems / block_elems)
                .checked_mul(block_bytes)
                .ok_or_else(|| ParseError(format!("size of {elems} {ggml_type} elements overflows")))?;
            Some(len)
        }
    };
    Ok(TensorInfo { name, dims, ggml_type, offset, byte_len })
}
