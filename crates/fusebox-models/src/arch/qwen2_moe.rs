//! Qwen2-MoE: Qwen2 (biases on q, k and v: `qkv_bias`) with a mixture of experts for the
//! MLP (`num_experts`, `num_experts_per_tok`, width `moe_intermediate_size`, softmax
//! weights renormalised when `norm_topk_prob`) beside a shared expert of width
//! `shared_expert_intermediate_size` scaled by `σ(shared_expert_gate(x))`; dense MLPs in
//! `mlp_only_layers` and off the `decoder_sparse_step` stride. llama.cpp's `qwen2moe`
//! keeps the softmax weights as they are.

use fusebox::{Error, Result, RopeStyle, Routing};
use serde_json::json;

use super::moe::{gguf_moe, hf_moe, write_gguf_moe, write_hf_qwen_moe};
use super::{
    gguf_llama_like, hf_llama_like, Architecture, GgufFacts, GgufKeys, GgufMetaOut, HfConfig, HfConfigOut, HfFacts,
    HF_MOE_NAMES,
};
use crate::transformer::{Arch, Biases};

/// Qwen2-MoE.
pub struct Qwen2Moe;

static HF: HfFacts =
    HfFacts { model_type: "qwen2_moe", class: "Qwen2MoeForCausalLM", names: &HF_MOE_NAMES, ..HfFacts::LLAMA_LIKE };
static GGUF: GgufFacts = GgufFacts::named("qwen2moe");

/// Whether llama.cpp renormalises the k routing weights of this architecture's files
/// (it does not, whatever the file says).
const NORMALIZED_IN_LLAMA_CPP: bool = false;

/// Layers whose MLP is dense: `mlp_only_layers`, and those off the `decoder_sparse_step`
/// stride (Qwen2-MoE and Qwen3-MoE alike).
pub fn dense_layers(c: &HfConfig<'_>, n_layers: usize) -> Result<Vec<usize>> {
    let step = c.uint("decoder_sparse_step")?.unwrap_or(1);
    if step == 0 {
        return Err(Error::value("config.json", "'decoder_sparse_step'", "> 0", 0));
    }
    let only: Vec<usize> = match c.field("mlp_only_layers") {
        None => Vec::new(),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|_| Error::Io(format!("config.json: 'mlp_only_layers': expected a list of layers, found {v}")))?,
    };
    Ok((0..n_layers).filter(|l| only.contains(l) || (l + 1) % step != 0).collect())
}

impl Architecture for Qwen2Moe {
    fn name(&self) -> &'static str {
        "qwen2_moe"
    }

    fn hf(&self) -> &'static HfFacts {
        &HF
    }

    fn gguf(&self) -> &'static GgufFacts {
        &GGUF
    }

    fn read_hf(&self, c: &HfConfig<'_>) -> Result<Arch> {
        if c.flag("use_sliding_window")?.unwrap_or(false) {
            return Err(Error::unsupported("config.json", "qwen2_moe with use_sliding_window"));
        }
        let mut arch = hf_llama_like(c, "qwen2_moe", 1e-6)?;
        arch.bias = Biases { qkv: c.flag("qkv_bias")?.unwrap_or(true), ..Biases::default() };
        let routing = if c.flag("norm_topk_prob")?.unwrap_or(false) {
            Routing::SoftmaxTopKNormalized
        } else {
            Routing::SoftmaxTopK
        };
        let mut moe = hf_moe(c, "num_experts", "moe_intermediate_size", routing)?;
        moe.dense_layers = dense_layers(c, arch.n_layers)?;
        arch.moe = Some(moe);
        Ok(arch)
    }

    /// NEOX rope, q/k/v biases; the experts and the shared expert from `qwen2moe.expert_*`.
    fn read_gguf(&self, k: &GgufKeys<'_>) -> Result<Arch> {
        let mut arch = gguf_llama_like(k, RopeStyle::HalfSplit)?;
        arch.name = "qwen2_moe".into();
        arch.bias = Biases { qkv: true, ..Biases::default() };
        arch.moe = Some(gguf_moe(k, NORMALIZED_IN_LLAMA_CPP)?.ok_or_else(|| {
            Error::Io(format!("gguf: a qwen2moe file without '{}' (its experts)", k.key("expert_count")))
        })?);
        Ok(arch)
    }

    fn write_hf(&self, arch: &Arch, c: &mut HfConfigOut) -> Result<()> {
        c.model(&HF);
        c.llama_sizes(arch);
        c.set("hidden_act", "silu".into());
        c.set("qkv_bias", arch.bias.qkv.into());
        c.set("use_sliding_window", false.into());
        c.rope(&arch.rope)?;
        write_hf_qwen_moe(arch, c, "qwen2_moe")?;
        c.set("shared_expert_intermediate_size", json!(arch.moe.as_ref().and_then(|m| m.d_shared).unwrap_or(0)));
        Ok(())
    }

    fn write_gguf(&self, arch: &Arch, m: &mut GgufMetaOut) -> Result<()> {
        super::gguf::write_llama_like(arch, m)?;
        write_gguf_moe(arch, m, NORMALIZED_IN_LLAMA_CPP)
    }
}
