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
