//! Fresh outputs, written once, tile by tile, with streaming stores beyond the caches.
//!
//! A kernel that fills a new tensor receives it in pieces ([`Dst`]: a row, or a chunk of
//! elements), each of which it writes exactly once. An F32 piece that stays in cache is
//! handed to the kernel as it is (its uninitialised memory, written in place); otherwise
//! [`Dst::write`] hands the kernel one small f32 tile at a time ([`TILE`] elements, in
//! registers or L1) and stores the finished tile into the output in its dtype (F16/BF16
//! rounded here, so kernels compute in f32 only). No pass zeroes the output beforehand:
//! with the working set in the last-level cache, a zeroing pass cost a third of an
//! rms_norm. Kernels that write in place may prefetch the piece's later lines for
//! writing ([`Dst::in_place`], [`Dst::own_lines`]), so the read-for-ownership of each
//! line is under way before its stores arrive.
//!
//! Why tiles: a plain store to a line that is not in cache first reads the line from
//! memory (read-for-ownership), so a fresh output beyond the caches crosses the memory
//! bus twice. A non-temporal store writes whole lines through write-combining buffers
//! without reading them, as `memcpy` does for large copies. Outputs of at least the
//! backend's `stream_min_bytes` (default [`default_stream_min_bytes`]) are therefore stored with non-temporal stores, tile by tile,
//! right after each tile is computed (computing a whole row into a scratch buffer first
//! and streaming it afterwards measured far slower: the stores then come in bursts).
//! Smaller outputs keep plain stores: they are likely still cached when the next op
//! reads them, and streaming would push them out.
//!
//! A piece the kernel does not write is zero-filled when dropped, so "untouched means
//! zero" holds as it did for zeroed buffers.
//!
//! Hazard: non-temporal stores are weakly ordered. Every task of [`fresh_tensors`] ends
//! with `sfence`, so its stores are globally visible before the task signals completion
//! and another thread reads them; [`Dst`]s exist only inside those tasks.

use std::cell::Cell;
use std::mem::MaybeUninit;
use std::sync::OnceLock;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::cpu::simd::Isa;
use crate::cpu::CpuBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::{Tensor, UninitHost};

/// Elements of one f32 tile: four cache lines. Small on purpose: each tile's streaming
/// stores then go out between the loads of the next tile's inputs; tiles of 256 and more
/// elements measured slower than plain stores (the stores come in bursts that stall on
/// the write-combining buffers while no loads are in flight). Kernels therefore call
/// [`Dst::write`] inside their own vectorized loop (so the per-tile work is inlined),
/// not once per tile through a dispatching call.
pub const TILE: usize = 64;

/// How a piece of output is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// Plain stores (the output stays in cache for the next op).
    Cached,
    /// Non-temporal stores for whole 64-byte lines (no read-for-ownership).
    Stream,
}

impl Store {
    /// Streaming for an output of at least `cpu`'s
    /// [`stream_min_bytes`](CpuBackend::stream_min_bytes), else cached.
    pub fn for_output(cpu: &CpuBackend, bytes: usize) -> Store {
        if bytes >= cpu.stream_min_bytes() {
            Store::Stream
        } else {
            Store::Cached
        }
    }
}

/// Outputs of at least this many bytes have their row kernels prefetch the next rows far
/// ahead even when the output stays in cache (see [`Dst::ahead`]).
pub const FAR_MIN_BYTES: usize = 8 << 20;

/// The default streaming threshold of a backend: a quarter of the last-level cache (read
/// from sysfs on Linux, else 32 MiB assumed), at least 4 MiB. An output that large,
/// together with its inputs, fills most of the cache, so it would be evicted before the
/// next op reads it anyway. `CpuBackendBuilder::stream_min_bytes` sets another.
pub fn default_stream_min_bytes() -> usize {
    static DEFAULT: OnceLock<usize> = OnceLock::new();
    *DEFAULT.get_or_init(|| (last_level_cache_bytes().unwrap_or(32 << 20) / 4).max(4 << 20))
}

