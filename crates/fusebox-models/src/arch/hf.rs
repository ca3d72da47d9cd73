//! Hugging Face `config.json`, both ways: [`HfConfig`] reads one (typed, every error
//! naming the field), the Llama-shaped readers start an architecture's description
//! from it, and [`HfConfigOut`] writes one, with the rope and layer fields every
//! architecture writes alike.

use fusebox::{Error, Result, RopeStyle};
use serde_json::{json, Map, Value as Json};

use super::{HfFacts, HfWrapper};
use crate::transformer::{Arch, Biases, LayerAttention, Mlp, NormKind, Positions, Rope, RopeScaling};

/// Typed, error-naming access to a Hugging Face `config.json`.
pub struct HfConfig<'a> {
    json: &'a Json,
    /// Tensors the checkpoint holds: the most layers it can have.
    tensors: usize,
}

fn io(msg: impl Into<String>) -> Error {
    Error::Io(msg.into())
}

impl<'a> HfConfig<'a> {
    /// `config.json` `json` of a checkpoint holding `tensors` tensors.
    pub fn new(json: &'a Json, tensors: usize) -> HfConfig<'a> {
        HfConfig { json, tensors }
    }

    /// `model_type`, required.
    pub fn model_type(&self) -> Result<&'a str> {
        match self.json.get("model_type") {
            Some(Json::String(s)) => Ok(s.as_str()),
            None | Some(Json::Null) => {
                Err(io(format!("config.json: missing 'model_type' (expected one of: {})", super::hf_model_types())))
            }
            Some(other) => Err(io(format!("config.json: 'model_type': expected a string, found {other}"))),
        }
    }

