//! Weight loading: a [`TensorSource`] (a GGUF file, or the safetensors shards of a
//! Hugging Face directory) read into a [`Transformer`] as an [`crate::arch::Plan`] says —
//! each file tensor found by its name, checked against the shape its parameter needs,
//! fixed (transposed, `1 + w`), and kept in its stored format: block formats are
//! multiplied straight from their blocks, F16/BF16 widened to f32 once.
//!
//! Projections of one input (q, k, v; gate, up) whose matrices share a storage format
//! are stacked into one matrix (rows are independent, so stacking is concatenating
//! bytes): one matmul, one pass over the input, computes them all.

pub mod shards;
pub mod text_only;

use std::collections::BTreeSet;

use fusebox::{ComputeBackend, DType, Error, Result, Tensor};

pub use shards::{read_config, Shards};

use crate::arch::{FileTensors, Fix, Plan};
use crate::gguf::GgufFile;
use crate::params::ParamSet;
use crate::transformer::{layout, Stacking, Stage, Transformer};

/// Named tensors of a checkpoint.
pub trait TensorSource {
    /// Where they come from, for messages (`gguf`, a directory).
    fn origin(&self) -> String;
    /// Every tensor name.
    fn names(&self) -> Vec<String>;
    /// Whether tensor `name` exists.
    fn has(&self, name: &str) -> bool;
    /// The dtype of tensor `name`.
    fn dtype(&self, name: &str) -> Result<DType>;
    /// Tensor `name` on the host.
    fn get(&self, name: &str) -> Result<Tensor>;
    /// Tensor `name` on the host, sharing the file's memory map where the source has one
    /// (read-only; by default a copy, as [`get`](Self::get)).
    fn get_mapped(&self, name: &str) -> Result<Tensor> {
        self.get(name)
    }
    /// Tensor `name` on the host for a loader, which will not read it again: a
    /// memory-mapped source gives back its pages as it copies them, so that a loaded
    /// model's resident memory is its weights, not its weights and the file's pages
    /// besides. By default [`get`](Self::get).
    fn take(&self, name: &str) -> Result<Tensor> {
        self.get(name)
    }
    /// Rows `rows` of tensor `name` along its first axis, as [`take`](Self::take) reads
    /// them; by default the whole tensor is read and the rows copied out.
    fn take_rows(&self, name: &str, rows: std::ops::Range<usize>) -> Result<Tensor> {
        let t = self.take(name)?;
        let range = row_bytes(name, t.dims(), t.dtype(), &rows)?;
        let dims: Vec<usize> = std::iter::once(rows.len()).chain(t.dims().iter().skip(1).copied()).collect();
        Tensor::from_bytes(&t.host_bytes()?[range], dims, t.dtype())
    }
}

/// The byte range of rows `rows` (first axis) of a row-major tensor `name` of `dims` and
/// `dtype` (block formats: whole blocks per row), or an error naming what does not fit.
pub(crate) fn row_bytes(
    name: &str,
    dims: &[usize],
    dtype: DType,
    rows: &std::ops::Range<usize>,
) -> Result<std::ops::Range<usize>> {
    let n = dims.first().copied().unwrap_or(0);
    let per_row: usize = dims.iter().skip(1).product();
    if rows.start > rows.end || rows.end > n || !per_row.is_multiple_of(dtype.block_elems()) {
        return Err(Error::Io(format!(
            "tensor '{name}' {dims:?} {dtype}: rows {}..{} are not whole rows of it",
            rows.start, rows.end
        )));
    }
    let row = dtype.storage_bytes(per_row);
    Ok(rows.start * row..rows.end * row)
}

impl TensorSource for Shards {
    fn origin(&self) -> String {
        "checkpoint".into()
    }
    fn names(&self) -> Vec<String> {
        Shards::names(self).map(str::to_string).collect()
    }
    fn has(&self, name: &str) -> bool {
        Shards::has(self, name)
    }
    fn dtype(&self, name: &str) -> Result<DType> {
        Shards::dtype(self, name)
    }
    fn get(&self, name: &str) -> Result<Tensor> {
        Shards::get(self, name)
    }
    fn take(&self, name: &str) -> Result<Tensor> {
        Shards::take(self, name)
    }
    fn take_rows(&self, name: &str, rows: std::ops::Range<usize>) -> Result<Tensor> {
        Shards::take_rows(self, name, rows)
    }
}

