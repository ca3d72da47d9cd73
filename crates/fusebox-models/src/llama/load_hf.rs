//! Hugging Face checkpoint directories: `config.json` plus one `model.safetensors` or
//! several shards (named by `model.safetensors.index.json`, or every `*.safetensors`).
//!
//! * `model_type` llama / mistral → [`LlamaModel`] (HF's q/k layout: half-split rope).
//! * `model_type` gpt2 → the trainable [`Model`] with style GPT-2. GPT-2's `Conv1D`
//!   weights are stored `[in, out]`; they are transposed at load to `[out, in]`, and the
//!   fused `c_attn` is split into the q, k and v projections.
//!
//! Tensors may be F32, F16 or BF16.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fusebox::{ComputeBackend, DType, Error, Result, Tensor};
use serde_json::Value as Json;

use super::config::LlamaConfig;
use super::model::{LlamaLayer, LlamaModel};
use super::weights::{check_shape, vector, Embedding, Linear, Projections};
use crate::config::{ModelConfig, Style};
use crate::model::{param_specs, Model};
use crate::params::ParamSet;
use crate::safetensors::SafeTensors;

/// The safetensors shards of a directory with a name → shard lookup.
pub struct Shards {
    files: Vec<SafeTensors>,
    index: BTreeMap<String, usize>,
    dir: PathBuf,
}

impl Shards {
    /// Reads the shards of `dir`: those the index json names, else every `*.safetensors`.
    pub fn open(dir: &Path) -> Result<Shards> {
        let io = |e: std::io::Error| Error::Io(format!("{}: {e}", dir.display()));
        let index_path = dir.join("model.safetensors.index.json");
        let names: Vec<String> = if index_path.exists() {
            let text = std::fs::read_to_string(&index_path).map_err(io)?;
            let v: Json = serde_json::from_str(&text)
                .map_err(|e| Error::Io(format!("{}: not valid JSON: {e}", index_path.display())))?;
            let map = v["weight_map"]
                .as_object()
                .ok_or_else(|| Error::Io(format!("{}: no 'weight_map' object", index_path.display())))?;
            let mut files: Vec<String> = map.values().filter_map(|f| f.as_str().map(str::to_owned)).collect();
            files.sort();
            files.dedup();
            files
        } else {
            let mut files: Vec<String> = std::fs::read_dir(dir)
                .map_err(io)?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".safetensors"))
                .collect();
            files.sort();
            files
        };
        if names.is_empty() {
            return Err(Error::Io(format!("{}: no *.safetensors files", dir.display())));
        }
        let mut files = Vec::new();
        let mut index = BTreeMap::new();
        for name in &names {
            if name.contains('/') || name.contains('\\') || name.starts_with("..") {
                return Err(Error::Io(format!("{}: shard name '{name}' is not a plain file name", dir.display())));
            }
            let st = SafeTensors::read(&dir.join(name))?;
            for tensor in st.tensors.keys() {
                index.insert(tensor.clone(), files.len());
            }
            files.push(st);
        }
        Ok(Shards { files, index, dir: dir.to_path_buf() })
    }

    /// Whether a tensor named `name` exists.
    pub fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Tensor `name` (host), or an error naming it and the directory.
    pub fn get(&self, name: &str) -> Result<Tensor> {
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| Error::Io(format!("{}: missing tensor '{name}'", self.dir.display())))?;
        self.files[i].tensor(name)
    }
}

/// Reads `dir/config.json` as JSON.
pub fn read_config(dir: &Path) -> Result<Json> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| Error::Io(format!("{}: not valid JSON: {e}", path.display())))
}

/// A Llama-family model from an HF directory (`config.json` with model_type llama or mistral).
pub fn load_hf_llama(b: &dyn ComputeBackend, dir: &Path, config: &Json) -> Result<LlamaModel> {
    let config = LlamaConfig::from_hf_json(config)?;
    let shards = Shards::open(dir)?;
    let (d, q, kv, f) = (config.d_model, config.q_dim(), config.kv_dim(), config.d_ff);
    let linear = |name: &str, out: usize, inp: usize| Linear::new(b, name, &shards.get(name)?, out, inp);
    let stack = |names: &[(String, usize)], inp: usize| -> Result<Projections> {
        let tensors = names.iter().map(|(n, _)| shards.get(n)).collect::<Result<Vec<_>>>()?;
        let parts: Vec<(&str, &Tensor, usize)> =
            names.iter().zip(&tensors).map(|((n, out), t)| (n.as_str(), t, *out)).collect();
        Projections::new(b, &parts, inp)
    };
    let norm = |name: &str| vector(b, name, &shards.get(name)?, d);
    let table = shards.get("model.embed_tokens.weight")?;
    let embed = Embedding::new(b, "model.embed_tokens.weight", &table, config.vocab_size, d)?;
    let mut layers = Vec::new();
    for l in 0..config.n_layers {
        let n = |part: &str| format!("model.layers.{l}.{part}.weight");
        layers.push(LlamaLayer {
            attn_norm: norm(&n("input_layernorm"))?,
            qkv: stack(&[(n("self_attn.q_proj"), q), (n("self_attn.k_proj"), kv), (n("self_attn.v_proj"), kv)], d)?,
            wo: linear(&n("self_attn.o_proj"), d, q)?,
            ffn_norm: norm(&n("post_attention_layernorm"))?,
            gate_up: stack(&[(n("mlp.gate_proj"), f), (n("mlp.up_proj"), f)], d)?,
            w_down: linear(&n("mlp.down_proj"), d, f)?,
        });
    }
    let norm_f = norm("model.norm.weight")?;
    let head = if config.tied_embeddings {
        Linear::new(b, "model.embed_tokens.weight", &table, config.vocab_size, d)?
    } else {
        linear("lm_head.weight", config.vocab_size, d)?
    };
    Ok(LlamaModel { config, embed, layers, norm_f, head })
}

