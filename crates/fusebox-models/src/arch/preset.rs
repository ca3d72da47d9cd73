//! Models trained from scratch: a [`ModelConfig`] (sizes and a [`Style`], as the
//! checkpoints' `config.json` records them) and the [`Preset`] of the architecture the
//! style names, which turns the sizes into the block ([`Arch`]) to train.

use std::fmt;

use fusebox::{Error, Result};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Architecture, ARCHITECTURES};
use crate::transformer::{layout, Arch, Stacking};

/// What an architecture trains from scratch.
#[derive(Debug)]
pub struct Preset {
    /// The block of a model of `cfg`'s sizes.
    pub block: fn(&ModelConfig) -> Arch,
    /// Key/value heads of [`ModelConfig::tiny`] (4 query heads).
    pub tiny_kv_heads: usize,
    /// MLP width of [`ModelConfig::tiny`] (width 128).
    pub tiny_d_ff: usize,
}

/// A registered architecture that has a [`Preset`]: what `fusebox train --arch` names.
#[derive(Clone, Copy)]
pub struct Style {
    unit: &'static dyn Architecture,
    preset: &'static Preset,
}

/// Every [`Style`], in the registry's order: what [`Style::ALL`] iterates.
#[derive(Debug, Clone, Copy)]
pub struct Styles;

impl IntoIterator for Styles {
    type Item = Style;
    type IntoIter = std::vec::IntoIter<Style>;
    fn into_iter(self) -> Self::IntoIter {
        ARCHITECTURES
            .iter()
            .filter_map(|&unit| Some(Style { unit, preset: unit.preset()? }))
            .collect::<Vec<_>>()
            .into_iter()
    }
}

// The styles by the names they had as an enum.
#[allow(non_upper_case_globals)]
impl Style {
    /// GPT-2: LayerNorm, GELU (tanh form) MLP, learned positions, biases.
    pub const Gpt2: Style = Style { unit: &super::gpt2::Gpt2, preset: &super::gpt2::PRESET };
    /// Llama: RMSNorm, RoPE, SwiGLU MLP, grouped-query attention, no biases.
    pub const Llama: Style = Style { unit: &super::llama::Llama, preset: &super::llama::PRESET };
    /// Qwen3: Llama with a per-head RMS norm of q and k before rope.
    pub const Qwen3: Style = Style { unit: &super::qwen3::Qwen3, preset: &super::qwen3::PRESET };
    /// Gemma 3: embeddings × √d_model, norms before and after attention and MLP,
    /// QK-norm, GeGLU; local layers (a window of half the context, rope base 10000)
    /// alternating with global ones (every second layer, rope base `rope_theta`).
    pub const Gemma3: Style = Style { unit: &super::gemma3::Gemma3, preset: &super::gemma3::PRESET };
}

impl Style {
    /// Every style: each registered architecture with a preset.
    pub const ALL: Styles = Styles;

    /// The architecture's name (`"gpt2"`, `"llama"`, ...).
    pub fn name(self) -> &'static str {
        self.unit.name()
    }

    /// The architecture.
    pub fn unit(self) -> &'static dyn Architecture {
        self.unit
    }

    /// Its preset.
    pub fn preset(self) -> &'static Preset {
        self.preset
    }

    /// The style of architecture `s`; an error lists the styles there are.
    pub fn parse(s: &str) -> Result<Style> {
        Style::ALL.into_iter().find(|st| st.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Style::ALL.into_iter().map(Style::name).collect();
            Error::value("ModelConfig", "style", format!("one of {}", names.join(", ")), s)
        })
    }
}

impl PartialEq for Style {
    fn eq(&self, other: &Style) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Style {}

impl fmt::Debug for Style {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Style({})", self.name())
    }
}

impl fmt::Display for Style {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Style {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Style {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Style, D::Error> {
        let name = String::deserialize(d)?;
        Style::parse(&name).map_err(serde::de::Error::custom)
    }
}

/// Sizes and style of a decoder-only transformer trained from scratch (its checkpoints'
/// `config.json`, field for field).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// The architecture.
    pub style: Style,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Decoder blocks.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (= `n_heads` for GPT-2; fewer for GQA).
    pub n_kv_heads: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Hidden width of the MLP.
    pub d_ff: usize,
    /// Longest sequence (learned positions, rope tables, KV caches).
    pub max_seq: usize,
    /// Epsilon of the layer or RMS norms.
    pub norm_eps: f32,
    /// Rotary embedding base (rope styles).
    pub rope_theta: f32,
    /// Output head shares the token embedding.
    pub tied_embeddings: bool,
}

impl ModelConfig {
    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }

    /// The block the style builds from these sizes.
    pub fn arch(&self) -> Arch {
        (self.style.preset.block)(self)
    }

    /// The block of one layer: every size but the depth, without allocating for
    /// `n_layers` (which a corrupt config may set to anything).
    fn one_layer(&self) -> Arch {
        (self.style.preset.block)(&ModelConfig { n_layers: 1, ..self.clone() })
    }

    /// The block built with at most 64 layers: enough to hold the pattern of layer kinds
    /// of a hybrid style (its period divides 64), without building a file's absurd count.
    fn some_layers(&self) -> Arch {
        (self.style.preset.block)(&ModelConfig { n_layers: self.n_layers.min(64), ..self.clone() })
    }