/// The size of the largest cache `cpu0` reports in sysfs (`index*/size`, e.g. `32768K`);
/// `None` where there is no such file (not Linux, or a hidden topology).
pub fn last_level_cache_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|entry| {
        let size = std::fs::read_to_string(entry.ok()?.path().join("size")).ok()?;
        let size = size.trim();
        let split = size.find(|c: char| !c.is_ascii_digit()).unwrap_or(size.len());
        let n: usize = size[..split].parse().ok()?;
        Some(match &size[split..] {
            "K" => n << 10,
            "M" => n << 20,
            "G" => n << 30,
            _ => n,
        })
    })
    .max()
}

/// The slots of one output piece, by element type.
enum Slots<'a> {
    F32(&'a mut [MaybeUninit<f32>]),
    F16(&'a mut [MaybeUninit<f16>]),
    BF16(&'a mut [MaybeUninit<bf16>]),
}

impl<'a> Slots<'a> {
    /// The first `mid` slots and the rest.
    fn split_at(self, mid: usize) -> (Slots<'a>, Slots<'a>) {
        match self {
            Slots::F32(s) => {
                let (a, b) = s.split_at_mut(mid);
                (Slots::F32(a), Slots::F32(b))
            }
            Slots::F16(s) => {
                let (a, b) = s.split_at_mut(mid);
                (Slots::F16(a), Slots::F16(b))
            }
            Slots::BF16(s) => {
                let (a, b) = s.split_at_mut(mid);
                (Slots::BF16(a), Slots::BF16(b))
            }
        }
    }

    fn len(&self) -> usize {
        match self {
            Slots::F32(s) => s.len(),
            Slots::F16(s) => s.len(),
            Slots::BF16(s) => s.len(),
        }
    }
}

/// One piece of a fresh output (see the module docs), written once by value: by
/// [`write`](Dst::write), [`fill`](Dst::fill) or [`copy_from`](Dst::copy_from), or split
/// into smaller pieces by [`into_chunks`](Dst::into_chunks). Dropped unwritten, it is
/// zero-filled.
pub struct Dst<'a> {
    slots: Slots<'a>,
    store: Store,
    /// Whether row kernels prefetch their next rows far ahead (see [`Dst::ahead`]).
    far: bool,
}

impl<'a> Dst<'a> {
    fn new(slots: Slots<'a>, store: Store, far: bool) -> Dst<'a> {
        Dst { slots, store, far }
    }

    /// A piece of no elements.
    fn empty() -> Dst<'a> {
        Dst::new(Slots::F32(&mut []), Store::Cached, false)
    }

    /// Elements in this piece.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the piece has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slots, leaving this piece empty (so its drop writes nothing).
    fn take(&mut self) -> Slots<'a> {
        std::mem::replace(&mut self.slots, Slots::F32(&mut []))
    }

    /// This piece's own F32 slots when it streams (an F32 output beyond the caches), for a
    /// kernel that issues its own streaming stores straight from registers
    /// (`cpu::stream_x86`); otherwise the piece back, unchanged. The task's closing
    /// `sfence` (see the module docs) covers those stores too.
    ///
    /// # Safety
    /// The caller must write every slot it receives: the tensor takes them as written.
    pub unsafe fn into_streamed_f32(mut self) -> std::result::Result<&'a mut [MaybeUninit<f32>], Dst<'a>> {
        match (self.store, self.take()) {
            (Store::Stream, Slots::F32(s)) => Ok(s),
            (_, slots) => {
                self.slots = slots;
                Err(self)
            }
        }
    }

    /// What a row kernel should prefetch far ahead ([`simd::prefetch_far`]) while it
    /// writes this piece: `next` (its next rows) when the output is streamed or at least
    /// [`FAR_MIN_BYTES`], nothing for a smaller one. Beyond that size the inputs come from
    /// the last-level cache or memory, and the prefetches overlap the next row's reads with
    /// this row's compute; below it they only compete with the demand loads and the
    /// hardware prefetchers (docs/performance.md, "Row kernels", has the measurements).
    ///
    /// [`simd::prefetch_far`]: crate::cpu::simd::prefetch_far
    pub fn ahead<'n>(&self, next: &'n [f32]) -> &'n [f32] {
        if self.far {
            next
        } else {
            &[]
        }
    }

    /// Whether this piece is streamed to memory (non-temporal stores).
    pub fn streams(&self) -> bool {
        self.store == Store::Stream
    }

    /// Whether [`write`](Dst::write) hands the kernel the output's own memory (a cached
    /// F32 piece, as one tile), so that prefetching the tile's later lines for writing
    /// ([`simd::prefetch_write`](crate::cpu::simd::prefetch_write)) takes their
    /// read-for-ownership off the stores' critical path.
    pub fn in_place(&self) -> bool {
        !self.own_lines().is_null()
    }

    /// The first element of this piece's memory when [`write`](Dst::write) writes it in
    /// place (see [`in_place`](Dst::in_place)), for prefetching its lines for writing
    /// during an earlier pass; null otherwise.
    pub fn own_lines(&self) -> *const f32 {
        match &self.slots {
            Slots::F32(s) if self.store == Store::Cached => s.as_ptr().cast(),
            _ => std::ptr::null(),
        }
    }

    /// Writes every element: `f(start, tile)` sets every slot of `tile` (elements
    /// `start .. start + tile.len()` of this piece, as f32, with `slot.write(v)`), tile
    /// after tile in order. A cached F32 piece is handed over whole, as one tile: the
    /// output's own uninitialised memory, written once (no zeroing pass before, which
    /// cost a third of an L3-resident rms_norm). Streamed and F16/BF16 pieces are
    /// computed in a small f32 tile and then stored; streamed ones start their second
    /// tile at a 64-byte boundary, so every tile after the first covers whole lines.
    ///
    /// # Safety
    /// `f` must write every slot of every tile it is handed (in the cached F32 case an
    /// unwritten slot would be uninitialised memory in the finished tensor).
    #[inline(always)]
    pub unsafe fn write(mut self, mut f: impl FnMut(usize, &mut [MaybeUninit<f32>])) {
        let store = self.store;
        match self.take() {
            Slots::F32(s) if store == Store::Cached => f(0, s),
            Slots::F32(s) => write_tiles(s, store, &mut f),
            Slots::F16(s) => write_tiles(s, store, &mut f),
            Slots::BF16(s) => write_tiles(s, store, &mut f),
        }
    }

    /// Sets every element to `value`.
    pub fn fill(self, value: f32) {
        // SAFETY: every slot of every tile is written.
        unsafe {
            self.write(|_, tile| {
                for slot in tile {
                    slot.write(value);
                }
            })
        };
    }

    /// Writes `src` (this piece's length) as the values.
    pub fn copy_from(self, src: &[f32]) {
        assert_eq!(src.len(), self.len(), "Dst::copy_from: length");
        // SAFETY: every slot of every tile is written (`src` has this piece's length).
        unsafe {
            self.write(|start, tile| {
                tile.write_copy_of_slice(&src[start..start + tile.len()]);
            })
        };
    }

    /// Writes this piece and `other` (of the same length and dtype) together, tile by
    /// tile: `f(start, a, b)` fills both tiles (see [`write`](Dst::write)).
    ///
    /// # Safety
    /// As [`write`](Dst::write), for both tiles.
    ///
    /// # Panics
    /// When the lengths or dtypes differ (a kernel bug: both come from one op).
    #[inline(always)]
    pub unsafe fn write_pair(
        mut self,
        mut other: Dst<'a>,
        mut f: impl FnMut(usize, &mut [MaybeUninit<f32>], &mut [MaybeUninit<f32>]),
    ) {
        assert_eq!(self.len(), other.len(), "Dst::write_pair: lengths differ");
        let store = self.store;
        match (self.take(), other.take()) {
            (Slots::F32(a), Slots::F32(b)) if store == Store::Cached => f(0, a, b),
            (Slots::F32(a), Slots::F32(b)) => write_tile_pairs(a, b, store, &mut f),
            (Slots::F16(a), Slots::F16(b)) => write_tile_pairs(a, b, store, &mut f),
            (Slots::BF16(a), Slots::BF16(b)) => write_tile_pairs(a, b, store, &mut f),
            _ => panic!("Dst::write_pair: the two outputs have different dtypes"),
        }
    }

    /// Splits this piece into consecutive pieces of `len` elements (the last may be
    /// shorter), each to be written on its own. Pieces the caller does not take are
    /// zero-filled when the iterator is dropped, as an unwritten piece is.
    pub fn into_chunks(self, len: usize) -> Chunks<'a> {
        Chunks { rest: self, len: len.max(1) }
    }
}

