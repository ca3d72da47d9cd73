//! The architectures, one small file each: how its Hugging Face `config.json` and its
//! GGUF metadata map onto an [`Arch`], and how the files name its tensors. What they
//! share (the config readers, the llama.cpp tensor names) is here.
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

pub mod gemma3;
pub mod gpt2;
pub mod llama;
pub mod mistral;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;

use fusebox::{Error, Result, RopeStyle};
use serde_json::Value as Json;

use crate::gguf::Metadata;
use crate::transformer::{Arch, Biases, LayerAttention, Mlp, NormKind, Positions, Rope, RopeScaling, Stacking};

/// HF `model_type`s with an architecture here.
pub const HF_MODEL_TYPES: &[&str] = &["gpt2", "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text"];
/// GGUF `general.architecture`s with an architecture here.
pub const GGUF_ARCHITECTURES: &[&str] = &["gpt2", "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3"];

/// A change a file's tensor needs on its way to fusebox's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fix {
    /// As stored.
    None,
    /// Stored `[in, out]` (GPT-2's `Conv1D`): transposed to `[out, in]`.
    Transpose,
    /// A Gemma `(1 + w)` norm weight stored as `w`: 1 is added.
    PlusOne,
}

/// How a file names fusebox's parameters: `(fusebox name, file name, fix)` pairs for
/// the per-layer tensors (after `h.{l}.` / `{layer_prefix}{l}.`) and the global ones.
#[derive(Debug)]
pub struct NameTable {
    /// The file's layer prefix (`model.layers.`, `blk.`, `h.`).
    pub layer_prefix: &'static str,
    /// Per-layer names.
    pub layer: &'static [(&'static str, &'static str, Fix)],
    /// Global names.
    pub global: &'static [(&'static str, &'static str, Fix)],
}

impl NameTable {
    /// The file's name of fusebox parameter `name`, and its fix.
    pub fn file_name(&self, name: &str) -> Option<(String, Fix)> {
        if let Some(rest) = name.strip_prefix("h.") {
            let (l, part) = rest.split_once('.')?;
            let (_, file, fix) = self.layer.iter().find(|(ours, _, _)| *ours == part)?;
            return Some((format!("{}{l}.{file}", self.layer_prefix), *fix));
        }
        self.global.iter().find(|(ours, _, _)| *ours == name).map(|(_, file, fix)| (file.to_string(), *fix))
    }
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
}

fn ignore_none(_: &str) -> bool {
    false
}

/// The llama.cpp tensor names (`llama-arch.cpp`), the same for every architecture here.
pub static GGUF_NAMES: NameTable = NameTable {
    layer_prefix: "blk.",
    layer: &[
        ("norm1.weight", "attn_norm.weight", Fix::None),
        ("norm1.bias", "attn_norm.bias", Fix::None),
        ("attn.q.weight", "attn_q.weight", Fix::None),
        ("attn.q.bias", "attn_q.bias", Fix::None),
        ("attn.k.weight", "attn_k.weight", Fix::None),
        ("attn.k.bias", "attn_k.bias", Fix::None),
        ("attn.v.weight", "attn_v.weight", Fix::None),
        ("attn.v.bias", "attn_v.bias", Fix::None),
        ("attn.qkv.weight", "attn_qkv.weight", Fix::None),
        ("attn.qkv.bias", "attn_qkv.bias", Fix::None),
        ("attn.q_norm.weight", "attn_q_norm.weight", Fix::None),
        ("attn.k_norm.weight", "attn_k_norm.weight", Fix::None),
        ("attn.o.weight", "attn_output.weight", Fix::None),
        ("attn.o.bias", "attn_output.bias", Fix::None),
        ("post_attn_norm.weight", "post_attention_norm.weight", Fix::None),
        ("norm2.weight", "ffn_norm.weight", Fix::None),
        ("norm2.bias", "ffn_norm.bias", Fix::None),
        ("mlp.gate.weight", "ffn_gate.weight", Fix::None),
        ("mlp.up.weight", "ffn_up.weight", Fix::None),
        ("mlp.gate_up.weight", "ffn_up.weight", Fix::None),
        ("mlp.down.weight", "ffn_down.weight", Fix::None),
        ("mlp.fc.weight", "ffn_up.weight", Fix::None),
        ("mlp.fc.bias", "ffn_up.bias", Fix::None),
        ("mlp.proj.weight", "ffn_down.weight", Fix::None),
        ("mlp.proj.bias", "ffn_down.bias", Fix::None),
        ("post_mlp_norm.weight", "post_ffw_norm.weight", Fix::None),
    ],
    global: &[
        ("wte", "token_embd.weight", Fix::None),
        ("wpe", "position_embd.weight", Fix::None),
        ("norm_f.weight", "output_norm.weight", Fix::None),
        ("norm_f.bias", "output_norm.bias", Fix::None),
        ("lm_head.weight", "output.weight", Fix::None),
    ],
};

