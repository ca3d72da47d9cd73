//! The backend factory of the command line: the core's `create_backend` plus the
//! backends compiled into this binary from other crates (`wgpu`, feature `wgpu`), and the
//! one place that reads the `FUSEBOX_*` environment variables, mapping them onto the
//! backends' builders (the libraries read no environment).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fusebox::cpu::CpuBackendBuilder;
use fusebox::{create_backend, ComputeBackend, CpuBackend, Error, Isa, Result};

/// The environment variables the command line reads, for `fusebox --help`.
pub const ENV_HELP: &str = "\
Environment variables (read by this command line only; an invalid value is an error):
  FUSEBOX_THREADS=N            CPU worker threads (default: every available core; --threads wins)
  FUSEBOX_ISA=avx512|avx2|scalar
                               instruction set of our CPU kernels, and with avx2 of the f32
                               GEMM's too (default: the best this CPU has; one it lacks is an
                               error)
  FUSEBOX_PIN_THREADS=0|1      pin each CPU worker to a CPU of its own when the pool spans the
                               process's CPUs (default 1)
  FUSEBOX_SPIN_US=N            microseconds idle CPU helpers spin before sleeping (default 300;
                               0 for a machine shared with other busy work)
  FUSEBOX_INT8_DECODE=0|1      decode with activations rounded to 8 bits and integer dot products
                               against quantized weights (1), or with f32 activations (0); default
                               1 for generate, chat, serve and bench, 0 for the others; --int8 and
                               --exact win
  FUSEBOX_STREAM_MIN_BYTES=N   outputs of at least N bytes are written with streaming stores
                               (default: a quarter of the last-level cache, at least 4 MiB)
  FUSEBOX_WGPU_ADAPTER=I|NAME  the wgpu adapter: its index, or text in its name (`fusebox info`
                               lists them; default: wgpu's preferred one)
  FUSEBOX_WGPU_POWER=high|low|none
                               which adapter wgpu prefers when none is named (default high)
  FUSEBOX_WGPU_TRACE=0|1       name each op that falls back to the CPU on stderr (default 0)";

/// How decoding GEMVs over quantized weights treat the activations (`--int8`, `--exact`,
/// `FUSEBOX_INT8_DECODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodePath {
    /// `--int8`: rounded to 8 bits for integer dot products, whatever the environment.
    Int8,
    /// `--exact`: f32, whatever the environment.
    Exact,
    /// Neither flag: `FUSEBOX_INT8_DECODE` when set, else `int8` (the command's default).
    Default { int8: bool },
}

/// The decode path chosen on the command line: 0 default f32, 1 default int8, 2 `--int8`,
/// 3 `--exact` (see [`set_decode_path`]).
static DECODE_PATH: AtomicU8 = AtomicU8::new(0);

/// Records the command line's decode path: every CPU backend built afterwards (and the
/// default one other backends fall back to, when configured afterwards) follows it.
pub fn set_decode_path(path: DecodePath) {
    let code = match path {
        DecodePath::Default { int8: false } => 0,
        DecodePath::Default { int8: true } => 1,
        DecodePath::Int8 => 2,
        DecodePath::Exact => 3,
    };
    DECODE_PATH.store(code, Ordering::Relaxed);
}

impl DecodePath {
    /// Whether activations are rounded to 8 bits, given `FUSEBOX_INT8_DECODE`'s value.
    fn int8(self, env: Option<bool>) -> bool {
        match self {
            DecodePath::Int8 => true,
            DecodePath::Exact => false,
            DecodePath::Default { int8 } => env.unwrap_or(int8),
        }
    }
}

/// The decode path [`set_decode_path`] recorded.
fn decode_path() -> DecodePath {
    match DECODE_PATH.load(Ordering::Relaxed) {
        1 => DecodePath::Default { int8: true },
        2 => DecodePath::Int8,
        3 => DecodePath::Exact,
        _ => DecodePath::Default { int8: false },
    }
}

/// How `b`'s CPU kernels take the activations of decoding GEMVs over quantized weights:
/// `"int8"` or `"f32"` (for reports).
pub fn activations(b: &dyn ComputeBackend) -> &'static str {
    if b.cpu().exact_decode() {
        "f32"
    } else {
        "int8"
    }
}

