//! [`CachingAllocator`]: a global allocator that keeps freed large blocks and hands
//! them to the next request of the same layout.
//!
//! A training step allocates the same activations, logits and gradients every step.
//! Left to the C allocator, blocks of megabytes are `mmap`ed fresh each time and
//! returned with `munmap`, so every page is faulted in and cleared by the kernel
//! again (~40 000 page faults per GPT-2 124M step here). Reusing the freed blocks
//! removes that, at the price of holding at most [`capacity`] bytes nobody uses.
//! Oldest blocks go back to the system first; [`clear`] returns all of them
//! (`CpuBackend::release_resources` calls it).
//!
//! A binary opts in with
//! `#[global_allocator] static ALLOC: fusebox::host_cache::CachingAllocator = fusebox::host_cache::CachingAllocator;`
//! (the `fusebox` command line does). Without it nothing here is used.
//!
//! Hazards: the allocator must not allocate itself (the cache is a fixed array under
//! a futex mutex, which never allocates), and a block is reused only for exactly the
//! layout it was allocated with, so it is later freed with the right layout.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Blocks smaller than this go straight to the system allocator (it handles them well).
const MIN_BYTES: usize = 1 << 20;
/// Blocks the cache can hold at once.
const SLOTS: usize = 1024;

/// Bound on the bytes held; [`set_capacity`] changes it.
static CAPACITY: AtomicUsize = AtomicUsize::new(1 << 30);

/// A freed block: its address and layout.
#[derive(Clone, Copy)]
struct Block {
    addr: usize,
    size: usize,
    align: usize,
    /// Insertion order, for evicting the oldest first.
    age: u64,
}

struct Cache {
    slots: [Option<Block>; SLOTS],
    held: usize,
    clock: u64,
}

static CACHE: Mutex<Cache> = Mutex::new(Cache { slots: [None; SLOTS], held: 0, clock: 0 });

fn lock() -> std::sync::MutexGuard<'static, Cache> {
    CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The most bytes the cache holds (1 GiB unless set).
pub fn capacity() -> usize {
    CAPACITY.load(Ordering::Relaxed)
}

/// Bounds the bytes held (0 disables caching); blocks beyond the new bound are freed.
pub fn set_capacity(bytes: usize) {
    CAPACITY.store(bytes, Ordering::Relaxed);
    let evicted = {
        let mut c = lock();
        evict_to(&mut c, bytes)
    };
    free_all(&evicted);
}

/// Bytes held right now.
pub fn held_bytes() -> usize {
    lock().held
}

/// Returns every cached block to the system allocator.
pub fn clear() {
    let evicted = {
        let mut c = lock();
        evict_to(&mut c, 0)
    };
    free_all(&evicted);
}

/// Removes the oldest block; returns its slot and the block.
fn evict_oldest(c: &mut Cache) -> Option<(usize, Block)> {
    let i = (0..SLOTS).filter(|&i| c.slots[i].is_some()).min_by_key(|&i| c.slots[i].map_or(0, |b| b.age))?;
    let b = c.slots[i].take()?;
    c.held -= b.size;
    Some((i, b))
}

/// Removes the oldest blocks until at most `bound` bytes are held; returns them.
fn evict_to(c: &mut Cache, bound: usize) -> [Option<Block>; SLOTS] {
    let mut out = [None; SLOTS];
    for slot in out.iter_mut() {
        if c.held <= bound {
            break;
        }
        *slot = evict_oldest(c).map(|(_, b)| b);
    }
    out
}

fn free_all(blocks: &[Option<Block>]) {
    for b in blocks.iter().flatten() {
        // SAFETY: every cached block came from `System` with exactly this layout.
        unsafe { System.dealloc(b.addr as *mut u8, Layout::from_size_align_unchecked(b.size, b.align)) };
    }
}