/// The iterator of [`Dst::into_chunks`]: splits pieces off the front of what is left
/// (no allocation; the rest is a [`Dst`], so it zero-fills itself when dropped).
pub struct Chunks<'a> {
    rest: Dst<'a>,
    len: usize,
}

impl<'a> Iterator for Chunks<'a> {
    type Item = Dst<'a>;

    fn next(&mut self) -> Option<Dst<'a>> {
        if self.rest.is_empty() {
            return None;
        }
        let mid = self.len.min(self.rest.len());
        let (head, tail) = self.rest.take().split_at(mid);
        self.rest.slots = tail;
        Some(Dst::new(head, self.rest.store, self.rest.far))
    }
}

impl Drop for Dst<'_> {
    fn drop(&mut self) {
        if !self.is_empty() {
            let rest = Dst::new(self.take(), self.store, self.far);
            rest.fill(0.0);
        }
    }
}

/// An element type outputs are stored in.
trait Elem: Copy {
    /// Stores an f32 tile into `dst` (same length), rounded to this type.
    fn store_tile(dst: &mut [MaybeUninit<Self>], tile: &[f32], store: Store);
}

impl Elem for f32 {
    #[inline(always)]
    fn store_tile(dst: &mut [MaybeUninit<f32>], tile: &[f32], store: Store) {
        store_elems(dst, tile, store);
    }
}

