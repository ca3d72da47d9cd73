//! `Tensor`: a shape, a dtype and shared storage that may live on the host or on a device.
//!
//! Clones are cheap (an `Arc`). Writes go through `&mut Tensor` and are refused
//! when another handle could observe them, instead of copying silently:
//!
//! * a tensor made by a constructor owns its storage alone and is writable while it
//!   has no clones and no views;
//! * [`Tensor::partition`] splits one uniquely owned allocation into disjoint views
//!   (parameters and gradients live in a few big buffers); each part is writable
//!   while it has no clones of its own;
//! * [`Tensor::view`] makes a read-only view at an offset: it shares the storage,
//!   so neither it nor its source can be written while both live.

use std::alloc::{self, Layout};
use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::shape::Shape;

/// Alignment of host allocations: one cache line, enough for any SIMD load.
const HOST_ALIGN: usize = 64;

/// Transparent huge pages: the size of one, and the allocation size from which a host
/// buffer is aligned to it and asks for them. A decode step streams every weight once;
/// in 4 KiB pages each page is a TLB miss (a two-level walk in a virtual machine), which
/// cost Gemma 3's 180 MB head GEMV 10.6 ms against 7.7 ms in 2 MiB pages (docs/decode.md).
const HUGE_PAGE: usize = 2 << 20;
const HUGE_FROM: usize = 4 << 20;

/// Asks the kernel to back `[ptr, ptr + bytes)` with transparent huge pages (Linux in
/// `madvise` mode; elsewhere, or when refused, nothing changes). Called before the
/// first write, which is when pages are chosen.
fn advise_huge_pages(ptr: *mut u8, bytes: usize) {
    #[cfg(all(target_os = "linux", not(miri)))]
    // SAFETY: the range is one live allocation of this process; the advice changes how
    // its pages are backed, not its contents.
    unsafe {
        libc::madvise(ptr as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE);
    }
    #[cfg(any(not(target_os = "linux"), miri))]
    let _ = (ptr, bytes);
}

/// A host allocation: 64-byte aligned (zero-initialised, or written before it becomes a
/// tensor: [`UninitHost`]), or a vector taken over as is; or bytes another object owns
/// and keeps alive (a memory-mapped file), never written.
///
/// Hazard: writes go through a shared pointer. Soundness rests on the tensor's
/// write rule (see module docs): a `&mut [T]` is only handed out when no other
/// handle can see the same bytes, and partitions never overlap.
pub struct HostBuffer {
    ptr: NonNull<u8>,
    bytes: usize,
    /// How the bytes were allocated (a `Vec` handed over keeps its own layout).
    layout: Layout,
    /// The owner of bytes this buffer did not allocate (then read-only, not freed here).
    owner: Option<Arc<dyn Any + Send + Sync>>,
}

// SAFETY: the buffer is plain memory; concurrent access is governed by the tensor write rule.
unsafe impl Send for HostBuffer {}
// SAFETY: as above.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    fn zeroed(bytes: usize) -> Result<Self> {
        Self::aligned("Tensor::zeros", bytes, true)
    }

    /// `bytes` of [`HOST_ALIGN`]-aligned memory (from [`HUGE_FROM`] bytes on,
    /// [`HUGE_PAGE`]-aligned and in huge pages where the kernel grants them), zeroed or
    /// left uninitialised.
    fn aligned(op: &'static str, bytes: usize, zeroed: bool) -> Result<Self> {
        let huge = bytes >= HUGE_FROM;
        let layout = Layout::from_size_align(bytes, if huge { HUGE_PAGE } else { HOST_ALIGN })
            .map_err(|_| Error::value(op, "size", "an allocatable number of bytes", bytes))?;
        if bytes == 0 {
            return Ok(HostBuffer { ptr: NonNull::<u64>::dangling().cast(), bytes: 0, layout, owner: None });
        }
        // SAFETY: the layout has non-zero size.
        let raw = unsafe {
            if zeroed && !huge {
                alloc::alloc_zeroed(layout)
            } else {
                alloc::alloc(layout)
            }
        };
        // A refused allocation is an error the caller can report, never an abort: sizes
        // come from user flags and file headers (KV caches, parameter buffers).
        let ptr = NonNull::new(raw).ok_or_else(|| {
            Error::value(op, "allocation", "memory for the tensor", format!("{bytes} bytes refused by the allocator"))
        })?;
        if huge {
            advise_huge_pages(ptr.as_ptr(), bytes);
            if zeroed {
                // SAFETY: `ptr` holds `bytes` writable bytes.
                unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, bytes) };
            }
        }
        Ok(HostBuffer { ptr, bytes, layout, owner: None })
    }

    /// Takes over a vector's allocation without copying.
    fn from_vec<T: Element>(v: Vec<T>) -> Self {
        let mut v = std::mem::ManuallyDrop::new(v);
        let (ptr, len, cap) = (v.as_mut_ptr(), v.len(), v.capacity());
        let layout = Layout::array::<T>(cap).expect("an existing vector's layout is valid");
        if layout.size() == 0 {
            // Nothing was allocated; keep an aligned dangling pointer for empty slices.
            return HostBuffer { ptr: NonNull::<u64>::dangling().cast(), bytes: 0, layout, owner: None };
        }
        // SAFETY: a vector's pointer is non-null when it owns an allocation.
        let ptr = unsafe { NonNull::new_unchecked(ptr as *mut u8) };
        HostBuffer { ptr, bytes: len * std::mem::size_of::<T>(), layout, owner: None }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }
    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if self.owner.is_none() && self.layout.size() != 0 {
            // SAFETY: allocated by the global allocator with exactly this layout
            // (`zeroed`, or the vector taken over in `from_vec`).
            unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
        }
    }
}