    /// `f` of this config with `name` = `value` where it has none: for an architecture
    /// whose transformers config lacks a field the shared readers require (Qwen3.5-MoE
    /// has no `intermediate_size`: every MLP is experts).
    pub fn with_default<R>(&self, name: &str, value: Json, f: impl FnOnce(&HfConfig<'_>) -> R) -> R {
        if self.field(name).is_some() {
            return f(self);
        }
        let mut json = self.json.clone();
        if let Some(fields) = json.as_object_mut() {
            fields.insert(name.to_string(), value);
        }
        f(&HfConfig { json: &json, tensors: self.tensors })
    }

    /// The field, absent when missing or null.
    pub fn field(&self, name: &str) -> Option<&'a Json> {
        self.json.get(name).filter(|x| !x.is_null())
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

    /// The layer count `name` (`num_hidden_layers`, GPT-2's `n_layer`): > 0, and no more
    /// than the tensors the checkpoint holds (each layer has its own), checked before the
    /// count sizes anything.
    pub fn layers(&self, name: &str) -> Result<usize> {
        let n = self.size(name)?;
        if n > self.tensors {
            return Err(Error::value(
                "config.json",
                format!("'{name}'"),
                format!("at most the {} tensors the checkpoint holds (each layer has its own)", self.tensors),
                n,
            ));
        }
        Ok(n)
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
        let context = self.uint("max_position_embeddings")?;
        let scaling = match params {
            Some(p) => rope_scaling(Some(p), context)?,
            None => rope_scaling(self.field("rope_scaling"), context)?,
        };
        Ok(Rope { theta, scaling, style: RopeStyle::HalfSplit })
    }

    /// The rotated dims of a head when `partial_rotary_factor` (top level or in
    /// `rope_parameters`) makes them fewer than `head_dim` (transformers:
    /// `int(head_dim · factor)`).
    pub fn rotary_dim(&self, head_dim: usize) -> Result<Option<usize>> {
        let in_params = self.field("rope_parameters").and_then(|p| p.get("partial_rotary_factor"));
        let Some(f) = in_params.filter(|x| !x.is_null()).or_else(|| self.field("partial_rotary_factor")) else {
            return Ok(None);
        };
        let f = f.as_f64().ok_or_else(|| io(format!("config.json: 'partial_rotary_factor': found {f}")))?;
        let dims = (head_dim as f64 * f) as usize;
        if !(f > 0.0 && f <= 1.0) || dims < 2 || !dims.is_multiple_of(2) {
            return Err(Error::value(
                "config.json",
                "'partial_rotary_factor'",
                format!("a factor in (0, 1] giving an even number ≥ 2 of the {head_dim} head dims"),
                f,
            ));
        }
        Ok((dims < head_dim).then_some(dims))
    }

    /// `layer_types` (`full_attention` / `sliding_attention` / `linear_attention` per
    /// layer) when present.
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
                Some("linear_attention") => Ok(LayerAttention::Linear),
                _ => Err(Error::unsupported("config.json", format!("layer_types entry {t} is not supported"))),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// The text model's `config.json` inside that of multimodal wrapper `w` (`v`, whose
/// `model_type` is the wrapper's): its `text_config`, which must be `text_model_type`'s
/// where it names one, with the wrapper's own `tie_word_embeddings`, which is what
/// transformers ties the head by (else the text config's; false where both are silent,
/// the wrapper's default).
pub fn text_config(v: &Json, w: &HfWrapper, text_model_type: &str) -> Result<Json> {
    let mut text = match v.get("text_config") {
        Some(Json::Object(m)) => m.clone(),
        None | Some(Json::Null) => {
            return Err(io(format!(
                "config.json: model_type '{}' ({}) keeps its text model's config in 'text_config', which is missing",
                w.model_type, w.class
            )))
        }
        Some(other) => {
            return Err(io(format!("config.json: 'text_config': expected an object, found {}", short(other))));
        }
    };
    match text.get("model_type") {
        None | Some(Json::Null) => {
            text.insert("model_type".into(), Json::String(text_model_type.into()));
        }
        Some(Json::String(t)) if t == text_model_type => {}
        Some(other) => {
            return Err(Error::unsupported(
                "config.json",
                format!(
                    "text_config.model_type {other} in a '{}' checkpoint (expected '{text_model_type}')",
                    w.model_type
                ),
            ))
        }
    }
    let tie = v.get("tie_word_embeddings").filter(|x| !x.is_null());
    let tie = tie.or_else(|| text.get("tie_word_embeddings").filter(|x| !x.is_null())).cloned();
    text.insert("tie_word_embeddings".into(), tie.unwrap_or(Json::Bool(false)));
    Ok(Json::Object(text))
}

/// A JSON value for a message, cut short.
fn short(v: &Json) -> String {
    let s = v.to_string();
    match s.char_indices().nth(60) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

/// `rope_scaling` (or `rope_parameters`): none, `default`, `linear`, `llama3` or `yarn`
/// (whose original context defaults to `context`, `max_position_embeddings`).
fn rope_scaling(v: Option<&Json>, context: Option<usize>) -> Result<RopeScaling> {
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
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor: num("factor")? }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_positions: num("original_max_position_embeddings")?,
        }),
        "yarn" => {
            let opt = |name: &str| {
                v.get(name).filter(|x| !x.is_null()).map(|x| {
                    x.as_f64().ok_or_else(|| {
                        io(format!("config.json: rope_scaling (yarn): '{name}': expected a number, found {x}"))
                    })
                })
            };
            let original = match opt("original_max_position_embeddings").transpose()? {
                Some(n) => n,
                None => context.ok_or_else(|| io("config.json: yarn needs 'original_max_position_embeddings'"))? as f64,
            };
            let factor = match opt("factor").transpose()? {
                Some(f) => f,
                None => context.ok_or_else(|| io("config.json: yarn needs 'factor'"))? as f64 / original,
            };
            // transformers' yarn_get_mscale: 0.1·m·ln(factor) + 1 (1 for factor ≤ 1).
            let mscale = |m: f64| if factor <= 1.0 { 1.0 } else { 0.1 * m * factor.ln() + 1.0 };
            let attention_factor = match (
                opt("attention_factor").transpose()?,
                opt("mscale").transpose()?,
                opt("mscale_all_dim").transpose()?,
            ) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => mscale(m) / mscale(all),
                _ => mscale(1.0),
            };
            let truncate = match v.get("truncate").filter(|x| !x.is_null()) {
                None => true,
                Some(t) => t.as_bool().ok_or_else(|| {
                    io(format!("config.json: rope_scaling (yarn): 'truncate': expected a boolean, found {t}"))
                })?,
            };
            Ok(RopeScaling::Yarn {
                factor,
                original_max_positions: original,
                beta_fast: opt("beta_fast").transpose()?.filter(|&b| b != 0.0).unwrap_or(32.0),
                beta_slow: opt("beta_slow").transpose()?.filter(|&b| b != 0.0).unwrap_or(1.0),
                attention_factor,
                truncate,
            })
        }
        other => Err(Error::unsupported(
            "config.json",
            format!("rope_scaling type '{other}' is not supported (supported: linear, llama3, yarn)"),
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
    if !n_heads.is_multiple_of(n_kv_heads) {
        return Err(Error::value(
            "config.json",
            "'num_key_value_heads'",
            format!("a divisor of 'num_attention_heads' = {n_heads}"),
            n_kv_heads,
        ));
    }
    let n_layers = c.layers("num_hidden_layers")?;
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
        qk_norm_whole: false,
        mlp: Mlp::SwiGlu,
        positions: Positions::Rope,
        rope: c.rope(None, 10000.0)?,
        rope_local: None,
        sliding_window: None,
        layer_attention: vec![LayerAttention::Global; n_layers],
        bias: Biases { qkv: attn_bias, o: attn_bias, mlp: mlp_bias, experts: false },
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        embed_scale: 1.0,
        tied_embeddings: c.flag("tie_word_embeddings")?.unwrap_or(false),
        attn_sinks: false,
        moe: None,
        linear_attention: None,
        attn_output_gate: false,
        rotary_dim: c.rotary_dim(head_dim)?,
    })
}

