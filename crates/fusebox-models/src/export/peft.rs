//! LoRA adapters written as Hugging Face PEFT does (`save_pretrained` of a `LoraConfig`
//! model): `adapter_config.json` and `adapter_model.safetensors` with the tensors
//! `base_model.model.model.layers.{l}.self_attn.q_proj.lora_A.weight` `[r, in]` and
//! `….lora_B.weight` `[out, r]`, so `PeftModel.from_pretrained(base, dir)` applies them to
//! the base in `transformers`.
//!
//! q and k rows follow the rope pair order of the Hugging Face model: a GGUF base's
//! interleaved pairs are converted to the half-split order as the `hf` export does, by
//! permuting the rows of `B` (the rows of `B·A` are the rows of the q/k projection).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use fusebox::{ComputeBackend, Error, Result, Tensor};
use serde_json::json;

use super::{check_out, temp_beside, Weights};
use crate::arch::{hf_plan, FileTensors};
use crate::transformer::lora::stem;
use crate::transformer::{Adapters, Arch, Target};

/// fusebox's name of the weight a LoRA target adapts in layer `l` (`h.0.attn.q.weight`).
fn adapted_weight(l: usize, t: Target, gated: bool) -> String {
    format!("h.{l}.{}.weight", stem(t, gated))
}

/// Writes `ad`, adapters of a model of `arch`, as a PEFT adapter directory `out`
/// (replacing an earlier one); `base` is recorded as `base_model_name_or_path`. The
/// module names are the architecture's Hugging Face names of the adapted weights;
/// an architecture whose Hugging Face layer fuses them (GPT-2's `c_attn`, Phi-3's
/// `qkv_proj`/`gate_up_proj`) has none, and is refused.
pub fn write(b: &dyn ComputeBackend, arch: &Arch, ad: &Adapters, base: &str, out: &Path) -> Result<()> {
    const OP: &str = "export --format peft";
    let unit = crate::arch::by_name(&arch.name)?;
    let names = unit.hf().names;
    let gated = arch.mlp.gated();
    if let Some(&(l, t)) = ad
        .sites()
        .iter()
        .find(|(l, t)| arch.experts_at(*l).is_some() && matches!(t, Target::Gate | Target::Up | Target::Down))
    {
        return Err(Error::unsupported(
            OP,
            format!(
                "layer {l}'s '{}' adapters are per expert, which PEFT names no module for here; export the merged \
                 model (--format hf or gguf) instead",
                t.name()
            ),
        ));
    }
    if let Some(w) = ad.sites().iter().map(|&(l, t)| adapted_weight(l, t, gated)).find(|w| unit.hf_part_of_fused(w)) {
        return Err(Error::unsupported(
            OP,
            format!(
                "{}'s Hugging Face layers fuse '{w}' with other projections in an order of their own, so PEFT has no \
                 module for its adapter; export the merged model (--format hf or gguf) instead",
                arch.name
            ),
        ));
    }
    // `{layers prefix}{l}.self_attn.q_proj` per adapted site, under PEFT's wrapper.
    let modules = ad
        .sites()
        .iter()
        .map(|&(l, t)| {
            let (file, _) = names.file_name(&adapted_weight(l, t, gated))?;
            Some(format!("base_model.model.{}", file.strip_suffix(".weight")?))
        })
        .collect::<Option<Vec<String>>>()
        .ok_or_else(|| {
            Error::unsupported(
                OP,
                format!(
                    "{}'s Hugging Face layers fuse the projections LoRA adapts here; export the merged model \
                     (--format hf) instead",
                    arch.name
                ),
            )
        })?;
    check_out(out, true)?;
    let config = super::hf::config_json(arch, None, None, None, super::FloatType::F32)?;
    // The model is in memory: its own layer count bounds what reads back.
    let file = FileTensors { count: arch.n_layers, has: &|_| true };
    let hf_style = hf_plan(&config, &file)?.arch.rope.style;

    // B of q and k through the hf export's row permutation, under the names it expects.
    let mut values = HashMap::new();
    for (i, &(l, t)) in ad.sites().iter().enumerate() {
        if matches!(t, Target::Q | Target::K) {
            let bt = b.to_host(&ad.params.tensors[2 * i + 1])?;
            values.insert(format!("h.{l}.attn.{}.weight", t.name()), (bt.dims().to_vec(), bt.to_vec_f32()?));
        }
    }
    let mut qk = Weights { values };
    qk.set_rope_style(arch, arch.rope.style, hf_style);

    let mut tensors = Vec::with_capacity(ad.specs.len());
    let mut target_modules: Vec<String> = Vec::new();
    for (i, (&(l, t), stem)) in ad.sites().iter().zip(&modules).enumerate() {
        let a = b.to_host(&ad.params.tensors[2 * i])?;
        let bm = match qk.values.remove(&format!("h.{l}.attn.{}.weight", t.name())) {
            Some((shape, v)) => Tensor::from_vec(v, shape)?,
            None => b.to_host(&ad.params.tensors[2 * i + 1])?,
        };
        tensors.push((format!("{stem}.lora_A.weight"), a));
        tensors.push((format!("{stem}.lora_B.weight"), bm));
        let module = stem.rsplit('.').next().unwrap_or("").to_string();
        if !target_modules.contains(&module) {
            target_modules.push(module);
        }
    }
    target_modules.sort_unstable();
    let adapter_config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": ad.config.rank,
        "lora_alpha": ad.config.alpha,
        "lora_dropout": 0.0,
        "target_modules": target_modules,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "use_rslora": false,
        "use_dora": false,
        "modules_to_save": null,
    });

    let tmp = temp_beside(out)?;
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| Error::Io(format!("{}: {e}", tmp.display())))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| Error::Io(format!("{}: {e}", tmp.display())))?;
    let result = (|| -> Result<()> {
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        crate::safetensors::write(&tmp.join("adapter_model.safetensors"), &tensors, &meta)?;
        let text = serde_json::to_string_pretty(&adapter_config).map_err(|e| Error::Io(e.to_string()))?;
        std::fs::write(tmp.join("adapter_config.json"), text).map_err(|e| Error::Io(format!("{}: {e}", tmp.display())))
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(|e| Error::Io(format!("{}: {e}", out.display())))?;
    }
    std::fs::rename(&tmp, out).map_err(|e| Error::Io(format!("rename {} → {}: {e}", tmp.display(), out.display())))
}