/// The HF names of the Llama family (`LlamaForCausalLM` and the models written as its diff).
pub static HF_LLAMA_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.",
    layer: &[
        ("norm1.weight", "input_layernorm.weight", Fix::None),
        ("attn.q.weight", "self_attn.q_proj.weight", Fix::None),
        ("attn.q.bias", "self_attn.q_proj.bias", Fix::None),
        ("attn.k.weight", "self_attn.k_proj.weight", Fix::None),
        ("attn.k.bias", "self_attn.k_proj.bias", Fix::None),
        ("attn.v.weight", "self_attn.v_proj.weight", Fix::None),
        ("attn.v.bias", "self_attn.v_proj.bias", Fix::None),
        ("attn.q_norm.weight", "self_attn.q_norm.weight", Fix::None),
        ("attn.k_norm.weight", "self_attn.k_norm.weight", Fix::None),
        ("attn.o.weight", "self_attn.o_proj.weight", Fix::None),
        ("attn.o.bias", "self_attn.o_proj.bias", Fix::None),
        ("norm2.weight", "post_attention_layernorm.weight", Fix::None),
        ("mlp.gate.weight", "mlp.gate_proj.weight", Fix::None),
        ("mlp.gate.bias", "mlp.gate_proj.bias", Fix::None),
        ("mlp.up.weight", "mlp.up_proj.weight", Fix::None),
        ("mlp.up.bias", "mlp.up_proj.bias", Fix::None),
        ("mlp.down.weight", "mlp.down_proj.weight", Fix::None),
        ("mlp.down.bias", "mlp.down_proj.bias", Fix::None),
    ],
    global: &[
        ("wte", "model.embed_tokens.weight", Fix::None),
        ("norm_f.weight", "model.norm.weight", Fix::None),
        ("lm_head.weight", "lm_head.weight", Fix::None),
    ],
};

/// A derived buffer some HF exports keep (recomputed from the config here).
fn hf_ignored(name: &str) -> bool {
    name.ends_with(".rotary_emb.inv_freq")
}

/// The plan for a Hugging Face checkpoint of `config.json` `v`; an unknown
/// `model_type` is refused naming it and the supported ones.
pub fn hf_plan(v: &Json) -> Result<Plan> {
    let c = HfConfig(v);
    let model_type = c.model_type()?;
    let llama_names = |arch: Arch| Plan {
        arch,
        names: &HF_LLAMA_NAMES,
        prefix: String::new(),
        file_stacking: Stacking::default(),
        ignored: hf_ignored,
    };
    match model_type {
        "llama" => Ok(llama_names(llama::hf(&c)?)),
        "mistral" => Ok(llama_names(mistral::hf(&c)?)),
        "qwen2" => Ok(llama_names(qwen2::hf(&c)?)),
        "qwen3" => Ok(llama_names(qwen3::hf(&c)?)),
        "phi3" => phi3::hf_plan(&c),
        "gemma3_text" => gemma3::hf_plan(&c),
        "gpt2" => gpt2::hf_plan(&c),
        other => Err(Error::unsupported(
            "config.json",
            format!("model_type '{other}' is not supported (supported: {})", HF_MODEL_TYPES.join(", ")),
        )),
    }
}

