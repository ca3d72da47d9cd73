//! Mixtral: Mistral with a mixture of experts for every MLP (`num_local_experts`,
//! `num_experts_per_tok`, each expert `intermediate_size` wide: `w1` gate, `w3` up, `w2`
//! down under `block_sparse_moe`), softmax routing with the k weights renormalised.
//! llama.cpp runs it as `llama` with `llama.expert_count`.

use fusebox::{Error, Result, Routing};

use super::moe::{hf_moe, write_gguf_moe, write_hf_moe};
use super::names::HF_LLAMA_NAMES;
use super::{Architecture, Fix, GgufFacts, GgufKeys, GgufMetaOut, HfConfig, HfConfigOut, HfFacts, NameTable};
use crate::transformer::Arch;

/// Mixtral.
pub struct Mixtral;

static NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.",
    layer: &[
        ("mlp.router.weight", "block_sparse_moe.gate.weight", Fix::None),
        ("mlp.experts.gate.weight", "block_sparse_moe.experts.{e}.w1.weight", Fix::None),
        ("mlp.experts.up.weight", "block_sparse_moe.experts.{e}.w3.weight", Fix::None),
        ("mlp.experts.down.weight", "block_sparse_moe.experts.{e}.w2.weight", Fix::None),
    ],
    global: &[],
    extends: Some(&HF_LLAMA_NAMES),
};

static HF: HfFacts =
    HfFacts { model_type: "mixtral", class: "MixtralForCausalLM", names: &NAMES, ..HfFacts::LLAMA_LIKE };
static GGUF: GgufFacts = GgufFacts { export_as: "llama", ..GgufFacts::named("mixtral") };

/// Whether llama.cpp renormalises the k routing weights of this architecture's files
/// (it renormalises, whatever the file says).
pub(super) const NORMALIZED_IN_LLAMA_CPP: bool = true;

impl Architecture for Mixtral {
    fn name(&self) -> &'static str {
        "mixtral"
    }

    fn hf(&self) -> &'static HfFacts {
        &HF
    }

    fn gguf(&self) -> &'static GgufFacts {
        &GGUF
    }

    fn read_hf(&self, c: &HfConfig<'_>) -> Result<Arch> {
        let mut arch = super::mistral::Mistral.read_hf(c)?;
        arch.name = "mixtral".into();
        arch.moe = Some(hf_moe(c, "num_local_experts", "intermediate_size", Routing::SoftmaxTopKNormalized)?);
        Ok(arch)
    }

    /// A `llama` file with experts (see [`super::llama::Llama::read_gguf`]).
    fn read_gguf(&self, k: &GgufKeys<'_>) -> Result<Arch> {
        super::llama::Llama.read_gguf(k)
    }

    fn write_hf(&self, arch: &Arch, c: &mut HfConfigOut) -> Result<()> {
        super::mistral::Mistral.write_hf(arch, c)?;
        c.model(&HF);
        let moe = arch.moe.as_ref().ok_or_else(|| Error::value("export", "mixtral", "experts", "none"))?;
        write_hf_moe(moe, c, "num_local_experts", "intermediate_size");
        Ok(())
    }

    fn write_gguf(&self, arch: &Arch, m: &mut GgufMetaOut) -> Result<()> {
        super::gguf::write_llama_like(arch, m)?;
        write_gguf_moe(arch, m, NORMALIZED_IN_LLAMA_CPP)
    }
}