impl TensorSource for GgufFile {
    fn origin(&self) -> String {
        "gguf".into()
    }
    fn names(&self) -> Vec<String> {
        self.tensors().iter().map(|t| t.name().to_string()).collect()
    }
    fn has(&self, name: &str) -> bool {
        self.tensor_info(name).is_some()
    }
    fn dtype(&self, name: &str) -> Result<DType> {
        self.tensor_info(name).ok_or_else(|| Error::Io(format!("gguf: missing tensor '{name}'")))?.dtype()
    }
    fn get(&self, name: &str) -> Result<Tensor> {
        self.tensor(name)
    }
    fn get_mapped(&self, name: &str) -> Result<Tensor> {
        self.tensor_mapped(name)
    }
    fn take(&self, name: &str) -> Result<Tensor> {
        self.take_tensor(name)
    }
    fn take_rows(&self, name: &str, rows: std::ops::Range<usize>) -> Result<Tensor> {
        self.take_tensor_rows(name, rows)
    }
}

/// One file tensor feeding (part of) a parameter.
struct Part {
    file: String,
    fix: Fix,
    /// The shape fusebox needs (`[out, in]` or `[n]`).
    shape: Vec<usize>,
}

/// How a parameter is used, which decides its storage.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A projection matrix: dense f32 or quantized, laid out for the backend.
    Matrix,
    /// The token embedding: f32 or quantized rows.
    Embedding,
    /// Every expert's matrix of one projection, `[E, out, in]`: dense f32 or quantized,
    /// read by `expert_matmul` as stored.
    Experts,
    /// Norm weights, biases, the position table: f32.
    Plain,
}

/// What a loaded model is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Inference: block formats kept, matrices laid out by `preprocess_linear_weight`,
    /// projections of one input stacked where their formats agree.
    Inference,
    /// Training (fine-tuning): every parameter f32 in the plain `[out, in]` layout the
    /// backward reads; only the file's own stacking. Block formats are dequantized.
    Training,
    /// A frozen base for LoRA: block formats kept (matrices and the embedding multiplied
    /// straight from their blocks, forward and backward), floats f32, all in the plain
    /// `[out, in]` layout; projections stacked as for inference.
    Frozen,
}

/// Reads the model `plan` describes from `src`, for inference (see [`load_for`]).
pub fn load(b: &dyn ComputeBackend, src: &dyn TensorSource, plan: Plan) -> Result<Transformer> {
    load_for(b, src, plan, Purpose::Inference)
}

/// Reads the model `plan` describes from `src` for `purpose`. Missing tensors, wrong
/// shapes, unusable dtypes and tensors the architecture has no place for are errors
/// that name them; everything is checked before anything large is read.
pub fn load_for(b: &dyn ComputeBackend, src: &dyn TensorSource, plan: Plan, purpose: Purpose) -> Result<Transformer> {
    load_stage_for(b, src, plan, purpose, &|sizes| Ok(Stage::whole(sizes.layers.len())))
}

/// Bytes of a model's parameters as the file stores them, by where a pipeline stage
/// holds them: what a split balances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageSizes {
    /// The token (and position) embeddings: the first stage's.
    pub embed: u64,
    /// The final norm and the head: the last stage's (the embedding's bytes again when
    /// the head is tied to it).
    pub head: u64,
    /// Each block's parameters.
    pub layers: Vec<u64>,
    /// Each block's f32 keys and values per cached position (0 for a linear-attention
    /// block, whose state does not grow).
    pub kv_per_position: Vec<u64>,
    /// Rows of the head (the vocabulary).
    pub vocab: usize,
    /// Whether the head is stored in a block format, whose product gives each logit the
    /// same bits whatever other rows are multiplied with it — so that a head split by
    /// rows over two stages computes one process's logits. A dense head's product is
    /// blocked by its row count (its logits agree within f32 rounding).
    pub head_in_blocks: bool,
}

