//! Writing a backend: `MyBackend` wraps `CpuBackend`, implements `relu` with its own
//! loop, and leaves every other op to the trait's CPU defaults. Then it runs the whole
//! conformance suite on itself — the suite is the test plan of any backend — and exits
//! non-zero on a failure.
//!
//! ```text
//! cargo run --release -p fusebox-conformance --example custom_backend
//! ```
//!
//! An accelerator backend has the same structure: `upload`/`to_host` move tensors to and
//! from its memory (wrap the buffers in a `DeviceBuffer` and build tensors with
//! `Tensor::from_device`), `uses_device_storage` returns true, and each overridden op
//! runs its kernel on device tensors. Its `supports(op)` is true for exactly the ops it
//! overrides: the others pay a round trip through host memory. A host backend like this
//! one answers true for every op (the suite checks it): its CPU defaults run on the
//! tensors where they are, with no copies.

use fusebox::{ComputeBackend, CpuBackend, DType, Device, Error, Op, Result, Tensor};

/// A host backend with a native `relu`; everything else runs on the wrapped CPU backend.
#[derive(Debug)]
struct MyBackend {
    inner: CpuBackend,
}

impl ComputeBackend for MyBackend {
    // The four required methods.
    fn name(&self) -> &str {
        "my-backend"
    }

    fn device(&self) -> Device {
        self.inner.device()
    }

    /// Host memory is this backend's memory: a cheap clone (tensors share storage); a
    /// tensor on another backend's device is an error.
    fn upload(&self, x: &Tensor) -> Result<Tensor> {
        self.inner.upload(x)
    }

    fn to_host(&self, x: &Tensor) -> Result<Tensor> {
        self.inner.to_host(x)
    }

    /// The CPU backend that runs the fallbacks: ours, so its thread count is used.
    fn cpu(&self) -> &CpuBackend {
        &self.inner
    }

    /// Every op runs natively: `relu` is this backend's own code, the others are the CPU
    /// kernels, run in place on host tensors (no fallback copies).
    fn supports(&self, op: Op) -> bool {
        let _ = op;
        true
    }

    /// `max(x, 0)` elementwise, in x's dtype (F32, F16 or BF16; computed in f32).
    ///
    /// # Shapes
    /// any → same.
    fn relu(&self, x: &Tensor) -> Result<Tensor> {
        if !matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) {
            return Err(Error::dtype("relu", "x", "f32, f16 or bf16", x.dtype().name()));
        }
        let values = x.to_vec_f32()?;
        let out: Vec<f32> = values.iter().map(|&v| if v > 0.0 { v } else { 0.0 }).collect();
        Tensor::from_f32_as(&out, x.shape().clone(), x.dtype())
    }
}

fn main() {
    let backend = match CpuBackend::new() {
        Ok(inner) => MyBackend { inner },
        Err(e) => {
            eprintln!("could not start the CPU backend: {e}");
            std::process::exit(1);
        }
    };

    let x = Tensor::from_slice(&[-2.0f32, -0.5, 0.0, 0.5, 2.0], [5]).and_then(|x| backend.relu(&x));
    match x.and_then(|y| y.to_vec_f32()) {
        Ok(y) => println!("relu([-2, -0.5, 0, 0.5, 2]) = {y:?}"),
        Err(e) => {
            eprintln!("relu failed: {e}");
            std::process::exit(1);
        }
    }
    let native = Op::ALL.iter().filter(|&&op| backend.supports(op)).count();
    println!("{}: relu is its own code; {native} of {} ops run natively", backend.name(), Op::ALL.len());

    let report = fusebox_conformance::run_suite(&backend);
    let relu_cases: usize = report.counts.iter().filter(|((op, _), _)| *op == Op::Relu).map(|(_, &n)| n).sum();
    println!(
        "conformance suite on '{}': {} cases ({} of them for relu) in {:.1} s",
        report.backend,
        report.total(),
        relu_cases,
        report.seconds
    );
    if !report.passed() {
        eprintln!("{}", report.summary());
        std::process::exit(1);
    }
    println!("passed");
}
