//! The Hugging Face writer: a directory `transformers.AutoModelForCausalLM` and
//! `AutoTokenizer` load, and fusebox too.
//!
//! | file | what |
//! |---|---|
//! | `config.json` | the `model_type`'s config as transformers 5 writes it (`rope_parameters`), with transformers 4's `rope_theta` / `rope_scaling` beside it |
//! | `model.safetensors` | HF tensor names; shards of at most [`SHARD_BYTES`] with `model.safetensors.index.json` past that |
//! | `tokenizer.json`, `tokenizer_config.json` | the source's, or converted from GGUF metadata; the chat template in `tokenizer_config.json` |
//! | `generation_config.json` | BOS, EOS (and the end-of-turn ids), padding |

use std::collections::BTreeMap;
use std::path::Path;

use fusebox::{ComputeBackend, Error, Result};
use serde_json::{json, Map, Value as Json};

use super::{
    check_out, check_reads_back, float_tensor, io_at, json_f32, temp_beside, FloatType, TokenizerInfo, Weights,
};
use crate::arch::hf_plan;
use crate::transformer::{Arch, LayerAttention, Rope, RopeScaling, Transformer};

/// Largest shard written; a model past it is split into `model-0000i-of-0000n.safetensors`.
pub const SHARD_BYTES: usize = 2 << 30;

/// transformers' `model_type` and class for an architecture.
fn model_type(arch: &Arch) -> Result<(&'static str, &'static str)> {
    Ok(match arch.name.as_str() {
        // A Llama file with a window is Mistral in transformers.
        "llama" | "mistral" if arch.sliding_window.is_some() => ("mistral", "MistralForCausalLM"),
        "llama" => ("llama", "LlamaForCausalLM"),
        "mistral" => ("mistral", "MistralForCausalLM"),
        "qwen2" => ("qwen2", "Qwen2ForCausalLM"),
        "qwen3" => ("qwen3", "Qwen3ForCausalLM"),
        "phi3" => ("phi3", "Phi3ForCausalLM"),
        "gemma3" => ("gemma3_text", "Gemma3ForCausalLM"),
        "gpt2" => ("gpt2", "GPT2LMHeadModel"),
        other => {
            return Err(Error::unsupported("export", format!("no Hugging Face model_type for architecture '{other}'")))
        }
    })
}

/// `rope_parameters` (transformers 5) of one rope.
fn rope_parameters(rope: &Rope) -> Result<Json> {
    let mut p = json!({"rope_theta": rope.theta, "rope_type": "default"});
    match &rope.scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => {
            p["rope_type"] = json!("linear");
            p["factor"] = json!(factor);
        }
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_positions } => {
            p["rope_type"] = json!("llama3");
            p["factor"] = json!(factor);
            p["low_freq_factor"] = json!(low_freq_factor);
            p["high_freq_factor"] = json!(high_freq_factor);
            p["original_max_position_embeddings"] = json!(*original_max_positions as u64);
        }
        RopeScaling::FreqFactors(_) => {
            return Err(Error::unsupported(
                "export",
                "rope frequency factors (GGUF rope_freqs.weight) have no config.json form: transformers describes \
                 Llama 3 scaling by its four parameters, which the factors do not give back",
            ))
        }
    }
    Ok(p)
}

/// transformers 4's `rope_scaling` of one rope (null when plain).
fn rope_scaling_v4(rope: &Rope) -> Result<Json> {
    let p = rope_parameters(rope)?;
    Ok(if rope.scaling == RopeScaling::None {
        Json::Null
    } else {
        let mut m = p.as_object().cloned().unwrap_or_default();
        m.remove("rope_theta");
        Json::Object(m)
    })
}

fn layer_types(arch: &Arch) -> Json {
    json!(arch
        .layer_attention
        .iter()
        .map(|a| match a {
            LayerAttention::Global => "full_attention",
            LayerAttention::Local => "sliding_attention",
        })
        .collect::<Vec<_>>())
}