/// As [`load_for`], holding only the blocks of the stage `choose` picks from the
/// parameters' sizes (for inference: a pipeline stage runs no backward). Only the
/// stage's tensors are read; the whole file is still checked.
pub fn load_stage_for(
    b: &dyn ComputeBackend,
    src: &dyn TensorSource,
    plan: Plan,
    purpose: Purpose,
    choose: &dyn Fn(&StageSizes) -> Result<Stage>,
) -> Result<Transformer> {
    let inference = purpose != Purpose::Training;
    let Plan { arch, names, mut prefix, file_stacking, ignored, wrapper: _ } = plan;
    arch.validate()?;
    if prefix.is_empty() {
        // Some GPT-2 exports prefix every name with `transformer.`.
        if let Some((wte, _)) = names.file_name("wte") {
            if !src.has(&wte) && src.has(&format!("transformer.{wte}")) {
                prefix = "transformer.".into();
            }
        }
    }
    let file_of = |ours: &str| -> Result<(String, Fix)> {
        names.file_name(ours).map(|(f, fix)| (format!("{prefix}{f}"), fix)).ok_or_else(|| {
            Error::unsupported("load", format!("the {} layout has no file name for parameter '{ours}'", arch.name))
        })
    };
    let same_dtype = |parts: &[&str]| -> bool {
        let dtypes: Vec<Option<DType>> = parts
            .iter()
            .map(|p| file_of(p).ok().filter(|(f, _)| src.has(f)).and_then(|(f, _)| src.dtype(&f).ok()))
            .collect();
        dtypes.iter().all(|d| d.is_some() && *d == dtypes[0])
    };
    let stacking = |l: usize| Stacking {
        qkv: file_stacking.qkv
            || inference
                && same_dtype(&[
                    &format!("h.{l}.attn.q.weight"),
                    &format!("h.{l}.attn.k.weight"),
                    &format!("h.{l}.attn.v.weight"),
                ]),
        gate_up: file_stacking.gate_up
            || inference
                && (arch.mlp.gated()
                    && same_dtype(&[&format!("h.{l}.mlp.gate.weight"), &format!("h.{l}.mlp.up.weight")])),
    };
    let (specs, index) = layout(&arch, stacking);

    // The file tensors of every parameter.
    let (q, kv, f) = (arch.q_proj_width(), arch.kv_dim(), arch.d_ff);
    // A linear-attention layer's convolution is `[C, K]` but no matrix multiplied.
    let convs: Vec<usize> = index.layers.iter().filter_map(|l| l.linear.map(|x| x.conv)).collect();
    let mut plan: Vec<(Role, Vec<Part>)> = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let dims = spec.shape.dims().to_vec();
        let role = if i == index.embed {
            Role::Embedding
        } else if convs.contains(&i) {
            Role::Plain
        } else if dims.len() == 3 {
            Role::Experts
        } else if dims.len() == 2 && Some(i) != index.pos_embed {
            Role::Matrix
        } else {
            Role::Plain
        };
        let split = |stem: &str, parts: &[(&str, usize)]| -> Option<Vec<(String, Vec<usize>)>> {
            let (head, tail) = spec.name.split_once(stem)?;
            Some(
                parts
                    .iter()
                    .map(|(p, rows)| {
                        let mut shape = dims.clone();
                        shape[0] = *rows;
                        (format!("{head}{p}{tail}"), shape)
                    })
                    .collect(),
            )
        };
        let pieces = match (file_stacking.qkv, file_stacking.gate_up) {
            (false, _) if spec.name.contains(".attn.qkv.") => {
                split("attn.qkv", &[("attn.q", q), ("attn.k", kv), ("attn.v", kv)])
            }
            (_, false) if spec.name.contains(".mlp.gate_up.") => {
                split("mlp.gate_up", &[("mlp.gate", f), ("mlp.up", f)])
            }
            _ => None,
        }
        .unwrap_or_else(|| vec![(spec.name.clone(), dims.clone())]);
        let mut parts = Vec::new();
        for (ours, shape) in pieces {
            let (file, fix) = file_of(&ours)?;
            if file.contains("{e}") {
                // One file tensor per expert, stacked along the parameter's first axis.
                parts.extend((0..shape[0]).map(|e| Part {
                    file: file.replace("{e}", &e.to_string()),
                    fix,
                    shape: shape[1..].to_vec(),
                }));
            } else {
                parts.push(Part { file, fix, shape });
            }
        }
        plan.push((role, parts));
    }

    // Every file tensor must be one this model uses: a layer past the block count or a
    // bias the architecture has none of would otherwise be dropped silently.
    let used: BTreeSet<&str> = plan.iter().flat_map(|(_, parts)| parts.iter().map(|p| p.file.as_str())).collect();
    let tied_copy = file_of("lm_head.weight").ok().filter(|_| arch.tied_embeddings).map(|(f, _)| f);
    for name in src.names() {
        if !used.contains(name.as_str()) && !ignored(&name) && tied_copy.as_deref() != Some(name.as_str()) {
            let layers_key = if src.origin() == "gguf" { "block_count" } else { "num_hidden_layers" };
            return Err(Error::Io(format!(
                "{}: tensor '{name}' is not part of a {}-layer {} model ({layers_key} {}); refusing a file \
                 with unexplained tensors",
                src.origin(),
                arch.n_layers,
                arch.name,
                arch.n_layers
            )));
        }
    }
    let first_missing = plan.iter().flat_map(|(_, parts)| parts.iter()).find(|p| !src.has(&p.file));
    if let Some(Part { file: missing, .. }) = first_missing {
        return Err(Error::Io(format!(
            "{}: missing tensor '{missing}' (a {}-layer {} model)",
            src.origin(),
            arch.n_layers,
            arch.name
        )));
    }

    let sizes = stage_sizes(src, &arch, &index, &plan)?;
    let stage = choose(&sizes)?;
    if stage.n_layers != arch.n_layers {
        return Err(Error::value("load", "stage", format!("a stage of the {} blocks", arch.n_layers), stage.n_layers));
    }
    if !stage.is_whole() && purpose != Purpose::Inference {
        return Err(Error::unsupported("load", "a pipeline stage is loaded for inference only"));
    }
    let held = stage.holds(&index, specs.len());
    // The embedding is served from the file's map when this process never multiplies by
    // all of it (untied, or tied but the head is another stage's or split): a lookup
    // touches only its rows, so the rest of the table need not be resident.
    let vocab = arch.vocab_size;
    let embed_is_head = arch.tied_embeddings && stage.is_last() && !stage.splits_head(vocab);
    // A split head's rows are read alone (a tied first stage reads its rows apart from
    // the table, below).
    let head_rows =
        (stage.splits_head(vocab) && !(arch.tied_embeddings && stage.is_first())).then(|| stage.head_share(vocab));
    let mut tensors = Vec::with_capacity(specs.len());
    for (i, (spec, (role, parts))) in specs.iter().zip(&plan).enumerate() {
        if !held[i] {
            tensors.push(Tensor::zeros([0], DType::F32)?);
            continue;
        }
        let reading = match &head_rows {
            Some(rows) if i == index.head_weight() => Reading::Rows(rows.clone()),
            _ if *role == Role::Embedding && purpose == Purpose::Inference && !embed_is_head => Reading::Mapped,
            _ => Reading::Copied,
        };
        tensors.push(read_param(b, src, &spec.name, *role, parts, spec.shape.dims(), purpose, reading)?);
    }
    let params = ParamSet { tensors };
    match purpose {
        Purpose::Inference if !stage.is_whole() => {
            // A tied first stage's rows of a split head, copied apart from the mapped
            // table: read in place from the file's 4 KiB pages, Gemma 3's decode ran 13%
            // slower.
            let apart = arch.tied_embeddings && stage.is_first() && stage.splits_head(vocab);
            let rows = match apart {
                true => Some(read_param(
                    b,
                    src,
                    "head rows",
                    Role::Embedding,
                    &plan[index.embed].1,
                    specs[index.embed].shape.dims(),
                    purpose,
                    Reading::Rows(stage.head_share(vocab)),
                )?),
                false => None,
            };
            let mut model = Transformer::for_inference_stage(arch, specs, index, params, stage)?;
            if let Some(rows) = rows {
                model.set_head_rows(rows)?;
            }
            Ok(model)
        }
        Purpose::Inference => Transformer::for_inference(arch, specs, index, params),
        Purpose::Training => Transformer::trainable_from(arch, specs, index, params),
        Purpose::Frozen => Transformer::frozen_from(arch, specs, index, params),
    }
}

