//! `CpuBackend`: every operation of the trait, multithreaded on its own threads (a
//! spinning fork-join [`team`] for the kernels' loops, a rayon pool for gemm), with
//! runtime ISA dispatch (see [`simd`]). The trait's default methods call the
//! kernels in these modules, one file per op family.

pub mod activation;
mod affinity;
pub mod attention;
pub mod bf16_gemm;
/// [`spec::check`](crate::spec::check) under the path kernels without a spec file name.
pub(crate) use crate::spec::check;
pub mod conv;
pub mod convert;
pub mod delta;
pub mod elementwise;
pub mod embedding;
pub mod gates;
/// The gemm crate's f32 GEMM on its AVX2 microkernels, for a backend capped at AVX2.
#[cfg(target_arch = "x86_64")]
mod gemm_capped;
pub mod layout;
pub mod loss;
pub mod matmul;
pub mod memory;
pub mod moe;
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::backend::ComputeBackend;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::tensor::{Device, Tensor};

pub use simd::{Isa, IsaGuard};

/// The CPU backend. Owns a fixed number of threads (default: available cores): the
/// caller and `threads − 1` team helpers run the kernels' parallel loops, a rayon pool
/// of `threads` workers runs gemm. Work is split by index, never by who runs it, so
/// results are bit-identical run to run for a fixed thread count.
///
/// Built by [`CpuBackend::builder`] (threads, ISA, pinning, spin time, streaming
/// threshold), or [`CpuBackend::new`] / [`CpuBackend::with_threads`] for the defaults.
/// Every setting is the backend's own: backends built differently run side by side in
/// one process.
#[derive(Debug)]
pub struct CpuBackend {
    /// Runs the flat parallel loops (`pool`'s helpers), started from outside the backend.
    team: team::Team,
    /// Runs gemm, and loops started inside [`CpuBackend::install`]; `None` for one
    /// thread (every loop then runs on the caller, so the backend starts no thread).
    pool: Option<rayon::ThreadPool>,
    threads: usize,
    isa: Isa,
    pinned: bool,
    spin: Duration,
    stream_min_bytes: usize,
    exact_decode: bool,
    /// Loops handed to the rayon pool (`install`); the team counts its own jobs.
    pool_regions: AtomicU64,
}

/// Settings of a [`CpuBackend`], from [`CpuBackend::builder`]; [`build`](Self::build)
/// checks them and starts the threads.
#[derive(Debug, Clone)]
pub struct CpuBackendBuilder {
    threads: Option<usize>,
    isa: Option<Isa>,
    pin_threads: bool,
    spin: Duration,
    stream_min_bytes: Option<usize>,
    exact_decode: bool,
}

impl Default for CpuBackendBuilder {
    fn default() -> Self {
        CpuBackendBuilder {
            threads: None,
            isa: None,
            pin_threads: true,
            spin: team::SPIN,
            stream_min_bytes: None,
            exact_decode: true,
        }
    }
}

