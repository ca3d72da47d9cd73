//! Checkpoints: a directory `step-N/` holding the weights (`model.safetensors`), the
//! optimizer moments (`optimizer.safetensors`), `config.json`, and `trainer.json` (step,
//! the data sampler's random state, the training settings). Saved atomically as a
//! whole: written to `step-N.tmp/`, renamed to `step-N/`, then `latest` (a one-line
//! file naming the directory) is replaced by rename — a run killed mid-save leaves the
//! previous checkpoint whole and `latest` pointing at it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fusebox::{ComputeBackend, Error, Result, Tensor};
use serde_json::Value;

use crate::config::ModelConfig;
use crate::model::{param_specs, Model};
use crate::params::{ParamSet, ParamSpec};
use crate::safetensors::{self, SafeTensors};

/// What a checkpoint holds besides the weights.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The checkpoint's directory (`step-N/`).
    pub dir: PathBuf,
    /// The model's configuration (`config.json`).
    pub config: ModelConfig,
    /// Free-form trainer state (`trainer.json`).
    pub trainer: Value,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Io(format!("{}: {e}", path.display()))
}

fn named(
    backend: &dyn ComputeBackend,
    specs: &[ParamSpec],
    set: &ParamSet,
    prefix: &str,
) -> Result<Vec<(String, Tensor)>> {
    specs.iter().zip(&set.tensors).map(|(s, t)| Ok((format!("{prefix}{}", s.name), backend.to_host(t)?))).collect()
}

/// Saves a checkpoint of `model` (and optimizer moments `m`, `v`) as `out/step-{step}`.
pub fn save(
    backend: &dyn ComputeBackend,
    out: &Path,
    step: u64,
    model: &Model,
    moments: Option<(&ParamSet, &ParamSet)>,
    trainer: &Value,
) -> Result<PathBuf> {
    std::fs::create_dir_all(out).map_err(io(out))?;
    let final_dir = out.join(format!("step-{step}"));
    let tmp = out.join(format!("step-{step}.tmp"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let meta = BTreeMap::from([("format".to_string(), "fusebox".to_string())]);
    safetensors::write(&tmp.join("model.safetensors"), &named(backend, &model.specs, &model.params, "")?, &meta)?;
    if let Some((m, v)) = moments {
        let mut tensors = named(backend, &model.specs, m, "m.")?;
        tensors.extend(named(backend, &model.specs, v, "v.")?);
        safetensors::write(&tmp.join("optimizer.safetensors"), &tensors, &meta)?;
    }
    write_json(&tmp.join("config.json"), &model.config.to_json())?;
    write_json(&tmp.join("trainer.json"), trainer)?;
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir).map_err(io(&final_dir))?;
    }
    std::fs::rename(&tmp, &final_dir).map_err(io(&final_dir))?;
    let latest_tmp = out.join("latest.tmp");
    std::fs::write(&latest_tmp, format!("step-{step}\n")).map_err(io(&latest_tmp))?;
    std::fs::rename(&latest_tmp, out.join("latest")).map_err(io(out))?;
    Ok(final_dir)
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v).map_err(|e| Error::Io(e.to_string()))?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    serde_json::from_str(&text).map_err(|e| Error::Io(format!("{}: not valid JSON: {e}", path.display())))
}

/// The checkpoint directory `path` names: a `step-N` directory itself, or an output
/// directory whose `latest` file names one.
pub fn resolve(path: &Path) -> Result<PathBuf> {
    if path.join("model.safetensors").exists() {
        return Ok(path.to_path_buf());
    }
    let latest = path.join("latest");
    if latest.exists() {
        let name = std::fs::read_to_string(&latest).map_err(io(&latest))?;
        let dir = path.join(name.trim());
        if dir.join("model.safetensors").exists() {
            return Ok(dir);
        }
        return Err(Error::Io(format!(
            "{}: 'latest' names {} which holds no model.safetensors",
            path.display(),
            dir.display()
        )));
    }
    if !path.exists() {
        return Err(Error::Io(format!("{}: no such checkpoint directory", path.display())));
    }
    Err(Error::Io(format!("{}: not a checkpoint (no model.safetensors, no 'latest' file)", path.display())))
}

fn load_set(
    backend: &dyn ComputeBackend,
    st: &SafeTensors,
    specs: &[ParamSpec],
    prefix: &str,
    file: &Path,
) -> Result<ParamSet> {
    let mut values = Vec::new();
    for s in specs {
        let name = format!("{prefix}{}", s.name);
        let t = st
            .tensor(&name)
            .map_err(|_| Error::Io(format!("{}: missing tensor '{name}' that the config needs", file.display())))?;
        if t.shape() != &s.shape {
            return Err(Error::Io(format!(
                "{}: tensor '{name}' has shape {} but config.json says {}",
                file.display(),
                t.shape(),
                s.shape
            )));
        }
        values.extend(t.to_vec_f32()?);
    }
    ParamSet::from_values(backend, specs, values)
}

/// Loads the model of a checkpoint (see [`resolve`] for `path`).
pub fn load_model(backend: &dyn ComputeBackend, path: &Path) -> Result<(Model, Checkpoint)> {
    let dir = resolve(path)?;
    let config = ModelConfig::from_json(&read_json(&dir.join("config.json"))?)
        .map_err(|e| Error::Io(format!("{}: {e}", dir.join("config.json").display())))?;
    let (specs, _) = param_specs(&config);
    let file = dir.join("model.safetensors");
    let st = SafeTensors::read(&file)?;
    let params = load_set(backend, &st, &specs, "", &file)?;
    let trainer = if dir.join("trainer.json").exists() { read_json(&dir.join("trainer.json"))? } else { Value::Null };
    let model = Model::from_params(backend, config.clone(), params)?;
    Ok((model, Checkpoint { dir, config, trainer }))
}

/// Loads the optimizer moments `(m, v)` of a checkpoint directory.
pub fn load_moments(backend: &dyn ComputeBackend, dir: &Path, specs: &[ParamSpec]) -> Result<(ParamSet, ParamSet)> {
    let file = dir.join("optimizer.safetensors");
    let st = SafeTensors::read(&file)?;
    Ok((load_set(backend, &st, specs, "m.", &file)?, load_set(backend, &st, specs, "v.", &file)?))
}
