//! The conformance suite on `CpuBackend`: once per ISA path this CPU has (each backend
//! dispatches on its own ISA, so every path runs in this one process), on one thread,
//! and with streaming stores for every output.

use fusebox::{CpuBackend, Isa};

/// Runs the suite on `backend`, failing with the report (and `what`) if any case fails.
fn passes(backend: &CpuBackend, what: &str) {
    let report = fusebox_conformance::run_suite(backend);
    println!("{what}: {}", report.summary());
    assert!(report.passed(), "conformance failures ({what}):\n{}", report.summary());
}

/// One test per ISA path, so a failure names its path and the paths run in parallel.
fn passes_on(isa: Isa) {
    if !isa.is_available() {
        println!("skipped: this CPU has no {isa} (available: {:?})", Isa::available());
        return;
    }
    let backend = CpuBackend::builder().isa(isa).build().unwrap();
    assert_eq!(backend.isa(), isa);
    passes(&backend, &format!("ISA path {isa}"));
}

#[test]
fn cpu_backend_passes_the_conformance_suite_with_avx512() {
    passes_on(Isa::Avx512);
}

#[test]
fn cpu_backend_passes_the_conformance_suite_with_avx2() {
    passes_on(Isa::Avx2);
}

#[test]
fn cpu_backend_passes_the_conformance_suite_with_scalar() {
    passes_on(Isa::Scalar);
}

#[test]
fn single_threaded_cpu_backend_passes_the_conformance_suite() {
    passes(&CpuBackend::with_threads(1).unwrap(), "1 thread");
}

/// Every fresh output streamed (non-temporal stores, see `fusebox::cpu::output`) instead
/// of only those beyond the caches.
#[test]
fn cpu_backend_passes_with_streaming_stores_everywhere() {
    let backend = CpuBackend::builder().stream_min_bytes(1).build().unwrap();
    passes(&backend, "streaming stores");
}

/// Decoding GEMVs over quantized weights with x rounded to 8 bits for integer dot
/// products (the default keeps x in f32; the suite checks each path against its twin).
#[test]
fn cpu_backend_passes_with_integer_decode() {
    assert!(CpuBackend::with_threads(1).unwrap().exact_decode(), "f32 activations by default");
    let backend = CpuBackend::builder().exact_decode(false).build().unwrap();
    assert!(!backend.exact_decode());
    passes(&backend, "integer decode");
}

/// The integer paths capped at AVX2 (`FUSEBOX_ISA=avx2`): the AVX2 decode dots and
/// prefill tile kernel, where the default above takes AVX-512 VNNI's on a CPU with it.
#[test]
fn cpu_backend_passes_with_integer_decode_on_avx2() {
    if !Isa::Avx2.is_available() {
        println!("skipped: this CPU has no avx2 (available: {:?})", Isa::available());
        return;
    }
    let backend = CpuBackend::builder().isa(Isa::Avx2).exact_decode(false).build().unwrap();
    passes(&backend, "integer decode, avx2");
}

/// The builder refuses what it cannot honour, with an error rather than a panic.
#[test]
fn the_builder_refuses_bad_settings() {
    assert!(CpuBackend::builder().threads(0).build().is_err());
    assert!(CpuBackend::builder().stream_min_bytes(0).build().is_err());
    for isa in Isa::ALL {
        let built = CpuBackend::builder().threads(1).isa(isa).build();
        assert_eq!(built.is_ok(), isa.is_available(), "{isa}");
        if let Err(e) = built {
            assert!(e.to_string().contains(isa.name()), "{e}");
        }
    }
}
