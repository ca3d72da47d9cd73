//! Measurement: median timings, the machine's sgemm peak and memory bandwidth measured
//! in the same run, peak RSS, and a table/JSON printer shared by every `bench` subcommand.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use fusebox::{ComputeBackend, CpuBackend, DType, Error, Result, Tensor};
use serde_json::{Map, Value};

/// How long and how often a case is repeated.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Untimed calls first.
    pub warmup: usize,
    /// Repeat until this much time was measured ...
    pub min_time: Duration,
    /// ... and at least this many reps ...
    pub min_reps: usize,
    /// ... but never more than this many.
    pub max_reps: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Budget { warmup: 1, min_time: Duration::from_millis(300), min_reps: 3, max_reps: 1000 }
    }
}

/// Timings of one case: the median is what is reported.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub median_s: f64,
    pub min_s: f64,
    pub reps: usize,
}

impl Timing {
    pub fn ms(&self) -> f64 {
        self.median_s * 1e3
    }
}

/// Runs `f` `budget.warmup` times, then repeats it until `min_time` and `min_reps` are
/// both reached (or `max_reps`), and returns the median wall time of one call.
pub fn time(budget: Budget, mut f: impl FnMut() -> Result<()>) -> Result<Timing> {
    Ok(timing_of(&time_interleaved(budget, 1, |_| {}, |_| f())?[0]))
}

/// Interleaved timing of `n` calls that are compared with each other: every rep calls
/// `f(0)`, `f(1)`, … `f(n − 1)` once each, timing each call, after `budget.warmup` untimed
/// rounds; reps continue until `min_time` (all calls together) and `min_reps`, or
/// `max_reps`. Returns the times per call, rep by rep. On a machine shared with other
/// work the speed drifts by tens of percent within seconds; calls timed side by side see
/// the same state, so per-rep ratios ([`median_ratio`]) are far steadier than ratios of
/// separately measured medians. `before(k)` runs untimed before every call `f(k)` (see
/// [`wake`]).
pub fn time_interleaved(
    budget: Budget,
    n: usize,
    mut before: impl FnMut(usize),
    mut f: impl FnMut(usize) -> Result<()>,
) -> Result<Vec<Vec<f64>>> {
    for _ in 0..budget.warmup {
        for k in 0..n {
            before(k);
            f(k)?;
        }
    }
    let mut times = vec![Vec::new(); n];
    let start = Instant::now();
    let mut reps = 0;
    while reps < budget.max_reps.max(1) && (reps < budget.min_reps.max(1) || start.elapsed() < budget.min_time) {
        for (k, t) in times.iter_mut().enumerate() {
            before(k);
            let s = Instant::now();
            f(k)?;
            t.push(s.elapsed().as_secs_f64());
        }
        reps += 1;
    }
    Ok(times)
}

/// Wakes the backend's helper threads, untimed, so that the call timed next finds them
/// spinning, as an op does that follows another in a model. Interleaved with 1-thread
/// calls (the speedup columns), the helpers park between reps, so the N-thread op paid
/// their wake-up inside its timed call while the copy timed right after it did not.
/// (What waking costs is measured on its own by `cargo bench -p fusebox --bench
/// dispatch`.)
pub fn wake(cpu: &CpuBackend) {
    if cpu.threads() > 1 {
        // One index per thread, each long enough that every helper takes one.
        cpu.for_each_index(cpu.threads(), 1 << 20, |_| std::thread::sleep(Duration::from_micros(100)));
    }
}

/// Median and fastest of a set of call times.
pub fn timing_of(times: &[f64]) -> Timing {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    Timing { median_s: sorted[sorted.len() / 2], min_s: sorted[0], reps: sorted.len() }
}

/// The median over reps of `a[i] / b[i]`.
pub fn median_ratio(a: &[f64], b: &[f64]) -> f64 {
    let mut r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    r.sort_by(f64::total_cmp);
    r[r.len() / 2]
}

/// Runs `f`, turning a panic (a kernel that is not written yet, say) into an error, so one
/// missing kernel does not end the whole bench. The panic message is not printed.
pub fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    match r {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into());
            Err(Error::unsupported("bench", format!("{what} panicked: {msg}")))
        }
    }
}

