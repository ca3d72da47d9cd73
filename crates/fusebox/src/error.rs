//! The one error type of fusebox: every public operation returns `Result<T>`.

use std::fmt;

/// Everything that can go wrong in fusebox, with enough context to act on it.
///
/// Operations name themselves (`op`), state what they expected and what came,
/// so a failing call reads like `rms_norm: weight shape: expected [64], got [65]`.
#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// A tensor had the wrong shape for the operation.
    Shape {
        /// The operation that failed.
        op: &'static str,
        /// The argument or property concerned (`weight shape`, `x`, `position`).
        what: String,
        /// What the operation expected.
        expected: String,
        /// What it got.
        got: String,
    },
    /// A tensor had a dtype the operation does not accept.
    DType {
        /// The operation that failed.
        op: &'static str,
        /// The argument or property concerned (`weight shape`, `x`, `position`).
        what: String,
        /// What the operation expected.
        expected: String,
        /// What it got.
        got: String,
    },
    /// A value (an index, a position, a parameter) was out of its valid range.
    Value {
        /// The operation that failed.
        op: &'static str,
        /// The argument or property concerned (`weight shape`, `x`, `position`).
        what: String,
        /// What the operation expected.
        expected: String,
        /// What it got.
        got: String,
    },
    /// A write through `&mut Tensor` was refused because the storage is shared.
    SharedStorage {
        /// The operation that tried to write.
        op: &'static str,
    },
    /// The backend cannot do this (unknown or unavailable backend, missing feature).
    Unsupported {
        /// The operation asked for.
        op: &'static str,
        /// Why it is not available.
        reason: String,
    },
    /// A tensor lives on a device this backend cannot read.
    Device {
        /// The operation that failed.
        op: &'static str,
        /// The device the backend reads.
        expected: String,
        /// The device the tensor lives on.
        got: String,
    },
    /// Input/output failure (files, model loading).
    Io(String),
}

/// Result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A shape mismatch in `op`.
    pub fn shape(
        op: &'static str,
        what: impl Into<String>,
        expected: impl fmt::Display,
        got: impl fmt::Display,
    ) -> Self {
        Error::Shape { op, what: what.into(), expected: expected.to_string(), got: got.to_string() }
    }
    /// A dtype mismatch in `op`.
    pub fn dtype(
        op: &'static str,
        what: impl Into<String>,
        expected: impl fmt::Display,
        got: impl fmt::Display,
    ) -> Self {
        Error::DType { op, what: what.into(), expected: expected.to_string(), got: got.to_string() }
    }
    /// An out-of-range value in `op`.
    pub fn value(
        op: &'static str,
        what: impl Into<String>,
        expected: impl fmt::Display,
        got: impl fmt::Display,
    ) -> Self {
        Error::Value { op, what: what.into(), expected: expected.to_string(), got: got.to_string() }
    }
    /// `op` is not available here, and why.
    pub fn unsupported(op: &'static str, reason: impl Into<String>) -> Self {
        Error::Unsupported { op, reason: reason.into() }
    }
    /// The operation that failed, when the error names one.
    pub fn op(&self) -> Option<&'static str> {
        match self {
            Error::Shape { op, .. }
            | Error::DType { op, .. }
            | Error::Value { op, .. }
            | Error::SharedStorage { op }
            | Error::Unsupported { op, .. }
            | Error::Device { op, .. } => Some(op),
            Error::Io(_) => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Shape { op, what, expected, got } => {
                write!(f, "{op}: {what} shape: expected {expected}, got {got}")
            }
            Error::DType { op, what, expected, got } => {
                write!(f, "{op}: {what} dtype: expected {expected}, got {got}")
            }
            Error::Value { op, what, expected, got } => {
                write!(f, "{op}: {what}: expected {expected}, got {got}")
            }
            Error::SharedStorage { op } => write!(
                f,
                "{op}: cannot write in place: the tensor's storage is shared with another handle \
                 (drop the other clones or copy it first)"
            ),
            Error::Unsupported { op, reason } => write!(f, "{op}: unsupported: {reason}"),
            Error::Device { op, expected, got } => {
                write!(f, "{op}: tensor on the wrong device: expected {expected}, got {got}")
            }
            Error::Io(msg) => write!(f, "i/o: {msg}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string())
    }
}
