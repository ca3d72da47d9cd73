//! `LlamaConfig`: the sizes of a pretrained Llama-family model, read from GGUF
//! metadata (`llama.*` keys) or from a Hugging Face `config.json`, and the rotary
//! frequencies they imply (with `rope_scaling` supported or refused by name).

use fusebox::{Error, Result, RopeStyle};
use serde_json::Value as Json;

use crate::gguf::Metadata;

/// How rotary frequencies are rescaled for a longer context.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain `θ^(−2i/d)`.
    None,
    /// Positions divided by `factor` (every frequency divided by it).
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama 3.x: low frequencies divided by `factor`, high ones kept, a smooth ramp between.
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f64,
        /// Wavelengths longer than `original_max_positions / low_freq_factor` are divided.
        low_freq_factor: f64,
        /// Wavelengths shorter than `original_max_positions / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length the model was pretrained with.
        original_max_positions: f64,
    },
    /// Per-frequency divisors (GGUF `rope_freqs.weight`, how llama.cpp stores Llama 3 scaling).
    FreqFactors(Vec<f32>),
}

/// Sizes and choices of a pretrained Llama-family decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Architecture name as the file states it (`llama`, `mistral`).
    pub architecture: String,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Decoder blocks.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (fewer than `n_heads` with grouped-query attention).
    pub n_kv_heads: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Hidden width of the SwiGLU MLP.
    pub d_ff: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Longest context the model was trained for; `--ctx-size` may not exceed it.
    pub context_length: usize,
    /// Epsilon of the RMS norms.
    pub norm_eps: f32,
    /// Rotary embedding base θ.
    pub rope_theta: f64,
    /// Interleaved for GGUF llama weights (converted for adjacent pairs), HalfSplit for HF.
    pub rope_style: RopeStyle,
    /// How the rotary frequencies are rescaled.
    pub rope_scaling: RopeScaling,
    /// Whether the output head is the token embedding (no separate output weight).
    pub tied_embeddings: bool,
}

/// GGUF architectures whose tensors and keys follow the `llama` layout.
const GGUF_ARCHITECTURES: &[&str] = &["llama", "mistral"];
/// `model_type`s of HF configs handled by the Llama path.
const HF_MODEL_TYPES: &[&str] = &["llama", "mistral"];

fn io(msg: impl Into<String>) -> Error {
    Error::Io(msg.into())
}