/// The `config.json` of `arch` (ids from the tokenizer).
pub fn config_json(
    arch: &Arch,
    bos: Option<u32>,
    eos: Option<u32>,
    pad: Option<u32>,
    dtype: FloatType,
) -> Result<Json> {
    let (model_type, class) = model_type(arch)?;
    let torch_dtype = match dtype {
        FloatType::F32 => "float32",
        FloatType::F16 => "float16",
        FloatType::BF16 => "bfloat16",
    };
    let mut c = Map::new();
    let mut set = |k: &str, v: Json| {
        c.insert(k.to_string(), v);
    };
    set("architectures", json!([class]));
    set("model_type", json!(model_type));
    set("vocab_size", json!(arch.vocab_size));
    set("bos_token_id", json!(bos));
    set("eos_token_id", json!(eos));
    set("pad_token_id", json!(pad));
    set("tie_word_embeddings", json!(arch.tied_embeddings));
    set("dtype", json!(torch_dtype));
    set("torch_dtype", json!(torch_dtype));
    set("use_cache", json!(true));
    set("initializer_range", json!(0.02));
    if model_type == "gpt2" {
        set("n_embd", json!(arch.d_model));
        set("n_head", json!(arch.n_heads));
        set("n_layer", json!(arch.n_layers));
        set("n_positions", json!(arch.context_length));
        set("n_ctx", json!(arch.context_length));
        set("n_inner", json!(arch.d_ff));
        set("layer_norm_epsilon", json_f32(arch.norm_eps));
        set("activation_function", json!("gelu_new"));
        set("scale_attn_weights", json!(true));
        set("scale_attn_by_inverse_layer_idx", json!(false));
        set("reorder_and_upcast_attn", json!(false));
        for k in ["attn_pdrop", "embd_pdrop", "resid_pdrop"] {
            set(k, json!(0.0));
        }
        return Ok(Json::Object(c));
    }
    set("hidden_size", json!(arch.d_model));
    set("intermediate_size", json!(arch.d_ff));
    set("num_hidden_layers", json!(arch.n_layers));
    set("num_attention_heads", json!(arch.n_heads));
    set("num_key_value_heads", json!(arch.n_kv_heads));
    set("head_dim", json!(arch.head_dim));
    set("max_position_embeddings", json!(arch.context_length));
    set("rms_norm_eps", json_f32(arch.norm_eps));
    set("attention_dropout", json!(0.0));
    let window = arch.sliding_window;
    match model_type {
        "llama" => {
            set("hidden_act", json!("silu"));
            set("attention_bias", json!(arch.bias.qkv));
            set("mlp_bias", json!(arch.bias.mlp));
            set("pretraining_tp", json!(1));
        }
        "mistral" => {
            set("hidden_act", json!("silu"));
            set("sliding_window", json!(window));
            if window.is_some() {
                set("layer_types", layer_types(arch));
            }
        }
        "qwen2" | "qwen3" => {
            set("hidden_act", json!("silu"));
            if model_type == "qwen3" {
                set("attention_bias", json!(arch.bias.qkv));
            }
            set("use_sliding_window", json!(window.is_some()));
            set("sliding_window", json!(window));
            // Layers from `max_window_layers` on use the window.
            let first_local = arch.layer_attention.iter().position(|a| *a == LayerAttention::Local);
            set("max_window_layers", json!(first_local.unwrap_or(arch.n_layers)));
            set("layer_types", layer_types(arch));
        }
        "phi3" => {
            set("hidden_act", json!("silu"));
            set("sliding_window", json!(window));
            set("original_max_position_embeddings", json!(arch.context_length));
            set("partial_rotary_factor", json!(1.0));
            for k in ["embd_pdrop", "resid_pdrop"] {
                set(k, json!(0.0));
            }
        }
        "gemma3_text" => {
            set("hidden_activation", json!("gelu_pytorch_tanh"));
            let scalar = 1.0 / (f64::from(arch.attn_scale) * f64::from(arch.attn_scale));
            let rounded = scalar.round();
            // transformers types it as an integer.
            if (scalar - rounded).abs() < 1e-3 * rounded.max(1.0) {
                set("query_pre_attn_scalar", json!(rounded as u64));
            } else {
                set("query_pre_attn_scalar", json!(scalar));
            }
            set("sliding_window", json!(window));
            set("layer_types", layer_types(arch));
            set("final_logit_softcapping", Json::Null);
            set("attn_logit_softcapping", Json::Null);
            let local = arch.rope_local.clone().unwrap_or_else(|| arch.rope.clone());
            set("rope_local_base_freq", json!(local.theta));
            set(
                "rope_parameters",
                json!({"full_attention": rope_parameters(&arch.rope)?, "sliding_attention": rope_parameters(&local)?}),
            );
            set("rope_theta", json!(arch.rope.theta));
            set("rope_scaling", rope_scaling_v4(&arch.rope)?);
            return Ok(Json::Object(c));
        }
        _ => {}
    }
    set("rope_parameters", rope_parameters(&arch.rope)?);
    set("rope_theta", json!(arch.rope.theta));
    set("rope_scaling", rope_scaling_v4(&arch.rope)?);
    Ok(Json::Object(c))
}

fn write_json(path: &Path, v: &Json) -> Result<()> {
    let text = serde_json::to_string_pretty(v).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    std::fs::write(path, text + "\n").map_err(io_at(path))
}

