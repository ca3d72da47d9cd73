//! `WgpuBackend`: fusebox's GPU backend through wgpu (Vulkan, Metal, DX12).
//!
//! Tensors live in GPU storage buffers (explicit `upload` / `to_host`), recycled by a
//! size-class pool. Dispatches are recorded into one pending command encoder and
//! submitted together when a result is read back, on `synchronize`, or every few
//! hundred dispatches. Kernels compute in f32; F16/BF16 tensors keep 16-bit storage and
//! are widened on the device (`ops/convert.rs`, in place through `ops/half.rs`), results
//! stored in the dtype the CPU backend returns. Ops without a native kernel, or with
//! inputs the kernels do not take (unusual layouts, 16-bit views not on a 4-byte
//! boundary), run on the CPU through the trait's fallback. Each op first validates its
//! arguments with the op's one specification (`fusebox::spec`, where its family has one),
//! so errors match the CPU backend's by construction; inputs of the families without a
//! spec yet that the native path does not recognise go to the CPU, which reports them.
//! `supports(op)` lists the native ops; `native_dispatches` counts the GPU work.
//!
//! Built by [`WgpuBackend::builder`] (which adapter, whether to trace CPU fallbacks), or
//! [`WgpuBackend::new`] for the defaults; nothing in this crate reads the environment.

#![warn(missing_docs)]

#[macro_use]
mod macros;

mod backend;
mod buffer;
mod builder;
mod context;
mod kernels;
mod native_ops;
mod ops;

pub use backend::WgpuBackend;
pub use buffer::WgpuBuffer;
pub use builder::{AdapterChoice, PowerPreference, WgpuBackendBuilder};
