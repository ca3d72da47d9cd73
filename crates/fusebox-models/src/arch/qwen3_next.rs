//! Qwen3-Next: Qwen3.5's hybrid block (Gated DeltaNet layers beside gated full-attention
//! layers with QK-norm and partial rotary, `(1 + w)` norms but the Gated DeltaNet's own)
//! with a mixture of experts for every MLP (softmax top-k, renormalised when
//! `norm_topk_prob`) beside a shared expert scaled by `σ(shared_expert_gate(x))`.
//!
//! What differs from Qwen3.5 is how the Gated DeltaNet's input projections are stored:
//! fused, with the heads interleaved per key head. `in_proj_qkvz` holds, for each key
//! head `g`, `[q_g (d_k), k_g (d_k), v_g (r·d_v), z_g (r·d_v)]` rows (`r` value heads per
//! key head), and `in_proj_ba` `[b_g (r), a_g (r)]` (transformers'
//! `fix_query_key_value_ordering`). [`Unfused`] presents them as the Qwen3.5 layout the
//! block runs (`in_proj_qkv` = all queries, all keys, all values; `in_proj_z`, `in_proj_b`,
//! `in_proj_a`) by gathering rows, which keeps any storage format (rows are whole);
//! [`Architecture::fuse_for_export`] interleaves them back.
//!
//! GGUF (`qwen3next`, as llama.cpp's `convert_hf_to_gguf.py` writes it): `attn_qkv` and
//! `attn_gate` already in that layout (or, in older files, the fused `ssm_in` in HF's),
//! `ssm_ba` still interleaved, value heads grouped (not tiled as in `qwen35`), norms
//! stored with the 1 added but `ssm_norm`, `ssm_a` = −e^{A_log}; the
//! multi-token-prediction blocks the converter may append are left out. llama.cpp
//! always renormalises the k routing weights and has no dense layers in `qwen3next`.

use std::collections::BTreeMap;

use fusebox::{DType, Error, Result, Tensor};

use super::moe::{gguf_moe, write_gguf_moe, write_hf_qwen_moe};
use super::names::hf_derived;
use super::qwen3_5::{self, a_log_of_ssm_a, layer_part, Qwen3_5};
use super::{Architecture, ExportTensor, GgufFacts, GgufKeys, GgufMetaOut, HfConfig, HfConfigOut, HfFacts, NameTable};
use crate::gguf::GgufFile;
use crate::transformer::{Arch, LinearAttention, Stacking};
use crate::weights::TensorSource;

/// Qwen3-Next.
pub struct Qwen3Next;

/// Qwen3-Next's HF names: Qwen3.5's (the fused projections read through [`Unfused`])
/// over the Qwen mixtures' expert names.
pub static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.",
    layer: qwen3_5::HF_LAYER_NAMES,
    global: qwen3_5::HF_GLOBAL_NAMES,
    extends: Some(&super::HF_MOE_NAMES),
};

static HF: HfFacts = HfFacts {
    model_type: "qwen3_next",
    class: "Qwen3NextForCausalLM",
    names: &HF_NAMES,
    stacking: Stacking { qkv: false, gate_up: false },
    ignored: hf_ignored,
    export_prefix: "",
};

/// Tensors a checkpoint may hold that are not run here: the derived rotary buffers, and
/// the multi-token-prediction block (`mtp.*`, or `model.mtp.*` in some exports, which
/// transformers does not load either) that Qwen3-Next and Qwen3.5 ship.
pub(super) fn hf_ignored(name: &str) -> bool {
    hf_derived(name) || name.starts_with("mtp.") || name.starts_with("model.mtp.")
}

/// The hybrid layers of a Qwen3-Next-style config (Qwen3-Next, Qwen3.5-MoE), named
/// `name`: Qwen3.5's reading (layer kinds, the Gated DeltaNet's sizes) with
/// transformers' defaults where the config is silent (`head_dim` 256, a quarter of it
/// rotated); the experts are the caller's.
pub(super) fn read_hf_hybrid(c: &HfConfig<'_>, name: &str) -> Result<Arch> {
    let mut arch = Qwen3_5.read_hf(c)?;
    arch.name = name.into();
    if c.field("head_dim").is_none() {
        arch.head_dim = DEFAULT_HEAD_DIM;
        arch.attn_scale = 1.0 / (DEFAULT_HEAD_DIM as f32).sqrt();
    }
    let named = c.field("rope_parameters").and_then(|p| p.get("partial_rotary_factor")).is_some_and(|x| !x.is_null())
        || c.field("partial_rotary_factor").is_some();
    arch.rotary_dim = if named {
        c.rotary_dim(arch.head_dim)?
    } else {
        Some((arch.head_dim as f64 * DEFAULT_ROTARY_FACTOR) as usize & !1).filter(|&r| r >= 2 && r < arch.head_dim)
    };
    Ok(arch)
}

