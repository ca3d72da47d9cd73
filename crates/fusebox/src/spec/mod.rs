//! One specification per op: the argument rules of an operation, written once and
//! called by every backend before it computes.
//!
//! Each function here takes an op's arguments, checks every shape, dtype and value
//! rule the op has, and returns a small description of the call (sizes, dtype) or the
//! [`Error`](crate::Error) naming the op, the argument, what was expected and what came.
//! `CpuBackend`'s kernels start by calling it and compute from the description; an
//! accelerator backend calls the same function first — an invalid call returns that
//! error, so errors are identical on every backend by construction — and then decides
//! between its native kernel and the CPU fallback by looking at the description (its
//! dtype, a size limit of its kernels), never by re-deriving the rules.
//!
//! Rules that depend on tensor *values* (ids below a table's row count, targets below
//! the vocabulary) are not here: they need the data and are checked where it is read.
//!
//! One file per op family, like `cpu/`.

pub mod attention;
pub mod check;
pub mod conv;
pub mod delta;
pub mod elementwise;
pub mod embedding;
pub mod gates;
pub mod layout;
pub mod matmul;
pub mod memory;
pub mod moe;
pub mod norm;
pub mod optim;
pub mod quant;
pub mod reduce;
pub mod rope;
pub mod softmax;