/// The plan for a GGUF file from its metadata; `vocab_from_tokens` is the tokenizer's
/// size, used when `{arch}.vocab_size` is absent; `has_tensor` tells which optional
/// tensors (an untied `output.weight`, `rope_freqs.weight`) the file holds, and
/// `rope_freqs` reads the Llama 3 frequency factors.
pub fn gguf_plan(
    meta: &Metadata,
    vocab_from_tokens: Option<usize>,
    has_tensor: &dyn Fn(&str) -> bool,
    rope_freqs: &dyn Fn() -> Result<Vec<f32>>,
) -> Result<Plan> {
    let name = meta.require_str("general.architecture")?.to_string();
    let k = GgufKeys { meta, arch: name.clone(), vocab_from_tokens };
    let (mut arch, file_stacking) = match name.as_str() {
        "llama" | "mistral" => (llama::gguf(&k)?, Stacking::default()),
        "qwen2" => (qwen2::gguf(&k)?, Stacking::default()),
        "qwen3" => (qwen3::gguf(&k)?, Stacking::default()),
        "phi3" => (phi3::gguf(&k)?, Stacking { qkv: true, gate_up: true }),
        "gemma3" => (gemma3::gguf(&k)?, Stacking::default()),
        "gpt2" => (gpt2::gguf(&k)?, Stacking { qkv: true, gate_up: false }),
        other => {
            return Err(Error::unsupported(
                "gguf",
                format!("architecture '{other}' is not supported (supported: {})", GGUF_ARCHITECTURES.join(", ")),
            ))
        }
    };
    arch.tied_embeddings = !has_tensor("output.weight");
    let mut ignored: fn(&str) -> bool = ignore_none;
    if has_tensor("rope_freqs.weight") {
        if arch.positions != Positions::Rope {
            return Err(Error::Io(format!("gguf: rope_freqs.weight in a {name} model, which has no rope")));
        }
        arch.rope.scaling = RopeScaling::FreqFactors(rope_freqs()?);
        ignored = |n| n == "rope_freqs.weight";
    }
    arch.validate()?;
    Ok(Plan { arch, names: &GGUF_NAMES, prefix: String::new(), file_stacking, ignored })
}

/// Typed, error-naming access to a Hugging Face `config.json`.
pub struct HfConfig<'a>(pub &'a Json);

fn io(msg: impl Into<String>) -> Error {
    Error::Io(msg.into())
}

