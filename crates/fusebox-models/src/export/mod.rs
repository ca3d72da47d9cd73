//! Export: an in-memory [`Transformer`] (loaded from a GGUF file or a Hugging Face
//! directory, or trained/fine-tuned here) written as a Hugging Face directory
//! ([`write_hf`]) or a GGUF file ([`write_gguf`]) that `transformers` and llama.cpp load.
//!
//! Both writers follow one plan: describe the model in the target's own terms
//! (`config.json`, or `{arch}.*` GGUF metadata), read that description back with the
//! loader's own parser ([`crate::arch::hf_plan`], [`crate::arch::gguf_plan`]) and refuse
//! to write unless the [`Arch`] read back is the model's; then write each file tensor
//! under the name and fix the same parser's [`Plan`] gives (the loader's mapping run
//! backwards): Conv1D weights transposed back, Gemma's `1 + w` norms stored as `w`,
//! q/k rows permuted between rope pair conventions, projections stacked or split as the
//! target stores them.
//!
//! Rope pairs: Hugging Face (and llama.cpp's NEOX architectures) rotate pairs `(i, i +
//! hd/2)` of a head; llama.cpp's converter stores Llama/Mistral q and k rows permuted so
//! that pairs are adjacent (`(2i, 2i + 1)`). Within each head, row `2i + j` of the
//! interleaved order is row `j·hd/2 + i` of the half-split order (`j ∈ {0, 1}`).
//!
//! Files are written atomically: a GGUF file to a temporary file beside it, renamed
//! once complete; a Hugging Face directory to a temporary directory beside it, renamed
//! once every file is in place.

pub mod gguf;
pub mod hf;
pub mod peft;
mod tokenizer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use fusebox::{ComputeBackend, DType, Error, Result, RopeStyle, Tensor};

use crate::arch::{Fix, Plan};
use crate::files;
use crate::gguf::{GgufFile, Metadata};
use crate::transformer::{layout, Arch, Positions, Rope, RopeScaling, Transformer};

pub use tokenizer::TokenizerInfo;

/// The float type of the tensors written unquantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatType {
    /// 32-bit floats (lossless for a model held in f32).
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
}

impl FloatType {
    /// The tensor dtype.
    pub fn dtype(self) -> DType {
        match self {
            FloatType::F32 => DType::F32,
            FloatType::F16 => DType::F16,
            FloatType::BF16 => DType::BF16,
        }
    }

    /// Parses `f32`, `f16` or `bf16`.
    pub fn parse(s: &str) -> Result<FloatType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(FloatType::F32),
            "f16" | "float16" => Ok(FloatType::F16),
            "bf16" | "bfloat16" => Ok(FloatType::BF16),
            other => Err(Error::value("export", "dtype", "f32, f16 or bf16", other)),
        }
    }
}

/// A file tensor: its name, its shape as stored, its f32 values.
pub(crate) type FileTensor = (String, Vec<usize>, Vec<f32>);

/// The model's parameters as f32 host values under fusebox's unstacked names
/// (`h.0.attn.q.weight`, never `attn.qkv`), with q/k rows in the rope pair order the
/// model computes with.
pub(crate) struct Weights {
    values: HashMap<String, (Vec<usize>, Vec<f32>)>,
}

