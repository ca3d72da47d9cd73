//! `fusebox bench attention`: fused causal attention forward, forward + backward, and
//! decode attention over a KV cache; optionally the peak-memory scaling in T.

use std::process::Command;

use clap::{Args, ValueEnum};
use fusebox::{ComputeBackend, CpuBackend, Error, Result, Tensor};
use serde_json::Value;

use super::measure::{
    cpu_backend, emit, guarded, header, median_ratio, random, reset_peak_rss, round, rss, sgemm_gflops,
    time_interleaved, timing_of, wake, Bandwidth, Budget, Row,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Pass {
    /// `causal_attention` alone.
    Fwd,
    /// `causal_attention` then `causal_attention_backward`, timed together.
    Fwdbwd,
    /// `decode_attention` of `--q-len` new queries over a cache of `--seq` positions.
    Decode,
}

impl Pass {
    fn name(self) -> &'static str {
        match self {
            Pass::Fwd => "fwd",
            Pass::Fwdbwd => "fwdbwd",
            Pass::Decode => "decode",
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct AttentionBenchArgs {
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Query heads (Hq).
    #[arg(long, default_value_t = 8)]
    heads: usize,
    /// Key/value heads (Hkv; default: --heads). Hq must be a multiple of it (GQA).
    #[arg(long)]
    kv_heads: Option<usize>,
    /// Sequence length T (for `--pass decode`: the cached length kv_len).
    #[arg(long, default_value_t = 1024)]
    seq: usize,
    #[arg(long, default_value_t = 64)]
    head_dim: usize,
    #[arg(long, value_enum, default_value_t = Pass::Fwd)]
    pass: Pass,
    /// Sliding window W: each query sees its last W keys (itself included); default:
    /// full causal.
    #[arg(long)]
    window: Option<usize>,
    /// New queries per decode step (`--pass decode` only).
    #[arg(long, default_value_t = 1)]
    q_len: usize,
    /// Worker threads (default: every available core).
    #[arg(long)]
    threads: Option<usize>,
    /// Also time the same call on 1 thread, interleaved, for the speedup of N threads over 1.
    #[arg(long)]
    speedup: bool,
    /// Instead of timing: forward + backward once at T/4, T/2 and T, each in a fresh
    /// process, printing the peak RSS the call added and its growth per doubling of T.
    #[arg(long)]
    memory_scaling: bool,
    /// (internal) one forward + backward at --seq, printing peak RSS as JSON.
    #[arg(long, hide = true)]
    memory_probe: bool,
    #[arg(long)]
    json: bool,
}

impl AttentionBenchArgs {
    fn hkv(&self) -> usize {
        self.kv_heads.unwrap_or(self.heads)
    }

    fn case_name(&self) -> String {
        let window = self.window.map(|w| format!("_w{w}")).unwrap_or_default();
        format!(
            "attention/{}/b{}_hq{}_hkv{}_t{}_d{}{window}",
            self.pass.name(),
            self.batch,
            self.heads,
            self.hkv(),
            self.seq,
            self.head_dim
        )
    }

    fn check(&self) -> Result<()> {
        let hkv = self.hkv();
        if self.batch == 0 || self.heads == 0 || hkv == 0 || self.seq == 0 || self.head_dim == 0 {
            return Err(Error::value("bench attention", "sizes", "all positive", 0));
        }
        if !self.heads.is_multiple_of(hkv) {
            return Err(Error::value(
                "bench attention",
                "--heads",
                format!("a multiple of --kv-heads {hkv}"),
                self.heads,
            ));
        }
        if self.pass == Pass::Decode && (self.q_len == 0 || self.q_len > self.seq) {
            return Err(Error::value("bench attention", "--q-len", format!("1..={}", self.seq), self.q_len));
        }
        // q, k, v, d_out, the output and the gradients: about 8 tensors of B·Hq·T·D f32.
        let elems = (self.batch as u128) * (self.heads as u128) * (self.seq as u128) * (self.head_dim as u128);
        super::measure::check_fits("bench attention", "--batch × --heads × --seq × --head-dim", 8 * 4 * elems)?;
        Ok(())
    }
}

/// FLOPs of causal attention forward as the issue counts them: `2·B·Hq·T²·D`.
pub fn causal_fwd_flops(b: usize, hq: usize, t: usize, d: usize) -> f64 {
    2.0 * (b * hq) as f64 * (t as f64).powi(2) * d as f64
}

/// FLOPs of a sliding-window causal forward: `4·B·Hq·D` per (query, visible key) pair
/// (`q·k` and `p·v`), query i seeing `min(i + 1, W)` keys.
pub fn windowed_fwd_flops(b: usize, hq: usize, t: usize, d: usize, w: usize) -> f64 {
    let (t, w) = (t as f64, w.min(t) as f64);
    let pairs = w * (w + 1.0) / 2.0 + (t - w) * w;
    4.0 * (b * hq) as f64 * d as f64 * pairs
}

/// The q, k, v (and d_out) inputs of one case.
struct Inputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    d_out: Tensor,
    window: Option<usize>,
    scale: f32,
}

fn inputs(a: &AttentionBenchArgs) -> Result<Inputs> {
    let tq = if a.pass == Pass::Decode { a.q_len } else { a.seq };
    let (b, hq, hkv, t, d) = (a.batch, a.heads, a.hkv(), a.seq, a.head_dim);
    Ok(Inputs {
        q: random(&[b, hq, tq, d], 1, 1.0)?,
        k: random(&[b, hkv, t, d], 2, 1.0)?,
        v: random(&[b, hkv, t, d], 3, 1.0)?,
        d_out: random(&[b, hq, tq, d], 4, 1.0)?,
        window: a.window,
        scale: 1.0 / (d as f32).sqrt(),
    })
}

fn call(cpu: &CpuBackend, pass: Pass, x: &Inputs, kv_len: usize) -> Result<()> {
    match pass {
        Pass::Fwd => cpu.causal_attention(&x.q, &x.k, &x.v, x.window, None, x.scale).map(drop),
        Pass::Fwdbwd => {
            let r = cpu.causal_attention(&x.q, &x.k, &x.v, x.window, None, x.scale)?;
            cpu.causal_attention_backward(&x.q, &x.k, &x.v, &r, &x.d_out, x.window, None, x.scale).map(drop)
        }
        Pass::Decode => cpu.decode_attention(&x.q, &x.k, &x.v, kv_len, x.window, None, x.scale).map(drop),
    }
}

pub fn run(a: &AttentionBenchArgs) -> Result<()> {
    a.check()?;
    if a.memory_probe {
        return memory_probe(a);
    }
    if a.memory_scaling {
        return memory_scaling(a);
    }
    let cpu = cpu_backend(a.threads)?;
    let x = inputs(a)?;
    let budget = Budget::default();
    let (b, hq, hkv, t, d) = (a.batch, a.heads, a.hkv(), a.seq, a.head_dim);
    let mut row = Row::new(a.case_name())
        .set("pass", a.pass.name())
        .set("batch", b)
        .set("heads", hq)
        .set("kv_heads", hkv)
        .set("seq", t)
        .set("head_dim", d)
        .set("threads", cpu.threads());
    if let Some(w) = a.window {
        row = row.set("window", w);
    }
    // Decode is memory-bound: timed beside a read of the same bytes (see `time_interleaved`);
    // the other passes alone.
    // Cache rows a decode query reads: kv_len, or the last W of them.
    let read_rows = a.window.map_or(t, |w| w.min(t));
    let kv_bytes = 2 * b * hkv * read_rows * d * 4;
    let mut read = if a.pass == Pass::Decode { Some(Bandwidth::read(kv_bytes)?) } else { None };
    let single = if a.speedup && cpu.threads() > 1 { Some(cpu_backend(Some(1))?) } else { None };
    // Calls per rep: the op; the read (decode); the op on 1 thread (--speedup).
    let read_call = read.is_some().then_some(1);
    let single_call = single.as_ref().map(|_| 1 + usize::from(read.is_some()));
    let calls = 1 + usize::from(read_call.is_some()) + usize::from(single_call.is_some());
    let measured = guarded(a.pass.name(), || {
        // The N-thread calls start with the helpers awake (see `wake`).
        let before = |k: usize| {
            if Some(k) != single_call {
                wake(&cpu)
            }
        };
        time_interleaved(budget, calls, before, |k| {
            if Some(k) == read_call {
                read.as_mut().expect("a read reference for decode").run(&cpu)
            } else if Some(k) == single_call {
                call(single.as_ref().expect("a 1-thread backend with --speedup"), a.pass, &x, t)
            } else {
                call(&cpu, a.pass, &x, t)
            }
        })
    });
    let times = match measured {
        Ok(times) => times,
        Err(e) => {
            let row = row.set("error", e.to_string());
            emit(a.json, &[("case", "name"), ("error", "error")], &[row]);
            return Ok(());
        }
    };
    let timing = timing_of(&times[0]);
    row = row.set("ms", round(timing.ms())).set("min_ms", round(timing.min_s * 1e3)).set("reps", timing.reps);
    if let Some(k) = single_call {
        row = row
            .set("ms_1thread", round(timing_of(&times[k]).ms()))
            .set("speedup", round(median_ratio(&times[k], &times[0])));
    }
    let mut columns: Vec<(&str, &str)>;
    if let Some(read) = &read {
        // Bytes that must come from memory: the rows of K and V the queries see.
        let gbps = kv_bytes as f64 / timing.median_s / 1e9;
        let flops = 4.0 * (b * hq * a.q_len * read_rows * d) as f64;
        let read_gbps =
            read.bytes() as f64 / timing_of(&times[read_call.expect("decode is timed beside a read")]).median_s / 1e9;
        // Per rep: (kv_bytes / t_decode) / (read bytes / t_read), then the median.
        let reads = &times[read_call.expect("decode is timed beside a read")];
        let pct = 100.0 * kv_bytes as f64 / read.bytes() as f64 * median_ratio(reads, &times[0]);
        row = row
            .set("q_len", a.q_len)
            .set("kv_bytes", kv_bytes)
            .set("gbps", round(gbps))
            .set("gflops", round(flops / timing.median_s / 1e9))
            .set("read_gbps", round(read_gbps))
            .set("pct_of_read", round(pct));
        columns = vec![
            ("case", "name"),
            ("ms", "ms"),
            ("GB/s (K+V)", "gbps"),
            ("read GB/s", "read_gbps"),
            ("% of read", "pct_of_read"),
            ("GFLOP/s", "gflops"),
        ];
    } else {
        let mut flops = match a.window {
            Some(w) => windowed_fwd_flops(b, hq, t, d, w),
            None => causal_fwd_flops(b, hq, t, d),
        };
        if a.pass == Pass::Fwdbwd {
            flops *= 3.5;
        }
        let gflops = flops / timing.median_s / 1e9;
        let peak = sgemm_gflops(&cpu, 1024, budget).ok();
        row = row
            .set("gflops", round(gflops))
            .set_opt("peak_sgemm_gflops", peak)
            .set_opt("pct_of_peak", peak.map(|p| 100.0 * gflops / p));
        columns = vec![
            ("case", "name"),
            ("ms", "ms"),
            ("GFLOP/s", "gflops"),
            ("sgemm peak", "peak_sgemm_gflops"),
            ("% of peak", "pct_of_peak"),
        ];
    }
    if single_call.is_some() {
        columns.extend([("1-thread ms", "ms_1thread"), ("speedup", "speedup")]);
    }
    if !a.json {
        println!("{}", header(&cpu, ""));
    }
    emit(a.json, &columns, &[row]);
    Ok(())
}

/// One forward + backward, printing the peak RSS it added over the RSS after the inputs
/// were made (one JSON line; run in a fresh process by `memory_scaling`).
fn memory_probe(a: &AttentionBenchArgs) -> Result<()> {
    let cpu = cpu_backend(a.threads)?;
    let mut a = a.clone();
    a.pass = Pass::Fwdbwd;
    let x = inputs(&a)?;
    let reset = reset_peak_rss();
    let (_, before) = rss().ok_or_else(|| Error::unsupported("bench attention", "no /proc/self/status"))?;
    let t0 = std::time::Instant::now();
    guarded("fwdbwd", || call(&cpu, Pass::Fwdbwd, &x, a.seq))?;
    let secs = t0.elapsed().as_secs_f64();
    let (hwm, _) = rss().unwrap_or((0, 0));
    let row =
        Row::new(format!("attention/memory/b{}_hq{}_hkv{}_t{}_d{}", a.batch, a.heads, a.hkv(), a.seq, a.head_dim))
            .set("seq", a.seq)
            .set("rss_before_bytes", before)
            .set("peak_rss_bytes", hwm)
            .set("peak_added_bytes", hwm.saturating_sub(before))
            .set("peak_reset", reset)
            .set("ms", round(secs * 1e3));
    println!("{}", row.json());
    Ok(())
}

/// Runs `memory_probe` at T/4, T/2, T in child processes and prints the growth of the
/// added peak per doubling of T (linear ≈ 2×, a T×T buffer would give ≈ 4×).
fn memory_scaling(a: &AttentionBenchArgs) -> Result<()> {
    let exe = std::env::current_exe().map_err(|e| Error::Io(e.to_string()))?;
    let seqs = [a.seq / 4, a.seq / 2, a.seq];
    if seqs[0] == 0 {
        return Err(Error::value("bench attention --memory-scaling", "--seq", "at least 4", a.seq));
    }
    let mut rows = Vec::new();
    let mut prev: Option<u64> = None;
    for t in seqs {
        let mut cmd = Command::new(&exe);
        cmd.args(["bench", "attention", "--memory-probe"]);
        cmd.args(["--batch", &a.batch.to_string(), "--heads", &a.heads.to_string()]);
        cmd.args(["--kv-heads", &a.hkv().to_string(), "--seq", &t.to_string(), "--head-dim", &a.head_dim.to_string()]);
        if let Some(n) = a.threads {
            cmd.args(["--threads", &n.to_string()]);
        }
        if let Some(w) = a.window {
            cmd.args(["--window", &w.to_string()]);
        }
        let out = cmd.output().map_err(|e| Error::Io(format!("{}: {e}", exe.display())))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find(|l| l.starts_with('{'));
        let Some(v) = line.and_then(|l| serde_json::from_str::<Value>(l).ok()) else {
            let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
            rows.push(Row::new(format!("attention/memory/t{t}")).set("seq", t).set("error", err));
            prev = None;
            continue;
        };
        let added = v["peak_added_bytes"].as_u64().unwrap_or(0);
        let name = v["name"].as_str().unwrap_or("").to_string();
        let inputs_mb = (4 * a.batch * (2 * a.heads + 2 * a.hkv()) * t * a.head_dim) as f64 / 1e6;
        let mut row = Row::new(name)
            .set("seq", t)
            .set("ms", v["ms"].clone())
            .set("inputs_mb", round(inputs_mb))
            .set("peak_added_mb", round(added as f64 / 1e6))
            .set("peak_rss_mb", round(v["peak_rss_bytes"].as_u64().unwrap_or(0) as f64 / 1e6));
        if let Some(p) = prev.filter(|&p| p > 0) {
            row = row.set("growth_per_doubling", round(added as f64 / p as f64));
        }
        prev = Some(added);
        rows.push(row);
    }
    if !a.json {
        println!(
            "# attention fwd+bwd peak memory, B{} Hq{} Hkv{} D{} (added = peak RSS during the call − RSS with inputs; linear in T ≈ 2× per doubling)",
            a.batch,
            a.heads,
            a.hkv(),
            a.head_dim
        );
    }
    emit(
        a.json,
        &[
            ("case", "name"),
            ("T", "seq"),
            ("ms", "ms"),
            ("inputs MB", "inputs_mb"),
            ("added peak MB", "peak_added_mb"),
            ("growth ×/doubling", "growth_per_doubling"),
            ("error", "error"),
        ],
        &rows,
    );
    Ok(())
}
