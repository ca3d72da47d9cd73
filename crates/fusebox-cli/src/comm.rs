//! The communicator of this process: MPI when an MPI launcher started it (`mpirun -np N`,
//! with the cargo feature `mpi`), else the world of one.

use std::sync::Arc;

use fusebox::{Error, Result};
use fusebox_models::comm::{Communicator, SingleProcess};

/// Environment variables MPI launchers set in the processes they start (Open MPI, PMI and
/// PMIx: MPICH, Intel MPI, Slurm's srun), with the world size where the variable holds it.
const LAUNCHER_VARS: [(&str, bool); 4] =
    [("OMPI_COMM_WORLD_SIZE", true), ("PMI_SIZE", true), ("PMIX_RANK", false), ("PMI_RANK", false)];

/// The world size an MPI launcher announced in the environment; `Some(0)` when a launcher
/// is present but the size is not in a variable we read; `None` without a launcher.
fn launched_world() -> Option<usize> {
    let mut launched = None;
    for (var, holds_size) in LAUNCHER_VARS {
        if let Some(v) = std::env::var_os(var) {
            let size = if holds_size { v.to_str().and_then(|s| s.parse().ok()).unwrap_or(0) } else { 0 };
            launched = Some(launched.unwrap_or(0).max(size));
        }
    }
    launched
}

/// MPI's world when launched by `mpirun`/`srun` (feature `mpi`), else [`SingleProcess`]. An
/// error when a launcher started several processes and this build has no MPI: each would
/// train alone and write the same files.
pub fn from_environment() -> Result<Arc<dyn Communicator>> {
    let launched = launched_world();
    #[cfg(feature = "mpi")]
    if launched.is_some() {
        return Ok(Arc::new(fusebox_models::comm::MpiCommunicator::init()?));
    }
    if let Some(n) = launched.filter(|&n| n != 1) {
        let size = if n == 0 { "several".to_string() } else { n.to_string() };
        return Err(Error::unsupported(
            "mpi",
            format!(
                "started by an MPI launcher ({size} processes) but this fusebox was built without MPI; \
                 rebuild it with `cargo build --release -p fusebox-cli --features mpi` (needs libopenmpi-dev)"
            ),
        ));
    }
    Ok(Arc::new(SingleProcess))
}
