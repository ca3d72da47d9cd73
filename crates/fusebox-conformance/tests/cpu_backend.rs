//! The conformance suite on `CpuBackend`, with the ISA path `FUSEBOX_ISA` selects.

use fusebox::CpuBackend;

#[test]
fn cpu_backend_passes_the_conformance_suite() {
    let backend = CpuBackend::new();
    let report = fusebox_conformance::run_suite(&backend);
    println!("ISA path: {}", backend.isa().name());
    println!("{}", report.summary());
    assert!(report.passed(), "conformance failures:\n{}", report.summary());
}

#[test]
fn single_threaded_cpu_backend_passes_the_conformance_suite() {
    let backend = CpuBackend::with_threads(1).unwrap();
    let report = fusebox_conformance::run_suite(&backend);
    assert!(report.passed(), "conformance failures (1 thread):\n{}", report.summary());
}

/// Every fresh output streamed (non-temporal stores, see `fusebox::cpu::output`) instead of
/// only those beyond the caches. The threshold is process-wide, so the other tests may
/// stream too while this one runs; stored values are the same either way.
#[test]
fn cpu_backend_passes_with_streaming_stores_everywhere() {
    fusebox::cpu::output::set_stream_threshold(1);
    let report = fusebox_conformance::run_suite(&CpuBackend::new());
    fusebox::cpu::output::set_stream_threshold(0);
    assert!(report.passed(), "conformance failures (streaming stores):\n{}", report.summary());
}
