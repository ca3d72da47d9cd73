//! fusebox: one trait, [`ComputeBackend`], holding every tensor operation a
//! transformer needs for inference and training — forward and backward — and
//! [`CpuBackend`], which implements all of them and is the default every other
//! backend falls back to.
//!
//! ```
//! use fusebox::{ComputeBackend, CpuBackend, Tensor};
//! let cpu = CpuBackend::new().unwrap();
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap();
//! let w = Tensor::from_vec(vec![1.0f32, 1.0], [2]).unwrap();
//! let y = cpu.rms_norm(&x, &w, 1e-6).unwrap().output;
//! assert_eq!(y.dims(), &[2, 2]);
//! ```

#![warn(missing_docs)]

pub mod backend;
pub mod cpu;
pub mod dtype;
pub mod error;
pub mod host_cache;
pub mod op;
pub mod rng;
pub mod shape;
pub mod spec;
pub mod tensor;
pub mod types;

pub use backend::{
    available_backends, check_native_ops, create_backend, in_place_on_cpu, ComputeBackend, ToBackend, NON_OP_METHODS,
};
pub use cpu::{default_cpu, CpuBackend, Isa};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use op::Op;
pub use shape::Shape;
pub use tensor::{Device, DeviceBuffer, DeviceKind, Storage, Tensor};
pub use types::*;