/// A deterministic pseudo-random f32 tensor, values in `[-scale, scale)`, 64-byte
/// aligned as the outputs of ops are (so the bench's inputs are what a model's ops read).
pub fn random(shape: &[usize], seed: u64, scale: f32) -> Result<Tensor> {
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| Error::value("bench", "tensor size", "fewer than usize::MAX elements", format!("{shape:?}")))?;
    let mut data: Vec<f32> = Vec::new();
    data.try_reserve_exact(n).map_err(|_| {
        Error::value("bench", "tensor size", "memory for the input", format!("{shape:?} f32 refused by the allocator"))
    })?;
    let mut rng = fusebox::rng::Rng::new(seed);
    data.extend((0..n).map(|_| (rng.uniform() * 2.0 - 1.0) * scale));
    Tensor::from_slice(&data, shape.to_vec())
}

/// Uniform ids in `0..bound`, U32.
pub fn random_ids(n: usize, bound: u32, seed: u64) -> Result<Tensor> {
    let mut rng = fusebox::rng::Rng::new(seed);
    let ids: Vec<u32> = (0..n).map(|_| rng.below(bound as usize) as u32).collect();
    Tensor::from_vec(ids, [n])
}

/// Best sgemm GFLOP/s of the backend's own `matmul` at `n`³ (f32, no transposes).
///
/// The peak reference uses the fastest call, not the median: on a machine that other work
/// shares, the best call is the closest to what the hardware can do, so "% of peak" stays
/// conservative. (Bandwidth references are timed beside their op instead, [`Bandwidth`].)
pub fn sgemm_gflops(cpu: &CpuBackend, n: usize, budget: Budget) -> Result<f64> {
    let a = random(&[n, n], 11, 1.0)?;
    let b = random(&[n, n], 12, 1.0)?;
    let t = guarded("matmul", || time(budget, || cpu.matmul(&a, &b, false, false).map(drop)))?;
    Ok(2.0 * (n as f64).powi(3) / t.min_s / 1e9)
}

/// Sum of a slice with 32 independent lanes, so it vectorizes without fast-math and
/// is bound by the loads.
fn sum_lanes(x: &[f32]) -> f32 {
    let mut acc = [0f32; 32];
    let mut chunks = x.chunks_exact(32);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += *v;
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

/// The block each worker reads or copies: large enough that the split costs nothing.
const BLOCK: usize = 64 * 1024;

/// A memory bandwidth reference, called beside the op it is compared with
/// ([`time_interleaved`]): its buffers are made once, as tensors, so they live in the
/// same kind of memory as the weights and activations they are compared with (host
/// tensors of 4 MiB and more ask for transparent huge pages).
pub enum Bandwidth {
    /// A vectorized sum over the buffer (bytes read).
    Read { x: Tensor, sink: f32 },
    /// A copy between two buffers (bytes read + bytes written).
    Copy { src: Tensor, dst: Tensor },
}

/// `n` f32 ones (`0` when `zero`) in a host tensor.
fn filled(n: usize, zero: bool) -> Result<Tensor> {
    let mut t = Tensor::zeros([n], DType::F32)?;
    if !zero {
        t.as_mut_slice::<f32>()?.fill(1.0);
    }
    Ok(t)
}

impl Bandwidth {
    /// Reads `bytes` of f32.
    pub fn read(bytes: usize) -> Result<Bandwidth> {
        Ok(Bandwidth::Read { x: filled((bytes / 4).max(BLOCK), false)?, sink: 0.0 })
    }

    /// Copies between two buffers that together hold `bytes`.
    pub fn copy(bytes: usize) -> Result<Bandwidth> {
        let n = (bytes / 8).max(BLOCK);
        Ok(Bandwidth::Copy { src: filled(n, false)?, dst: filled(n, true)? })
    }

    /// Bytes one call moves.
    pub fn bytes(&self) -> usize {
        match self {
            Bandwidth::Read { x, .. } => x.elem_count() * 4,
            Bandwidth::Copy { src, .. } => src.elem_count() * 8,
        }
    }

    /// One pass, on the backend's threads (fails only if the buffers were not the host
    /// f32 tensors [`read`](Self::read) and [`copy`](Self::copy) make).
    pub fn run(&mut self, cpu: &CpuBackend) -> Result<()> {
        match self {
            Bandwidth::Read { x, sink } => {
                let x = x.as_slice::<f32>()?;
                let blocks = x.len().div_ceil(BLOCK);
                let part = |i: usize| sum_lanes(&x[i * BLOCK..((i + 1) * BLOCK).min(x.len())]);
                *sink += cpu.map_indices(blocks, BLOCK, part).iter().sum::<f32>();
                std::hint::black_box(sink);
            }
            Bandwidth::Copy { src, dst } => {
                let src = src.as_slice::<f32>()?;
                let dst = dst.as_mut_slice::<f32>()?;
                cpu.for_each_chunk(dst, BLOCK, 1, |i, d| d.copy_from_slice(&src[i * BLOCK..i * BLOCK + d.len()]));
                std::hint::black_box(dst);
            }
        }
        Ok(())
    }
}

/// `VmHWM` and `VmRSS` from `/proc/self/status`, in bytes (Linux only).
pub fn rss() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    };
    Some((field("VmHWM:")?, field("VmRSS:")?))
}