/// The GPT-2 config of an HF `config.json`.
pub fn gpt2_config(v: &Json) -> Result<ModelConfig> {
    let uint = |name: &str| v.get(name).and_then(Json::as_u64).map(|x| x as usize);
    let req = |name: &str| uint(name).ok_or_else(|| Error::Io(format!("config.json: missing integer '{name}'")));
    let act = v.get("activation_function").and_then(Json::as_str).unwrap_or("gelu_new");
    if !matches!(act, "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast") {
        return Err(Error::unsupported(
            "load_hf",
            format!("GPT-2 activation_function '{act}' (only the tanh GELU forms: gelu_new, gelu_pytorch_tanh)"),
        ));
    }
    let d_model = req("n_embd")?;
    let cfg = ModelConfig {
        style: Style::Gpt2,
        vocab_size: req("vocab_size")?,
        n_layers: req("n_layer")?,
        n_heads: req("n_head")?,
        n_kv_heads: req("n_head")?,
        d_model,
        d_ff: uint("n_inner").unwrap_or(4 * d_model),
        max_seq: uint("n_positions")
            .or_else(|| uint("n_ctx"))
            .ok_or_else(|| Error::Io("config.json: missing integer 'n_positions'".into()))?,
        norm_eps: v.get("layer_norm_epsilon").and_then(Json::as_f64).unwrap_or(1e-5) as f32,
        rope_theta: 10000.0,
        tied_embeddings: true,
    };
    cfg.validate()?;
    Ok(cfg)
}

/// Values of a host float tensor as f32.
fn values(t: &Tensor) -> Result<Vec<f32>> {
    match t.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => t.to_vec_f32(),
        other => Err(Error::Io(format!("tensor of dtype {other}: expected f32, f16 or bf16"))),
    }
}

/// `[rows, cols]` row-major → its transpose `[cols, rows]`.
fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = v[r * cols + c];
        }
    }
    out
}

/// A GPT-2 model from an HF directory, mapped onto the trainable [`Model`].
pub fn load_hf_gpt2(b: &dyn ComputeBackend, dir: &Path, config: &Json) -> Result<Model> {
    let cfg = gpt2_config(config)?;
    let shards = Shards::open(dir)?;
    // Some exports prefix every name with "transformer.".
    let prefix = if shards.has("transformer.wte.weight") { "transformer." } else { "" };
    let get = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
        let full = format!("{prefix}{name}");
        let t = shards.get(&full)?;
        check_shape(&full, &t, shape)?;
        values(&t).map_err(|e| Error::Io(format!("tensor '{full}': {e}")))
    };
    let (d, f) = (cfg.d_model, cfg.d_ff);
    let (specs, _) = param_specs(&cfg);
    // Values per parameter name of `param_specs`, converted to its [out, in] layout.
    let mut by_name: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    by_name.insert("wte".into(), get("wte.weight", &[cfg.vocab_size, d])?);
    by_name.insert("wpe".into(), get("wpe.weight", &[cfg.max_seq, d])?);
    for l in 0..cfg.n_layers {
        let src = |s: &str| format!("h.{l}.{s}");
        let dst = |s: &str| format!("h.{l}.{s}");
        by_name.insert(dst("norm1.weight"), get(&src("ln_1.weight"), &[d])?);
        by_name.insert(dst("norm1.bias"), get(&src("ln_1.bias"), &[d])?);
        // c_attn: [in D, out 3D] → [3D, D], rows q | k | v.
        let qkv = transpose(&get(&src("attn.c_attn.weight"), &[d, 3 * d])?, d, 3 * d);
        let qkv_b = get(&src("attn.c_attn.bias"), &[3 * d])?;
        for (i, name) in ["q", "k", "v"].iter().enumerate() {
            by_name.insert(dst(&format!("attn.{name}.weight")), qkv[i * d * d..(i + 1) * d * d].to_vec());
            by_name.insert(dst(&format!("attn.{name}.bias")), qkv_b[i * d..(i + 1) * d].to_vec());
        }
        by_name.insert(dst("attn.o.weight"), transpose(&get(&src("attn.c_proj.weight"), &[d, d])?, d, d));
        by_name.insert(dst("attn.o.bias"), get(&src("attn.c_proj.bias"), &[d])?);
        by_name.insert(dst("norm2.weight"), get(&src("ln_2.weight"), &[d])?);
        by_name.insert(dst("norm2.bias"), get(&src("ln_2.bias"), &[d])?);
        by_name.insert(dst("mlp.fc.weight"), transpose(&get(&src("mlp.c_fc.weight"), &[d, f])?, d, f));
        by_name.insert(dst("mlp.fc.bias"), get(&src("mlp.c_fc.bias"), &[f])?);
        by_name.insert(dst("mlp.proj.weight"), transpose(&get(&src("mlp.c_proj.weight"), &[f, d])?, f, d));
        by_name.insert(dst("mlp.proj.bias"), get(&src("mlp.c_proj.bias"), &[d])?);
    }
    by_name.insert("norm_f.weight".into(), get("ln_f.weight", &[d])?);
    by_name.insert("norm_f.bias".into(), get("ln_f.bias", &[d])?);
    let mut all = Vec::new();
    for s in &specs {
        let v = by_name
            .remove(&s.name)
            .ok_or_else(|| Error::Io(format!("GPT-2 loader: no source for parameter '{}'", s.name)))?;
        all.extend(v);
    }
    let params = ParamSet::from_values(b, &specs, all)?;
    Model::from_params(b, cfg, params)
}