impl Elem for f16 {
    #[inline(always)]
    fn store_tile(dst: &mut [MaybeUninit<f16>], tile: &[f32], store: Store) {
        let mut rounded = [f16::ZERO; TILE];
        rounded[..tile.len()].convert_from_f32_slice(tile);
        store_elems(dst, &rounded[..tile.len()], store);
    }
}

impl Elem for bf16 {
    #[inline(always)]
    fn store_tile(dst: &mut [MaybeUninit<bf16>], tile: &[f32], store: Store) {
        let mut rounded = [bf16::ZERO; TILE];
        rounded[..tile.len()].convert_from_f32_slice(tile);
        store_elems(dst, &rounded[..tile.len()], store);
    }
}

/// A staging tile for [`write_tiles`]: initialised once (zeros), so reading it back is
/// sound whatever the kernel wrote.
#[inline(always)]
fn staging_tile() -> [MaybeUninit<f32>; TILE] {
    [MaybeUninit::new(0.0); TILE]
}

/// The values of a staging tile.
#[inline(always)]
fn staged(tile: &[MaybeUninit<f32>]) -> &[f32] {
    // SAFETY: staging tiles start initialised (`staging_tile`) and kernels only store
    // initialised values into them; `MaybeUninit<f32>` has the layout of `f32`.
    unsafe { &*(tile as *const [MaybeUninit<f32>] as *const [f32]) }
}

/// [`Dst::write`] for one element type: tiles computed in f32, then stored (rounded).
#[inline(always)]
fn write_tiles<T: Elem>(
    slots: &mut [MaybeUninit<T>],
    store: Store,
    f: &mut impl FnMut(usize, &mut [MaybeUninit<f32>]),
) {
    let mut tile = staging_tile();
    for (start, end) in tiles(slots, store) {
        f(start, &mut tile[..end - start]);
        T::store_tile(&mut slots[start..end], staged(&tile[..end - start]), store);
    }
}

/// [`Dst::write_pair`] for one element type (tiles aligned as `a`'s).
#[inline(always)]
fn write_tile_pairs<T: Elem>(
    a: &mut [MaybeUninit<T>],
    b: &mut [MaybeUninit<T>],
    store: Store,
    f: &mut impl FnMut(usize, &mut [MaybeUninit<f32>], &mut [MaybeUninit<f32>]),
) {
    let (mut ta, mut tb) = (staging_tile(), staging_tile());
    for (start, end) in tiles(a, store) {
        let len = end - start;
        f(start, &mut ta[..len], &mut tb[..len]);
        T::store_tile(&mut a[start..end], staged(&ta[..len]), store);
        T::store_tile(&mut b[start..end], staged(&tb[..len]), store);
    }
}