/// A fresh host allocation of `len` elements of `T`, `HOST_ALIGN`-aligned and not yet
/// initialised: kernels write their output into [`slots`](UninitHost::slots) and
/// [`assume_init`](UninitHost::assume_init) makes it a tensor, without a zeroing pass.
///
/// Why not a `Vec`: the allocator aligns large blocks to 16 bytes only (glibc puts a
/// 16-byte header before every mapped block), so every 64-byte vector load or store of a
/// row kernel straddles two cache lines. On a Xeon with a 480 MiB L3 (`fusebox bench ops`,
/// 16 MiB tensors in cache, 2 threads, % of copy bandwidth), aligning the ops' outputs and
/// then their inputs too took rms_norm from 75 to 82 and 85, softmax from 75 to 74 and 77,
/// cross-entropy from 67 to 67 and 71.
pub struct UninitHost<T: Element> {
    buf: HostBuffer,
    len: usize,
    _elem: std::marker::PhantomData<T>,
}

impl<T: Element> UninitHost<T> {
    /// Room for `len` elements; `op` names the caller in the error for an impossible size.
    pub fn new(op: &'static str, len: usize) -> Result<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::value(op, "output size", "fewer than isize::MAX bytes", len))?;
        Ok(UninitHost { buf: HostBuffer::aligned(op, bytes, false)?, len, _elem: std::marker::PhantomData })
    }

    /// The element slots, to be written.
    pub fn slots(&mut self) -> &mut [std::mem::MaybeUninit<T>] {
        // SAFETY: the buffer holds `len` elements of `T`, aligned for it (64 bytes), and is
        // exclusively ours; `MaybeUninit` makes no claim on their contents.
        unsafe { std::slice::from_raw_parts_mut(self.buf.ptr.as_ptr().cast(), self.len) }
    }

    /// The tensor of `shape` over these elements.
    ///
    /// # Safety
    /// Every slot must have been written.
    pub unsafe fn assume_init(self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if shape.elem_count() != self.len {
            return Err(Error::shape(
                "UninitHost::assume_init",
                "shape",
                format!("{} elements", self.len),
                format!("{} elements for shape {shape}", shape.elem_count()),
            ));
        }
        Ok(Tensor::from_storage(Storage::Host(self.buf), shape, T::DTYPE))
    }
}

/// Memory owned by a device backend (a GPU buffer, say). Backends downcast through `as_any`.
pub trait DeviceBuffer: Any + Send + Sync + fmt::Debug {
    /// The device this buffer lives on.
    fn device(&self) -> Device;
    /// Size in bytes.
    fn byte_len(&self) -> usize;
    /// For downcasting to the backend's concrete buffer type.
    fn as_any(&self) -> &dyn Any;
}

