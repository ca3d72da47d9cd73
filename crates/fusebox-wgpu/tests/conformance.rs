//! The conformance suite on `WgpuBackend`, counting the cases that ran on the GPU path.
//!
//! Without an adapter the test prints why and passes, unless
//! `FUSEBOX_REQUIRE_GPU_ADAPTER=1` (CI), where it fails.

use std::collections::BTreeMap;

use fusebox::{ComputeBackend, Op};
use fusebox_conformance::suite::{family_cases, FAMILIES};
use fusebox_conformance::{all_cases, coverage_gaps, run_cases, Case, CaseKind};
use fusebox_wgpu::WgpuBackend;

fn backend_or_skip() -> Option<WgpuBackend> {
    match WgpuBackend::new() {
        Ok(b) => Some(b),
        Err(e) => {
            if std::env::var("FUSEBOX_REQUIRE_GPU_ADAPTER").is_ok_and(|v| v == "1") {
                panic!("FUSEBOX_REQUIRE_GPU_ADAPTER=1 but no wgpu adapter: {e}");
            }
            println!("skipped: no wgpu adapter ({e})");
            None
        }
    }
}

#[test]
fn wgpu_backend_passes_the_conformance_suite() {
    let Some(backend) = backend_or_skip() else { return };
    println!("backend: {}  adapter: {}", backend.name(), backend.adapter_info());
    let start = std::time::Instant::now();
    let mut failures = Vec::new();
    // Per op and per family: (cases run, cases that ran on the GPU path).
    let mut per_op: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
    let mut per_family: Vec<(&str, usize, usize)> = Vec::new();
    let mut on_gpu = 0;
    let mut total = 0;
    for &family in FAMILIES {
        let cases: Vec<Case<WgpuBackend>> = family_cases(family).unwrap_or_default();
        let mut fam = (family, 0, 0);
        for case in &cases {
            let before = backend.native_dispatches();
            let report = run_cases(&backend, std::slice::from_ref(case), None);
            let native = backend.native_dispatches() > before;
            failures.extend(report.failures);
            total += 1;
            fam.1 += 1;
            let e = per_op.entry(case.op.name()).or_default();
            e.0 += 1;
            // A bad-input case that ended in the CPU's error did no GPU work, and a
            // twin-vs-finite-differences case runs no backend op: neither counts.
            if native && backend.supports(case.op) && case.kind != CaseKind::TwinGradient {
                on_gpu += 1;
                fam.2 += 1;
                e.1 += 1;
            }
        }
        per_family.push(fam);
    }
    let cases = all_cases::<WgpuBackend>();
    let seconds = start.elapsed().as_secs_f64();
    for (op, (n, g)) in &per_op {
        println!("  {op:<28} {g:>4} of {n:>4} cases on the GPU path");
    }
    // Queries and transfers do no kernel work of their own.
    let no_kernel = [
        Op::Name,
        Op::Device,
        Op::Supports,
        Op::UsesDeviceStorage,
        Op::Upload,
        Op::ToHost,
        Op::SupportsCausalAttention,
    ];
    let missing: Vec<&str> = per_op
        .iter()
        .filter(|(op, (_, g))| {
            *g == 0 && Op::from_name(op).is_some_and(|o| backend.supports(o) && !no_kernel.contains(&o))
        })
        .map(|(op, _)| *op)
        .collect();
    for (family, n, g) in &per_family {
        println!("  family {family:<12} {g:>4} of {n:>4} cases on the GPU path");
    }
    println!("{on_gpu} cases ran on the GPU path (of {total}) in {seconds:.1}s");
    let gaps = coverage_gaps(&cases);
    for f in &failures {
        println!("FAILED: {f}");
    }
    println!("{} passed, {} failed", total - failures.len(), failures.len());
    assert!(gaps.is_empty(), "coverage gaps: {gaps:?}");
    assert!(failures.is_empty(), "{} conformance failures (listed above)", failures.len());
    assert!(missing.is_empty(), "native ops with no case on the GPU path: {missing:?}");
}
