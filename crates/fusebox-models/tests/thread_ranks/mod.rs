//! Thread ranks for data-parallel tests: one process, one communicator per thread, the
//! collectives through shared memory, summed in rank order as MPI sums two ranks.

use std::sync::{Arc, Barrier, Mutex};

use fusebox::Result;
use fusebox_models::comm::{Communicator, PendingAllReduce, ReduceOp};

/// The memory the thread ranks of one world share.
#[derive(Debug)]
struct Shared {
    barrier: Barrier,
    slots: Mutex<Vec<Vec<f32>>>,
}

/// One thread rank.
#[derive(Debug)]
struct ThreadRank {
    rank: usize,
    shared: Arc<Shared>,
}

impl ThreadRank {
    /// Every rank's `mine`, in rank order.
    fn exchange(&self, mine: &[f32]) -> Vec<Vec<f32>> {
        self.shared.slots.lock().unwrap()[self.rank] = mine.to_vec();
        self.shared.barrier.wait();
        let all = self.shared.slots.lock().unwrap().clone();
        // Nobody writes the slots again before everyone has read them.
        self.shared.barrier.wait();
        all
    }
}

/// A reduction that finished before its handle was made.
struct Finished(Vec<f32>);

impl PendingAllReduce for Finished {
    fn test(&mut self) -> Result<bool> {
        Ok(true)
    }
    fn wait(self: Box<Self>) -> Result<Vec<f32>> {
        Ok(self.0)
    }
}

impl Communicator for ThreadRank {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.shared.slots.lock().unwrap().len()
    }
    fn all_reduce(&self, buf: &mut [f32], op: ReduceOp) -> Result<()> {
        let all = self.exchange(buf);
        for (i, x) in buf.iter_mut().enumerate() {
            *x = all[1..].iter().fold(all[0][i], |acc, r| if op == ReduceOp::Max { acc.max(r[i]) } else { acc + r[i] });
            if op == ReduceOp::Average {
                *x *= 1.0 / all.len() as f32;
            }
        }
        Ok(())
    }
    fn start_all_reduce(&self, mut buf: Vec<f32>, op: ReduceOp) -> Result<Box<dyn PendingAllReduce>> {
        self.all_reduce(&mut buf, op)?;
        Ok(Box::new(Finished(buf)))
    }
    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()> {
        let all = self.exchange(buf);
        buf.copy_from_slice(&all[root]);
        Ok(())
    }
    fn barrier(&self) -> Result<()> {
        self.shared.barrier.wait();
        Ok(())
    }
    // reduce_scatter and all_gather: the trait's defaults over this all-reduce.
}

/// Runs `f(rank's communicator)` on `world` thread ranks and returns what each returned.
pub fn on_ranks<T: Send>(world: usize, f: impl Fn(Arc<dyn Communicator>) -> T + Sync) -> Vec<T> {
    let shared = Arc::new(Shared { barrier: Barrier::new(world), slots: Mutex::new(vec![Vec::new(); world]) });
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let comm: Arc<dyn Communicator> = Arc::new(ThreadRank { rank, shared: shared.clone() });
                let f = &f;
                s.spawn(move || f(comm))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
