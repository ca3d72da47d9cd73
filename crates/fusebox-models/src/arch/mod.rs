//! The architectures, one file each. A file holds everything fusebox knows that is
//! specific to its architecture: how a Hugging Face `config.json` and GGUF metadata map
//! onto an [`Arch`] and back, how each format names its tensors, and the block it
//! trains from scratch. Each file implements [`Architecture`] for a unit struct, and
//! [`ARCHITECTURES`] lists them: the one place that names them all. Everything else asks
//! the list ([`by_name`], [`by_hf_model_type`], [`by_gguf_name`]).
//!
//! | arch | norm | MLP | positions | extras |
//! |---|---|---|---|---|
//! | [`gpt2`] | LayerNorm | GELU | learned | biases, Conv1D `[in, out]` weights, fused qkv |
//! | [`llama`] | RMS | SwiGLU | rope (llama3, linear scaling) | GQA, tied or untied |
//! | [`mistral`] | RMS | SwiGLU | rope | sliding window |
//! | [`qwen2`] | RMS | SwiGLU | rope | q/k/v biases |
//! | [`qwen3`] | RMS | SwiGLU | rope | per-head QK-norm, explicit head_dim |
//! | [`phi3`] | RMS | SwiGLU | rope | fused qkv and gate_up |
//! | [`gemma3`] | RMS (1 + w) | GeGLU | rope, local base | pre+post norms, QK-norm, √d embeddings, local/global layers |
//! | [`mixtral`] | RMS | SwiGLU experts | rope | Mistral with experts (softmax, renormalised top-k) |
//! | [`olmoe`] | RMS | SwiGLU experts | rope | experts (softmax top-k), QK-norms over all heads |
//! | [`qwen2_moe`] | RMS | SwiGLU experts + shared expert | rope | q/k/v biases, a sigmoid-gated shared expert |
//! | [`qwen3_moe`] | RMS | SwiGLU experts | rope | Qwen3 with experts (`norm_topk_prob`), dense `mlp_only_layers` |
//! | [`qwen3_5`] | RMS (1 + w) | SwiGLU | rope (partial) | Gated DeltaNet layers beside full attention with an output gate, QK-norm |
//! | [`qwen3_5_moe`] | RMS (1 + w) | SwiGLU experts + shared expert | rope (partial) | Qwen3.5's layers with Qwen3-Next's MLP in every layer |
//! | [`qwen3_next`] | RMS (1 + w) | SwiGLU experts + shared expert | rope (partial) | Qwen3.5's layers with the linear projections fused per key head (`in_proj_qkvz`, `in_proj_ba`) |
//! | [`gpt_oss`] | RMS | clamped SwiGLU experts | rope (YaRN) | attention sinks, biases everywhere, top-k-then-softmax routing, alternating windows |
//!
//! What the files share lives beside them: [`hf`] (reading and writing `config.json`),
//! [`gguf`] (reading and writing `{arch}.*` metadata), [`names`] (tensor names) and
//! [`preset`] (from-scratch configs), and [`moe`] (the experts' keys).

pub mod gemma3;
pub mod gguf;
pub mod gpt2;
pub mod gpt_oss;
pub mod hf;
pub mod llama;
pub mod mistral;
pub mod mixtral;
pub mod moe;
pub mod names;
pub mod olmoe;
pub mod phi3;
pub mod preset;
pub mod qwen2;
pub mod qwen2_moe;
pub mod qwen3;
pub mod qwen3_5;
pub mod qwen3_5_moe;
pub mod qwen3_moe;
pub mod qwen3_next;

use fusebox::{Error, Result};
use serde_json::Value as Json;

pub use gguf::{gguf_llama_like, gguf_llama_like_partial_rope, GgufKeys, GgufMetaOut};
pub use hf::{hf_llama_like, hf_sizes, hf_sliding_window_all, HfConfig, HfConfigOut};
pub use names::{Fix, NameTable, GGUF_NAMES, HF_LLAMA_NAMES, HF_MOE_NAMES};
pub use preset::{ModelConfig, Preset, Style};

use crate::gguf::{GgufFile, Metadata};
use crate::transformer::{Arch, Positions, RopeScaling, Stacking};
use crate::weights::TensorSource;

