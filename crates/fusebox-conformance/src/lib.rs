//! fusebox-conformance: a plain-loop f64 twin of every fusebox op and of every
//! backward (in [`reference`](mod@reference)), and one suite, generic over any `ComputeBackend`,
//! that compares a backend with the twins, checks the twins' backwards by finite
//! differences, and feeds every op bad input.
//!
//! A new backend passes by instantiating the suite:
//!
//! ```no_run
//! let report = fusebox_conformance::run_suite(&fusebox::CpuBackend::new().unwrap());
//! assert!(report.passed(), "{}", report.summary());
//! ```

#![warn(missing_docs)]

pub mod array;
pub mod case;
pub mod cases;
pub mod reference;
pub mod rng;
pub mod suite;
pub mod tolerance;

pub use array::Array;
pub use case::{Case, CaseKind, GradCase, Input, OpCase};
pub use rng::Rng;
pub use suite::{all_cases, coverage_gaps, run_cases, run_suite, SuiteReport};
pub use tolerance::Tolerance;
