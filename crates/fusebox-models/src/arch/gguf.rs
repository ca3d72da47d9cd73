//! GGUF metadata, both ways: [`GgufKeys`] reads an architecture's `{arch}.*` keys
//! (typed, every error naming the key), [`gguf_llama_like`] starts an architecture's
//! description from them, and [`GgufMetaOut`] writes them under llama.cpp's key names.

use fusebox::{Error, Result, RopeStyle};

use crate::gguf::{Metadata, Value};
use crate::transformer::{Arch, Biases, LayerAttention, Mlp, NormKind, Positions, Rope, RopeScaling};

fn io(msg: impl Into<String>) -> Error {
    Error::Io(msg.into())
}

/// Typed, error-naming access to the `{arch}.*` keys of GGUF metadata.
pub struct GgufKeys<'a> {
    /// The metadata.
    pub meta: &'a Metadata,
    /// `general.architecture`.
    pub arch: String,
    /// The tokenizer's size (when `{arch}.vocab_size` is absent).
    pub vocab_from_tokens: Option<usize>,
    /// Tensors the file holds: the most layers it can have.
    pub tensors: usize,
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

    /// `{arch}.block_count`: > 0, and no more than the tensors the file holds (each
    /// layer has its own), checked before the count sizes anything.
    pub fn layers(&self) -> Result<usize> {
        let n = self.size("block_count")?;
        if n > self.tensors {
            return Err(Error::value(
                "gguf",
                format!("metadata '{}'", self.key("block_count")),
                format!("at most the {} tensors the file holds (each layer has its own)", self.tensors),
                n,
            ));
        }
        Ok(n)
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
/// A `rope.dimension_count` below the head size (partial rotary) is refused.
pub fn gguf_llama_like(k: &GgufKeys<'_>, style: RopeStyle) -> Result<Arch> {
    llama_like(k, style, false)
}

/// [`gguf_llama_like`] of an architecture that rotates only the first
/// `rope.dimension_count` dims of each head (Qwen3.5): that count, when below the head
/// size, is the description's `rotary_dim`.
pub fn gguf_llama_like_partial_rope(k: &GgufKeys<'_>, style: RopeStyle) -> Result<Arch> {
    llama_like(k, style, true)
}

fn llama_like(k: &GgufKeys<'_>, style: RopeStyle, partial: bool) -> Result<Arch> {
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
    let rope_dims = k.opt_size("rope.dimension_count")?;
    let rotary_dim = rope_dims.filter(|&r| partial && r < head_dim);
    if let Some(rot) = rope_dims.filter(|_| rotary_dim.is_none()) {
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
        Some("yarn") => gguf_yarn(k)?,
        Some(other) => {
            return Err(Error::unsupported(
                "gguf",
                format!("rope scaling type '{other}' is not supported (supported: none, linear, yarn)"),
            ))
        }
    };
    let n_layers = k.layers()?;
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
        qk_norm_whole: false,
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
        attn_sinks: false,
        moe: None,
        linear_attention: None,
        attn_output_gate: false,
        rotary_dim,
    })
}