/// Where a tensor's bytes live.
pub enum Storage {
    /// Host memory.
    Host(HostBuffer),
    /// Memory of a device, owned by its backend.
    Device(Box<dyn DeviceBuffer>),
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Storage::Host(h) => write!(f, "Host({} bytes)", h.bytes),
            Storage::Device(d) => write!(f, "Device({d:?})"),
        }
    }
}

/// What kind of device memory lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// The host CPU.
    Cpu,
    /// A GPU.
    Gpu,
}

/// A device: kind, index among devices of that kind, a name, and its memory if known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// CPU or GPU.
    pub kind: DeviceKind,
    /// Index among devices of this kind.
    pub index: usize,
    /// Human-readable name (the adapter's for a GPU).
    pub name: String,
    /// Memory size in bytes, when known.
    pub memory_bytes: Option<u64>,
}

impl Device {
    /// Host memory.
    pub fn cpu() -> Self {
        Device { kind: DeviceKind::Cpu, index: 0, name: "cpu".into(), memory_bytes: None }
    }
}

/// An n-dimensional array: shape, dtype and (shared) storage; row-major and contiguous.
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    byte_offset: usize,
    shape: Shape,
    dtype: DType,
    /// Set on the parts of a [`Tensor::partition`]: the part is writable while this is unique.
    part_token: Option<Arc<()>>,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({}, {}, {:?}", self.shape, self.dtype, self.storage)?;
        if self.byte_offset != 0 {
            write!(f, " @{}", self.byte_offset)?;
        }
        write!(f, ")")
    }
}

fn check_block_shape(op: &'static str, shape: &Shape, dtype: DType) -> Result<()> {
    let be = dtype.block_elems();
    if be > 1 && !shape.last_dim().is_multiple_of(be) {
        return Err(Error::shape(
            op,
            format!("last dimension for {dtype} blocks"),
            format!("a multiple of {be}"),
            shape,
        ));
    }
    Ok(())
}