/// The value of `name`, `None` when unset or empty; an error when not Unicode.
fn var(name: &'static str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Ok(Some(v.trim().to_string())),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(Error::value("environment", name, "Unicode text", format!("{v:?}")))
        }
    }
}

/// `name` parsed by `parse`, naming the variable and what it takes when it does not parse.
fn parsed<T>(name: &'static str, expected: &str, parse: impl Fn(&str) -> Option<T>) -> Result<Option<T>> {
    match var(name)? {
        None => Ok(None),
        Some(v) => parse(&v).map(Some).ok_or_else(|| Error::value("environment", name, expected, format!("'{v}'"))),
    }
}

fn flag(name: &'static str) -> Result<Option<bool>> {
    parsed(name, "0 or 1", |v| match v {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    })
}

/// The CPU backend's settings from the environment, with `threads` (a `--threads` flag)
/// taking precedence over `FUSEBOX_THREADS`.
pub fn cpu_builder(threads: Option<usize>) -> Result<CpuBackendBuilder> {
    let mut b = CpuBackend::builder();
    let env_threads = parsed("FUSEBOX_THREADS", "a positive integer", |v| v.parse::<usize>().ok().filter(|&n| n > 0))?;
    if let Some(n) = threads.or(env_threads) {
        b = b.threads(n);
    }
    if let Some(isa) = parsed("FUSEBOX_ISA", "avx512, avx2 or scalar", |v| v.parse::<Isa>().ok())? {
        b = b.isa(isa);
    }
    if let Some(pin) = flag("FUSEBOX_PIN_THREADS")? {
        b = b.pin_threads(pin);
    }
    if let Some(us) = parsed("FUSEBOX_SPIN_US", "a number of microseconds", |v| v.parse::<u64>().ok())? {
        b = b.spin_time(Duration::from_micros(us));
    }
    let min_bytes = parsed("FUSEBOX_STREAM_MIN_BYTES", "a positive number of bytes", |v| {
        v.parse::<usize>().ok().filter(|&n| n > 0)
    })?;
    if let Some(bytes) = min_bytes {
        b = b.stream_min_bytes(bytes);
    }
    b = b.exact_decode(!decode_path().int8(flag("FUSEBOX_INT8_DECODE")?));
    Ok(b)
}

/// A CPU backend with the environment's settings (`threads` overriding
/// `FUSEBOX_THREADS`).
pub fn cpu(threads: Option<usize>) -> Result<CpuBackend> {
    cpu_builder(threads)?.build()
}

/// Makes the environment's CPU settings those of the process-wide CPU backend that
/// other backends (wgpu) fall back to. Called once at start.
pub fn configure_default_cpu() -> Result<()> {
    fusebox::cpu::configure_default_cpu(cpu_builder(None)?)
}

/// Creates a backend by name: `cpu`, `cpu:N`, `wgpu` (also `vulkan`, `metal`, `dx12`,
/// which pick whatever adapter wgpu finds, or the one `FUSEBOX_WGPU_ADAPTER` names).
pub fn create(name: &str) -> Result<Arc<dyn ComputeBackend>> {
    let lower = name.trim().to_ascii_lowercase();
    if matches!(lower.as_str(), "wgpu" | "vulkan" | "metal" | "dx12" | "gpu") {
        return create_wgpu();
    }
    if lower == "cpu" {
        return Ok(Arc::new(cpu(None)?));
    }
    if let Some(threads) = lower.strip_prefix("cpu:") {
        if let Ok(n) = threads.parse::<usize>() {
            return Ok(Arc::new(cpu(Some(n))?));
        }
    }
    create_backend(name).map_err(|e| match e {
        Error::Unsupported { op, reason } if reason.starts_with("unknown backend") => {
            Error::unsupported(op, format!("unknown backend '{name}'; known: {}", available().join(", ")))
        }
        other => other,
    })
}

/// Most CPU threads a backend may be asked for: beyond any machine's cores, and few enough
/// that spawning them cannot exhaust the process's thread limit.
const MAX_THREADS: usize = 4096;