/// Writes `model` as a Hugging Face directory at `out` (see the module docs): weights
/// in `dtype`, the tokenizer converted when it comes from GGUF metadata, `chat_template`
/// in `tokenizer_config.json`. The directory appears complete or not at all (it is
/// built beside `out` and renamed); an existing `out` is replaced only if it is empty
/// or a Hugging Face directory.
pub fn write(
    b: &dyn ComputeBackend,
    model: &Transformer,
    tokenizer: &TokenizerInfo,
    chat_template: Option<&str>,
    out: &Path,
    dtype: FloatType,
) -> Result<()> {
    let arch = &model.arch;
    check_out(out, true)?;
    let tok = tokenizer.tokenizer()?;
    if tok.vocab_size() > arch.vocab_size {
        return Err(Error::Io(format!(
            "export: the tokenizer has {} tokens, the model's embedding {} rows",
            tok.vocab_size(),
            arch.vocab_size
        )));
    }
    let config = config_json(arch, tok.bos_id(), tok.eos_id(), tok.pad_id(), dtype)?;
    let plan = hf_plan(&config)?;
    check_reads_back(arch, &plan.arch, "a config.json")?;
    let (tokenizer_json, mut tokenizer_config, generation) = tokenizer.hf_files()?;

    let mut weights = Weights::read(b, model)?;
    weights.set_rope_style(arch, arch.rope.style, plan.arch.rope.style);
    let prefix = if plan.arch.name == "gpt2" { "transformer." } else { "" };
    let tensors = weights.file_tensors(&plan, prefix)?;
    drop(weights);

    let tmp = temp_beside(out)?;
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io_at(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io_at(&tmp))?;
    let result = (|| -> Result<()> {
        write_json(&tmp.join("config.json"), &config)?;
        write_safetensors(&tmp, &tensors, dtype)?;
        std::fs::write(tmp.join("tokenizer.json"), &tokenizer_json).map_err(io_at(&tmp))?;
        if let Some(obj) = tokenizer_config.as_object_mut() {
            match chat_template {
                Some(t) => obj.insert("chat_template".into(), json!(t)),
                None => obj.remove("chat_template"),
            };
            obj.insert("model_max_length".into(), json!(arch.context_length));
        }
        write_json(&tmp.join("tokenizer_config.json"), &tokenizer_config)?;
        let generation = generation.unwrap_or_else(|| {
            let mut eos: Vec<u32> = tok.eos_id().into_iter().collect();
            eos.extend(tok.eog_ids().iter().filter(|id| Some(**id) != tok.eos_id()));
            json!({"bos_token_id": tok.bos_id(), "eos_token_id": if eos.len() == 1 { json!(eos[0]) } else { json!(eos) },
                   "pad_token_id": tok.pad_id()})
        });
        write_json(&tmp.join("generation_config.json"), &generation)?;
        if let Ok(d) = std::fs::File::open(&tmp) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // Replace an earlier export: set it aside, move the new one in, then remove it.
    let old = out.with_file_name(format!(
        ".{}.old-{}",
        out.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let had_old = out.exists();
    if had_old {
        std::fs::rename(out, &old).map_err(io_at(out))?;
    }
    if let Err(e) = std::fs::rename(&tmp, out) {
        if had_old {
            let _ = std::fs::rename(&old, out);
        }
        return Err(Error::Io(format!("rename {} → {}: {e}", tmp.display(), out.display())));
    }
    if had_old {
        std::fs::remove_dir_all(&old).map_err(io_at(&old))?;
    }
    Ok(())
}

/// The safetensors shard(s) and, for more than one, the index.
fn write_safetensors(dir: &Path, tensors: &[super::FileTensor], dtype: FloatType) -> Result<()> {
    let elem = dtype.dtype().block_bytes();
    let mut shards: Vec<Vec<usize>> = vec![Vec::new()];
    let mut bytes = 0usize;
    for (i, (_, shape, _)) in tensors.iter().enumerate() {
        let n = shape.iter().product::<usize>() * elem;
        if bytes > 0 && bytes + n > SHARD_BYTES {
            shards.push(Vec::new());
            bytes = 0;
        }
        bytes += n;
        if let Some(last) = shards.last_mut() {
            last.push(i);
        }
    }
    let count = shards.len();
    let file_name = |i: usize| {
        if count == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{count:05}.safetensors", i + 1)
        }
    };
    let st_dtype = match dtype {
        FloatType::F32 => safetensors::Dtype::F32,
        FloatType::F16 => safetensors::Dtype::F16,
        FloatType::BF16 => safetensors::Dtype::BF16,
    };
    let mut weight_map = BTreeMap::new();
    let mut total = 0usize;
    for (s, members) in shards.iter().enumerate() {
        let name = file_name(s);
        let converted = members
            .iter()
            .map(|&i| {
                let (tname, shape, values) = &tensors[i];
                float_tensor(values, shape, dtype.dtype()).map(|t| (tname.clone(), shape.clone(), t))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut views = Vec::with_capacity(converted.len());
        for (tname, shape, t) in &converted {
            let view = safetensors::tensor::TensorView::new(st_dtype, shape.clone(), t.host_bytes()?)
                .map_err(|e| Error::Io(format!("export: safetensors tensor '{tname}': {e}")))?;
            total += t.byte_len();
            weight_map.insert(tname.clone(), name.clone());
            views.push((tname.clone(), view));
        }
        let path = dir.join(&name);
        let metadata = Some(std::collections::HashMap::from([("format".to_string(), "pt".to_string())]));
        safetensors::serialize_to_file(views, metadata, &path)
            .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
        // The shard gets the permissions the other files got (the umask's), not the
        // writer's private ones.
        let perms = std::fs::metadata(dir.join("config.json")).map_err(io_at(dir))?.permissions();
        std::fs::set_permissions(&path, perms).map_err(io_at(&path))?;
    }
    if count > 1 {
        write_json(
            &dir.join("model.safetensors.index.json"),
            &json!({"metadata": {"total_size": total}, "weight_map": weight_map}),
        )?;
    }
    Ok(())
}
