//! Phi-3: Llama with q, k, v in one `qkv_proj` matrix and gate, up in one
//! `gate_up_proj` (gate first); an optional sliding window on every layer.

use fusebox::{Error, Result, RopeStyle};

use super::names::hf_derived;
use super::{
    gguf_llama_like, hf_llama_like, hf_sliding_window_all, Architecture, Fix, GgufFacts, GgufKeys, HfConfig,
    HfConfigOut, HfFacts, NameTable,
};
use crate::transformer::{Arch, Stacking};

/// Phi-3.
pub struct Phi3;

/// Phi-3's HF names.
pub static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.",
    layer: &[
        ("norm1.weight", "input_layernorm.weight", Fix::None),
        ("attn.qkv.weight", "self_attn.qkv_proj.weight", Fix::None),
        ("attn.o.weight", "self_attn.o_proj.weight", Fix::None),
        ("norm2.weight", "post_attention_layernorm.weight", Fix::None),
        ("mlp.gate_up.weight", "mlp.gate_up_proj.weight", Fix::None),
        ("mlp.down.weight", "mlp.down_proj.weight", Fix::None),
    ],
    global: &[
        ("wte", "model.embed_tokens.weight", Fix::None),
        ("norm_f.weight", "model.norm.weight", Fix::None),
        ("lm_head.weight", "lm_head.weight", Fix::None),
    ],
    extends: None,
};

static HF: HfFacts = HfFacts {
    model_type: "phi3",
    class: "Phi3ForCausalLM",
    names: &HF_NAMES,
    stacking: Stacking { qkv: true, gate_up: true },
    ignored: hf_derived,
    export_prefix: "",
};

/// llama.cpp stores `attn_qkv`, and `ffn_up` holding gate and up.
static GGUF: GgufFacts = GgufFacts { stacking: Stacking { qkv: true, gate_up: true }, ..GgufFacts::named("phi3") };

impl Architecture for Phi3 {
    fn name(&self) -> &'static str {
        "phi3"
    }

    fn hf(&self) -> &'static HfFacts {
        &HF
    }

    fn gguf(&self) -> &'static GgufFacts {
        &GGUF
    }

    fn read_hf(&self, c: &HfConfig<'_>) -> Result<Arch> {
        let mut arch = hf_llama_like(c, "phi3", 1e-5)?;
        if let Some(f) = c.float("partial_rotary_factor")? {
            if f != 1.0 {
                return Err(Error::unsupported("config.json", format!("partial_rotary_factor {f} (only 1.0)")));
            }
        }
        hf_sliding_window_all(c, &mut arch)?;
        Ok(arch)
    }

    /// NEOX rope: half-split pairs.
    fn read_gguf(&self, k: &GgufKeys<'_>) -> Result<Arch> {
        let mut arch = gguf_llama_like(k, RopeStyle::HalfSplit)?;
        if let Some(w) = k.opt_size("attention.sliding_window")? {
            super::mistral::set_window(&mut arch, w);
        }
        Ok(arch)
    }

    fn write_hf(&self, arch: &Arch, c: &mut HfConfigOut) -> Result<()> {
        c.model(&HF);
        c.llama_sizes(arch);
        c.set("hidden_act", "silu".into());
        c.set("sliding_window", arch.sliding_window.into());
        c.set("original_max_position_embeddings", arch.context_length.into());
        c.set("partial_rotary_factor", 1.0.into());
        for k in ["embd_pdrop", "resid_pdrop"] {
            c.set(k, 0.0.into());
        }
        c.rope(&arch.rope)
    }
}
