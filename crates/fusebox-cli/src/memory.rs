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

/// `bytes` in GiB with two decimals.
pub(crate) fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}