impl HfConfig<'_> {
    /// `model_type`, required.
    pub fn model_type(&self) -> Result<&str> {
        match self.0.get("model_type") {
            Some(Json::String(s)) => Ok(s.as_str()),
            None | Some(Json::Null) => {
                Err(io(format!("config.json: missing 'model_type' (expected one of: {})", HF_MODEL_TYPES.join(", "))))
            }
            Some(other) => Err(io(format!("config.json: 'model_type': expected a string, found {other}"))),
        }
    }

    /// The field, absent when missing or null.
    pub fn field(&self, name: &str) -> Option<&Json> {
        self.0.get(name).filter(|x| !x.is_null())
    }

    /// An optional non-negative integer.
    pub fn uint(&self, name: &str) -> Result<Option<usize>> {
        self.field(name)
            .map(|x| {
                x.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| io(format!("config.json: '{name}': expected a non-negative integer, found {x}")))
            })
            .transpose()
    }

    /// A required integer > 0.
    pub fn size(&self, name: &str) -> Result<usize> {
        match self.uint(name)? {
            None => Err(io(format!("config.json: missing '{name}'"))),
            Some(0) => Err(Error::value("config.json", format!("'{name}'"), "> 0", 0)),
            Some(v) => Ok(v),
        }
    }

    /// An optional number.
    pub fn float(&self, name: &str) -> Result<Option<f64>> {
        self.field(name)
            .map(|x| x.as_f64().ok_or_else(|| io(format!("config.json: '{name}': expected a number, found {x}"))))
            .transpose()
    }

    /// An optional boolean.
    pub fn flag(&self, name: &str) -> Result<Option<bool>> {
        self.field(name)
            .map(|x| x.as_bool().ok_or_else(|| io(format!("config.json: '{name}': expected a boolean, found {x}"))))
            .transpose()
    }

    /// An optional string.
    pub fn string(&self, name: &str) -> Result<Option<&str>> {
        self.field(name)
            .map(|x| x.as_str().ok_or_else(|| io(format!("config.json: '{name}': expected a string, found {x}"))))
            .transpose()
    }

    /// Refuses `name` unless it is absent or one of `allowed`.
    pub fn require_one_of(&self, name: &str, default: &str, allowed: &[&str]) -> Result<()> {
        let v = self.string(name)?.unwrap_or(default);
        if allowed.contains(&v) {
            Ok(())
        } else {
            Err(Error::unsupported(
                "config.json",
                format!("{name} '{v}' is not supported here (supported: {})", allowed.join(", ")),
            ))
        }
    }

    /// Refuses a field that is present and not null (an option this model cannot run).
    pub fn refuse(&self, name: &str) -> Result<()> {
        match self.field(name) {
            None => Ok(()),
            Some(v) => Err(Error::unsupported("config.json", format!("'{name}' = {v} is not supported"))),
        }
    }

    /// The rope of `config.json`: `rope_theta` and `rope_scaling` (transformers 4), or
    /// `rope_parameters` (transformers 5; `key` picks an entry of a per-layer-type dict).
    pub fn rope(&self, key: Option<&str>, default_theta: f64) -> Result<Rope> {
        let params = match (self.field("rope_parameters"), key) {
            (Some(p), Some(k)) if p.get(k).is_some() => p.get(k),
            (Some(p), _) => Some(p),
            (None, _) => None,
        };
        let theta = match params.and_then(|p| p.get("rope_theta")) {
            Some(t) => t.as_f64().ok_or_else(|| io(format!("config.json: rope_parameters.rope_theta: found {t}")))?,
            None => self.float("rope_theta")?.unwrap_or(default_theta),
        };
        let scaling = match params {
            Some(p) => rope_scaling(Some(p))?,
            None => rope_scaling(self.field("rope_scaling"))?,
        };
        Ok(Rope { theta, scaling, style: RopeStyle::HalfSplit })
    }

    /// `layer_types` (`full_attention` / `sliding_attention` per layer) when present.
    pub fn layer_types(&self, n_layers: usize) -> Result<Option<Vec<LayerAttention>>> {
        let Some(v) = self.field("layer_types") else { return Ok(None) };
        let list = v.as_array().ok_or_else(|| io(format!("config.json: 'layer_types': expected a list, found {v}")))?;
        if list.len() != n_layers {
            return Err(Error::value(
                "config.json",
                "'layer_types'",
                format!("{n_layers} entries (num_hidden_layers)"),
                list.len(),
            ));
        }
        list.iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(LayerAttention::Global),
                Some("sliding_attention") => Ok(LayerAttention::Local),
                _ => Err(Error::unsupported("config.json", format!("layer_types entry {t} is not supported"))),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// `rope_scaling` (or `rope_parameters`): none, `default`, `linear` or `llama3`.
fn rope_scaling(v: Option<&Json>) -> Result<RopeScaling> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(RopeScaling::None) };
    let kind = match v.get("rope_type").or_else(|| v.get("type")) {
        Some(Json::String(s)) => s.as_str(),
        None => "default",
        Some(other) => {
            return Err(io(format!("config.json: rope_scaling: expected a string 'rope_type', found {other}")));
        }
    };
    let num = |name: &str| -> Result<f64> {
        v.get(name)
            .and_then(Json::as_f64)
            .ok_or_else(|| io(format!("config.json: rope_scaling ({kind}) lacks the number '{name}'")))
    };
    if let Some(f) = v.get("partial_rotary_factor").and_then(Json::as_f64) {
        if f != 1.0 {
            return Err(Error::unsupported("config.json", format!("partial_rotary_factor {f} (only 1.0)")));
        }
    }
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor: num("factor")? }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_positions: num("original_max_position_embeddings")?,
        }),
        other => Err(Error::unsupported(
            "config.json",
            format!("rope_scaling type '{other}' is not supported (supported: linear, llama3)"),
        )),
    }
}

/// The Llama-shaped description of an HF config (RMS norms, SwiGLU, half-split rope,
/// GQA, biases as `attention_bias` / `mlp_bias` say); each architecture edits it.
pub fn hf_llama_like(c: &HfConfig<'_>, name: &str, default_eps: f64) -> Result<Arch> {
    c.require_one_of("hidden_act", "silu", &["silu"])?;
    hf_sizes(c, name, default_eps)
}