/// llama.cpp's `qwen3next` names are `qwen35`'s (`ssm_beta` and `ssm_alpha` read out of
/// `ssm_ba` through [`Unfused`]).
static GGUF: GgufFacts = GgufFacts {
    name: "qwen3next",
    export_as: "qwen3next",
    stacking: Stacking { qkv: false, gate_up: false },
    names: &qwen3_5::GGUF_NAMES,
};

/// Whether llama.cpp renormalises the k routing weights of `qwen3next` files (it does,
/// whatever the file says).
const NORMALIZED_IN_LLAMA_CPP: bool = true;

/// transformers' default rotated share of a head when the config names none.
const DEFAULT_ROTARY_FACTOR: f64 = 0.25;
/// transformers' default head width when the config names none.
const DEFAULT_HEAD_DIM: usize = 256;

/// Which file stores the fused tensors, and so their names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Hf,
    Gguf,
}

/// One parameter-layout tensor read out of a fused stored one: row `i` of `name` is row
/// `rows[i]` of `stored`.
#[derive(Debug, Clone)]
struct Part {
    name: String,
    rows: Vec<usize>,
}

/// The row maps of a linear layer's fused projections (see the module docs):
/// `(qkv, z)` out of `in_proj_qkvz`, and `(b, a)` out of `in_proj_ba`.
fn row_maps(la: &LinearAttention) -> ([Vec<usize>; 2], [Vec<usize>; 2]) {
    let (hk, dk, dv) = (la.k_heads.max(1), la.k_dim, la.v_dim);
    let r = la.v_heads / hk;
    let group = 2 * dk + 2 * r * dv;
    let rows = |offset: usize, width: usize| -> Vec<usize> {
        (0..hk).flat_map(|g| (0..width).map(move |i| g * group + offset + i)).collect()
    };
    let mut qkv = rows(0, dk);
    qkv.extend(rows(dk, dk));
    qkv.extend(rows(2 * dk, r * dv));
    let z = rows(2 * dk + r * dv, r * dv);
    let ba =
        |offset: usize| -> Vec<usize> { (0..hk).flat_map(|g| (0..r).map(move |i| g * 2 * r + offset + i)).collect() };
    ([qkv, z], [ba(0), ba(r)])
}

/// Every fused tensor of `arch`'s linear layers in `format`, with the parts read out of
/// it; `legacy_in`: a GGUF file storing `ssm_in` (HF's `in_proj_qkvz`) rather than
/// `attn_qkv` and `attn_gate`.
fn fusions(arch: &Arch, format: Format, legacy_in: bool) -> Vec<(String, Vec<Part>)> {
    let Some(la) = arch.linear_attention else { return Vec::new() };
    let ([qkv, z], [b, a]) = row_maps(&la);
    let mut out = Vec::new();
    for l in (0..arch.n_layers).filter(|&l| arch.is_linear(l)) {
        let (prefix, qkvz, parts_qkvz, ba, parts_ba) = match format {
            Format::Hf => (
                format!("model.layers.{l}.linear_attn."),
                "in_proj_qkvz.weight",
                ["in_proj_qkv.weight", "in_proj_z.weight"],
                "in_proj_ba.weight",
                ["in_proj_b.weight", "in_proj_a.weight"],
            ),
            Format::Gguf => (
                format!("blk.{l}."),
                "ssm_in.weight",
                ["attn_qkv.weight", "attn_gate.weight"],
                "ssm_ba.weight",
                ["ssm_beta.weight", "ssm_alpha.weight"],
            ),
        };
        let part = |name: &str, rows: &Vec<usize>| Part { name: format!("{prefix}{name}"), rows: rows.clone() };
        if format == Format::Hf || legacy_in {
            out.push((format!("{prefix}{qkvz}"), vec![part(parts_qkvz[0], &qkv), part(parts_qkvz[1], &z)]));
        }
        out.push((format!("{prefix}{ba}"), vec![part(parts_ba[0], &b), part(parts_ba[1], &a)]));
    }
    out
}

