//! `quantized_matmul_backward` (`dx = dy · W` straight from W's blocks) against its
//! peer, `dequantize(W)` then `matmul(dy, W)`, same backend, same run, interleaved.
//!
//! ```text
//! cargo run --release -p fusebox-bench --bin quant_backward -- [THREADS] [REPS] [M]
//! ```
//!
//! dy `[M, 576]` · W `[576, 1536]` (SmolLM2-135M's MLP down projection, whose input
//! gradient a LoRA step computes; M = 512 tokens by default) for the formats with fast
//! kernels. Prints the median time of each path and the peer's time over the op's (> 1:
//! the op is faster), and checks that the two agree.

use std::time::Instant;

use fusebox::{ComputeBackend, CpuBackend, DType, Result, Tensor};

const FORMATS: [DType; 7] = [DType::Q4_1, DType::Q4K, DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::Q5K, DType::Q6K];

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
    let reps = args.next().and_then(|a| a.parse().ok()).unwrap_or(20usize).max(1);
    let m = args.next().and_then(|a| a.parse().ok()).unwrap_or(512usize);
    let (n, k) = (576, 1536);
    let b = CpuBackend::builder().threads(threads).build()?;
    let dy = Tensor::from_vec(values(m * n, 3), [m, n])?;
    println!("dx = dy[{m}, {n}] · W[{n}, {k}], {threads} threads, median of {reps}");
    println!("{:<7} {:>12} {:>22} {:>7} {:>10}", "format", "op ms", "dequantize+matmul ms", "ratio", "max |Δ|");
    for dtype in FORMATS {
        let w = b.quantize(&Tensor::from_vec(values(n * k, 7), [n, k])?, dtype)?;
        let peer = |b: &CpuBackend| -> Result<Tensor> { b.matmul(&dy, &b.dequantize(&w)?, false, false) };
        let (got, want) = (b.quantized_matmul_backward(&dy, &w)?, peer(&b)?); // warm up, and compare
        let diff = got.to_vec_f32()?.iter().zip(want.to_vec_f32()?).fold(0.0f32, |d, (g, w)| d.max((g - w).abs()));
        let (mut t_op, mut t_peer) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
        for _ in 0..reps {
            let start = Instant::now();
            std::hint::black_box(b.quantized_matmul_backward(&dy, &w)?);
            t_op.push(start.elapsed().as_secs_f64());
            let start = Instant::now();
            std::hint::black_box(peer(&b)?);
            t_peer.push(start.elapsed().as_secs_f64());
        }
        let (op, pe) = (median(t_op), median(t_peer));
        println!("{:<7} {:>12.2} {:>22.2} {:>6.2}× {:>10.2e}", dtype.to_string(), op * 1e3, pe * 1e3, pe / op, diff);
    }
    Ok(())
}
