//! Qwen3.5-MoE: Qwen3.5's hybrid block (separate `in_proj_qkv`, `in_proj_z`,
//! `in_proj_b`, `in_proj_a`; gated full attention; `(1 + w)` norms but the Gated
//! DeltaNet's) with Qwen3-Next's MLP in every layer: a mixture of experts beside a shared
//! expert scaled by `σ(shared_expert_gate(x))`.
//!
//! What differs from both: transformers' config has no `intermediate_size`,
//! `norm_topk_prob`, `decoder_sparse_step` nor `mlp_only_layers` (its router always
//! renormalises the k weights and every layer is sparse; such keys are ignored), and its
//! defaults are Qwen3-Next's (`head_dim` 256, a quarter rotated, a shared expert of 512).
//!
//! Published, like Qwen3.5, as a vision-language model (`model_type` `qwen3_5_moe`,
//! `Qwen3_5MoeForConditionalGeneration`), read text only as [`qwen3_5::WRAPPER`] says;
//! the experts either one tensor per expert (`mlp.experts.N.gate_proj.weight`, as
//! transformers saves them) or fused into 3-D tensors (`mlp.experts.gate_up_proj`
//! `[E, 2F, D]`, each expert's gate rows then its up rows, and `mlp.experts.down_proj`
//! `[E, D, F]`, as transformers holds them in memory) — both are read. Exports are the
//! text model with per-expert tensors.
//!
//! GGUF (`qwen35moe`, as llama.cpp's `convert_hf_to_gguf.py` writes it): `qwen35`'s
//! linear layers (value heads tiled, `ssm_a` = −e^{A_log}, norms stored +1 but
//! `ssm_norm`, rope sections) read and written by [`Qwen3_5`], and the experts as
//! `qwen3next` stores them (`ffn_{gate,up,down}_exps`, `ffn_*_shexp`,
//! `ffn_gate_inp_shexp`); no `feed_forward_length` is written, so the expert width stands
//! in for it. llama.cpp renormalises the k weights of `qwen35moe` too.

use fusebox::{Error, Result, Routing};
use serde_json::json;

use super::moe::{gguf_moe, hf_moe, write_gguf_moe, write_hf_moe};
use super::qwen3_5::{self, Qwen3_5};
use super::qwen3_next::{self, read_hf_hybrid};
use super::{
    Architecture, Fix, GgufFacts, GgufKeys, GgufMetaOut, HfConfig, HfConfigOut, HfFacts, HfWrapper, NameTable,
};
use crate::gguf::{GgufFile, Metadata, Value};
use crate::transformer::{Arch, Moe, Stacking};
use crate::weights::TensorSource;

/// Qwen3.5-MoE (text).
pub struct Qwen3_5Moe;

/// Names as Qwen3-Next's (Qwen3.5's layers over the Qwen mixtures' experts); the linear
/// projections are stored apart, so they are read as named.
static HF: HfFacts = HfFacts {
    model_type: "qwen3_5_moe_text",
    class: "Qwen3_5MoeForCausalLM",
    names: &qwen3_next::HF_NAMES,
    stacking: Stacking { qkv: false, gate_up: false },
    ignored: qwen3_next::hf_ignored,
    export_prefix: "",
};

/// The vision-language checkpoint Qwen3.5-MoE is published as: Qwen3.5's, renamed.
pub static WRAPPER: HfWrapper = HfWrapper {
    model_type: "qwen3_5_moe",
    class: "Qwen3_5MoeForConditionalGeneration",
    text_prefix: qwen3_5::TEXT_PREFIX,
    skipped: qwen3_5::SKIPPED,
};

/// The names of a checkpoint whose experts are fused into 3-D tensors (see the module
/// docs); the rest as [`qwen3_next::HF_NAMES`].
pub static HF_FUSED_EXPERT_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.",
    layer: &[
        ("mlp.experts.gate.weight", FUSED_GATE_UP, Fix::Half(0)),
        ("mlp.experts.up.weight", FUSED_GATE_UP, Fix::Half(1)),
        ("mlp.experts.down.weight", "mlp.experts.down_proj", Fix::None),
    ],
    global: &[],
    extends: Some(&qwen3_next::HF_NAMES),
};

/// The fused gate and up projections of every expert, `[E, 2F, D]`.
const FUSED_GATE_UP: &str = "mlp.experts.gate_up_proj";

static GGUF: GgufFacts = GgufFacts {
    name: "qwen35moe",
    export_as: "qwen35moe",
    stacking: Stacking { qkv: false, gate_up: false },
    names: &qwen3_5::GGUF_NAMES,
};

