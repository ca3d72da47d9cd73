//! Checkpoints: a directory `step-N/` holding the weights (`model.safetensors`), the
//! optimizer moments (`optimizer.safetensors`), `config.json`, and `trainer.json` (step,
//! the data sampler's random state, the training settings), written last.
//!
//! A save never deletes the only complete copy of a checkpoint, and `latest` (a one-line
//! file naming the directory) only ever names a complete one:
//!
//! 1. everything is written into `step-N.tmp/` (each file by write-then-rename, synced);
//! 2. an existing `step-N/` is renamed to `step-N.old/`;
//! 3. `step-N.tmp/` is renamed to `step-N/`;
//! 4. `latest` is replaced by rename (`latest.tmp` → `latest`);
//! 5. `step-N.old/` is removed.
//!
//! Under ZeRO (`--zero 1|2`) the moments are sharded: each rank writes its piece of them as
//! `optimizer-shard-R-of-N.safetensors` (tensors `m` and `v`, 1-D) into the same
//! `step-N.tmp/`, and `optimizer-shards.json` (the manifest: stage, world size, the
//! tensors in flat order and each rank's range of the flat vector) takes the place of
//! `optimizer.safetensors` ([`save_sharded`]). [`load_moment_range`] reads any range of the
//! flat moments from either form, so a run resumes at any world size with or without ZeRO.
//!
//! A process killed at any point leaves either the previous state or a state that
//! [`recover`] (run before every save and by `fusebox train` on start) repairs without
//! loss: a complete `step-N.tmp/` or `step-N.old/` whose `step-N/` is missing or
//! incomplete takes its place, stale ones are removed, and a `latest` that names a
//! missing or incomplete directory is pointed at the newest complete checkpoint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fusebox::{ComputeBackend, Error, Result, Tensor};
use serde_json::Value;

use crate::comm::Communicator;
use crate::config::ModelConfig;
use crate::data_parallel::shard::ShardLayout;
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

/// The points of a save after which a crash is simulated in tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    TmpCreated,
    ModelWritten,
    OptimizerWritten,
    ConfigWritten,
    TrainerWritten,
    OldMovedAside,
    Renamed,
    LatestTmpWritten,
    LatestReplaced,
}

impl Phase {
    #[cfg(test)]
    pub(crate) const ALL: [Phase; 9] = [
        Phase::TmpCreated,
        Phase::ModelWritten,
        Phase::OptimizerWritten,
        Phase::ConfigWritten,
        Phase::TrainerWritten,
        Phase::OldMovedAside,
        Phase::Renamed,
        Phase::LatestTmpWritten,
        Phase::LatestReplaced,
    ];
}

/// Whether `dir` holds a whole checkpoint: `trainer.json` is written last, after the
/// weights, the moments and the config, each by write-then-rename.
pub fn is_complete(dir: &Path) -> bool {
    ["model.safetensors", "config.json", "trainer.json"].iter().all(|f| dir.join(f).is_file())
}

/// Flushes a directory's entries (renames) to disk. Best effort: not every platform can
/// open a directory for syncing, and a kill (as opposed to a power cut) needs no sync.
fn sync_dir(dir: &Path) {
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.sync_all();
    }
}

/// Saves a checkpoint of `model` (and optimizer moments `m`, `v`) as `out/step-{step}`
/// and points `out/latest` at it (see the module docs for the order of the steps).
pub fn save(
    backend: &dyn ComputeBackend,
    out: &Path,
    step: u64,
    model: &Model,
    moments: Option<(&ParamSet, &ParamSet)>,
    trainer: &Value,
) -> Result<PathBuf> {
    save_with(backend, out, step, model, moments, trainer, &mut |_| Ok(()))
}

/// [`save`] calling `after(phase)` after each phase; an error from it stops the save
/// there, as a kill would.
pub(crate) fn save_with(
    backend: &dyn ComputeBackend,
    out: &Path,
    step: u64,
    model: &Model,
    moments: Option<(&ParamSet, &ParamSet)>,
    trainer: &Value,
    after: &mut dyn FnMut(Phase) -> Result<()>,
) -> Result<PathBuf> {
    let contents = Contents {
        specs: &model.net.specs,
        params: &model.net.params,
        moments,
        config: model.config.to_json(),
        extra: Vec::new(),
    };
    save_contents_with(backend, out, step, &contents, trainer, after)
}