/// Sets a sliding window on every layer from `sliding_window` (absent or null: none).
pub fn hf_sliding_window_all(c: &HfConfig<'_>, arch: &mut Arch) -> Result<()> {
    hf_sliding_window(c, arch, |n| vec![LayerAttention::Local; n])
}

/// Sets the window from `sliding_window` (absent or null: none) on the layers
/// `layer_types` names, or on `default(n_layers)`'s when it is absent.
pub fn hf_sliding_window(
    c: &HfConfig<'_>,
    arch: &mut Arch,
    default: impl FnOnce(usize) -> Vec<LayerAttention>,
) -> Result<()> {
    if let Some(w) = c.uint("sliding_window")? {
        if w == 0 {
            return Err(Error::value("config.json", "'sliding_window'", "> 0 or null", 0));
        }
        arch.sliding_window = Some(w);
        arch.layer_attention = match c.layer_types(arch.n_layers)? {
            Some(types) => types,
            None => default(arch.n_layers),
        };
    }
    Ok(())
}

/// A `config.json` being written. The export sets the fields every model has (vocab,
/// token ids, dtype); an architecture's [`super::Architecture::write_hf`] the rest.
#[derive(Debug, Default)]
pub struct HfConfigOut {
    fields: Map<String, Json>,
}

impl HfConfigOut {
    /// An empty config.
    pub fn new() -> HfConfigOut {
        HfConfigOut::default()
    }

    /// Sets field `name`.
    pub fn set(&mut self, name: &str, v: Json) {
        self.fields.insert(name.to_string(), v);
    }

    /// `model_type` and the class (`architectures`) of `hf`.
    pub fn model(&mut self, hf: &HfFacts) {
        self.set("architectures", json!([hf.class]));
        self.set("model_type", json!(hf.model_type));
    }

