//! [`Arch`]: everything that distinguishes one decoder-only transformer from another,
//! as data. The block in [`super::Transformer`] reads it; the files under
//! [`crate::arch`] fill it from a Hugging Face `config.json` or GGUF metadata.
//!
//! It reads and writes itself as JSON ([`Arch::to_json`], [`Arch::from_json`]: a
//! fine-tuning checkpoint's `arch.json`); the field names are the Rust ones, the
//! choices snake case (`"rms"`, `"swiglu"`, `{"type": "llama3", ...}`).

use fusebox::{Error, Result, RopeStyle, Routing};
use serde::{Deserialize, Serialize};

/// Which normalisation the blocks use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormKind {
    /// `(x − mean)/sqrt(var + eps)·w + b` (GPT-2).
    LayerNorm,
    /// `x/sqrt(mean(x²) + eps)·w`. Gemma's `(1 + w)` form is this with `1 + w` stored
    /// (HF weights get the 1 added at load, as llama.cpp's converter does).
    Rms,
}

/// The MLP of a block.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mlp {
    /// `down(gelu_tanh(up(x)))` (GPT-2's `fc` / `proj`).
    Gelu,
    /// `down(silu(gate(x)) · up(x))` (Llama).
    SwiGlu,
    /// `down(gelu_tanh(gate(x)) · up(x))` (Gemma).
    GeGlu,
    /// `down((u' + 1)·g'·σ(α·g'))` with `g' = min(gate(x), limit)` and
    /// `u' = clamp(up(x), −limit, limit)` (gpt-oss: α = 1.702, limit = 7).
    #[serde(rename = "clamped_swiglu")]
    ClampedSwiGlu {
        /// The sigmoid's gain α.
        alpha: f32,
        /// The clamp of the gate (above) and the up projection (both sides).
        limit: f32,
    },
}

impl Mlp {
    /// Whether the MLP has a gate beside its up projection.
    pub fn gated(self) -> bool {
        !matches!(self, Mlp::Gelu)
    }
}

/// A mixture-of-experts MLP: per token a router (`[experts, D]`) picks `top_k` of
/// `experts` gated MLPs (the block's activation, [`Arch::mlp`], hidden width `d_expert`)
/// and sums their outputs, each times its routing weight; plus, when there is one, a
/// shared expert every token uses, scaled by a sigmoid gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Moe {
    /// Experts per layer.
    pub experts: usize,
    /// Experts each token uses.
    pub top_k: usize,
    /// Hidden width of one expert.
    pub d_expert: usize,
    /// How router logits become the chosen experts' weights.
    #[serde(with = "routing")]
    pub routing: Routing,
    /// Weight of the load-balancing loss in training (transformers'
    /// `router_aux_loss_coef` when `output_router_logits`; 0: none).
    #[serde(default)]
    pub aux_loss_coef: f32,
    /// A shared expert of this hidden width that every token also uses, its output
    /// scaled by `σ(x·w_gate)` (Qwen2-MoE, Qwen3-Next: `shared_expert`,
    /// `shared_expert_gate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub d_shared: Option<usize>,
    /// Layers whose MLP is dense (width [`Arch::d_ff`]) instead (Qwen3-MoE's
    /// `mlp_only_layers`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dense_layers: Vec<usize>,
}

/// [`Routing`] as JSON: `"softmax_topk"`, `"softmax_topk_normalized"` or `"topk_softmax"`.
mod routing {
    use fusebox::Routing;
    use serde::{Deserialize, Deserializer, Serializer};

    const NAMES: &[(&str, Routing)] = &[
        ("softmax_topk", Routing::SoftmaxTopK),
        ("softmax_topk_normalized", Routing::SoftmaxTopKNormalized),
        ("topk_softmax", Routing::TopKSoftmax),
    ];

