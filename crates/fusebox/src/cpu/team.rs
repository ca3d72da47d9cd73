//! A fork-join team for the flat parallel loops: the calling thread and `threads − 1`
//! helper threads that spin between loops, so a loop starts and ends in about a
//! microsecond instead of a futex round trip.
//!
//! Why not the rayon pool alone: a loop submitted to a rayon pool from a thread outside
//! it is injected into the pool and the caller sleeps on a futex until the pool is done.
//! Waking a sleeping thread takes a futex wake and, in a VM, an inter-processor
//! interrupt: tens of microseconds, against about one for a team whose helpers spin
//! (docs/performance.md, "Threads", has the measurements).
//!
//! How: [`Team::run`] publishes a job (the loop body and its index count) and bumps an
//! epoch; helpers spinning on the epoch pick it up. Every participant, the caller
//! included, claims runs of indices from one counter (guided: a claim takes
//! `remaining / (2·participants)` indices, at least one), so a helper that starts late
//! (asleep, or descheduled) only finds less to do, and the caller never waits for a
//! helper that has not started. The caller returns when every index has finished.
//! Helpers spin for the backend's spin time (default [`SPIN`]) after their last job, then
//! park until the next one; they park at once when the rayon pool is about to run (`rest`),
//! so they do not take CPU time from its workers (gemm runs there).
//!
//! Which index runs where never changes a result: each index writes its own outputs, as
//! with the rayon loops before (bit-identical run to run).
//!
//! Hazard: the loop body borrows the caller's stack, and helpers see it through a
//! lifetime-erased pointer. It is dereferenced only for a claimed index below the count,
//! and the caller does not return (or unwind) before all claimed indices have finished,
//! so no helper can touch it afterwards: a late helper's claims are all past the count.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::affinity;
use super::simd::{self, Isa};

/// How long a helper spins after its last job before it parks, by default. Long enough
/// to cover the serial work between two ops of a training or decoding step; short enough
/// that an idle backend stops burning its CPUs at once. `CpuBackendBuilder::spin_time`
/// sets it per backend (0: park at once, for a process that shares its CPUs with other
/// busy work).
pub const SPIN: Duration = Duration::from_micros(300);

thread_local! {
    /// Set on helper threads, and on the caller while it runs a job: a loop started
    /// there runs serially (the team is already busy with the outer loop).
    static IN_TEAM: Cell<bool> = const { Cell::new(false) };
}

/// True on a team helper, or on a caller inside [`Team::run`].
pub fn in_team() -> bool {
    IN_TEAM.with(Cell::get)
}