/// One architecture: everything specific to it, behind one registered unit.
pub trait Architecture: Sync {
    /// fusebox's name: [`Arch::name`] of the models it builds (`llama`, `gemma3`).
    fn name(&self) -> &'static str;

    /// How Hugging Face stores it: `model_type`, class, tensor names.
    fn hf(&self) -> &'static HfFacts;

    /// How llama.cpp stores it: `general.architecture`, stacked tensors.
    fn gguf(&self) -> &'static GgufFacts;

    /// Its [`Arch`] from a `config.json` whose `model_type` is [`HfFacts::model_type`].
    fn read_hf(&self, c: &HfConfig<'_>) -> Result<Arch>;

    /// Its [`Arch`] from GGUF metadata whose `general.architecture` is [`GgufFacts::name`].
    fn read_gguf(&self, k: &GgufKeys<'_>) -> Result<Arch>;

    /// Writes `arch` as a `config.json` that reads back as `arch`: `model_type`, the
    /// class and every field of its own ([`HfConfigOut`] holds the ones every model shares).
    fn write_hf(&self, arch: &Arch, c: &mut HfConfigOut) -> Result<()>;

    /// Writes the `{arch}.*` metadata of `arch` that is not the same for every
    /// architecture ([`gguf::write_common`] writes that); llama.cpp's Llama keys by default.
    fn write_gguf(&self, arch: &Arch, m: &mut GgufMetaOut) -> Result<()> {
        gguf::write_llama_like(arch, m)
    }

    /// A GGUF file's tensors as this architecture's parameters read them, where llama.cpp's
    /// converter stores some in another order or form (Qwen3.5's value heads); `None`
    /// reads them as stored.
    fn gguf_source<'a>(&self, _arch: &Arch, _file: &'a GgufFile) -> Result<Option<Box<dyn TensorSource + 'a>>> {
        Ok(None)
    }

    /// The values GGUF tensor `name` (stored shape `shape`) holds, from `values`, the
    /// values of the parameter it stores already in that shape: the inverse of
    /// [`gguf_source`](Self::gguf_source); by default unchanged.
    fn gguf_store(&self, _arch: &Arch, _name: &str, _shape: &[usize], values: Vec<f32>) -> Result<Vec<f32>> {
        Ok(values)
    }

    /// A Hugging Face checkpoint's tensors as this architecture's parameters read them,
    /// where the checkpoint fuses some in an order of its own (Qwen3-Next's
    /// `in_proj_qkvz`); `None` reads them as stored.
    fn hf_source<'a>(&self, _arch: &Arch, _src: &'a dyn TensorSource) -> Result<Option<Box<dyn TensorSource + 'a>>> {
        Ok(None)
    }

    /// The tensors an export writes (`(name, stored shape, values)`, in layout order) from
    /// those its name table names: the inverse of [`hf_source`](Self::hf_source) (`gguf`
    /// false) or [`gguf_source`](Self::gguf_source) (`gguf` true) where those split a
    /// stored tensor into several; by default unchanged.
    fn fuse_for_export(&self, _arch: &Arch, _gguf: bool, tensors: Vec<ExportTensor>) -> Result<Vec<ExportTensor>> {
        Ok(tensors)
    }

    /// Whether fusebox parameter `name` is one part of a tensor the Hugging Face checkpoint
    /// fuses in an order of its own (what [`hf_source`](Self::hf_source) splits: Qwen3-Next's
    /// `in_proj_qkvz`), so that no Hugging Face module, nor a PEFT adapter, holds it alone;
    /// by default none is.
    fn hf_part_of_fused(&self, _name: &str) -> bool {
        false
    }

    /// The multimodal checkpoint that publishes this text model inside a wrapper of its
    /// own (`qwen3_5` around `qwen3_5_text`), if one does: read text only.
    fn hf_wrapper(&self) -> Option<&'static HfWrapper> {
        None
    }

    /// The tensor names of a checkpoint that holds the tensors `has` finds (named as the
    /// text model names them): [`HfFacts::names`], unless the architecture is published
    /// in more than one layout (Qwen3.5-MoE's experts, per expert or fused).
    fn hf_names(&self, _has: &dyn Fn(&str) -> bool) -> &'static NameTable {
        self.hf().names
    }

    /// The from-scratch preset, for the architectures `fusebox train` builds.
    fn preset(&self) -> Option<&'static Preset> {
        None
    }
}

