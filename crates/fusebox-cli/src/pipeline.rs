//! A pretrained model over the processes `mpirun -np N` started (cargo feature `mpi`):
//! each rank loads only its pipeline stage's blocks ([`fusebox_models::pipeline`]); rank
//! 0 runs the command as one process would, every step passing through the other ranks,
//! which only follow. A plain run is the world of one: the whole model, the same code.

use std::path::Path;
use std::sync::Arc;

use clap::Args;
use fusebox::{ComputeBackend, DType, Error, Result};
use fusebox_models::comm::{Communicator, ReduceOp};
use fusebox_models::pipeline::{self, Pipeline, SplitOptions, StageStats, Wire};
use fusebox_models::pretrained::{self, Pretrained};
use fusebox_models::transformer::Stage;
use fusebox_models::weights::StageSizes;
use fusebox_models::{finetune, open};

/// The flags of a model split over MPI ranks.
#[derive(Args, Clone, Debug, Default)]
pub struct PipelineArgs {
    /// Under mpirun: blocks per rank, comma-separated (`10,14`); default: balanced by the
    /// bytes each rank holds (its weights and KV cache, its resident memory before
    /// loading — rank 0's tokenizer — and its share of the head).
    #[arg(long)]
    pub(crate) layer_split: Option<String>,
    /// Under mpirun: the head's vocabulary rows rank 0 multiplies by (the last rank the
    /// rest; 0: the whole head on the last rank); default: the rows that even out the two.
    #[arg(long, value_name = "ROWS")]
    pub(crate) head_split: Option<usize>,
    /// Under mpirun: the dtype of the hidden state between ranks: f32 (exact: one
    /// process's tokens), f16 or bf16 (half the bytes, rounded).
    #[arg(long, default_value = "f32")]
    pub(crate) wire: String,
}

/// This process's part in running one model.
pub struct Distributed {
    comm: Arc<dyn Communicator>,
    wire: Wire,
    counts: Option<Vec<usize>>,
    head_rows: Option<usize>,
}

impl Distributed {
    /// The world `mpirun` started (or the world of one), with the flags checked.
    pub fn from_environment(args: &PipelineArgs) -> Result<Distributed> {
        let wire = Wire::parse(&args.wire)?;
        let counts = args.layer_split.as_deref().map(pipeline::parse_layer_split).transpose()?;
        let comm = crate::comm::from_environment()?;
        if comm.world_size() == 1 && counts.as_ref().is_some_and(|c| c.len() != 1) {
            return Err(Error::value(
                "--layer-split",
                "counts",
                "one per MPI rank (run under mpirun -np N)",
                format!("{} counts in a single process", counts.as_ref().map_or(0, Vec::len)),
            ));
        }
        if comm.world_size() == 1 && args.head_split.is_some() {
            return Err(Error::value(
                "--head-split",
                "processes",
                "two or more MPI ranks (run under mpirun -np N)",
                "a single process",
            ));
        }
        Ok(Distributed { comm, wire, counts, head_rows: args.head_split })
    }

    /// Whether the model is split over several processes.
    pub fn is_split(&self) -> bool {
        self.comm.world_size() > 1
    }

    /// Whether this process drives the run (rank 0, or the only process).
    pub fn is_lead(&self) -> bool {
        self.comm.rank() == 0
    }

    /// The pretrained model `path` for this process: the whole model, or under mpirun
    /// rank 0's stage with the pipeline attached (the other ranks run
    /// [`follow`](Self::follow) instead). `ctx` positions of `cache` dtype count in the
    /// balance. Each rank prints its blocks and resident memory to stderr.
    pub fn load(&self, b: &dyn ComputeBackend, path: &Path, ctx: Option<usize>, cache: DType) -> Result<Pretrained> {
        if !self.is_split() {
            return open::load(b, path);
        }
        self.check_splittable(path)?;
        let mut model = pretrained::load_gguf_or_hf_stage(b, path, &self.chooser(ctx, cache))?;
        self.report(model.network.stage());
        if self.is_lead() {
            model.pipeline = Some(Arc::new(Pipeline::new(self.comm.clone(), self.wire)?));
        }
        Ok(model)
    }

    /// On ranks other than 0: loads this rank's stage of `path` — its blocks' tensors
    /// only, no tokenizer: this rank never sees text — and follows rank 0's steps (see
    /// [`pipeline::follow`]) with `slots` caches of `cache` dtype, each of
    /// `positions(the model's context length)` positions, until rank 0 ends the run.
    /// `ctx` is what [`load`](Self::load) was given on rank 0 (the same balance).
    pub fn follow(
        &self,
        b: &dyn ComputeBackend,
        path: &Path,
        ctx: Option<usize>,
        cache: DType,
        slots: usize,
        positions: impl Fn(usize) -> usize,
    ) -> Result<()> {
        self.check_splittable(path)?;
        let network = pretrained::load_stage_network(b, path, &self.chooser(ctx, cache))?;
        self.report(network.stage());
        let n = positions(network.arch.context_length);
        let mut kv = (0..slots.max(1)).map(|_| network.new_cache_of(b, n, cache)).collect::<Result<Vec<_>>>()?;
        pipeline::follow(&network, b, self.comm.as_ref(), self.wire, &mut kv)
    }

    /// A fine-tuning checkpoint is not split (its base and adapters are one process's).
    fn check_splittable(&self, path: &Path) -> Result<()> {
        if finetune::is_finetune_checkpoint(path) {
            return Err(Error::unsupported(
                "pipeline",
                format!(
                    "{} is a fine-tuning checkpoint; a model split over MPI ranks is read from a GGUF file or a \
                     Hugging Face directory (export the checkpoint first)",
                    path.display()
                ),
            ));
        }
        Ok(())
    }

