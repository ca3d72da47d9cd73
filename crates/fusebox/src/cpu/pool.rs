//! Parallel loops inside a `CpuBackend`'s pool. Work is split into fixed chunks by
//! index, so the result never depends on scheduling (bit-identical run to run).

use rayon::prelude::*;

use super::CpuBackend;

/// Below this many elements of work a loop runs on the calling thread: spawning
/// costs more than it saves.
pub const SERIAL_WORK: usize = 1 << 15;

impl CpuBackend {
    /// Calls `f(i, chunk)` for consecutive `chunk_len`-sized chunks of `data` (the last
    /// may be shorter), in parallel when `data.len() · work_per_elem` is large.
    pub fn for_each_chunk<T: Send>(
        &self,
        data: &mut [T],
        chunk_len: usize,
        work_per_elem: usize,
        f: impl Fn(usize, &mut [T]) + Sync + Send,
    ) {
        let chunk_len = chunk_len.max(1);
        if self.threads() == 1 || data.len().saturating_mul(work_per_elem.max(1)) < SERIAL_WORK {
            data.chunks_mut(chunk_len).enumerate().for_each(|(i, c)| f(i, c));
        } else {
            self.install(|| data.par_chunks_mut(chunk_len).enumerate().for_each(|(i, c)| f(i, c)));
        }
    }

    /// Calls `f(i)` for `i in 0..n`, in parallel when `n · work_per_item` is large.
    pub fn for_each_index(&self, n: usize, work_per_item: usize, f: impl Fn(usize) + Sync + Send) {
        if self.threads() == 1 || n.saturating_mul(work_per_item.max(1)) < SERIAL_WORK {
            (0..n).for_each(f);
        } else {
            self.install(|| (0..n).into_par_iter().for_each(f));
        }
    }

    /// `f(i)` for `i in 0..n`, collected in order; parallel when the work is large.
    pub fn map_indices<R: Send>(&self, n: usize, work_per_item: usize, f: impl Fn(usize) -> R + Sync + Send) -> Vec<R> {
        if self.threads() == 1 || n.saturating_mul(work_per_item.max(1)) < SERIAL_WORK {
            (0..n).map(f).collect()
        } else {
            self.install(|| (0..n).into_par_iter().map(f).collect())
        }
    }
}

/// A raw pointer that may cross threads; for kernels whose tasks write disjoint ranges
/// of one output (the caller proves disjointness at the use site).
#[derive(Clone, Copy)]
pub struct SharedMut<T>(pub *mut T);
// SAFETY: only used to write disjoint index ranges from different tasks.
unsafe impl<T> Send for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// A mutable slice `[start, start + len)` of the buffer.
    ///
    /// # Safety
    /// The range must be in bounds and no other live slice may overlap it.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        // SAFETY: guaranteed by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}