/// What a checkpoint directory holds besides `trainer.json`: the weights, the optimizer
/// moments, `config.json`, and further files (a fine-tuning run's `arch.json`, its
/// tokenizer), all written before `trainer.json`.
#[derive(Debug)]
pub struct Contents<'a> {
    /// Names and shapes of `params` (and of the moments).
    pub specs: &'a [ParamSpec],
    /// The tensors of `model.safetensors`.
    pub params: &'a ParamSet,
    /// AdamW's `(m, v)`, written to `optimizer.safetensors`.
    pub moments: Option<(&'a ParamSet, &'a ParamSet)>,
    /// `config.json`.
    pub config: Value,
    /// Other files: `(file name, bytes)`, each written by write-then-rename.
    pub extra: Vec<(String, Vec<u8>)>,
}

/// Saves `contents` as `out/step-{step}` with `trainer` as its `trainer.json`, by the
/// steps of the module docs (the same crash safety as [`save`]).
pub fn save_contents(
    backend: &dyn ComputeBackend,
    out: &Path,
    step: u64,
    contents: &Contents<'_>,
    trainer: &Value,
) -> Result<PathBuf> {
    save_contents_with(backend, out, step, contents, trainer, &mut |_| Ok(()))
}

fn save_contents_with(
    backend: &dyn ComputeBackend,
    out: &Path,
    step: u64,
    contents: &Contents<'_>,
    trainer: &Value,
    after: &mut dyn FnMut(Phase) -> Result<()>,
) -> Result<PathBuf> {
    begin_save(out, step)?;
    after(Phase::TmpCreated)?;
    commit_save(backend, out, step, contents, trainer, after)
}

/// Repairs what an interrupted save left in `out` and makes the empty `step-{step}.tmp/`
/// a save fills (the first step of the module docs).
fn begin_save(out: &Path, step: u64) -> Result<PathBuf> {
    std::fs::create_dir_all(out).map_err(io(out))?;
    // Leftovers of an interrupted save are repaired first, so every `step-M/` is complete.
    recover(out)?;
    let tmp = out.join(format!("step-{step}.tmp"));
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    Ok(tmp)
}

/// Writes `contents` and `trainer` (last) into `step-{step}.tmp/` and puts it in place
/// (the other steps of the module docs).
fn commit_save(
    backend: &dyn ComputeBackend,
    out: &Path,
    step: u64,
    contents: &Contents<'_>,
    trainer: &Value,
    after: &mut dyn FnMut(Phase) -> Result<()>,
) -> Result<PathBuf> {
    let final_dir = out.join(format!("step-{step}"));
    let tmp = out.join(format!("step-{step}.tmp"));
    let old = out.join(format!("step-{step}.old"));
    let meta = BTreeMap::from([("format".to_string(), "fusebox".to_string())]);
    safetensors::write(&tmp.join("model.safetensors"), &named(backend, contents.specs, contents.params, "")?, &meta)?;
    after(Phase::ModelWritten)?;
    if let Some((m, v)) = contents.moments {
        let mut tensors = named(backend, contents.specs, m, "m.")?;
        tensors.extend(named(backend, contents.specs, v, "v.")?);
        safetensors::write(&tmp.join("optimizer.safetensors"), &tensors, &meta)?;
    }
    after(Phase::OptimizerWritten)?;
    for (name, bytes) in &contents.extra {
        let path = tmp.join(name);
        let part = tmp.join(format!("{name}.part"));
        write_synced(&part, bytes)?;
        std::fs::rename(&part, &path).map_err(io(&path))?;
    }
    write_json(&tmp.join("config.json"), &contents.config)?;
    after(Phase::ConfigWritten)?;
    write_json(&tmp.join("trainer.json"), trainer)?;
    sync_dir(&tmp);
    after(Phase::TrainerWritten)?;
    let replacing = final_dir.exists();
    if replacing {
        std::fs::rename(&final_dir, &old).map_err(io(&old))?;
        after(Phase::OldMovedAside)?;
    }
    std::fs::rename(&tmp, &final_dir).map_err(io(&final_dir))?;
    sync_dir(out);
    after(Phase::Renamed)?;
    point_latest(out, &format!("step-{step}"), after)?;
    if replacing {
        std::fs::remove_dir_all(&old).map_err(io(&old))?;
    }
    Ok(final_dir)
}

/// The manifest of a sharded optimizer state.
pub const SHARD_MANIFEST: &str = "optimizer-shards.json";

