//! `metrics.csv`: one row per step (loss, learning rate, gradient norm, throughput,
//! and the evaluation when there was one), kept across a resume, and the curves of
//! `loss.png`.

use std::io::Write;
use std::path::Path;

use fusebox::{Error, Result};

/// The open `metrics.csv` of a run and the loss curves read from it and added since.
pub(crate) struct Metrics {
    file: std::fs::File,
    /// `(step, training loss)`.
    pub(crate) train: Vec<(u64, f32)>,
    /// `(step, held-out loss)`.
    pub(crate) eval: Vec<(u64, f32)>,
}

const METRICS_HEADER: &str = "step,loss,lr,grad_norm,tokens_per_s,eval_loss,accuracy";

impl Metrics {
    /// Opens `out/metrics.csv` for appending. `keep_until`: the step a resumed run
    /// continues from: rows of later steps (written after that checkpoint by a run that
    /// was then killed, and about to be redone) are dropped first; `None` starts afresh.
    pub(crate) fn open(out: &Path, keep_until: Option<u64>) -> Result<Metrics> {
        let path = out.join("metrics.csv");
        let io = |e: std::io::Error| Error::Io(format!("{}: {e}", path.display()));
        let (mut train, mut eval) = (Vec::new(), Vec::new());
        let mut kept = vec![METRICS_HEADER.to_string()];
        if let (Some(until), Ok(text)) = (keep_until, std::fs::read_to_string(&path)) {
            for line in text.lines().skip(1) {
                let cols: Vec<&str> = line.split(',').collect();
                let Some(step) = cols.first().and_then(|c| c.parse::<u64>().ok()) else { continue };
                if step > until {
                    continue;
                }
                let num = |i: usize| cols.get(i).and_then(|c| c.parse::<f32>().ok());
                if let (Some(loss), Some(_lr)) = (num(1), num(2)) {
                    train.push((step, loss));
                }
                if let Some(e) = num(5) {
                    eval.push((step, e));
                }
                kept.push(line.to_string());
            }
        }
        // Rewritten whole by write-then-rename, so a kill leaves the old or the new file.
        let tmp = out.join("metrics.csv.tmp");
        std::fs::write(&tmp, kept.join("\n") + "\n").map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)?;
        let file = std::fs::OpenOptions::new().append(true).open(&path).map_err(io)?;
        Ok(Metrics { file, train, eval })
    }
    /// Appends one row.
    pub(crate) fn line(&mut self, s: &str) -> Result<()> {
        writeln!(self.file, "{s}").map_err(|e| Error::Io(format!("metrics.csv: {e}")))
    }
}
