//! The GPU context: adapter and device, limits, the buffer pool, the pending command
//! encoder that batches dispatches, compiled pipelines, and the mapping of wgpu
//! errors (caught through error scopes or the uncaptured-error handler) to `Error`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fusebox::{DType, DeviceBuffer, Error, Result, Shape, Tensor};

use crate::buffer::WgpuBuffer;
use crate::builder::{AdapterChoice, WgpuBackendBuilder};

/// Dispatches recorded before the pending encoder is submitted on its own.
const MAX_PENDING_DISPATCHES: u32 = 256;
/// Bytes of freed buffers the pool keeps for reuse.
const POOL_KEEP_BYTES: u64 = 1 << 30;
/// Words of a kernel's parameter block reserved for the element offsets of its tensors.
pub const OFFSET_WORDS: usize = 12;

/// One WGSL kernel: source, entry point, and for each tensor binding whether the
/// kernel writes it (bindings are 1..=n; binding 0 is the parameter block).
#[derive(Debug, Clone, Copy)]
pub struct Kernel {
    pub name: &'static str,
    pub source: &'static str,
    pub entry: &'static str,
    pub writes: &'static [bool],
}

/// A tensor as a kernel sees it: a buffer range bound at an aligned offset, and the
/// element offset (in 4-byte words) of the tensor's first element inside that range.
#[derive(Debug, Clone)]
pub struct Bound {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
    pub word_offset: u32,
}

struct Pending {
    encoder: Option<wgpu::CommandEncoder>,
    dispatches: u32,
}

/// Freed buffers by size, for reuse.
#[derive(Default)]
pub struct Pool {
    free: Mutex<(HashMap<u64, Vec<wgpu::Buffer>>, u64)>,
}

impl Pool {
    fn take(&self, size: u64) -> Option<wgpu::Buffer> {
        let mut g = self.free.lock().ok()?;
        let buf = g.0.get_mut(&size)?.pop()?;
        g.1 -= size;
        Some(buf)
    }
    /// Returns a buffer for reuse (dropped when the pool is full).
    pub fn give(&self, buffer: wgpu::Buffer) {
        if let Ok(mut g) = self.free.lock() {
            let size = buffer.size();
            if g.1 + size <= POOL_KEEP_BYTES {
                g.1 += size;
                g.0.entry(size).or_default().push(buffer);
            }
        }
    }
    fn clear(&self) {
        if let Ok(mut g) = self.free.lock() {
            g.0.clear();
            g.1 = 0;
        }
    }
}

/// The size class a request of `bytes` is served from: multiples of 256 bytes up to
/// 64 KiB, then steps of 1/8 of the next power of two (at most 12.5% waste).
fn size_class(bytes: u64) -> u64 {
    let b = bytes.max(16);
    if b <= 65536 {
        return b.div_ceil(256) * 256;
    }
    let step = b.next_power_of_two() / 8;
    b.div_ceil(step) * step
}

/// A compiled kernel and the layout of its bindings.
type Pipeline = (wgpu::ComputePipeline, wgpu::BindGroupLayout);

pub struct Context {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub features: wgpu::Features,
    pub pool: Arc<Pool>,
    pending: Mutex<Pending>,
    pipelines: Mutex<HashMap<(&'static str, &'static str), Arc<Pipeline>>>,
    modules: Mutex<HashMap<&'static str, wgpu::ShaderModule>>,
    uncaptured: Arc<Mutex<Vec<String>>>,
    /// Native kernel dispatches (and native buffer copies) since creation.
    pub dispatches: AtomicU64,
    /// Ops that fell back to the CPU since creation.
    pub fallbacks: AtomicU64,
    /// Whether each op that falls back to the CPU is named on stderr.
    pub(crate) trace: bool,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Context({} / {:?})", self.info.name, self.info.backend)
    }
}

/// A wgpu instance on every backend this build has, configured by our settings only
/// (not by wgpu's `WGPU_*` environment variables).
fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle())
}

