//! OLMoE: Llama with a mixture of experts for every MLP (Qwen3-MoE's tensor names and
//! keys: `num_experts`, `num_experts_per_tok`, each expert `intermediate_size` wide,
//! renormalised when `norm_topk_prob`) and QK-norms over all heads at once (`q_norm`
//! `[Hq·hd]`, `k_norm` `[Hkv·hd]`, before the split into heads). llama.cpp's `olmoe`
//! keeps the softmax weights as they are.

use fusebox::{Error, Result, RopeStyle, Routing};
use serde_json::json;

use super::moe::{gguf_moe, hf_moe, write_gguf_moe, write_hf_moe};
use super::{
    gguf_llama_like, hf_llama_like, Architecture, GgufFacts, GgufKeys, GgufMetaOut, HfConfig, HfConfigOut, HfFacts,
    HF_MOE_NAMES,
};
use crate::transformer::Arch;

/// OLMoE.
pub struct Olmoe;

static HF: HfFacts =
    HfFacts { model_type: "olmoe", class: "OlmoeForCausalLM", names: &HF_MOE_NAMES, ..HfFacts::LLAMA_LIKE };
static GGUF: GgufFacts = GgufFacts::named("olmoe");

/// The QK-norms of OLMoE.
fn whole_qk_norm(arch: &mut Arch) {
    arch.qk_norm = true;
    arch.qk_norm_whole = true;
}

/// Whether llama.cpp renormalises the k routing weights of this architecture's files
/// (it does not renormalise, whatever the file says).
const NORMALIZED_IN_LLAMA_CPP: bool = false;

impl Architecture for Olmoe {
    fn name(&self) -> &'static str {
        "olmoe"
    }

    fn hf(&self) -> &'static HfFacts {
        &HF
    }

    fn gguf(&self) -> &'static GgufFacts {
        &GGUF
    }

    fn read_hf(&self, c: &HfConfig<'_>) -> Result<Arch> {
        c.refuse("clip_qkv")?;
        let mut arch = hf_llama_like(c, "olmoe", 1e-5)?;
        whole_qk_norm(&mut arch);
        let routing = if c.flag("norm_topk_prob")?.unwrap_or(false) {
            Routing::SoftmaxTopKNormalized
        } else {
            Routing::SoftmaxTopK
        };
        arch.moe = Some(hf_moe(c, "num_experts", "intermediate_size", routing)?);
        Ok(arch)
    }

    /// NEOX rope; the experts from `olmoe.expert_*`.
    fn read_gguf(&self, k: &GgufKeys<'_>) -> Result<Arch> {
        let mut arch = gguf_llama_like(k, RopeStyle::HalfSplit)?;
        arch.name = "olmoe".into();
        whole_qk_norm(&mut arch);
        arch.moe = Some(gguf_moe(k, NORMALIZED_IN_LLAMA_CPP)?.ok_or_else(|| {
            Error::Io(format!("gguf: an olmoe file without '{}' (its experts)", k.key("expert_count")))
        })?);
        Ok(arch)
    }

    fn write_hf(&self, arch: &Arch, c: &mut HfConfigOut) -> Result<()> {
        c.model(&HF);
        c.llama_sizes(arch);
        c.set("hidden_act", "silu".into());
        c.set("attention_bias", arch.bias.qkv.into());
        c.set("clip_qkv", json!(null));
        c.rope(&arch.rope)?;
        let moe = arch.moe.as_ref().ok_or_else(|| Error::value("export", "olmoe", "experts", "none"))?;
        write_hf_moe(moe, c, "num_experts", "intermediate_size");
        c.set("norm_topk_prob", json!(moe.routing.normalized()));
        Ok(())
    }

    fn write_gguf(&self, arch: &Arch, m: &mut GgufMetaOut) -> Result<()> {
        super::gguf::write_llama_like(arch, m)?;
        write_gguf_moe(arch, m, NORMALIZED_IN_LLAMA_CPP)
    }
}