    pub fn serialize<S: Serializer>(r: &Routing, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(NAMES.iter().find(|(_, v)| v == r).map_or("softmax_topk", |(n, _)| n))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Routing, D::Error> {
        let name = String::deserialize(d)?;
        NAMES.iter().find(|(n, _)| *n == name).map(|(_, r)| *r).ok_or_else(|| {
            serde::de::Error::unknown_variant(&name, &["softmax_topk", "softmax_topk_normalized", "topk_softmax"])
        })
    }
}

/// How positions enter the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Positions {
    /// A learned table `[context_length, D]` added to the token embeddings (GPT-2).
    Learned,
    /// Rotary embeddings of q and k.
    Rope,
}

/// How rotary frequencies are rescaled for a longer context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "ScalingJson", try_from = "ScalingJson")]
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
    /// YaRN (Peng et al. 2023, transformers' `yarn`): frequencies below the correction
    /// range divided by `factor`, above it kept, a linear ramp between (over pair index,
    /// from where `beta_fast` to where `beta_slow` rotations fit the original context,
    /// floored/ceiled when `truncate`), and cos/sin multiplied by `attention_factor`.
    Yarn {
        /// Divisor of the interpolated frequencies.
        factor: f64,
        /// The context length the model was pretrained with.
        original_max_positions: f64,
        /// Rotations over the original context at the ramp's high-frequency end.
        beta_fast: f64,
        /// Rotations at its low-frequency end.
        beta_slow: f64,
        /// Factor on cos and sin (transformers' `attention_factor`; `0.1·ln(factor) + 1` by default).
        attention_factor: f64,
        /// Whether the ramp's ends are rounded to whole pairs.
        truncate: bool,
    },
}

/// [`RopeScaling`] as JSON: `{"type": "none" | "linear" | "llama3" | "freq_factors", ...}`
/// with the numbers of its kind. Read as one flat object (not a serde-tagged enum) so a
/// bad number's error names its path (`rope.scaling.factor`).
#[derive(Serialize, Deserialize)]
struct ScalingJson {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    low_freq_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    high_freq_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    original_max_positions: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    factors: Option<Vec<f32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    beta_fast: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    beta_slow: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attention_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    truncate: Option<bool>,
}

impl From<RopeScaling> for ScalingJson {
    fn from(s: RopeScaling) -> ScalingJson {
        let mut j = ScalingJson {
            kind: String::new(),
            factor: None,
            low_freq_factor: None,
            high_freq_factor: None,
            original_max_positions: None,
            factors: None,
            beta_fast: None,
            beta_slow: None,
            attention_factor: None,
            truncate: None,
        };
        j.kind = match s {
            RopeScaling::None => "none",
            RopeScaling::Linear { factor } => {
                j.factor = Some(factor);
                "linear"
            }
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_positions } => {
                j.factor = Some(factor);
                j.low_freq_factor = Some(low_freq_factor);
                j.high_freq_factor = Some(high_freq_factor);
                j.original_max_positions = Some(original_max_positions);
                "llama3"
            }
            RopeScaling::FreqFactors(factors) => {
                j.factors = Some(factors);
                "freq_factors"
            }
            RopeScaling::Yarn { factor, original_max_positions, beta_fast, beta_slow, attention_factor, truncate } => {
                j.factor = Some(factor);
                j.original_max_positions = Some(original_max_positions);
                j.beta_fast = Some(beta_fast);
                j.beta_slow = Some(beta_slow);
                j.attention_factor = Some(attention_factor);
                j.truncate = Some(truncate);
                "yarn"
            }
        }
        .to_string();
        j
    }
}

