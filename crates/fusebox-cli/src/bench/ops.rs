//! `fusebox bench ops`: memory-bound ops and their backwards at sizes well beyond L2,
//! reported in GB/s (the minimal bytes each op must read and write) against a copy
//! bandwidth measured over the same working-set size (the distinct bytes the op touches)
//! on the same threads, with the speedup of N threads over 1.

use clap::Args;
use fusebox::{AdamWConfig, ComputeBackend, CpuBackend, Result, Tensor};

use super::measure::{
    cpu_backend, emit, guarded, header, median_ratio, random, random_ids, round, time_interleaved, timing_of,
    Bandwidth, Budget, Row,
};

#[derive(Args, Debug)]
pub struct OpsBenchArgs {
    /// Only these ops (comma-separated names, e.g. `rms_norm,softmax_backward`).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Worker threads (default: every available core); 1 thread is also measured for
    /// the speedup column unless this is 1.
    #[arg(long)]
    threads: Option<usize>,
    /// Skip the 1-thread run (no speedup column; halves the time).
    #[arg(long)]
    no_speedup: bool,
    #[arg(long)]
    json: bool,
}

/// Rows × hidden size of the norm, activation and softmax cases: 4 Mi f32 = 16 MiB per
/// tensor, far beyond a 2 MiB L2.
pub const ROWS: usize = 1024;
pub const DIM: usize = 4096;
/// Cross-entropy: 128 rows of a 32000-token vocabulary (16 MiB of logits).
pub const CE_ROWS: usize = 128;
pub const VOCAB: usize = 32000;
/// Elements of the AdamW case.
pub const PARAMS: usize = ROWS * DIM;

/// A prepared call of one op on given inputs (state such as AdamW's moments lives inside).
type Runner = Box<dyn FnMut(&CpuBackend) -> Result<()>>;

/// One op case: its name, shape, the bytes it must move at the least, its working set
/// (distinct bytes touched: what the copy reference is sized to), and how to build its
/// inputs (forward outputs that a backward needs come from `cpu`).
pub struct OpCase {
    pub name: &'static str,
    pub shape: String,
    pub bytes: usize,
    pub footprint: usize,
    make: fn(&CpuBackend) -> Result<Runner>,
}

const EPS: f32 = 1e-5;

fn rows() -> [usize; 2] {
    [ROWS, DIM]
}

/// The cases, in the order the issue lists them; `add` is a reference elementwise op.
pub fn cases() -> Vec<OpCase> {
    let n = ROWS * DIM;
    let nd = format!("[{ROWS}, {DIM}]");
    let ce = format!("[{CE_ROWS}, {VOCAB}]");
    vec![
        OpCase {
            name: "add",
            shape: nd.clone(),
            bytes: 12 * n,
            footprint: 12 * n,
            make: |_| {
                let (a, b) = (random(&rows(), 1, 1.0)?, random(&rows(), 2, 1.0)?);
                Ok(Box::new(move |cpu| cpu.add(&a, &b).map(drop)))
            },
        },
        OpCase {
            name: "rms_norm",
            shape: nd.clone(),
            bytes: 8 * n,
            footprint: 8 * n,
            make: |_| {
                let (x, w) = (random(&rows(), 1, 1.0)?, random(&[DIM], 2, 1.0)?);
                Ok(Box::new(move |cpu| cpu.rms_norm(&x, &w, EPS).map(drop)))
            },
        },
        OpCase {
            name: "rms_norm_backward",
            shape: nd.clone(),
            bytes: 12 * n,
            footprint: 12 * n,
            make: |cpu| {
                let (x, w, dy) = (random(&rows(), 1, 1.0)?, random(&[DIM], 2, 1.0)?, random(&rows(), 3, 1.0)?);
                let rstd = cpu.rms_norm(&x, &w, EPS)?.rstd;
                Ok(Box::new(move |cpu| cpu.rms_norm_backward(&x, &w, &rstd, &dy).map(drop)))
            },
        },
        OpCase {
            name: "add_rms_norm",
            shape: nd.clone(),
            bytes: 16 * n,
            footprint: 16 * n,
            make: |_| {
                let (a, b, w) = (random(&rows(), 1, 1.0)?, random(&rows(), 2, 1.0)?, random(&[DIM], 3, 1.0)?);
                Ok(Box::new(move |cpu| cpu.add_rms_norm(&a, &b, &w, EPS).map(drop)))
            },
        },
        OpCase {
            name: "silu_mul",
            shape: nd.clone(),
            bytes: 12 * n,
            footprint: 12 * n,
            make: |_| {
                let (g, u) = (random(&rows(), 1, 4.0)?, random(&rows(), 2, 1.0)?);
                Ok(Box::new(move |cpu| cpu.silu_mul(&g, &u).map(drop)))
            },
        },
        OpCase {
            name: "silu_mul_backward",
            shape: nd.clone(),
            bytes: 20 * n,
            footprint: 20 * n,
            make: |_| {
                let (g, u, dy) = (random(&rows(), 1, 4.0)?, random(&rows(), 2, 1.0)?, random(&rows(), 3, 1.0)?);
                Ok(Box::new(move |cpu| cpu.silu_mul_backward(&g, &u, &dy).map(drop)))
            },
        },
        OpCase {
            name: "softmax",
            shape: nd.clone(),
            bytes: 8 * n,
            footprint: 8 * n,
            make: |_| {
                let x = random(&rows(), 1, 8.0)?;
                Ok(Box::new(move |cpu| cpu.softmax(&x, 1).map(drop)))
            },
        },
        OpCase {
            name: "softmax_backward",
            shape: nd.clone(),
            bytes: 12 * n,
            footprint: 12 * n,
            make: |cpu| {
                let y = cpu.softmax(&random(&rows(), 1, 8.0)?, 1)?;
                let dy = random(&rows(), 2, 1.0)?;
                Ok(Box::new(move |cpu| cpu.softmax_backward(&y, &dy, 1).map(drop)))
            },
        },
        OpCase {
            name: "cross_entropy",
            shape: ce.clone(),
            bytes: 8 * CE_ROWS * VOCAB + 4 * CE_ROWS,
            footprint: 8 * CE_ROWS * VOCAB + 4 * CE_ROWS,
            make: |_| {
                let (z, t) = (random(&[CE_ROWS, VOCAB], 1, 8.0)?, random_ids(CE_ROWS, VOCAB as u32, 2)?);
                Ok(Box::new(move |cpu| cpu.cross_entropy(&z, &t, None).map(drop)))
            },
        },
        OpCase {
            name: "cross_entropy_backward",
            shape: ce,
            bytes: 8 * CE_ROWS * VOCAB + 4 * CE_ROWS,
            footprint: 8 * CE_ROWS * VOCAB + 4 * CE_ROWS,
            make: |_| {
                let (z, t) = (random(&[CE_ROWS, VOCAB], 1, 8.0)?, random_ids(CE_ROWS, VOCAB as u32, 2)?);
                Ok(Box::new(move |cpu| cpu.cross_entropy_backward(&z, &t, None, 1.0).map(drop)))
            },
        },
        OpCase {
            name: "adamw_update",
            shape: format!("[{PARAMS}]"),
            // Reads p, g, m, v and writes p, m, v in place: 7 passes over 4 buffers.
            bytes: 28 * PARAMS,
            footprint: 16 * PARAMS,
            make: |_| {
                let g = random(&[PARAMS], 2, 1e-2)?;
                let mut p = random(&[PARAMS], 1, 1.0)?;
                let mut m = Tensor::from_vec(vec![0f32; PARAMS], [PARAMS])?;
                let mut v = Tensor::from_vec(vec![0f32; PARAMS], [PARAMS])?;
                let hyper =
                    AdamWConfig { lr: 1e-4, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, grad_scale: 1.0 };
                let mut step = 0u64;
                Ok(Box::new(move |cpu| {
                    step += 1;
                    cpu.adamw_update(&mut p, &g, &mut m, &mut v, &hyper, step)
                }))
            },
        },
    ]
}