    /// This rank's stage: the split balanced over the ranks (or `--layer-split`,
    /// `--head-split`), with `ctx` positions of `cache` dtype counted for each block's KV
    /// cache and each rank's resident memory so far (rank 0's tokenizer) for its own.
    /// Every rank calls it at the same point of loading (one all-reduce).
    fn chooser(&self, ctx: Option<usize>, cache: DType) -> impl Fn(&StageSizes) -> Result<Stage> + '_ {
        let (rank, world) = (self.comm.rank(), self.comm.world_size());
        move |sizes: &StageSizes| -> Result<Stage> {
            let positions = ctx.unwrap_or(2048) as u64;
            let per_value = cache.storage_bytes(1) as u64;
            let kv: Vec<u64> = sizes.kv_per_position.iter().map(|b| b / 4 * per_value * positions).collect();
            // Each rank's resident MiB, summed into every rank's copy (exact in f32).
            let mut resident = vec![0f32; world];
            resident[rank] = (crate::memory::current_rss().unwrap_or(0) >> 20) as f32;
            self.comm.all_reduce(&mut resident, ReduceOp::Sum)?;
            let resident: Vec<u64> = resident.iter().map(|&m| (m as u64) << 20).collect();
            let options = SplitOptions {
                cache_per_layer: &kv,
                resident: &resident,
                counts: self.counts.as_deref(),
                lead_head_rows: self.head_rows,
            };
            let split = pipeline::split_layers(sizes, world, &options)?;
            if rank == 0 {
                eprintln!("[pipeline] {world} ranks, {}", split.describe());
            }
            split.stage(rank)
        }
    }

    /// Prints this rank's blocks, its rows of a split head and its peak resident memory
    /// after loading.
    fn report(&self, s: &Stage) {
        let rss =
            crate::memory::peak_rss().map_or("unknown".to_string(), |b| format!("{:.1} MiB", b as f64 / 1048576.0));
        let head = match &s.head_rows {
            Some(r) if !r.is_empty() => format!(", head rows {}..{}", r.start, r.end),
            _ if s.is_last() && s.head_rows.is_none() => ", the head".to_string(),
            _ => String::new(),
        };
        eprintln!(
            "[pipeline] rank {}: blocks {}..{} of {}{head}, peak resident {rss} after loading",
            self.comm.rank(),
            s.layers.start,
            s.layers.end,
            s.n_layers
        );
    }

    /// Ends the other ranks' loops (rank 0 of a split model); every stage's counters.
    pub fn finish(&self, model: &Pretrained) -> Result<Option<Vec<StageStats>>> {
        match &model.pipeline {
            Some(p) => p.finish().map(Some),
            None => Ok(None),
        }
    }

    /// Runs `work` on this process; an error on a rank of a split model ends every rank
    /// (MPI_Abort) with the error and this rank's number, so no rank waits for a peer
    /// that will not answer.
    pub fn run(&self, work: impl FnOnce() -> Result<()>) -> Result<()> {
        let result = work();
        if let (Err(e), true) = (&result, self.is_split()) {
            self.comm.abort(1, &format!("error: {e}"));
        }
        result
    }
}

/// `[pipeline]` lines describing a run's stages: steps, compute seconds, bytes sent,
/// and the per-hop latency rank 0's waits leave once the other stages' compute is taken
/// out (one step in flight at a time: `generate`, `chat`, `bench generate`).
pub fn describe(stats: &[StageStats]) -> Vec<String> {
    let mut lines = describe_ranks(stats);
    if let Some(hop) = hop_latency(stats) {
        lines.push(format!("[pipeline] per hop: {:.1} µs ({} hops per step)", hop * 1e6, stats.len()));
    }
    lines
}

/// One `[pipeline]` line per rank: steps, compute seconds, bytes sent, peak resident
/// memory (a server's batches overlap, so no hop latency is derived from its waits).
pub fn describe_ranks(stats: &[StageStats]) -> Vec<String> {
    stats
        .iter()
        .map(|s| {
            format!(
                "[pipeline] rank {}: {} steps, {:.3} s compute, {:.2} MB sent, peak resident {:.1} MiB",
                s.rank,
                s.steps,
                s.compute_seconds,
                s.bytes_sent as f64 / 1e6,
                s.peak_resident_bytes as f64 / 1048576.0
            )
        })
        .collect()
}

/// Seconds per hop: what rank 0 waited per step beyond the other stages' compute,
/// over the `N` messages a step makes (rank 0 → 1 → … → N−1 → 0).
pub fn hop_latency(stats: &[StageStats]) -> Option<f64> {
    let lead = stats.first()?;
    if lead.steps == 0 || stats.len() < 2 {
        return None;
    }
    let others: f64 = stats[1..].iter().map(|s| s.compute_seconds).sum();
    Some(((lead.wait_seconds - others) / lead.steps as f64 / stats.len() as f64).max(0.0))
}

/// A run's stages as JSON: each rank's counters and the per-hop latency.
pub fn to_json(stats: &[StageStats]) -> serde_json::Value {
    let ranks: Vec<serde_json::Value> = stats
        .iter()
        .map(|s| {
            serde_json::json!({"rank": s.rank, "steps": s.steps, "compute_seconds": s.compute_seconds,
                               "wait_seconds": s.wait_seconds, "bytes_sent": s.bytes_sent,
                               "peak_resident_bytes": s.peak_resident_bytes})
        })
        .collect();
    serde_json::json!({"ranks": ranks, "hop_latency_us": hop_latency(stats).map(|h| h * 1e6)})
}