impl CpuBackendBuilder {
    /// Worker threads, at least 1 (default: the available cores).
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = Some(threads);
        self
    }

    /// The instruction set our own kernels run with (default: [`Isa::detected`], the
    /// best this CPU has). [`build`](Self::build) refuses one the CPU lacks.
    pub fn isa(mut self, isa: Isa) -> Self {
        self.isa = Some(isa);
        self
    }

    /// Whether each worker is pinned to a CPU of its own when the pool spans the
    /// process's affinity mask one worker per CPU (Linux; default true). Pinning keeps
    /// woken workers from starting stacked on one CPU; see `affinity`.
    pub fn pin_threads(mut self, pin: bool) -> Self {
        self.pin_threads = pin;
        self
    }

    /// How long idle team helpers spin before parking (default [`team::SPIN`]; zero
    /// parks at once, for a process that shares its CPUs with other busy work).
    pub fn spin_time(mut self, spin: Duration) -> Self {
        self.spin = spin;
        self
    }

    /// Fresh outputs of at least this many bytes are written with streaming
    /// (non-temporal) stores, at least 1; `usize::MAX` never streams (default:
    /// [`output::default_stream_min_bytes`], a quarter of the last-level cache).
    pub fn stream_min_bytes(mut self, bytes: usize) -> Self {
        self.stream_min_bytes = Some(bytes);
        self
    }

    /// Whether `quantized_matmul` with few x rows (decoding) multiplies the weight blocks
    /// by x in f32 (`true`, the default), or quantizes x to 8 bits per element once per
    /// call and sums integer products block by block (`false`: faster, within the
    /// activations' rounding of the f32 result, which can change greedy choices; see
    /// `cpu::quant`). Formats without an integer kernel always take the f32 path.
    pub fn exact_decode(mut self, exact: bool) -> Self {
        self.exact_decode = exact;
        self
    }

    /// Checks the settings without starting anything: an error for 0 threads, a
    /// streaming threshold of 0, or an ISA this CPU lacks.
    pub fn check(&self) -> Result<()> {
        const OP: &str = "CpuBackend::builder";
        if self.threads == Some(0) {
            return Err(Error::value(OP, "threads", "at least 1", 0));
        }
        if let Some(isa) = self.isa.filter(|isa| !isa.is_available()) {
            return Err(Error::unsupported(
                OP,
                format!(
                    "instruction set {isa} is not available on this CPU (available: {})",
                    Isa::available().iter().map(|i| i.name()).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        if self.stream_min_bytes == Some(0) {
            return Err(Error::value(OP, "stream_min_bytes", "at least 1 (usize::MAX: never stream)", 0));
        }
        Ok(())
    }

    /// Checks the settings ([`check`](Self::check)) and starts the threads: an error
    /// also when the system refuses to start them.
    pub fn build(self) -> Result<CpuBackend> {
        const OP: &str = "CpuBackend::builder";
        self.check()?;
        let threads = self.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let isa = self.isa.unwrap_or_else(Isa::detected);
        let stream_min_bytes = self.stream_min_bytes.unwrap_or_else(output::default_stream_min_bytes);
        let started =
            |e: &dyn std::fmt::Display| Error::unsupported(OP, format!("could not start {threads} threads: {e}"));
        // Each worker on a CPU of its own (see `affinity`: woken workers otherwise start
        // stacked on one CPU).
        let cpus = if self.pin_threads { affinity::plan(threads) } else { None };
        let team = team::Team::new(threads, cpus.clone(), isa, self.spin).map_err(|e| started(&e))?;
        let pool = if threads == 1 {
            None
        } else {
            let cpus = cpus.clone();
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("fusebox-cpu-{i}"))
                .start_handler(move |i| {
                    simd::hold_isa(isa);
                    if let Some(cpus) = &cpus {
                        affinity::pin_current_thread(cpus[i]);
                    }
                })
                .build()
                .map_err(|e| started(&e))?;
            Some(pool)
        };
        let pinned = cpus.is_some() && threads > 1;
        let exact_decode = self.exact_decode;
        Ok(CpuBackend {
            team,
            pool,
            threads,
            isa,
            pinned,
            spin: self.spin,
            stream_min_bytes,
            exact_decode,
            pool_regions: AtomicU64::new(0),
        })
    }
}

impl CpuBackend {
    /// The settings of a backend, defaults filled in: see [`CpuBackendBuilder`].
    pub fn builder() -> CpuBackendBuilder {
        CpuBackendBuilder::default()
    }

    /// A backend with the default settings: one thread per available core, the best ISA
    /// this CPU has (an error only when the system refuses to start the threads).
    pub fn new() -> Result<Self> {
        Self::builder().build()
    }

    /// A backend with exactly `threads` worker threads and the other settings default
    /// (`CpuBackend::builder().threads(threads).build()`).
    pub fn with_threads(threads: usize) -> Result<Self> {
        Self::builder().threads(threads).build()
    }

    /// One thread, the best ISA: starts no thread, so it cannot fail.
    fn single_threaded() -> Self {
        let (isa, spin) = (Isa::detected(), team::SPIN);
        CpuBackend {
            team: team::Team::solo(isa),
            pool: None,
            threads: 1,
            isa,
            pinned: false,
            spin,
            stream_min_bytes: output::default_stream_min_bytes(),
            exact_decode: true,
            pool_regions: AtomicU64::new(0),
        }
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The instruction set our own kernels run with on this backend.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Whether the workers are pinned to CPUs of their own (see
    /// [`CpuBackendBuilder::pin_threads`]).
    pub fn pins_threads(&self) -> bool {
        self.pinned
    }

    /// How long idle team helpers spin before parking.
    pub fn spin_time(&self) -> Duration {
        self.spin
    }

    /// Fresh outputs of at least this many bytes are written with streaming stores.
    pub fn stream_min_bytes(&self) -> usize {
        self.stream_min_bytes
    }

    /// Whether decoding GEMVs over quantized weights keep x in f32 (see
    /// [`CpuBackendBuilder::exact_decode`]).
    pub fn exact_decode(&self) -> bool {
        self.exact_decode
    }

    /// How many parallel regions (fork-joins: a job of the spinning team, or a call into
    /// the rayon pool) this backend has started since it was built. Every region ends in
    /// a synchronisation of all its threads; `fusebox bench generate` reports the count
    /// per decoded token. Loops small enough to run on the caller alone are not counted.
    pub fn parallel_regions(&self) -> u64 {
        self.team.jobs() + self.pool_regions.load(Ordering::Relaxed)
    }

    /// Holds this backend's ISA on the calling thread while the guard lives. The trait's
    /// methods do this themselves; a caller of the kernels in [`crate::cpu`] directly
    /// holds one around the call so its own thread dispatches like the backend's workers
    /// (without one it runs [`Isa::detected`]).
    pub fn enter(&self) -> IsaGuard {
        IsaGuard::enter(self.isa)
    }

    /// Whether the calling thread is one of this backend's rayon workers.
    pub(crate) fn on_pool_worker(&self) -> bool {
        self.pool.as_ref().is_some_and(|p| p.current_thread_index().is_some())
    }

    /// Runs `f` inside this backend's rayon pool (the team's spinning helpers park first,
    /// leaving the CPUs to the pool's workers); on the calling thread for one thread.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(pool) => {
                self.team.rest();
                self.pool_regions.fetch_add(1, Ordering::Relaxed);
                pool.install(f)
            }
            None => f(),
        }
    }
}

/// The process-wide CPU backend that other backends fall back to.
static DEFAULT_CPU: OnceLock<CpuBackend> = OnceLock::new();
/// The settings [`default_cpu`] is built with, when [`configure_default_cpu`] gave some.
static DEFAULT_SETTINGS: Mutex<Option<CpuBackendBuilder>> = Mutex::new(None);

/// The process-wide CPU backend that other backends fall back to, built at its first use:
/// with the settings [`configure_default_cpu`] gave (default ones otherwise), or, if the
/// system refuses to start that many threads, one thread (which starts none).
pub fn default_cpu() -> &'static CpuBackend {
    DEFAULT_CPU.get_or_init(|| {
        let settings = DEFAULT_SETTINGS.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_default();
        settings.build().or_else(|_| CpuBackend::new()).unwrap_or_else(|_| CpuBackend::single_threaded())
    })
}

