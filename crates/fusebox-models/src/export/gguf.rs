//! The GGUF writer (format version 3, the layout [`crate::gguf::GgufFile`] reads):
//! `general.*`, the `{arch}.*` hyperparameters under llama.cpp's key names, the
//! `tokenizer.ggml.*` vocabulary and `tokenizer.chat_template`, then the tensors under
//! llama.cpp's names (`blk.N.attn_q.weight`, …), each aligned to 32 bytes.
//!
//! Llama and Mistral q/k rows are stored permuted to adjacent rope pairs, as
//! llama.cpp's converter stores them; Llama 3 rope scaling becomes `rope_freqs.weight`.
//!
//! Tensor types: norms and biases (1-d) stay f32; with a quantized type every matrix is
//! quantized to it, except the output head (the token embedding when tied), which gets
//! Q6_K (Q8_0 when its rows are not whole 256-blocks) unless the type is Q8_0, as
//! llama.cpp's `llama-quantize` does; a matrix whose rows are not whole blocks of the
//! type falls back as llama.cpp's does (Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, Q2_K/
//! Q3_K/IQ4_XS → IQ4_NL, then f16 for rows not a multiple of 32).

use std::io::Write;
use std::path::Path;

use fusebox::{ComputeBackend, DType, Error, Result, Tensor};

use super::{check_out, check_reads_back, float_tensor, write_file_atomic, FloatType, TokenizerInfo, Weights};
use crate::arch::{gguf_plan, FileTensors, GgufMetaOut};
use crate::gguf::{Array, GgmlType, Metadata, Value, DEFAULT_ALIGNMENT};
use crate::transformer::{Arch, RopeScaling, Transformer};

/// How tensors are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// The float type of matrices that are not quantized (1-d tensors are always f32).
    pub float: FloatType,
    /// The block format of the matrices, if any.
    pub quant: Option<DType>,
}

/// The `--quant` names, in the order they are listed to users.
pub const QUANT_TYPES: &[&str] =
    &["q8_0", "q6_k", "q5_k", "q5_1", "q5_0", "q4_k", "q4_1", "q4_0", "q3_k", "q2_k", "iq4_nl", "iq4_xs"];

/// The block format of a `--quant` name (`q8_0`, `q4_k`, … as in [`QUANT_TYPES`];
/// `q4_k_m` and the like name their main type). MXFP4 is not one: llama.cpp writes it
/// only for expert tensors (`MXFP4_MOE`, the rest Q8_0), not for every matrix.
pub fn parse_quant(s: &str) -> Result<DType> {
    let lower = s.to_ascii_lowercase();
    let base = lower.strip_suffix("_m").or_else(|| lower.strip_suffix("_s")).unwrap_or(&lower);
    DType::ALL
        .iter()
        .copied()
        .find(|d| d.is_quantized() && d.name() == base && QUANT_TYPES.contains(&base))
        .ok_or_else(|| Error::value("export", "quant", format!("one of {}", QUANT_TYPES.join(", ")), s))
}

/// llama.cpp's `general.file_type` for the main type.
fn file_type(o: &Options) -> u32 {
    match o.quant {
        None => match o.float {
            FloatType::F32 => 0,
            FloatType::F16 => 1,
            FloatType::BF16 => 32,
        },
        Some(DType::Q4_0) => 2,
        Some(DType::Q4_1) => 3,
        Some(DType::Q8_0) => 7,
        Some(DType::Q5_0) => 8,
        Some(DType::Q5_1) => 9,
        Some(DType::Q2K) => 10,
        Some(DType::Q3K) => 12,
        Some(DType::Q4K) => 15,
        Some(DType::Q5K) => 17,
        Some(DType::Q6K) => 18,
        Some(DType::IQ4NL) => 25,
        Some(DType::IQ4XS) => 30,
        Some(_) => 0,
    }
}

/// The type a matrix with rows of `cols` elements is stored in: `want`, or llama.cpp's
/// fallback when rows are not whole blocks.
fn fit(want: DType, cols: usize, float: FloatType) -> DType {
    let mut t = want;
    for _ in 0..3 {
        if cols.is_multiple_of(t.block_elems()) {
            return t;
        }
        t = match t {
            DType::Q4K => DType::Q5_0,
            DType::Q5K => DType::Q5_1,
            DType::Q6K => DType::Q8_0,
            DType::Q2K | DType::Q3K | DType::IQ4XS => DType::IQ4NL,
            _ => float.dtype(),
        };
    }
    float.dtype()
}

