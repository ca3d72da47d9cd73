//! Qwen3.5 (dense, text): a hybrid of Gated DeltaNet linear-attention layers
//! (`layer_types` `linear_attention`; by default three of every four) and full-attention
//! layers whose output is gated by `σ(gate)` (the gate rows follow each query head's
//! rows in `q_proj`), with per-head QK-norm and partial rotary (`partial_rotary_factor`,
//! 0.25). Every RMS norm but the Gated DeltaNet's own is Gemma's `(1 + w)` form, stored
//! as `w` (the 1 is added at load, as for Gemma 3).
//!
//! Qwen3.5 is published as a vision-language model (`model_type` `qwen3_5`,
//! `Qwen3_5ForConditionalGeneration`): the text model's config under `text_config`, its
//! tensors under `model.language_model.*` (the head stays `lm_head.weight`), a vision
//! tower beside them (`model.visual.*`), and multi-token-prediction blocks (`mtp.*`)
//! that transformers does not load either. fusebox reads such a checkpoint as its text
//! model ([`WRAPPER`]: the vision tower left out, with a notice) and exports the text
//! model (`qwen3_5_text`, `Qwen3_5ForCausalLM`, which transformers loads, and which loads
//! the wrapper's weights too).
//!
//! transformers' rope is "mrope" with sections for image grids; for text every section
//! sees the same position, which is the plain rope over the rotated dims.
//!
//! GGUF (`qwen35`, as llama.cpp's `convert_hf_to_gguf.py` writes it): the norms are
//! stored with the 1 added (all but `ssm_norm`), the convolution as `[C, K]`, A as
//! `ssm_a` = −e^{A_log}, `dt_bias` as `ssm_dt.bias`; and where there are fewer key
//! heads than value heads the value heads are stored *tiled* rather than grouped: HF's
//! head `h = g·r + i` (the `i`-th of key head `g`'s `r` value heads) is stored as head
//! `i·Hk + g`, so that stored head `s` reads key head `s mod Hk` (ggml's broadcast).
//! That reorders the rows of the v part of `attn_qkv` and of `ssm_conv1d`, the rows of
//! `attn_gate`, `ssm_alpha`, `ssm_beta`, `ssm_a`, `ssm_dt.bias`, and the columns of
//! `ssm_out`. [`GgufSource`] undoes all of it on load (so the model runs HF's layout)
//! and [`Architecture::gguf_store`] redoes it on export.

use fusebox::{DType, Error, Result, RopeStyle, Tensor};
use serde_json::json;

use super::preset::{ModelConfig, Preset};
use super::qwen3_next::hf_ignored;
use super::{
    gguf, gguf_llama_like_partial_rope, hf_llama_like, llama, Architecture, Fix, GgufFacts, GgufKeys, GgufMetaOut,
    HfConfig, HfConfigOut, HfFacts, HfWrapper, NameTable,
};
use crate::gguf::{Array, GgufFile, Value};
use crate::transformer::{Arch, LayerAttention, LinearAttention, Stacking};
use crate::weights::TensorSource;

/// Qwen3.5 (dense).
pub struct Qwen3_5;

/// Qwen3.5's HF names: the Llama ones with `(1 + w)` norms and the Gated DeltaNet's.
pub static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.",
    layer: HF_LAYER_NAMES,
    global: HF_GLOBAL_NAMES,
    extends: Some(&super::HF_LLAMA_NAMES),
};