/// Sets the settings of [`default_cpu`] (an application's configuration, made once at
/// start): an error when they do not [`check`](CpuBackendBuilder::check), or when the
/// default backend is already built.
pub fn configure_default_cpu(settings: CpuBackendBuilder) -> Result<()> {
    settings.check()?;
    let mut slot = DEFAULT_SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    if DEFAULT_CPU.get().is_some() {
        return Err(Error::unsupported(
            "configure_default_cpu",
            "the default CPU backend is already built; configure it before its first use",
        ));
    }
    *slot = Some(settings);
    Ok(())
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use rayon::prelude::*;

    use super::*;

    /// Every thread that runs a backend's kernels — the caller inside `enter`, the team's
    /// helpers, the rayon workers — dispatches on that backend's ISA, and the caller gets
    /// its own back afterwards; two backends of different ISAs live side by side.
    #[test]
    fn every_thread_of_a_backend_runs_its_isa() {
        let wide = CpuBackend::builder().threads(3).build().unwrap();
        let scalar = CpuBackend::builder().threads(3).isa(Isa::Scalar).build().unwrap();
        for cpu in [&scalar, &wide] {
            let seen = Mutex::new(Vec::new());
            {
                let _isa = cpu.enter();
                assert_eq!(Isa::active(), cpu.isa());
                cpu.for_each_index(64, 1 << 20, |_| {
                    std::thread::sleep(Duration::from_micros(50));
                    seen.lock().unwrap().push(Isa::active());
                });
                cpu.install(|| {
                    (0..64).into_par_iter().for_each(|_| seen.lock().unwrap().push(Isa::active()));
                });
            }
            let seen = seen.into_inner().unwrap();
            assert_eq!(seen.len(), 128);
            assert!(seen.iter().all(|&isa| isa == cpu.isa()), "{:?}: {seen:?}", cpu.isa());
            assert_eq!(Isa::active(), Isa::detected(), "the caller's ISA is restored");
        }
    }

    #[test]
    fn check_refuses_what_build_would() {
        assert!(CpuBackend::builder().threads(0).check().is_err());
        assert!(CpuBackend::builder().stream_min_bytes(0).check().is_err());
        assert!(CpuBackend::builder().threads(2).isa(Isa::Scalar).stream_min_bytes(1).check().is_ok());
        assert!(configure_default_cpu(CpuBackend::builder().threads(0)).is_err());
    }

    #[test]
    fn isas_parse_by_name_and_refuse_others() {
        for isa in Isa::ALL {
            assert_eq!(isa.name().parse::<Isa>().unwrap(), isa);
            assert_eq!(format!(" {} ", isa.name().to_uppercase()).parse::<Isa>().unwrap(), isa);
        }
        let err = "sse9".parse::<Isa>().unwrap_err().to_string();
        assert!(err.contains("sse9") && err.contains("avx2"), "{err}");
        assert!(Isa::Scalar.is_available() && Isa::detected().is_available());
        assert_eq!(Isa::available().last(), Some(&Isa::Scalar));
    }

    /// A one-thread backend starts no thread and runs `install` on the caller.
    #[test]
    fn one_thread_runs_on_the_caller() {
        let cpu = CpuBackend::with_threads(1).unwrap();
        let caller = std::thread::current().id();
        assert_eq!(cpu.install(|| std::thread::current().id()), caller);
        assert_eq!(CpuBackend::single_threaded().threads(), 1);
        assert_eq!(cpu.spin_time(), team::SPIN);
    }
}
