//! `fusebox bench matmul`: sgemm through the backend's `matmul`, GFLOP/s and % of the
//! best sgemm measured in the same run.

use clap::Args;
use fusebox::{ComputeBackend, Error, Result};

use super::measure::{
    cpu_backend, emit, guarded, header, median_ratio, random, round, sgemm_gflops, time_interleaved, timing_of, wake,
    Budget, Row,
};

#[derive(Args, Debug)]
pub struct MatmulBenchArgs {
    #[arg(long, default_value_t = 1024)]
    m: usize,
    #[arg(long, default_value_t = 1024)]
    n: usize,
    #[arg(long, default_value_t = 1024)]
    k: usize,
    /// Multiply by Bᵀ (b stored `[n, k]`), as `linear_forward` does.
    #[arg(long)]
    transpose_b: bool,
    /// Worker threads (default: every available core).
    #[arg(long)]
    threads: Option<usize>,
    /// Also time the same product on 1 thread, interleaved, for the speedup of N threads over 1.
    #[arg(long)]
    speedup: bool,
    #[arg(long)]
    json: bool,
}

pub fn run(a: &MatmulBenchArgs) -> Result<()> {
    if a.m == 0 || a.n == 0 || a.k == 0 {
        return Err(Error::value("bench matmul", "--m/--n/--k", "positive", 0));
    }
    let (m, n, k) = (a.m as u128, a.n as u128, a.k as u128);
    super::measure::check_fits("bench matmul", "--m/--n/--k", 4 * (m * k + k * n + m * n))?;
    let cpu = cpu_backend(a.threads)?;
    let budget = Budget::default();
    let x = random(&[a.m, a.k], 1, 1.0)?;
    let y = if a.transpose_b { random(&[a.n, a.k], 2, 1.0)? } else { random(&[a.k, a.n], 2, 1.0)? };
    let mut name = format!("matmul/{}x{}x{}", a.m, a.n, a.k);
    if a.transpose_b {
        name.push_str("_bt");
    }
    let row = Row::new(name).set("m", a.m).set("n", a.n).set("k", a.k).set("threads", cpu.threads());
    let single = if a.speedup && cpu.threads() > 1 { Some(cpu_backend(Some(1))?) } else { None };
    let calls = if single.is_some() { 2 } else { 1 };
    let measured = guarded("matmul", || {
        time_interleaved(
            budget,
            calls,
            // The N-thread calls start with the helpers awake (see `wake`).
            |k| {
                if k == 0 {
                    wake(&cpu)
                }
            },
            |k| {
                let backend = if k == 0 { &cpu } else { single.as_ref().expect("a 1-thread backend with --speedup") };
                backend.matmul(&x, &y, false, a.transpose_b).map(drop)
            },
        )
    });
    let row = match measured {
        Ok(times) => {
            let t = timing_of(&times[0]);
            let flops = 2.0 * (a.m * a.n * a.k) as f64;
            let gflops = flops / t.median_s / 1e9;
            // The peak is the best sgemm of this run: the 1024³ reference or this case's
            // fastest call.
            let reference = if (a.m, a.n, a.k) == (1024, 1024, 1024) && !a.transpose_b {
                None
            } else {
                sgemm_gflops(&cpu, 1024, budget).ok()
            };
            let best = flops / t.min_s / 1e9;
            let peak = reference.map_or(best, |r| r.max(best));
            let row = row
                .set("ms", round(t.ms()))
                .set("min_ms", round(t.min_s * 1e3))
                .set("reps", t.reps)
                .set("gflops", round(gflops))
                .set("peak_sgemm_gflops", round(peak))
                .set("pct_of_peak", round(100.0 * gflops / peak));
            match times.get(1) {
                Some(t1) => {
                    row.set("ms_1thread", round(timing_of(t1).ms())).set("speedup", round(median_ratio(t1, &times[0])))
                }
                None => row,
            }
        }
        Err(e) => row.set("error", e.to_string()),
    };
    if !a.json {
        println!("{}", header(&cpu, ""));
    }
    emit(
        a.json,
        &[
            ("case", "name"),
            ("ms", "ms"),
            ("GFLOP/s", "gflops"),
            ("sgemm peak", "peak_sgemm_gflops"),
            ("% of peak", "pct_of_peak"),
            ("1-thread ms", "ms_1thread"),
            ("speedup", "speedup"),
            ("error", "error"),
        ],
        &[row],
    );
    Ok(())
}