impl TryFrom<ScalingJson> for RopeScaling {
    type Error = String;
    fn try_from(j: ScalingJson) -> std::result::Result<RopeScaling, String> {
        let ScalingJson {
            kind,
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_positions,
            factors,
            beta_fast,
            beta_slow,
            attention_factor,
            truncate,
        } = j;
        let need = |v: Option<f64>, name: &str| v.ok_or_else(|| format!("{kind} scaling needs '{name}'"));
        Ok(match kind.as_str() {
            "none" => RopeScaling::None,
            "linear" => RopeScaling::Linear { factor: need(factor, "factor")? },
            "llama3" => RopeScaling::Llama3 {
                factor: need(factor, "factor")?,
                low_freq_factor: need(low_freq_factor, "low_freq_factor")?,
                high_freq_factor: need(high_freq_factor, "high_freq_factor")?,
                original_max_positions: need(original_max_positions, "original_max_positions")?,
            },
            "freq_factors" => RopeScaling::FreqFactors(factors.ok_or("freq_factors scaling needs 'factors'")?),
            "yarn" => RopeScaling::Yarn {
                factor: need(factor, "factor")?,
                original_max_positions: need(original_max_positions, "original_max_positions")?,
                beta_fast: need(beta_fast, "beta_fast")?,
                beta_slow: need(beta_slow, "beta_slow")?,
                attention_factor: need(attention_factor, "attention_factor")?,
                truncate: truncate.unwrap_or(true),
            },
            other => return Err(format!("type '{other}': expected one of none, linear, llama3, freq_factors, yarn")),
        })
    }
}

/// [`RopeStyle`] as JSON: `"half_split"` or `"interleaved"`.
mod rope_style {
    use fusebox::RopeStyle;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(style: &RopeStyle, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match style {
            RopeStyle::HalfSplit => "half_split",
            RopeStyle::Interleaved => "interleaved",
        })
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<RopeStyle, D::Error> {
        match String::deserialize(d)?.as_str() {
            "half_split" => Ok(RopeStyle::HalfSplit),
            "interleaved" => Ok(RopeStyle::Interleaved),
            other => Err(serde::de::Error::unknown_variant(other, &["half_split", "interleaved"])),
        }
    }
}

/// One rotary embedding: base, scaling and pair convention.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rope {
    /// The base θ.
    pub theta: f64,
    /// How the frequencies are rescaled.
    pub scaling: RopeScaling,
    /// HalfSplit for HF weights and llama.cpp's NEOX archs; Interleaved for GGUF llama
    /// (whose converter permutes q/k rows to adjacent pairs).
    #[serde(with = "rope_style")]
    pub style: RopeStyle,
}

impl Rope {
    /// Plain rope of base `theta` (no scaling) in `style`.
    pub fn plain(theta: f64, style: RopeStyle) -> Rope {
        Rope { theta, scaling: RopeScaling::None, style }
    }