/// The file of rank `rank`'s piece of the moments, of `world` ranks.
pub fn shard_file(rank: usize, world: usize) -> String {
    format!("optimizer-shard-{rank}-of-{world}.safetensors")
}

/// One rank's piece of AdamW's moments under ZeRO, flat (see the module docs).
#[derive(Debug)]
pub struct MomentShard<'a> {
    /// The ZeRO stage that wrote it (recorded in the manifest).
    pub stage: u8,
    /// The cut of the trained tensors over the ranks.
    pub layout: &'a ShardLayout,
    /// `m` of this rank's range of the flat vector.
    pub m: &'a [f32],
    /// `v` of the same range.
    pub v: &'a [f32],
}

/// Saves a checkpoint whose moments are sharded, on every rank of `comm` together
/// (collective): rank 0 prepares `step-{step}.tmp/`, every rank writes its
/// `optimizer-shard-R-of-N.safetensors` into it (write-then-rename), then rank 0 writes
/// the weights, the manifest, the config and `trainer.json` and puts the directory in
/// place, with the crash safety of [`save`]. `contents.moments` must be `None`. The
/// directory must be one every rank can write (a shared filesystem across hosts).
pub fn save_sharded(
    backend: &dyn ComputeBackend,
    comm: &dyn Communicator,
    out: &Path,
    step: u64,
    contents: Contents<'_>,
    trainer: &Value,
    shard: &MomentShard<'_>,
) -> Result<PathBuf> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let mine = shard.layout.range(rank);
    if shard.layout.world() != world || shard.m.len() != mine.len() || shard.v.len() != mine.len() {
        return Err(Error::shape(
            "save_sharded",
            "moment shard",
            format!("{} values for rank {rank} of {world}", mine.len()),
            format!("{} and {} of a cut over {} ranks", shard.m.len(), shard.v.len(), shard.layout.world()),
        ));
    }
    if rank == 0 {
        begin_save(out, step)?;
    }
    comm.barrier()?;
    let tmp = out.join(format!("step-{step}.tmp"));
    let meta = BTreeMap::from([("format".to_string(), "fusebox-zero-shard".to_string())]);
    let flat = |x: &[f32]| Tensor::from_slice(x, [x.len()]);
    safetensors::write(
        &tmp.join(shard_file(rank, world)),
        &[("m".to_string(), flat(shard.m)?), ("v".to_string(), flat(shard.v)?)],
        &meta,
    )?;
    comm.barrier()?;
    let final_dir = out.join(format!("step-{step}"));
    if rank == 0 {
        let tensors: Vec<Value> = contents
            .specs
            .iter()
            .enumerate()
            .map(|(i, s)| serde_json::json!([s.name, shard.layout.tensor_range(i).len()]))
            .collect();
        let shards: Vec<Value> = (0..world)
            .map(|r| {
                let range = shard.layout.range(r);
                serde_json::json!({"rank": r, "start": range.start, "end": range.end, "file": shard_file(r, world)})
            })
            .collect();
        let manifest = serde_json::json!({
            "format": "fusebox-zero", "stage": shard.stage, "world_size": world,
            "elements": shard.layout.total(), "tensors": tensors, "shards": shards,
        });
        let text = serde_json::to_vec_pretty(&manifest).map_err(|e| Error::Io(e.to_string()))?;
        let mut contents = contents;
        contents.moments = None;
        contents.extra.push((SHARD_MANIFEST.to_string(), text));
        commit_save(backend, out, step, &contents, trainer, &mut |_| Ok(()))?;
    }
    // Every rank returns once the checkpoint is whole.
    comm.barrier()?;
    Ok(final_dir)
}

/// Replaces `out/latest` by rename with a file naming `name`.
fn point_latest(out: &Path, name: &str, after: &mut dyn FnMut(Phase) -> Result<()>) -> Result<()> {
    let latest_tmp = out.join("latest.tmp");
    write_synced(&latest_tmp, format!("{name}\n").as_bytes())?;
    after(Phase::LatestTmpWritten)?;
    std::fs::rename(&latest_tmp, out.join("latest")).map_err(io(out))?;
    sync_dir(out);
    after(Phase::LatestReplaced)
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(io(path))?;
    f.write_all(bytes).map_err(io(path))?;
    f.sync_all().map_err(io(path))
}

