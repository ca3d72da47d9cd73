//! Shared by the criterion benches: inputs, a short criterion config, and a probe that
//! skips a case whose kernel panics (not written yet) instead of aborting the run.
//! The cases mirror `fusebox bench` (crates/fusebox-cli/src/bench/).

#![allow(dead_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use criterion::Criterion;
use fusebox::{CpuBackend, Tensor};

/// A short config: 10 samples, 2 s each case, so the whole suite fits in minutes on 2 cores.
pub fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args()
}

/// The backend benches run on: every core, the best ISA.
pub fn backend() -> CpuBackend {
    CpuBackend::new().expect("a CPU backend of every core")
}

/// Deterministic values in `[-scale, scale)`.
pub fn random(shape: &[usize], seed: u64, scale: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let data = fusebox::rng::Rng::new(seed).uniform_vec(n, -scale, scale);
    Tensor::from_vec(data, shape.to_vec()).expect("shape matches data")
}

/// Ids in `0..bound`, U32.
pub fn random_ids(n: usize, bound: u32, seed: u64) -> Tensor {
    let mut rng = fusebox::rng::Rng::new(seed);
    let ids: Vec<u32> = (0..n).map(|_| rng.below(bound as usize) as u32).collect();
    Tensor::from_vec(ids, [n]).expect("shape matches data")
}

/// Runs `f` once: its value, or `None` (with a note on stderr) if it panics or errs, so
/// the case is skipped.
pub fn try_once<T, E: std::fmt::Debug>(name: &str, f: impl FnOnce() -> Result<T, E>) -> Option<T> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    match r {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) => {
            eprintln!("skipping {name}: {e:?}");
            None
        }
        Err(_) => {
            eprintln!("skipping {name}: the kernel panicked (not implemented yet?)");
            None
        }
    }
}

/// Runs `f` once; `false` if it panics or errs (see [`try_once`]).
pub fn works<T, E: std::fmt::Debug>(name: &str, f: impl FnOnce() -> Result<T, E>) -> bool {
    try_once(name, f).is_some()
}
