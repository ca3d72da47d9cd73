//! What the mixture-of-experts architectures share: reading and writing a [`Moe`] in
//! `config.json` and GGUF metadata. Each architecture says which keys it uses and how
//! it routes.

use fusebox::{Error, Result, Routing};
use serde_json::json;

use super::{GgufKeys, GgufMetaOut, HfConfig, HfConfigOut};
use crate::transformer::{Arch, Moe};

/// The experts of a `config.json`: `experts_key` (`num_experts`, Mixtral's
/// `num_local_experts`; either is read, as transformers 5 maps one onto the other),
/// `num_experts_per_tok`, the expert width `width_key`
/// (`moe_intermediate_size`, or `intermediate_size` where every MLP is sparse); the
/// load-balancing loss as transformers trains it (`router_aux_loss_coef`, only with
/// `output_router_logits`).
pub fn hf_moe(c: &HfConfig<'_>, experts_key: &str, width_key: &str, routing: Routing) -> Result<Moe> {
    let other = if experts_key == "num_experts" { "num_local_experts" } else { "num_experts" };
    let experts = match (c.field(experts_key), c.field(other)) {
        (None, Some(_)) => c.size(other)?,
        _ => c.size(experts_key)?,
    };
    let top_k = c.size("num_experts_per_tok")?;
    if top_k > experts {
        return Err(Error::value(
            "config.json",
            "'num_experts_per_tok'",
            format!("≤ {experts_key} = {experts}"),
            top_k,
        ));
    }
    let aux_loss_coef = if c.flag("output_router_logits")?.unwrap_or(false) {
        c.float("router_aux_loss_coef")?.unwrap_or(0.001) as f32
    } else {
        0.0
    };
    // A shared expert (Qwen2-MoE, Qwen3-Next): `shared_expert_intermediate_size` > 0.
    let d_shared = c.uint("shared_expert_intermediate_size")?.filter(|&w| w > 0);
    Ok(Moe { experts, top_k, d_expert: c.size(width_key)?, routing, aux_loss_coef, d_shared, dense_layers: Vec::new() })
}

/// Writes `moe` under `experts_key` / `width_key` (as [`hf_moe`] reads it).
pub fn write_hf_moe(moe: &Moe, c: &mut HfConfigOut, experts_key: &str, width_key: &str) {
    c.set(experts_key, json!(moe.experts));
    c.set("num_experts_per_tok", json!(moe.top_k));
    c.set(width_key, json!(moe.d_expert));
    c.set("output_router_logits", json!(moe.aux_loss_coef > 0.0));
    if moe.aux_loss_coef > 0.0 {
        c.set("router_aux_loss_coef", super::hf::json_f32(moe.aux_loss_coef));
    }
    if let Some(w) = moe.d_shared {
        c.set("shared_expert_intermediate_size", json!(w));
    }
}

/// The experts of `arch` as the Qwen mixtures (Qwen2-MoE, Qwen3-MoE) write them:
/// `num_experts`, `moe_intermediate_size`, `norm_topk_prob`, every layer on the sparse
/// stride but `mlp_only_layers`; `name` heads the error when `arch` has no experts.
pub fn write_hf_qwen_moe(arch: &Arch, c: &mut HfConfigOut, name: &str) -> Result<()> {
    let moe = arch.moe.as_ref().ok_or_else(|| Error::value("export", name.to_string(), "experts", "none"))?;
    write_hf_moe(moe, c, "num_experts", "moe_intermediate_size");
    c.set("norm_topk_prob", json!(moe.routing.normalized()));
    c.set("decoder_sparse_step", json!(1));
    c.set("mlp_only_layers", json!(moe.dense_layers));
    Ok(())
}

/// The experts of GGUF metadata: `expert_count`, `expert_used_count`, the width
/// `expert_feed_forward_length` (else `feed_forward_length`); whether the k weights are
/// renormalised is the architecture's (`normalized`), fixed in llama.cpp whatever the
/// file says. `None` when the file has no experts.
pub fn gguf_moe(k: &GgufKeys<'_>, normalized: bool) -> Result<Option<Moe>> {
    let Some(experts) = k.opt_size("expert_count")? else { return Ok(None) };
    let top_k = k.size("expert_used_count")?;
    if top_k > experts {
        return Err(Error::value(
            "gguf",
            format!("metadata '{}'", k.key("expert_used_count")),
            format!("≤ {experts}"),
            top_k,
        ));
    }
    let d_expert = match k.opt_size("expert_feed_forward_length")? {
        Some(w) => w,
        None => k.size("feed_forward_length")?,
    };
    let routing = if normalized { Routing::SoftmaxTopKNormalized } else { Routing::SoftmaxTopK };
    let d_shared = k.opt_size("expert_shared_feed_forward_length")?;
    Ok(Some(Moe { experts, top_k, d_expert, routing, aux_loss_coef: 0.0, d_shared, dense_layers: Vec::new() }))
}

/// Writes the experts of `arch` (as [`gguf_moe`] reads them). llama.cpp fixes whether an
/// architecture renormalises the k weights (`normalized`) and ignores the file's key: a
/// model that routes otherwise is refused rather than written to run differently there.
pub fn write_gguf_moe(arch: &Arch, m: &mut GgufMetaOut, normalized: bool) -> Result<()> {
    let Some(moe) = &arch.moe else { return Ok(()) };
    if !moe.dense_layers.is_empty() {
        return Err(Error::unsupported(
            "export",
            "GGUF has no key for dense layers among sparse ones (mlp_only_layers)",
        ));
    }
    if moe.routing.normalized() != normalized {
        return Err(Error::unsupported(
            "export",
            format!(
                "llama.cpp's '{}' {} the k routing weights, and this model {}: it would run differently there",
                m.arch(),
                if normalized { "always renormalises" } else { "never renormalises" },
                if moe.routing.normalized() { "does" } else { "does not" }
            ),
        ));
    }
    m.size("expert_count", "moe.experts", moe.experts)?;
    m.size("expert_used_count", "moe.top_k", moe.top_k)?;
    m.size("expert_feed_forward_length", "moe.d_expert", moe.d_expert)?;
    if let Some(w) = moe.d_shared {
        m.size("expert_shared_feed_forward_length", "moe.d_shared", w)?;
    }
    Ok(())
}
