//! Pinning the pool's worker threads to distinct CPUs (Linux; elsewhere nothing is pinned).
//!
//! Why: a worker that has gone to sleep while the calling thread ran serial work is, when the
//! next parallel op wakes it, placed by the scheduler beside the thread that woke it
//! (wake-affine), so the pool's workers can start an op stacked on one CPU until the load
//! balancer moves one of them (milliseconds later). Measured on 2 vCPUs, attention forward +
//! backward at B4 H12 T256 on the 2-thread pool, alternating with 1-thread calls on the
//! caller: median 13.4–17.0 ms unpinned, 10.8–12.6 ms pinned (five runs each); called back to
//! back with no serial work between, both measure the same.
//!
//! Worker `i` is pinned to the `i`-th CPU of the process's affinity mask, so `taskset` and
//! cpusets are respected, and only when the pool has exactly one worker per CPU of the mask:
//! a smaller pool is left free to move, so that several processes with a few threads each
//! (four 4-thread backends on 16 cores, say) are not all pinned onto the same CPUs.
//! `CpuBackendBuilder::pin_threads(false)` leaves the workers unpinned. The same plan pins
//! the fork-join team's helpers (`team`): helper `i` to the `i`-th CPU, the first left to
//! the caller.

/// The CPUs the workers of a `threads`-worker pool are pinned to, or `None` when they are
/// not pinned (a pool that does not span the affinity mask one worker per CPU, or no
/// affinity API here).
pub(crate) fn plan(threads: usize) -> Option<Vec<usize>> {
    let cpus = allowed_cpus()?;
    (threads == cpus.len()).then_some(cpus)
}

/// The CPUs the calling thread may run on.
#[cfg(target_os = "linux")]
fn allowed_cpus() -> Option<Vec<usize>> {
    // SAFETY: `set` is a plain bit set, zeroed and then filled by the kernel; the size
    // passed is its own.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        Some((0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
    }
}

#[cfg(not(target_os = "linux"))]
fn allowed_cpus() -> Option<Vec<usize>> {
    None
}

/// Pins the calling thread to `cpu`; a failure (a CPU gone offline since) leaves it unpinned.
#[cfg(target_os = "linux")]
pub(crate) fn pin_current_thread(cpu: usize) {
    // SAFETY: as above; `cpu` < CPU_SETSIZE (it came from `allowed_cpus`).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn pin_current_thread(_cpu: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_only_a_pool_that_spans_the_allowed_cpus() {
        let Some(cpus) = allowed_cpus() else { return };
        assert!(!cpus.is_empty());
        assert_eq!(plan(cpus.len() + 1), None);
        if cpus.len() > 1 {
            assert_eq!(plan(cpus.len() - 1), None, "a pool smaller than the mask stays free to move");
        }
        assert_eq!(plan(cpus.len()), Some(cpus.clone()));
    }
}