/// The stored bytes of every parameter, grouped as [`StageSizes`] says.
fn stage_sizes(
    src: &dyn TensorSource,
    arch: &crate::transformer::Arch,
    index: &crate::transformer::ParamIndex,
    plan: &[(Role, Vec<Part>)],
) -> Result<StageSizes> {
    let bytes = |i: usize| -> Result<u64> {
        let mut total = 0u64;
        for p in &plan[i].1 {
            let elems = p.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or_else(|| {
                Error::Io(format!(
                    "tensor '{}': shape {:?} has more elements than this machine can address",
                    p.file, p.shape
                ))
            })?;
            let dtype = src.dtype(&p.file)?;
            let stored = ((elems / dtype.block_elems()) as u64).saturating_mul(dtype.block_bytes() as u64);
            total = total.saturating_add(stored);
        }
        Ok(total)
    };
    let sum = |ids: &mut dyn Iterator<Item = usize>| -> Result<u64> { ids.map(bytes).sum() };
    let embed = sum(&mut [Some(index.embed), index.pos_embed].into_iter().flatten())?;
    let head =
        sum(&mut [Some(index.norm_f.weight), index.norm_f.bias, Some(index.head_weight())].into_iter().flatten())?;
    let layers = index.layers.iter().map(|l| sum(&mut l.params().into_iter())).collect::<Result<Vec<_>>>()?;
    let kv = 2 * 4 * arch.kv_dim() as u64;
    let kv_per_position = (0..arch.n_layers).map(|l| if arch.is_linear(l) { 0 } else { kv }).collect();
    let head_parts = &plan[index.head_weight()].1;
    let head_in_blocks = head_parts.len() == 1 && head_parts[0].fix == Fix::None && {
        let dtype = src.dtype(&head_parts[0].file)?;
        dtype.is_quantized() || dtype == DType::F8E4M3
    };
    Ok(StageSizes { embed, head, layers, kv_per_position, vocab: arch.vocab_size, head_in_blocks })
}