impl Tensor {
    /// A zero-filled host tensor.
    pub fn zeros(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        let shape = shape.into();
        check_block_shape("Tensor::zeros", &shape, dtype)?;
        let bytes = shape
            .checked_elem_count()
            .and_then(|n| (n / dtype.block_elems()).checked_mul(dtype.block_bytes()))
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| Error::value("Tensor::zeros", "size", "fewer than isize::MAX bytes", &shape))?;
        Ok(Self::from_storage(Storage::Host(HostBuffer::zeroed(bytes)?), shape, dtype))
    }

    fn from_storage(storage: Storage, shape: Shape, dtype: DType) -> Tensor {
        Tensor { storage: Arc::new(storage), byte_offset: 0, shape, dtype, part_token: None }
    }

    /// A host tensor holding `data` with `shape`, taking over the vector's allocation
    /// (no copy); errors when the lengths disagree. The allocation keeps the allocator's
    /// alignment (16 bytes for large blocks with glibc); [`Tensor::from_slice`] copies into
    /// 64-byte-aligned memory, which the SIMD kernels read faster (see [`UninitHost`]).
    pub fn from_vec<T: Element>(data: Vec<T>, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if data.len() != shape.elem_count() {
            return Err(Error::shape(
                "Tensor::from_vec",
                "data length",
                format!("{} elements for shape {shape}", shape.elem_count()),
                format!("{} elements", data.len()),
            ));
        }
        Ok(Self::from_storage(Storage::Host(HostBuffer::from_vec(data)), shape, T::DTYPE))
    }

    /// A host tensor holding a copy of `data` with `shape`; errors when the lengths disagree.
    pub fn from_slice<T: Element>(data: &[T], shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if data.len() != shape.elem_count() {
            return Err(Error::shape(
                "Tensor::from_slice",
                "data length",
                format!("{} elements for shape {shape}", shape.elem_count()),
                format!("{} elements", data.len()),
            ));
        }
        let mut t = Self::zeros(shape, T::DTYPE)?;
        t.as_mut_slice::<T>()?.copy_from_slice(data);
        Ok(t)
    }

    /// A host tensor from raw storage bytes (block formats, FP8); errors when the size disagrees.
    pub fn from_bytes(bytes: &[u8], shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        let shape = shape.into();
        check_block_shape("Tensor::from_bytes", &shape, dtype)?;
        let need = dtype.storage_bytes(shape.elem_count());
        if bytes.len() != need {
            return Err(Error::shape(
                "Tensor::from_bytes",
                "byte length",
                format!("{need} bytes for {dtype} {shape}"),
                format!("{} bytes", bytes.len()),
            ));
        }
        // Written once, not zeroed first: a model's weights come through here at load.
        let buf = HostBuffer::aligned("Tensor::from_bytes", need, false)?;
        // SAFETY: `buf` is a fresh allocation of `need` bytes, `bytes` holds exactly
        // `need`, and the two cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.ptr.as_ptr(), need) };
        Ok(Tensor::from_storage(Storage::Host(buf), shape, dtype))
    }

    /// A read-only host tensor over `owner`'s bytes `start ..` (a memory-mapped file's
    /// tensor data), without copying them: the tensor keeps `owner` alive and is never
    /// writable. Errors when the range lies outside `owner` or its size disagrees.
    pub fn from_shared_bytes<O: AsRef<[u8]> + Send + Sync + 'static>(
        owner: Arc<O>,
        start: usize,
        shape: impl Into<Shape>,
        dtype: DType,
    ) -> Result<Tensor> {
        const OP: &str = "Tensor::from_shared_bytes";
        let shape = shape.into();
        check_block_shape(OP, &shape, dtype)?;
        let need = dtype.storage_bytes(shape.elem_count());
        let all = (*owner).as_ref();
        let bytes = start.checked_add(need).and_then(|end| all.get(start..end)).ok_or_else(|| {
            Error::shape(
                OP,
                "byte range",
                format!("{need} bytes for {dtype} {shape} from {start}"),
                format!("{} bytes", all.len()),
            )
        })?;
        let ptr = NonNull::new(bytes.as_ptr() as *mut u8).unwrap_or(NonNull::<u64>::dangling().cast());
        let layout = Layout::new::<u8>();
        let owner: Arc<dyn Any + Send + Sync> = owner;
        Ok(Tensor::from_storage(
            Storage::Host(HostBuffer { ptr, bytes: need, layout, owner: Some(owner) }),
            shape,
            dtype,
        ))
    }

    /// A rank-0 f32 tensor.
    pub fn scalar(v: f32) -> Tensor {
        Self::from_slice(&[v], Shape::new(vec![])).expect("a scalar always fits")
    }

    /// A tensor over device memory; used by device backends.
    pub fn from_device(buffer: Box<dyn DeviceBuffer>, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        let shape = shape.into();
        check_block_shape("Tensor::from_device", &shape, dtype)?;
        let need = dtype.storage_bytes(shape.elem_count());
        if buffer.byte_len() < need {
            return Err(Error::shape(
                "Tensor::from_device",
                "device buffer size",
                format!("at least {need} bytes"),
                format!("{} bytes", buffer.byte_len()),
            ));
        }
        Ok(Self::from_storage(Storage::Device(buffer), shape, dtype))
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }
    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Number of logical elements.
    pub fn elem_count(&self) -> usize {
        self.shape.elem_count()
    }
    /// Bytes this tensor's elements take in storage.
    pub fn byte_len(&self) -> usize {
        self.dtype.storage_bytes(self.elem_count())
    }
    /// Offset of the first element in the underlying allocation, in bytes.
    pub fn byte_offset(&self) -> usize {
        self.byte_offset
    }
    /// Whether the elements live in host memory.
    pub fn is_host(&self) -> bool {
        matches!(*self.storage, Storage::Host(_))
    }
    /// The device buffer, when the tensor lives on a device.
    pub fn device_buffer(&self) -> Option<&dyn DeviceBuffer> {
        match &*self.storage {
            Storage::Device(d) => Some(d.as_ref()),
            Storage::Host(_) => None,
        }
    }
    /// The device the tensor lives on.
    pub fn device(&self) -> Device {
        match &*self.storage {
            Storage::Host(_) => Device::cpu(),
            Storage::Device(d) => d.device(),
        }
    }
    /// Whether `self` and `other` share an allocation.
    pub fn shares_storage_with(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// Whether an in-place write through `&mut self` is allowed (see module docs).
    pub fn is_writable(&self) -> bool {
        if matches!(&*self.storage, Storage::Host(h) if h.owner.is_some()) {
            return false; // bytes another object owns (a mapped file)
        }
        match &self.part_token {
            Some(token) => Arc::strong_count(token) == 1,
            None => Arc::strong_count(&self.storage) == 1,
        }
    }

    /// Errors with [`Error::SharedStorage`] naming `op` unless the tensor is writable.
    pub fn ensure_writable(&self, op: &'static str) -> Result<()> {
        if self.is_writable() {
            Ok(())
        } else {
            Err(Error::SharedStorage { op })
        }
    }

    /// The same storage with another shape of equal element count (no copy).
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        crate::spec::layout::reshape(self, &shape)?;
        let mut t = self.clone();
        t.shape = shape;
        Ok(t)
    }

    /// A read-only view of `shape` starting `elem_offset` elements into this tensor.
    /// The view shares storage, so neither it nor `self` is writable while both live.
    pub fn view(&self, elem_offset: usize, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        let be = self.dtype.block_elems();
        if !elem_offset.is_multiple_of(be) {
            return Err(Error::value("Tensor::view", "offset", format!("a multiple of {be}"), elem_offset));
        }
        check_block_shape("Tensor::view", &shape, self.dtype)?;
        if elem_offset + shape.elem_count() > self.elem_count() {
            return Err(Error::shape(
                "Tensor::view",
                "view range",
                format!("within {} elements", self.elem_count()),
                format!("offset {elem_offset} + {shape}"),
            ));
        }
        let mut t = self.clone();
        t.byte_offset += self.dtype.storage_bytes(elem_offset);
        t.shape = shape;
        Ok(t)
    }

    /// Runs `f` on a writable view of `shape` starting `elem_offset` elements into this
    /// writable tensor, to update that window in place (one rank's piece of a parameter,
    /// say). The window carries this tensor's write right while `f` runs and hands it back
    /// after: should `f` keep a copy of the window, this tensor stays read-only while the
    /// copy lives, as with any shared storage.
    pub fn with_window_mut<R>(
        &mut self,
        elem_offset: usize,
        shape: impl Into<Shape>,
        f: impl FnOnce(&mut Tensor) -> Result<R>,
    ) -> Result<R> {
        self.ensure_writable("Tensor::with_window_mut")?;
        let token = self.part_token.take();
        let had_token = token.is_some();
        let mut window = match self.view(elem_offset, shape) {
            Ok(w) => w,
            Err(e) => {
                self.part_token = token;
                return Err(e);
            }
        };
        // A part's own token moves into the window (a whole tensor's window gets a fresh
        // one: the shared storage then keeps the whole tensor read-only meanwhile).
        window.part_token = Some(token.unwrap_or_default());
        let out = f(&mut window);
        let token = window.part_token.take();
        drop(window);
        if had_token {
            self.part_token = token;
        }
        out
    }

    /// Splits a uniquely owned tensor into consecutive disjoint parts of the given
    /// shapes (their element counts must add up to at most this tensor's). Each part
    /// can be written in place while it has no clones; this is how parameters,
    /// gradients and optimizer state live in a few large allocations.
    pub fn partition(self, shapes: &[Shape]) -> Result<Vec<Tensor>> {
        self.ensure_writable("Tensor::partition")?;
        let total: usize = shapes.iter().map(Shape::elem_count).sum();
        if total > self.elem_count() {
            return Err(Error::shape(
                "Tensor::partition",
                "parts",
                format!("at most {} elements in all", self.elem_count()),
                format!("{total} elements"),
            ));
        }
        let mut offset = 0;
        let mut parts = Vec::with_capacity(shapes.len());
        for s in shapes {
            let mut part = self.view(offset, s.clone())?;
            part.part_token = Some(Arc::new(()));
            offset += s.elem_count();
            parts.push(part);
        }
        Ok(parts)
    }

    fn host_buffer(&self, op: &'static str) -> Result<&HostBuffer> {
        match &*self.storage {
            Storage::Host(h) => Ok(h),
            Storage::Device(d) => Err(Error::Device { op, expected: "host memory".into(), got: d.device().name }),
        }
    }

    /// The raw storage bytes of a host tensor.
    pub fn host_bytes(&self) -> Result<&[u8]> {
        let h = self.host_buffer("Tensor::host_bytes")?;
        let len = self.byte_len();
        // SAFETY: offset + len lie inside the allocation (checked when views are made);
        // no `&mut` to these bytes exists while `self` is shared (write rule).
        Ok(unsafe { std::slice::from_raw_parts(h.ptr.as_ptr().add(self.byte_offset), len) })
    }

    /// The raw storage bytes of a writable host tensor.
    pub fn host_bytes_mut(&mut self) -> Result<&mut [u8]> {
        self.ensure_writable("Tensor::host_bytes_mut")?;
        let h = self.host_buffer("Tensor::host_bytes_mut")?;
        let len = self.byte_len();
        // SAFETY: in bounds as above; the write rule guarantees no other handle sees these bytes.
        Ok(unsafe { std::slice::from_raw_parts_mut(h.ptr.as_ptr().add(self.byte_offset), len) })
    }

    fn check_elem<T: Element>(&self, op: &'static str) -> Result<()> {
        if self.dtype != T::DTYPE {
            return Err(Error::dtype(op, "tensor", T::DTYPE, self.dtype));
        }
        Ok(())
    }

    /// The elements of a host tensor of dtype `T`.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.check_elem::<T>("Tensor::as_slice")?;
        let bytes = self.host_bytes()?;
        // SAFETY: our own allocations are 64-byte aligned and a vector taken over keeps the
        // alignment of its element type, which the dtype check makes `T`; offsets are
        // multiples of the element size, so the cast is aligned; the length is exact.
        Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, self.elem_count()) })
    }

    /// The elements of a writable host tensor of dtype `T`.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        self.check_elem::<T>("Tensor::as_mut_slice")?;
        let n = self.elem_count();
        let bytes = self.host_bytes_mut()?;
        // SAFETY: as in `as_slice`, and the bytes are exclusively ours.
        Ok(unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut T, n) })
    }

    /// A copy of the elements of a host tensor of dtype `T`.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        Ok(self.as_slice::<T>()?.to_vec())
    }

    /// The elements of a host F32/F16/BF16 tensor converted to f32.
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        match self.dtype {
            DType::F32 => self.to_vec::<f32>(),
            DType::F16 => Ok(self.as_slice::<half::f16>()?.iter().map(|v| v.to_f32()).collect()),
            DType::BF16 => Ok(self.as_slice::<half::bf16>()?.iter().map(|v| v.to_f32()).collect()),
            other => Err(Error::dtype("Tensor::to_vec_f32", "tensor", "f32, f16 or bf16", other)),
        }
    }

    /// A host tensor of `dtype` (F32, F16 or BF16) from f32 values, rounding to nearest.
    pub fn from_f32_as(data: &[f32], shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        match dtype {
            DType::F32 => Self::from_slice(data, shape),
            DType::F16 => Self::from_vec(data.iter().map(|&v| half::f16::from_f32(v)).collect::<Vec<_>>(), shape),
            DType::BF16 => Self::from_vec(data.iter().map(|&v| half::bf16::from_f32(v)).collect::<Vec<_>>(), shape),
            other => Err(Error::dtype("Tensor::from_f32_as", "target", "f32, f16 or bf16", other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Miri stops the program on an allocation it cannot satisfy instead of returning null
    // as the system allocator does, so this property is only testable natively.
    #[test]
    fn shared_bytes_are_read_in_place_and_never_writable() {
        let owner = Arc::new((0u8..=255).collect::<Vec<u8>>());
        let t = Tensor::from_shared_bytes(Arc::clone(&owner), 64, [2, 32], DType::Q8_0).unwrap();
        assert_eq!(t.host_bytes().unwrap().as_ptr(), owner[64..].as_ptr());
        assert_eq!(t.host_bytes().unwrap().len(), 68);
        assert!(!t.is_writable());
        assert!(t.ensure_writable("test").is_err());
        // Past the owner's end, and a size that is not whole blocks, are errors.
        assert!(Tensor::from_shared_bytes(Arc::clone(&owner), 200, [2, 32], DType::Q8_0).is_err());
        assert!(Tensor::from_shared_bytes(Arc::clone(&owner), usize::MAX, [1, 32], DType::Q8_0).is_err());
        assert!(Tensor::from_shared_bytes(owner, 0, [1, 31], DType::Q8_0).is_err());
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn an_allocation_too_big_for_the_machine_is_an_error_not_an_abort() {
        // 2^62 bytes passes the isize::MAX check but exceeds any address space.
        let e = Tensor::zeros([1usize << 40, 1 << 20], DType::F32).unwrap_err();
        assert!(e.to_string().contains("refused by the allocator"), "{e}");
        assert!(UninitHost::<f32>::new("test", 1 << 60).is_err());
    }

    #[test]
    fn large_buffers_are_huge_page_aligned_and_hold_what_was_asked() {
        let n = HUGE_FROM / 4 + 3;
        let z = Tensor::zeros([n], DType::F32).unwrap();
        let zs = z.as_slice::<f32>().unwrap();
        assert_eq!(zs.as_ptr() as usize % HUGE_PAGE, 0);
        assert!(zs.iter().all(|&v| v == 0.0));
        let bytes: Vec<u8> = (0..HUGE_FROM + 5).map(|i| (i % 251) as u8).collect();
        let t = Tensor::from_bytes(&bytes, [bytes.len()], DType::F8E4M3).unwrap();
        assert_eq!(t.host_bytes().unwrap().as_ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(t.host_bytes().unwrap(), &bytes[..]);
        // Below the threshold: cache-line alignment.
        let small = Tensor::from_bytes(&bytes[..1000], [1000], DType::F8E4M3).unwrap();
        assert_eq!(small.host_bytes().unwrap().as_ptr() as usize % HOST_ALIGN, 0);
    }

    #[test]
    fn from_slice_checks_length() {
        let e = Tensor::from_slice(&[1.0f32, 2.0, 3.0], [2, 2]).unwrap_err();
        assert!(matches!(e, Error::Shape { .. }), "{e}");
        let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    }

    /// Fresh outputs are 64-byte aligned (when they hold anything), hold what was
    /// written, and refuse a shape of another size.
    #[test]
    fn uninit_host_is_aligned_and_checks_its_shape() {
        for len in [0usize, 1, 17, if cfg!(miri) { 4096 } else { 1 << 20 }] {
            let mut u = UninitHost::<f32>::new("test", len).unwrap();
            for (i, slot) in u.slots().iter_mut().enumerate() {
                slot.write(i as f32);
            }
            // SAFETY: every slot was written above.
            let t = unsafe { u.assume_init([len]) }.unwrap();
            let v = t.as_slice::<f32>().unwrap();
            if len > 0 {
                assert_eq!(v.as_ptr() as usize % HOST_ALIGN, 0, "len {len}");
            }
            assert!(v.iter().enumerate().all(|(i, &x)| x == i as f32), "len {len}");
        }
        let u = UninitHost::<f32>::new("test", 6).unwrap();
        // SAFETY: refused before anything is read.
        let e = unsafe { u.assume_init([7]) }.unwrap_err();
        assert!(matches!(e, Error::Shape { .. }), "{e}");
        assert!(UninitHost::<f32>::new("test", usize::MAX).is_err());
    }

    #[test]
    fn clones_refuse_in_place_writes() {
        let mut a = Tensor::zeros([4], DType::F32).unwrap();
        assert!(a.as_mut_slice::<f32>().is_ok());
        let b = a.clone();
        assert_eq!(a.as_mut_slice::<f32>().unwrap_err(), Error::SharedStorage { op: "Tensor::host_bytes_mut" });
        drop(b);
        assert!(a.as_mut_slice::<f32>().is_ok());
    }

    #[test]
    fn a_window_is_written_in_place_and_a_kept_copy_keeps_the_tensor_read_only() {
        let whole = Tensor::zeros([10], DType::F32).unwrap();
        let mut parts = whole.partition(&[Shape::new([4]), Shape::new([6])]).unwrap();
        parts[1].with_window_mut(2, [3], |w| w.as_mut_slice::<f32>().map(|x| x.fill(7.0))).unwrap();
        assert_eq!(parts[1].to_vec::<f32>().unwrap(), [0.0, 0.0, 7.0, 7.0, 7.0, 0.0]);
        assert!(parts[1].is_writable() && parts[0].is_writable());
        let kept = parts[1].with_window_mut(0, [2], |w| Ok(w.clone())).unwrap();
        assert!(!parts[1].is_writable(), "a copy of the window still reads these bytes");
        drop(kept);
        assert!(parts[1].is_writable());
        assert!(parts[1].with_window_mut(5, [2], |_| Ok(())).is_err(), "past the end");
        assert!(parts[1].is_writable());
        let mut t = Tensor::zeros([4], DType::F32).unwrap();
        t.with_window_mut(1, [2], |w| w.as_mut_slice::<f32>().map(|x| x.fill(1.0))).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), [0.0, 1.0, 1.0, 0.0]);
        assert!(t.is_writable());
        let reader = t.clone();
        assert!(t.with_window_mut(0, [1], |_| Ok(())).is_err(), "shared storage is not writable");
        drop(reader);
    }

    #[test]
    fn partitions_are_disjoint_writable_views() {
        let big = Tensor::zeros([10], DType::F32).unwrap();
        let mut parts = big.partition(&[Shape::new([4]), Shape::new([2, 3])]).unwrap();
        parts[0].as_mut_slice::<f32>().unwrap().fill(1.0);
        parts[1].as_mut_slice::<f32>().unwrap().fill(2.0);
        assert_eq!(parts[0].to_vec::<f32>().unwrap(), vec![1.0; 4]);
        assert_eq!(parts[1].to_vec::<f32>().unwrap(), vec![2.0; 6]);
        assert!(parts[1].shares_storage_with(&parts[0]));
        let reader = parts[1].clone();
        assert!(parts[1].as_mut_slice::<f32>().is_err());
        assert!(parts[0].as_mut_slice::<f32>().is_ok());
        drop(reader);
        assert!(parts[1].as_mut_slice::<f32>().is_ok());
    }

    /// A vector taken over keeps its allocation (spare capacity included), is read and
    /// written in place, and is freed with the layout it was allocated with (which Miri
    /// checks, `scripts/miri.sh`).
    #[test]
    fn a_vector_taken_over_is_used_in_place_and_freed_with_its_layout() {
        let mut v = Vec::with_capacity(10);
        v.extend_from_slice(&[1.0f32, 2.0, 3.0]);
        let at = v.as_ptr();
        let mut t = Tensor::from_vec(v, [3]).unwrap();
        assert_eq!(t.as_slice::<f32>().unwrap().as_ptr(), at);
        t.as_mut_slice::<f32>().unwrap()[1] = 5.0;
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 5.0, 3.0]);
        let h = Tensor::from_vec(vec![half::f16::from_f32(1.5); 5], [5]).unwrap();
        assert_eq!(h.to_vec_f32().unwrap(), vec![1.5; 5]);
        drop((t, h));
    }

    /// Disjoint parts of one allocation are written from two threads at once and read
    /// back after the join (under Miri the race detector checks the handover).
    #[test]
    fn partitions_are_written_from_two_threads() {
        let whole = Tensor::zeros([12], DType::F32).unwrap();
        let parts = whole.partition(&[Shape::new([5]), Shape::new([7])]).unwrap();
        let writers: Vec<_> = parts
            .into_iter()
            .enumerate()
            .map(|(k, mut part)| {
                std::thread::spawn(move || {
                    for (i, x) in part.as_mut_slice::<f32>().unwrap().iter_mut().enumerate() {
                        *x = (10 * k + i) as f32;
                    }
                    part
                })
            })
            .collect();
        let parts: Vec<Tensor> = writers.into_iter().map(|w| w.join().unwrap()).collect();
        assert_eq!(parts[0].to_vec::<f32>().unwrap(), (0..5).map(|i| i as f32).collect::<Vec<_>>());
        assert_eq!(parts[1].to_vec::<f32>().unwrap(), (10..17).map(|i| i as f32).collect::<Vec<_>>());
    }

    #[test]
    fn views_check_bounds_and_blocks() {
        let t = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], [6]).unwrap();
        let v = t.view(2, [2, 2]).unwrap();
        assert_eq!(v.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0, 5.0]);
        assert!(t.view(3, [4]).is_err());
        assert!(Tensor::zeros([3, 31], DType::Q8_0).is_err());
        assert!(Tensor::zeros([1 << 40, 1 << 40, 16], DType::F32).is_err());
        assert!(Tensor::zeros([usize::MAX / 2, 4], DType::F32).is_err());
        let empty = Tensor::from_vec(Vec::<f32>::new(), [0, 4]).unwrap();
        assert_eq!(empty.as_slice::<f32>().unwrap().len(), 0);
        let empty = Tensor::zeros([0], DType::F32).unwrap();
        assert_eq!(empty.to_vec::<f32>().unwrap(), Vec::<f32>::new());
        let q = Tensor::zeros([2, 64], DType::Q4_0).unwrap();
        assert_eq!(q.byte_len(), 4 * 18);
    }
}
