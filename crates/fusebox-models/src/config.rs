//! `ModelConfig`: the sizes and architecture of a transformer trained from scratch
//! (GPT-2, Llama, Qwen3 or Gemma 3 style), as its checkpoints record them.

use fusebox::{Error, Result};

/// Which family of decoder block the model uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// LayerNorm, GELU (tanh form) MLP, learned positions, biases, tied embeddings.
    Gpt2,
    /// RMSNorm, RoPE, SwiGLU MLP, grouped-query attention, no biases.
    Llama,
    /// Llama with a per-head RMS norm of q and k before rope.
    Qwen3,
    /// Gemma 3: embeddings × √d_model, norms before and after attention and MLP,
    /// QK-norm, GeGLU; local layers (a window of half the context, rope base 10000)
    /// alternating with global ones (every second layer, rope base `rope_theta`).
    Gemma3,
}

impl Style {
    /// Every style.
    pub const ALL: [Style; 4] = [Style::Gpt2, Style::Llama, Style::Qwen3, Style::Gemma3];

    /// `"gpt2"`, `"llama"`, `"qwen3"` or `"gemma3"`.
    pub fn name(self) -> &'static str {
        match self {
            Style::Gpt2 => "gpt2",
            Style::Llama => "llama",
            Style::Qwen3 => "qwen3",
            Style::Gemma3 => "gemma3",
        }
    }
    /// Parses a [`name`](Self::name).
    pub fn parse(s: &str) -> Result<Style> {
        Style::ALL
            .into_iter()
            .find(|st| st.name() == s)
            .ok_or_else(|| Error::value("ModelConfig", "style", "gpt2, llama, qwen3 or gemma3", s))
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
        if self.style != Style::Gpt2 && !self.head_dim().is_multiple_of(2) {
            return bad("head_dim", "even for rope".into(), self.head_dim().to_string());
        }
        // Every parameter must be addressable as one f32 buffer.
        if self.param_count().is_none_or(|n| n > (isize::MAX as u64) / 4) {
            return bad("sizes", "a parameter count that fits in memory (f32)".into(), format!("{self:?}"));
        }
        Ok(())
    }

    /// Number of parameters [`crate::model::param_specs`] lays out, computed without
    /// building them; `None` when it overflows 64 bits.
    pub fn param_count(&self) -> Option<u64> {
        let u = |x: usize| u64::try_from(x).ok();
        let gpt2 = self.style == Style::Gpt2;
        let (v, d, f) = (u(self.vocab_size)?, u(self.d_model)?, u(self.d_ff)?);
        let hd = u(self.d_model.checked_div(self.n_heads)?)?;
        let q = u(self.n_heads)?.checked_mul(hd)?;
        let kv = u(self.n_kv_heads)?.checked_mul(hd)?;
        // q, k, v, o projections; MLP in (and up when gated) and out; two norms (four
        // for Gemma 3) and the per-head q/k norms of Qwen3 and Gemma 3.
        let mut layer =
            q.checked_mul(d)?.checked_add(kv.checked_mul(d)?.checked_mul(2)?)?.checked_add(d.checked_mul(q)?)?;
        layer = layer.checked_add(f.checked_mul(d)?.checked_mul(if gpt2 { 2 } else { 3 })?)?.checked_add(2 * d)?;
        if matches!(self.style, Style::Qwen3 | Style::Gemma3) {
            layer = layer.checked_add(hd.checked_mul(2)?)?;
        }
        if self.style == Style::Gemma3 {
            layer = layer.checked_add(d.checked_mul(2)?)?;
        }
        if gpt2 {
            // Biases of q, k, v, o, fc, proj and of both layer norms.
            layer = layer.checked_add(q.checked_add(2 * kv)?.checked_add(d)?.checked_add(f)?.checked_add(d)?)?;
            layer = layer.checked_add(2 * d)?;
        }
        let mut total = v.checked_mul(d)?.checked_add(layer.checked_mul(u(self.n_layers)?)?)?.checked_add(d)?;
        if gpt2 {
            total = total.checked_add(u(self.max_seq)?.checked_mul(d)?)?.checked_add(d)?;
        }
        if !self.tied_embeddings {
            total = total.checked_add(v.checked_mul(d)?)?;
        }
        Some(total)
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
            _ => (4, 2),
        };
        ModelConfig {
            style,
            vocab_size,
            n_layers: 2,
            n_heads,
            n_kv_heads,
            d_model: 128,
            d_ff: if style == Style::Gpt2 { 512 } else { 352 },
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