impl Weights {
    /// Reads every parameter of `model` to the host as f32: block formats and FP8
    /// dequantized, f16/bf16 widened, stacked projections split into their parts.
    /// The parameters must be in the plain `[out, in]` layout: a model trained here, or
    /// one loaded through the CPU backend (whose `preprocess_linear_weight` keeps it).
    pub(crate) fn read(b: &dyn ComputeBackend, model: &Transformer) -> Result<Weights> {
        let arch = &model.arch;
        let mut values = HashMap::new();
        for (spec, t) in model.specs.iter().zip(&model.params.tensors) {
            let host = b.to_host(t)?;
            let dtype = host.dtype();
            let v = if dtype.is_quantized() || dtype == DType::F8E4M3 {
                b.dequantize(&host)?.to_vec_f32()?
            } else {
                host.to_vec_f32()?
            };
            let dims = spec.shape.dims().to_vec();
            if v.len() != dims.iter().product::<usize>() {
                return Err(Error::shape("export", format!("parameter '{}'", spec.name), format!("{dims:?}"), v.len()));
            }
            let split = |stem: &str, parts: &[(&str, usize)]| -> Option<Vec<FileTensor>> {
                let (head, tail) = spec.name.split_once(stem)?;
                let cols: usize = dims[1..].iter().product();
                let mut start = 0;
                Some(
                    parts
                        .iter()
                        .map(|(p, rows)| {
                            let mut shape = dims.clone();
                            shape[0] = *rows;
                            let chunk = v[start * cols..(start + rows) * cols].to_vec();
                            start += rows;
                            (format!("{head}{p}{tail}"), shape, chunk)
                        })
                        .collect(),
                )
            };
            let pieces = if spec.name.contains(".attn.qkv.") {
                split(
                    "attn.qkv",
                    &[("attn.q", arch.q_proj_width()), ("attn.k", arch.kv_dim()), ("attn.v", arch.kv_dim())],
                )
            } else if spec.name.contains(".mlp.gate_up.") {
                split("mlp.gate_up", &[("mlp.gate", arch.d_ff), ("mlp.up", arch.d_ff)])
            } else {
                None
            };
            match pieces {
                Some(pieces) => {
                    for (name, shape, data) in pieces {
                        values.insert(name, (shape, data));
                    }
                }
                None => {
                    values.insert(spec.name.clone(), (dims, v));
                }
            }
        }
        Ok(Weights { values })
    }

    /// Converts q and k rows (weights, biases and QK-norm weights) from the rope pair
    /// order `from` to `to` (see the module docs).
    pub(crate) fn set_rope_style(&mut self, arch: &Arch, from: RopeStyle, to: RopeStyle) {
        if from == to || arch.positions != Positions::Rope {
            return;
        }
        let hd = arch.head_dim;
        let half = hd / 2;
        // new[dst(r)] = old[r] for each row r of a head, per the pair conventions.
        let dst = |r: usize| -> usize {
            match to {
                // interleaved 2i + j ← half-split j·half + i
                RopeStyle::Interleaved => {
                    let (j, i) = (r / half, r % half);
                    2 * i + j
                }
                // half-split j·half + i ← interleaved 2i + j
                RopeStyle::HalfSplit => {
                    let (i, j) = (r / 2, r % 2);
                    j * half + i
                }
            }
        };
        for (name, entry) in self.values.iter_mut() {
            let heads = if name.ends_with("attn.q.weight") || name.ends_with("attn.q.bias") {
                arch.n_heads
            } else if name.ends_with("attn.k.weight") || name.ends_with("attn.k.bias") {
                arch.n_kv_heads
            } else if name.ends_with("attn.q_norm.weight") || name.ends_with("attn.k_norm.weight") {
                1
            } else {
                continue;
            };
            let (shape, data) = entry;
            let cols: usize = shape[1..].iter().product();
            let old = data.clone();
            for h in 0..heads {
                for r in 0..hd {
                    let (src, to_row) = ((h * hd + r) * cols, (h * hd + dst(r)) * cols);
                    data[to_row..to_row + cols].copy_from_slice(&old[src..src + cols]);
                }
            }
        }
    }