/// [`hf_llama_like`] without the activation check (for architectures whose MLP differs).
pub fn hf_sizes(c: &HfConfig<'_>, name: &str, default_eps: f64) -> Result<Arch> {
    let d_model = c.size("hidden_size")?;
    let n_heads = c.size("num_attention_heads")?;
    let head_dim = match c.uint("head_dim")? {
        Some(0) => return Err(Error::value("config.json", "'head_dim'", "> 0", 0)),
        Some(h) => h,
        None if d_model.is_multiple_of(n_heads) => d_model / n_heads,
        None => {
            return Err(Error::value(
                "config.json",
                "'num_attention_heads'",
                format!("a divisor of 'hidden_size' = {d_model} (or an explicit 'head_dim')"),
                n_heads,
            ))
        }
    };
    let n_kv_heads = match c.uint("num_key_value_heads")? {
        Some(0) => return Err(Error::value("config.json", "'num_key_value_heads'", "> 0", 0)),
        Some(k) => k,
        None => n_heads,
    };
    let n_layers = c.size("num_hidden_layers")?;
    let attn_bias = c.flag("attention_bias")?.unwrap_or(false);
    let mlp_bias = c.flag("mlp_bias")?.unwrap_or(false);
    Ok(Arch {
        name: name.to_string(),
        vocab_size: c.size("vocab_size")?,
        n_layers,
        d_model,
        n_heads,
        n_kv_heads,
        head_dim,
        d_ff: c.size("intermediate_size")?,
        context_length: c.size("max_position_embeddings")?,
        norm: NormKind::Rms,
        norm_eps: c.float("rms_norm_eps")?.unwrap_or(default_eps) as f32,
        post_norms: false,
        qk_norm: false,
        mlp: Mlp::SwiGlu,
        positions: Positions::Rope,
        rope: c.rope(None, 10000.0)?,
        rope_local: None,
        sliding_window: None,
        layer_attention: vec![LayerAttention::Global; n_layers],
        bias: Biases { qkv: attn_bias, o: attn_bias, mlp: mlp_bias },
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        embed_scale: 1.0,
        tied_embeddings: c.flag("tie_word_embeddings")?.unwrap_or(false),
    })
}

/// Sets a sliding window on every layer from `sliding_window` (absent or null: none).
pub fn hf_sliding_window_all(c: &HfConfig<'_>, arch: &mut Arch) -> Result<()> {
    if let Some(w) = c.uint("sliding_window")? {
        if w == 0 {
            return Err(Error::value("config.json", "'sliding_window'", "> 0 or null", 0));
        }
        arch.sliding_window = Some(w);
        arch.layer_attention = match c.layer_types(arch.n_layers)? {
            Some(types) => types,
            None => vec![LayerAttention::Local; arch.n_layers],
        };
    }
    Ok(())
}

/// Typed, error-naming access to the `{arch}.*` keys of GGUF metadata.
pub struct GgufKeys<'a> {
    /// The metadata.
    pub meta: &'a Metadata,
    /// `general.architecture`.
    pub arch: String,
    /// The tokenizer's size (when `{arch}.vocab_size` is absent).
    pub vocab_from_tokens: Option<usize>,
}

impl GgufKeys<'_> {
    /// `{arch}.{k}`.
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn positive(&self, k: &str, v: u64) -> Result<usize> {
        match usize::try_from(v) {
            Ok(v) if v > 0 => Ok(v),
            _ => Err(Error::value("gguf", format!("metadata '{}'", self.key(k)), "> 0", v)),
        }
    }

    /// A required size > 0.
    pub fn size(&self, k: &str) -> Result<usize> {
        self.positive(k, self.meta.require_u64(&self.key(k))?)
    }

    /// An optional size > 0.
    pub fn opt_size(&self, k: &str) -> Result<Option<usize>> {
        self.meta.get_u64(&self.key(k))?.map(|v| self.positive(k, v)).transpose()
    }

    /// An optional number.
    pub fn float(&self, k: &str) -> Result<Option<f64>> {
        self.meta.get_f64(&self.key(k))
    }

    /// A required number.
    pub fn require_float(&self, k: &str) -> Result<f64> {
        self.meta.require_f64(&self.key(k))
    }
}