/// Resets the peak RSS (`VmHWM`) to the current RSS; false where the kernel refuses.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// One row of output: a name, then ordered fields. Printed as a table row or one JSON
/// object per line.
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub fields: Map<String, Value>,
}

impl Row {
    pub fn new(name: impl Into<String>) -> Row {
        let mut r = Row::default();
        r.fields.insert("name".into(), Value::from(name.into()));
        r
    }

    pub fn set(mut self, key: &str, v: impl Into<Value>) -> Row {
        self.fields.insert(key.into(), v.into());
        self
    }

    pub fn set_opt(self, key: &str, v: Option<f64>) -> Row {
        match v {
            Some(v) => self.set(key, round(v)),
            None => self,
        }
    }

    pub fn json(&self) -> String {
        Value::Object(self.fields.clone()).to_string()
    }
}

/// Four significant decimals are plenty for timings and rates.
pub fn round(v: f64) -> f64 {
    if !v.is_finite() || v == 0.0 {
        return v;
    }
    let digits = 4 - v.abs().log10().ceil() as i32;
    let p = 10f64.powi(digits.clamp(0, 12));
    (v * p).round() / p
}

/// Prints rows as an aligned table: `columns` are `(header, json key)`; a missing key
/// prints `-`.
pub fn print_table(columns: &[(&str, &str)], rows: &[Row]) {
    let cell = |r: &Row, key: &str| -> String {
        match r.fields.get(key) {
            None | Some(Value::Null) => "-".into(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => {
                let v = n.as_f64().unwrap_or(0.0);
                if n.is_u64() || n.is_i64() {
                    format!("{v}")
                } else if v.abs() >= 100.0 {
                    format!("{v:.0}")
                } else if v.abs() >= 10.0 {
                    format!("{v:.1}")
                } else if v.abs() >= 1.0 {
                    format!("{v:.2}")
                } else {
                    format!("{v:.3}")
                }
            }
            Some(v) => v.to_string(),
        }
    };
    let cells: Vec<Vec<String>> = rows.iter().map(|r| columns.iter().map(|(_, k)| cell(r, k)).collect()).collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, (h, _))| cells.iter().map(|c| c[i].chars().count()).chain([h.chars().count()]).max().unwrap_or(0))
        .collect();
    let line = |items: Vec<String>| {
        let parts: Vec<String> = items
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let pad = widths[i] - s.chars().count();
                if i == 0 {
                    format!("{s}{}", " ".repeat(pad))
                } else {
                    format!("{}{s}", " ".repeat(pad))
                }
            })
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(columns.iter().map(|(h, _)| h.to_string()).collect());
    for c in cells {
        line(c);
    }
}

/// Prints rows: JSON lines, or a table with `columns`.
pub fn emit(json: bool, columns: &[(&str, &str)], rows: &[Row]) {
    if json {
        for r in rows {
            println!("{}", r.json());
        }
    } else {
        print_table(columns, rows);
    }
}

/// The backend for `--threads N` (default: `FUSEBOX_THREADS`, else every available core),
/// with the environment's other settings (see `fusebox --help`).
pub fn cpu_backend(threads: Option<usize>) -> Result<CpuBackend> {
    crate::backends::cpu(threads)
}

/// `(machine, isa)`: the CPU model name from `/proc/cpuinfo` and the ISA our kernels use.
pub fn machine(cpu: &CpuBackend) -> (String, String) {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    (model, format!("{:?}", cpu.isa()))
}

/// The header line printed above human tables.
pub fn header(cpu: &CpuBackend, extra: &str) -> String {
    let (model, isa) = machine(cpu);
    format!("# {model}, ISA {isa}, {} thread(s){extra}", cpu.threads())
}

/// Refuses a case whose tensors (`bytes` in all) exceed the memory available, naming the
/// flags that set its size.
pub fn check_fits(op: &'static str, flags: &str, bytes: u128) -> Result<()> {
    let avail = crate::memory::available_memory().map_or(isize::MAX as u128, u128::from).min(isize::MAX as u128);
    if bytes > avail {
        return Err(Error::value(
            op,
            flags,
            format!("tensors that fit in the {} available", crate::memory::gib(avail.min(u64::MAX as u128) as u64)),
            format!("about {:.3e} bytes", bytes as f64),
        ));
    }
    Ok(())
}