/// `t`'s rows `rows` (any storage: whole rows are moved as bytes).
fn gather_rows(name: &str, t: &Tensor, rows: &[usize]) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let [n, cols] = dims[..] else {
        return Err(Error::shape("load", format!("tensor '{name}'"), "2 dims", format!("{dims:?}")));
    };
    let dtype = t.dtype();
    let bytes = t.host_bytes()?;
    let row_bytes = cols / dtype.block_elems() * dtype.block_bytes();
    if !cols.is_multiple_of(dtype.block_elems()) || bytes.len() != n * row_bytes {
        return Err(Error::Io(format!("tensor '{name}': rows of {cols} are not whole {dtype} blocks")));
    }
    if let Some(&bad) = rows.iter().find(|&&r| r >= n) {
        return Err(Error::shape("load", format!("tensor '{name}' rows"), format!("more than {bad}"), n));
    }
    let mut out = Vec::with_capacity(rows.len() * row_bytes);
    for &r in rows {
        out.extend_from_slice(&bytes[r * row_bytes..(r + 1) * row_bytes]);
    }
    Tensor::from_bytes(&out, vec![rows.len(), cols], dtype)
}

/// A checkpoint's tensors with the fused projections of the linear layers read as their
/// parts (see the module docs), and, for GGUF, `ssm_a` back to A_log and the blocks
/// past the model's layers (multi-token prediction) left out.
pub struct Unfused<'a> {
    inner: &'a dyn TensorSource,
    /// Each part's fused tensor and rows in it.
    parts: BTreeMap<String, (String, Vec<usize>)>,
    /// The fused tensors read as parts (not listed themselves).
    fused: Vec<String>,
    format: Format,
    n_layers: usize,
}

impl<'a> Unfused<'a> {
    fn new(arch: &Arch, inner: &'a dyn TensorSource, format: Format) -> Unfused<'a> {
        let legacy_in = format == Format::Gguf && inner.has("blk.0.ssm_in.weight");
        let mut parts = BTreeMap::new();
        let mut fused = Vec::new();
        for (stored, ps) in fusions(arch, format, legacy_in) {
            for p in ps {
                parts.insert(p.name, (stored.clone(), p.rows));
            }
            fused.push(stored);
        }
        Unfused { inner, parts, fused, format, n_layers: arch.n_layers }
    }

    fn is_ssm_a(&self, name: &str) -> bool {
        self.format == Format::Gguf && layer_part(name).is_some_and(|(_, p)| p == "ssm_a")
    }

    fn read(&self, name: &str, mapped: bool) -> Result<Tensor> {
        if let Some((stored, rows)) = self.parts.get(name) {
            return gather_rows(stored, &self.inner.get(stored)?, rows);
        }
        if self.is_ssm_a(name) {
            return a_log_of_ssm_a(name, &self.inner.get(name)?);
        }
        if mapped {
            self.inner.get_mapped(name)
        } else {
            self.inner.get(name)
        }
    }
}

impl TensorSource for Unfused<'_> {
    fn origin(&self) -> String {
        self.inner.origin()
    }
    fn names(&self) -> Vec<String> {
        let beyond = |t: &str| self.format == Format::Gguf && layer_part(t).is_some_and(|(l, _)| l >= self.n_layers);
        let mut names: Vec<String> =
            self.inner.names().into_iter().filter(|t| !self.fused.contains(t) && !beyond(t)).collect();
        names.extend(self.parts.iter().filter(|(_, (stored, _))| self.inner.has(stored)).map(|(p, _)| p.clone()));
        names
    }
    fn has(&self, name: &str) -> bool {
        match self.parts.get(name) {
            Some((stored, _)) => self.inner.has(stored),
            None => self.inner.has(name),
        }
    }
    fn dtype(&self, name: &str) -> Result<DType> {
        if self.is_ssm_a(name) {
            return Ok(DType::F32);
        }
        match self.parts.get(name) {
            Some((stored, _)) => self.inner.dtype(stored),
            None => self.inner.dtype(name),
        }
    }
    fn get(&self, name: &str) -> Result<Tensor> {
        self.read(name, false)
    }
    fn get_mapped(&self, name: &str) -> Result<Tensor> {
        self.read(name, true)
    }
}