/// The per-layer entries of [`HF_NAMES`] (Qwen3-Next's table shares them).
pub const HF_LAYER_NAMES: &[(&str, &str, Fix)] = &[
    ("norm1.weight", "input_layernorm.weight", Fix::PlusOne),
    ("norm2.weight", "post_attention_layernorm.weight", Fix::PlusOne),
    ("attn.q_norm.weight", "self_attn.q_norm.weight", Fix::PlusOne),
    ("attn.k_norm.weight", "self_attn.k_norm.weight", Fix::PlusOne),
    ("linear.qkv.weight", "linear_attn.in_proj_qkv.weight", Fix::None),
    ("linear.z.weight", "linear_attn.in_proj_z.weight", Fix::None),
    ("linear.b.weight", "linear_attn.in_proj_b.weight", Fix::None),
    ("linear.a.weight", "linear_attn.in_proj_a.weight", Fix::None),
    ("linear.conv.weight", "linear_attn.conv1d.weight", Fix::Depthwise),
    ("linear.dt_bias", "linear_attn.dt_bias", Fix::None),
    ("linear.a_log", "linear_attn.A_log", Fix::None),
    ("linear.norm.weight", "linear_attn.norm.weight", Fix::None),
    ("linear.out.weight", "linear_attn.out_proj.weight", Fix::None),
];

/// The global entries of [`HF_NAMES`]: the final norm is `(1 + w)` too.
pub const HF_GLOBAL_NAMES: &[(&str, &str, Fix)] = &[("norm_f.weight", "model.norm.weight", Fix::PlusOne)];

static HF: HfFacts = HfFacts {
    model_type: "qwen3_5_text",
    class: "Qwen3_5ForCausalLM",
    names: &HF_NAMES,
    stacking: Stacking { qkv: false, gate_up: false },
    ignored: hf_ignored,
    export_prefix: "",
};

/// The vision-language checkpoint Qwen3.5 is published as (see the module docs).
pub static WRAPPER: HfWrapper = HfWrapper {
    model_type: "qwen3_5",
    class: "Qwen3_5ForConditionalGeneration",
    text_prefix: TEXT_PREFIX,
    skipped: SKIPPED,
};

/// Where Qwen3.5's wrappers keep the text model's `model.*` tensors.
pub const TEXT_PREFIX: (&str, &str) = ("model.", "model.language_model.");

/// What a text-only run of Qwen3.5's wrappers leaves out: the vision tower.
pub const SKIPPED: &[(&str, &str)] = &[("model.visual.", "vision tower")];
/// llama.cpp's `qwen35` names: its common ones, the MLP's norm as
/// `post_attention_norm`, and the Gated DeltaNet's (`ssm_a` holds −e^{A_log} and the
/// value heads are tiled: [`GgufSource`] and [`Architecture::gguf_store`] convert).
pub static GGUF_NAMES: NameTable = NameTable {
    layer_prefix: "blk.",
    layer: &[
        ("norm2.weight", "post_attention_norm.weight", Fix::None),
        ("linear.qkv.weight", "attn_qkv.weight", Fix::None),
        ("linear.z.weight", "attn_gate.weight", Fix::None),
        ("linear.b.weight", "ssm_beta.weight", Fix::None),
        ("linear.a.weight", "ssm_alpha.weight", Fix::None),
        ("linear.conv.weight", "ssm_conv1d.weight", Fix::None),
        ("linear.dt_bias", "ssm_dt.bias", Fix::None),
        ("linear.a_log", "ssm_a", Fix::None),
        ("linear.norm.weight", "ssm_norm.weight", Fix::None),
        ("linear.out.weight", "ssm_out.weight", Fix::None),
    ],
    global: &[],
    extends: Some(&super::GGUF_NAMES),
};

static GGUF: GgufFacts = GgufFacts {
    name: "qwen35",
    export_as: "qwen35",
    stacking: Stacking { qkv: false, gate_up: false },
    names: &GGUF_NAMES,
};

/// Qwen3.5's rope sections (temporal, height, width, extra) as its converter writes them.
const ROPE_SECTIONS: [i32; 4] = [11, 11, 10, 0];

/// The rope sections an export writes: Qwen3.5's where they fit in a head (ggml asserts
/// their sum ≤ head size), else the first `head_dim` sectors split alike (each of the
/// three text positions gets every third sector, so every pair rotates by the position).
fn rope_sections(head_dim: usize) -> [i32; 4] {
    let m = head_dim.min(32) as i32;
    if m == 32 {
        return ROPE_SECTIONS;
    }
    [(m + 2) / 3, (m + 1) / 3, m / 3, 0]
}