/// One parallel loop: `body(i)` for `i in 0..n`.
struct Job {
    /// The loop body, lifetime erased (see the module's hazard).
    body: *const (dyn Fn(usize) + Sync),
    n: usize,
    participants: usize,
    /// The next unclaimed index.
    next: AtomicUsize,
    /// Indices finished (run, or skipped after a panic).
    done: AtomicUsize,
    /// Set by the first panicking index: the rest are skipped.
    panicked: AtomicBool,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `body` is `Sync` and is only called while the caller keeps it alive (see the
// module's hazard); everything else is atomics and a mutex.
unsafe impl Send for Job {}
// SAFETY: as above.
unsafe impl Sync for Job {}

impl Job {
    /// Claims runs of indices until none is left, running each (unless a panic was seen).
    fn work(&self) {
        loop {
            let mut start = self.next.load(Ordering::Relaxed);
            let end = loop {
                if start >= self.n {
                    return;
                }
                let take = ((self.n - start) / (2 * self.participants)).max(1);
                match self.next.compare_exchange_weak(start, start + take, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => break start + take,
                    Err(now) => start = now,
                }
            };
            if !self.panicked.load(Ordering::Relaxed) {
                // SAFETY: `start..end` is claimed and below `n`, so the caller is still
                // inside `Team::run` and `body` is alive.
                let body = unsafe { &*self.body };
                if let Err(p) = catch_unwind(AssertUnwindSafe(|| (start..end).for_each(body))) {
                    self.panicked.store(true, Ordering::Relaxed);
                    self.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(p);
                }
            }
            // Release: the run's writes happen before the caller sees it done.
            self.done.fetch_add(end - start, Ordering::Release);
        }
    }

    fn finished(&self) -> bool {
        self.done.load(Ordering::Acquire) >= self.n
    }
}

/// What the caller and the helpers share.
struct Shared {
    /// Bumped for every job; helpers spin on it.
    epoch: AtomicU64,
    job: Mutex<Option<Arc<Job>>>,
    /// Park now instead of spinning (the rayon pool is about to run).
    rest: AtomicBool,
    shutdown: AtomicBool,
    /// Busy-wait with `spin_loop`; false when the team has more threads than the process
    /// has CPUs, where a spinning thread would take the CPU from one still working, so
    /// waiting threads yield instead.
    spin: bool,
    /// How long helpers spin after a job before parking (the backend's spin time).
    spin_for: Duration,
    /// The ISA every participant's kernels run with (the backend's).
    isa: Isa,
    /// Per helper: parked (or about to park) and waiting for an unpark.
    parked: Vec<AtomicBool>,
}

/// The caller plus `threads − 1` spinning helpers (see the module docs).
pub struct Team {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
    /// Held by the one caller running a job; a second caller at the same time (another
    /// thread sharing the backend) is told to use the rayon pool instead.
    busy: Mutex<()>,
    /// Jobs run so far (see [`Team::jobs`]).
    jobs: AtomicU64,
}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Team").field("helpers", &self.helpers.len()).finish()
    }
}