/// The step of a directory name `step-N` followed by `suffix` (`""`, `".tmp"`, `".old"`).
fn step_of(name: &str, suffix: &str) -> Option<u64> {
    name.strip_prefix("step-")?.strip_suffix(suffix)?.parse().ok()
}

/// Repairs what an interrupted save left in the output directory `out` and returns one
/// line per change (empty when there was nothing to do):
///
/// - a `step-N.tmp/` or `step-N.old/` beside a complete `step-N/` is removed;
/// - otherwise a complete one becomes `step-N/` (the `.tmp`, fully written, first) and
///   the rest is removed; an incomplete `step-N/` it replaces holds no whole copy;
/// - `latest.tmp` is removed;
/// - a `latest` that is missing or names a missing or incomplete directory is pointed at
///   the complete `step-N/` with the largest N, if any.
///
/// A directory that does not exist needs no repair.
pub fn recover(out: &Path) -> Result<Vec<String>> {
    let mut notes = Vec::new();
    let entries = match std::fs::read_dir(out) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(notes),
        Err(e) => return Err(io(out)(e)),
    };
    let (mut pending, mut complete) = (std::collections::BTreeSet::new(), Vec::new());
    for entry in entries {
        let name = entry.map_err(io(out))?.file_name().to_string_lossy().into_owned();
        if let Some(n) = step_of(&name, ".tmp").or_else(|| step_of(&name, ".old")) {
            pending.insert(n);
        }
    }
    for n in pending {
        let final_dir = out.join(format!("step-{n}"));
        let tmp = out.join(format!("step-{n}.tmp"));
        let old = out.join(format!("step-{n}.old"));
        if !is_complete(&final_dir) {
            if let Some(source) = [&tmp, &old].into_iter().find(|d| is_complete(d)) {
                if final_dir.exists() {
                    std::fs::remove_dir_all(&final_dir).map_err(io(&final_dir))?;
                }
                std::fs::rename(source, &final_dir).map_err(io(&final_dir))?;
                notes.push(format!(
                    "recovered step-{n} from {} left by an interrupted save",
                    source.file_name().map_or_else(String::new, |s| s.to_string_lossy().into_owned())
                ));
            }
        }
        for stale in [&tmp, &old] {
            if stale.exists() {
                std::fs::remove_dir_all(stale).map_err(io(stale))?;
                notes.push(format!("removed {} left by an interrupted save", stale.display()));
            }
        }
    }
    let latest_tmp = out.join("latest.tmp");
    if latest_tmp.exists() {
        std::fs::remove_file(&latest_tmp).map_err(io(&latest_tmp))?;
    }
    for entry in std::fs::read_dir(out).map_err(io(out))? {
        let name = entry.map_err(io(out))?.file_name().to_string_lossy().into_owned();
        if let Some(n) = step_of(&name, "") {
            if is_complete(&out.join(&name)) {
                complete.push(n);
            }
        }
    }
    let latest = out.join("latest");
    let named = crate::files::read_text(&latest, "latest", 4096).ok().map(|s| s.trim().to_string());
    let named_ok =
        named.as_ref().is_some_and(|n| !n.is_empty() && !n.contains(['/', '\\']) && is_complete(&out.join(n)));
    if !named_ok {
        if let Some(n) = complete.iter().max() {
            let target = format!("step-{n}");
            point_latest(out, &target, &mut |_| Ok(()))?;
            notes.push(match named {
                Some(old) => {
                    format!("'latest' named '{old}', which is not a complete checkpoint; it now names {target}")
                }
                None => format!("'latest' was missing; it now names {target}"),
            });
        }
    }
    sync_dir(out);
    Ok(notes)
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v).map_err(|e| Error::Io(e.to_string()))?;
    let tmp = path.with_extension("json.tmp");
    // Synced before the rename, as the weights are, so a power cut cannot leave an empty file
    // under the final name.
    write_synced(&tmp, text.as_bytes())?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// A checkpoint's JSON file: a regular file (never a FIFO or a device) of at most 64 MiB.
fn read_json(path: &Path) -> Result<Value> {
    crate::files::read_json(path, "checkpoint JSON", 64 << 20)
}

