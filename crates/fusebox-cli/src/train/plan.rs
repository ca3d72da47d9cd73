//! Where a run writes and what it starts from: the output directory (refusing to write
//! over another run), the checkpoint to resume and the settings — the saved ones with the
//! flags on top — the same for training from scratch and fine-tuning.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fusebox::{Error, Result};
use fusebox_models::checkpoint;
use fusebox_models::comm::Communicator;
use fusebox_models::train::{resume_info, ResumeInfo, TrainConfig};

use super::args::{apply_flags, schedule_changes, TrainArgs};

/// Where a run writes and what it starts from.
pub(crate) struct Plan {
    /// The output directory.
    pub(crate) out: PathBuf,
    /// The settings.
    pub(crate) config: TrainConfig,
    /// The checkpoint to resume.
    pub(crate) resume: Option<ResumeInfo>,
    /// Whether `out` is the directory the resumed checkpoint came from.
    pub(crate) continues: bool,
    /// Whether --overwrite asked to clear what another run left in `out`.
    pub(crate) clear: bool,
}

/// The plan of every rank: rank 0 checks and repairs the output directory first, then the
/// others read it. `defaults`: the settings where neither a checkpoint nor a flag says
/// otherwise; `default_out`: the output directory of a fresh run without --out.
pub(crate) fn plan_ranks(
    args: &TrainArgs,
    defaults: TrainConfig,
    default_out: &str,
    comm: &Arc<dyn Communicator>,
) -> Result<Plan> {
    let (lead, world) = (comm.rank() == 0, comm.world_size());
    if lead {
        let p = plan(args, defaults, PathBuf::from(default_out), true, world)?;
        comm.barrier()?;
        Ok(p)
    } else {
        comm.barrier()?;
        plan(args, defaults, PathBuf::from(default_out), false, world)
    }
}

/// Decides the output directory and the settings, refusing to write over another run.
/// `lead`: whether this process checks and repairs the output directory and says what it
/// resumes; `world`: the ranks.
fn plan(args: &TrainArgs, defaults: TrainConfig, default_out: PathBuf, lead: bool, world: usize) -> Result<Plan> {
    // --eval-only writes nothing: any directory will do.
    let refuse_busy = lead && !args.overwrite && !args.eval_only;
    let Some(src) = &args.resume else {
        let out = args.out.clone().unwrap_or(default_out);
        if refuse_busy && non_empty(&out) {
            return Err(Error::value(
                "train",
                "--out",
                "an empty or new directory for a fresh run (--resume DIR continues a run; --overwrite replaces it)",
                format!("{}, which holds {}", out.display(), listing(&out)),
            ));
        }
        let config = apply_flags(defaults, args);
        return Ok(Plan { out, config, resume: None, continues: false, clear: args.overwrite });
    };
    let run_dir = run_dir_of(src);
    if lead {
        recover_noting(&run_dir)?;
    }
    let info = resume_info(src)?;
    let out = args.out.clone().unwrap_or_else(|| run_dir.clone());
    let continues = same_dir(&out, &run_dir);
    if refuse_busy && !continues && non_empty(&out) {
        return Err(Error::value(
            "train",
            "--out",
            format!("an empty or new directory for a run forked from {} (or --overwrite)", run_dir.display()),
            format!("{}, which holds {}", out.display(), listing(&out)),
        ));
    }
    let clear = !continues && args.overwrite;
    let saved = info.config.clone();
    let mut config = apply_flags(saved.clone().unwrap_or(defaults), args);
    let say = lead && !args.json && !args.eval_only;
    // The global batch (batch × accumulation × ranks) is kept across world sizes unless
    // --accumulation says otherwise, so the run continues on the same data.
    if let (None, Some(saved), Some(w0)) = (args.accumulation, &saved, info.saved.world_size()) {
        let global = saved.accumulation * w0;
        if w0 != world && global % world == 0 {
            config.accumulation = global / world;
            if say {
                println!(
                    "the checkpoint was trained on {w0} rank(s) × accumulation {}: {world} rank(s) continue with \
                     accumulation {} (the same global batch)",
                    saved.accumulation, config.accumulation
                );
            }
        }
    }
    if say {
        match &saved {
            Some(saved) => {
                let changes = schedule_changes(saved, &config);
                if changes.is_empty() {
                    println!(
                        "resuming {} at step {} of {}: keeping the saved settings (lr {}, warmup {}, batch {} × {})",
                        info.dir.display(),
                        info.step,
                        config.steps,
                        config.lr,
                        config.warmup,
                        config.batch,
                        config.accumulation
                    );
                } else {
                    println!(
                        "resuming {} at step {}: overriding the saved settings: {}",
                        info.dir.display(),
                        info.step,
                        changes.join("; ")
                    );
                }
            }
            None => println!(
                "resuming {} at step {}: it holds no saved settings; using the flags and defaults",
                info.dir.display(),
                info.step
            ),
        }
    }
    Ok(Plan { out, config, resume: Some(info), continues, clear })
}

/// Whether `dir` exists and holds any entry.
fn non_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}

/// The names of a few entries of `dir`, for messages.
fn listing(dir: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    let more = names.len().saturating_sub(5);
    names.truncate(5);
    if more > 0 {
        names.push(format!("and {more} more"));
    }
    names.join(", ")
}

/// Removes what a run writes into `out` (checkpoints, `latest`, metrics, plot), for --overwrite.
pub(crate) fn clear_run(out: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(out) else { return Ok(()) };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let ours = name.starts_with("step-")
            || matches!(
                name.as_str(),
                "latest" | "latest.tmp" | "metrics.csv" | "metrics.csv.tmp" | "loss.png" | "loss.tmp.png"
            );
        if !ours {
            continue;
        }
        let r = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        r.map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    }
    Ok(())
}

/// The run directory of a checkpoint path: the path itself when it is an output
/// directory, the parent of a `step-N` directory.
fn run_dir_of(path: &Path) -> PathBuf {
    let step_dir = path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("step-"));
    if step_dir || (path.join("model.safetensors").exists() && !path.join("latest").exists()) {
        if let Some(parent) = path.parent() {
            return if parent.as_os_str().is_empty() { PathBuf::from(".") } else { parent.to_path_buf() };
        }
    }
    path.to_path_buf()
}

/// Whether two paths name the same directory (compared canonically when both exist).
fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Prints repairs of an interrupted save (stderr: they are no result).
pub(crate) fn recover_noting(dir: &Path) -> Result<()> {
    for note in checkpoint::recover(dir)? {
        eprintln!("note: {}: {note}", dir.display());
    }
    Ok(())
}
