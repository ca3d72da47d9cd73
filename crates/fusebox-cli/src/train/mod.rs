//! `fusebox train`: a model from scratch (the built-in addition task, or `--data FILE`),
//! or fine-tuning a pretrained one (`--init MODEL`, every parameter or LoRA adapters);
//! `--resume` of either. Both build a trainer of the one engine and hand it to the one
//! run loop (`run_loop`); under `mpirun -np N` (feature `mpi`) either runs
//! data-parallel.

mod args;
mod finetune;
mod metrics;
mod plan;
mod run_loop;
mod scratch;

use fusebox::{Error, Result};

pub use self::args::TrainArgs;
pub use self::scratch::preset;

/// Runs `fusebox train` on every rank of the run (one without an MPI launcher). An error
/// on one rank ends every rank (MPI_Abort): the others would wait in their next
/// collective for ever. Rank 0 writes every file; its last checkpoint stays whole (saves
/// are atomic).
pub fn run(args: &TrainArgs) -> Result<()> {
    let fine_tune =
        args.init.is_some() || args.resume.as_deref().is_some_and(fusebox_models::finetune::is_finetune_checkpoint);
    if !fine_tune && (args.eval_only || args.skip_bad_lines) {
        return Err(Error::value(
            "train",
            if args.eval_only { "--eval-only" } else { "--skip-bad-lines" },
            "--init MODEL or --resume of a fine-tuning run (flags of fine-tuning)",
            "a from-scratch run",
        ));
    }
    args::check_flags(args)?;
    let comm = crate::comm::from_environment()?;
    let result = if fine_tune { finetune::run(args, &comm) } else { scratch::run(args, &comm) };
    match result {
        Err(e) if comm.world_size() > 1 => comm.abort(1, &format!("error: {e}")),
        r => r,
    }
}