impl Team {
    /// A team of `threads` participants: the caller and `threads − 1` helpers, helper
    /// `i` pinned to `cpus[i]` when given (worker 0's CPU is left to the caller), each
    /// holding `isa` for its kernels (see `simd`) and spinning for `spin_for` when idle.
    pub fn new(threads: usize, cpus: Option<Vec<usize>>, isa: Isa, spin_for: Duration) -> std::io::Result<Team> {
        let helpers = threads.saturating_sub(1);
        let shared = Team::shared(threads, isa, spin_for);
        let mut handles = Vec::with_capacity(helpers);
        for h in 0..helpers {
            let (mine, cpu) = (Arc::clone(&shared), cpus.as_ref().map(|c| c[h + 1]));
            let spawned = std::thread::Builder::new().name(format!("fusebox-team-{}", h + 1)).spawn(move || {
                simd::hold_isa(isa);
                if let Some(cpu) = cpu {
                    affinity::pin_current_thread(cpu);
                }
                helper_loop(&mine, h);
            });
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    // Stop the helpers already started before reporting.
                    drop(Team { shared, helpers: handles, busy: Mutex::new(()), jobs: AtomicU64::new(0) });
                    return Err(e);
                }
            }
        }
        Ok(Team { shared, helpers: handles, busy: Mutex::new(()), jobs: AtomicU64::new(0) })
    }

    /// A team of the caller alone running `isa` (no helper; starts no thread, so it
    /// cannot fail).
    pub fn solo(isa: Isa) -> Team {
        Team { shared: Team::shared(1, isa, SPIN), helpers: Vec::new(), busy: Mutex::new(()), jobs: AtomicU64::new(0) }
    }

    /// The state shared by a team of `threads` participants.
    fn shared(threads: usize, isa: Isa, spin_for: Duration) -> Arc<Shared> {
        Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: Mutex::new(None),
            rest: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            spin: std::thread::available_parallelism().is_ok_and(|cpus| threads <= cpus.get()),
            spin_for,
            isa,
            parked: (0..threads.saturating_sub(1)).map(|_| AtomicBool::new(false)).collect(),
        })
    }

    /// Runs `body(i)` for `i in 0..n` on the caller and the helpers, returning once all
    /// have finished (a panic in any index is resumed here, after the rest finished or
    /// were skipped). Returns `false`, having run nothing, when another thread is running
    /// a job on this team right now.
    pub fn run(&self, n: usize, body: &(dyn Fn(usize) + Sync)) -> bool {
        let _busy = match self.busy.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock) => return false,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
        };
        self.jobs.fetch_add(1, Ordering::Relaxed);
        // SAFETY (lifetime erasure): see the module's hazard; we wait below for every
        // claimed index before returning or unwinding.
        let body: *const (dyn Fn(usize) + Sync + '_) = body;
        let body: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(body) };
        let job = Arc::new(Job {
            body,
            n,
            participants: self.helpers.len() + 1,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            panic: Mutex::new(None),
        });
        let s = &*self.shared;
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(&job));
        s.rest.store(false, Ordering::Relaxed);
        // SeqCst pairs with the helper's store to `parked` and reload of `epoch`: either
        // it sees the new epoch, or we see it parked and unpark it.
        s.epoch.fetch_add(1, Ordering::SeqCst);
        for (parked, helper) in s.parked.iter().zip(&self.helpers) {
            if parked.load(Ordering::SeqCst) && parked.swap(false, Ordering::SeqCst) {
                helper.thread().unpark();
            }
        }
        IN_TEAM.with(|t| t.set(true));
        {
            // The caller's share runs with the team's ISA too (the trait's methods hold it
            // already; a direct kernel call may not).
            let _isa = simd::IsaGuard::enter(s.isa);
            job.work();
        }
        IN_TEAM.with(|t| t.set(false));
        wait_until(s.spin, s.spin_for, || job.finished());
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let panic = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = panic {
            resume_unwind(p);
        }
        true
    }

    /// How many jobs [`run`](Self::run) has run (each one fork-join of the team).
    pub fn jobs(&self) -> u64 {
        self.jobs.load(Ordering::Relaxed)
    }

    /// Tells spinning helpers to park now (before other threads, such as the rayon
    /// pool's, take the CPUs); the next job wakes them.
    pub fn rest(&self) {
        self.shared.rest.store(true, Ordering::Relaxed);
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for helper in self.helpers.drain(..) {
            helper.thread().unpark();
            let _ = helper.join();
        }
    }
}

/// A helper: spin on the epoch, run each new job, park when idle for `spin_for`.
fn helper_loop(s: &Shared, h: usize) {
    IN_TEAM.with(|t| t.set(true));
    let mut seen = 0;
    loop {
        let mut idle_since = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.shutdown.load(Ordering::Relaxed) {
                return;
            }
            let epoch = s.epoch.load(Ordering::Acquire);
            if epoch != seen {
                seen = epoch;
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) && (s.rest.load(Ordering::Relaxed) || idle_since.elapsed() >= s.spin_for) {
                s.parked[h].store(true, Ordering::SeqCst);
                if s.epoch.load(Ordering::SeqCst) == seen && !s.shutdown.load(Ordering::SeqCst) {
                    std::thread::park();
                }
                s.parked[h].store(false, Ordering::SeqCst);
                idle_since = Instant::now();
            }
            pause(s.spin);
        }
        let job = s.job.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(job) = job {
            job.work();
        }
    }
}

/// Waits for `cond`: spins (when `spin`) for up to `spin_for`, then yields between
/// checks (a participant still running may share this CPU).
fn wait_until(spin: bool, spin_for: Duration, cond: impl Fn() -> bool) {
    let start = Instant::now();
    let (mut spins, mut yielding) = (0u32, !spin);
    while !cond() {
        spins = spins.wrapping_add(1);
        yielding = yielding || (spins.is_multiple_of(64) && start.elapsed() >= spin_for);
        pause(!yielding);
    }
}

