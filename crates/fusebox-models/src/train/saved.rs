//! What a checkpoint's `trainer.json` says about the run it came from: the step, the data
//! sampler's state, the settings, where the data came from — read before resuming it.

use std::path::{Path, PathBuf};

use fusebox::{ComputeBackend, Error, Result};
use serde_json::Value;

use super::TrainConfig;
use crate::checkpoint;
use crate::files;
use crate::model::Model;

/// Largest `trainer.json` read.
const MAX_TRAINER_JSON: u64 = 64 << 20;

/// A checkpoint's trainer state, to resume from.
#[derive(Debug, Clone)]
pub struct Saved {
    /// The `step-N` directory.
    pub dir: PathBuf,
    /// Completed optimizer steps.
    pub step: u64,
    /// The data sampler's state.
    pub data_rng: u64,
    /// Its `trainer.json`.
    pub trainer: Value,
}

impl Saved {
    /// The state of checkpoint directory `dir` whose `trainer.json` holds `trainer`.
    pub fn new(dir: PathBuf, trainer: Value) -> Result<Saved> {
        let field = |name: &str| {
            trainer.get(name).and_then(Value::as_u64).ok_or_else(|| {
                Error::Io(format!("{}: no '{name}' (a non-negative integer)", dir.join("trainer.json").display()))
            })
        };
        let (step, data_rng) = (field("step")?, field("data_rng")?);
        Ok(Saved { dir, step, data_rng, trainer })
    }

    /// Reads the `trainer.json` of checkpoint directory `dir`.
    pub fn read(dir: PathBuf) -> Result<Saved> {
        let trainer = files::read_json(&dir.join("trainer.json"), "trainer.json", MAX_TRAINER_JSON)?;
        Saved::new(dir, trainer)
    }

    /// Where the data came from, as the run that saved it recorded it (`"data_args"`;
    /// fine-tuning checkpoints older than the field have it under `"finetune"`); `Null`
    /// when not recorded.
    pub fn data_args(&self) -> Value {
        let t = &self.trainer;
        t.get("data_args")
            .or_else(|| t.get("finetune").and_then(|f| f.get("data_args")))
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// The ranks that trained it (`world_size`; `None` in checkpoints older than the field).
    pub fn world_size(&self) -> Option<usize> {
        self.trainer.get("world_size")?.as_u64().and_then(|n| usize::try_from(n).ok()).filter(|&n| n > 0)
    }
}

/// The from-scratch model of the checkpoint `path` names (see [`checkpoint::resolve`])
/// and its trainer state.
pub fn load_model(b: &dyn ComputeBackend, path: &Path) -> Result<(Model, Saved)> {
    let (model, ckpt) = checkpoint::load_model(b, path)?;
    Ok((model, Saved::new(ckpt.dir, ckpt.trainer)?))
}

/// What a checkpoint says about the run it came from, read before resuming it.
#[derive(Debug, Clone)]
pub struct ResumeInfo {
    /// The `step-N` directory.
    pub dir: PathBuf,
    /// Completed optimizer steps.
    pub step: u64,
    /// The training settings saved with it (absent in checkpoints older than the field).
    pub config: Option<TrainConfig>,
    /// Its trainer state.
    pub saved: Saved,
}

/// Reads the step and training settings of the checkpoint `path` names (see
/// [`checkpoint::resolve`]) without loading its tensors.
pub fn resume_info(path: &Path) -> Result<ResumeInfo> {
    let saved = Saved::read(checkpoint::resolve(path)?)?;
    let file = saved.dir.join("trainer.json");
    let config = match saved.trainer.get("train") {
        Some(t) => Some(TrainConfig::from_json(t).map_err(|e| Error::Io(format!("{}: {e}", file.display())))?),
        None => None,
    };
    Ok(ResumeInfo { dir: saved.dir.clone(), step: saved.step, config, saved })
}