/// The rope frequency factors a Llama 3 scaling amounts to (`rope_freqs.weight`).
fn freq_factors(arch: &Arch) -> Option<Vec<f32>> {
    match &arch.rope.scaling {
        RopeScaling::FreqFactors(f) => Some(f.clone()),
        RopeScaling::Llama3 { .. } => {
            let plain = crate::transformer::Rope::plain(arch.rope.theta, arch.rope.style).frequencies(arch.head_dim);
            let scaled = arch.rope.frequencies(arch.head_dim);
            Some(plain.iter().zip(&scaled).map(|(p, s)| (p / s) as f32).collect())
        }
        _ => None,
    }
}

/// The general and `{arch}.*` metadata of `arch`: what every architecture writes
/// ([`crate::arch::gguf::write_common`]), then its own ([`crate::arch::Architecture::write_gguf`]).
fn model_metadata(arch: &Arch, o: &Options) -> Result<Vec<(String, Value)>> {
    let unit = crate::arch::by_name(&arch.name)?;
    let mut m = GgufMetaOut::new(unit.gguf().export_as);
    m.put("general.type", Value::String("model".into()));
    m.put("general.file_type", Value::U32(file_type(o)));
    if o.quant.is_some() {
        m.put("general.quantization_version", Value::U32(2));
    }
    crate::arch::gguf::write_common(arch, &mut m)?;
    unit.write_gguf(arch, &mut m)?;
    Ok(m.into_entries())
}

/// Writes `model` as a GGUF file at `out` (see the module docs), atomically: the file
/// is written beside `out` and renamed once complete.
pub fn write(
    b: &dyn ComputeBackend,
    model: &Transformer,
    tokenizer: &TokenizerInfo,
    chat_template: Option<&str>,
    out: &Path,
    options: &Options,
) -> Result<()> {
    let arch = &model.arch;
    check_out(out, false)?;
    let mut kvs = model_metadata(arch, options)?;
    kvs.extend(tokenizer.gguf_entries(arch.vocab_size)?);
    if let Some(t) = chat_template {
        kvs.push(("tokenizer.chat_template".into(), Value::String(t.to_string())));
    }
    let mut meta = Metadata::default();
    for (k, v) in &kvs {
        if !meta.insert(k.clone(), v.clone()) {
            return Err(Error::Io(format!("export: metadata key '{k}' written twice")));
        }
    }
    let factors = freq_factors(arch);
    let n_tokens = meta.get_strings("tokenizer.ggml.tokens")?.map(<[String]>::len);
    let has = |name: &str| match name {
        "output.weight" => !arch.tied_embeddings,
        "rope_freqs.weight" => factors.is_some(),
        _ => false,
    };
    // The counts read back are the model's own, bounded by the tensors it holds.
    let file = FileTensors { count: model.specs.len(), has: &has };
    let plan = gguf_plan(&meta, n_tokens, &file, &|| Ok(factors.clone().unwrap_or_default()))?;
    check_reads_back(arch, &plan.arch, "GGUF metadata")?;

    let mut weights = Weights::read(b, model)?;
    weights.set_rope_style(arch, arch.rope.style, plan.arch.rope.style);
    let mut tensors = Vec::new();
    let head = if arch.tied_embeddings { "token_embd.weight" } else { "output.weight" };
    let unit = crate::arch::by_name(&arch.name)?;
    for (name, shape, values) in unit.fuse_for_export(arch, true, weights.file_tensors(&plan, "")?)? {
        let values = unit.gguf_store(arch, &name, &shape, values)?;
        let dtype = match (shape.len(), options.quant) {
            (1, _) => DType::F32,
            // llama.cpp keeps a Gated DeltaNet's convolution in f32 (converter and quantizer).
            _ if name.ends_with(".ssm_conv1d.weight") => DType::F32,
            _ if name == "position_embd.weight" => options.float.dtype(),
            (_, None) => options.float.dtype(),
            (_, Some(q)) => {
                let cols = shape[shape.len() - 1];
                let q = if name == head && q != DType::Q8_0 { DType::Q6K } else { q };
                fit(q, cols, options.float)
            }
        };
        let t = if dtype.is_quantized() {
            b.to_host(&b.quantize(&b.upload(&Tensor::from_vec(values, shape.clone())?)?, dtype)?)?
        } else {
            float_tensor(&values, &shape, dtype)?
        };
        tensors.push((name, t));
    }
    drop(weights);
    if let Some(f) = &factors {
        tensors.push(("rope_freqs.weight".into(), Tensor::from_vec(f.clone(), [f.len()])?));
    }
    write_file_atomic(out, |w| write_gguf(w, &kvs, &tensors))
}

fn io(e: std::io::Error) -> Error {
    Error::Io(format!("export: gguf: {e}"))
}

fn put_str(w: &mut dyn Write, s: &str) -> Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes()).map_err(io)?;
    w.write_all(s.as_bytes()).map_err(io)
}