/// A tensor as an export writes it: its file name, stored shape and values.
pub type ExportTensor = (String, Vec<usize>, Vec<f32>);

impl std::fmt::Debug for dyn Architecture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Architecture({})", self.name())
    }
}

/// Every architecture fusebox runs, in the order errors list them (one a line, so
/// adding one is a one-line diff).
#[rustfmt::skip]
pub static ARCHITECTURES: &[&dyn Architecture] = &[
    &gpt2::Gpt2,
    &llama::Llama,
    &mistral::Mistral,
    &mixtral::Mixtral,
    &qwen2::Qwen2,
    &qwen2_moe::Qwen2Moe,
    &qwen3::Qwen3,
    &qwen3_moe::Qwen3Moe,
    &qwen3_5::Qwen3_5,
    &qwen3_5_moe::Qwen3_5Moe,
    &qwen3_next::Qwen3Next,
    &olmoe::Olmoe,
    &gpt_oss::GptOss,
    &phi3::Phi3,
    &gemma3::Gemma3,
];

/// How Hugging Face stores an architecture.
#[derive(Debug)]
pub struct HfFacts {
    /// `config.json`'s `model_type`.
    pub model_type: &'static str,
    /// The transformers class (`config.json`'s `architectures`).
    pub class: &'static str,
    /// The checkpoint's tensor names; PEFT's module names are these without `.weight`.
    pub names: &'static NameTable,
    /// Which groups the checkpoint stores as one matrix.
    pub stacking: Stacking,
    /// Tensors a checkpoint may hold that are derived here (rotary `inv_freq`, mask buffers).
    pub ignored: fn(&str) -> bool,
    /// Written before every tensor name on export (GPT-2's `transformer.`).
    pub export_prefix: &'static str,
}

impl HfFacts {
    /// The facts of the Llama family (`LlamaForCausalLM` and the models written as its
    /// diff); an architecture fills in its `model_type` and class.
    pub const LLAMA_LIKE: HfFacts = HfFacts {
        model_type: "",
        class: "",
        names: &HF_LLAMA_NAMES,
        stacking: Stacking { qkv: false, gate_up: false },
        ignored: names::hf_derived,
        export_prefix: "",
    };
}

/// A multimodal Hugging Face checkpoint around a text model (Qwen3.5's
/// `Qwen3_5ForConditionalGeneration`): its `config.json` nests the text model's config
/// under `text_config` (beside a `vision_config`), and its tensors hold the text model's
/// `model.*` under `model.language_model.*` beside the vision tower's. fusebox runs the
/// text model alone; the other parts' tensors are left unread, and a loader says so.
#[derive(Debug)]
pub struct HfWrapper {
    /// The wrapper's `model_type` (`qwen3_5`).
    pub model_type: &'static str,
    /// Its transformers class (`Qwen3_5ForConditionalGeneration`).
    pub class: &'static str,
    /// Where it keeps the text model's tensors: `(text model's prefix, wrapper's)`,
    /// `("model.", "model.language_model.")`; names without the prefix (`lm_head.weight`)
    /// are the same in both.
    pub text_prefix: (&'static str, &'static str),
    /// The parts a text-only run leaves out: `(tensor name prefix, what it is)`,
    /// `("model.visual.", "vision tower")`.
    pub skipped: &'static [(&'static str, &'static str)],
}

impl HfWrapper {
    /// The text model's name of wrapper tensor `name`; `None` for a tensor of a part
    /// left out.
    pub fn text_name(&self, name: &str) -> Option<String> {
        if self.skipped.iter().any(|(p, _)| name.starts_with(p)) {
            return None;
        }
        let (text, wrapped) = self.text_prefix;
        Some(match name.strip_prefix(wrapped) {
            Some(rest) => format!("{text}{rest}"),
            None => name.to_string(),
        })
    }