/// A cached block of exactly `layout`, if one is held (its contents are stale).
fn take(layout: Layout) -> Option<*mut u8> {
    if layout.size() < MIN_BYTES {
        return None;
    }
    let mut c = lock();
    let i = (0..SLOTS).find(|&i| c.slots[i].is_some_and(|b| b.size == layout.size() && b.align == layout.align()))?;
    let b = c.slots[i].take()?;
    c.held -= b.size;
    Some(b.addr as *mut u8)
}

/// Keeps a freed block; returns `false` when it is not kept (the caller frees it).
fn keep(ptr: *mut u8, layout: Layout) -> bool {
    let cap = capacity();
    if layout.size() < MIN_BYTES || layout.size() > cap {
        return false;
    }
    let (evicted, oldest) = {
        let mut c = lock();
        let evicted = evict_to(&mut c, cap - layout.size());
        // Every slot full: the oldest block makes room.
        let (free, oldest) = match (0..SLOTS).find(|&i| c.slots[i].is_none()) {
            Some(i) => (i, None),
            None => match evict_oldest(&mut c) {
                Some((i, b)) => (i, Some(b)),
                None => return false,
            },
        };
        c.clock += 1;
        c.slots[free] = Some(Block { addr: ptr as usize, size: layout.size(), align: layout.align(), age: c.clock });
        c.held += layout.size();
        (evicted, oldest)
    };
    free_all(&evicted);
    free_all(&[oldest]);
    true
}

/// The system allocator with a cache of freed blocks of 1 MiB and more.
pub struct CachingAllocator;

// SAFETY: every block handed out comes from `System` (fresh or cached with the same
// layout), and every block returned is either kept for the same layout or freed by
// `System` with its layout.
unsafe impl GlobalAlloc for CachingAllocator {
    /// A block of `layout`: a cached one of the same layout, else a fresh one from `System`.
    ///
    /// # Safety
    /// `layout` must have a non-zero size (the `GlobalAlloc::alloc` contract).
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match take(layout) {
            Some(p) => p,
            // SAFETY: the caller's contract (non-zero size) carries over.
            None => unsafe { System.alloc(layout) },
        }
    }

    /// As `alloc`, zero-filled.
    ///
    /// # Safety
    /// As for `alloc`: `layout` must have a non-zero size.
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match take(layout) {
            Some(p) => {
                // SAFETY: a cached block of `layout.size()` bytes, now ours.
                unsafe { p.write_bytes(0, layout.size()) };
                p
            }
            // SAFETY: as in `alloc`.
            None => unsafe { System.alloc_zeroed(layout) },
        }
    }

    /// Keeps the block for reuse when it is large enough and the cache has room, else
    /// returns it to `System`.
    ///
    /// # Safety
    /// `ptr` must have been returned by this allocator for the same `layout` and not
    /// freed since (the `GlobalAlloc::dealloc` contract).
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !keep(ptr, layout) {
            // SAFETY: allocated by `System` with `layout` (fresh or cached).
            unsafe { System.dealloc(ptr, layout) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_block_is_reused_for_the_same_layout_only() {
        // Odd sizes no other test asks for; the test calls the allocator directly.
        let layout = Layout::from_size_align(MIN_BYTES * 3 + 4160, 64).unwrap();
        let other = Layout::from_size_align(MIN_BYTES * 3 + 4224, 64).unwrap();
        let a = CachingAllocator;
        // SAFETY: non-zero sizes; each block is freed once with its layout.
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            p.write_bytes(7, layout.size());
            a.dealloc(p, layout);
            assert!(held_bytes() >= layout.size());
            let q = a.alloc_zeroed(other);
            assert_ne!(p, q, "a block of another size must not be reused");
            a.dealloc(q, other);
            let z = a.alloc_zeroed(layout);
            assert_eq!(z, p, "the freed block of this layout is reused");
            assert!(std::slice::from_raw_parts(z, layout.size()).iter().all(|&b| b == 0));
            a.dealloc(z, layout);
        }
        clear();
        assert_eq!(held_bytes(), 0);
    }
}