/// The checkpoint directory `path` names: a `step-N` directory itself, or an output
/// directory whose `latest` file names one.
pub fn resolve(path: &Path) -> Result<PathBuf> {
    if path.join("model.safetensors").exists() {
        return Ok(path.to_path_buf());
    }
    let latest = path.join("latest");
    if latest.exists() {
        let name = crate::files::read_text(&latest, "latest", 4096)?;
        let dir = path.join(name.trim());
        if is_complete(&dir) {
            return Ok(dir);
        }
        return Err(Error::Io(format!(
            "{}: 'latest' names {}, which is not a complete checkpoint (model.safetensors, config.json and \
             trainer.json); `fusebox train --resume {}` repairs what an interrupted save left",
            path.display(),
            dir.display(),
            path.display()
        )));
    }
    if !path.exists() {
        return Err(Error::Io(format!("{}: no such checkpoint directory", path.display())));
    }
    Err(Error::Io(format!("{}: not a checkpoint (no model.safetensors, no 'latest' file)", path.display())))
}

pub(crate) fn load_set(
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
    let file = dir.join("model.safetensors");
    // The config's parameter count is checked against the file before any layout is
    // built from it: a corrupt config must not make us allocate for a trillion layers.
    let file_bytes = std::fs::metadata(&file).map_err(io(&file))?.len();
    match config.param_count() {
        Some(n) if n.saturating_mul(4) <= file_bytes => {}
        n => {
            return Err(Error::Io(format!(
                "{}: config.json says {} f32 parameters, but model.safetensors holds only {file_bytes} bytes",
                dir.display(),
                n.map_or("more than 2^64".to_string(), |n| n.to_string())
            )))
        }
    }
    let (specs, _) = param_specs(&config);
    let st = SafeTensors::read(&file)?;
    let params = load_set(backend, &st, &specs, "", &file)?;
    let trainer = if dir.join("trainer.json").exists() { read_json(&dir.join("trainer.json"))? } else { Value::Null };
    let model = Model::from_params(backend, config.clone(), params)?;
    Ok((model, Checkpoint { dir, config, trainer }))
}

/// Loads the optimizer moments `(m, v)` of a checkpoint directory, whole or sharded.
pub fn load_moments(backend: &dyn ComputeBackend, dir: &Path, specs: &[ParamSpec]) -> Result<(ParamSet, ParamSet)> {
    if dir.join(SHARD_MANIFEST).exists() {
        let total = specs.iter().map(|s| s.shape.elem_count()).sum();
        let (m, v) = load_moment_range(dir, specs, 0..total)?;
        return Ok((ParamSet::from_values(backend, specs, m)?, ParamSet::from_values(backend, specs, v)?));
    }
    let file = dir.join("optimizer.safetensors");
    let st = SafeTensors::read(&file)?;
    Ok((load_set(backend, &st, specs, "m.", &file)?, load_set(backend, &st, specs, "v.", &file)?))
}

