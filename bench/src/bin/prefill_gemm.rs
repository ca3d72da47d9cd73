//! Prompt prefill GEMM: `quantized_matmul` with M x rows (default 512) on Llama-1.5B-sized
//! weights (`[2048, 2048]`, `[5632, 2048]`, `[2048, 5632]`), the f32 activations of
//! `exact_decode(true)` against the 8-bit activations of the default, same run,
//! interleaved call by call, for each ISA of `FUSEBOX_ISA` (a comma-separated list of
//! `avx512`, `avx2`, `scalar`; default the detected one). With 8-bit activations AVX-512
//! runs the VNNI tile kernel where the CPU has VNNI and `avx2` the AVX2 one; the f32
//! panels are decoded for the ISA but multiplied by the gemm crate, which picks its own
//! (AVX-512 where the CPU has it).
//!
//! ```text
//! [FUSEBOX_ISA=avx512,avx2] cargo run --release -p fusebox-bench --bin prefill_gemm -- [THREADS] [REPS] [M]
//! ```
//!
//! Prints per format, shape and ISA the median time of each mode, its GMAC/s and the ratio.

use std::time::Instant;

use fusebox::{ComputeBackend, CpuBackend, DType, Isa, Result, Tensor};

const FORMATS: [DType; 5] = [DType::Q4K, DType::Q6K, DType::Q8_0, DType::Q4_0, DType::Q5K];
const SHAPES: [(usize, usize); 3] = [(2048, 2048), (5632, 2048), (2048, 5632)];

fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s as f32 / u32::MAX as f32 - 0.5
        })
        .collect()
}

fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let threads = args.next().and_then(|a| a.parse().ok()).unwrap_or(2usize);
    let reps = args.next().and_then(|a| a.parse().ok()).unwrap_or(5usize);
    let m = args.next().and_then(|a| a.parse().ok()).unwrap_or(512usize);
    let isas: Vec<Isa> = match std::env::var("FUSEBOX_ISA") {
        Ok(list) => list
            .split(',')
            .map(|n| {
                Isa::ALL.into_iter().find(|i| i.name() == n.trim()).ok_or_else(|| {
                    fusebox::Error::value("prefill_gemm", "FUSEBOX_ISA", "avx512, avx2 or scalar", format!("'{n}'"))
                })
            })
            .collect::<Result<_>>()?,
        Err(_) => vec![Isa::detected()],
    };
    let mut backends = Vec::new();
    for &isa in &isas {
        let exact = CpuBackend::builder().threads(threads).exact_decode(true).isa(isa).build()?;
        let int8 = CpuBackend::builder().threads(threads).exact_decode(false).isa(isa).build()?;
        backends.push((isa, exact, int8));
    }
    let names: Vec<&str> = isas.iter().map(|i| i.name()).collect();
    println!("prefill GEMM, M = {m}, {threads} threads, {}, median of {reps}", names.join(", "));
    println!(
        "{:<6} {:>11} {:>7} {:>10} {:>8} {:>10} {:>8} {:>7}",
        "format", "n x k", "isa", "f32 ms", "GMAC/s", "int8 ms", "GMAC/s", "ratio"
    );
    for dtype in FORMATS {
        for (n, k) in SHAPES {
            let w = backends[0].1.quantize(&Tensor::from_vec(values(n * k, 1), [n, k])?, dtype)?;
            let x = Tensor::from_vec(values(m * k, 2), [m, k])?;
            let mut times = vec![(Vec::with_capacity(reps), Vec::with_capacity(reps)); backends.len()];
            for (_, exact, int8) in &backends {
                std::hint::black_box(exact.quantized_matmul(&x, &w)?);
                std::hint::black_box(int8.quantized_matmul(&x, &w)?);
            }
            for _ in 0..reps {
                for ((_, exact, int8), (te, ti)) in backends.iter().zip(&mut times) {
                    let t = Instant::now();
                    std::hint::black_box(exact.quantized_matmul(&x, &w)?);
                    te.push(t.elapsed().as_secs_f64());
                    let t = Instant::now();
                    std::hint::black_box(int8.quantized_matmul(&x, &w)?);
                    ti.push(t.elapsed().as_secs_f64());
                }
            }
            for ((isa, _, _), (te, ti)) in backends.iter().zip(times) {
                let (te, ti) = (median(te), median(ti));
                let macs = (m * n * k) as f64 * 1e-9;
                println!(
                    "{:<6} {:>11} {:>7} {:>10.2} {:>8.1} {:>10.2} {:>8.1} {:>6.2}×",
                    dtype.to_string(),
                    format!("{n}x{k}"),
                    isa.name(),
                    te * 1e3,
                    macs / te,
                    ti * 1e3,
                    macs / ti,
                    te / ti
                );
            }
        }
    }
    Ok(())
}