    /// The wrapper's name of text model tensor `name`, where the wrapper moves it.
    pub fn wrapped_name(&self, name: &str) -> String {
        let (text, wrapped) = self.text_prefix;
        match name.strip_prefix(text) {
            Some(rest) => format!("{wrapped}{rest}"),
            None => name.to_string(),
        }
    }

    /// What a text-only load of a checkpoint holding tensors `names` leaves out, for a
    /// notice: `text only: the vision tower (model.visual.*, 21 tensors) is not loaded`;
    /// `None` when it holds none of those parts.
    pub fn skipped_notice<'n>(&self, names: impl Iterator<Item = &'n str>) -> Option<String> {
        let mut counts = vec![0usize; self.skipped.len()];
        for n in names {
            if let Some(i) = self.skipped.iter().position(|(p, _)| n.starts_with(p)) {
                counts[i] += 1;
            }
        }
        let parts: Vec<String> = self
            .skipped
            .iter()
            .zip(&counts)
            .filter(|(_, &c)| c > 0)
            .map(|((p, what), c)| format!("the {what} ({p}*, {c} tensors)"))
            .collect();
        (!parts.is_empty()).then(|| format!("text only: {} not loaded", parts.join(", ")))
    }
}

/// How llama.cpp stores an architecture.
#[derive(Debug)]
pub struct GgufFacts {
    /// `general.architecture` of the files it reads, and the `{arch}.` key prefix.
    pub name: &'static str,
    /// `general.architecture` an export writes (llama.cpp runs Mistral weights as `llama`).
    pub export_as: &'static str,
    /// Which groups the file stores as one matrix.
    pub stacking: Stacking,
    /// The tensor names ([`GGUF_NAMES`], which llama.cpp uses for nearly every architecture).
    pub names: &'static NameTable,
}

impl GgufFacts {
    /// An architecture llama.cpp stores under its own `name`, nothing stacked.
    pub const fn named(name: &'static str) -> GgufFacts {
        GgufFacts { name, export_as: name, stacking: Stacking { qkv: false, gate_up: false }, names: &GGUF_NAMES }
    }
}

fn supported(f: impl Fn(&dyn Architecture) -> &'static str) -> String {
    ARCHITECTURES.iter().map(|a| f(*a)).collect::<Vec<_>>().join(", ")
}

fn find(f: impl Fn(&dyn Architecture) -> bool) -> Option<&'static dyn Architecture> {
    ARCHITECTURES.iter().copied().find(|a| f(*a))
}

/// The architecture fusebox calls `name` ([`Arch::name`]).
pub fn by_name(name: &str) -> Result<&'static dyn Architecture> {
    find(|a| a.name() == name).ok_or_else(|| {
        Error::unsupported(
            "architecture",
            format!("'{name}' is not one fusebox runs (supported: {})", supported(|a| a.name())),
        )
    })
}

/// The architecture of a Hugging Face `model_type`: a text model's, or that of the
/// multimodal wrapper it is published in ([`Architecture::hf_wrapper`]).
pub fn by_hf_model_type(model_type: &str) -> Result<&'static dyn Architecture> {
    find(|a| a.hf().model_type == model_type || a.hf_wrapper().is_some_and(|w| w.model_type == model_type)).ok_or_else(
        || {
            Error::unsupported(
                "config.json",
                format!("model_type '{model_type}' is not supported (supported: {})", hf_model_types()),
            )
        },
    )
}

/// The architecture of a GGUF `general.architecture`.
pub fn by_gguf_name(name: &str) -> Result<&'static dyn Architecture> {
    find(|a| a.gguf().name == name).ok_or_else(|| {
        Error::unsupported(
            "gguf",
            format!("architecture '{name}' is not supported (supported: {})", supported(|a| a.gguf().name)),
        )
    })
}

/// The `model_type`s with an architecture here (and the wrappers read text only), for
/// messages.
pub fn hf_model_types() -> String {
    let wrappers = ARCHITECTURES.iter().filter_map(|a| a.hf_wrapper()).map(|w| w.model_type);
    ARCHITECTURES.iter().map(|a| a.hf().model_type).chain(wrappers).collect::<Vec<_>>().join(", ")
}