    /// The rotary angle per position for each pair `i < head_dim/2`:
    /// `θ^(−2i/head_dim)` rescaled as [`RopeScaling`] says.
    pub fn frequencies(&self, head_dim: usize) -> Vec<f64> {
        let d = head_dim as f64;
        if let RopeScaling::Yarn { factor, original_max_positions, beta_fast, beta_slow, truncate, .. } = self.scaling {
            // Pair index where `rotations` turns fit the original context.
            let dim_of = |rotations: f64| {
                d * (original_max_positions / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * self.theta.ln())
            };
            let (mut low, mut high) = (dim_of(beta_fast), dim_of(beta_slow));
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
            if low == high {
                high += 0.001;
            }
            return (0..head_dim / 2)
                .map(|i| {
                    let extrapolated = self.theta.powf(-2.0 * i as f64 / d);
                    let interpolated = extrapolated / factor;
                    // 1 below the ramp (kept), 0 above it (interpolated).
                    let keep = 1.0 - ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    interpolated * (1.0 - keep) + extrapolated * keep
                })
                .collect();
        }
        (0..head_dim / 2)
            .map(|i| {
                let freq = self.theta.powf(-2.0 * i as f64 / d);
                match &self.scaling {
                    RopeScaling::None | RopeScaling::Yarn { .. } => freq,
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

    /// The factor on cos and sin (YaRN's attention factor; 1 otherwise).
    pub fn attention_factor(&self) -> f64 {
        match self.scaling {
            RopeScaling::Yarn { attention_factor, .. } => attention_factor,
            _ => 1.0,
        }
    }

    fn validate(&self, what: &str, head_dim: usize) -> Result<()> {
        let bad = |field: &str, expected: String, got: String| {
            Err(Error::value("Arch", format!("{what}.{field}"), expected, got))
        };
        if !(self.theta > 0.0 && self.theta.is_finite()) {
            return bad("theta", "a finite value > 0".into(), self.theta.to_string());
        }
        match &self.scaling {
            RopeScaling::FreqFactors(f) if f.len() != head_dim / 2 => {
                bad("freq_factors", format!("{} factors (head_dim / 2)", head_dim / 2), f.len().to_string())
            }
            RopeScaling::FreqFactors(f) if f.iter().any(|v| !v.is_finite() || *v <= 0.0) => {
                bad("freq_factors", "finite values > 0".into(), format!("{f:?}"))
            }
            RopeScaling::Linear { factor } | RopeScaling::Llama3 { factor, .. } | RopeScaling::Yarn { factor, .. }
                if !factor.is_finite() || *factor <= 0.0 =>
            {
                bad("scaling.factor", "a finite value > 0".into(), factor.to_string())
            }
            RopeScaling::Llama3 { low_freq_factor: lo, high_freq_factor: hi, original_max_positions: n, .. }
                if !(lo.is_finite() && hi.is_finite() && *lo > 0.0 && hi > lo && n.is_finite() && *n > 0.0) =>
            {
                bad(
                    "scaling (llama3)",
                    "0 < low_freq_factor < high_freq_factor, positions > 0".into(),
                    format!("{lo}, {hi}, {n}"),
                )
            }
            RopeScaling::Yarn { original_max_positions: n, beta_fast, beta_slow, attention_factor, .. }
                if ![*n, *beta_fast, *beta_slow, *attention_factor].iter().all(|v| v.is_finite() && *v > 0.0) =>
            {
                bad(
                    "scaling (yarn)",
                    "positions, beta_fast, beta_slow and attention_factor finite and > 0".into(),
                    format!("{n}, {beta_fast}, {beta_slow}, {attention_factor}"),
                )
            }
            _ => Ok(()),
        }
    }
}

/// Which attention a layer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerAttention {
    /// Every earlier position, the global rope.
    Global,
    /// The last [`Arch::sliding_window`] positions, the local rope when there is one
    /// ([`Arch::rope_local`]), else the global one.
    Local,
    /// No softmax attention: the Gated DeltaNet of [`Arch::linear_attention`] (a state
    /// of fixed size instead of keys and values, no rope).
    Linear,
}

/// The Gated DeltaNet token mixer of linear-attention layers (Qwen3.5, Qwen3-Next):
/// ```text
/// qkv, z, b, a = h·W_qkvᵀ, h·W_zᵀ, h·W_bᵀ, h·W_aᵀ
/// q, k, v = split(silu(causal_depthwise_conv(qkv)))        kernel `conv_kernel`
/// q, k = l2_norm(q), l2_norm(k)                             per head
/// β = σ(b);  g = −exp(a_log)·softplus(a + dt_bias)          per value head
/// o = gated_delta_rule(q, k, v, g, β; scale = k_dim^−½)
/// out = (rms_norm(o, w)·silu(z))·W_outᵀ                     the norm per value head, plain w
/// ```
/// The conv channels are q, k, v in that order (`2·k_heads·k_dim + v_heads·v_dim`);
/// value head `h` reads key head `h / (v_heads / k_heads)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinearAttention {
    /// Query/key heads.
    pub k_heads: usize,
    /// Value heads (a multiple of `k_heads`).
    pub v_heads: usize,
    /// Width of a query/key head.
    pub k_dim: usize,
    /// Width of a value head.
    pub v_dim: usize,
    /// Taps of the causal depthwise convolution.
    pub conv_kernel: usize,
}

impl LinearAttention {
    /// Width of the queries (and of the keys): `k_heads · k_dim`.
    pub fn key_width(&self) -> usize {
        self.k_heads * self.k_dim
    }

    /// Width of the values (and of the output and `z`): `v_heads · v_dim`.
    pub fn value_width(&self) -> usize {
        self.v_heads * self.v_dim
    }

    /// Channels of the convolution: q, k and v.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_width() + self.value_width()
    }
}

/// Which projections carry a bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Biases {
    /// q, k and v (GPT-2, Qwen2).
    pub qkv: bool,
    /// The attention output projection (GPT-2).
    pub o: bool,
    /// The MLP's projections (GPT-2).
    pub mlp: bool,
    /// The router and every expert's projections (gpt-oss).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub experts: bool,
}