/// The tiles of `slots` as `(start, end)`: at most [`TILE`] long; streamed, the first
/// ends at the first 64-byte boundary (a whole tile when the slots start on one), so
/// later tiles cover whole lines.
#[inline(always)]
fn tiles<T>(slots: &[MaybeUninit<T>], store: Store) -> impl Iterator<Item = (usize, usize)> {
    let n = slots.len();
    let first = match store {
        Store::Stream => match slots.as_ptr().align_offset(64) {
            0 => TILE,
            k => k.min(TILE),
        },
        Store::Cached => TILE,
    };
    let mut next = (0, first.min(n));
    std::iter::from_fn(move || {
        let (start, end) = next;
        (start < n).then(|| {
            next = (end, (end + TILE).min(n));
            (start, end)
        })
    })
}

/// `dst = src`: plain stores, or (streamed) non-temporal stores for the whole 64-byte
/// lines of a 64-byte-aligned destination and plain stores for the rest. Never a partial
/// line with non-temporal stores: a partly written write-combining buffer is flushed as
/// slow partial writes, and the line's other bytes may belong to another task's piece,
/// which writes them with plain stores from another core (softmax rows on two threads
/// measured several times slower).
#[inline(always)]
fn store_elems<T: Copy>(dst: &mut [MaybeUninit<T>], src: &[T], store: Store) {
    let bytes = std::mem::size_of_val(src);
    let (d, s) = (dst.as_mut_ptr().cast::<u8>(), src.as_ptr().cast::<u8>());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if store == Store::Stream && d.align_offset(64) == 0 {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
        done = bytes / 64 * 64;
        // SAFETY: dst and src are `bytes` long and disjoint (dst is exclusively
        // borrowed); `d` is 64-byte aligned; SSE is part of x86-64, AVX-512 is checked.
        // Any byte pattern copied from a T is that T.
        unsafe {
            if Isa::active() == Isa::Avx512 {
                stream_lines_avx512(d, s, done / 64);
            } else {
                for g in 0..done / 16 {
                    _mm_stream_ps(d.add(16 * g).cast(), _mm_loadu_ps(s.add(16 * g).cast()));
                }
            }
        }
    }
    let _ = store;
    if done == 0 {
        // Cached (or a destination off line alignment): plain stores of the whole tile.
        // SAFETY: both ranges are `bytes` long and disjoint (dst is exclusively borrowed).
        unsafe { std::ptr::copy_nonoverlapping(s, d, bytes) };
        return;
    }
    // The rest of a streamed tile one byte at a time: less than a line, and a copy call
    // per tile would cost more.
    for b in done..bytes {
        // SAFETY: b < bytes, inside both ranges.
        unsafe { *d.add(b) = *s.add(b) };
    }
}

/// Copies `lines` 64-byte lines from `s` to the 64-byte-aligned `d` with one 512-bit
/// non-temporal store each (inlined into the AVX-512 builds of the kernels; the 128-bit
/// loop takes four stores and four loads per line).
///
/// # Safety
/// AVX-512F must be present; both ranges valid for `64·lines` bytes, disjoint.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn stream_lines_avx512(d: *mut u8, s: *const u8, lines: usize) {
    use std::arch::x86_64::{_mm512_loadu_ps, _mm512_stream_ps};
    for l in 0..lines {
        // SAFETY: guaranteed by the caller.
        unsafe { _mm512_stream_ps(d.add(64 * l).cast(), _mm512_loadu_ps(s.add(64 * l).cast())) };
    }
}

/// Orders this thread's non-temporal stores before its later stores.
#[inline(always)]
fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// A fresh buffer of one float dtype, 64-byte aligned (see [`UninitHost`]), filled
/// through [`Dst`] pieces.
enum Buffer {
    F32(UninitHost<f32>),
    F16(UninitHost<f16>),
    BF16(UninitHost<bf16>),
}

