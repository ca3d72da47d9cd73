//! `CpuBackend`: every operation of the trait, multithreaded on its own threads (a
//! spinning fork-join [`team`] for the kernels' loops, a rayon pool for gemm), with
//! runtime ISA dispatch (see [`simd`]). The trait's default methods call the
//! kernels in these modules, one file per op family.

pub mod activation;
mod affinity;
pub mod attention;
pub mod check;
pub mod conv;
pub mod convert;
pub mod elementwise;
pub mod embedding;
pub mod layout;
pub mod loss;
pub mod matmul;
pub mod memory;
pub mod norm;
pub mod optim;
pub mod output;
pub mod pool;
pub mod quant;
pub mod reduce;
pub mod rope;
pub mod simd;
pub mod softmax;
#[cfg(target_arch = "x86_64")]
pub mod softmax_x86;
#[cfg(target_arch = "x86_64")]
pub mod stream_x86;
pub mod team;

use std::sync::OnceLock;

use crate::backend::ComputeBackend;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::tensor::{Device, Tensor};

pub use simd::Isa;

/// The CPU backend. Owns a fixed number of threads (default: available cores): the
/// caller and `threads − 1` team helpers run the kernels' parallel loops, a rayon pool
/// of `threads` workers runs gemm. Work is split by index, never by who runs it, so
/// results are bit-identical run to run for a fixed thread count.
#[derive(Debug)]
pub struct CpuBackend {
    /// Runs the flat parallel loops (`pool`'s helpers), started from outside the backend.
    team: team::Team,
    /// Runs gemm, and loops started inside [`CpuBackend::install`].
    pool: rayon::ThreadPool,
    threads: usize,
    isa: Isa,
}

impl CpuBackend {
    /// A backend with one thread per available core (or `FUSEBOX_THREADS` if set).
    pub fn new() -> Self {
        let threads = std::env::var("FUSEBOX_THREADS")
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
        Self::with_threads(threads).expect("a thread pool of the available core count")
    }

    /// A backend with exactly `threads` worker threads, each pinned to a CPU of its own
    /// when the process may use exactly `threads` CPUs (Linux; `FUSEBOX_PIN_THREADS=0`
    /// leaves them unpinned).
    pub fn with_threads(threads: usize) -> Result<Self> {
        if threads == 0 {
            return Err(Error::value("CpuBackend::with_threads", "threads", "at least 1", 0));
        }
        // Each worker on a CPU of its own (see `affinity`: woken workers otherwise start
        // stacked on one CPU).
        let cpus = affinity::plan(threads);
        let team = team::Team::new(threads, cpus.clone())
            .map_err(|e| Error::unsupported("CpuBackend::with_threads", e.to_string()))?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("fusebox-cpu-{i}"))
            .start_handler(move |i| {
                if let Some(cpus) = &cpus {
                    affinity::pin_current_thread(cpus[i]);
                }
            })
            .build()
            .map_err(|e| Error::unsupported("CpuBackend::with_threads", e.to_string()))?;
        Ok(CpuBackend { team, pool, threads, isa: Isa::selected() })
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The instruction set our own kernels use (see [`Isa::selected`]).
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Runs `f` inside this backend's rayon pool (the team's spinning helpers park first,
    /// leaving the CPUs to the pool's workers).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.team.rest();
        self.pool.install(f)
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

/// The process-wide CPU backend that other backends fall back to.
pub fn default_cpu() -> &'static CpuBackend {
    static CPU: OnceLock<CpuBackend> = OnceLock::new();
    CPU.get_or_init(CpuBackend::new)
}

fn host_only(op: &'static str, x: &Tensor) -> Result<Tensor> {
    if x.is_host() {
        Ok(x.clone())
    } else {
        Err(Error::Device { op, expected: "host memory".into(), got: x.device().name })
    }
}

impl ComputeBackend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn device(&self) -> Device {
        Device::cpu()
    }

    fn supports(&self, _op: Op) -> bool {
        true
    }

    fn upload(&self, x: &Tensor) -> Result<Tensor> {
        host_only("upload", x)
    }

    fn to_host(&self, x: &Tensor) -> Result<Tensor> {
        host_only("to_host", x)
    }

    fn cpu(&self) -> &CpuBackend {
        self
    }

    /// Returns the freed host blocks kept for reuse (see `host_cache`) to the allocator.
    fn release_resources(&self) -> Result<()> {
        crate::host_cache::clear();
        Ok(())
    }
}