/// llama.cpp's interleaved multi-section rope gives rotary pair `i` the position of
/// section `sector mod 3` (temporal, height, width: all the token's position for text)
/// while `sector = i mod Σsections` is below three times that section's size, else the
/// extra section's (not the token's). Refuses sections that send a pair there.
fn check_rope_sections(k: &GgufKeys<'_>, arch: &Arch) -> Result<()> {
    let key = k.key("rope.dimension_sections");
    let Some(a) = k.meta.get_array(&key)? else { return Ok(()) };
    let s: Vec<i64> = (0..a.len().min(4)).map(|i| a.get_i64(i).unwrap_or(-1)).collect();
    let total: i64 = s.iter().sum();
    let bad = |why: String| Error::unsupported("gguf", format!("{key} {s:?}: {why}"));
    if s.len() < 3 || s.iter().any(|&x| x < 0) || total <= 0 || total > arch.head_dim as i64 {
        return Err(bad(format!("expected 3 or 4 sizes ≥ 0 summing to 1..={}", arch.head_dim)));
    }
    for pair in 0..arch.rotary_dims() as i64 / 2 {
        let sector = pair % total;
        if sector >= 3 * s[(sector % 3) as usize] {
            return Err(bad(format!("rotary pair {pair} gets the extra (vision) position, which text has none of")));
        }
    }
    Ok(())
}

/// How the value heads of a linear-attention layer are stored in GGUF: `r` value heads
/// per key head, tiled (see the module docs).
#[derive(Debug, Clone, Copy)]
struct Tiling {
    k_heads: usize,
    per_k: usize,
}

impl Tiling {
    fn of(la: &LinearAttention) -> Tiling {
        Tiling { k_heads: la.k_heads.max(1), per_k: (la.v_heads / la.k_heads.max(1)).max(1) }
    }

    /// The stored head of HF's head `h = g·r + i`: `i·Hk + g`.
    fn stored(self, h: usize) -> usize {
        (h % self.per_k) * self.k_heads + h / self.per_k
    }

    /// HF's head of stored head `s` (the inverse of [`stored`](Self::stored)).
    fn grouped(self, s: usize) -> usize {
        (s % self.k_heads) * self.per_k + s / self.k_heads
    }
}

/// Where a linear-attention tensor holds value heads: rows `start..` in heads of `width`
/// rows, or its columns in heads of `width`.
#[derive(Debug, Clone, Copy)]
enum Heads {
    Rows { start: usize, width: usize },
    Cols { width: usize },
}

/// The value heads of GGUF tensor `part` (the name after `blk.N.`) of a linear layer.
fn heads_of(la: &LinearAttention, part: &str) -> Option<Heads> {
    match part {
        "attn_qkv.weight" | "ssm_conv1d.weight" => Some(Heads::Rows { start: 2 * la.key_width(), width: la.v_dim }),
        "attn_gate.weight" => Some(Heads::Rows { start: 0, width: la.v_dim }),
        "ssm_beta.weight" | "ssm_alpha.weight" | "ssm_dt.bias" | "ssm_a" => Some(Heads::Rows { start: 0, width: 1 }),
        "ssm_out.weight" => Some(Heads::Cols { width: la.v_dim }),
        _ => None,
    }
}

