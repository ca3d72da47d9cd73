//! A Llama model from a GGUF file: config from the `llama.*` metadata, weights from the
//! `token_embd` / `blk.N.*` / `output*` tensors, kept in their stored format (block
//! formats are multiplied straight from the blocks).

use fusebox::{ComputeBackend, Result, Tensor};

use super::config::{LlamaConfig, RopeScaling};
use super::model::{LlamaLayer, LlamaModel};
use super::weights::{vector, Embedding, Linear, Projections};
use crate::gguf::GgufFile;

/// Builds the model held by `file`. Missing tensors, wrong shapes and unsupported
/// architectures or formats are errors that name them.
pub fn load_gguf(b: &dyn ComputeBackend, file: &GgufFile) -> Result<LlamaModel> {
    let meta = file.metadata();
    let vocab_from_tokens = meta.get_strings("tokenizer.ggml.tokens")?.map(<[String]>::len);
    let mut config = LlamaConfig::from_gguf(meta, vocab_from_tokens)?;
    if file.tensor_info("rope_freqs.weight").is_some() {
        let f = file.tensor("rope_freqs.weight")?;
        config.rope_scaling = RopeScaling::FreqFactors(f.to_vec_f32()?);
    }
    config.tied_embeddings = file.tensor_info("output.weight").is_none();
    config.validate()?;
    let (d, q, kv, f) = (config.d_model, config.q_dim(), config.kv_dim(), config.d_ff);
    // Every tensor must be one this model uses: a block past `block_count` or a tensor
    // the llama layout has none of (a bias) would otherwise be dropped silently.
    for info in file.tensors() {
        let name = info.name();
        let known = matches!(name, "token_embd.weight" | "output_norm.weight" | "output.weight" | "rope_freqs.weight")
            || block_of(name).is_some_and(|(l, part)| l < config.n_layers && BLOCK_TENSORS.contains(&part));
        if !known {
            return Err(fusebox::Error::Io(format!(
                "gguf: tensor '{name}' is not part of a {}-layer {} model (block_count {}); \
                 refusing a file with unexplained tensors",
                config.n_layers, config.architecture, config.n_layers
            )));
        }
    }
    // Every block tensor must be there before anything large is read.
    for l in 0..config.n_layers {
        for part in BLOCK_TENSORS {
            let name = format!("blk.{l}.{part}.weight");
            if file.tensor_info(&name).is_none() {
                return Err(fusebox::Error::Io(format!("gguf: missing tensor '{name}' ({} blocks)", config.n_layers)));
            }
        }
    }
    let get = |name: &str| -> Result<Tensor> { file.tensor(name) };
    let linear = |name: &str, out: usize, inp: usize| Linear::new(b, name, &get(name)?, out, inp);
    let stack = |names: &[(String, usize)], inp: usize| -> Result<Projections> {
        let tensors = names.iter().map(|(n, _)| get(n)).collect::<Result<Vec<_>>>()?;
        let parts: Vec<(&str, &Tensor, usize)> =
            names.iter().zip(&tensors).map(|((n, out), t)| (n.as_str(), t, *out)).collect();
        Projections::new(b, &parts, inp)
    };
    let table = get("token_embd.weight")?;
    let embed = Embedding::new(b, "token_embd.weight", &table, config.vocab_size, d)?;
    let mut layers = Vec::new();
    for l in 0..config.n_layers {
        let n = |part: &str| format!("blk.{l}.{part}.weight");
        layers.push(LlamaLayer {
            attn_norm: vector(b, &n("attn_norm"), &get(&n("attn_norm"))?, d)?,
            qkv: stack(&[(n("attn_q"), q), (n("attn_k"), kv), (n("attn_v"), kv)], d)?,
            wo: linear(&n("attn_output"), d, q)?,
            ffn_norm: vector(b, &n("ffn_norm"), &get(&n("ffn_norm"))?, d)?,
            gate_up: stack(&[(n("ffn_gate"), f), (n("ffn_up"), f)], d)?,
            w_down: linear(&n("ffn_down"), d, f)?,
        });
    }
    let norm_f = vector(b, "output_norm.weight", &get("output_norm.weight")?, d)?;
    let head = if config.tied_embeddings {
        // Shares the table's storage on host backends (upload is a cheap clone).
        Linear::new(b, "token_embd.weight", &table, config.vocab_size, d)?
    } else {
        linear("output.weight", config.vocab_size, d)?
    };
    Ok(LlamaModel { config, embed, layers, norm_f, head })
}

/// The block index and part of `blk.{l}.{part}.weight`.
fn block_of(name: &str) -> Option<(usize, &str)> {
    let (l, rest) = name.strip_prefix("blk.")?.split_once('.')?;
    if l.len() > 1 && l.starts_with('0') {
        return None;
    }
    Some((l.parse().ok()?, rest.strip_suffix(".weight")?))
}

/// The per-block tensors of the llama layout.
const BLOCK_TENSORS: [&str; 9] =
    ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"];
