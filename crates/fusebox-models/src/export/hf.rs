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
use serde_json::{json, Value as Json};

use super::{check_out, check_reads_back, float_tensor, io_at, temp_beside, FloatType, TokenizerInfo, Weights};
use crate::arch::{hf_plan, FileTensors, HfConfigOut};
use crate::transformer::{Arch, Transformer};

/// Largest shard written; a model past it is split into `model-0000i-of-0000n.safetensors`.
pub const SHARD_BYTES: usize = 2 << 30;

/// The `config.json` of `arch` (ids from the tokenizer): the fields every model has,
/// and its architecture's ([`crate::arch::Architecture::write_hf`]).
pub fn config_json(
    arch: &Arch,
    bos: Option<u32>,
    eos: Option<u32>,
    pad: Option<u32>,
    dtype: FloatType,
) -> Result<Json> {
    let unit = crate::arch::by_name(&arch.name)?;
    let torch_dtype = match dtype {
        FloatType::F32 => "float32",
        FloatType::F16 => "float16",
        FloatType::BF16 => "bfloat16",
    };
    let mut c = HfConfigOut::new();
    c.set("vocab_size", json!(arch.vocab_size));
    c.set("bos_token_id", json!(bos));
    c.set("eos_token_id", json!(eos));
    c.set("pad_token_id", json!(pad));
    c.set("tie_word_embeddings", json!(arch.tied_embeddings));
    c.set("dtype", json!(torch_dtype));
    c.set("torch_dtype", json!(torch_dtype));
    c.set("use_cache", json!(true));
    c.set("initializer_range", json!(0.02));
    unit.write_hf(arch, &mut c)?;
    if !c.has("model_type") {
        return Err(Error::unsupported("export", format!("the {} unit wrote no model_type", arch.name)));
    }
    Ok(c.into_json())
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
    // The counts read back are the model's own, bounded by the tensors it holds.
    let plan = hf_plan(&config, &FileTensors { count: model.specs.len(), has: &|_| true })?;
    check_reads_back(arch, &plan.arch, "a config.json")?;
    let (tokenizer_json, mut tokenizer_config, generation) = tokenizer.hf_files()?;

    let mut weights = Weights::read(b, model)?;
    weights.set_rope_style(arch, arch.rope.style, plan.arch.rope.style);
    let unit = crate::arch::by_name(&plan.arch.name)?;
    let tensors = unit.fuse_for_export(arch, false, weights.file_tensors(&plan, unit.hf().export_prefix)?)?;
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