/// The network of a GGUF file (its architecture from the metadata).
pub fn load_gguf(b: &dyn ComputeBackend, file: &GgufFile) -> Result<Transformer> {
    load_gguf_for(b, file, Purpose::Inference)
}

/// The network of a GGUF file for `purpose`.
pub fn load_gguf_for(b: &dyn ComputeBackend, file: &GgufFile, purpose: Purpose) -> Result<Transformer> {
    load_gguf_with(b, file, purpose, &|sizes| Ok(Stage::whole(sizes.layers.len())))
}

/// The pipeline stage of a GGUF file's network that `choose` picks, for inference (see
/// [`load_stage_for`]).
pub fn load_gguf_stage(
    b: &dyn ComputeBackend,
    file: &GgufFile,
    choose: &dyn Fn(&StageSizes) -> Result<Stage>,
) -> Result<Transformer> {
    load_gguf_with(b, file, Purpose::Inference, choose)
}

/// A GGUF file's network for `purpose`, holding the stage `choose` picks.
fn load_gguf_with(
    b: &dyn ComputeBackend,
    file: &GgufFile,
    purpose: Purpose,
    choose: &dyn Fn(&StageSizes) -> Result<Stage>,
) -> Result<Transformer> {
    let plan = gguf_plan(file)?;
    // Tensors the converter stored in another order or form are read back as the plan's.
    match crate::arch::by_name(&plan.arch.name)?.gguf_source(&plan.arch, file)? {
        Some(src) => load_stage_for(b, src.as_ref(), plan, purpose, choose),
        None => load_stage_for(b, file, plan, purpose, choose),
    }
}

/// The plan of a GGUF file, from its metadata and tensor names.
fn gguf_plan(file: &GgufFile) -> Result<Plan> {
    // The tokens' count: from the array, or as counted when it was skipped at open.
    let vocab_from_tokens = match file.metadata().get_strings("tokenizer.ggml.tokens")? {
        Some(tokens) => Some(tokens.len()),
        None => file.vocabulary_len(),
    };
    let has = |name: &str| file.tensor_info(name).is_some();
    let tensors = FileTensors { count: file.tensors().len(), has: &has };
    crate::arch::gguf_plan(file.metadata(), vocab_from_tokens, &tensors, &|| {
        file.tensor("rope_freqs.weight")?.to_vec_f32()
    })
}

/// The network of a Hugging Face directory (`config.json` and the safetensors
/// shards), for inference.
pub fn load_hf(b: &dyn ComputeBackend, dir: &std::path::Path) -> Result<Transformer> {
    load_hf_for(b, dir, Purpose::Inference)
}

/// The network of a Hugging Face directory for `purpose`.
pub fn load_hf_for(b: &dyn ComputeBackend, dir: &std::path::Path, purpose: Purpose) -> Result<Transformer> {
    let config = read_config(dir)?;
    let shards = Shards::open(dir)?;
    let plan = hf_plan(&config, &shards)?;
    load_hf_stage(b, &shards, plan, purpose, &|sizes| Ok(Stage::whole(sizes.layers.len())))
}

