//! Runs the conformance cases of one op family (or all) on the CPU backend and prints
//! the report: `cargo run --release -p fusebox-conformance --example family -- norm`.

use fusebox::CpuBackend;
use fusebox_conformance::{coverage_gaps, run_cases, suite};

fn main() {
    let family = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    let filter = std::env::args().nth(2);
    let Some(cases) = suite::family_cases::<CpuBackend>(&family) else {
        eprintln!("unknown family '{family}'; known: {}", suite::FAMILIES.join(", "));
        std::process::exit(2);
    };
    let backend = match CpuBackend::new() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut report = run_cases(&backend, &cases, filter.as_deref());
    if family == "all" {
        report.coverage_gaps = coverage_gaps(&cases);
    }
    println!("{}", report.summary());
    if !report.passed() {
        std::process::exit(1);
    }
}