/// The backend of the `--backend NAME` and `--threads N` flags: [`create`]`(name)`, with
/// `threads` CPU threads when given.
pub fn backend_for(name: &str, threads: Option<usize>) -> Result<Arc<dyn ComputeBackend>> {
    let named = name.trim().strip_prefix("cpu:").and_then(|n| n.parse::<usize>().ok());
    for (what, n) in [("--threads", threads), ("the N of --backend cpu:N", named)] {
        match n {
            Some(0) => return Err(Error::value("backend", what, "at least 1", 0)),
            Some(n) if n > MAX_THREADS => {
                return Err(Error::value("backend", what, format!("at most {MAX_THREADS}"), n));
            }
            _ => {}
        }
    }
    match (name, threads) {
        ("cpu", Some(n)) => create(&format!("cpu:{n}")),
        _ => create(name),
    }
}

/// The wgpu backend's settings from the environment.
#[cfg(feature = "wgpu")]
fn wgpu_builder() -> Result<fusebox_wgpu::WgpuBackendBuilder> {
    use fusebox_wgpu::{AdapterChoice, PowerPreference, WgpuBackend};
    let mut b = WgpuBackend::builder();
    if let Some(choice) =
        parsed("FUSEBOX_WGPU_ADAPTER", "an adapter index or name", |v| v.parse::<AdapterChoice>().ok())?
    {
        b = b.adapter(choice);
    }
    if let Some(power) = parsed("FUSEBOX_WGPU_POWER", "high, low or none", |v| v.parse::<PowerPreference>().ok())? {
        b = b.power_preference(power);
    }
    if let Some(trace) = flag("FUSEBOX_WGPU_TRACE")? {
        b = b.trace(trace);
    }
    Ok(b)
}

#[cfg(feature = "wgpu")]
fn create_wgpu() -> Result<Arc<dyn ComputeBackend>> {
    Ok(Arc::new(wgpu_builder()?.build()?))
}

#[cfg(not(feature = "wgpu"))]
fn create_wgpu() -> Result<Arc<dyn ComputeBackend>> {
    Err(Error::unsupported("create_backend", "this fusebox was built without the `wgpu` feature"))
}

/// Names of the backends compiled into this binary.
pub fn available() -> Vec<&'static str> {
    let mut v = fusebox::available_backends();
    if cfg!(feature = "wgpu") {
        v.push("wgpu");
    }
    v
}

/// What `fusebox info` says about the wgpu backend.
pub struct WgpuDetails {
    /// Every adapter wgpu finds, as `index: name (API, type)`.
    pub adapters: Vec<String>,
    /// The adapter opened (with the environment's settings), or why none was.
    pub opened: std::result::Result<(String, String), String>,
    /// The ops that run natively.
    pub native_ops: Vec<&'static str>,
}

/// The wgpu adapters, the one the environment's settings open (adapter, limits), and the
/// native ops; `None` without the `wgpu` feature.
#[cfg(feature = "wgpu")]
pub fn wgpu_details() -> Option<WgpuDetails> {
    use fusebox_wgpu::WgpuBackend;
    let opened = wgpu_builder().and_then(|b| b.build()).map(|b| (b.adapter_info(), b.limits_summary()));
    Some(WgpuDetails {
        adapters: WgpuBackend::adapters(),
        opened: opened.map_err(|e| e.to_string()),
        native_ops: WgpuBackend::native_op_names(),
    })
}

#[cfg(not(feature = "wgpu"))]
pub fn wgpu_details() -> Option<WgpuDetails> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variable the command line reads is documented in `--help`.
    #[test]
    fn every_variable_read_is_documented() {
        let source = include_str!("backends.rs");
        let code = &source[source.find("fn var(").unwrap()..source.find("#[cfg(test)]").unwrap()];
        let mut rest = code;
        let mut found = 0;
        while let Some(at) = rest.find("\"FUSEBOX_") {
            let name: String = rest[at + 1..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            assert!(ENV_HELP.contains(&format!("{name}=")), "{name} is read but not in ENV_HELP");
            found += 1;
            rest = &rest[at + 1..];
        }
        assert!(found >= 8, "found {found} variables");
    }

    /// `--int8` and `--exact` win over the environment, which wins over the command's default.
    #[test]
    fn decode_path_precedence() {
        for env in [None, Some(false), Some(true)] {
            assert!(DecodePath::Int8.int8(env));
            assert!(!DecodePath::Exact.int8(env));
        }
        for default in [false, true] {
            assert_eq!(DecodePath::Default { int8: default }.int8(None), default);
            assert!(DecodePath::Default { int8: default }.int8(Some(true)));
            assert!(!DecodePath::Default { int8: default }.int8(Some(false)));
        }
    }
}