/// [`load_stage_for`] of a Hugging Face checkpoint: a multimodal wrapper's text model
/// read under its own names ([`text_only::TextOnly`]), and tensors it fuses in an order
/// of its own (Qwen3-Next's) read as the plan's parameters
/// ([`crate::arch::Architecture::hf_source`]).
pub fn load_hf_stage(
    b: &dyn ComputeBackend,
    shards: &Shards,
    plan: Plan,
    purpose: Purpose,
    choose: &dyn Fn(&StageSizes) -> Result<Stage>,
) -> Result<Transformer> {
    let text_only;
    let shards: &dyn TensorSource = match plan.wrapper {
        Some(w) => {
            text_only = text_only::TextOnly::new(shards, w)?;
            &text_only
        }
        None => shards,
    };
    let model = match crate::arch::by_name(&plan.arch.name)?.hf_source(&plan.arch, shards)? {
        Some(src) => load_stage_for(b, src.as_ref(), plan, purpose, choose),
        None => load_stage_for(b, shards, plan, purpose, choose),
    };
    model
}

/// The plan of a Hugging Face checkpoint: `config.json` `config`, its counts checked
/// against the tensors `shards` hold.
pub fn hf_plan(config: &serde_json::Value, shards: &Shards) -> Result<Plan> {
    let has = |name: &str| Shards::has(shards, name);
    crate::arch::hf_plan(config, &FileTensors { count: Shards::names(shards).count(), has: &has })
}

/// How [`read_param`] reads a parameter from its file.
#[derive(Debug, Clone, PartialEq)]
enum Reading {
    /// Copied into this process's memory (the file's pages given back).
    Copied,
    /// Served from the file's memory map where it is used as stored.
    Mapped,
    /// Only these leading-axis rows of it, copied: a stage's share of a split head.
    Rows(std::ops::Range<usize>),
}