/// The description of a decoder-only transformer: sizes and every choice the block makes.
///
/// Per block, with `x` the residual stream:
/// ```text
/// h = norm1(x);  q, k, v = h·Wqᵀ(+b), h·Wkᵀ(+b), h·Wvᵀ(+b)
/// q, k = rope(qk_norm(q)), rope(qk_norm(k))          (qk_norm when `qk_norm`)
/// a = attention(q, k, v; scale, window of the layer, sinks)·Woᵀ(+b)
/// x = x + post_attn_norm(a)                           (post norm when `post_norms`)
/// x = x + post_mlp_norm(mlp(norm2(x)))
/// ```
/// then `logits = norm_f(x)·Wheadᵀ`; the input is `embed(ids)·embed_scale (+ pos)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Arch {
    /// Architecture name as the file states it (`llama`, `qwen3`, `gemma3`, ...).
    pub name: String,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Decoder blocks.
    pub n_layers: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (fewer than `n_heads` with grouped-query attention).
    pub n_kv_heads: usize,
    /// Width of one attention head (need not be `d_model / n_heads`).
    pub head_dim: usize,
    /// Hidden width of the MLP.
    pub d_ff: usize,
    /// Longest context (learned position table, rope tables, KV caches).
    pub context_length: usize,
    /// The norm of every block and the final one.
    pub norm: NormKind,
    /// Epsilon of the norms.
    pub norm_eps: f32,
    /// Norms on the attention and MLP outputs before the residual adds (Gemma).
    pub post_norms: bool,
    /// Per-head RMS norms of q and k before rope (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// The QK-norms span all heads (weights `[Hq·hd]`, `[Hkv·hd]`, applied before the
    /// split into heads: OLMoE) instead of one head.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm_whole: bool,
    /// The MLP.
    pub mlp: Mlp,
    /// Learned positions or rope.
    pub positions: Positions,
    /// The rope of global layers (unused with learned positions).
    pub rope: Rope,
    /// The rope of local (sliding-window) layers when it differs (Gemma 3).
    pub rope_local: Option<Rope>,
    /// Keys a local layer sees: query i sees keys j with i − W < j ≤ i.
    pub sliding_window: Option<usize>,
    /// Global or local attention, per layer (`n_layers` entries).
    pub layer_attention: Vec<LayerAttention>,
    /// Which projections have a bias.
    pub bias: Biases,
    /// Attention logits are `q·kᵀ·attn_scale` (usually `1/sqrt(head_dim)`).
    pub attn_scale: f32,
    /// Token embeddings are multiplied by this (Gemma: `sqrt(d_model)`); 1 elsewhere.
    pub embed_scale: f32,
    /// The output head is the token embedding table.
    pub tied_embeddings: bool,
    /// One learned logit per query head in every attention softmax's denominator
    /// (gpt-oss's sinks).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attn_sinks: bool,
    /// Mixture-of-experts MLPs (in every layer but [`Moe::dense_layers`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<Moe>,
    /// The token mixer of the [`LayerAttention::Linear`] layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear_attention: Option<LinearAttention>,
    /// The attention output is multiplied by `σ(gate)` before `Wo`, the gate a second
    /// half of each query head's rows in `attn.q` (`[Hq·2·hd, D]`, per head q then gate:
    /// Qwen3.5, Qwen3-Next).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attn_output_gate: bool,
    /// Rotated dims of each head when fewer than `head_dim` (partial rotary: the first
    /// `rotary_dim` dims rotate, the rest pass through).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotary_dim: Option<usize>,
}

impl Arch {
    /// Width of the query projection (`n_heads · head_dim`).
    pub fn q_dim(&self) -> usize {
        self.n_heads.saturating_mul(self.head_dim)
    }

    /// Rows of the query projection: `q_dim`, twice that with an output gate (each
    /// head's query rows, then its gate rows).
    pub fn q_proj_width(&self) -> usize {
        self.q_dim().saturating_mul(if self.attn_output_gate { 2 } else { 1 })
    }