/// AdamW's `(m, v)` of the elements `range` of the trained tensors `specs` flattened in
/// order, read from checkpoint directory `dir`: from the shards its manifest names (those
/// that meet the range only), or from a whole `optimizer.safetensors`. An error when the
/// checkpoint's tensors are not `specs`.
pub fn load_moment_range(
    dir: &Path,
    specs: &[ParamSpec],
    range: std::ops::Range<usize>,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let sizes: Vec<usize> = specs.iter().map(|s| s.shape.elem_count()).collect();
    let (mut m, mut v) = (Vec::with_capacity(range.len()), Vec::with_capacity(range.len()));
    let manifest_path = dir.join(SHARD_MANIFEST);
    if !manifest_path.exists() {
        let file = dir.join("optimizer.safetensors");
        let st = SafeTensors::read(&file)?;
        let whole = ShardLayout::even(&sizes, 1)?;
        if range.end > whole.total() {
            return Err(Error::Io(format!(
                "{}: moments {}..{} of {}",
                file.display(),
                range.start,
                range.end,
                whole.total()
            )));
        }
        for p in whole.pieces(range, usize::MAX) {
            for (prefix, out) in [("m.", &mut m), ("v.", &mut v)] {
                let name = format!("{prefix}{}", specs[p.tensor].name);
                let t =
                    st.tensor(&name).map_err(|_| Error::Io(format!("{}: missing tensor '{name}'", file.display())))?;
                if t.shape() != &specs[p.tensor].shape {
                    return Err(Error::Io(format!(
                        "{}: tensor '{name}' has shape {} but the model's is {}",
                        file.display(),
                        t.shape(),
                        specs[p.tensor].shape
                    )));
                }
                out.extend_from_slice(&t.to_vec_f32()?[p.offset..p.offset + p.len]);
            }
        }
        return Ok((m, v));
    }
    let bad = |what: String| Error::Io(format!("{}: {what}", manifest_path.display()));
    let manifest = read_json(&manifest_path)?;
    let tensors = manifest["tensors"].as_array().ok_or_else(|| bad("no 'tensors' list".into()))?;
    let same = tensors.len() == specs.len()
        && tensors
            .iter()
            .zip(specs.iter().zip(&sizes))
            .all(|(t, (s, &n))| t[0].as_str() == Some(s.name.as_str()) && t[1].as_u64() == Some(n as u64));
    if !same {
        return Err(bad(format!(
            "its tensors (names and sizes) are not the {} trained tensors of this run (the same model and method)",
            specs.len()
        )));
    }
    let shards = manifest["shards"].as_array().ok_or_else(|| bad("no 'shards' list".into()))?;
    let mut ranges = Vec::with_capacity(shards.len());
    let mut files = Vec::with_capacity(shards.len());
    for (r, sh) in shards.iter().enumerate() {
        let field = |k: &str| {
            sh[k].as_u64().and_then(|x| usize::try_from(x).ok()).ok_or_else(|| bad(format!("shard {r}: no '{k}'")))
        };
        ranges.push(field("start")?..field("end")?);
        let file = sh["file"].as_str().ok_or_else(|| bad(format!("shard {r}: no 'file'")))?;
        if file.contains(['/', '\\']) || file.starts_with('.') {
            return Err(bad(format!("shard {r}: file '{file}' is not a name within the checkpoint")));
        }
        files.push(dir.join(file));
    }
    let layout = ShardLayout::from_ranges(&sizes, ranges).map_err(|e| bad(e.to_string()))?;
    if range.end > layout.total() {
        return Err(bad(format!("moments {}..{} asked of {}", range.start, range.end, layout.total())));
    }
    for (r, file) in files.iter().enumerate() {
        let held = layout.range(r);
        let (lo, hi) = (held.start.max(range.start), held.end.min(range.end));
        if lo >= hi {
            continue;
        }
        let st = SafeTensors::read(file)?;
        for (name, out) in [("m", &mut m), ("v", &mut v)] {
            let values =
                st.tensor(name).map_err(|_| Error::Io(format!("{}: missing tensor '{name}'", file.display())))?;
            let values = values.to_vec_f32()?;
            if values.len() != held.len() {
                return Err(Error::Io(format!(
                    "{}: '{name}' holds {} values but the manifest gives rank {r} {}",
                    file.display(),
                    values.len(),
                    held.len()
                )));
            }
            out.extend_from_slice(&values[lo - held.start..hi - held.start]);
        }
    }
    Ok((m, v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Style;
    use fusebox::CpuBackend;
    use serde_json::json;

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fusebox-ckpt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn tiny(b: &CpuBackend, seed: u64) -> (Model, ParamSet, ParamSet) {
        let cfg = ModelConfig { n_layers: 1, d_model: 16, d_ff: 32, ..ModelConfig::tiny(Style::Llama, 12, 8) };
        let model = Model::new(b, cfg, seed).unwrap();
        let m = ParamSet::zeros(b, &model.net.specs).unwrap();
        let v = ParamSet::zeros(b, &model.net.specs).unwrap();
        (model, m, v)
    }

    /// A crash simulated after `phase`: the hook fails there and the save stops.
    fn crash_after(phase: Phase) -> impl FnMut(Phase) -> Result<()> {
        move |p| if p == phase { Err(Error::Io(format!("simulated crash after {p:?}"))) } else { Ok(()) }
    }

    fn entries(out: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    /// After a crash at any phase and a recovery, `latest` names a complete checkpoint
    /// that loads, holds the step its name says, and nothing stale is left.
    fn check_resumable(b: &CpuBackend, out: &Path, allowed: &[u64], phase: Phase) {
        let notes = recover(out).unwrap();
        let dir = resolve(out).unwrap_or_else(|e| panic!("{phase:?}: {e}; left {:?}, notes {notes:?}", entries(out)));
        assert!(is_complete(&dir), "{phase:?}: {}", dir.display());
        let (_, ckpt) = load_model(b, out).unwrap();
        let step = ckpt.trainer["step"].as_u64().unwrap();
        assert!(allowed.contains(&step), "{phase:?}: step {step}, expected one of {allowed:?}");
        assert!(dir.ends_with(format!("step-{step}")), "{phase:?}: {}", dir.display());
        assert!(load_moments(b, &dir, &ckpt_specs(&ckpt)).is_ok(), "{phase:?}");
        let left = entries(out);
        assert!(left.iter().all(|e| !e.ends_with(".tmp") && !e.ends_with(".old")), "{phase:?}: {left:?}");
    }

    fn ckpt_specs(ckpt: &Checkpoint) -> Vec<ParamSpec> {
        param_specs(&ckpt.config).0
    }

    #[test]
    fn a_crash_after_any_phase_of_a_save_leaves_a_resumable_latest() {
        let b = CpuBackend::with_threads(1).unwrap();
        let (model, m, v) = tiny(&b, 1);
        for phase in Phase::ALL {
            // A new step after an earlier one: `latest` names step 1 or step 2.
            let out = temp_dir("phase-next");
            save(&b, &out, 1, &model, Some((&m, &v)), &json!({"step": 1})).unwrap();
            let r = save_with(&b, &out, 2, &model, Some((&m, &v)), &json!({"step": 2}), &mut crash_after(phase));
            // A new step has no earlier copy to move aside: that phase does not occur.
            assert_eq!(r.is_err(), phase != Phase::OldMovedAside, "{phase:?}");
            check_resumable(&b, &out, &[1, 2], phase);
            // The next save after the crash succeeds and is what `latest` names.
            save(&b, &out, 3, &model, Some((&m, &v)), &json!({"step": 3})).unwrap();
            check_resumable(&b, &out, &[3], phase);
            std::fs::remove_dir_all(&out).unwrap();

            // The same step saved again (the last step is also a --save-every step): the
            // first copy is never deleted before the second is whole.
            let out = temp_dir("phase-same");
            save(&b, &out, 2, &model, Some((&m, &v)), &json!({"step": 2, "copy": 1})).unwrap();
            let r =
                save_with(&b, &out, 2, &model, Some((&m, &v)), &json!({"step": 2, "copy": 2}), &mut crash_after(phase));
            assert!(r.is_err(), "{phase:?}");
            check_resumable(&b, &out, &[2], phase);
            std::fs::remove_dir_all(&out).unwrap();

            // The very first save: once the new directory is whole it is what `latest` names.
            let out = temp_dir("phase-first");
            let r = save_with(&b, &out, 1, &model, Some((&m, &v)), &json!({"step": 1}), &mut crash_after(phase));
            assert_eq!(r.is_err(), phase != Phase::OldMovedAside, "{phase:?}");
            if phase >= Phase::TrainerWritten {
                check_resumable(&b, &out, &[1], phase);
            } else {
                recover(&out).unwrap();
                assert!(resolve(&out).is_err(), "{phase:?}: nothing whole was saved");
                assert!(entries(&out).is_empty(), "{phase:?}: {:?}", entries(&out));
            }
            std::fs::remove_dir_all(&out).unwrap();
        }
    }

    #[test]
    fn recover_repairs_a_latest_that_names_a_directory_of_json_files_only() {
        // What the earlier save order left when killed between deleting step-N and
        // renaming step-N.tmp: the whole copy stranded in step-N.tmp.
        let b = CpuBackend::with_threads(1).unwrap();
        let (model, m, v) = tiny(&b, 2);
        let out = temp_dir("legacy");
        save(&b, &out, 4, &model, Some((&m, &v)), &json!({"step": 4})).unwrap();
        std::fs::rename(out.join("step-4"), out.join("step-4.tmp")).unwrap();
        std::fs::create_dir_all(out.join("step-4")).unwrap();
        std::fs::write(out.join("step-4/config.json"), "{}").unwrap();
        assert!(resolve(&out).unwrap_err().to_string().contains("not a complete checkpoint"));
        let notes = recover(&out).unwrap();
        assert!(notes.iter().any(|n| n.contains("recovered step-4 from step-4.tmp")), "{notes:?}");
        check_resumable(&b, &out, &[4], Phase::Renamed);
        // A `latest` naming a missing directory is pointed at the newest complete one.
        std::fs::write(out.join("latest"), "step-9\n").unwrap();
        let notes = recover(&out).unwrap();
        assert!(notes.iter().any(|n| n.contains("now names step-4")), "{notes:?}");
        assert!(recover(&out).unwrap().is_empty(), "a second recovery has nothing to do");
        std::fs::remove_dir_all(&out).unwrap();
    }
}