/// The tensors a checkpoint holds, as far as building its plan needs them.
pub struct FileTensors<'a> {
    /// How many tensors it holds. Every layer has tensors of its own, so a layer count
    /// from the metadata past this is refused before it sizes anything.
    pub count: usize,
    /// Whether it holds tensor `name` (as the file names it).
    pub has: &'a dyn Fn(&str) -> bool,
}

/// Everything needed to load a checkpoint's tensors into an [`Arch`].
#[derive(Debug)]
pub struct Plan {
    /// The architecture.
    pub arch: Arch,
    /// The file's tensor names.
    pub names: &'static NameTable,
    /// Prepended to every file name (GPT-2 exports with `transformer.`).
    pub prefix: String,
    /// Which groups the file stores as one matrix.
    pub file_stacking: Stacking,
    /// Tensors the file may hold that are derived here (rotary `inv_freq`, mask buffers).
    pub ignored: fn(&str) -> bool,
    /// The multimodal wrapper the checkpoint is, when it is one: its tensors are read
    /// under the text model's names ([`HfWrapper::text_name`]), the other parts' left out.
    pub wrapper: Option<&'static HfWrapper>,
}

/// The plan for a Hugging Face checkpoint of `config.json` `v` holding `file`'s tensors;
/// an unknown `model_type` is refused naming it and the supported ones. A multimodal
/// wrapper ([`HfWrapper`]) is planned as its text model.
pub fn hf_plan(v: &Json, file: &FileTensors<'_>) -> Result<Plan> {
    let c = HfConfig::new(v, file.count);
    let model_type = c.model_type()?;
    let unit = by_hf_model_type(model_type)?;
    let hf = unit.hf();
    let wrapper = unit.hf_wrapper().filter(|w| w.model_type == model_type);
    let arch = match wrapper {
        None => unit.read_hf(&c)?,
        Some(w) => unit.read_hf(&HfConfig::new(&hf::text_config(v, w, hf.model_type)?, file.count))?,
    };
    arch.validate()?;
    let has_text = |name: &str| (file.has)(name) || wrapper.is_some_and(|w| (file.has)(&w.wrapped_name(name)));
    let names = unit.hf_names(&has_text);
    Ok(Plan { arch, names, prefix: String::new(), file_stacking: hf.stacking, ignored: hf.ignored, wrapper })
}

fn ignore_none(_: &str) -> bool {
    false
}