/// `t` (any storage: rows of whole blocks are moved as bytes) with `n` value heads
/// reordered: head `h` of the result is head `src(h)` of `t`. Columns of a block format
/// whose blocks straddle heads cannot be moved as bytes: those come back dequantized (f32).
fn reorder_heads(name: &str, t: &Tensor, heads: Heads, n: usize, src: impl Fn(usize) -> usize) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let (rows, cols) = match dims.as_slice() {
        [r] => (*r, 1),
        [r, c] => (*r, *c),
        _ => return Err(Error::shape("gguf", format!("tensor '{name}'"), "1 or 2 dims", format!("{dims:?}"))),
    };
    let dtype = t.dtype();
    let (be, bb) = (dtype.block_elems(), dtype.block_bytes());
    let bytes = t.host_bytes()?;
    let row_bytes = cols / be * bb;
    if !cols.is_multiple_of(be) || bytes.len() != rows * row_bytes {
        return Err(Error::Io(format!("gguf: tensor '{name}': rows of {cols} are not whole {dtype} blocks")));
    }
    let fits = |have: usize, start: usize, width: usize| start + n * width == have;
    match heads {
        Heads::Rows { start, width } => {
            if !fits(rows, start, width) {
                return Err(Error::shape("gguf", format!("tensor '{name}' rows"), start + n * width, rows));
            }
            let mut out = bytes.to_vec();
            let w = width * row_bytes;
            for h in 0..n {
                let (to, from) = ((start + h * width) * row_bytes, (start + src(h) * width) * row_bytes);
                out[to..to + w].copy_from_slice(&bytes[from..from + w]);
            }
            Tensor::from_bytes(&out, dims, dtype)
        }
        Heads::Cols { width } => {
            if !fits(cols, 0, width) {
                return Err(Error::shape("gguf", format!("tensor '{name}' columns"), n * width, cols));
            }
            if width.is_multiple_of(be) {
                let w = width / be * bb;
                let mut out = bytes.to_vec();
                for r in 0..rows {
                    for h in 0..n {
                        let (to, from) = (r * row_bytes + h * w, r * row_bytes + src(h) * w);
                        out[to..to + w].copy_from_slice(&bytes[from..from + w]);
                    }
                }
                return Tensor::from_bytes(&out, dims, dtype);
            }
            let mut row = vec![0f32; cols];
            let mut out = vec![0f32; rows * cols];
            for r in 0..rows {
                fusebox::cpu::quant::dequantize_row_into(dtype, &bytes[r * row_bytes..(r + 1) * row_bytes], &mut row)?;
                for h in 0..n {
                    out[r * cols + h * width..r * cols + (h + 1) * width]
                        .copy_from_slice(&row[src(h) * width..(src(h) + 1) * width]);
                }
            }
            Tensor::from_vec(out, dims)
        }
    }
}

/// `blk.{l}.{part}` → `(l, part)`.
pub(super) fn layer_part(name: &str) -> Option<(usize, &str)> {
    let (l, part) = name.strip_prefix("blk.")?.split_once('.')?;
    Some((l.parse().ok()?, part))
}

/// A `qwen35` GGUF file's tensors as the model reads them (HF's layout): value heads
/// back in grouped order, `ssm_a` back to A_log, and the multi-token-prediction blocks
/// the converter appends after the last layer (which fusebox does not run) left out.
pub struct GgufSource<'a> {
    file: &'a GgufFile,
    la: LinearAttention,
    linear: Vec<bool>,
}

impl GgufSource<'_> {
    /// What is done to tensor `name` on the way: its value heads, and whether it is `ssm_a`.
    fn change(&self, name: &str) -> Option<(Option<Heads>, bool)> {
        let (l, part) = layer_part(name)?;
        if !self.linear.get(l).copied().unwrap_or(false) {
            return None;
        }
        let heads = heads_of(&self.la, part).filter(|_| self.la.v_heads != self.la.k_heads);
        let a = part == "ssm_a";
        (heads.is_some() || a).then_some((heads, a))
    }

    fn read(&self, name: &str, t: Tensor) -> Result<Tensor> {
        let Some((heads, a)) = self.change(name) else { return Ok(t) };
        let tiling = Tiling::of(&self.la);
        let t = match heads {
            Some(h) => reorder_heads(name, &t, h, self.la.v_heads, |h| tiling.stored(h))?,
            None => t,
        };
        if !a {
            return Ok(t);
        }
        a_log_of_ssm_a(name, &t)
    }
}