    /// The tensors of a file as `plan` names and stores them, in the order of the
    /// parameter layout: `(file name, shape as stored, f32 values)`; `prefix` goes
    /// before every name. A tied head is not written.
    pub(crate) fn file_tensors(&self, plan: &Plan, prefix: &str) -> Result<Vec<FileTensor>> {
        let stacking = plan.file_stacking;
        let arch = &plan.arch;
        let (specs, _) = layout(arch, |_| stacking);
        let get = |name: &str| -> Result<&(Vec<usize>, Vec<f32>)> {
            self.values.get(name).ok_or_else(|| {
                Error::Io(format!("export: the model has no parameter '{name}' (a {} model)", arch.name))
            })
        };
        let mut out = Vec::with_capacity(specs.len());
        for spec in &specs {
            let parts: Vec<String> = if let Some((head, tail)) = spec.name.split_once("attn.qkv") {
                ["attn.q", "attn.k", "attn.v"].iter().map(|p| format!("{head}{p}{tail}")).collect()
            } else if let Some((head, tail)) = spec.name.split_once("mlp.gate_up") {
                ["mlp.gate", "mlp.up"].iter().map(|p| format!("{head}{p}{tail}")).collect()
            } else {
                vec![spec.name.clone()]
            };
            let mut data = Vec::new();
            for p in &parts {
                data.extend_from_slice(&get(p)?.1);
            }
            let shape = spec.shape.dims().to_vec();
            if data.len() != shape.iter().product::<usize>() {
                return Err(Error::shape(
                    "export",
                    format!("parameter '{}'", spec.name),
                    format!("{shape:?}"),
                    data.len(),
                ));
            }
            let (file, fix) = plan.names.file_name(&spec.name).ok_or_else(|| {
                Error::unsupported("export", format!("the {} layout has no file name for '{}'", arch.name, spec.name))
            })?;
            let stored_shape = fix.stored_shape(&shape);
            let name = format!("{prefix}{file}");
            if let Fix::Interleaved(_) | Fix::InterleavedTransposed(_) | Fix::Half(_) = fix {
                // Two parameters share the stored tensor: the first creates it, each fills its part.
                let at = match out.iter().position(|(n, _, _)| *n == name) {
                    Some(at) => at,
                    None => {
                        out.push((name, stored_shape.clone(), vec![0.0; data.len() * 2]));
                        out.len() - 1
                    }
                };
                fix.to_stored(&shape, &data, &mut out[at].2);
                continue;
            }
            let mut stored = vec![0.0f32; data.len()];
            fix.to_stored(&shape, &data, &mut stored);
            let (data, shape) = (stored, stored_shape);
            if file.contains("{e}") {
                // One file tensor per expert (HF): the parameter's first axis split.
                let per: usize = shape[1..].iter().product();
                for (e, chunk) in data.chunks_exact(per.max(1)).enumerate() {
                    out.push((
                        format!("{prefix}{}", file.replace("{e}", &e.to_string())),
                        shape[1..].to_vec(),
                        chunk.to_vec(),
                    ));
                }
                continue;
            }
            out.push((name, shape, data));
        }
        Ok(out)
    }
}

/// `arch` with what a file format leaves to convention set aside (the rope pair order,
/// which the weights' rows carry, and the name under which the family is filed), for
/// comparing a model with the description its export reads back as.
fn comparable(arch: &Arch, name: &str) -> Arch {
    let mut a = arch.clone();
    a.name = name.to_string();
    let head_dim = a.head_dim;
    let norm = |r: &mut Rope| {
        r.style = RopeStyle::HalfSplit;
        // Llama 3 scaling as the frequency factors GGUF stores it as.
        if let RopeScaling::Llama3 { .. } = r.scaling {
            let plain = Rope::plain(r.theta, RopeStyle::HalfSplit).frequencies(head_dim);
            let scaled = r.frequencies(head_dim);
            r.scaling = RopeScaling::FreqFactors(plain.iter().zip(&scaled).map(|(p, s)| (p / s) as f32).collect());
        }
    };
    norm(&mut a.rope);
    // The experts' load-balancing loss is a training setting GGUF has no key for.
    if let Some(m) = a.moe.as_mut() {
        m.aux_loss_coef = 0.0;
    }
    if let Some(r) = a.rope_local.as_mut() {
        norm(r);
    }
    a
}

/// Refuses an export whose description reads back as another model than `model`.
fn check_reads_back(model: &Arch, read_back: &Arch, what: &str) -> Result<()> {
    let want = comparable(model, &read_back.name);
    let got = comparable(read_back, &read_back.name);
    if want == got {
        return Ok(());
    }
    Err(Error::unsupported(
        "export",
        format!(
            "this {} model cannot be described as {what} that reads back as the same model:\n  model:     {want:?}\n  \
             read back: {got:?}",
            model.name
        ),
    ))
}

