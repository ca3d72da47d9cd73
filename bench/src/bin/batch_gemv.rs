//! Small-batch GEMV (`quantized_matmul` with M = 1..=16 x rows, as a server batching M
//! sequences runs it): one call on M rows against M calls on one row each, same backend,
//! same run, interleaved. Each row's result is bit-identical either way (the example
//! checks it); the ratio says what batching saves.
//!
//! ```text
//! [FUSEBOX_INT8_DECODE=1] [FUSEBOX_ISA=avx2] cargo run --release -p fusebox-bench --bin batch_gemv -- [THREADS] [REPS]
//! ```
//!
//! Prints per format, on W `[1536, 576]` (SmolLM2-135M's MLP up; 768 inputs for the K
//! formats), for M in 2, 4, 8, 16: the median time of the batched call, of the M single
//! calls, and their ratio.

use std::time::Instant;

use fusebox::{ComputeBackend, CpuBackend, DType, Error, Isa, Result, Tensor};

const FORMATS: [DType; 5] = [DType::Q4_1, DType::Q4_0, DType::Q8_0, DType::Q4K, DType::Q6K];

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
    let reps = args.next().and_then(|a| a.parse().ok()).unwrap_or(100usize);
    // FUSEBOX_INT8_DECODE=1: the integer decode path (x rounded to 8 bits).
    let int8 = std::env::var("FUSEBOX_INT8_DECODE").is_ok_and(|v| v == "1");
    // FUSEBOX_ISA=avx2 (or scalar): that level's kernels on a CPU that has a better one.
    let isa = std::env::var("FUSEBOX_ISA").ok().and_then(|n| Isa::ALL.into_iter().find(|i| i.name() == n));
    let b =
        CpuBackend::builder().threads(threads).exact_decode(!int8).isa(isa.unwrap_or_else(Isa::detected)).build()?;
    let path = if int8 { "int8" } else { "f32" };
    println!(
        "batched GEMV vs single rows, {threads} threads, {path} activations, {}, median of {reps}",
        b.isa().name()
    );
    println!("{:<6} {:>3} {:>12} {:>14} {:>8}", "format", "M", "batched µs", "M × single µs", "ratio");
    for dtype in FORMATS {
        let k = if dtype.block_elems() == 256 { 768 } else { 576 };
        let n = 1536;
        let w = b.quantize(&Tensor::from_vec(values(n * k, 1), [n, k])?, dtype)?;
        for m in [2usize, 4, 8, 16] {
            let xs = values(m * k, 2 + m as u32);
            let batch = Tensor::from_vec(xs.clone(), [m, k])?;
            let singles: Vec<Tensor> =
                xs.chunks_exact(k).map(|x| Tensor::from_vec(x.to_vec(), [1, k])).collect::<Result<_>>()?;
            // Warm-up, and the bit-for-bit check.
            let y = b.quantized_matmul(&batch, &w)?.to_vec_f32()?;
            for (i, x) in singles.iter().enumerate() {
                let one = b.quantized_matmul(x, &w)?.to_vec_f32()?;
                if one.iter().zip(&y[i * n..(i + 1) * n]).any(|(a, c)| a.to_bits() != c.to_bits()) {
                    return Err(Error::value(
                        "batch_gemv",
                        "row",
                        "bit-identical batched and alone",
                        format!("{dtype} row {i} of {m}"),
                    ));
                }
            }
            let (mut tb, mut ts) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
            for _ in 0..reps {
                let t = Instant::now();
                std::hint::black_box(b.quantized_matmul(&batch, &w)?);
                tb.push(t.elapsed().as_secs_f64());
                let t = Instant::now();
                for x in &singles {
                    std::hint::black_box(b.quantized_matmul(x, &w)?);
                }
                ts.push(t.elapsed().as_secs_f64());
            }
            let (tb, ts) = (median(tb), median(ts));
            println!("{:<6} {:>3} {:>12.1} {:>14.1} {:>7.2}×", dtype.to_string(), m, tb * 1e6, ts * 1e6, ts / tb);
        }
    }
    Ok(())
}