    /// The sizes of a Llama-shaped config (`hidden_size`, heads, `head_dim`, ...).
    pub fn llama_sizes(&mut self, arch: &Arch) {
        self.set("hidden_size", json!(arch.d_model));
        self.set("intermediate_size", json!(arch.d_ff));
        self.set("num_hidden_layers", json!(arch.n_layers));
        self.set("num_attention_heads", json!(arch.n_heads));
        self.set("num_key_value_heads", json!(arch.n_kv_heads));
        self.set("head_dim", json!(arch.head_dim));
        self.set("max_position_embeddings", json!(arch.context_length));
        self.set("rms_norm_eps", json_f32(arch.norm_eps));
        self.set("attention_dropout", json!(0.0));
    }

    /// The rope: `rope_parameters` (transformers 5) and, beside it, transformers 4's
    /// `rope_theta` / `rope_scaling`.
    pub fn rope(&mut self, rope: &Rope) -> Result<()> {
        self.set("rope_parameters", rope_parameters(rope)?);
        self.set("rope_theta", json!(rope.theta));
        self.set("rope_scaling", rope_scaling_v4(rope)?);
        Ok(())
    }

    /// `layer_types`: `full_attention` / `sliding_attention` per layer.
    pub fn layer_types(&mut self, arch: &Arch) {
        let types: Vec<&str> = arch
            .layer_attention
            .iter()
            .map(|a| match a {
                LayerAttention::Global => "full_attention",
                LayerAttention::Local => "sliding_attention",
                LayerAttention::Linear => "linear_attention",
            })
            .collect();
        self.set("layer_types", json!(types));
    }

    /// Whether field `name` is set.
    pub fn has(&self, name: &str) -> bool {
        self.fields.contains_key(name)
    }

    /// The config as JSON.
    pub fn into_json(self) -> Json {
        Json::Object(self.fields)
    }
}

/// `rope_parameters` (transformers 5) of one rope.
pub fn rope_parameters(rope: &Rope) -> Result<Json> {
    let mut p = json!({"rope_theta": rope.theta, "rope_type": "default"});
    match &rope.scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => {
            p["rope_type"] = json!("linear");
            p["factor"] = json!(factor);
        }
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_positions } => {
            p["rope_type"] = json!("llama3");
            p["factor"] = json!(factor);
            p["low_freq_factor"] = json!(low_freq_factor);
            p["high_freq_factor"] = json!(high_freq_factor);
            p["original_max_position_embeddings"] = json!(*original_max_positions as u64);
        }
        RopeScaling::Yarn { factor, original_max_positions, beta_fast, beta_slow, attention_factor, truncate } => {
            p["rope_type"] = json!("yarn");
            p["factor"] = json!(factor);
            p["original_max_position_embeddings"] = json!(*original_max_positions as u64);
            p["beta_fast"] = json!(beta_fast);
            p["beta_slow"] = json!(beta_slow);
            p["attention_factor"] = json!(attention_factor);
            p["truncate"] = json!(truncate);
        }
        RopeScaling::FreqFactors(_) => {
            return Err(Error::unsupported(
                "export",
                "rope frequency factors (GGUF rope_freqs.weight) have no config.json form: transformers describes \
                 Llama 3 scaling by its four parameters, which the factors do not give back",
            ))
        }
    }
    Ok(p)
}

/// transformers 4's `rope_scaling` of one rope (null when plain).
pub fn rope_scaling_v4(rope: &Rope) -> Result<Json> {
    let p = rope_parameters(rope)?;
    Ok(if rope.scaling == RopeScaling::None {
        Json::Null
    } else {
        let mut m = p.as_object().cloned().unwrap_or_default();
        m.remove("rope_theta");
        Json::Object(m)
    })
}

/// A finite f32 as the JSON number of its shortest decimal form (`1e-5`, not
/// `9.999999747378752e-6`).
pub fn json_f32(x: f32) -> Json {
    let shortest: f64 = x.to_string().parse().unwrap_or(f64::from(x));
    serde_json::Number::from_f64(shortest).map(Json::Number).unwrap_or(Json::Null)
}