    /// Checks the sizes fit together and the style can build them; nothing is
    /// allocated for the layers before the parameter count is known to fit.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, expected: String, got: String| Err(Error::value("ModelConfig", what, expected, got));
        if self.vocab_size == 0 || self.n_layers == 0 || self.d_model == 0 || self.d_ff == 0 || self.max_seq == 0 {
            return bad("sizes", "all positive".into(), format!("{self:?}"));
        }
        if self.n_heads == 0 || !self.d_model.is_multiple_of(self.n_heads) {
            return bad("n_heads", format!("a divisor of d_model {}", self.d_model), self.n_heads.to_string());
        }
        if self.n_kv_heads == 0 || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad("n_kv_heads", format!("a divisor of n_heads {}", self.n_heads), self.n_kv_heads.to_string());
        }
        // The style builds every size as given, or says which one it fixes.
        let one = self.one_layer();
        let given = [
            ("vocab_size", one.vocab_size, self.vocab_size),
            ("n_heads", one.n_heads, self.n_heads),
            ("n_kv_heads", one.n_kv_heads, self.n_kv_heads),
            ("d_model", one.d_model, self.d_model),
            ("d_ff", one.d_ff, self.d_ff),
            ("max_seq", one.context_length, self.max_seq),
        ];
        if let Some((what, built, asked)) = given.into_iter().find(|(_, built, asked)| built != asked) {
            return bad(what, format!("{built} for {}", self.style.name()), asked.to_string());
        }
        // Every parameter must be addressable as one f32 buffer, and fit in this machine
        // (a config read from a file is checked before its layers size an allocation).
        let Some(params) = self.param_count().filter(|&n| n <= (isize::MAX as u64) / 4) else {
            return bad("sizes", "a parameter count that fits in memory (f32)".into(), format!("{self:?}"));
        };
        if let Some(total) = crate::transformer::cache::physical_memory().filter(|&t| params.saturating_mul(4) > t) {
            return bad(
                "sizes",
                format!("parameters that fit in this machine's {total} bytes of memory (f32)"),
                format!("{params} parameters: {self:?}"),
            );
        }
        one.validate()
    }

    /// Number of parameters [`crate::model::param_specs`] lays out, counted from the
    /// layout of at most 64 blocks without building the others; `None` when it
    /// overflows 64 bits.
    pub fn param_count(&self) -> Option<u64> {
        if self.n_heads == 0 || self.n_layers == 0 {
            return None;
        }
        layout::param_count(&self.some_layers(), |_| Stacking::default(), self.n_layers)
    }

    /// GPT-2 124M: vocab 50257, 12 layers, 12 heads, width 768, context 1024, tied embeddings.
    pub fn gpt2_124m() -> ModelConfig {
        super::gpt2::config_124m()
    }

    /// A small model of `style` for a given vocabulary: 2 layers of width 128, 4 heads;
    /// the key/value heads and MLP width its preset gives.
    pub fn tiny(style: Style, vocab_size: usize, max_seq: usize) -> ModelConfig {
        ModelConfig {
            style,
            vocab_size,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: style.preset.tiny_kv_heads,
            d_model: 128,
            d_ff: style.preset.tiny_d_ff,
            max_seq,
            norm_eps: 1e-5,
            rope_theta: 10000.0,
            tied_embeddings: true,
        }
    }

    /// The config as JSON (written beside checkpoints).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a ModelConfig is plain numbers and a name")
    }

    /// Reads a config written by [`ModelConfig::to_json`] and validates it; an error
    /// names the missing or bad field.
    pub fn from_json(v: &serde_json::Value) -> Result<ModelConfig> {
        let cfg: ModelConfig = crate::files::from_json_value(v, "config.json")?;
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_written_before_the_units_still_read() {
        let v = serde_json::json!({"style": "qwen3", "vocab_size": 40, "n_layers": 2, "n_heads": 4,
            "n_kv_heads": 2, "d_model": 32, "d_ff": 64, "max_seq": 16, "norm_eps": 0.0009765625, "rope_theta": 10000.0,
            "tied_embeddings": true});
        let cfg = ModelConfig::from_json(&v).unwrap();
        assert_eq!(cfg.style, Style::Qwen3);
        assert_eq!(cfg.to_json(), v);
        let mut bad = v.clone();
        bad["style"] = serde_json::json!("falcon");
        let e = ModelConfig::from_json(&bad).unwrap_err().to_string();
        assert!(
            e.contains("'style'")
                && e.contains("falcon")
                && e.contains("gpt2, llama, qwen3, qwen3_moe, qwen3_5, gpt_oss, gemma3"),
            "{e}"
        );
        let mut bad = v.clone();
        bad.as_object_mut().unwrap().remove("d_ff");
        assert!(ModelConfig::from_json(&bad).unwrap_err().to_string().contains("'d_ff'"));
    }

    #[test]
    fn a_style_that_fixes_a_size_says_which() {
        let cfg = ModelConfig { n_kv_heads: 2, ..ModelConfig::tiny(Style::Gpt2, 20, 8) };
        let e = cfg.validate().unwrap_err().to_string();
        assert!(e.contains("n_kv_heads") && e.contains("4 for gpt2"), "{e}");
        // 2^50 layers are counted, not laid out.
        let huge = ModelConfig { n_layers: 1 << 50, ..ModelConfig::tiny(Style::Gemma3, 20, 8) };
        assert!(huge.validate().unwrap_err().to_string().contains("fits in memory"));
        // 2^40 layers fit in an address space but not in a machine: refused before
        // anything is allocated (it aborted in the parameters' allocation).
        let v = serde_json::json!({"style": "llama", "vocab_size": 40, "n_layers": 1u64 << 40, "n_heads": 4,
            "n_kv_heads": 2, "d_model": 32, "d_ff": 64, "max_seq": 16, "norm_eps": 1e-5, "rope_theta": 10000.0,
            "tied_embeddings": true});
        let e = ModelConfig::from_json(&v).unwrap_err().to_string();
        assert!(e.contains("this machine's") && e.contains("bytes of memory"), "{e}");
    }
}