impl Buffer {
    fn new(op: &'static str, dtype: DType, n: usize) -> Result<Buffer> {
        match dtype {
            DType::F32 => Ok(Buffer::F32(UninitHost::new(op, n)?)),
            DType::F16 => Ok(Buffer::F16(UninitHost::new(op, n)?)),
            DType::BF16 => Ok(Buffer::BF16(UninitHost::new(op, n)?)),
            other => Err(Error::dtype(op, "output", "f32, f16 or bf16", other)),
        }
    }

    /// The (uninitialised) slots cut into `chunk`-sized pieces.
    fn pieces(&mut self, chunk: usize, store: Store, far: bool) -> Vec<Dst<'_>> {
        let chunk = chunk.max(1);
        match self {
            Buffer::F32(v) => v.slots().chunks_mut(chunk).map(|s| Dst::new(Slots::F32(s), store, far)).collect(),
            Buffer::F16(v) => v.slots().chunks_mut(chunk).map(|s| Dst::new(Slots::F16(s), store, far)).collect(),
            Buffer::BF16(v) => v.slots().chunks_mut(chunk).map(|s| Dst::new(Slots::BF16(s), store, far)).collect(),
        }
    }

    /// The tensor of `shape` over the buffer.
    ///
    /// # Safety
    /// Every slot must have been written (every [`Dst`] over them written or dropped).
    unsafe fn assume_filled(self, shape: Shape) -> Result<Tensor> {
        // SAFETY: guaranteed by the caller.
        unsafe {
            match self {
                Buffer::F32(v) => v.assume_init(shape),
                Buffer::F16(v) => v.assume_init(shape),
                Buffer::BF16(v) => v.assume_init(shape),
            }
        }
    }
}

/// One output of [`fresh_tensors`]: its shape, dtype, and the elements each task writes.
pub struct OutputSpec {
    /// The output's shape.
    pub shape: Shape,
    /// The output's dtype.
    pub dtype: DType,
    /// Elements each task writes.
    pub per_task: usize,
}