/// Reads, checks, fixes and concatenates the parts of one parameter of `shape` as
/// `reading` says (its rows of `shape` only for [`Reading::Rows`]).
#[allow(clippy::too_many_arguments)]
fn read_param(
    b: &dyn ComputeBackend,
    src: &dyn TensorSource,
    name: &str,
    role: Role,
    parts: &[Part],
    shape: &[usize],
    purpose: Purpose,
    reading: Reading,
) -> Result<Tensor> {
    let origin = src.origin();
    // One part stored as used is read for its rows alone; anything else is read whole and
    // its rows taken at the end.
    let rows = match &reading {
        Reading::Rows(r) if r.end > shape.first().copied().unwrap_or(0) => {
            return Err(Error::value(
                "load",
                format!("rows of '{name}'"),
                format!("within {shape:?}"),
                format!("{r:?}"),
            ));
        }
        Reading::Rows(r) => Some(r.clone()),
        _ => None,
    };
    let rows_alone = rows.clone().filter(|_| parts.len() == 1 && parts[0].fix == Fix::None);
    let of_rows = |dims: &[usize], r: &std::ops::Range<usize>| -> Vec<usize> {
        std::iter::once(r.len()).chain(dims.iter().skip(1).copied()).collect()
    };
    let mut host = Vec::with_capacity(parts.len());
    // A mixture of experts' weights in a block format, used as stored (one file tensor,
    // not trained): served from the file's map, not copied — they are most of the model,
    // and a token reads only its experts'.
    let map = reading == Reading::Mapped;
    let mapped =
        (map || role == Role::Experts && purpose != Purpose::Training) && parts.len() == 1 && parts[0].fix == Fix::None;
    for p in parts {
        let (t, stored) = match &rows_alone {
            Some(r) => (src.take_rows(&p.file, r.clone())?, of_rows(&p.shape, r)),
            None if mapped => (src.get_mapped(&p.file)?, p.fix.stored_shape(&p.shape)),
            None => (src.take(&p.file)?, p.fix.stored_shape(&p.shape)),
        };
        // Size-1 axes may differ (llama.cpp stores the shared expert's gate `[1, D]` as `[D]`).
        let squeezed = |d: &[usize]| d.iter().copied().filter(|&n| n != 1).collect::<Vec<_>>();
        let t = if t.dims() == stored.as_slice() {
            t
        } else if squeezed(t.dims()) == squeezed(&stored) {
            t.reshape(stored.clone())?
        } else {
            return Err(Error::Io(format!("{origin}: tensor '{}': shape {:?}, expected {stored:?}", p.file, t.dims())));
        };
        let dtype = t.dtype();
        let float = matches!(dtype, DType::F32 | DType::F16 | DType::BF16);
        let blocks = dtype.is_quantized() || dtype == DType::F8E4M3;
        let ok = match (role, purpose) {
            (Role::Plain, _) => float,
            // Training dequantizes block formats to f32 once, at load.
            (Role::Matrix | Role::Experts, _) | (Role::Embedding, Purpose::Training) => float || blocks,
            (Role::Embedding, _) => float || dtype.is_quantized(),
        };
        if !ok || (p.fix != Fix::None && !float) {
            return Err(Error::Io(format!(
                "{origin}: tensor '{}': dtype {dtype} cannot be {}{}",
                p.file,
                if purpose == Purpose::Training { "trained as " } else { "" },
                match role {
                    Role::Matrix => "a weight matrix",
                    Role::Experts => "expert weight matrices",
                    Role::Embedding => "an embedding table",
                    Role::Plain => "a norm weight, bias or position table (f32, f16 or bf16)",
                }
            )));
        }
        let t = match p.fix {
            Fix::None => t,
            fix => Tensor::from_vec(fix.to_ours(&p.shape, &t.to_vec_f32()?), p.shape.clone())?,
        };
        host.push(t);
    }
    // One part as it is; several concatenated along rows: block formats by bytes (whole
    // blocks per row), floats as f32.
    let dtype = host[0].dtype();
    let shape = match &rows_alone {
        Some(r) => of_rows(shape, r),
        None => shape.to_vec(),
    };
    let joined = if host.len() == 1 {
        host.remove(0)
    } else if host.iter().all(|t| t.dtype() == dtype) && !matches!(dtype, DType::F16 | DType::BF16 | DType::F32) {
        let mut bytes = Vec::new();
        for t in &host {
            bytes.extend_from_slice(t.host_bytes()?);
        }
        Tensor::from_bytes(&bytes, shape.to_vec(), dtype)?
    } else {
        let mut values = Vec::new();
        for t in &host {
            values.extend(t.to_vec_f32()?);
        }
        Tensor::from_vec(values, shape.to_vec())?
    };
    let dtype = joined.dtype();
    let widen = |t: &Tensor| -> Result<Tensor> {
        let t = b.upload(t)?;
        if t.dtype() == DType::F32 {
            Ok(t)
        } else if t.dtype().is_quantized() || t.dtype() == DType::F8E4M3 {
            b.dequantize(&t)
        } else {
            b.cast(&t, DType::F32)
        }
    };
    let out = match role {
        _ if purpose == Purpose::Training => widen(&joined)?,
        Role::Matrix if purpose == Purpose::Frozen && (dtype.is_quantized() || dtype == DType::F8E4M3) => {
            b.upload(&joined)?
        }
        Role::Matrix if purpose == Purpose::Frozen => widen(&joined)?,
        Role::Matrix if dtype.is_quantized() || dtype == DType::F8E4M3 => {
            b.preprocess_linear_weight(&b.upload(&joined)?)?
        }
        Role::Matrix => b.preprocess_linear_weight(&widen(&joined)?)?,
        Role::Experts if dtype.is_quantized() || dtype == DType::F8E4M3 => b.upload(&joined)?,
        Role::Experts => widen(&joined)?,
        Role::Embedding if dtype.is_quantized() => b.upload(&joined)?,
        Role::Embedding | Role::Plain => widen(&joined)?,
    };
    if out.dims() != shape {
        return Err(Error::Io(format!("{origin}: parameter '{name}': shape {:?}, expected {shape:?}", out.dims())));
    }
    match rows.filter(|_| rows_alone.is_none()) {
        // Read whole (several parts, or fixed): its rows copied out, the rest dropped.
        Some(r) => {
            let host = b.to_host(&out)?;
            let row_bytes = host.byte_len() / shape[0].max(1);
            let bytes = &host.host_bytes()?[r.start * row_bytes..r.end * row_bytes];
            b.upload(&Tensor::from_bytes(bytes, of_rows(&shape, &r), host.dtype())?)
        }
        None => Ok(out),
    }
}
