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
use crate::files::{read_json, MAX_CONFIG_BYTES};
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
    /// Reads the shards of `dir`: those `model.safetensors.index.json` names, else every
    /// `*.safetensors`. A tensor in two shards, or one the index places in another shard
    /// than the one holding it, is an error naming it.
    pub fn open(dir: &Path) -> Result<Shards> {
        let io = |e: std::io::Error| Error::Io(format!("{}: {e}", dir.display()));
        let index_path = dir.join("model.safetensors.index.json");
        let mut weight_map: Option<BTreeMap<String, String>> = None;
        let names: Vec<String> = if index_path.exists() {
            let v = read_json(&index_path, "the shard index", MAX_CONFIG_BYTES)?;
            let map = v["weight_map"].as_object().ok_or_else(|| {
                Error::Io(format!(
                    "{}: expected a 'weight_map' object, found {}",
                    index_path.display(),
                    v["weight_map"]
                ))
            })?;
            let mut wm = BTreeMap::new();
            for (tensor, file) in map {
                let file = file.as_str().ok_or_else(|| {
                    Error::Io(format!(
                        "{}: weight_map['{tensor}']: expected a file name, found {file}",
                        index_path.display()
                    ))
                })?;
                wm.insert(tensor.clone(), file.to_owned());
            }
            let mut files: Vec<String> = wm.values().cloned().collect();
            files.sort();
            files.dedup();
            weight_map = Some(wm);
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
            if name.is_empty() || name.contains('/') || name.contains('\\') || name.starts_with("..") {
                return Err(Error::Io(format!("{}: shard name '{name}' is not a plain file name", dir.display())));
            }
            let path = dir.join(name);
            let st = SafeTensors::read(&path)?;
            for tensor in st.tensors.keys() {
                if let Some(&other) = index.get(tensor) {
                    return Err(Error::Io(format!(
                        "{}: tensor '{tensor}' is in two shards: {} and {name}",
                        dir.display(),
                        names[other]
                    )));
                }
                if let Some(wm) = &weight_map {
                    match wm.get(tensor) {
                        Some(f) if f == name => {}
                        Some(f) => {
                            return Err(Error::Io(format!(
                                "{}: tensor '{tensor}' is in {name}, but the index places it in {f}",
                                dir.display()
                            )))
                        }
                        None => {
                            return Err(Error::Io(format!(
                                "{}: tensor '{tensor}' in {name} is not in the index's weight_map",
                                dir.display()
                            )))
                        }
                    }
                }
                index.insert(tensor.clone(), files.len());
            }
            files.push(st);
        }
        if let Some(wm) = &weight_map {
            if let Some((tensor, file)) = wm.iter().find(|(t, _)| !index.contains_key(*t)) {
                return Err(Error::Io(format!(
                    "{}: the index places tensor '{tensor}' in {file}, which does not hold it",
                    dir.display()
                )));
            }
        }
        Ok(Shards { files, index, dir: dir.to_path_buf() })
    }

    /// Whether a tensor named `name` exists.
    pub fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// Tensor `name` (host), or an error naming it and the directory.
    pub fn get(&self, name: &str) -> Result<Tensor> {
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| Error::Io(format!("{}: missing tensor '{name}'", self.dir.display())))?;
        self.files[i].tensor(name)
    }

    /// An error naming the first tensor that `expected` does not account for (a layer
    /// past `num_hidden_layers`, a bias the architecture has none of, a stray name):
    /// loading it silently would run another model than the file holds.
    pub fn refuse_unexplained(&self, what: &str, expected: impl Fn(&str) -> bool) -> Result<()> {
        match self.names().find(|n| !expected(n)) {
            Some(name) => Err(Error::Io(format!(
                "{}: tensor '{name}' is not part of {what}; refusing a checkpoint with unexplained tensors",
                self.dir.display()
            ))),
            None => Ok(()),
        }
    }
}

/// Reads `dir/config.json` as JSON (a regular file of at most [`MAX_CONFIG_BYTES`]).
pub fn read_config(dir: &Path) -> Result<Json> {
    read_json(&dir.join("config.json"), "config.json", MAX_CONFIG_BYTES)
}

/// The layer index of a name `{prefix}{l}.{rest}` and the rest.
fn layer_of<'a>(name: &'a str, prefix: &str) -> Option<(usize, &'a str)> {
    let (l, rest) = name.strip_prefix(prefix)?.split_once('.')?;
    if l.len() > 1 && l.starts_with('0') {
        return None;
    }
    Some((l.parse().ok()?, rest))
}

/// A Llama-family model from an HF directory (`config.json` with model_type llama or mistral).
pub fn load_hf_llama(b: &dyn ComputeBackend, dir: &Path, config: &Json) -> Result<LlamaModel> {
    let config = LlamaConfig::from_hf_json(config)?;
    let shards = Shards::open(dir)?;
    let n_layers = config.n_layers;
    shards.refuse_unexplained(&format!("a {}-layer {} model", n_layers, config.architecture), |name| {
        matches!(name, "model.embed_tokens.weight" | "model.norm.weight" | "lm_head.weight")
            || layer_of(name, "model.layers.").is_some_and(|(l, rest)| {
                l < n_layers
                    && (HF_LLAMA_BLOCK.iter().any(|p| rest.strip_suffix(".weight") == Some(*p))
                        // A derived buffer some exports keep; recomputed from the config.
                        || rest == "self_attn.rotary_emb.inv_freq")
            })
    })?;
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

/// The per-block weights of an HF Llama layer (`model.layers.N.{part}.weight`).
const HF_LLAMA_BLOCK: [&str; 9] = [
    "input_layernorm",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "post_attention_layernorm",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

/// The per-block tensors of an HF GPT-2 layer (`h.N.{part}`).
const HF_GPT2_BLOCK: [&str; 12] = [
    "ln_1.weight",
    "ln_1.bias",
    "attn.c_attn.weight",
    "attn.c_attn.bias",
    "attn.c_proj.weight",
    "attn.c_proj.bias",
    "ln_2.weight",
    "ln_2.bias",
    "mlp.c_fc.weight",
    "mlp.c_fc.bias",
    "mlp.c_proj.weight",
    "mlp.c_proj.bias",
];

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
    let n_layers = cfg.n_layers;
    shards.refuse_unexplained(&format!("a {n_layers}-layer GPT-2 model"), |full| {
        let Some(name) = full.strip_prefix(prefix) else { return full == "lm_head.weight" };
        matches!(name, "wte.weight" | "wpe.weight" | "ln_f.weight" | "ln_f.bias")
            || layer_of(name, "h.").is_some_and(|(l, rest)| {
                l < n_layers
                    && (HF_GPT2_BLOCK.contains(&rest)
                        // The causal-mask buffers older exports keep; the mask is implicit here.
                        || rest == "attn.bias"
                        || rest == "attn.masked_bias")
            })
    })?;
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