/// transformers' expert and shared-expert widths when the config names none.
const DEFAULT_EXPERT_WIDTH: usize = 512;
/// Whether transformers and llama.cpp renormalise the k routing weights (both always do).
const NORMALIZED: bool = true;

/// The experts of `arch`, or an error naming what a Qwen3.5-MoE model needs: a shared
/// expert and every layer sparse, the k weights renormalised.
fn experts_of(arch: &Arch) -> Result<&Moe> {
    let moe = arch.moe.as_ref().ok_or_else(|| Error::value("export", "qwen3_5_moe", "experts", "none"))?;
    if moe.d_shared.is_none() || !moe.dense_layers.is_empty() || moe.routing.normalized() != NORMALIZED {
        return Err(Error::unsupported(
            "export",
            "a Qwen3.5-MoE layer is always sparse, with a shared expert and the k routing weights renormalised",
        ));
    }
    Ok(moe)
}

impl Architecture for Qwen3_5Moe {
    fn name(&self) -> &'static str {
        "qwen3_5_moe"
    }

    fn hf(&self) -> &'static HfFacts {
        &HF
    }

    fn gguf(&self) -> &'static GgufFacts {
        &GGUF
    }

    fn hf_wrapper(&self) -> Option<&'static HfWrapper> {
        Some(&WRAPPER)
    }

    /// Fused experts when the first layer has them and not its first expert's own
    /// tensors (every layer is sparse), else one tensor per expert (what exports write).
    fn hf_names(&self, has: &dyn Fn(&str) -> bool) -> &'static NameTable {
        let per_expert = HF.names.file_name("h.0.mlp.experts.gate.weight").map(|(f, _)| f.replace("{e}", "0"));
        let fused = HF_FUSED_EXPERT_NAMES.file_name("h.0.mlp.experts.gate.weight").map(|(f, _)| f);
        if fused.is_some_and(|f| has(&f)) && !per_expert.is_some_and(|f| has(&f)) {
            &HF_FUSED_EXPERT_NAMES
        } else {
            HF.names
        }
    }

    /// Qwen3-Next's hybrid reading, and experts in every layer (`num_experts` of
    /// `moe_intermediate_size`, renormalised top-`num_experts_per_tok`, the
    /// load-balancing loss with `output_router_logits`) beside a shared expert.
    fn read_hf(&self, c: &HfConfig<'_>) -> Result<Arch> {
        let width = c.uint("moe_intermediate_size")?.unwrap_or(DEFAULT_EXPERT_WIDTH);
        c.with_default("moe_intermediate_size", json!(width), |c| {
            c.with_default("intermediate_size", json!(width), |c| {
                let mut arch = read_hf_hybrid(c, "qwen3_5_moe")?;
                let mut moe = hf_moe(c, "num_experts", "moe_intermediate_size", Routing::SoftmaxTopKNormalized)?;
                if c.field("shared_expert_intermediate_size").is_none() {
                    moe.d_shared = Some(DEFAULT_EXPERT_WIDTH);
                }
                arch.moe = Some(moe);
                Ok(arch)
            })
        })
    }

    /// As llama.cpp reads `qwen35moe`: [`Qwen3_5`]'s keys (the expert width standing in
    /// for the absent `feed_forward_length`) and the experts (`expert_*`, renormalised).
    fn read_gguf(&self, k: &GgufKeys<'_>) -> Result<Arch> {
        let ff = k.key("feed_forward_length");
        let with_ff: Metadata;
        let keys: GgufKeys<'_>;
        let k = match (k.meta.get(&ff), k.opt_size("expert_feed_forward_length")?) {
            (None, Some(width)) => {
                // A copy of the metadata with the key added (the file's is borrowed).
                let mut meta = k.meta.clone();
                meta.insert(ff, Value::U64(width as u64));
                with_ff = meta;
                keys = GgufKeys {
                    meta: &with_ff,
                    arch: k.arch.clone(),
                    vocab_from_tokens: k.vocab_from_tokens,
                    tensors: k.tensors,
                };
                &keys
            }
            _ => k,
        };
        let mut arch = Qwen3_5.read_gguf(k)?;
        arch.name = "qwen3_5_moe".into();
        arch.moe = Some(gguf_moe(k, NORMALIZED)?.ok_or_else(|| {
            Error::Io(format!("gguf: a qwen35moe file without '{}' (its experts)", k.key("expert_count")))
        })?);
        Ok(arch)
    }

    /// Qwen3.5's config and the experts' keys transformers reads.
    fn write_hf(&self, arch: &Arch, c: &mut HfConfigOut) -> Result<()> {
        let moe = experts_of(arch)?;
        Qwen3_5.write_hf(arch, c)?;
        c.model(&HF);
        write_hf_moe(moe, c, "num_experts", "moe_intermediate_size");
        Ok(())
    }

    /// `qwen35`'s keys and the experts'.
    fn write_gguf(&self, arch: &Arch, m: &mut GgufMetaOut) -> Result<()> {
        experts_of(arch)?;
        Qwen3_5.write_gguf(arch, m)?;
        write_gguf_moe(arch, m, NORMALIZED)
    }

    fn gguf_source<'a>(&self, arch: &Arch, file: &'a GgufFile) -> Result<Option<Box<dyn TensorSource + 'a>>> {
        Qwen3_5.gguf_source(arch, file)
    }

    fn gguf_store(&self, arch: &Arch, name: &str, shape: &[usize], values: Vec<f32>) -> Result<Vec<f32>> {
        Qwen3_5.gguf_store(arch, name, shape, values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::{hf_plan, FileTensors};

    /// A config as transformers 5 saves `Qwen3_5MoeTextConfig`: no `intermediate_size`.
    fn config() -> serde_json::Value {
        json!({
            "model_type": "qwen3_5_moe_text", "hidden_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 64,
            "max_position_embeddings": 64, "hidden_act": "silu",
            "layer_types": ["linear_attention", "full_attention"],
            "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 4,
            "linear_value_head_dim": 4, "linear_conv_kernel_dim": 4,
            "moe_intermediate_size": 8, "shared_expert_intermediate_size": 12, "num_experts": 3,
            "num_experts_per_tok": 2, "output_router_logits": false, "router_aux_loss_coef": 0.001,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
        })
    }

    fn arch_of(v: &serde_json::Value) -> Result<Arch> {
        Ok(hf_plan(v, &FileTensors { count: 1000, has: &|_| false })?.arch)
    }

    #[test]
    fn every_layer_is_sparse_renormalised_with_a_shared_expert() {
        let a = arch_of(&config()).unwrap();
        let moe = a.moe.as_ref().unwrap();
        assert_eq!((moe.experts, moe.top_k, moe.d_expert, moe.d_shared), (3, 2, 8, Some(12)));
        assert!(moe.routing.normalized() && moe.dense_layers.is_empty() && moe.aux_loss_coef == 0.0);
        assert_eq!((a.name.as_str(), a.rotary_dims(), a.is_linear(0), a.is_linear(1)), ("qwen3_5_moe", 2, true, false));
        // Keys transformers ignores for this model are ignored here too.
        let mut v = config();
        v["norm_topk_prob"] = json!(false);
        v["mlp_only_layers"] = json!([0]);
        v["intermediate_size"] = json!(99);
        let b = arch_of(&v).unwrap();
        assert_eq!(b.moe, a.moe);
        // transformers' shared expert width when the config names none.
        let mut v = config();
        v.as_object_mut().unwrap().remove("shared_expert_intermediate_size");
        assert_eq!(arch_of(&v).unwrap().moe.unwrap().d_shared, Some(DEFAULT_EXPERT_WIDTH));
    }

    /// The keys llama.cpp's converter wrote for a 4-layer Qwen3.5-MoE (read off its file):
    /// no `feed_forward_length`.
    #[test]
    fn converter_metadata_reads_with_the_expert_width_for_d_ff() {
        use crate::gguf::Array;
        let mut meta = Metadata::default();
        let mut put = |k: &str, v: Value| assert!(meta.insert(format!("qwen35moe.{k}"), v));
        for (k, v) in [
            ("block_count", 4),
            ("context_length", 256),
            ("embedding_length", 64),
            ("attention.head_count", 4),
            ("attention.head_count_kv", 2),
            ("expert_count", 8),
            ("expert_used_count", 2),
            ("attention.key_length", 32),
            ("attention.value_length", 32),
            ("expert_feed_forward_length", 48),
            ("expert_shared_feed_forward_length", 80),
            ("ssm.conv_kernel", 4),
            ("ssm.state_size", 16),
            ("ssm.group_count", 2),
            ("ssm.time_step_rank", 4),
            ("ssm.inner_size", 64),
            ("full_attention_interval", 4),
            ("rope.dimension_count", 8),
            ("vocab_size", 300),
        ] {
            put(k, Value::U32(v));
        }
        put("rope.freq_base", Value::F32(10000.0));
        put("attention.layer_norm_rms_epsilon", Value::F32(1e-6));
        put("attention.recurrent_layers", Value::Array(Array::Bool(vec![true, true, true, false])));
        put("rope.dimension_sections", Value::Array(Array::I32(vec![11, 11, 10, 0])));
        let k = GgufKeys { meta: &meta, arch: "qwen35moe".into(), vocab_from_tokens: None, tensors: 1000 };
        let a = Qwen3_5Moe.read_gguf(&k).unwrap();
        let moe = a.moe.as_ref().unwrap();
        assert_eq!((a.name.as_str(), a.d_ff, a.rotary_dims()), ("qwen3_5_moe", 48, 8));
        assert_eq!((moe.experts, moe.top_k, moe.d_expert, moe.d_shared), (8, 2, 48, Some(80)));
        assert!(moe.routing.normalized() && a.linear_attention.is_some() && !a.is_linear(3));
    }

    /// `config()` inside the wrapper as transformers saves `Qwen3_5MoeConfig`.
    fn wrapper(tie: Option<bool>) -> serde_json::Value {
        let mut v = json!({"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
                           "text_config": config(), "vision_config": {"depth": 1, "model_type": "qwen3_5_moe_vision"},
                           "image_token_id": 248056});
        if let Some(t) = tie {
            v["tie_word_embeddings"] = json!(t);
        }
        v
    }

    #[test]
    fn the_wrapper_is_read_as_its_text_model_tied_as_the_wrapper_says() {
        let mut text = config();
        text["tie_word_embeddings"] = json!(true);
        let mut v = wrapper(Some(false));
        v["text_config"] = text;
        let plain = arch_of(&config()).unwrap();
        let a = arch_of(&v).unwrap();
        assert_eq!((a.moe, a.tied_embeddings, a.n_layers), (plain.moe, false, 2));
        v["tie_word_embeddings"] = json!(true);
        assert!(arch_of(&v).unwrap().tied_embeddings);
        // Silent wrapper: the text config's; both silent: untied (the wrapper's default).
        v.as_object_mut().unwrap().remove("tie_word_embeddings");
        assert!(arch_of(&v).unwrap().tied_embeddings);
        assert!(!arch_of(&wrapper(None)).unwrap().tied_embeddings);
        let plan = hf_plan(&wrapper(None), &FileTensors { count: 1000, has: &|_| false }).unwrap();
        assert_eq!(plan.wrapper.map(|w| w.class), Some("Qwen3_5MoeForConditionalGeneration"));
    }

    #[test]
    fn a_wrapper_without_its_text_config_or_around_another_model_is_refused() {
        let mut v = wrapper(None);
        v.as_object_mut().unwrap().remove("text_config");
        let e = arch_of(&v).unwrap_err().to_string();
        assert!(e.contains("'text_config'") && e.contains("qwen3_5_moe"), "{e}");
        let mut v = wrapper(None);
        v["text_config"]["model_type"] = json!("qwen3_5_text");
        let e = arch_of(&v).unwrap_err().to_string();
        assert!(e.contains("qwen3_5_text") && e.contains("expected 'qwen3_5_moe_text'"), "{e}");
        let mut v = wrapper(None);
        v["text_config"] = json!([1]);
        assert!(arch_of(&v).unwrap_err().to_string().contains("expected an object"));
    }

    #[test]
    fn fused_experts_are_named_where_the_checkpoint_has_them() {
        let names = |has: &dyn Fn(&str) -> bool| {
            let plan = hf_plan(&wrapper(None), &FileTensors { count: 1000, has }).unwrap();
            plan.names.file_name("h.1.mlp.experts.up.weight").unwrap()
        };
        let fused = |n: &str| n == "model.language_model.layers.0.mlp.experts.gate_up_proj";
        assert_eq!(names(&fused), ("model.layers.1.mlp.experts.gate_up_proj".into(), Fix::Half(1)));
        let per_expert = |n: &str| n == "model.language_model.layers.0.mlp.experts.0.gate_proj.weight";
        assert_eq!(names(&per_expert), ("model.layers.1.mlp.experts.{e}.up_proj.weight".into(), Fix::None));
        // Both (or a probe that says yes to everything): per expert, as exports write.
        assert_eq!(names(&|_| true).1, Fix::None);
    }

    #[test]
    fn models_it_cannot_write_are_refused() {
        let mut a = arch_of(&config()).unwrap();
        a.moe.as_mut().unwrap().d_shared = None;
        let e = Qwen3_5Moe.write_hf(&a, &mut HfConfigOut::new()).unwrap_err().to_string();
        assert!(e.contains("shared expert"), "{e}");
        let mut a = arch_of(&config()).unwrap();
        a.moe.as_mut().unwrap().routing = Routing::SoftmaxTopK;
        assert!(Qwen3_5Moe.write_hf(&a, &mut HfConfigOut::new()).is_err());
    }
}