/// A_log from GGUF's `ssm_a` (tensor `name`), which holds −e^{A_log}.
pub(super) fn a_log_of_ssm_a(name: &str, t: &Tensor) -> Result<Tensor> {
    let mut v = t.to_vec_f32()?;
    for x in &mut v {
        if !(*x < 0.0 && x.is_finite()) {
            return Err(Error::value("gguf", format!("tensor '{name}'"), "−e^{A_log}: finite and < 0", *x));
        }
        *x = (-*x).ln();
    }
    Tensor::from_vec(v, t.dims().to_vec())
}

impl TensorSource for GgufSource<'_> {
    fn origin(&self) -> String {
        TensorSource::origin(self.file)
    }
    fn names(&self) -> Vec<String> {
        let n = self.linear.len();
        TensorSource::names(self.file).into_iter().filter(|t| layer_part(t).is_none_or(|(l, _)| l < n)).collect()
    }
    fn has(&self, name: &str) -> bool {
        TensorSource::has(self.file, name)
    }
    fn dtype(&self, name: &str) -> Result<DType> {
        let stored = TensorSource::dtype(self.file, name)?;
        Ok(match self.change(name) {
            Some((_, true)) => DType::F32,
            Some((Some(Heads::Cols { width }), _)) if !width.is_multiple_of(stored.block_elems()) => DType::F32,
            _ => stored,
        })
    }
    fn get(&self, name: &str) -> Result<Tensor> {
        self.read(name, self.file.tensor(name)?)
    }
    fn get_mapped(&self, name: &str) -> Result<Tensor> {
        match self.change(name) {
            Some(_) => self.get(name),
            None => self.file.tensor_mapped(name),
        }
    }
}

/// Trained from scratch: [`preset_block`].
pub static PRESET: Preset =
    Preset { block: preset_block, tiny_kv_heads: llama::PRESET.tiny_kv_heads, tiny_d_ff: llama::PRESET.tiny_d_ff };

/// Linear layers but every fourth and the last (full attention).
fn preset_layers(n_layers: usize) -> Vec<LayerAttention> {
    (0..n_layers)
        .map(|l| if (l + 1) % 4 == 0 || l + 1 == n_layers { LayerAttention::Global } else { LayerAttention::Linear })
        .collect()
}

/// The Llama block with Qwen3.5's changes: QK-norm, a gated output, a quarter of each
/// head rotated, and Gated DeltaNet layers (query/key heads half the attention heads,
/// value heads as many, both of the attention's head width, a 4-tap convolution).
pub fn preset_block(cfg: &ModelConfig) -> Arch {
    let mut arch = llama::block(cfg, "qwen3_5");
    arch.qk_norm = true;
    arch.attn_output_gate = true;
    arch.rotary_dim = Some((arch.head_dim / 4).max(2) & !1).filter(|&r| r < arch.head_dim);
    arch.layer_attention = preset_layers(cfg.n_layers);
    arch.linear_attention = Some(LinearAttention {
        k_heads: (cfg.n_heads / 2).max(1),
        v_heads: cfg.n_heads,
        k_dim: arch.head_dim,
        v_dim: arch.head_dim,
        conv_kernel: 4,
    });
    arch
}

/// The layer kinds of a config without `layer_types`: linear but every
/// `full_attention_interval`-th (transformers' default 4).
fn interval_layers(n_layers: usize, interval: usize) -> Vec<LayerAttention> {
    (0..n_layers)
        .map(|l| if (l + 1) % interval == 0 { LayerAttention::Global } else { LayerAttention::Linear })
        .collect()
}