impl LlamaConfig {
    /// Checks that the sizes fit together; an error names the field, what was
    /// expected and what came.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, expected: String, got: String| Err(Error::value("LlamaConfig", what, expected, got));
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("n_layers", self.n_layers),
            ("d_model", self.d_model),
            ("d_ff", self.d_ff),
            ("context_length", self.context_length),
            ("head_dim", self.head_dim),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
        ];
        for (what, v) in sizes {
            if v == 0 {
                return bad(what, "> 0".into(), "0".into());
            }
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad("n_kv_heads", format!("a divisor of n_heads ({})", self.n_heads), self.n_kv_heads.to_string());
        }
        // Every width the model allocates must be representable; a layer's KV cache
        // per position is `kv_dim` floats and a projection `q_dim × d_model`.
        let widths = [
            ("n_heads × head_dim", self.n_heads.checked_mul(self.head_dim)),
            ("n_kv_heads × head_dim", self.n_kv_heads.checked_mul(self.head_dim)),
            ("vocab_size × d_model", self.vocab_size.checked_mul(self.d_model)),
            ("d_ff × d_model", self.d_ff.checked_mul(self.d_model)),
        ];
        for (what, v) in widths {
            if v.is_none_or(|v| v > isize::MAX as usize / 8) {
                return bad(what, "a size that fits in memory".into(), "an overflowing product".into());
            }
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad("head_dim", "even (rotary pairs)".into(), self.head_dim.to_string());
        }
        if !(self.norm_eps > 0.0 && self.norm_eps.is_finite()) {
            return bad("norm_eps", "a finite value > 0".into(), self.norm_eps.to_string());
        }
        if !(self.rope_theta > 0.0 && self.rope_theta.is_finite()) {
            return bad("rope_theta", "a finite value > 0".into(), self.rope_theta.to_string());
        }
        match &self.rope_scaling {
            RopeScaling::FreqFactors(f) if f.len() != self.head_dim / 2 => {
                bad("rope_freqs", format!("{} factors (head_dim / 2)", self.head_dim / 2), f.len().to_string())
            }
            RopeScaling::FreqFactors(f) if f.iter().any(|v| !v.is_finite() || *v <= 0.0) => {
                bad("rope_freqs", "finite values > 0".into(), format!("{f:?}"))
            }
            RopeScaling::Linear { factor } | RopeScaling::Llama3 { factor, .. }
                if !factor.is_finite() || *factor <= 0.0 =>
            {
                bad("rope_scaling.factor", "a finite value > 0".into(), factor.to_string())
            }
            RopeScaling::Llama3 { low_freq_factor: lo, high_freq_factor: hi, original_max_positions: n, .. }
                if !(lo.is_finite() && hi.is_finite() && *lo > 0.0 && hi > lo && n.is_finite() && *n > 0.0) =>
            {
                bad(
                    "rope_scaling (llama3)",
                    "0 < low_freq_factor < high_freq_factor, positions > 0".into(),
                    format!("{lo}, {hi}, {n}"),
                )
            }
            _ => Ok(()),
        }
    }

    /// Width of the query projection (`n_heads · head_dim`).
    pub fn q_dim(&self) -> usize {
        self.n_heads.saturating_mul(self.head_dim)
    }

    /// Width of the key and value projections (`n_kv_heads · head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads.saturating_mul(self.head_dim)
    }

    /// The rotary angle per position for each pair `i < head_dim/2`:
    /// `θ^(−2i/head_dim)` rescaled as [`RopeScaling`] says.
    pub fn rope_frequencies(&self) -> Vec<f64> {
        let d = self.head_dim as f64;
        (0..self.head_dim / 2)
            .map(|i| {
                let freq = self.rope_theta.powf(-2.0 * i as f64 / d);
                match &self.rope_scaling {
                    RopeScaling::None => freq,
                    RopeScaling::Linear { factor } => freq / factor,
                    RopeScaling::FreqFactors(f) => freq / f64::from(f[i]),
                    RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_positions } => {
                        let wavelen = 2.0 * std::f64::consts::PI / freq;
                        let low_wavelen = original_max_positions / low_freq_factor;
                        let high_wavelen = original_max_positions / high_freq_factor;
                        if wavelen < high_wavelen {
                            freq
                        } else if wavelen > low_wavelen {
                            freq / factor
                        } else {
                            let smooth = (original_max_positions / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * freq / factor + smooth * freq
                        }
                    }
                }
            })
            .collect()
    }

    /// The config of a GGUF file from its `{arch}.*` metadata. `vocab_from_tokens` is
    /// the tokenizer's vocabulary size, used when `{arch}.vocab_size` is absent.
    pub fn from_gguf(meta: &Metadata, vocab_from_tokens: Option<usize>) -> Result<LlamaConfig> {
        let arch = meta.require_str("general.architecture")?.to_string();
        if !GGUF_ARCHITECTURES.contains(&arch.as_str()) {
            return Err(Error::unsupported(
                "LlamaConfig::from_gguf",
                format!(
                    "architecture '{arch}' is not supported by the Llama path (supported: {})",
                    GGUF_ARCHITECTURES.join(", ")
                ),
            ));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let size = |k: &str, v: u64| -> Result<usize> {
            match usize::try_from(v) {
                Ok(v) if v > 0 => Ok(v),
                _ => Err(Error::value("LlamaConfig::from_gguf", format!("metadata '{}'", key(k)), "> 0", v)),
            }
        };
        let req = |k: &str| -> Result<usize> { size(k, meta.require_u64(&key(k))?) };
        let opt = |k: &str| -> Result<Option<usize>> { meta.get_u64(&key(k))?.map(|v| size(k, v)).transpose() };
        let d_model = req("embedding_length")?;
        let n_heads = req("attention.head_count")?;
        let n_kv_heads = opt("attention.head_count_kv")?.unwrap_or(n_heads);
        if !n_heads.is_multiple_of(n_kv_heads) {
            return Err(Error::value(
                "LlamaConfig::from_gguf",
                format!("metadata '{}'", key("attention.head_count_kv")),
                format!("a divisor of {} = {n_heads}", key("attention.head_count")),
                n_kv_heads,
            ));
        }
        let head_dim = match opt("attention.key_length")? {
            Some(k) => k,
            None if d_model.is_multiple_of(n_heads) => d_model / n_heads,
            None => {
                return Err(Error::value(
                    "LlamaConfig::from_gguf",
                    format!("metadata '{}'", key("attention.head_count")),
                    format!(
                        "a divisor of {} = {d_model} (or an explicit {})",
                        key("embedding_length"),
                        key("attention.key_length")
                    ),
                    n_heads,
                ))
            }
        };
        if let Some(v) = opt("attention.value_length")? {
            if v != head_dim {
                return Err(Error::unsupported(
                    "LlamaConfig::from_gguf",
                    format!("{} = {v} differs from the key head size {head_dim}", key("attention.value_length")),
                ));
            }
        }
        if let Some(rot) = opt("rope.dimension_count")? {
            if rot != head_dim {
                return Err(Error::unsupported(
                    "LlamaConfig::from_gguf",
                    format!(
                        "{} = {rot} but the head size is {head_dim}: partial rotary embedding is not supported",
                        key("rope.dimension_count")
                    ),
                ));
            }
        }
        let vocab_size = match opt("vocab_size")? {
            Some(v) => v,
            None => vocab_from_tokens
                .filter(|&n| n > 0)
                .ok_or_else(|| io(format!("gguf: no {} and no tokenizer.ggml.tokens", key("vocab_size"))))?,
        };
        let rope_scaling = match meta.get_str(&key("rope.scaling.type"))? {
            None | Some("none") => RopeScaling::None,
            Some("linear") => {
                let factor = meta.get_f64(&key("rope.scaling.factor"))?.unwrap_or(1.0);
                if factor == 1.0 {
                    RopeScaling::None
                } else {
                    RopeScaling::Linear { factor }
                }
            }
            Some(other) => {
                return Err(Error::unsupported(
                    "LlamaConfig::from_gguf",
                    format!("rope scaling type '{other}' is not supported (supported: none, linear)"),
                ))
            }
        };
        let cfg = LlamaConfig {
            vocab_size,
            n_layers: req("block_count")?,
            n_heads,
            n_kv_heads,
            d_model,
            d_ff: req("feed_forward_length")?,
            head_dim,
            context_length: req("context_length")?,
            norm_eps: meta.require_f64(&key("attention.layer_norm_rms_epsilon"))? as f32,
            rope_theta: meta.get_f64(&key("rope.freq_base"))?.unwrap_or(10000.0),
            rope_style: RopeStyle::Interleaved,
            rope_scaling,
            tied_embeddings: true, // decided by the loader from the tensors present
            architecture: arch,
        };
        Ok(cfg)
    }

    /// The config of a Hugging Face `config.json` (`model_type` llama or mistral).
    pub fn from_hf_json(v: &Json) -> Result<LlamaConfig> {
        let model_type = match v.get("model_type") {
            Some(Json::String(s)) => s.as_str(),
            None | Some(Json::Null) => {
                return Err(io(format!(
                    "config.json: missing 'model_type' (expected one of: {})",
                    HF_MODEL_TYPES.join(", ")
                )))
            }
            Some(other) => return Err(io(format!("config.json: 'model_type': expected a string, found {other}"))),
        };
        if !HF_MODEL_TYPES.contains(&model_type) {
            return Err(Error::unsupported(
                "LlamaConfig::from_hf_json",
                format!(
                    "model_type '{model_type}' is not supported by the Llama path (supported: {})",
                    HF_MODEL_TYPES.join(", ")
                ),
            ));
        }
        let field = |name: &str| v.get(name).filter(|x| !x.is_null());
        let uint = |name: &str| -> Result<Option<usize>> {
            field(name)
                .map(|x| {
                    x.as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| io(format!("config.json: '{name}': expected a non-negative integer, found {x}")))
                })
                .transpose()
        };
        let req = |name: &str| uint(name)?.ok_or_else(|| io(format!("config.json: missing '{name}'")));
        let float = |name: &str| -> Result<Option<f64>> {
            field(name)
                .map(|x| x.as_f64().ok_or_else(|| io(format!("config.json: '{name}': expected a number, found {x}"))))
                .transpose()
        };
        let flag = |name: &str| -> Result<Option<bool>> {
            field(name)
                .map(|x| x.as_bool().ok_or_else(|| io(format!("config.json: '{name}': expected a boolean, found {x}"))))
                .transpose()
        };
        let act = match field("hidden_act") {
            None => "silu",
            Some(Json::String(s)) => s.as_str(),
            Some(other) => return Err(io(format!("config.json: 'hidden_act': expected a string, found {other}"))),
        };
        if act != "silu" {
            return Err(Error::unsupported("LlamaConfig::from_hf_json", format!("hidden_act '{act}' (only silu)")));
        }
        for bias in ["attention_bias", "mlp_bias"] {
            if flag(bias)? == Some(true) {
                return Err(Error::unsupported("LlamaConfig::from_hf_json", format!("{bias} = true")));
            }
        }
        let positive = |name: &str, v: usize| -> Result<usize> {
            if v == 0 {
                return Err(Error::value("LlamaConfig::from_hf_json", format!("config.json '{name}'"), "> 0", 0));
            }
            Ok(v)
        };
        let req = |name: &str| positive(name, req(name)?);
        let d_model = req("hidden_size")?;
        let n_heads = req("num_attention_heads")?;
        let head_dim = match uint("head_dim")? {
            Some(h) => positive("head_dim", h)?,
            None if d_model.is_multiple_of(n_heads) => d_model / n_heads,
            None => {
                return Err(Error::value(
                    "LlamaConfig::from_hf_json",
                    "config.json 'num_attention_heads'",
                    format!("a divisor of 'hidden_size' = {d_model} (or an explicit 'head_dim')"),
                    n_heads,
                ))
            }
        };
        let n_kv_heads = match uint("num_key_value_heads")? {
            Some(k) => positive("num_key_value_heads", k)?,
            None => n_heads,
        };
        let cfg = LlamaConfig {
            architecture: model_type.to_string(),
            vocab_size: req("vocab_size")?,
            n_layers: req("num_hidden_layers")?,
            n_heads,
            n_kv_heads,
            d_model,
            d_ff: req("intermediate_size")?,
            head_dim,
            context_length: req("max_position_embeddings")?,
            norm_eps: float("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            rope_theta: float("rope_theta")?.unwrap_or(10000.0),
            rope_style: RopeStyle::HalfSplit,
            rope_scaling: hf_rope_scaling(field("rope_scaling"))?,
            tied_embeddings: flag("tie_word_embeddings")?.unwrap_or(false),
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// `rope_scaling` of an HF config: null, `linear` or `llama3`; anything else is refused.
fn hf_rope_scaling(v: Option<&Json>) -> Result<RopeScaling> {
    let Some(v) = v else { return Ok(RopeScaling::None) };
    if v.is_null() {
        return Ok(RopeScaling::None);
    }
    let kind = match v.get("rope_type").or_else(|| v.get("type")) {
        Some(Json::String(s)) => s.as_str(),
        other => {
            return Err(io(format!(
                "config.json: rope_scaling: expected a string 'rope_type' (linear, llama3), found {}",
                other.map_or("none".into(), Json::to_string)
            )))
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
        other => Err(Error::unsupported(
            "LlamaConfig::from_hf_json",
            format!("rope_scaling type '{other}' is not supported (supported: linear, llama3)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smollm2_hf() -> Json {
        json!({
            "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
            "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
            "tie_word_embeddings": true, "rope_scaling": null, "hidden_act": "silu"
        })
    }

    #[test]
    fn hf_config_reads_sizes_and_defaults() {
        let c = LlamaConfig::from_hf_json(&smollm2_hf()).unwrap();
        assert_eq!((c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.n_layers), (576, 9, 3, 64, 30));
        assert_eq!(
            (c.rope_style, c.rope_scaling.clone(), c.tied_embeddings),
            (RopeStyle::HalfSplit, RopeScaling::None, true)
        );
        let f = c.rope_frequencies();
        assert_eq!(f.len(), 32);
        assert_eq!(f[0], 1.0);
        assert!((f[1] - 100000f64.powf(-2.0 / 64.0)).abs() < 1e-15);
    }

    #[test]
    fn unsupported_configs_are_named() {
        let mut v = smollm2_hf();
        v["model_type"] = json!("qwen2");
        assert!(LlamaConfig::from_hf_json(&v).unwrap_err().to_string().contains("qwen2"));
        let mut v = smollm2_hf();
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
        assert!(LlamaConfig::from_hf_json(&v).unwrap_err().to_string().contains("yarn"));
        let mut v = smollm2_hf();
        v["num_attention_heads"] = json!(0);
        assert!(LlamaConfig::from_hf_json(&v).is_err());
        let mut v = smollm2_hf();
        v["num_key_value_heads"] = json!(2);
        assert!(LlamaConfig::from_hf_json(&v).is_err());
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let mut v = smollm2_hf();
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        v["rope_theta"] = json!(500000.0);
        let c = LlamaConfig::from_hf_json(&v).unwrap();
        let f = c.rope_frequencies();
        let plain = |i: usize| 500000f64.powf(-2.0 * i as f64 / 64.0);
        assert_eq!(f[0], plain(0));
        assert!((f[31] - plain(31) / 8.0).abs() < 1e-18);
    }
}
