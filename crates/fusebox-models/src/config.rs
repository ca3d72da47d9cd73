//! `ModelConfig`: one config for GPT-2-style and Llama-style decoder transformers.

use fusebox::{Error, Result};

/// Which family of decoder block the model uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// LayerNorm, GELU (tanh form) MLP, learned positions, biases, tied embeddings.
    Gpt2,
    /// RMSNorm, RoPE, SwiGLU MLP, grouped-query attention, no biases.
    Llama,
}

impl Style {
    /// `"gpt2"` or `"llama"`.
    pub fn name(self) -> &'static str {
        match self {
            Style::Gpt2 => "gpt2",
            Style::Llama => "llama",
        }
    }
    /// Parses `"gpt2"` / `"llama"`.
    pub fn parse(s: &str) -> Result<Style> {
        match s {
            "gpt2" => Ok(Style::Gpt2),
            "llama" => Ok(Style::Llama),
            other => Err(Error::value("ModelConfig", "style", "\"gpt2\" or \"llama\"", other)),
        }
    }
}

/// Sizes and choices of a decoder-only transformer.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// GPT-2 or Llama style.
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
    /// Rotary embedding base (Llama style).
    pub rope_theta: f32,
    /// Output head shares the token embedding.
    pub tied_embeddings: bool,
}

impl ModelConfig {
    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }

    /// Checks the sizes fit together.
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
        if self.style == Style::Gpt2 && self.n_kv_heads != self.n_heads {
            return bad("n_kv_heads", "equal to n_heads for gpt2".into(), self.n_kv_heads.to_string());
        }
        if self.style == Style::Llama && !self.head_dim().is_multiple_of(2) {
            return bad("head_dim", "even for rope".into(), self.head_dim().to_string());
        }
        Ok(())
    }

    /// GPT-2 124M: vocab 50257, 12 layers, 12 heads, width 768, context 1024, tied embeddings.
    pub fn gpt2_124m() -> ModelConfig {
        ModelConfig {
            style: Style::Gpt2,
            vocab_size: 50257,
            n_layers: 12,
            n_heads: 12,
            n_kv_heads: 12,
            d_model: 768,
            d_ff: 3072,
            max_seq: 1024,
            norm_eps: 1e-5,
            rope_theta: 10000.0,
            tied_embeddings: true,
        }
    }

    /// A small model of either style for a given vocabulary.
    pub fn tiny(style: Style, vocab_size: usize, max_seq: usize) -> ModelConfig {
        let (n_heads, n_kv_heads) = match style {
            Style::Gpt2 => (4, 4),
            Style::Llama => (4, 2),
        };
        ModelConfig {
            style,
            vocab_size,
            n_layers: 2,
            n_heads,
            n_kv_heads,
            d_model: 128,
            d_ff: if style == Style::Llama { 352 } else { 512 },
            max_seq,
            norm_eps: 1e-5,
            rope_theta: 10000.0,
            tied_embeddings: true,
        }
    }

    /// The config as JSON (written beside checkpoints).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "style": self.style.name(),
            "vocab_size": self.vocab_size,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "d_model": self.d_model,
            "d_ff": self.d_ff,
            "max_seq": self.max_seq,
            "norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,
            "tied_embeddings": self.tied_embeddings,
        })
    }

    /// Reads a config written by [`ModelConfig::to_json`]; names the missing or bad field.
    pub fn from_json(v: &serde_json::Value) -> Result<ModelConfig> {
        let field = |name: &str| v.get(name).ok_or_else(|| Error::Io(format!("config.json: missing field '{name}'")));
        let uint = |name: &str| -> Result<usize> {
            field(name)?
                .as_u64()
                .map(|x| x as usize)
                .ok_or_else(|| Error::Io(format!("config.json: field '{name}' is not a non-negative integer")))
        };
        let float = |name: &str| -> Result<f32> {
            field(name)?
                .as_f64()
                .map(|x| x as f32)
                .ok_or_else(|| Error::Io(format!("config.json: field '{name}' is not a number")))
        };
        let style =
            field("style")?.as_str().ok_or_else(|| Error::Io("config.json: field 'style' is not a string".into()))?;
        let cfg = ModelConfig {
            style: Style::parse(style)?,
            vocab_size: uint("vocab_size")?,
            n_layers: uint("n_layers")?,
            n_heads: uint("n_heads")?,
            n_kv_heads: uint("n_kv_heads")?,
            d_model: uint("d_model")?,
            d_ff: uint("d_ff")?,
            max_seq: uint("max_seq")?,
            norm_eps: float("norm_eps")?,
            rope_theta: float("rope_theta")?,
            tied_embeddings: field("tied_embeddings")?
                .as_bool()
                .ok_or_else(|| Error::Io("config.json: field 'tied_embeddings' is not a boolean".into()))?,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}
