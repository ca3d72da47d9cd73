//! What the machine and this process hold in memory (Linux `/proc`), for the checks that
//! refuse a run that cannot fit and for the figures runs report.

/// Bytes the OS says a new process can still use (Linux `MemAvailable`); `None` where unknown.
pub(crate) fn available_memory() -> Option<u64> {
    proc_kib("/proc/meminfo", "MemAvailable:")
}

/// The process's peak resident memory (Linux `VmHWM`); `None` where unknown.
pub(crate) fn peak_rss() -> Option<u64> {
    proc_kib("/proc/self/status", "VmHWM:")
}

/// The process's resident memory now (Linux `VmRSS`); `None` where unknown.
pub(crate) fn current_rss() -> Option<u64> {
    proc_kib("/proc/self/status", "VmRSS:")
}

/// The value in bytes of the line starting with `key` in a `/proc` file of `key  N kB` lines.
fn proc_kib(file: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Lets the allocator's cache of freed blocks ([`fusebox::host_cache`]) hold what a
/// training step allocates and frees again (`bytes`: the estimate of its activations,
/// logits and the backward's transients), so the next step reuses those blocks instead
/// of having the kernel fault in and clear fresh pages. Twice the estimate, which leaves
/// out the kernels' own scratch (packed operands, transposes); at least the cache's
/// default, at most half the memory available.
pub(crate) fn cache_step_buffers(bytes: u64) {
    let bytes = bytes.saturating_mul(2);
    let cap = available_memory().map_or(bytes, |a| bytes.min(a / 2));
    let cap = usize::try_from(cap).unwrap_or(usize::MAX).max(fusebox::host_cache::capacity());
    fusebox::host_cache::set_capacity(cap);
}

/// `bytes` in GiB with two decimals.
pub(crate) fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}