impl Architecture for Qwen3_5 {
    fn name(&self) -> &'static str {
        "qwen3_5"
    }

    fn hf(&self) -> &'static HfFacts {
        &HF
    }

    fn gguf(&self) -> &'static GgufFacts {
        &GGUF
    }

    fn hf_wrapper(&self) -> Option<&'static HfWrapper> {
        Some(&WRAPPER)
    }

    fn read_hf(&self, c: &HfConfig<'_>) -> Result<Arch> {
        let mut arch = hf_llama_like(c, "qwen3_5", 1e-6)?;
        arch.qk_norm = true;
        arch.attn_output_gate = true;
        arch.layer_attention = match c.layer_types(arch.n_layers)? {
            Some(t) => t,
            None => match c.uint("full_attention_interval")? {
                Some(0) => return Err(Error::value("config.json", "'full_attention_interval'", "> 0", 0)),
                i => interval_layers(arch.n_layers, i.unwrap_or(4)),
            },
        };
        if arch.layer_attention.contains(&LayerAttention::Local) {
            return Err(Error::unsupported("config.json", "Qwen3.5 with sliding_attention layers"));
        }
        arch.linear_attention = Some(LinearAttention {
            k_heads: c.uint("linear_num_key_heads")?.unwrap_or(16),
            v_heads: c.uint("linear_num_value_heads")?.unwrap_or(32),
            k_dim: c.uint("linear_key_head_dim")?.unwrap_or(128),
            v_dim: c.uint("linear_value_head_dim")?.unwrap_or(128),
            conv_kernel: c.uint("linear_conv_kernel_dim")?.unwrap_or(4),
        });
        Ok(arch)
    }

    /// As llama.cpp reads `qwen35`: the blocks less the `nextn_predict_layers`
    /// multi-token-prediction blocks the converter appends; the layer kinds from
    /// `attention.recurrent_layers`, else a full-attention layer every
    /// `full_attention_interval` (4); the Gated DeltaNet's sizes from the `ssm.*` keys
    /// (`group_count` key heads of `state_size`, `time_step_rank` value heads sharing
    /// `inner_size`); `rope.dimension_count` rotated dims.
    fn read_gguf(&self, k: &GgufKeys<'_>) -> Result<Arch> {
        let mut arch = gguf_llama_like_partial_rope(k, RopeStyle::HalfSplit)?;
        arch.name = "qwen3_5".into();
        arch.qk_norm = true;
        arch.attn_output_gate = true;
        let blocks = arch.n_layers;
        let mtp = k.meta.get_u64(&k.key("nextn_predict_layers"))?.unwrap_or(0);
        arch.n_layers = usize::try_from(mtp).ok().filter(|&m| m < blocks).map(|m| blocks - m).ok_or_else(|| {
            Error::value("gguf", format!("metadata '{}'", k.key("nextn_predict_layers")), format!("< {blocks}"), mtp)
        })?;
        let n = arch.n_layers;
        let recurrent = k.key("attention.recurrent_layers");
        arch.layer_attention = match k.meta.get_array(&recurrent)? {
            Some(Array::Bool(r)) if r.len() >= n => {
                r[..n].iter().map(|&r| if r { LayerAttention::Linear } else { LayerAttention::Global }).collect()
            }
            Some(other) => {
                return Err(Error::value(
                    "gguf",
                    format!("metadata '{recurrent}'"),
                    format!("{n} or more booleans"),
                    format!("{} of {}", other.len(), other.element_type().name()),
                ))
            }
            None => interval_layers(n, k.opt_size("full_attention_interval")?.unwrap_or(4)),
        };
        let v_heads = k.size("ssm.time_step_rank")?;
        let inner = k.size("ssm.inner_size")?;
        if !inner.is_multiple_of(v_heads) {
            return Err(Error::value(
                "gguf",
                format!("metadata '{}'", k.key("ssm.inner_size")),
                format!("a multiple of {} = {v_heads}", k.key("ssm.time_step_rank")),
                inner,
            ));
        }
        arch.linear_attention = Some(LinearAttention {
            k_heads: k.size("ssm.group_count")?,
            v_heads,
            k_dim: k.size("ssm.state_size")?,
            v_dim: inner / v_heads,
            conv_kernel: k.size("ssm.conv_kernel")?,
        });
        check_rope_sections(k, &arch)?;
        Ok(arch)
    }

    /// The keys llama.cpp's converter writes for `qwen35`: `write_gguf_hybrid`'s and
    /// the rope sections.
    fn write_gguf(&self, arch: &Arch, m: &mut GgufMetaOut) -> Result<()> {
        write_gguf_hybrid(arch, m)?;
        let sections = rope_sections(arch.head_dim).to_vec();
        m.put(&format!("{}.rope.dimension_sections", m.arch()), Value::Array(Array::I32(sections)));
        Ok(())
    }

    fn gguf_source<'a>(&self, arch: &Arch, file: &'a GgufFile) -> Result<Option<Box<dyn TensorSource + 'a>>> {
        let la = arch
            .linear_attention
            .ok_or_else(|| Error::value("qwen3_5", "linear_attention", "the Gated DeltaNet sizes", "none"))?;
        let linear = (0..arch.n_layers).map(|l| arch.is_linear(l)).collect();
        Ok(Some(Box::new(GgufSource { file, la, linear })))
    }

    /// A linear layer's tensors as the converter stores them: `ssm_a` = −e^{A_log}, the
    /// value heads tiled.
    fn gguf_store(&self, arch: &Arch, name: &str, shape: &[usize], values: Vec<f32>) -> Result<Vec<f32>> {
        let (Some(la), Some((l, part))) = (arch.linear_attention, layer_part(name)) else { return Ok(values) };
        if !arch.is_linear(l) {
            return Ok(values);
        }
        let values = if part == "ssm_a" { values.iter().map(|a| -a.exp()).collect() } else { values };
        match heads_of(&la, part).filter(|_| la.v_heads != la.k_heads) {
            Some(heads) => {
                let tiling = Tiling::of(&la);
                let t = Tensor::from_vec(values, shape.to_vec())?;
                reorder_heads(name, &t, heads, la.v_heads, |s| tiling.grouped(s))?.to_vec_f32()
            }
            None => Ok(values),
        }
    }

    fn write_hf(&self, arch: &Arch, c: &mut HfConfigOut) -> Result<()> {
        let la = arch
            .linear_attention
            .ok_or_else(|| Error::value("qwen3_5", "linear_attention", "the Gated DeltaNet sizes", "none"))?;
        if !(arch.qk_norm && arch.attn_output_gate) || arch.sliding_window.is_some() {
            return Err(Error::unsupported(
                "config.json",
                "a Qwen3.5 config needs QK-norm and the output gate, and has no sliding window",
            ));
        }
        c.model(&HF);
        c.llama_sizes(arch);
        c.set("hidden_act", "silu".into());
        c.set("attention_bias", arch.bias.qkv.into());
        c.set("tie_word_embeddings", arch.tied_embeddings.into());
        c.set("linear_num_key_heads", la.k_heads.into());
        c.set("linear_num_value_heads", la.v_heads.into());
        c.set("linear_key_head_dim", la.k_dim.into());
        c.set("linear_value_head_dim", la.v_dim.into());
        c.set("linear_conv_kernel_dim", la.conv_kernel.into());
        c.layer_types(arch);
        c.rope(&arch.rope)?;
        let mut params = super::hf::rope_parameters(&arch.rope)?;
        params["partial_rotary_factor"] = json!(arch.rotary_dims() as f64 / arch.head_dim as f64);
        c.set("rope_parameters", params);
        Ok(())
    }

    fn preset(&self) -> Option<&'static Preset> {
        Some(&PRESET)
    }
}

