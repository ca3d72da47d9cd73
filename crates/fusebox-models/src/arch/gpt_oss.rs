//! gpt-oss (OpenAI): a mixture of experts on every layer with biases everywhere — q, k,
//! v, o, the router and each expert's projections — routed top-k then softmax over the k
//! logits, experts with the clamped SwiGLU `(u' + 1)·g'·σ(1.702·g')` (clamp 7);
//! attention with one learned sink logit per head in every softmax's denominator,
//! sliding-window (128) and full layers alternating from a sliding first layer, YaRN
//! rope. Hugging Face fuses each layer's experts into 3-D tensors: `gate_up_proj`
//! `[E, D, 2F]` with gate and up interleaved along its last axis, `down_proj` `[E, F, D]`
//! (both `[in, out]`), biases `[E, 2F]` and `[E, D]`. llama.cpp (`gpt-oss`) stores them
//! split and `[out, in]` as every MoE, the post-attention norm as `post_attention_norm`,
//! and fixes α, the clamp and the sliding pattern.

use fusebox::{Error, Result, RopeStyle, Routing};
use serde_json::json;

use super::llama;
use super::moe::{gguf_moe, hf_moe, write_hf_moe};
use super::names::{GGUF_NAMES, HF_LLAMA_NAMES};
use super::preset::Preset;
use super::{
    hf_llama_like, Architecture, Fix, GgufFacts, GgufKeys, GgufMetaOut, HfConfig, HfConfigOut, HfFacts, NameTable,
};
use crate::transformer::{Arch, LayerAttention, Mlp, Moe};

/// gpt-oss.
pub struct GptOss;

/// The SwiGLU gain and clamp of every gpt-oss (llama.cpp's fixed `swiglu_oai` constants).
const ALPHA: f32 = 1.702;
const LIMIT: f32 = 7.0;

static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.",
    layer: &[
        ("attn.sinks", "self_attn.sinks", Fix::None),
        ("mlp.router.weight", "mlp.router.weight", Fix::None),
        ("mlp.router.bias", "mlp.router.bias", Fix::None),
        ("mlp.experts.gate.weight", "mlp.experts.gate_up_proj", Fix::InterleavedTransposed(0)),
        ("mlp.experts.up.weight", "mlp.experts.gate_up_proj", Fix::InterleavedTransposed(1)),
        ("mlp.experts.gate.bias", "mlp.experts.gate_up_proj_bias", Fix::Interleaved(0)),
        ("mlp.experts.up.bias", "mlp.experts.gate_up_proj_bias", Fix::Interleaved(1)),
        ("mlp.experts.down.weight", "mlp.experts.down_proj", Fix::Transpose),
        ("mlp.experts.down.bias", "mlp.experts.down_proj_bias", Fix::None),
    ],
    global: &[],
    extends: Some(&HF_LLAMA_NAMES),
};

static GGUF_OSS_NAMES: NameTable = NameTable {
    layer_prefix: "blk.",
    layer: &[
        ("norm2.weight", "post_attention_norm.weight", Fix::None),
        ("attn.sinks", "attn_sinks.weight", Fix::None),
        ("mlp.router.bias", "ffn_gate_inp.bias", Fix::None),
        ("mlp.experts.gate.bias", "ffn_gate_exps.bias", Fix::None),
        ("mlp.experts.up.bias", "ffn_up_exps.bias", Fix::None),
        ("mlp.experts.down.bias", "ffn_down_exps.bias", Fix::None),
    ],
    global: &[],
    extends: Some(&GGUF_NAMES),
};

static HF: HfFacts =
    HfFacts { model_type: "gpt_oss", class: "GptOssForCausalLM", names: &HF_NAMES, ..HfFacts::LLAMA_LIKE };
static GGUF: GgufFacts = GgufFacts { names: &GGUF_OSS_NAMES, ..GgufFacts::named("gpt-oss") };

/// Trained from scratch: the Llama block made gpt-oss's (sinks, biases, the clamped
/// SwiGLU), 8 experts of a quarter of the MLP width, 2 per token, a window of half the
/// context on every other layer, and a load-balancing loss of weight 0.01.
pub static PRESET: Preset = Preset {
    block: |cfg| {
        let mut arch = (llama::PRESET.block)(cfg);
        gpt_oss_block(&mut arch, ALPHA, LIMIT);
        arch.sliding_window = Some(cfg.max_seq.div_ceil(2).max(1));
        arch.layer_attention = alternating(arch.n_layers);
        arch.moe = Some(Moe {
            experts: 8,
            top_k: 2,
            d_expert: cfg.d_ff.div_ceil(4),
            routing: Routing::TopKSoftmax,
            aux_loss_coef: 0.01,
            d_shared: None,
            dense_layers: Vec::new(),
        });
        arch
    },
    tiny_kv_heads: llama::PRESET.tiny_kv_heads,
    tiny_d_ff: llama::PRESET.tiny_d_ff,
};

/// gpt-oss's layer pattern: sliding on even layers, full on odd ones.
fn alternating(n_layers: usize) -> Vec<LayerAttention> {
    (0..n_layers).map(|l| if l % 2 == 0 { LayerAttention::Local } else { LayerAttention::Global }).collect()
}