/// The Llama-shaped description of GGUF metadata (RMS norms, SwiGLU, rope in `style`,
/// no biases, tied unless the file has `output.weight`); each architecture edits it.
pub fn gguf_llama_like(k: &GgufKeys<'_>, style: RopeStyle) -> Result<Arch> {
    let d_model = k.size("embedding_length")?;
    let n_heads = k.size("attention.head_count")?;
    let n_kv_heads = k.opt_size("attention.head_count_kv")?.unwrap_or(n_heads);
    if !n_heads.is_multiple_of(n_kv_heads) {
        return Err(Error::value(
            "gguf",
            format!("metadata '{}'", k.key("attention.head_count_kv")),
            format!("a divisor of {} = {n_heads}", k.key("attention.head_count")),
            n_kv_heads,
        ));
    }
    let head_dim = match k.opt_size("attention.key_length")? {
        Some(h) => h,
        None if d_model.is_multiple_of(n_heads) => d_model / n_heads,
        None => {
            return Err(Error::value(
                "gguf",
                format!("metadata '{}'", k.key("attention.head_count")),
                format!(
                    "a divisor of {} = {d_model} (or an explicit {})",
                    k.key("embedding_length"),
                    k.key("attention.key_length")
                ),
                n_heads,
            ))
        }
    };
    if let Some(v) = k.opt_size("attention.value_length")? {
        if v != head_dim {
            return Err(Error::unsupported(
                "gguf",
                format!("{} = {v} differs from the key head size {head_dim}", k.key("attention.value_length")),
            ));
        }
    }
    if let Some(rot) = k.opt_size("rope.dimension_count")? {
        if rot != head_dim {
            return Err(Error::unsupported(
                "gguf",
                format!(
                    "{} = {rot} but the head size is {head_dim}: partial rotary embedding is not supported",
                    k.key("rope.dimension_count")
                ),
            ));
        }
    }
    let vocab_size = match k.opt_size("vocab_size")? {
        Some(v) => v,
        None => k
            .vocab_from_tokens
            .filter(|&n| n > 0)
            .ok_or_else(|| io(format!("gguf: no {} and no tokenizer.ggml.tokens", k.key("vocab_size"))))?,
    };
    let scaling = match k.meta.get_str(&k.key("rope.scaling.type"))? {
        None | Some("none") => RopeScaling::None,
        Some("linear") => match k.float("rope.scaling.factor")?.unwrap_or(1.0) {
            1.0 => RopeScaling::None,
            factor => RopeScaling::Linear { factor },
        },
        Some(other) => {
            return Err(Error::unsupported(
                "gguf",
                format!("rope scaling type '{other}' is not supported (supported: none, linear)"),
            ))
        }
    };
    let n_layers = k.size("block_count")?;
    Ok(Arch {
        name: k.arch.clone(),
        vocab_size,
        n_layers,
        d_model,
        n_heads,
        n_kv_heads,
        head_dim,
        d_ff: k.size("feed_forward_length")?,
        context_length: k.size("context_length")?,
        norm: NormKind::Rms,
        norm_eps: k.require_float("attention.layer_norm_rms_epsilon")? as f32,
        post_norms: false,
        qk_norm: false,
        mlp: Mlp::SwiGlu,
        positions: Positions::Rope,
        rope: Rope { theta: k.float("rope.freq_base")?.unwrap_or(10000.0), scaling, style },
        rope_local: None,
        sliding_window: None,
        layer_attention: vec![LayerAttention::Global; n_layers],
        bias: Biases::default(),
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        embed_scale: 1.0,
        tied_embeddings: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
    fn transformers4_config_reads_sizes_and_defaults() {
        let a = hf_plan(&smollm2_hf()).unwrap().arch;
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
        assert!(hf_plan(&v).unwrap_err().to_string().contains("falcon"));
        let mut v = smollm2_hf();
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
        assert!(hf_plan(&v).unwrap_err().to_string().contains("yarn"));
        let mut v = smollm2_hf();
        v["num_attention_heads"] = json!(0);
        assert!(hf_plan(&v).is_err());
        let mut v = smollm2_hf();
        v["num_key_value_heads"] = json!(2);
        assert!(hf_plan(&v).is_err());
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let mut v = smollm2_hf();
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        v["rope_theta"] = json!(500000.0);
        let a = hf_plan(&v).unwrap().arch;
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
        let a = hf_plan(&v).unwrap().arch;
        let global: Vec<usize> = (0..18).filter(|&l| a.window(l).is_none()).collect();
        assert_eq!(global, [5, 11, 17]);
        assert_eq!((a.rope_of(0).theta, a.rope_of(5).theta, a.window(0)), (10_000.0, 1_000_000.0, Some(512)));
        assert!(a.tied_embeddings && a.post_norms && a.qk_norm && a.mlp == Mlp::GeGlu);
        assert_eq!(a.attn_scale, 1.0 / 16.0);
    }
}
