//! `fusebox bench ops`: memory-bound ops and their backwards at sizes well beyond L2,
//! reported in GB/s (the minimal bytes each op must read and write) against a copy
//! bandwidth measured over the same working-set size (the distinct bytes the op touches)
//! on the same threads, with the speedup of N threads over 1.

use clap::Args;
use fusebox::{AdamWConfig, ComputeBackend, CpuBackend, Result, Tensor};

use super::measure::{
    cpu_backend, emit, guarded, header, median_ratio, random, random_ids, round, time_interleaved, timing_of, wake,
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
    /// Rows of 4096 in the norm, activation and softmax cases (cross-entropy takes an
    /// eighth as many rows of 32000, AdamW `rows × 4096` parameters). The default, 1024,
    /// gives 16 MiB tensors; 256 keeps the working set of most ops in a 32 MiB L3.
    #[arg(long, default_value_t = Size::DEFAULT_ROWS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(8..=1 << 20))]
    rows: usize,
    #[arg(long)]
    json: bool,
}

/// Hidden size of the norm, activation and softmax cases.
pub const DIM: usize = 4096;
/// Cross-entropy vocabulary.
pub const VOCAB: usize = 32000;

/// The size of every case, from the rows of the row-wise ops.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    pub rows: usize,
}

impl Size {
    /// 1024 rows of 4096: 4 Mi f32 = 16 MiB per tensor, far beyond a 2 MiB L2.
    pub const DEFAULT_ROWS: usize = 1024;

    fn shape(self) -> [usize; 2] {
        [self.rows, DIM]
    }

    /// Elements of one `[rows, DIM]` tensor.
    fn n(self) -> usize {
        self.rows * DIM
    }

    /// Cross-entropy rows: an eighth of `rows`, so the logits are about the size of the
    /// other cases' tensors (128 rows of 32000, 16 MiB, at the default).
    fn ce_rows(self) -> usize {
        (self.rows / 8).max(1)
    }

    /// Elements of the AdamW case.
    fn params(self) -> usize {
        self.n()
    }
}

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
    make: fn(&CpuBackend, Size) -> Result<Runner>,
}

const EPS: f32 = 1e-5;

