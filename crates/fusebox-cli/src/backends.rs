//! The backend factory of the command line: the core's `create_backend` plus the
//! backends compiled into this binary from other crates (`wgpu`, feature `wgpu`).

use std::sync::Arc;

use fusebox::{create_backend, ComputeBackend, Error, Result};

/// Creates a backend by name: `cpu`, `cpu:N`, `wgpu` (also `vulkan`, `metal`, `dx12`,
/// which pick whatever adapter wgpu finds).
pub fn create(name: &str) -> Result<Arc<dyn ComputeBackend>> {
    let lower = name.trim().to_ascii_lowercase();
    if matches!(lower.as_str(), "wgpu" | "vulkan" | "metal" | "dx12" | "gpu") {
        return create_wgpu();
    }
    create_backend(name).map_err(|e| match e {
        Error::Unsupported { op, reason } if reason.starts_with("unknown backend") => {
            Error::unsupported(op, format!("unknown backend '{name}'; known: {}", available().join(", ")))
        }
        other => other,
    })
}

#[cfg(feature = "wgpu")]
fn create_wgpu() -> Result<Arc<dyn ComputeBackend>> {
    Ok(Arc::new(fusebox_wgpu::WgpuBackend::new()?))
}

#[cfg(not(feature = "wgpu"))]
fn create_wgpu() -> Result<Arc<dyn ComputeBackend>> {
    Err(Error::unsupported("create_backend", "this fusebox was built without the `wgpu` feature"))
}

/// Names of the backends compiled into this binary.
pub fn available() -> Vec<&'static str> {
    let mut v = fusebox::available_backends();
    if cfg!(feature = "wgpu") {
        v.push("wgpu");
    }
    v
}

/// What `fusebox info` says about the wgpu backend: adapter, limits, native ops.
#[cfg(feature = "wgpu")]
pub fn wgpu_details() -> Option<(String, String, Vec<&'static str>)> {
    let b = fusebox_wgpu::WgpuBackend::new().ok()?;
    Some((b.adapter_info(), b.limits_summary(), fusebox_wgpu::WgpuBackend::native_op_names()))
}

#[cfg(not(feature = "wgpu"))]
pub fn wgpu_details() -> Option<(String, String, Vec<&'static str>)> {
    None
}
