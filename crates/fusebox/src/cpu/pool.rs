//! Parallel loops inside a `CpuBackend`. Work is split into fixed chunks by index, so
//! the result never depends on scheduling (bit-identical run to run).
//!
//! A loop started on a thread outside the backend runs on its [`Team`](super::team::Team)
//! (the caller and spinning helpers: a microsecond to start, see `team`). One started
//! inside a team job runs serially, as the team is busy with the outer loop; one started
//! on a worker of the rayon pool (inside [`CpuBackend::install`], or while another thread
//! holds the team) runs on the rayon pool.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::team::in_team;
use super::CpuBackend;

/// Below this many elements of work a loop runs on the calling thread: spawning
/// costs more than it saves.
pub const SERIAL_WORK: usize = 1 << 15;

/// Where a parallel loop runs.
enum Place {
    Serial,
    Team,
    Rayon,
}

impl CpuBackend {
    /// Where a loop of `items` indices and `work` elements of work in all runs.
    fn place(&self, items: usize, work: usize) -> Place {
        if self.threads() == 1 || items <= 1 || work < SERIAL_WORK || in_team() {
            Place::Serial
        } else if self.on_pool_worker() {
            Place::Rayon
        } else {
            Place::Team
        }
    }

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
        let (len, chunks) = (data.len(), data.len().div_ceil(chunk_len));
        let rayon =
            |data: &mut [T]| self.install(|| data.par_chunks_mut(chunk_len).enumerate().for_each(|(i, c)| f(i, c)));
        match self.place(chunks, len.saturating_mul(work_per_elem.max(1))) {
            Place::Serial => data.chunks_mut(chunk_len).enumerate().for_each(|(i, c)| f(i, c)),
            Place::Rayon => rayon(data),
            Place::Team => {
                let base = SharedMut(data.as_mut_ptr());
                let body = |i: usize| {
                    let start = i * chunk_len;
                    // SAFETY: chunk `i` is in bounds, and each index runs once, so the
                    // chunks handed out never overlap.
                    f(i, unsafe { base.slice(start, chunk_len.min(len - start)) })
                };
                if !self.team.run(chunks, &body) {
                    rayon(data);
                }
            }
        }
    }

    /// Calls `f(i)` for `i in 0..n`, in parallel when `n · work_per_item` is large.
    pub fn for_each_index(&self, n: usize, work_per_item: usize, f: impl Fn(usize) + Sync + Send) {
        match self.place(n, n.saturating_mul(work_per_item.max(1))) {
            Place::Serial => (0..n).for_each(f),
            Place::Team if self.team.run(n, &f) => {}
            Place::Team | Place::Rayon => self.install(|| (0..n).into_par_iter().for_each(f)),
        }
    }

    /// `f(i)` for `i in 0..n`, collected in order; parallel when the work is large.
    pub fn map_indices<R: Send>(&self, n: usize, work_per_item: usize, f: impl Fn(usize) -> R + Sync + Send) -> Vec<R> {
        match self.place(n, n.saturating_mul(work_per_item.max(1))) {
            Place::Serial => (0..n).map(f).collect(),
            Place::Rayon => self.install(|| (0..n).into_par_iter().map(f).collect()),
            Place::Team => {
                let mut out: Vec<R> = Vec::with_capacity(n);
                let slots = SharedMut(out.spare_capacity_mut().as_mut_ptr());
                let body = |i: usize| {
                    // SAFETY: each index runs once and writes its own slot.
                    let slot: &mut [MaybeUninit<R>] = unsafe { slots.slice(i, 1) };
                    slot[0].write(f(i));
                };
                if !self.team.run(n, &body) {
                    return self.install(|| (0..n).into_par_iter().map(f).collect());
                }
                // SAFETY: `run` returned normally, so every one of the `n` slots was
                // written (a panicking index unwinds out of `run`, leaking the written ones).
                unsafe { out.set_len(n) };
                out
            }
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
    /// The pointer (a method, so closures capture the `Sync` wrapper, not the field).
    pub fn ptr(self) -> *mut T {
        self.0
    }

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