/// One step of a busy wait: a `pause` when spinning, else a yield to other threads.
fn pause(spin: bool) {
    if spin {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_runs_exactly_once() {
        let team = Team::new(3, None, Isa::detected(), SPIN).unwrap();
        for n in [0, 1, 2, 5, 100, if cfg!(miri) { 300 } else { 10_007 }] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            assert!(team.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            }));
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n = {n}");
        }
    }

    #[test]
    fn the_body_runs_inside_the_team() {
        let team = Team::new(2, None, Isa::detected(), SPIN).unwrap();
        let inner_ran_in_team = AtomicUsize::new(0);
        team.run(4, &|_| {
            if in_team() {
                inner_ran_in_team.fetch_add(1, Ordering::Relaxed);
            }
        });
        assert_eq!(inner_ran_in_team.load(Ordering::Relaxed), 4);
        assert!(!in_team(), "the caller leaves the team when the job ends");
    }

    #[test]
    fn a_panic_reaches_the_caller_after_the_loop_ends() {
        let team = Team::new(2, None, Isa::detected(), SPIN).unwrap();
        let ran = AtomicUsize::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            team.run(1000, &|i| {
                ran.fetch_add(1, Ordering::Relaxed);
                if i == 500 {
                    panic!("index 500");
                }
            })
        }));
        let message = result.unwrap_err();
        assert_eq!(message.downcast_ref::<&str>(), Some(&"index 500"));
        // The team is usable again, and the caller is not left marked as inside it.
        assert!(!in_team());
        let count = AtomicUsize::new(0);
        team.run(10, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 10);
    }

    /// Helpers and the caller's share of a job run with the team's ISA, and the caller
    /// gets its own back afterwards.
    #[test]
    fn every_participant_runs_the_team_isa() {
        let team = Team::new(3, None, Isa::Scalar, SPIN).unwrap();
        let seen: Vec<Mutex<Option<Isa>>> = (0..64).map(|_| Mutex::new(None)).collect();
        team.run(64, &|i| {
            std::thread::sleep(Duration::from_micros(50));
            *seen[i].lock().unwrap() = Some(Isa::active());
        });
        assert!(seen.iter().all(|s| *s.lock().unwrap() == Some(Isa::Scalar)));
        assert_eq!(Isa::active(), Isa::detected());
    }

    /// Each index writes its own slot from whichever thread claims it, and the caller
    /// reads every slot after `run` returns: the completion count's release/acquire
    /// orders the helpers' writes before those reads (under Miri, `scripts/miri.sh`, the
    /// race detector checks it, and the borrow checks cover the lifetime-erased body).
    #[test]
    fn helper_writes_are_visible_to_the_caller_after_run() {
        struct Slots(*mut usize);
        // SAFETY: every index writes only its own slot, and the vector outlives the loop.
        unsafe impl Sync for Slots {}
        impl Slots {
            /// # Safety
            /// `i` is in bounds and no other thread touches slot `i` meanwhile.
            unsafe fn write(&self, i: usize, value: usize) {
                // SAFETY: the caller's contract.
                unsafe { *self.0.add(i) = value };
            }
        }
        let team = Team::new(3, None, Isa::detected(), SPIN).unwrap();
        for round in 0..3 {
            let mut v = vec![0usize; 37];
            let slots = Slots(v.as_mut_ptr());
            assert!(team.run(37, &|i| {
                // SAFETY: i < 37 = v.len(), and no other index writes slot i.
                unsafe { slots.write(i, i * round + 1) };
            }));
            assert!(v.iter().enumerate().all(|(i, &x)| x == i * round + 1), "round {round}: {v:?}");
        }
    }

    #[test]
    fn helpers_wake_from_park() {
        let team = Team::new(2, None, Isa::detected(), SPIN).unwrap();
        for _ in 0..3 {
            std::thread::sleep(SPIN * 3);
            let count = AtomicUsize::new(0);
            team.run(64, &|_| {
                count.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(count.load(Ordering::Relaxed), 64);
        }
    }
}