/// YaRN as llama.cpp runs it: `rope.scaling.factor`, `rope.scaling.original_context_length`
/// (else the context length), `yarn_beta_fast` / `yarn_beta_slow` (32 and 1 by
/// default), the ramp's ends always rounded to whole pairs, and cos/sin scaled by
/// `(1 + 0.1·ln factor)·rope.scaling.attn_factor` (llama.cpp cancels a file's
/// `yarn_attn_factor` and applies this; DeepSeek's `yarn_log_multiplier` is refused).
fn gguf_yarn(k: &GgufKeys<'_>) -> Result<RopeScaling> {
    let factor = k.require_float("rope.scaling.factor")?;
    if !(factor.is_finite() && factor > 0.0) {
        return Err(Error::value("gguf", format!("metadata '{}'", k.key("rope.scaling.factor")), "> 0", factor));
    }
    if k.float("rope.scaling.yarn_log_multiplier")?.is_some_and(|m| m != 0.0) {
        return Err(Error::unsupported(
            "gguf",
            format!("{} (DeepSeek's YaRN) is not supported", k.key("rope.scaling.yarn_log_multiplier")),
        ));
    }
    let original = match k.opt_size("rope.scaling.original_context_length")? {
        Some(n) => n,
        None => k.size("context_length")?,
    };
    let mscale = if factor <= 1.0 { 1.0 } else { 0.1 * factor.ln() + 1.0 };
    Ok(RopeScaling::Yarn {
        factor,
        original_max_positions: original as f64,
        beta_fast: k.float("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
        beta_slow: k.float("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
        attention_factor: mscale * k.float("rope.scaling.attn_factor")?.unwrap_or(1.0),
        truncate: true,
    })
}

/// GGUF metadata being written: `general.*` and the `{arch}.*` keys, in order.
#[derive(Debug)]
pub struct GgufMetaOut {
    arch: String,
    entries: Vec<(String, Value)>,
}

impl GgufMetaOut {
    /// Metadata of a file whose `general.architecture` is `arch`.
    pub fn new(arch: &str) -> GgufMetaOut {
        let entries = vec![("general.architecture".to_string(), Value::String(arch.to_string()))];
        GgufMetaOut { arch: arch.to_string(), entries }
    }

    /// `general.architecture`, the prefix of its `{arch}.*` keys.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Sets a key as it is (`general.file_type`).
    pub fn put(&mut self, key: &str, v: Value) {
        self.entries.push((key.to_string(), v));
    }

    /// `{arch}.{key}` = `n` as a u32; `what` names the size in the error when it does not fit.
    pub fn size(&mut self, key: &str, what: &str, n: usize) -> Result<()> {
        let v = u32::try_from(n).map_err(|_| Error::value("export", what.to_string(), "≤ u32::MAX", n))?;
        self.entries.push((format!("{}.{key}", self.arch), Value::U32(v)));
        Ok(())
    }

    /// `{arch}.{key}` = `x` as an f32.
    pub fn float(&mut self, key: &str, x: f64) {
        self.entries.push((format!("{}.{key}", self.arch), Value::F32(x as f32)));
    }

    /// `{arch}.{key}` = `s`.
    pub fn string(&mut self, key: &str, s: &str) {
        self.entries.push((format!("{}.{key}", self.arch), Value::String(s.to_string())));
    }

    /// The entries, in the order set.
    pub fn into_entries(self) -> Vec<(String, Value)> {
        self.entries
    }
}

/// The `{arch}.*` keys every architecture writes alike: sizes, the norm epsilon under
/// the key of its norm, the rope and the sliding window.
pub fn write_common(arch: &Arch, m: &mut GgufMetaOut) -> Result<()> {
    m.size("vocab_size", "vocab_size", arch.vocab_size)?;
    m.size("context_length", "context_length", arch.context_length)?;
    m.size("embedding_length", "d_model", arch.d_model)?;
    m.size("block_count", "n_layers", arch.n_layers)?;
    m.size("feed_forward_length", "d_ff", arch.d_ff)?;
    m.size("attention.head_count", "n_heads", arch.n_heads)?;
    match arch.norm {
        NormKind::LayerNorm => m.float("attention.layer_norm_epsilon", f64::from(arch.norm_eps)),
        NormKind::Rms => m.float("attention.layer_norm_rms_epsilon", f64::from(arch.norm_eps)),
    }
    if arch.positions == Positions::Rope {
        m.float("rope.freq_base", arch.rope.theta);
        m.size("rope.dimension_count", "rotary dims", arch.rotary_dims())?;
        match arch.rope.scaling {
            RopeScaling::Linear { factor } => {
                m.string("rope.scaling.type", "linear");
                m.float("rope.scaling.factor", factor);
            }
            // As `gguf_yarn` reads it back; llama.cpp always rounds the ramp's ends
            // (`truncate`), which a model trained without rounding differs from slightly.
            RopeScaling::Yarn { factor, original_max_positions, beta_fast, beta_slow, attention_factor, .. } => {
                m.string("rope.scaling.type", "yarn");
                m.float("rope.scaling.factor", factor);
                m.size(
                    "rope.scaling.original_context_length",
                    "rope.scaling.original_max_positions",
                    original_max_positions as usize,
                )?;
                m.float("rope.scaling.yarn_beta_fast", beta_fast);
                m.float("rope.scaling.yarn_beta_slow", beta_slow);
                let mscale = if factor <= 1.0 { 1.0 } else { 0.1 * factor.ln() + 1.0 };
                if (attention_factor / mscale - 1.0).abs() > 1e-6 {
                    m.float("rope.scaling.attn_factor", attention_factor / mscale);
                }
            }
            _ => {}
        }
    }
    if let Some(w) = arch.sliding_window {
        m.size("attention.sliding_window", "sliding_window", w)?;
    }
    Ok(())
}

/// llama.cpp's Llama keys beyond [`write_common`]: the key/value head count, and the
/// head size when it is not `d_model / heads`.
pub fn write_llama_like(arch: &Arch, m: &mut GgufMetaOut) -> Result<()> {
    m.size("attention.head_count_kv", "n_kv_heads", arch.n_kv_heads)?;
    if arch.head_dim * arch.n_heads != arch.d_model {
        write_head_size(arch, m)?;
    }
    Ok(())
}

/// `attention.key_length` and `attention.value_length`: the head size.
pub fn write_head_size(arch: &Arch, m: &mut GgufMetaOut) -> Result<()> {
    m.size("attention.key_length", "head_dim", arch.head_dim)?;
    m.size("attention.value_length", "head_dim", arch.head_dim)
}