/// The cases, in the order the issue lists them; `add` is a reference elementwise op.
pub fn cases(size: Size) -> Vec<OpCase> {
    let (n, ce_rows, params) = (size.n(), size.ce_rows(), size.params());
    let nd = format!("[{}, {DIM}]", size.rows);
    let ce = format!("[{ce_rows}, {VOCAB}]");
    vec![
        OpCase {
            name: "add",
            shape: nd.clone(),
            bytes: 12 * n,
            footprint: 12 * n,
            make: |_, size| {
                let (a, b) = (random(&size.shape(), 1, 1.0)?, random(&size.shape(), 2, 1.0)?);
                Ok(Box::new(move |cpu| cpu.add(&a, &b).map(drop)))
            },
        },
        OpCase {
            name: "rms_norm",
            shape: nd.clone(),
            bytes: 8 * n,
            footprint: 8 * n,
            make: |_, size| {
                let (x, w) = (random(&size.shape(), 1, 1.0)?, random(&[DIM], 2, 1.0)?);
                Ok(Box::new(move |cpu| cpu.rms_norm(&x, &w, EPS).map(drop)))
            },
        },
        OpCase {
            name: "rms_norm_backward",
            shape: nd.clone(),
            bytes: 12 * n,
            footprint: 12 * n,
            make: |cpu, size| {
                let (x, w, dy) =
                    (random(&size.shape(), 1, 1.0)?, random(&[DIM], 2, 1.0)?, random(&size.shape(), 3, 1.0)?);
                let rstd = cpu.rms_norm(&x, &w, EPS)?.rstd;
                Ok(Box::new(move |cpu| cpu.rms_norm_backward(&x, &w, &rstd, &dy).map(drop)))
            },
        },
        OpCase {
            name: "add_rms_norm",
            shape: nd.clone(),
            bytes: 16 * n,
            footprint: 16 * n,
            make: |_, size| {
                let (a, b, w) =
                    (random(&size.shape(), 1, 1.0)?, random(&size.shape(), 2, 1.0)?, random(&[DIM], 3, 1.0)?);
                Ok(Box::new(move |cpu| cpu.add_rms_norm(&a, &b, &w, EPS).map(drop)))
            },
        },
        OpCase {
            name: "silu_mul",
            shape: nd.clone(),
            bytes: 12 * n,
            footprint: 12 * n,
            make: |_, size| {
                let (g, u) = (random(&size.shape(), 1, 4.0)?, random(&size.shape(), 2, 1.0)?);
                Ok(Box::new(move |cpu| cpu.silu_mul(&g, &u).map(drop)))
            },
        },
        OpCase {
            name: "silu_mul_backward",
            shape: nd.clone(),
            bytes: 20 * n,
            footprint: 20 * n,
            make: |_, size| {
                let (g, u, dy) =
                    (random(&size.shape(), 1, 4.0)?, random(&size.shape(), 2, 1.0)?, random(&size.shape(), 3, 1.0)?);
                Ok(Box::new(move |cpu| cpu.silu_mul_backward(&g, &u, &dy).map(drop)))
            },
        },
        OpCase {
            name: "softmax",
            shape: nd.clone(),
            bytes: 8 * n,
            footprint: 8 * n,
            make: |_, size| {
                let x = random(&size.shape(), 1, 8.0)?;
                Ok(Box::new(move |cpu| cpu.softmax(&x, 1).map(drop)))
            },
        },
        OpCase {
            name: "softmax_backward",
            shape: nd.clone(),
            bytes: 12 * n,
            footprint: 12 * n,
            make: |cpu, size| {
                let y = cpu.softmax(&random(&size.shape(), 1, 8.0)?, 1)?;
                let dy = random(&size.shape(), 2, 1.0)?;
                Ok(Box::new(move |cpu| cpu.softmax_backward(&y, &dy, 1).map(drop)))
            },
        },
        OpCase {
            name: "cross_entropy",
            shape: ce.clone(),
            bytes: 8 * ce_rows * VOCAB + 4 * ce_rows,
            footprint: 8 * ce_rows * VOCAB + 4 * ce_rows,
            make: |_, size| {
                let (z, t) = (random(&[size.ce_rows(), VOCAB], 1, 8.0)?, random_ids(size.ce_rows(), VOCAB as u32, 2)?);
                Ok(Box::new(move |cpu| cpu.cross_entropy(&z, &t, None).map(drop)))
            },
        },
        OpCase {
            name: "cross_entropy_backward",
            shape: ce,
            bytes: 8 * ce_rows * VOCAB + 4 * ce_rows,
            footprint: 8 * ce_rows * VOCAB + 4 * ce_rows,
            make: |_, size| {
                let (z, t) = (random(&[size.ce_rows(), VOCAB], 1, 8.0)?, random_ids(size.ce_rows(), VOCAB as u32, 2)?);
                Ok(Box::new(move |cpu| cpu.cross_entropy_backward(&z, &t, None, 1.0).map(drop)))
            },
        },
        OpCase {
            name: "adamw_update",
            shape: format!("[{params}]"),
            // Reads p, g, m, v and writes p, m, v in place: 7 passes over 4 buffers.
            bytes: 28 * params,
            footprint: 16 * params,
            make: |_, size| {
                let params = size.params();
                let g = random(&[params], 2, 1e-2)?;
                let mut p = random(&[params], 1, 1.0)?;
                let mut m = Tensor::from_vec(vec![0f32; params], [params])?;
                let mut v = Tensor::from_vec(vec![0f32; params], [params])?;
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
    let single = if cpu.threads() > 1 && !a.no_speedup { Some(cpu_backend(Some(1))?) } else { None };
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
    for case in cases(Size { rows: a.rows }) {
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
            let mut f = (case.make)(&cpu, Size { rows: a.rows })?;
            let mut copy = Bandwidth::copy(case.footprint)?;
            // op and copy on N threads, then (for the speedups) both on 1 thread.
            let calls = if single.is_some() { 4 } else { 2 };
            // The N-thread calls start with the helpers awake (see `wake`).
            let before = |k: usize| {
                if k < 2 {
                    wake(&cpu)
                }
            };
            let times = time_interleaved(budget, calls, before, |k| {
                let one = || single.as_ref().expect("a 1-thread backend when 4 calls");
                match k {
                    0 => f(&cpu),
                    1 => copy.run(&cpu),
                    2 => f(one()),
                    _ => copy.run(one()),
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