/// The GGUF type tag of a value.
fn tag(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn array_tag(a: &Array) -> u32 {
    match a {
        Array::U8(_) => 0,
        Array::I8(_) => 1,
        Array::U16(_) => 2,
        Array::I16(_) => 3,
        Array::U32(_) => 4,
        Array::I32(_) => 5,
        Array::F32(_) => 6,
        Array::Bool(_) => 7,
        Array::String(_) => 8,
        Array::Array(_) => 9,
        Array::U64(_) => 10,
        Array::I64(_) => 11,
        Array::F64(_) => 12,
    }
}

fn put_value(w: &mut dyn Write, v: &Value) -> Result<()> {
    let bytes: Vec<u8> = match v {
        Value::U8(x) => vec![*x],
        Value::I8(x) => x.to_le_bytes().to_vec(),
        Value::U16(x) => x.to_le_bytes().to_vec(),
        Value::I16(x) => x.to_le_bytes().to_vec(),
        Value::U32(x) => x.to_le_bytes().to_vec(),
        Value::I32(x) => x.to_le_bytes().to_vec(),
        Value::F32(x) => x.to_le_bytes().to_vec(),
        Value::Bool(x) => vec![u8::from(*x)],
        Value::String(s) => return put_str(w, s),
        Value::Array(a) => return put_array(w, a),
        Value::U64(x) => x.to_le_bytes().to_vec(),
        Value::I64(x) => x.to_le_bytes().to_vec(),
        Value::F64(x) => x.to_le_bytes().to_vec(),
    };
    w.write_all(&bytes).map_err(io)
}

fn put_array(w: &mut dyn Write, a: &Array) -> Result<()> {
    w.write_all(&array_tag(a).to_le_bytes()).map_err(io)?;
    w.write_all(&(a.len() as u64).to_le_bytes()).map_err(io)?;
    let mut buf = Vec::new();
    macro_rules! each {
        ($v:expr) => {{
            for x in $v {
                buf.extend_from_slice(&x.to_le_bytes());
            }
            w.write_all(&buf).map_err(io)
        }};
    }
    match a {
        Array::U8(v) => w.write_all(v).map_err(io),
        Array::I8(v) => each!(v),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::Bool(v) => w.write_all(&v.iter().map(|&x| u8::from(x)).collect::<Vec<_>>()).map_err(io),
        Array::String(v) => v.iter().try_for_each(|s| put_str(w, s)),
        Array::Array(v) => v.iter().try_for_each(|x| put_array(w, x)),
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F64(v) => each!(v),
    }
}

fn pad_to(n: u64, align: u64) -> u64 {
    n.div_ceil(align) * align
}

/// The file: header, metadata, tensor infos, padding, aligned tensor data.
fn write_gguf(w: &mut dyn Write, kvs: &[(String, Value)], tensors: &[(String, Tensor)]) -> Result<()> {
    let align = DEFAULT_ALIGNMENT;
    let mut head: Vec<u8> = Vec::new();
    head.extend_from_slice(&crate::gguf::MAGIC);
    head.extend_from_slice(&3u32.to_le_bytes());
    head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    head.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        put_str(&mut head, k)?;
        head.extend_from_slice(&tag(v).to_le_bytes());
        put_value(&mut head, v)?;
    }
    let mut offset = 0u64;
    for (name, t) in tensors {
        let ty = GgmlType::from_dtype(t.dtype())
            .ok_or_else(|| Error::dtype("export", format!("tensor '{name}'"), "a GGUF type", t.dtype()))?;
        put_str(&mut head, name)?;
        head.extend_from_slice(&(t.dims().len() as u32).to_le_bytes());
        // ggml lists dimensions fastest first.
        for &d in t.dims().iter().rev() {
            head.extend_from_slice(&(d as u64).to_le_bytes());
        }
        head.extend_from_slice(&ty.0.to_le_bytes());
        head.extend_from_slice(&offset.to_le_bytes());
        offset = pad_to(offset + t.byte_len() as u64, align);
    }
    let data_start = pad_to(head.len() as u64, align);
    head.resize(data_start as usize, 0);
    w.write_all(&head).map_err(io)?;
    let mut written = 0u64;
    for (_, t) in tensors {
        let bytes = t.host_bytes()?;
        w.write_all(bytes).map_err(io)?;
        written += bytes.len() as u64;
        let padded = pad_to(written, align);
        w.write_all(&vec![0u8; (padded - written) as usize]).map_err(io)?;
        written = padded;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quant_names_are_the_listed_block_formats_only() {
        for name in QUANT_TYPES {
            assert_eq!(parse_quant(name).map(DType::name).ok(), Some(*name));
        }
        for refused in ["mxfp4", "mxfp4_moe", "f8e4m3", "f32"] {
            let err = parse_quant(refused).unwrap_err().to_string();
            assert!(err.contains("iq4_xs"), "{refused}: {err}");
        }
    }
}
