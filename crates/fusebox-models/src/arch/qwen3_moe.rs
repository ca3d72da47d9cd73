//! Qwen3-MoE: Qwen3 with a mixture of experts for the MLP (`num_experts`,
//! `num_experts_per_tok`, width `moe_intermediate_size`), softmax routing with the k
//! weights renormalised when `norm_topk_prob`; dense MLPs of `intermediate_size` in
//! `mlp_only_layers` and off the `decoder_sparse_step` stride. llama.cpp's `qwen3moe`
//! renormalises.

use fusebox::{Error, Result, RopeStyle, Routing};

use super::moe::{gguf_moe, hf_moe, write_gguf_moe, write_hf_qwen_moe};
use super::preset::Preset;
use super::{llama, Architecture, GgufFacts, GgufKeys, GgufMetaOut, HfConfig, HfConfigOut, HfFacts, HF_MOE_NAMES};
use crate::transformer::{Arch, Moe};

/// Qwen3-MoE.
pub struct Qwen3Moe;

static HF: HfFacts =
    HfFacts { model_type: "qwen3_moe", class: "Qwen3MoeForCausalLM", names: &HF_MOE_NAMES, ..HfFacts::LLAMA_LIKE };
static GGUF: GgufFacts = GgufFacts::named("qwen3moe");

/// Trained from scratch: the Qwen3 block with 8 experts of a quarter of the MLP width,
/// 2 per token, renormalised, and a load-balancing loss of weight 0.01.
pub static PRESET: Preset = Preset {
    block: |cfg| Arch {
        moe: Some(Moe {
            experts: 8,
            top_k: 2,
            d_expert: cfg.d_ff.div_ceil(4),
            routing: Routing::SoftmaxTopKNormalized,
            aux_loss_coef: 0.01,
            d_shared: None,
            dense_layers: Vec::new(),
        }),
        name: "qwen3_moe".into(),
        ..(super::qwen3::PRESET.block)(cfg)
    },
    tiny_kv_heads: llama::PRESET.tiny_kv_heads,
    tiny_d_ff: llama::PRESET.tiny_d_ff,
};

/// Whether llama.cpp renormalises the k routing weights of this architecture's files
/// (it renormalises, whatever the file says).
const NORMALIZED_IN_LLAMA_CPP: bool = true;

impl Architecture for Qwen3Moe {
    fn name(&self) -> &'static str {
        "qwen3_moe"
    }

    fn hf(&self) -> &'static HfFacts {
        &HF
    }

    fn gguf(&self) -> &'static GgufFacts {
        &GGUF
    }

    fn read_hf(&self, c: &HfConfig<'_>) -> Result<Arch> {
        let mut arch = super::qwen3::Qwen3.read_hf(c)?;
        arch.name = "qwen3_moe".into();
        arch.moe = Some(hf_qwen_moe(c, arch.n_layers, false)?);
        Ok(arch)
    }

    /// NEOX rope, QK-norm; the experts from `qwen3moe.expert_*`.
    fn read_gguf(&self, k: &GgufKeys<'_>) -> Result<Arch> {
        let mut arch = super::gguf_llama_like(k, RopeStyle::HalfSplit)?;
        arch.name = "qwen3_moe".into();
        arch.qk_norm = true;
        arch.moe = Some(gguf_moe(k, NORMALIZED_IN_LLAMA_CPP)?.ok_or_else(|| {
            Error::Io(format!("gguf: a qwen3moe file without '{}' (its experts)", k.key("expert_count")))
        })?);
        Ok(arch)
    }

    fn write_hf(&self, arch: &Arch, c: &mut HfConfigOut) -> Result<()> {
        super::qwen3::Qwen3.write_hf(arch, c)?;
        c.model(&HF);
        write_hf_qwen_moe(arch, c, "qwen3_moe")?;
        Ok(())
    }

    fn write_gguf(&self, arch: &Arch, m: &mut GgufMetaOut) -> Result<()> {
        super::gguf::write_llama_like(arch, m)?;
        write_gguf_moe(arch, m, NORMALIZED_IN_LLAMA_CPP)
    }

    fn preset(&self) -> Option<&'static Preset> {
        Some(&PRESET)
    }
}

/// The experts of a Qwen mixture-of-experts config (Qwen3-MoE, Qwen3-Next): `num_experts`
/// of `moe_intermediate_size`, renormalised top-k when `norm_topk_prob` (absent: as
/// `normalized_by_default`), dense layers from `mlp_only_layers`/`decoder_sparse_step`.
pub(super) fn hf_qwen_moe(c: &HfConfig<'_>, n_layers: usize, normalized_by_default: bool) -> Result<Moe> {
    let routing = if c.flag("norm_topk_prob")?.unwrap_or(normalized_by_default) {
        Routing::SoftmaxTopKNormalized
    } else {
        Routing::SoftmaxTopK
    };
    let mut moe = hf_moe(c, "num_experts", "moe_intermediate_size", routing)?;
    moe.dense_layers = super::qwen2_moe::dense_layers(c, n_layers)?;
    Ok(moe)
}
