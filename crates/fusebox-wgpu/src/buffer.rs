//! `WgpuBuffer`: a GPU storage buffer behind a device tensor, returned to the
//! backend's pool when the last tensor using it is dropped.

use std::any::Any;
use std::sync::Arc;

use fusebox::{Device, DeviceBuffer, DeviceKind};

use crate::context::Pool;

/// A storage buffer holding a tensor's bytes (the buffer may be larger: size classes).
pub struct WgpuBuffer {
    buffer: Option<wgpu::Buffer>,
    bytes: u64,
    pool: Arc<Pool>,
    adapter: String,
}

impl WgpuBuffer {
    pub(crate) fn new(buffer: wgpu::Buffer, bytes: u64, pool: Arc<Pool>, adapter: String) -> Self {
        WgpuBuffer { buffer: Some(buffer), bytes, pool, adapter }
    }
    /// The wgpu buffer.
    pub fn raw(&self) -> &wgpu::Buffer {
        self.buffer.as_ref().expect("a live WgpuBuffer holds its buffer until dropped")
    }
}

impl std::fmt::Debug for WgpuBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WgpuBuffer({} bytes on {})", self.bytes, self.adapter)
    }
}

impl Drop for WgpuBuffer {
    fn drop(&mut self) {
        if let Some(b) = self.buffer.take() {
            self.pool.give(b);
        }
    }
}

impl DeviceBuffer for WgpuBuffer {
    fn device(&self) -> Device {
        Device { kind: DeviceKind::Gpu, index: 0, name: format!("wgpu:{}", self.adapter), memory_bytes: None }
    }
    fn byte_len(&self) -> usize {
        self.bytes as usize
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