/// A temporary path beside `out` for an atomic write.
fn temp_beside(out: &Path) -> Result<PathBuf> {
    let name = out
        .file_name()
        .ok_or_else(|| Error::Io(format!("{}: not a file or directory name", out.display())))?
        .to_string_lossy()
        .into_owned();
    Ok(out.with_file_name(format!(".{name}.tmp-{}", std::process::id())))
}

fn io_at(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Io(format!("{}: {e}", path.display()))
}

/// A model's tokenizer and chat template as stored in a file fusebox loads: a GGUF
/// file's `tokenizer.*` metadata, or a Hugging Face directory's tokenizer files.
pub fn read_tokenizer_source(path: &Path) -> Result<(TokenizerInfo, Option<String>)> {
    let meta = std::fs::metadata(path).map_err(io_at(path))?;
    if meta.is_dir() {
        TokenizerInfo::from_hf_dir(path)
    } else {
        let file = GgufFile::open(path)?;
        Ok(TokenizerInfo::from_gguf(file.metadata()))
    }
}

/// The `tokenizer.*` entries of GGUF metadata, without the chat template.
pub(crate) fn tokenizer_entries(meta: &Metadata) -> Metadata {
    let mut out = Metadata::default();
    for (k, v) in meta.iter() {
        if k.starts_with("tokenizer.ggml.") {
            out.insert(k.to_string(), v.clone());
        }
    }
    out
}

/// Writes `bytes` to `path` atomically (temp file beside it, synced, renamed).
pub(crate) fn write_file_atomic(path: &Path, write: impl FnOnce(&mut dyn std::io::Write) -> Result<()>) -> Result<()> {
    use std::io::Write;
    let tmp = temp_beside(path)?;
    let result = (|| {
        let f = std::fs::File::create(&tmp).map_err(io_at(&tmp))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        write(&mut w)?;
        w.flush().map_err(io_at(&tmp))?;
        let f = w.into_inner().map_err(|e| Error::Io(format!("{}: {e}", tmp.display())))?;
        f.sync_all().map_err(io_at(&tmp))?;
        std::fs::rename(&tmp, path)
            .map_err(|e| Error::Io(format!("rename {} → {}: {e}", tmp.display(), path.display())))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Refuses to export over something that is not a previous export of `kind`.
fn check_out(out: &Path, dir: bool) -> Result<()> {
    match std::fs::symlink_metadata(out) {
        Err(_) => Ok(()),
        Ok(m) if dir && m.is_dir() => {
            let empty = std::fs::read_dir(out).map_err(io_at(out))?.next().is_none();
            let has = |name: &str| files::is_regular(&out.join(name));
            if empty || has("config.json") || has("adapter_config.json") {
                Ok(())
            } else {
                Err(Error::Io(format!(
                    "{}: exists and is neither empty nor a Hugging Face or PEFT directory (no config.json or \
                     adapter_config.json); refusing to replace it",
                    out.display()
                )))
            }
        }
        Ok(m) if !dir && m.is_file() => Ok(()),
        Ok(_) => Err(Error::Io(format!(
            "{}: exists and is not a {}; refusing to replace it",
            out.display(),
            if dir { "directory" } else { "regular file" }
        ))),
    }
}

/// The quantized or float type of a tensor written with [`write_gguf`].
pub type GgufOptions = gguf::Options;

/// Writes `model` as a Hugging Face directory; see [`hf::write`].
pub fn write_hf(
    b: &dyn ComputeBackend,
    model: &Transformer,
    tokenizer: &TokenizerInfo,
    chat_template: Option<&str>,
    out: &Path,
    dtype: FloatType,
) -> Result<()> {
    hf::write(b, model, tokenizer, chat_template, out, dtype)
}

/// Writes `model` as a GGUF file; see [`gguf::write`].
pub fn write_gguf(
    b: &dyn ComputeBackend,
    model: &Transformer,
    tokenizer: &TokenizerInfo,
    chat_template: Option<&str>,
    out: &Path,
    options: &GgufOptions,
) -> Result<()> {
    gguf::write(b, model, tokenizer, chat_template, out, options)
}

/// A tensor of `dtype` (f32, f16 or bf16) from f32 values.
fn float_tensor(values: &[f32], shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::from_f32_as(values, shape.to_vec(), dtype)
}