/// `tensors` with each fused tensor's parts written back into it (at the first part's
/// place): the inverse of [`Unfused`].
fn fuse(arch: &Arch, format: Format, mut tensors: Vec<ExportTensor>) -> Result<Vec<ExportTensor>> {
    for (stored, parts) in fusions(arch, format, false) {
        let mut rows_total = 0;
        let mut cols = None;
        let mut found = Vec::new();
        for p in &parts {
            let at = tensors.iter().position(|(n, _, _)| *n == p.name).ok_or_else(|| {
                Error::Io(format!("export: '{}' has no part '{}' (a {} model)", stored, p.name, arch.name))
            })?;
            let (_, shape, _) = &tensors[at];
            let [n, c] = shape[..] else {
                return Err(Error::shape("export", format!("tensor '{}'", p.name), "2 dims", format!("{shape:?}")));
            };
            if n != p.rows.len() || cols.is_some_and(|k| k != c) {
                return Err(Error::shape("export", format!("tensor '{}'", p.name), p.rows.len(), n));
            }
            cols = Some(c);
            rows_total += n;
            found.push(at);
        }
        let cols = cols.unwrap_or(0);
        let mut values = vec![0f32; rows_total * cols];
        for (p, &at) in parts.iter().zip(&found) {
            let v = &tensors[at].2;
            for (i, &r) in p.rows.iter().enumerate() {
                values[r * cols..(r + 1) * cols].copy_from_slice(&v[i * cols..(i + 1) * cols]);
            }
        }
        let first = found[0];
        tensors[first] = (stored, vec![rows_total, cols], values);
        let mut rest: Vec<usize> = found[1..].to_vec();
        rest.sort_unstable_by(|a, b| b.cmp(a));
        for at in rest {
            tensors.remove(at);
        }
    }
    Ok(tensors)
}