fn gpu_error(op: &'static str, e: impl std::fmt::Display) -> Error {
    Error::unsupported(op, format!("wgpu error: {e}"))
}

impl Context {
    /// The adapters wgpu finds on every backend (Vulkan, Metal, DX12, GL), in its order.
    pub fn adapters() -> Vec<wgpu::Adapter> {
        pollster::block_on(instance().enumerate_adapters(wgpu::Backends::all()))
    }

    /// Opens the adapter `options` choose, with the adapter's own limits.
    pub fn new(options: &WgpuBackendBuilder) -> Result<Context> {
        const OP: &str = "WgpuBackend::builder";
        let adapter = match &options.adapter {
            AdapterChoice::Preferred => pollster::block_on(instance().request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: options.power.to_wgpu(),
                ..Default::default()
            }))
            .map_err(|e| {
                Error::unsupported(
                    OP,
                    format!(
                        "no GPU adapter found (tried Vulkan, Metal and DX12 through wgpu; on Linux install a Vulkan \
                         driver, e.g. Debian's mesa-vulkan-drivers for the llvmpipe software adapter): {e}"
                    ),
                )
            })?,
            choice => {
                let mut all = Context::adapters();
                let found = match choice {
                    AdapterChoice::Index(i) => (*i < all.len()).then_some(*i),
                    AdapterChoice::Name(name) => {
                        let name = name.to_lowercase();
                        all.iter().position(|a| a.get_info().name.to_lowercase().contains(&name))
                    }
                    AdapterChoice::Preferred => None,
                };
                match found {
                    Some(i) => all.swap_remove(i),
                    None => {
                        let names: Vec<String> =
                            all.iter().enumerate().map(|(i, a)| format!("{i}: {}", a.get_info().name)).collect();
                        return Err(Error::value(
                            OP,
                            "adapter",
                            format!("one of [{}]", names.join(", ")),
                            format!("{choice:?}"),
                        ));
                    }
                }
            }
        };
        let info = adapter.get_info();
        let limits = adapter.limits();
        let features = adapter.features() & wgpu::Features::SHADER_F16;
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("fusebox"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| Error::unsupported(OP, format!("adapter '{}' gave no device: {e}", info.name)))?;
        let uncaptured: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        Ok(Context {
            device,
            queue,
            info,
            limits,
            features,
            pool: Arc::default(),
            pending: Mutex::new(Pending { encoder: None, dispatches: 0 }),
            pipelines: Mutex::default(),
            modules: Mutex::default(),
            uncaptured,
            dispatches: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            trace: options.trace,
        })
    }

    /// Runs `f` inside out-of-memory and validation error scopes; a caught error
    /// becomes an `Error` naming `op`.
    pub fn scoped<T>(&self, op: &'static str, f: impl FnOnce() -> T) -> Result<T> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f();
        let v = pollster::block_on(validation.pop());
        let o = pollster::block_on(oom.pop());
        if let Some(e) = o {
            return Err(Error::unsupported(op, format!("out of device memory on '{}': {e}", self.info.name)));
        }
        if let Some(e) = v {
            return Err(gpu_error(op, e));
        }
        Ok(out)
    }

    /// Errors reported outside any scope since the last check.
    fn take_uncaptured(&self, op: &'static str) -> Result<()> {
        let msgs = match self.uncaptured.lock() {
            Ok(mut v) => std::mem::take(&mut *v),
            Err(_) => Vec::new(),
        };
        if msgs.is_empty() {
            Ok(())
        } else {
            Err(gpu_error(op, msgs.join("; ")))
        }
    }

    /// A storage buffer of at least `bytes` bytes (a recycled one when the pool has it).
    pub fn alloc(&self, op: &'static str, bytes: u64) -> Result<WgpuBuffer> {
        let size = size_class(bytes);
        if size > self.limits.max_buffer_size {
            return Err(Error::unsupported(
                op,
                format!(
                    "a tensor of {bytes} bytes exceeds the adapter's max_buffer_size of {} bytes on '{}'",
                    self.limits.max_buffer_size, self.info.name
                ),
            ));
        }
        let buffer = match self.pool.take(size) {
            Some(b) => b,
            None => self.scoped(op, || {
                self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            })?,
        };
        Ok(WgpuBuffer::new(buffer, bytes, self.pool.clone(), self.info.name.clone()))
    }

    /// A device tensor of `shape` and `dtype` with undefined contents.
    pub fn empty(&self, op: &'static str, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        let shape = shape.into();
        let bytes = dtype.storage_bytes(shape.elem_count()) as u64;
        let buf = self.alloc(op, bytes)?;
        Tensor::from_device(Box::new(buf), shape, dtype)
    }

    /// A zero-filled device tensor.
    pub fn zeros(&self, op: &'static str, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        let t = self.empty(op, shape, dtype)?;
        let b = buffer_of(&t)?;
        let size = (b.byte_len() as u64).div_ceil(4) * 4;
        if size > 0 {
            self.record(|enc| enc.clear_buffer(b.raw(), 0, Some(size)));
            self.dispatches.fetch_add(1, Ordering::Relaxed);
        }
        Ok(t)
    }

    /// Zeroes the bytes of a device tensor (4-byte aligned range).
    pub fn zeros_into(&self, op: &'static str, t: &Tensor) -> Result<()> {
        let b = buffer_of(t)?;
        let (off, len) = (t.byte_offset() as u64, t.byte_len() as u64);
        if !off.is_multiple_of(4) || !len.is_multiple_of(4) {
            return Err(Error::unsupported(op, "zeroing a view that is not 4-byte aligned"));
        }
        if len > 0 {
            self.record(|enc| enc.clear_buffer(b.raw(), off, Some(len)));
            self.dispatches.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Records commands into the pending encoder.
    pub fn record(&self, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let enc = p
            .encoder
            .get_or_insert_with(|| self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None }));
        f(enc);
        p.dispatches += 1;
        if p.dispatches >= MAX_PENDING_DISPATCHES {
            if let Some(enc) = p.encoder.take() {
                p.dispatches = 0;
                self.queue.submit([enc.finish()]);
            }
        }
    }

    /// Submits the pending encoder (does not wait).
    pub fn flush(&self, op: &'static str) -> Result<()> {
        let enc = {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.dispatches = 0;
            p.encoder.take()
        };
        if let Some(enc) = enc {
            self.scoped(op, || self.queue.submit([enc.finish()]))?;
        }
        self.take_uncaptured(op)
    }

    /// Submits pending work and waits for the device to finish it.
    pub fn synchronize(&self, op: &'static str) -> Result<()> {
        self.flush(op)?;
        self.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| gpu_error(op, e))?;
        self.take_uncaptured(op)
    }

    /// Binds `t` for a kernel: an aligned range of its buffer and the word offset of its
    /// first element. Errors name the binding limit when the range is too large.
    pub fn bind(&self, op: &'static str, t: &Tensor) -> Result<Bound> {
        let b = buffer_of(t)?;
        let start = t.byte_offset() as u64;
        if !start.is_multiple_of(4) {
            return Err(Error::unsupported(op, "tensor view at an offset that is not a multiple of 4 bytes"));
        }
        let align = self.limits.min_storage_buffer_offset_alignment as u64;
        let offset = start / align * align;
        let end = (start + t.byte_len() as u64).div_ceil(4) * 4;
        let size = (end - offset).max(4).min(b.raw().size() - offset);
        if size > self.limits.max_storage_buffer_binding_size {
            return Err(Error::unsupported(
                op,
                format!(
                    "a tensor of {} bytes exceeds the adapter's max_storage_buffer_binding_size of {} bytes on '{}'",
                    t.byte_len(),
                    self.limits.max_storage_buffer_binding_size,
                    self.info.name
                ),
            ));
        }
        Ok(Bound { buffer: b.raw().clone(), offset, size, word_offset: ((start - offset) / 4) as u32 })
    }

    fn pipeline(&self, op: &'static str, kernel: &Kernel) -> Result<Arc<Pipeline>> {
        if let Some(p) = self.pipelines.lock().ok().and_then(|m| m.get(&(kernel.name, kernel.entry)).cloned()) {
            return Ok(p);
        }
        let module = {
            let mut mods = self.modules.lock().unwrap_or_else(|e| e.into_inner());
            match mods.get(kernel.name) {
                Some(m) => m.clone(),
                None => {
                    let src = crate::kernels::module_source(kernel);
                    let m = self.scoped(op, || {
                        self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
                            label: Some(kernel.name),
                            source: wgpu::ShaderSource::Wgsl(src.into()),
                        })
                    })?;
                    mods.insert(kernel.name, m.clone());
                    m
                }
            }
        };
        let storage = |binding: u32, read_only: bool| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let mut entries = vec![storage(0, true)];
        for (i, &w) in kernel.writes.iter().enumerate() {
            entries.push(storage(i as u32 + 1, !w));
        }
        let made = self.scoped(op, || {
            let layout = self.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(kernel.entry),
                entries: &entries,
            });
            let pl = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(kernel.entry),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
            let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(kernel.entry),
                layout: Some(&pl),
                module: &module,
                entry_point: Some(kernel.entry),
                compilation_options: Default::default(),
                cache: None,
            });
            (pipeline, layout)
        })?;
        let made = Arc::new(made);
        if let Ok(mut m) = self.pipelines.lock() {
            m.insert((kernel.name, kernel.entry), made.clone());
        }
        Ok(made)
    }

    /// Records one dispatch of `kernel` over `groups` workgroups with the tensors
    /// `args` (in binding order) and the parameter words `params` (after the offsets).
    /// Workgroup counts beyond the per-dimension limit spill into the y dimension
    /// (kernels recover the flat index with `flat_group`).
    pub fn dispatch(
        &self,
        op: &'static str,
        kernel: &Kernel,
        args: &[&Tensor],
        params: &[u32],
        groups: u64,
    ) -> Result<()> {
        self.dispatch_3d(op, kernel, args, params, groups, 1)
    }

    /// As `dispatch`, with `z` in the third dimension.
    pub fn dispatch_3d(
        &self,
        op: &'static str,
        kernel: &Kernel,
        args: &[&Tensor],
        params: &[u32],
        groups: u64,
        z: u32,
    ) -> Result<()> {
        if args.len() != kernel.writes.len() || args.len() > OFFSET_WORDS {
            return Err(Error::unsupported(op, format!("kernel {} bound with {} tensors", kernel.entry, args.len())));
        }
        if groups == 0 || z == 0 {
            return Ok(());
        }
        let max = self.limits.max_compute_workgroups_per_dimension as u64;
        let (gx, gy) = if groups <= max { (groups, 1) } else { (max, groups.div_ceil(max)) };
        if gy > max || z as u64 > max {
            return Err(Error::unsupported(
                op,
                format!(
                    "{groups}×{z} workgroups exceed the adapter's max_compute_workgroups_per_dimension of {max} on '{}'",
                    self.info.name
                ),
            ));
        }
        let mut bounds = Vec::with_capacity(args.len());
        for t in args {
            bounds.push(self.bind(op, t)?);
        }
        // A buffer bound for writing cannot also be bound read-only in the same
        // dispatch: such a read-only input is copied to a temporary first.
        let mut temps = Vec::new();
        for i in 0..bounds.len() {
            if kernel.writes[i] {
                continue;
            }
            let aliases = (0..bounds.len()).any(|j| kernel.writes[j] && bounds[j].buffer == bounds[i].buffer);
            if aliases {
                let tmp = self.alloc(op, bounds[i].size)?;
                let (src, off, size) = (bounds[i].buffer.clone(), bounds[i].offset, bounds[i].size);
                self.record(|enc| enc.copy_buffer_to_buffer(&src, off, tmp.raw(), 0, size));
                bounds[i] = Bound { buffer: tmp.raw().clone(), offset: 0, size, word_offset: bounds[i].word_offset };
                temps.push(tmp);
            }
        }
        let mut words = vec![0u32; OFFSET_WORDS];
        for (i, b) in bounds.iter().enumerate() {
            words[i] = b.word_offset;
        }
        words.push(gx as u32);
        words.extend_from_slice(params);
        let bytes: &[u8] = bytemuck::cast_slice(&words);
        let pipe = self.pipeline(op, kernel)?;
        let param_buf = self.scoped(op, || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: bytes.len() as u64,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: true,
            })
        })?;
        {
            let mut view = param_buf.get_mapped_range_mut(..).map_err(|e| gpu_error(op, e))?;
            view.copy_from_slice(bytes);
        }
        param_buf.unmap();
        let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: param_buf.as_entire_binding() }];
        for (i, b) in bounds.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &b.buffer,
                    offset: b.offset,
                    size: wgpu::BufferSize::new(b.size),
                }),
            });
        }
        let bind_group = self.scoped(op, || {
            self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipe.1,
                entries: &entries,
            })
        })?;
        self.record(|enc| {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
            pass.set_pipeline(&pipe.0);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(gx as u32, gy as u32, z);
        });
        self.dispatches.fetch_add(1, Ordering::Relaxed);
        drop(temps);
        Ok(())
    }

    /// Copies `bytes` bytes between buffers inside the pending encoder (4-byte aligned).
    pub fn copy(&self, src: &wgpu::Buffer, src_off: u64, dst: &wgpu::Buffer, dst_off: u64, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.record(|enc| enc.copy_buffer_to_buffer(src, src_off, dst, dst_off, bytes));
        self.dispatches.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads `bytes` bytes at `offset` (both multiples of 4) back to the host, after
    /// all pending work.
    pub fn read(&self, op: &'static str, src: &wgpu::Buffer, offset: u64, bytes: u64) -> Result<Vec<u8>> {
        if bytes == 0 {
            return Ok(Vec::new());
        }
        let staging = self.scoped(op, || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        self.record(|enc| enc.copy_buffer_to_buffer(src, offset, &staging, 0, bytes));
        self.flush(op)?;
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| gpu_error(op, e))?;
        rx.recv()
            .map_err(|e| gpu_error(op, e))?
            .map_err(|e| gpu_error(op, format!("mapping the readback buffer failed: {e}")))?;
        let data = staging.get_mapped_range(..).map_err(|e| gpu_error(op, e))?.to_vec();
        staging.unmap();
        self.take_uncaptured(op)?;
        Ok(data)
    }

    /// Writes host bytes into a buffer at `offset` after all work recorded so far.
    pub fn write(&self, op: &'static str, dst: &wgpu::Buffer, offset: u64, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        // queue.write_buffer lands before the next submission: submit what is
        // recorded first, so earlier reads of a recycled buffer see its old contents.
        self.flush(op)?;
        self.scoped(op, || self.queue.write_buffer(dst, offset, bytes))
    }

    /// Counts an op that ran on the CPU (and names it on stderr when the backend was built
    /// with `trace(true)`).
    pub fn note_fallback(&self, what: &str) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        if self.trace {
            eprintln!("fusebox-wgpu: CPU fallback: {what}");
        }
    }

    /// Drops every pooled buffer and compiled pipeline.
    pub fn release(&self) {
        self.pool.clear();
    }
}

/// The wgpu buffer of a device tensor (an error for host tensors or other devices).
pub fn buffer_of(t: &Tensor) -> Result<&WgpuBuffer> {
    t.device_buffer().and_then(|d| d.as_any().downcast_ref::<WgpuBuffer>()).ok_or_else(|| Error::Device {
        op: "wgpu",
        expected: "a wgpu device tensor".into(),
        got: t.device().name,
    })
}