/// The plan for a GGUF file from its metadata; `vocab_from_tokens` is the tokenizer's
/// size, used when `{arch}.vocab_size` is absent; `file` tells which optional tensors
/// (an untied `output.weight`, `rope_freqs.weight`) the file holds, and `rope_freqs`
/// reads the Llama 3 frequency factors.
pub fn gguf_plan(
    meta: &Metadata,
    vocab_from_tokens: Option<usize>,
    file: &FileTensors<'_>,
    rope_freqs: &dyn Fn() -> Result<Vec<f32>>,
) -> Result<Plan> {
    let name = meta.require_str("general.architecture")?;
    let unit = by_gguf_name(name)?;
    let k = GgufKeys { meta, arch: name.to_string(), vocab_from_tokens, tensors: file.count };
    let mut arch = unit.read_gguf(&k)?;
    arch.tied_embeddings = !(file.has)("output.weight");
    let mut ignored: fn(&str) -> bool = ignore_none;
    if (file.has)("rope_freqs.weight") {
        if arch.positions != Positions::Rope {
            return Err(Error::Io(format!("gguf: rope_freqs.weight in a {name} model, which has no rope")));
        }
        arch.rope.scaling = RopeScaling::FreqFactors(rope_freqs()?);
        ignored = |n| n == "rope_freqs.weight";
    }
    arch.validate()?;
    let gguf = unit.gguf();
    Ok(Plan { arch, names: gguf.names, prefix: String::new(), file_stacking: gguf.stacking, ignored, wrapper: None })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transformer::Mlp;
    use fusebox::RopeStyle;
    use serde_json::json;

    fn plan(v: &Json) -> Result<Plan> {
        hf_plan(v, &FileTensors { count: 1000, has: &|_| false })
    }

    /// SmolLM2-135M's config as transformers 4 writes it (`rope_theta`, `rope_scaling`).
    fn smollm2_hf() -> Json {
        json!({
            "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
            "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
            "tie_word_embeddings": true, "rope_scaling": null, "hidden_act": "silu"
        })
    }

    #[test]
    fn every_unit_is_found_by_each_of_its_names() {
        for unit in ARCHITECTURES {
            assert_eq!(by_name(unit.name()).unwrap().name(), unit.name());
            assert_eq!(by_hf_model_type(unit.hf().model_type).unwrap().name(), unit.name());
            assert_eq!(by_gguf_name(unit.gguf().name).unwrap().name(), unit.name());
            assert!(
                by_gguf_name(unit.gguf().export_as).is_ok(),
                "{}: exports as an architecture it reads",
                unit.name()
            );
        }
        let e = by_name("falcon").unwrap_err().to_string();
        assert!(
            e.contains("falcon")
                && e.contains(
                    "gpt2, llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, qwen3_5, qwen3_5_moe, qwen3_next, olmoe, \
                     gpt_oss, \
                     phi3, gemma3"
                ),
            "{e}"
        );
    }

    #[test]
    fn transformers4_config_reads_sizes_and_defaults() {
        let a = plan(&smollm2_hf()).unwrap().arch;
        assert_eq!((a.d_model, a.n_heads, a.n_kv_heads, a.head_dim, a.n_layers), (576, 9, 3, 64, 30));
        assert_eq!(
            (a.rope.style, a.rope.scaling.clone(), a.tied_embeddings),
            (RopeStyle::HalfSplit, RopeScaling::None, true)
        );
        let f = a.rope.frequencies(a.head_dim);
        assert_eq!(f.len(), 32);
        assert_eq!(f[0], 1.0);
        assert!((f[1] - 100000f64.powf(-2.0 / 64.0)).abs() < 1e-15);
    }

    #[test]
    fn unsupported_configs_are_named() {
        let mut v = smollm2_hf();
        v["model_type"] = json!("falcon");
        assert!(plan(&v).unwrap_err().to_string().contains("falcon"));
        let mut v = smollm2_hf();
        v["rope_scaling"] = json!({"rope_type": "longrope", "factor": 4.0});
        assert!(plan(&v).unwrap_err().to_string().contains("longrope"));
        let mut v = smollm2_hf();
        v["num_attention_heads"] = json!(0);
        assert!(plan(&v).is_err());
        let mut v = smollm2_hf();
        v["num_key_value_heads"] = json!(2);
        assert!(plan(&v).is_err());
    }

    #[test]
    fn a_layer_count_past_the_tensors_present_is_refused_before_it_sizes_anything() {
        let e = hf_plan(&smollm2_hf(), &FileTensors { count: 29, has: &|_| false }).unwrap_err().to_string();
        assert!(e.contains("num_hidden_layers") && e.contains("29 tensors") && e.contains("30"), "{e}");
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let mut v = smollm2_hf();
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        v["rope_theta"] = json!(500000.0);
        let a = plan(&v).unwrap().arch;
        let f = a.rope.frequencies(a.head_dim);
        let plain = |i: usize| 500000f64.powf(-2.0 * i as f64 / 64.0);
        assert_eq!(f[0], plain(0));
        assert!((f[31] - plain(31) / 8.0).abs() < 1e-18);
    }

    #[test]
    fn gemma3_transformers4_config_has_local_layers_with_their_own_base() {
        let v = json!({
            "model_type": "gemma3_text", "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0, "sliding_window": 512, "sliding_window_pattern": 6,
            "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh",
            "final_logit_softcapping": null, "attn_logit_softcapping": null, "rope_scaling": null
        });
        let a = plan(&v).unwrap().arch;
        let global: Vec<usize> = (0..18).filter(|&l| a.window(l).is_none()).collect();
        assert_eq!(global, [5, 11, 17]);
        assert_eq!((a.rope_of(0).theta, a.rope_of(5).theta, a.window(0)), (10_000.0, 1_000_000.0, Some(512)));
        assert!(a.tied_embeddings && a.post_norms && a.qk_norm && a.mlp == Mlp::GeGlu);
        assert_eq!(a.attn_scale, 1.0 / 16.0);
    }
}