/// What every gpt-oss has beyond the Llama block (`arch` sized, rope and window set).
fn gpt_oss_block(arch: &mut Arch, alpha: f32, limit: f32) {
    arch.name = "gpt_oss".into();
    arch.mlp = Mlp::ClampedSwiGlu { alpha, limit };
    arch.bias.qkv = true;
    arch.bias.o = true;
    arch.bias.experts = true;
    arch.attn_sinks = true;
}

impl Architecture for GptOss {
    fn name(&self) -> &'static str {
        "gpt_oss"
    }

    fn hf(&self) -> &'static HfFacts {
        &HF
    }

    fn gguf(&self) -> &'static GgufFacts {
        &GGUF
    }

    fn read_hf(&self, c: &HfConfig<'_>) -> Result<Arch> {
        let mut arch = hf_llama_like(c, "gpt_oss", 1e-5)?;
        if !c.flag("attention_bias")?.unwrap_or(true) {
            return Err(Error::unsupported(
                "config.json",
                "gpt_oss without attention biases ('attention_bias': false)",
            ));
        }
        arch.rope = c.rope(None, 150_000.0)?;
        let alpha = c.float("swiglu_alpha")?.unwrap_or(f64::from(ALPHA)) as f32;
        let limit = c.float("swiglu_limit")?.unwrap_or(f64::from(LIMIT)) as f32;
        gpt_oss_block(&mut arch, alpha, limit);
        super::hf::hf_sliding_window(c, &mut arch, alternating)?;
        arch.moe = Some(hf_moe(c, "num_local_experts", "intermediate_size", Routing::TopKSoftmax)?);
        Ok(arch)
    }

    /// `gpt-oss.*`: NEOX rope (YaRN), the window on even layers, the experts.
    fn read_gguf(&self, k: &GgufKeys<'_>) -> Result<Arch> {
        let mut arch = super::gguf_llama_like(k, RopeStyle::HalfSplit)?;
        gpt_oss_block(&mut arch, ALPHA, LIMIT);
        arch.sliding_window = Some(k.size("attention.sliding_window")?);
        arch.layer_attention = alternating(arch.n_layers);
        let mut moe = gguf_moe(k, true)?.ok_or_else(|| {
            Error::Io(format!("gguf: a gpt-oss file without '{}' (its experts)", k.key("expert_count")))
        })?;
        moe.routing = Routing::TopKSoftmax;
        arch.moe = Some(moe);
        Ok(arch)
    }

    fn write_hf(&self, arch: &Arch, c: &mut HfConfigOut) -> Result<()> {
        let Mlp::ClampedSwiGlu { alpha, limit } = arch.mlp else {
            return Err(Error::value("export", "gpt_oss", "the clamped SwiGLU", format!("{:?}", arch.mlp)));
        };
        let moe = arch.moe.as_ref().ok_or_else(|| Error::value("export", "gpt_oss", "experts", "none"))?;
        c.model(&HF);
        c.llama_sizes(arch);
        c.set("hidden_act", json!("silu"));
        c.set("attention_bias", json!(true));
        c.set("sliding_window", json!(arch.sliding_window));
        c.layer_types(arch);
        c.set("swiglu_alpha", super::hf::json_f32(alpha));
        c.set("swiglu_limit", super::hf::json_f32(limit));
        write_hf_moe(moe, c, "num_local_experts", "intermediate_size");
        c.rope(&arch.rope)
    }

    /// llama.cpp fixes what gpt-oss's files do not say (α, the clamp, the window on even
    /// layers, top-k then softmax): a model that differs is refused rather than written
    /// to run differently there.
    fn write_gguf(&self, arch: &Arch, m: &mut GgufMetaOut) -> Result<()> {
        let moe = arch.moe.as_ref().ok_or_else(|| Error::value("export", "gpt_oss", "experts", "none"))?;
        let fixed = [
            (arch.mlp == Mlp::ClampedSwiGlu { alpha: ALPHA, limit: LIMIT }, "the clamped SwiGLU with α 1.702, clamp 7"),
            (
                arch.layer_attention == alternating(arch.n_layers),
                "sliding-window attention on even layers, full on odd",
            ),
            (
                moe.routing == Routing::TopKSoftmax && moe.dense_layers.is_empty(),
                "top-k-then-softmax experts on every layer",
            ),
            (arch.attn_sinks && arch.bias.experts && arch.bias.qkv && arch.bias.o, "sinks and biases"),
        ];
        if let Some((_, what)) = fixed.iter().find(|(ok, _)| !ok) {
            return Err(Error::unsupported(
                "export",
                format!("llama.cpp's gpt-oss fixes {what}, and this model differs: it would run differently there"),
            ));
        }
        super::gguf::write_llama_like(arch, m)?;
        m.size("expert_count", "moe.experts", moe.experts)?;
        m.size("expert_used_count", "moe.top_k", moe.top_k)?;
        m.size("expert_feed_forward_length", "moe.d_expert", moe.d_expert)
    }

    fn preset(&self) -> Option<&'static Preset> {
        Some(&PRESET)
    }
}