impl Architecture for Qwen3Next {
    fn name(&self) -> &'static str {
        "qwen3_next"
    }

    fn hf(&self) -> &'static HfFacts {
        &HF
    }

    fn gguf(&self) -> &'static GgufFacts {
        &GGUF
    }

    /// Qwen3.5's reading (layer kinds, the Gated DeltaNet's sizes), transformers'
    /// defaults where the config is silent (`head_dim` 256, a quarter of it rotated), and
    /// the experts: sparse on the `decoder_sparse_step` stride but `mlp_only_layers`,
    /// every MLP dense when `num_experts` is 0.
    fn read_hf(&self, c: &HfConfig<'_>) -> Result<Arch> {
        let mut arch = read_hf_hybrid(c, "qwen3_next")?;
        if c.uint("num_experts")?.unwrap_or(512) > 0 {
            arch.moe = Some(super::qwen3_moe::hf_qwen_moe(c, arch.n_layers, true)?);
        }
        Ok(arch)
    }

    /// As llama.cpp reads `qwen3next`: Qwen3.5's keys without the rope sections, and the
    /// experts (`expert_*`, renormalised).
    fn read_gguf(&self, k: &GgufKeys<'_>) -> Result<Arch> {
        let mut arch = Qwen3_5.read_gguf(k)?;
        arch.name = "qwen3_next".into();
        arch.moe = Some(gguf_moe(k, NORMALIZED_IN_LLAMA_CPP)?.ok_or_else(|| {
            Error::Io(format!("gguf: a qwen3next file without '{}' (its experts)", k.key("expert_count")))
        })?);
        Ok(arch)
    }

    fn write_hf(&self, arch: &Arch, c: &mut HfConfigOut) -> Result<()> {
        Qwen3_5.write_hf(arch, c)?;
        c.model(&HF);
        write_hf_qwen_moe(arch, c, "qwen3_next")
    }

    /// The keys llama.cpp's converter writes for `qwen3next`: the hybrid layers' and the
    /// experts'.
    fn write_gguf(&self, arch: &Arch, m: &mut GgufMetaOut) -> Result<()> {
        qwen3_5::write_gguf_hybrid(arch, m)?;
        write_gguf_moe(arch, m, NORMALIZED_IN_LLAMA_CPP)
    }

    fn hf_source<'a>(&self, arch: &Arch, src: &'a dyn TensorSource) -> Result<Option<Box<dyn TensorSource + 'a>>> {
        Ok(Some(Box::new(Unfused::new(arch, src, Format::Hf))))
    }

    fn gguf_source<'a>(&self, arch: &Arch, file: &'a GgufFile) -> Result<Option<Box<dyn TensorSource + 'a>>> {
        Ok(Some(Box::new(Unfused::new(arch, file, Format::Gguf))))
    }

    /// The Gated DeltaNet's input projections: parts of `in_proj_qkvz` and `in_proj_ba`.
    fn hf_part_of_fused(&self, name: &str) -> bool {
        [".linear.qkv.weight", ".linear.z.weight", ".linear.b.weight", ".linear.a.weight"]
            .iter()
            .any(|part| name.starts_with("h.") && name.ends_with(part))
    }

    fn fuse_for_export(&self, arch: &Arch, gguf: bool, tensors: Vec<ExportTensor>) -> Result<Vec<ExportTensor>> {
        fuse(arch, if gguf { Format::Gguf } else { Format::Hf }, tensors)
    }

    /// `ssm_a` as the converter stores it: −e^{A_log}.
    fn gguf_store(&self, arch: &Arch, name: &str, _shape: &[usize], values: Vec<f32>) -> Result<Vec<f32>> {
        match layer_part(name) {
            Some((l, "ssm_a")) if arch.is_linear(l) => Ok(values.iter().map(|a| -a.exp()).collect()),
            _ => Ok(values),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox::{ComputeBackend, CpuBackend};

    fn la(k_heads: usize, v_heads: usize, k_dim: usize, v_dim: usize) -> LinearAttention {
        LinearAttention { k_heads, v_heads, k_dim, v_dim, conv_kernel: 4 }
    }

    /// transformers' `fix_query_key_value_ordering` with 2 key heads of width 1 and 2
    /// value heads of width 1 per key head: `in_proj_qkvz` rows
    /// `[q0 k0 v0 v1 z0 z1 | q1 k1 v2 v3 z2 z3]`, `in_proj_ba` `[b0 b1 a0 a1 | b2 b3 a2 a3]`.
    #[test]
    fn row_maps_are_transformers_ordering() {
        let ([qkv, z], [b, a]) = row_maps(&la(2, 4, 1, 1));
        assert_eq!(qkv, [0, 6, 1, 7, 2, 3, 8, 9]);
        assert_eq!(z, [4, 5, 10, 11]);
        assert_eq!(b, [0, 1, 4, 5]);
        assert_eq!(a, [2, 3, 6, 7]);
    }

    /// Every stored row is read by exactly one part.
    #[test]
    fn row_maps_cover_the_fused_rows_once() {
        for (hk, hv, dk, dv) in [(1, 1, 4, 4), (2, 4, 8, 6), (3, 6, 2, 5), (4, 4, 3, 3)] {
            let ([qkv, z], [b, a]) = row_maps(&la(hk, hv, dk, dv));
            let mut all: Vec<usize> = qkv.into_iter().chain(z).collect();
            all.sort_unstable();
            assert_eq!(all, (0..2 * hk * dk + 2 * hv * dv).collect::<Vec<_>>());
            let mut all: Vec<usize> = b.into_iter().chain(a).collect();
            all.sort_unstable();
            assert_eq!(all, (0..2 * hv).collect::<Vec<_>>());
        }
    }

    #[test]
    fn gathered_rows_of_a_block_format_are_its_rows() {
        let values: Vec<f32> = (0..6 * 64).map(|i| ((i * 13 % 29) as f32 - 14.0) / 3.0).collect();
        let b = CpuBackend::with_threads(1).unwrap();
        let plain = Tensor::from_vec(values, [6, 64]).unwrap();
        let q = b.to_host(&b.quantize(&plain, DType::Q8_0).unwrap()).unwrap();
        let got = gather_rows("t", &q, &[4, 0, 5]).unwrap();
        assert_eq!(got.dtype(), DType::Q8_0);
        let f32_of = |t: &Tensor| b.to_host(&b.dequantize(t).unwrap()).unwrap().to_vec_f32().unwrap();
        let want = gather_rows("t", &Tensor::from_vec(f32_of(&q), [6, 64]).unwrap(), &[4, 0, 5]).unwrap();
        assert_eq!(f32_of(&got), want.to_vec_f32().unwrap());
        assert!(gather_rows("t", &q, &[6]).is_err());
    }
}
