//! The suite: every family's cases, run against one backend, with a mechanical
//! coverage check over the `Op` enum.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use fusebox::{ComputeBackend, Op};

use crate::case::{catch, Case, CaseKind};
use crate::cases;

/// Ops that take no input a caller could get wrong (pure queries): they need a
/// checking case but no bad-input case.
pub const NO_BAD_INPUT: &[Op] = &[
    Op::Name,
    Op::Device,
    Op::Supports,
    Op::UsesDeviceStorage,
    Op::Synchronize,
    Op::ReleaseResources,
    Op::ReleaseTemporaryResources,
    Op::SupportsCausalAttention,
];

/// The op families, each a module of `cases` and of `reference`.
pub const FAMILIES: &[&str] = &[
    "memory",
    "quant",
    "matmul",
    "attention",
    "activation",
    "norm",
    "softmax",
    "loss",
    "optim",
    "rope",
    "embedding",
    "elementwise",
    "reduce",
    "layout",
    "conv",
    "moe",
    "delta",
];

/// The cases of one family by name, or of every family for `"all"`.
pub fn family_cases<B: ComputeBackend + ?Sized + 'static>(family: &str) -> Option<Vec<Case<B>>> {
    Some(match family {
        "memory" => cases::memory::cases(),
        "quant" => cases::quant::cases(),
        "matmul" => cases::matmul::cases(),
        "attention" => cases::attention::cases(),
        "activation" => cases::activation::cases(),
        "norm" => cases::norm::cases(),
        "softmax" => cases::softmax::cases(),
        "loss" => cases::loss::cases(),
        "optim" => cases::optim::cases(),
        "rope" => cases::rope::cases(),
        "embedding" => cases::embedding::cases(),
        "elementwise" => cases::elementwise::cases(),
        "reduce" => cases::reduce::cases(),
        "layout" => cases::layout::cases(),
        "conv" => cases::conv::cases(),
        "moe" => cases::moe::cases(),
        "delta" => cases::delta::cases(),
        "all" => return Some(FAMILIES.iter().flat_map(|f| family_cases(f).unwrap_or_default()).collect()),
        _ => return None,
    })
}

/// Every case of every op family.
pub fn all_cases<B: ComputeBackend + ?Sized + 'static>() -> Vec<Case<B>> {
    family_cases("all").unwrap_or_default()
}

/// The outcome of running the suite on one backend.
#[derive(Debug, Default)]
pub struct SuiteReport {
    /// The backend's `name()`.
    pub backend: String,
    /// (op, kind) → number of cases run.
    pub counts: BTreeMap<(Op, CaseKind), usize>,
    /// Failing cases: full configuration and message.
    pub failures: Vec<String>,
    /// Ops lacking a checking case or a bad-input case.
    pub coverage_gaps: Vec<String>,
    /// Wall-clock seconds the cases took.
    pub seconds: f64,
}

impl SuiteReport {
    /// Whether every case passed and every op is covered.
    pub fn passed(&self) -> bool {
        self.failures.is_empty() && self.coverage_gaps.is_empty()
    }
    /// Total number of cases run.
    pub fn total(&self) -> usize {
        self.counts.values().sum()
    }
    /// A readable summary: cases per op and kind, failures, coverage gaps.
    pub fn summary(&self) -> String {
        let mut s =
            format!("conformance suite on '{}': {} cases in {:.1}s\n", self.backend, self.total(), self.seconds);
        let mut per_op: BTreeMap<Op, BTreeMap<CaseKind, usize>> = BTreeMap::new();
        for (&(op, kind), &n) in &self.counts {
            *per_op.entry(op).or_default().entry(kind).or_default() += n;
        }
        for (op, kinds) in &per_op {
            let parts: Vec<String> = kinds.iter().map(|(k, n)| format!("{k:?} {n}")).collect();
            s += &format!("  {:<28} {}\n", op.name(), parts.join(", "));
        }
        for g in &self.coverage_gaps {
            s += &format!("COVERAGE GAP: {g}\n");
        }
        for f in &self.failures {
            s += &format!("FAILED: {f}\n");
        }
        s += &format!("{} passed, {} failed\n", self.total() - self.failures.len(), self.failures.len());
        s
    }
}

/// Runs `cases` on `backend`, optionally only those whose name contains `filter`.
pub fn run_cases<B: ComputeBackend + ?Sized + 'static>(
    backend: &B,
    cases: &[Case<B>],
    filter: Option<&str>,
) -> SuiteReport {
    let start = Instant::now();
    let mut report = SuiteReport { backend: backend.name().to_string(), ..Default::default() };
    for case in cases {
        if let Some(f) = filter {
            if !case.name.contains(f) && !case.op.name().contains(f) {
                continue;
            }
        }
        *report.counts.entry((case.op, case.kind)).or_default() += 1;
        let outcome = catch(|| (case.run)(backend)).and_then(|r| r);
        if let Err(msg) = outcome {
            report.failures.push(format!("[{} {:?}] {} :: {}", case.op.name(), case.kind, case.name, msg));
        }
    }
    report.seconds = start.elapsed().as_secs_f64();
    report
}

/// Ops of `Op::ALL` without a checking case, or without a bad-input case (unless exempt).
pub fn coverage_gaps<B: ?Sized>(cases: &[Case<B>]) -> Vec<String> {
    let checked: BTreeSet<Op> = cases.iter().filter(|c| c.kind != CaseKind::BadInput).map(|c| c.op).collect();
    let bad: BTreeSet<Op> = cases.iter().filter(|c| c.kind == CaseKind::BadInput).map(|c| c.op).collect();
    let mut gaps = Vec::new();
    for &op in Op::ALL {
        if !checked.contains(&op) {
            gaps.push(format!("{} has no forward/backward/property case", op.name()));
        }
        if !bad.contains(&op) && !NO_BAD_INPUT.contains(&op) {
            gaps.push(format!("{} has no bad-input case", op.name()));
        }
    }
    gaps
}

/// Runs the whole suite on `backend` and checks coverage.
pub fn run_suite<B: ComputeBackend + ?Sized + 'static>(backend: &B) -> SuiteReport {
    let cases = all_cases::<B>();
    let mut report = run_cases(backend, &cases, None);
    report.coverage_gaps = coverage_gaps(&cases);
    report
}