    /// Width of the key and value projections (`n_kv_heads · head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads.saturating_mul(self.head_dim)
    }

    /// Dims of a head that rope rotates (`head_dim` unless partial).
    pub fn rotary_dims(&self) -> usize {
        self.rotary_dim.unwrap_or(self.head_dim)
    }

    /// Whether layer `l` is a linear-attention (Gated DeltaNet) layer.
    pub fn is_linear(&self, l: usize) -> bool {
        self.layer_attention.get(l) == Some(&LayerAttention::Linear)
    }

    /// Layers with softmax attention (the ones with a KV cache).
    pub fn attention_layers(&self) -> usize {
        (0..self.n_layers).filter(|&l| !self.is_linear(l)).count()
    }

    /// The window of layer `l` (`None`: global attention).
    pub fn window(&self, l: usize) -> Option<usize> {
        match self.layer_attention.get(l) {
            Some(LayerAttention::Local) => self.sliding_window,
            _ => None,
        }
    }

    /// The rope of layer `l`: `rope_local` for local layers when there is one.
    pub fn rope_of(&self, l: usize) -> &Rope {
        match (self.layer_attention.get(l), &self.rope_local) {
            (Some(LayerAttention::Local), Some(local)) => local,
            _ => &self.rope,
        }
    }

    /// The experts of layer `l`, when its MLP is a mixture of experts.
    pub fn experts_at(&self, l: usize) -> Option<&Moe> {
        self.moe.as_ref().filter(|m| !m.dense_layers.contains(&l))
    }

    /// `self` as JSON (every field).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("an Arch is plain numbers, names and lists")
    }

    /// Reads what [`to_json`](Self::to_json) wrote and validates it
    /// ([`validate`](Self::validate)); `what` (the file) and the field path head every
    /// error.
    pub fn from_json(v: &serde_json::Value, what: &str) -> Result<Arch> {
        let arch: Arch = crate::files::from_json_value(v, what)?;
        arch.validate().map_err(|e| Error::Io(format!("{what}: {e}")))?;
        Ok(arch)
    }

    /// Checks that the sizes fit together; an error names the field, what was
    /// expected and what came.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, expected: String, got: String| Err(Error::value("Arch", what, expected, got));
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
        // Every width the model allocates must be representable.
        let widths = [
            ("n_heads × head_dim", self.n_heads.checked_mul(self.head_dim)),
            ("n_kv_heads × head_dim", self.n_kv_heads.checked_mul(self.head_dim)),
            ("vocab_size × d_model", self.vocab_size.checked_mul(self.d_model)),
            ("d_ff × d_model", self.d_ff.checked_mul(self.d_model)),
            ("context_length × d_model", self.context_length.checked_mul(self.d_model)),
        ];
        for (what, v) in widths {
            if v.is_none_or(|v| v > isize::MAX as usize / 8) {
                return bad(what, "a size that fits in memory".into(), "an overflowing product".into());
            }
        }
        if self.positions == Positions::Rope && !self.head_dim.is_multiple_of(2) {
            return bad("head_dim", "even (rotary pairs)".into(), self.head_dim.to_string());
        }
        if !(self.norm_eps > 0.0 && self.norm_eps.is_finite()) {
            return bad("norm_eps", "a finite value > 0".into(), self.norm_eps.to_string());
        }
        for (what, v) in [("attn_scale", self.attn_scale), ("embed_scale", self.embed_scale)] {
            if !(v > 0.0 && v.is_finite()) {
                return bad(what, "a finite value > 0".into(), v.to_string());
            }
        }
        if self.layer_attention.len() != self.n_layers {
            return bad(
                "layer_attention",
                format!("one entry per layer ({})", self.n_layers),
                self.layer_attention.len().to_string(),
            );
        }
        let any_local = self.layer_attention.contains(&LayerAttention::Local);
        match self.sliding_window {
            Some(0) => return bad("sliding_window", "> 0".into(), "0".into()),
            None if any_local => return bad("sliding_window", "a window for the local layers".into(), "none".into()),
            _ => {}
        }
        if let Some(m) = &self.moe {
            if m.experts == 0 || m.experts > u32::MAX as usize {
                return bad("moe.experts", "1..=2³²".into(), m.experts.to_string());
            }
            if m.top_k == 0 || m.top_k > m.experts {
                return bad("moe.top_k", format!("1..={} (the experts)", m.experts), m.top_k.to_string());
            }
            if m.d_expert == 0 {
                return bad("moe.d_expert", "> 0".into(), "0".into());
            }
            if m.d_shared == Some(0) {
                return bad("moe.d_shared", "> 0 or none".into(), "0".into());
            }
            let per_layer = m.experts.checked_mul(m.d_expert).and_then(|v| v.checked_mul(self.d_model));
            if per_layer.is_none_or(|v| v > isize::MAX as usize / 8) {
                return bad(
                    "moe",
                    "experts × d_expert × d_model that fits in memory".into(),
                    "an overflowing product".into(),
                );
            }
            if !(m.aux_loss_coef >= 0.0 && m.aux_loss_coef.is_finite()) {
                return bad("moe.aux_loss_coef", "a finite value ≥ 0".into(), m.aux_loss_coef.to_string());
            }
            if !self.mlp.gated() {
                return bad("mlp", "a gated MLP (experts are gated)".into(), format!("{:?}", self.mlp));
            }
            if let Some(l) = m.dense_layers.iter().find(|&&l| l >= self.n_layers) {
                return bad("moe.dense_layers", format!("layers < {}", self.n_layers), l.to_string());
            }
        }
        let any_linear = self.layer_attention.contains(&LayerAttention::Linear);
        match &self.linear_attention {
            None if any_linear => {
                return bad("linear_attention", "the token mixer of the linear layers".into(), "none".into())
            }
            Some(la) => {
                let sizes = [
                    ("k_heads", la.k_heads),
                    ("v_heads", la.v_heads),
                    ("k_dim", la.k_dim),
                    ("v_dim", la.v_dim),
                    ("conv_kernel", la.conv_kernel),
                ];
                if let Some((what, _)) = sizes.iter().find(|(_, v)| *v == 0) {
                    return bad(&format!("linear_attention.{what}"), "> 0".into(), "0".into());
                }
                if !la.v_heads.is_multiple_of(la.k_heads) {
                    return bad(
                        "linear_attention.v_heads",
                        format!("a multiple of k_heads ({})", la.k_heads),
                        la.v_heads.to_string(),
                    );
                }
                // The input projection `[C, D]` and one layer's state `[Hv, dk, dv]`.
                let conv = la
                    .k_heads
                    .checked_mul(la.k_dim)
                    .zip(la.v_heads.checked_mul(la.v_dim))
                    .and_then(|(k, v)| k.checked_mul(2)?.checked_add(v)?.checked_mul(self.d_model));
                let state = la.v_heads.checked_mul(la.k_dim).and_then(|n| n.checked_mul(la.v_dim));
                if [conv, state].iter().any(|w| w.is_none_or(|v| v > isize::MAX as usize / 8)) {
                    return bad(
                        "linear_attention",
                        "widths that fit in memory".into(),
                        "an overflowing product".into(),
                    );
                }
            }
            None => {}
        }
        if let Some(r) = self.rotary_dim {
            if r < 2 || r > self.head_dim || !r.is_multiple_of(2) {
                return bad("rotary_dim", format!("even, 2..={} (head_dim)", self.head_dim), r.to_string());
            }
        }
        if let Mlp::ClampedSwiGlu { alpha, limit } = self.mlp {
            if !(alpha > 0.0 && alpha.is_finite() && limit > 0.0 && limit.is_finite()) {
                return bad(
                    "mlp (clamped_swiglu)",
                    "alpha and limit finite and > 0".into(),
                    format!("{alpha}, {limit}"),
                );
            }
        }
        self.rope.validate("rope", self.rotary_dims())?;
        if let Some(local) = &self.rope_local {
            local.validate("rope_local", self.rotary_dims())?;
        }
        Ok(())
    }
}