pub fn run(a: &OpsBenchArgs) -> Result<()> {
    let cpu = cpu_backend(a.threads)?;
    let single = if cpu.threads() > 1 && !a.no_speedup { Some(CpuBackend::with_threads(1)?) } else { None };
    let budget = Budget::default();
    let mut rows = Vec::new();
    if !a.json {
        println!(
            "{}",
            header(
                &cpu,
                "; GB/s = minimal bytes read + written; % of copy = against copy_from_slice on the same working set, \
                 timed beside the op (median of per-rep ratios, as the speedup)"
            )
        );
    }
    for case in cases() {
        if !a.only.is_empty() && !a.only.iter().any(|o| o == case.name) {
            continue;
        }
        let mut row = Row::new(format!("ops/{}", case.name))
            .set("op", case.name)
            .set("shape", case.shape.clone())
            .set("bytes", case.bytes)
            .set("working_set_bytes", case.footprint)
            .set("threads", cpu.threads());
        let measured = guarded(case.name, || {
            let mut f = (case.make)(&cpu)?;
            let mut copy = Bandwidth::copy(case.footprint);
            // op and copy on N threads, then (for the speedups) both on 1 thread.
            let calls = if single.is_some() { 4 } else { 2 };
            let times = time_interleaved(budget, calls, |k| {
                let one = || single.as_ref().expect("a 1-thread backend when 4 calls");
                match k {
                    0 => f(&cpu),
                    1 => {
                        copy.run(&cpu);
                        Ok(())
                    }
                    2 => f(one()),
                    _ => {
                        copy.run(one());
                        Ok(())
                    }
                }
            })?;
            Ok((times, copy.bytes()))
        });
        match measured {
            Ok((times, copy_bytes)) => {
                let t = timing_of(&times[0]);
                let copy = timing_of(&times[1]);
                // Per rep: (bytes / t_op) / (copy_bytes / t_copy), then the median.
                let pct = 100.0 * case.bytes as f64 / copy_bytes as f64 * median_ratio(&times[1], &times[0]);
                row = row
                    .set("ms", round(t.ms()))
                    .set("min_ms", round(t.min_s * 1e3))
                    .set("reps", t.reps)
                    .set("gbps", round(case.bytes as f64 / t.median_s / 1e9))
                    .set("copy_gbps", round(copy_bytes as f64 / copy.median_s / 1e9))
                    .set("pct_of_copy", round(pct));
                if let (Some(t1), Some(c1)) = (times.get(2), times.get(3)) {
                    // The copy's own speedup is the ceiling for a memory-bound op.
                    row = row
                        .set("ms_1thread", round(timing_of(t1).ms()))
                        .set("speedup", round(median_ratio(t1, &times[0])))
                        .set("copy_speedup", round(median_ratio(c1, &times[1])));
                }
            }
            Err(e) => row = row.set("error", e.to_string()),
        }
        if a.json {
            println!("{}", row.json());
        }
        rows.push(row);
    }
    if !a.json {
        emit(
            false,
            &[
                ("op", "op"),
                ("shape", "shape"),
                ("ms", "ms"),
                ("GB/s", "gbps"),
                ("copy GB/s", "copy_gbps"),
                ("% of copy", "pct_of_copy"),
                ("1-thread ms", "ms_1thread"),
                ("speedup", "speedup"),
                ("copy speedup", "copy_speedup"),
                ("error", "error"),
            ],
            &rows,
        );
    }
    Ok(())
}