/// The keys llama.cpp's converters write for its hybrid Qwens (`qwen35`, `qwen3next`):
/// the KV heads, the head size, the Gated DeltaNet's sizes (`ssm.*`), which layers are
/// recurrent. llama.cpp sizes a value head as a key head (`ssm.state_size`), so a model
/// whose heads differ is refused.
pub(super) fn write_gguf_hybrid(arch: &Arch, m: &mut GgufMetaOut) -> Result<()> {
    let la = arch.linear_attention.ok_or_else(|| {
        Error::value("export", format!("{}: linear_attention", arch.name), "the Gated DeltaNet sizes", "none")
    })?;
    if la.v_dim != la.k_dim {
        return Err(Error::unsupported(
            "export",
            format!(
                "llama.cpp's {} sizes a Gated DeltaNet value head as a key head; this model's are {} and {}",
                m.arch(),
                la.v_dim,
                la.k_dim
            ),
        ));
    }
    m.size("attention.head_count_kv", "n_kv_heads", arch.n_kv_heads)?;
    gguf::write_head_size(arch, m)?;
    m.size("ssm.conv_kernel", "linear conv_kernel", la.conv_kernel)?;
    m.size("ssm.state_size", "linear k_dim", la.k_dim)?;
    m.size("ssm.group_count", "linear k_heads", la.k_heads)?;
    m.size("ssm.time_step_rank", "linear v_heads", la.v_heads)?;
    m.size("ssm.inner_size", "linear value width", la.value_width())?;
    let recurrent = (0..arch.n_layers).map(|l| arch.is_linear(l)).collect();
    m.put(&format!("{}.attention.recurrent_layers", m.arch()), Value::Array(Array::Bool(recurrent)));
    m.size("full_attention_interval", "full_attention_interval", 4)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox::{ComputeBackend, CpuBackend};

    #[test]
    fn tiling_is_the_converters_reorder() {
        // convert_hf_to_gguf.py's `_reorder_v_heads`: [Hk, r, d] → [r, Hk, d]. With 2 key
        // heads of 3 value heads each, HF's [G0v0 G0v1 G0v2 G1v0 G1v1 G1v2] is stored as
        // [G0v0 G1v0 G0v1 G1v1 G0v2 G1v2].
        let t = Tiling { k_heads: 2, per_k: 3 };
        assert_eq!((0..6).map(|s| t.grouped(s)).collect::<Vec<_>>(), [0, 3, 1, 4, 2, 5]);
        assert!((0..6).all(|h| t.grouped(t.stored(h)) == h && t.stored(t.grouped(h)) == h));
    }

    /// `reorder_heads` of a Q8_0 tensor equals the f32 reorder of its dequantized values,
    /// rows as bytes, columns as bytes when heads are whole blocks and dequantized when not.
    #[test]
    fn block_formats_reorder_as_their_values() {
        let b = CpuBackend::with_threads(1).unwrap();
        let t = Tiling { k_heads: 2, per_k: 2 };
        let src = |h: usize| t.stored(h);
        let values: Vec<f32> = (0..8 * 128).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        for (dims, heads, n, width) in [
            (vec![8usize, 128], Heads::Rows { start: 0, width: 2 }, 4, 2),
            (vec![8, 128], Heads::Cols { width: 32 }, 4, 32),
            (vec![16, 64], Heads::Cols { width: 16 }, 4, 16),
        ] {
            let plain = Tensor::from_vec(values.clone(), dims.clone()).unwrap();
            let q = b.to_host(&b.quantize(&plain, DType::Q8_0).unwrap()).unwrap();
            let plain = b.dequantize(&q).unwrap();
            let want = reorder_heads("t", &plain, heads, n, src).unwrap().to_vec_f32().unwrap();
            let got = reorder_heads("t", &q, heads, n, src).unwrap();
            let stays = matches!(heads, Heads::Rows { .. }) || width % 32 == 0;
            assert_eq!(got.dtype(), if stays { DType::Q8_0 } else { DType::F32 }, "{heads:?}");
            let got = if stays { b.dequantize(&got).unwrap() } else { got };
            assert_eq!(got.to_vec_f32().unwrap(), want, "{heads:?}");
        }
    }

    #[test]
    fn exported_rope_sections_give_every_pair_the_token_position() {
        for head_dim in (2..=256).step_by(2) {
            let s = rope_sections(head_dim);
            let total: i32 = s.iter().sum();
            assert!(total > 0 && total as usize <= head_dim, "{head_dim}: {s:?}");
            for pair in 0..head_dim as i32 / 2 {
                let sector = pair % total;
                assert!(sector < 3 * s[(sector % 3) as usize], "{head_dim}: {s:?}, pair {pair}");
            }
        }
        assert_eq!(rope_sections(256), ROPE_SECTIONS);
    }
}