/// New tensors filled in parallel tasks: task `i` receives piece `i` of every output
/// (`per_task` consecutive elements of output k, the last piece shorter, missing ones
/// empty) and writes them through their [`Dst`]s; `tasks · work_per_task` decides whether
/// the tasks run in parallel. Outputs beyond the caches are streamed (see the module docs).
pub fn fresh_tensors<const K: usize>(
    cpu: &CpuBackend,
    op: &'static str,
    tasks: usize,
    work_per_task: usize,
    specs: [OutputSpec; K],
    fill: impl Fn(usize, [Dst<'_>; K]) + Sync + Send,
) -> Result<[Tensor; K]> {
    let mut buffers = Vec::with_capacity(K);
    for s in &specs {
        buffers.push(Buffer::new(op, s.dtype, s.shape.elem_count())?);
    }
    {
        let mut columns: Vec<std::vec::IntoIter<Dst<'_>>> = buffers
            .iter_mut()
            .zip(&specs)
            .map(|(b, s)| {
                let n = s.shape.elem_count();
                let bytes = s.dtype.storage_bytes(n);
                let store = Store::for_output(cpu, bytes);
                let pieces = b.pieces(s.per_task, store, store == Store::Stream || bytes >= FAR_MIN_BYTES);
                assert!(pieces.len() <= tasks, "fresh_tensors: {op} output has more pieces than tasks");
                pieces.into_iter()
            })
            .collect();
        // Task i's pieces; outputs with fewer pieces give empty ones.
        let mut per_task: Vec<Option<[Dst<'_>; K]>> =
            (0..tasks).map(|_| Some(std::array::from_fn(|k| columns[k].next().unwrap_or_else(Dst::empty)))).collect();
        cpu.for_each_chunk(&mut per_task, 1, work_per_task, |i, task| {
            if let Some(pieces) = task[0].take() {
                fill(i, pieces);
                // One fence per task (after all its pieces): fencing every row stalls on
                // the write-combining buffers each time.
                fence();
            }
        });
    }
    let tensors: Vec<Tensor> = buffers
        .into_iter()
        .zip(specs)
        // SAFETY: every piece of every buffer was handed to a task and either written or
        // zero-filled when dropped (a panicking task propagates before this line).
        .map(|(b, s)| unsafe { b.assume_filled(s.shape) })
        .collect::<Result<_>>()?;
    Ok(tensors.try_into().unwrap_or_else(|_| unreachable!("K buffers make K tensors")))
}

/// A new tensor of `shape` and `dtype` filled by `fill(i, dst)` over chunks of
/// `chunk_len` elements (in parallel when `len · work_per_elem` is large): see
/// [`fresh_tensors`].
pub fn fresh_tensor(
    cpu: &CpuBackend,
    op: &'static str,
    shape: &Shape,
    dtype: DType,
    chunk_len: usize,
    work_per_elem: usize,
    fill: impl Fn(usize, Dst<'_>) + Sync + Send,
) -> Result<Tensor> {
    let chunk_len = chunk_len.max(1);
    let tasks = shape.elem_count().div_ceil(chunk_len);
    let spec = OutputSpec { shape: shape.clone(), dtype, per_task: chunk_len };
    let [t] = fresh_tensors(cpu, op, tasks, chunk_len.saturating_mul(work_per_elem), [spec], |i, [dst]| fill(i, dst))?;
    Ok(t)
}

/// `c` viewed as possibly-uninitialised slots, for a kernel that writes through
/// `MaybeUninit` into an initialised buffer. Sound: only initialised f32 are ever
/// written through the view, so `c` stays initialised.
pub fn as_uninit(c: &mut [f32]) -> &mut [MaybeUninit<f32>] {
    // SAFETY: `MaybeUninit<f32>` has the layout of `f32`; see above for initialisation.
    unsafe { &mut *(c as *mut [f32] as *mut [MaybeUninit<f32>]) }
}

thread_local! {
    /// Per-thread scratch of [`with_scratch`] (taken out while in use, so a nested call
    /// allocates its own).
    static SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Runs `f` on a thread-local f32 scratch slice of `len` elements (contents unspecified:
/// left from earlier use), for kernels that need a row of temporaries. The slice starts
/// on a 64-byte line, so the kernels' vectors never straddle two lines (the allocator
/// aligns a `Vec` to 16 bytes only).
pub fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    const LINE: usize = 64 / std::mem::size_of::<f32>();
    let mut buf = SCRATCH.with(|s| s.take());
    if buf.len() < len + LINE {
        buf.resize(len + LINE, 0.0);
    }
    // Fewer than LINE elements to the next line: a Vec<f32> is at least 4-byte aligned.
    let start = buf.as_ptr().align_offset(64).min(LINE);
    let r = f(&mut buf[start..start + len]);
    SCRATCH.with(|s| s.set(buf));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(t: &Tensor) -> Vec<f32> {
        t.to_vec_f32().expect("float tensor")
    }

    /// The row kernels' outputs start on a cache line, whatever their dtype (see
    /// `UninitHost`): their vectors then never straddle two lines.
    #[test]
    fn fresh_outputs_start_on_a_cache_line() {
        let cpu = CpuBackend::with_threads(2).unwrap();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let spec = |n: usize| OutputSpec { shape: Shape::from([n]), dtype, per_task: 64 };
            let [a, b] = fresh_tensors(&cpu, "test", 4, 64, [spec(256), spec(100)], |_, [a, b]| {
                a.fill(1.0);
                b.fill(2.0);
            })
            .unwrap();
            for t in [&a, &b] {
                assert_eq!(t.host_bytes().unwrap().as_ptr() as usize % 64, 0, "{dtype}");
            }
            assert!(a.to_vec_f32().unwrap().iter().all(|&x| x == 1.0));
            assert!(b.to_vec_f32().unwrap().iter().all(|&x| x == 2.0));
        }
    }

    #[test]
    fn pieces_are_written_at_every_alignment_and_store() {
        let cpu = CpuBackend::with_threads(2).expect("pool");
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for n in [0usize, 1, 15, 17, 511, 513, 1500, 4099] {
                for chunk in [1usize, 7, 100, 512, 4096] {
                    let shape = Shape::from([n]);
                    let t = fresh_tensor(&cpu, "test", &shape, dtype, chunk, 1, |i, dst| {
                        let base = i * chunk;
                        // SAFETY: every slot of every tile is written.
                        unsafe {
                            dst.write(|s, tile| {
                                for (k, v) in tile.iter_mut().enumerate() {
                                    v.write(((base + s + k) % 256) as f32);
                                }
                            })
                        }
                    })
                    .expect("fresh tensor");
                    let want: Vec<f32> = (0..n).map(|i| (i % 256) as f32).collect();
                    assert_eq!(values(&t), want, "{dtype:?} n {n} chunk {chunk}");
                }
            }
        }
    }

    #[test]
    fn streamed_tiles_match_plain_ones() {
        for offset in 0..20 {
            let n = 3000;
            let src: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
            let mut buf = vec![MaybeUninit::new(-1.0f32); n + 20];
            Dst::new(Slots::F32(&mut buf[offset..offset + n]), Store::Stream, true).copy_from(&src);
            for (i, slot) in buf.iter().enumerate() {
                // SAFETY: every slot was initialised (to −1, then maybe overwritten).
                let got = unsafe { slot.assume_init() };
                let want = if (offset..offset + n).contains(&i) { src[i - offset] } else { -1.0 };
                assert_eq!(got, want, "offset {offset} index {i}");
            }
        }
    }

    #[test]
    fn unwritten_pieces_read_as_zero_and_chunks_split() {
        let cpu = CpuBackend::with_threads(1).expect("pool");
        let shape = Shape::from([10, 6]);
        let t = fresh_tensor(&cpu, "test", &shape, DType::F32, 12, 1, |i, dst| {
            if i % 4 == 0 {
                for (r, row) in dst.into_chunks(6).enumerate() {
                    if r == 0 {
                        row.fill((i + 1) as f32);
                    }
                }
            } else if i % 4 == 2 {
                // The iterator dropped after one piece: the rest still reads as zero.
                if let Some(row) = dst.into_chunks(6).next() {
                    row.fill((i + 1) as f32);
                }
            }
        })
        .expect("fresh tensor");
        let v = values(&t);
        for (row, vals) in v.chunks(6).enumerate() {
            let want = if row % 4 == 0 { (row / 2 + 1) as f32 } else { 0.0 };
            assert!(vals.iter().all(|&x| x == want), "row {row}: {vals:?}");
        }
    }

    #[test]
    fn several_outputs_of_different_piece_sizes() {
        let cpu = CpuBackend::with_threads(2).expect("pool");
        let specs = [
            OutputSpec { shape: Shape::from([7, 3]), dtype: DType::F32, per_task: 3 },
            OutputSpec { shape: Shape::from([7]), dtype: DType::BF16, per_task: 1 },
        ];
        let [a, b] = fresh_tensors(&cpu, "test", 7, 1, specs, |i, [a, b]| {
            a.fill(i as f32);
            b.fill(-(i as f32));
        })
        .expect("fresh tensors");
        assert_eq!(values(&a), (0..21).map(|i| (i / 3) as f32).collect::<Vec<_>>());
        assert_eq!(values(&b), (0..7).map(|i| -(i as f32)).collect::<Vec<_>>());
    }

    #[test]
    fn threshold_is_at_least_4_mib_and_per_backend() {
        assert!(default_stream_min_bytes() >= 4 << 20);
        let cpu = CpuBackend::with_threads(1).unwrap();
        assert_eq!(Store::for_output(&cpu, 1 << 20), Store::Cached);
        let streaming = CpuBackend::builder().threads(1).stream_min_bytes(1).build().unwrap();
        assert_eq!(Store::for_output(&streaming, 1), Store::Stream);
        assert_eq!(streaming.stream_min_bytes(), 1);
        assert_eq!(cpu.stream_min_bytes(), default_stream_min_bytes());
    }

    #[test]
    fn scratch_nests() {
        let total = with_scratch(10, |a| {
            a.fill(1.0);
            with_scratch(5, |b| {
                b.fill(2.0);
                b.iter().sum::<f32>()
            }) + a.iter().sum::<f32>()
        });
        assert_eq!(total, 20.0);
    }
}
